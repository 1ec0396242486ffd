"""Error taxonomy of the paired sender: one pure classifier, flags instead of ad-hoc ``except`` ladders.

:func:`classify` maps any exception raised while talking to Service Bus (azure-servicebus exceptions, the
SDK's AMQP layer, azure-core, sockets) to an :class:`ErrorClass` whose flags say what to do (SPEC B3, B5, B7,
B10):

* ``retry`` - transient: back off and try the same target again;
* ``fail_over`` - an outage of the target entity: on the primary it starts/continues the failover timer, on a
  backlog queue it pulls the queue from the rotation;
* ``fail_batch`` - a configuration or programming error (e.g. unauthorized): raise a clear error, never fail
  over and never divert;
* ``reject_message`` - message-level (e.g. too large): record the message as rejected, go on;
* ``rebuild_client`` - the client (and its partner, B10) must be closed and rebuilt before the next use.

A send that failed with no verdict once its transfer was written is *ambiguous* (:func:`is_ambiguous`, SPEC B14):
the wire marks the exception (:func:`mark_written`), the class says the service did not answer.

The exceptions the sender raises to its caller (the Spark task) are defined here too. None of them carries a
secret: namespaces are named by their redacted form only.

Runs anywhere (executors' Python workers, the syphon, tests); pure and picklable.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spark_sb.core.redact import redact


class LaneClosed(ConnectionError):
    """A lane (:mod:`spark_sb.wire.lane`) was closed or its worker abandoned before the call started: the
    client's own doing, never evidence about a namespace (:data:`CLIENT_CLOSED`)."""


@dataclass(frozen=True)
class ErrorClass:
    """What to do about a failure. ``name`` is stable and goes to logs and the Delta event log."""

    name: str
    retry: bool = False
    fail_over: bool = False
    fail_batch: bool = False
    reject_message: bool = False
    rebuild_client: bool = False

    def __str__(self) -> str:
        return self.name


# Send-side classes.
SERVER_BUSY = ErrorClass("server_busy", retry=True)
UNAUTHORIZED = ErrorClass("unauthorized", fail_batch=True)
QUOTA_EXCEEDED = ErrorClass("quota_exceeded", fail_over=True)
ENTITY_DISABLED = ErrorClass("entity_disabled", fail_over=True)
ENTITY_NOT_FOUND = ErrorClass("entity_not_found", fail_over=True)
TIMEOUT = ErrorClass("timeout", retry=True, fail_over=True, rebuild_client=True)
CONNECTION = ErrorClass("connection", retry=True, fail_over=True, rebuild_client=True)
# The namespace refused a new connection: it holds its quota of concurrent connections (5,000 on the service).
# Counted as an outage of the namespace (fail_over, namespace-wide): no send of this process can reach the
# primary until connections free up, and failing over after failover_interval keeps the stream moving with
# nothing lost; it gets its own name so that logs and the events table tell it from a network outage.
CONNECTION_QUOTA = ErrorClass("connection_quota", retry=True, fail_over=True, rebuild_client=True)
SERVICE_ERROR = ErrorClass("service_error", retry=True, fail_over=True)
MESSAGE_TOO_LARGE = ErrorClass("message_too_large", reject_message=True)
INVALID_REQUEST = ErrorClass("invalid_request", fail_batch=True)
CLIENT_CLOSED = ErrorClass("client_closed", retry=True, rebuild_client=True)
# Receive/admin-side classes (the syphon and provisioning use the same classifier).
LOCK_LOST = ErrorClass("lock_lost")
MESSAGE_NOT_FOUND = ErrorClass("message_not_found")
SESSION_LOCKED = ErrorClass("session_locked", retry=True)
ALREADY_EXISTS = ErrorClass("already_exists")
ALREADY_SETTLED = ErrorClass("already_settled")
# Anything else is a bug or a configuration problem: fail loudly.
UNEXPECTED = ErrorClass("unexpected", fail_batch=True)

