"""The error classifier as a pure function (SPEC B3, B5, B7, B10)."""

from __future__ import annotations

import errno
import inspect
import pickle
import socket

import pytest
from azure.core import exceptions as ace
from azure.servicebus import exceptions as sbe
from azure.servicebus._pyamqp import error as amqp_error

from spark_sb.core import errors
from spark_sb.core.errors import (
    ALREADY_EXISTS,
    ALREADY_SETTLED,
    CLIENT_CLOSED,
    CONNECTION,
    ENTITY_DISABLED,
    ENTITY_NOT_FOUND,
    INVALID_REQUEST,
    LOCK_LOST,
    MESSAGE_NOT_FOUND,
    MESSAGE_TOO_LARGE,
    QUOTA_EXCEEDED,
    SERVER_BUSY,
    SERVICE_ERROR,
    SESSION_LOCKED,
    TIMEOUT,
    UNAUTHORIZED,
    UNEXPECTED,
    ErrorClass,
    NoBacklogAvailableError,
    ServiceBusConfigError,
    classify,
)

# Every exception class of azure.servicebus.exceptions must be listed here: a class added by a future SDK
# fails test_every_sdk_exception_is_classified until someone decides what it means for the paired sender.
EXPECTED_SDK: dict[str, ErrorClass] = {
    "ServiceBusError": SERVICE_ERROR,
    "ServiceBusConnectionError": CONNECTION,
    "ServiceBusAuthenticationError": UNAUTHORIZED,
    "ServiceBusAuthorizationError": UNAUTHORIZED,
    "OperationTimeoutError": TIMEOUT,
    "MessageSizeExceededError": MESSAGE_TOO_LARGE,
    "MessageAlreadySettled": ALREADY_SETTLED,
    "MessageLockLostError": LOCK_LOST,
    "SessionLockLostError": LOCK_LOST,
    "MessageNotFoundError": MESSAGE_NOT_FOUND,
    "MessagingEntityNotFoundError": ENTITY_NOT_FOUND,
    "MessagingEntityDisabledError": ENTITY_DISABLED,
    "MessagingEntityAlreadyExistsError": ALREADY_EXISTS,
    "ServiceBusQuotaExceededError": QUOTA_EXCEEDED,
    "ServiceBusServerBusyError": SERVER_BUSY,
    "ServiceBusCommunicationError": CONNECTION,
    "SessionCannotBeLockedError": SESSION_LOCKED,
    "AutoLockRenewFailed": LOCK_LOST,
    "AutoLockRenewTimeout": LOCK_LOST,
}


def _sdk_exception_classes() -> list[type[BaseException]]:
    return [
        obj
        for _, obj in inspect.getmembers(sbe, inspect.isclass)
        if issubclass(obj, BaseException) and obj.__module__ == sbe.__name__
    ]


def _make(cls: type[BaseException]) -> BaseException:
    if cls is sbe.ServiceBusError or cls in (sbe.AutoLockRenewFailed, sbe.AutoLockRenewTimeout):
        return cls("boom")  # type: ignore[call-arg]
    return cls()


def test_every_sdk_exception_is_listed() -> None:
    names = {c.__name__ for c in _sdk_exception_classes()}
    assert names, "no exception classes found in azure.servicebus.exceptions"
    unlisted = names - set(EXPECTED_SDK)
    assert not unlisted, f"classify these new SDK exceptions: {sorted(unlisted)}"


@pytest.mark.parametrize("cls", _sdk_exception_classes(), ids=lambda c: c.__name__)
def test_every_sdk_exception_is_classified(cls: type[BaseException]) -> None:
    assert classify(_make(cls)) == EXPECTED_SDK[cls.__name__]


