"""The admin (HTTPS) calls of the send path and how their errors read (:mod:`spark_sb.wire.admin_api`): which errors
are worth another try, which are a missing right or an untrusted certificate, the one line that describes them
(free of secrets), and the primary's namespace name - asked of the namespace once per process and endpoint, on the
driver, and shipped in the configuration. Admin clients are fakes: no namespace, no HTTP."""

from __future__ import annotations

import ssl
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from azure.core.exceptions import ClientAuthenticationError, ServiceRequestError

from spark_sb.config.namespace import NamespaceConfig
from spark_sb.config.secret import Secret
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.errors import ProvisioningError
from spark_sb.wire import admin_api
from spark_sb.wire.admin_api import (
    NO_SDK_RETRY,
    close_quietly,
    describe_admin_error,
    is_certificate_error,
    is_retryable,
    is_unauthorized,
    namespace_properties_name,
    primary_namespace_name,
    resolve_primary_namespace_name,
    with_namespace_name,
)
from tests.unit.admin.test_provisioning import FakeAdmin, http_error

#: A made-up SAS key (base64 of "not-a-real-key"): what must never show in an error text.
FAKE_KEY = "bm90LWEtcmVhbC1rZXk="


def ns(host: str, name: str | None = None) -> NamespaceConfig:
    cs = f"Endpoint=sb://{host}/;SharedAccessKeyName=k;SharedAccessKey={FAKE_KEY}"
    return NamespaceConfig(connection_string=Secret(cs), namespace_name=name)


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The namespaces asked for their name (the admin call replaced), with an empty per-process cache."""
    calls: list[str] = []

    def resolve(primary: NamespaceConfig, **kwargs: Any) -> str:
        calls.append(primary.endpoint_host())
        return f"reported-{len(calls)}"

    monkeypatch.setattr(admin_api, "_resolved_names", {})
    monkeypatch.setattr(admin_api, "resolve_primary_namespace_name", resolve)
    return calls


# ------------------------------------------------------------------------------------------------ error reading


def _wrapped_verify_error() -> ServiceRequestError:
    cause = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    try:
        raise ServiceRequestError("connection failed", error=cause) from cause
    except ServiceRequestError as exc:
        return exc


def test_a_certificate_error_is_recognised_through_the_sdk_wrapper() -> None:
    exc = _wrapped_verify_error()
    assert is_certificate_error(exc)
    assert not is_retryable(exc)
    assert not is_certificate_error(ServiceRequestError("connection refused"))
    assert is_retryable(ServiceRequestError("connection refused"))


def test_the_error_says_how_to_trust_the_certificate() -> None:
    text = describe_admin_error(_wrapped_verify_error(), "sb://127.0.0.1:5682 (development emulator)")
    assert "not trusted" in text
    assert "REQUESTS_CA_BUNDLE" in text
    assert "ca_file" in text and "python -m servicebus_local" in text


def test_resolve_primary_namespace_name_from_namespace_config(monkeypatch: pytest.MonkeyPatch) -> None:
    admin = FakeAdmin(namespace_name="primary-local")
    monkeypatch.setattr(NamespaceConfig, "endpoint_host", lambda self: "127.0.0.1:40001")
    cfg = NamespaceConfig()
    assert resolve_primary_namespace_name(cfg, admin_client=admin) == "primary-local"  # type: ignore[arg-type]
    assert admin.calls == ["namespace"]
    assert resolve_primary_namespace_name(replace(cfg, namespace_name="given")) == "given"
    monkeypatch.setattr(NamespaceConfig, "endpoint_host", lambda self: "contoso.servicebus.windows.net")
    assert resolve_primary_namespace_name(cfg) == "contoso"


def test_retry_classification() -> None:
    assert is_retryable(http_error(500))
    assert is_retryable(http_error(503))
    assert is_retryable(http_error(429))
    assert is_retryable(ConnectionError("refused"))
    assert not is_retryable(http_error(400))
    assert not is_retryable(http_error(403))
    assert not is_retryable(ClientAuthenticationError("401"))


def test_the_status_code_is_read_from_the_error_or_its_response() -> None:
    direct = http_error(503, "busy")
    assert describe_admin_error(direct, "ns") == "HttpResponseError (HTTP 503): busy"
    wrapped = RuntimeError("gateway said no")
    wrapped.response = SimpleNamespace(status_code=502)  # type: ignore[attr-defined]
    assert describe_admin_error(wrapped, "ns") == "RuntimeError (HTTP 502): gateway said no"
    odd = RuntimeError("no code")
    odd.status_code = "503"  # type: ignore[attr-defined]  # not a number: not a status
    assert describe_admin_error(odd, "ns") == "RuntimeError: no code"


def test_the_description_is_the_first_line_of_the_message_or_the_type_alone() -> None:
    assert describe_admin_error(ValueError("  first line  \nsecond line\n"), "ns") == "ValueError: first line"
    assert describe_admin_error(TimeoutError(), "ns") == "TimeoutError"
    assert describe_admin_error(http_error(500, "   "), "ns") == "HttpResponseError (HTTP 500)"


@pytest.mark.parametrize(
    ("exc", "said"),
    [
        (http_error(401), "HttpResponseError (HTTP 401): boom"),
        (http_error(403), "HttpResponseError (HTTP 403): boom"),
        (ClientAuthenticationError("token rejected"), "ClientAuthenticationError: token rejected"),
    ],
)
def test_a_missing_right_names_the_manage_right_and_the_namespace(exc: BaseException, said: str) -> None:
    assert is_unauthorized(exc)
    text = describe_admin_error(exc, "sb://secondary.example.net")
    assert text.startswith(
        "not authorized to manage queues in sb://secondary.example.net: the 'Manage' right"
    )
    assert "Azure Service Bus Data Owner" in text
    assert text.endswith("; service said: " + said)


@pytest.mark.parametrize(
    "exc", [http_error(500), http_error(404), ConnectionError("refused"), TimeoutError()]
)
def test_other_errors_are_not_a_missing_right(exc: BaseException) -> None:
    assert not is_unauthorized(exc)
    assert "Manage" not in describe_admin_error(exc, "ns")


def test_a_key_in_the_service_text_is_redacted() -> None:
    leaky = http_error(500, f"Endpoint=sb://x.example.net/;SharedAccessKeyName=k;SharedAccessKey={FAKE_KEY}")
    text = describe_admin_error(leaky, "ns")
    assert FAKE_KEY not in text, "the key was not redacted"
    assert text.startswith("HttpResponseError (HTTP 500): ")


def test_a_certificate_error_is_found_through_inner_exceptions_and_contexts() -> None:
    verify = ssl.SSLCertVerificationError(1, "certificate verify failed")
    inner = RuntimeError("request failed")
    inner.inner_exception = verify  # type: ignore[attr-defined]  # azure-core's way of wrapping
    assert is_certificate_error(inner)
    try:
        try:
            raise verify
        except ssl.SSLError:
            raise OSError("connection reset")  # noqa: B904 - the implicit context is the point
    except OSError as outer:
        assert is_certificate_error(outer)  # the error raised while handling it
    assert is_certificate_error(RuntimeError("[SSL: CERTIFICATE_VERIFY_FAILED] self-signed"))
    assert not is_certificate_error(ssl.SSLError("wrong version number"))


def test_a_cycle_of_causes_is_walked_once() -> None:
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert not is_certificate_error(a)
    assert is_retryable(a)


# ----------------------------------------------------------------------------------- the primary's namespace name


def test_the_name_of_an_address_is_asked_once_per_process_and_endpoint(asked: list[str]) -> None:
    first, other = ns("127.0.0.1:5671"), ns("127.0.0.1:5672")
    assert primary_namespace_name(first) == "reported-1"
    assert primary_namespace_name(first) == "reported-1"
    assert primary_namespace_name(replace(first, namespace_name=None)) == "reported-1"
    assert primary_namespace_name(other) == "reported-2"
    assert asked == ["127.0.0.1:5671", "127.0.0.1:5672"]


def test_a_name_given_or_in_the_fqdn_is_never_asked(asked: list[str]) -> None:
    assert primary_namespace_name(ns("127.0.0.1:5671", name="given")) == "given"
    assert primary_namespace_name(ns("contoso.servicebus.windows.net")) == "contoso"
    assert asked == []


def test_the_driver_ships_the_asked_name_in_the_configuration(asked: list[str]) -> None:
    config = ServiceBusConfig(primary=ns("127.0.0.1:5671"), secondary=ns("127.0.0.1:5682"), entity="orders")
    shipped = with_namespace_name(config)
    assert shipped.primary.namespace_name == "reported-1"
    assert shipped.primary.endpoint_host() == "127.0.0.1:5671"
    assert shipped.secondary == config.secondary and shipped.entity == "orders"
    assert config.primary.namespace_name is None  # the original is unchanged
    assert asked == ["127.0.0.1:5671"]


def test_the_configuration_is_unchanged_without_a_secondary_or_with_a_known_name(asked: list[str]) -> None:
    alone = ServiceBusConfig(primary=ns("127.0.0.1:5671"), entity="orders")
    assert with_namespace_name(alone) is alone
    named = ServiceBusConfig(
        primary=ns("127.0.0.1:5671", "p"), secondary=ns("127.0.0.1:5682"), entity="orders"
    )
    assert with_namespace_name(named) is named
    assert asked == []


def test_the_namespace_is_asked_with_the_sdks_retries_off() -> None:
    seen: list[dict[str, Any]] = []

    class Admin:
        def get_namespace_properties(self, **kwargs: Any) -> SimpleNamespace:
            seen.append(kwargs)
            return SimpleNamespace(name=None)

    assert NO_SDK_RETRY == {"retry_total": 0}
    assert namespace_properties_name(Admin(), "127.0.0.1:5671") == ""  # type: ignore[arg-type]
    assert seen == [{"retry_total": 0}]


@pytest.mark.parametrize(("exc", "unauthorized"), [(http_error(401), True), (http_error(503), False)])
def test_a_failed_question_raises_a_provisioning_error_that_says_how_to_skip_it(
    exc: BaseException, unauthorized: bool
) -> None:
    class Admin:
        def get_namespace_properties(self, **kwargs: Any) -> SimpleNamespace:
            raise exc

    with pytest.raises(ProvisioningError) as caught:
        namespace_properties_name(Admin(), "127.0.0.1:5671")  # type: ignore[arg-type]
    err = caught.value
    assert err.namespace == "127.0.0.1:5671" and err.tried == []
    assert err.unauthorized is unauthorized
    assert err.last_error.startswith(
        "could not ask the primary namespace for its name (set primary.namespace_name"
    )
    assert err.last_error.endswith(describe_admin_error(exc, "127.0.0.1:5671"))
    assert err.__cause__ is None and err.__suppress_context__


def test_the_admin_client_built_for_the_question_is_closed_even_when_it_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[FakeAdmin] = []

    def admin_client(self: NamespaceConfig, *args: Any, **kwargs: Any) -> FakeAdmin:
        admin = FakeAdmin(namespace_name="primary-local")
        built.append(admin)
        return admin

    monkeypatch.setattr(NamespaceConfig, "admin_client", admin_client)
    assert resolve_primary_namespace_name(ns("127.0.0.1:5671")) == "primary-local"
    assert [a.closed for a in built] == [True]

    def refuse(self: FakeAdmin, **kwargs: Any) -> SimpleNamespace:
        raise http_error(500)

    monkeypatch.setattr(FakeAdmin, "get_namespace_properties", refuse)
    with pytest.raises(ProvisioningError):
        resolve_primary_namespace_name(ns("127.0.0.1:5671"))
    assert [a.closed for a in built] == [True, True]


def test_closing_quietly_swallows_a_failing_close() -> None:
    class Broken:
        def close(self) -> None:
            raise RuntimeError("already gone")

    close_quietly(Broken())
    admin = FakeAdmin()
    close_quietly(admin)
    assert admin.closed