ALL_CLASSES: tuple[ErrorClass, ...] = (
    SERVER_BUSY,
    UNAUTHORIZED,
    QUOTA_EXCEEDED,
    ENTITY_DISABLED,
    ENTITY_NOT_FOUND,
    TIMEOUT,
    CONNECTION,
    CONNECTION_QUOTA,
    SERVICE_ERROR,
    MESSAGE_TOO_LARGE,
    INVALID_REQUEST,
    CLIENT_CLOSED,
    LOCK_LOST,
    MESSAGE_NOT_FOUND,
    SESSION_LOCKED,
    ALREADY_EXISTS,
    ALREADY_SETTLED,
    UNEXPECTED,
)

# AMQP / Service Bus error conditions (as text) -> class.
CONDITIONS: dict[str, ErrorClass] = {
    "com.microsoft:server-busy": SERVER_BUSY,
    "amqp:unauthorized-access": UNAUTHORIZED,
    "com.microsoft:auth-failed": UNAUTHORIZED,
    "amqp:resource-limit-exceeded": QUOTA_EXCEEDED,
    "com.microsoft:entity-disabled": ENTITY_DISABLED,
    "amqp:not-found": ENTITY_NOT_FOUND,
    "amqp:resource-deleted": ENTITY_NOT_FOUND,
    "com.microsoft:timeout": TIMEOUT,
    "amqp:link:message-size-exceeded": MESSAGE_TOO_LARGE,
    "amqp:connection:forced": CONNECTION,
    "amqp:connection:framing-error": CONNECTION,
    "amqp:connection:redirect": CONNECTION,
    "amqp:link:detach-forced": CONNECTION,
    "amqp:link:redirect": CONNECTION,
    "amqp:link:stolen": CONNECTION,
    "amqp:session:window-violation": CONNECTION,
    "amqp:session:errant-link": CONNECTION,
    "amqp:session:handle-in-use": CONNECTION,
    "amqp:session:unattached-handle": CONNECTION,
    "amqp:illegal-state": CONNECTION,
    "amqp:socket-error": CONNECTION,
    "amqp:unknown-error": CONNECTION,
    "amqp:client-error": CONNECTION,
    "com.microsoft:container-close": CONNECTION,
    "amqp:internal-error": SERVICE_ERROR,
    "amqp:vendor-error": SERVICE_ERROR,
    "amqp:link:transfer-limit-exceeded": SERVICE_ERROR,
    "amqp:resource-locked": SERVICE_ERROR,
    "amqp:frame-size-too-small": INVALID_REQUEST,
    "amqp:decode-error": INVALID_REQUEST,
    "amqp:invalid-field": INVALID_REQUEST,
    "amqp:not-allowed": INVALID_REQUEST,
    "amqp:not-implemented": INVALID_REQUEST,
    "amqp:precondition-failed": INVALID_REQUEST,
    "com.microsoft:precondition-failed": INVALID_REQUEST,
    "com.microsoft:argument-error": INVALID_REQUEST,
    "com.microsoft:argument-out-of-range": INVALID_REQUEST,
    "com.microsoft:message-lock-lost": LOCK_LOST,
    "com.microsoft:session-lock-lost": LOCK_LOST,
    "com.microsoft:message-not-found": MESSAGE_NOT_FOUND,
    "com.microsoft:session-cannot-be-locked": SESSION_LOCKED,
    "com.microsoft:entity-already-exists": ALREADY_EXISTS,
}

_HANDLER_SHUT_DOWN = "handler has already been shutdown"
_RESOURCE_LIMIT = "amqp:resource-limit-exceeded"