def test_spec_b3_rules() -> None:
    busy = classify(sbe.ServiceBusServerBusyError())
    assert busy.retry and not busy.fail_over and not busy.fail_batch
    for exc in (sbe.ServiceBusAuthenticationError(), sbe.ServiceBusAuthorizationError()):
        c = classify(exc)
        assert c.fail_batch and not c.fail_over and not c.retry
    for exc in (
        sbe.ServiceBusQuotaExceededError(),
        sbe.MessagingEntityDisabledError(),
        sbe.MessagingEntityNotFoundError(),
        sbe.ServiceBusConnectionError(),
        sbe.OperationTimeoutError(),
        ConnectionRefusedError(errno.ECONNREFUSED, "refused"),
        TimeoutError("timed out"),
    ):
        c = classify(exc)
        assert c.fail_over and not c.fail_batch, exc
    too_big = classify(sbe.MessageSizeExceededError())
    assert too_big.reject_message and not too_big.fail_over
    assert classify(sbe.ServiceBusConnectionError()).rebuild_client
    assert classify(sbe.OperationTimeoutError()).rebuild_client
    assert not classify(sbe.ServiceBusQuotaExceededError()).rebuild_client


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        (b"com.microsoft:server-busy", SERVER_BUSY),
        (b"amqp:unauthorized-access", UNAUTHORIZED),
        (b"amqp:resource-limit-exceeded", QUOTA_EXCEEDED),
        (b"com.microsoft:entity-disabled", ENTITY_DISABLED),
        (b"amqp:not-found", ENTITY_NOT_FOUND),
        (b"com.microsoft:timeout", TIMEOUT),
        (b"amqp:link:message-size-exceeded", MESSAGE_TOO_LARGE),
        (b"amqp:link:detach-forced", CONNECTION),
        (b"com.microsoft:argument-error", INVALID_REQUEST),
        (b"amqp:not-allowed", INVALID_REQUEST),
        (b"amqp:internal-error", SERVICE_ERROR),
        (b"com.example:never-heard-of-it", SERVICE_ERROR),
    ],
)
def test_generic_service_bus_error_classified_by_condition(condition: bytes, expected: ErrorClass) -> None:
    assert classify(sbe.ServiceBusError("x", condition=condition)) == expected


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (amqp_error.AMQPConnectionError(amqp_error.ErrorCondition.SocketError), CONNECTION),
        (amqp_error.AMQPConnectionError(amqp_error.ErrorCondition.NotFound), CONNECTION),
        (amqp_error.AMQPLinkError(amqp_error.ErrorCondition.NotFound), ENTITY_NOT_FOUND),
        (amqp_error.AMQPLinkError(amqp_error.ErrorCondition.ResourceLimitExceeded), QUOTA_EXCEEDED),
        (amqp_error.AMQPLinkError(b"com.microsoft:server-busy"), SERVER_BUSY),
        (amqp_error.AMQPLinkError(b"com.microsoft:entity-disabled"), ENTITY_DISABLED),
        (amqp_error.AuthenticationException(amqp_error.ErrorCondition.ClientError), UNAUTHORIZED),
        (amqp_error.AMQPException(b"com.example:odd"), SERVICE_ERROR),
    ],
    ids=repr,
)
def test_amqp_exceptions(exc: BaseException, expected: ErrorClass) -> None:
    assert classify(exc) == expected


def test_connection_error_closed_for_lack_of_rights_is_unauthorized() -> None:
    exc = sbe.ServiceBusConnectionError(condition=b"amqp:unauthorized-access")
    assert classify(exc) == UNAUTHORIZED