def condition_of(exc: BaseException) -> str | None:
    """The AMQP error condition an exception carries (SDK ``_condition`` or pyamqp ``condition``), as text."""
    raw: Any = getattr(exc, "_condition", None)
    if raw is None:
        raw = getattr(exc, "condition", None)
    if raw is None:
        return None
    if isinstance(raw, bytes):  # includes pyamqp's ErrorCondition(bytes, Enum)
        return bytes(raw).decode("utf-8", "replace")
    value = getattr(raw, "value", raw)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def token_expired(exc: BaseException) -> bool:
    """The SDK refused a call because the client's token expired (pyamqp's ``TokenExpired``, raised as
    ``ServiceBusAuthenticationError``), or the namespace detached the link for an expired token
    (``amqp:unauthorized-access`` with "expired"). Pure."""
    seen: BaseException | None = exc
    for _ in range(8):  # the cause chain, bounded
        if seen is None:
            break
        text = f"{type(seen).__name__} {seen}".lower()
        if "tokenexpired" in text or (
            "expired" in text and ("authentication" in text or "unauthorized" in text)
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def classify(exc: BaseException) -> ErrorClass:
    """Classify ``exc``; pure (no I/O, no state). See the module docstring for what the flags mean."""
    return _classify(exc, depth=0)


def _classify(exc: BaseException, depth: int) -> ErrorClass:
    if isinstance(exc, SendError):
        return exc.error_class
    sdk = _classify_sdk(exc, depth)
    if sdk is not None:
        return sdk
    amqp = _classify_amqp(exc)
    if amqp is not None:
        return amqp
    core = _classify_azure_core(exc, depth)
    if core is not None:
        return core
    if isinstance(exc, LaneClosed):  # closed on our side (a sender or transport closing): evidence of nothing
        return CLIENT_CLOSED
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return TIMEOUT
    if isinstance(exc, (ConnectionError, socket.gaierror, EOFError, OSError)):
        return CONNECTION
    if isinstance(exc, ValueError) and _HANDLER_SHUT_DOWN in str(exc):
        return CLIENT_CLOSED
    return UNEXPECTED


def _classify_sdk(exc: BaseException, depth: int) -> ErrorClass | None:
    from azure.servicebus import exceptions as sbe

    if isinstance(exc, sbe.MessageAlreadySettled):
        return ALREADY_SETTLED
    if not isinstance(exc, sbe.ServiceBusError):
        return None
    by_class: tuple[tuple[type[BaseException], ErrorClass], ...] = (
        (sbe.ServiceBusServerBusyError, SERVER_BUSY),
        (sbe.ServiceBusAuthenticationError, UNAUTHORIZED),
        (sbe.ServiceBusAuthorizationError, UNAUTHORIZED),
        (sbe.ServiceBusQuotaExceededError, QUOTA_EXCEEDED),
        (sbe.MessagingEntityDisabledError, ENTITY_DISABLED),
        (sbe.MessagingEntityNotFoundError, ENTITY_NOT_FOUND),
        (sbe.OperationTimeoutError, TIMEOUT),
        (sbe.MessageSizeExceededError, MESSAGE_TOO_LARGE),
        (sbe.MessageLockLostError, LOCK_LOST),
        (sbe.SessionLockLostError, LOCK_LOST),
        (sbe.AutoLockRenewFailed, LOCK_LOST),
        (sbe.AutoLockRenewTimeout, LOCK_LOST),
        (sbe.MessageNotFoundError, MESSAGE_NOT_FOUND),
        (sbe.SessionCannotBeLockedError, SESSION_LOCKED),
        (sbe.MessagingEntityAlreadyExistsError, ALREADY_EXISTS),
    )
    for cls, error_class in by_class:
        if isinstance(exc, cls):
            return error_class
    condition = condition_of(exc)
    if isinstance(exc, (sbe.ServiceBusConnectionError, sbe.ServiceBusCommunicationError)):
        # The SDK maps every AMQP connection error to these classes whatever the condition; a connection
        # closed for lack of rights is still a configuration error.
        if condition is not None and CONDITIONS.get(condition) is UNAUTHORIZED:
            return UNAUTHORIZED
        if condition == _RESOURCE_LIMIT:  # a connection refused for the namespace's connection quota
            return CONNECTION_QUOTA
        return CONNECTION
    # The generic ServiceBusError: its condition, else what it wraps, else an outage of unknown kind.
    if condition is not None and condition in CONDITIONS:
        return CONDITIONS[condition]
    return _classify_inner(exc, depth)


def _classify_amqp(exc: BaseException) -> ErrorClass | None:
    try:
        from azure.servicebus._pyamqp import error as amqp_error
    except ImportError:  # pragma: no cover - the SDK always ships it
        return None
    if not isinstance(exc, amqp_error.AMQPException):
        return None
    condition = condition_of(exc)
    if isinstance(exc, amqp_error.AuthenticationException):
        return UNAUTHORIZED
    if condition is not None and condition in CONDITIONS:
        found = CONDITIONS[condition]
        if isinstance(exc, amqp_error.AMQPConnectionError) and found is ENTITY_NOT_FOUND:
            return CONNECTION  # the namespace (host), not the entity, was not found
        if isinstance(exc, amqp_error.AMQPConnectionError) and condition == _RESOURCE_LIMIT:
            return CONNECTION_QUOTA
        return found
    if isinstance(exc, (amqp_error.AMQPConnectionError, amqp_error.AMQPSessionError)):
        return CONNECTION
    return SERVICE_ERROR


def _classify_azure_core(exc: BaseException, depth: int) -> ErrorClass | None:
    from azure.core import exceptions as ace

    if not isinstance(exc, ace.AzureError):
        return None
    if isinstance(exc, ace.ClientAuthenticationError):
        return UNAUTHORIZED
    if isinstance(exc, ace.ResourceNotFoundError):
        return ENTITY_NOT_FOUND
    if isinstance(exc, ace.ResourceExistsError):
        return ALREADY_EXISTS
    if isinstance(exc, (ace.ServiceRequestTimeoutError, ace.ServiceResponseTimeoutError)):
        return TIMEOUT
    if isinstance(exc, (ace.ServiceRequestError, ace.ServiceResponseError)):
        return CONNECTION
    if isinstance(exc, ace.HttpResponseError):
        status = exc.status_code
        if status in (401, 403):
            return UNAUTHORIZED
        if status in (429, 503):
            return SERVER_BUSY
        if status == 408:
            return TIMEOUT
        if status is not None and status >= 500:
            return SERVICE_ERROR
        return INVALID_REQUEST
    return _classify_inner(exc, depth)


def _classify_inner(exc: BaseException, depth: int) -> ErrorClass:
    """The class of the exception ``exc`` wraps (azure-core's ``inner_exception``), else a service error."""
    inner = _inner(exc)
    if inner is not None and depth < 5:
        found = _classify(inner, depth + 1)
        if found is not UNEXPECTED:
            return found
    return SERVICE_ERROR


def _inner(exc: BaseException) -> BaseException | None:
    inner = getattr(exc, "inner_exception", None)
    if isinstance(inner, BaseException) and inner is not exc:
        return inner
    cause = exc.__cause__
    if cause is not None and cause is not exc:
        return cause
    return None


# ---------------------------------------------------------------------------------------------------------
# Ambiguous sends (SPEC B14): a send that failed once its transfer was written may have landed.

#: The classes of a failure the service gave no verdict on: a send that ended with one after its transfer was
#: written may have landed (a refusal, a full or disabled entity, a too-large message: the service said no).
NO_VERDICT = frozenset({TIMEOUT.name, CONNECTION.name, CLIENT_CLOSED.name})
_WRITTEN = "_spark_sb_transfer_written"


def mark_written(exc: BaseException) -> None:
    """The wire's mark on ``exc``: it ended a send whose transfer was written to the link (handed to the SDK's send,
    or a parked send resumed), so the message may have reached the entity."""
    with contextlib.suppress(AttributeError):  # an exception without a __dict__: taken as not written
        setattr(exc, _WRITTEN, True)


def is_ambiguous(exc: BaseException) -> bool:
    """A send that failed with ``exc`` may have landed (pure): its transfer was written (:func:`mark_written`) and
    the service gave no verdict (:data:`NO_VERDICT`: a timeout, a connection or link lost, the client closed)."""
    return bool(getattr(exc, _WRITTEN, False)) and classify(exc).name in NO_VERDICT


# ---------------------------------------------------------------------------------------------------------
# Exceptions raised by the paired sender to its caller.


class SendError(Exception):
    """Base of the errors the paired sender raises; the Spark task fails and Spark retries it.

    ``outcome`` (a ``spark_sb.sender.paired.SendOutcome`` or None) tells what was confirmed before the failure; the
    messages not counted there were not sent. The text never contains a secret.
    """

    error_class: ErrorClass = UNEXPECTED

    def __init__(self, message: str, *, outcome: Any = None, error_class: ErrorClass | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome
        if error_class is not None:
            self.error_class = error_class

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_error, (type(self), self.args, dict(self.__dict__)))


class ServiceBusConfigError(SendError):
    """A configuration error found while sending (e.g. unauthorized: the SAS rule or role lacks ``Send``)."""

    error_class = UNAUTHORIZED


class NoBacklogAvailableError(SendError):
    """The primary entity is failed over and every backlog queue is pulled from the rotation (SPEC B5)."""

    error_class = CONNECTION


class ServerBusyError(SendError):
    """The namespace kept answering "server busy" beyond the configured retry budget (never a failover)."""

    error_class = SERVER_BUSY


class MessageRejectedError(SendError):
    """A message was rejected (B7) and ``on_reject = "fail"``; ``reject`` is the ``spark_sb.message.outbound.Reject``."""

    error_class = MESSAGE_TOO_LARGE

    def __init__(self, message: str, *, reject: Any = None, outcome: Any = None) -> None:
        super().__init__(message, outcome=outcome)
        self.reject = reject


# ---------------------------------------------------------------------------------------------------------
# Configuration errors (raised while loading or checking a configuration, on the driver).


class ConfigError(ValueError):
    """An invalid setting. The message names the dotted key and, where there is a set, the valid values.

    ``errors`` holds every problem found (``(key, message)``); ``str()`` joins them.
    """

    def __init__(self, message: str, errors: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.errors = errors if errors is not None else []

    @classmethod
    def at(cls, key: str, message: str) -> ConfigError:
        """The error for one setting: ``"<key>: <message>"``."""
        return cls(f"{key}: {message}", [(key, message)])


def _rebuild_error(cls: type[SendError], args: tuple[Any, ...], state: dict[str, Any]) -> SendError:
    err = Exception.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


class ProvisioningError(RuntimeError):
    """No backlog queue is usable: names the namespace, the queues tried and the last error."""

    def __init__(
        self,
        namespace: str,
        tried: Sequence[str],
        last_error: str,
        *,
        report: Any = None,  # the spark_sb.admin.report.ProvisioningReport that found no usable queue
        unauthorized: bool = False,
    ) -> None:
        self.namespace = namespace
        self.unauthorized = unauthorized
        self.tried = list(tried)
        self.last_error = last_error
        self.report = report
        shown = ", ".join(self.tried[:5]) + (
            f", ... ({len(self.tried)} in all)" if len(self.tried) > 5 else ""
        )
        super().__init__(
            f"no usable backlog queue in namespace {namespace}: tried {shown or '(none)'}; last error: {last_error}"
        )


def describe_error(exc: BaseException) -> str:
    """One line of at most 300 characters naming the error, free of secrets (:func:`~spark_sb.core.redact.redact`):
    the form used in records, logs and error texts. Errors of admin calls: :func:`~spark_sb.wire.admin_api.describe_admin_error`."""
    text = redact(f"{type(exc).__name__}: {exc}")
    return text if len(text) <= 300 else text[:297] + "..."