def test_generic_error_wrapping_a_socket_error_is_a_connection_error() -> None:
    inner = ConnectionResetError(errno.ECONNRESET, "reset by peer")
    exc = sbe.ServiceBusError("Handler failed", error=inner)
    assert classify(exc) == CONNECTION
    try:
        raise sbe.ServiceBusError("wrapped") from TimeoutError("slow")
    except sbe.ServiceBusError as wrapped:
        assert classify(wrapped) == TIMEOUT


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), CONNECTION),
        (ConnectionResetError(errno.ECONNRESET, "reset"), CONNECTION),
        (BrokenPipeError(errno.EPIPE, "pipe"), CONNECTION),
        (socket.gaierror(socket.EAI_NONAME, "no such host"), CONNECTION),
        (OSError(errno.ENETUNREACH, "unreachable"), CONNECTION),
        (TimeoutError("timed out"), TIMEOUT),
        (TimeoutError(), TIMEOUT),
        (ace.ServiceRequestError("no route"), CONNECTION),
        (ace.ServiceResponseError("cut"), CONNECTION),
        (ace.ServiceRequestTimeoutError("slow"), TIMEOUT),
        (ace.ClientAuthenticationError("no"), UNAUTHORIZED),
        (ace.ResourceNotFoundError("gone"), ENTITY_NOT_FOUND),
        (ace.ResourceExistsError("there"), ALREADY_EXISTS),
        (ace.AzureError("?"), SERVICE_ERROR),
        (ValueError("The handler has already been shutdown. Please use ..."), CLIENT_CLOSED),
        (ValueError("bad"), UNEXPECTED),
        (TypeError("bad"), UNEXPECTED),
        (KeyboardInterrupt(), UNEXPECTED),
    ],
    ids=repr,
)
def test_non_sdk_exceptions(exc: BaseException, expected: ErrorClass) -> None:
    assert classify(exc) == expected


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (401, UNAUTHORIZED),
        (403, UNAUTHORIZED),
        (429, SERVER_BUSY),
        (503, SERVER_BUSY),
        (500, SERVICE_ERROR),
        (408, TIMEOUT),
        (400, INVALID_REQUEST),
    ],
)
def test_http_status_codes(status: int, expected: ErrorClass) -> None:
    exc = ace.HttpResponseError("http")
    exc.status_code = status
    assert classify(exc) == expected


def test_unexpected_errors_fail_the_batch_and_never_fail_over() -> None:
    c = classify(RuntimeError("bug"))
    assert c.fail_batch and not c.fail_over and not c.retry


def test_classes_are_consistent() -> None:
    names = [c.name for c in errors.ALL_CLASSES]
    assert len(names) == len(set(names))
    for c in errors.ALL_CLASSES:
        assert not (c.fail_batch and c.fail_over), c
        assert not (c.fail_batch and c.retry), c
    assert set(errors.CONDITIONS.values()) <= set(errors.ALL_CLASSES)


def test_own_errors_classify_as_their_class_and_pickle() -> None:
    err = NoBacklogAvailableError("none left", outcome={"sent": 1})
    assert classify(err) == errors.CONNECTION
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is NoBacklogAvailableError
    assert str(copy) == "none left" and copy.outcome == {"sent": 1}
    assert classify(ServiceBusConfigError("unauthorized")) == UNAUTHORIZED


def test_a_connection_refused_for_the_namespaces_connection_quota_has_its_own_class() -> None:
    """What the local namespace (and the service) answers beyond the connection quota: a connection closed with
    amqp:resource-limit-exceeded; the SDK raises ServiceBusConnectionError with that condition."""
    from spark_sb.core.errors import CONNECTION_QUOTA
    from spark_sb.failover.decisions import namespace_wide

    sdk = sbe.ServiceBusConnectionError(
        message="ConnectionsQuotaExceeded for namespace x.", condition=b"amqp:resource-limit-exceeded"
    )
    amqp = amqp_error.AMQPConnectionError(amqp_error.ErrorCondition.ResourceLimitExceeded)
    for exc in (sdk, amqp):
        cls = classify(exc)
        assert cls == CONNECTION_QUOTA and cls.fail_over and cls.retry and cls.rebuild_client
        assert namespace_wide(cls, connection_answered=True)  # the namespace's, whatever else answered
    # On a link, the same condition is the entity's quota (entity full), not the namespace's.
    assert (
        classify(amqp_error.AMQPLinkError(amqp_error.ErrorCondition.ResourceLimitExceeded)) == QUOTA_EXCEEDED
    )
