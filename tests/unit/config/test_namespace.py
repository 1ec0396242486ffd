"""The ``retry.*`` settings do what the configuration documents say (issue 23: "a documented setting does what it
says"): ``backoff_factor`` / ``backoff_max`` / ``mode`` shape the paired sender's pauses between attempts, and
``retry.total`` - the SDK's own retries inside one call - is 0 for every client, a config that says otherwise being
told so. Unit tier: fake transport and clock, SDK clients built but never opened."""

from __future__ import annotations

import random
import warnings
from typing import Any

import azure.servicebus.exceptions as sbe
import pytest

from servicebus_local.clock import FakeClock
from spark_sb.config.namespace import CredentialConfig, RetryConfig
from spark_sb.config.service_bus import ServiceBusConfig, load_config
from spark_sb.core.errors import ConfigError
from spark_sb.failover.registry import FailoverRegistry
from spark_sb.message.outbound import OutboundMessage
from spark_sb.sender.paired import PairedSender
from spark_sb.wire.sdk_transport import SdkTransport
from spark_sb.wire.transport import PRIMARY
from tests.unit.fakes import FakeTransport

KEY = "c2VjcmV0LWtleS1kby1ub3QtbG9n"


def _settings(**retry: Any) -> dict[str, Any]:
    def cs(host: str) -> str:
        return f"Endpoint=sb://{host}/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={KEY}"

    return {
        "primary": {"connection_string": cs("primary.servicebus.windows.net"), "namespace_name": "primary"},
        "secondary": {"connection_string": cs("secondary.servicebus.windows.net")},
        "entity": "orders",
        "backlog_queue_count": 3,
        "failover_interval": "60s",
        "retry": retry,
    }


def _config(**retry: Any) -> ServiceBusConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a setting the clients honour loads without a warning
        return ServiceBusConfig.from_dict(_settings(**retry))


def _pauses(config: ServiceBusConfig, failures: int) -> list[float]:
    """The pauses between a sender's attempts at one batch while the primary refuses ``failures`` sends and then
    takes it (well within the failover interval: no failover)."""
    clock = FakeClock()
    tried: list[float] = []

    def refused() -> BaseException:
        tried.append(clock.monotonic())
        return sbe.ServiceBusConnectionError(message="connection refused")

    transport = FakeTransport(clock)
    transport.fail(refused, namespace=PRIMARY, count=failures)
    sender = PairedSender(
        config, transport=transport, clock=clock, registry=FailoverRegistry(clock), rng=random.Random(1)
    )
    result = sender.send([OutboundMessage(body="x", message_id="1")])
    assert result.total_diverted == 0 and len(tried) == failures
    tried.append(clock.monotonic())  # the attempt that went through
    return [round(b - a, 6) for a, b in zip(tried, tried[1:], strict=False)]


def test_the_back_off_settings_shape_the_senders_pauses_between_attempts() -> None:
    """The first retry after a connection error is immediate (a fresh client); then retry number n waits
    backoff_factor * 2**(n-1) up to backoff_max, or backoff_factor every time with mode: fixed. Fails if any of the
    three is ignored."""
    assert _pauses(_config(backoff_factor=1.0, backoff_max=4.0), 6) == [0.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    assert _pauses(_config(backoff_factor=0.5, backoff_max=60.0), 5) == [0.0, 1.0, 2.0, 4.0, 8.0]
    assert _pauses(_config(backoff_factor=1.0, backoff_max=4.0, mode="fixed"), 6) == [0.0] + [1.0] * 5


def test_no_client_retries_inside_a_call() -> None:
    """retry.total is 0, the default: the clients are built with ``retry_total=0`` (the sender's through the
    transport, the syphon's from ``client_kwargs``), whatever the back-off settings are."""
    config = _config(backoff_factor=0.5, backoff_max=30)
    assert config.retry.total == 0 and config.client_kwargs()["retry_total"] == 0
    transport = SdkTransport(config)  # builds no client until a call needs one
    assert transport._client_kwargs["retry_total"] == 0
    client = config.primary.client(**transport._client_kwargs)
    try:
        assert client._config.retry_total == 0 and client._config.retry_backoff_factor == 0.5
    finally:
        client.close()
    admin = config.primary.admin_client(config.retry)
    admin.close()
    assert _config(total=0) == ServiceBusConfig.from_dict(_settings())  # `total: 0` says what is true


@pytest.mark.parametrize(
    "source",
    [
        _settings(total=3),
        {"primary.connection_string": _settings()["primary"]["connection_string"], "retry.total": "3"},
    ],
    ids=["nested", "options"],
)
def test_a_retry_count_the_clients_would_not_honour_is_refused_naming_the_key(source: Any) -> None:
    """retry.total once promised SDK retries to the syphon's receivers and the admin client that no client made: a
    config that asks for some is refused with an error naming the key and what to do, not silently ignored."""
    with pytest.raises(ConfigError, match=r"retry\.total: 3 is not honoured: .* remove the key"):
        load_config(source)


def test_a_negative_retry_total_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"retry\.total: must be 0"):
        load_config(_settings(total=-1))


# ------------------------------------------------------------------- parts of a namespace that cannot work together
LOCAL = f"Endpoint=sb://127.0.0.1:5671;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={KEY}"
LOCAL_EMULATOR = LOCAL + ";UseDevelopmentEmulator=true"
CLOUD = f"Endpoint=sb://contoso-dr.servicebus.windows.net/;SharedAccessKeyName=Send;SharedAccessKey={KEY}"


def _refused(settings: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(settings)
    text = str(caught.value)
    assert KEY not in text and len(text.splitlines()) == 1
    return text


def test_an_entity_path_in_a_connection_string_is_refused_at_load() -> None:
    """A client built from a string with EntityPath refuses every other entity, '$connection' too - the name the sink
    opens its shared connection with - so no connection would ever open: refused at load, naming the key."""
    for prefix, other in (("primary", "secondary"), ("secondary", "primary")):
        scoped = {
            f"{prefix}.connection_string": CLOUD + ";EntityPath=orders",
            f"{other}.connection_string": LOCAL,
        }
        text = _refused(scoped)
        assert text.startswith(f"{prefix}.connection_string: has EntityPath=orders, which limits its client")
        assert "without EntityPath" in text


def test_the_sdk_refuses_a_shared_connection_to_a_client_scoped_by_entity_path() -> None:
    """The evidence for the check above: the SDK's own refusal, which the sink met only inside a task."""
    from azure.servicebus import ServiceBusClient

    client = ServiceBusClient.from_connection_string(LOCAL_EMULATOR + ";EntityPath=orders")
    try:
        with pytest.raises(ValueError, match="does not match the EntityPath"):
            client.get_queue_sender("$connection")
    finally:
        client.close()


def test_the_emulator_flag_beside_a_connection_string_that_does_not_say_it_is_refused() -> None:
    """use_development_emulator is for fully_qualified_namespace + credential: a connection string's client takes
    TLS or not from the string, so the flag beside a string without UseDevelopmentEmulator=true did nothing."""
    text = _refused({"primary.connection_string": CLOUD, "primary.use_development_emulator": "true"})
    assert text.startswith(
        "primary.use_development_emulator: applies to fully_qualified_namespace + credential; with "
        "primary.connection_string put UseDevelopmentEmulator=true in the string"
    )
    said = load_config(
        {"primary.connection_string": LOCAL_EMULATOR, "primary.use_development_emulator": "true"}
    )
    assert said.primary.use_development_emulator  # the string says it too: nothing to refuse


def test_a_tenant_for_a_managed_identity_is_refused() -> None:
    """ManagedIdentityCredential takes no tenant (config/clients.credential): a tenant_id beside kind
    managed_identity was silently unused."""
    settings = {
        "primary.fully_qualified_namespace": "contoso.servicebus.windows.net",
        "primary.credential.kind": "managed_identity",
        "primary.credential.client_id": "c",
    }
    assert load_config(settings).primary.credential == CredentialConfig("managed_identity", None, "c")
    text = _refused({**settings, "primary.credential.tenant_id": "t"})
    assert text.startswith(
        "primary.credential.tenant_id: not used with primary.credential.kind 'managed_identity'"
    )
    with_default = load_config(
        {**settings, "primary.credential.kind": "default", "primary.credential.tenant_id": "t"}
    )
    assert (
        with_default.primary.credential is not None
    )  # DefaultAzureCredential takes it (additionally_allowed_tenants)


def test_a_longest_pause_below_the_first_cannot_be_honoured() -> None:
    """backoff_max below backoff_factor: the sender raises its cap to the factor (every pause would be the factor,
    in either mode), so the check refuses it, naming both keys; equal is fine."""
    assert _pauses(_config(backoff_factor=1.0, backoff_max=1.0), 3) == [0.0, 1.0, 1.0]
    RetryConfig(backoff_factor=2.0, backoff_max=2.0).check()
    with pytest.raises(ConfigError, match=r"^retry\.backoff_max: 0\.5 is below retry\.backoff_factor 0\.8 "):
        RetryConfig(backoff_max=0.5).check()


@pytest.mark.parametrize(
    "fqns",
    [
        "contoso-dr.servicebus.windows.net",
        "Contoso-DR.servicebus.windows.net",
        "sb://contoso-dr.servicebus.windows.net/",
    ],
)
def test_a_namespace_beside_its_own_connection_string_may_be_spelled_any_way(fqns: str) -> None:
    """fully_qualified_namespace beside a connection string must name its Endpoint's host: the same host in another
    case or with a scheme is that host, not a conflict."""
    c = load_config({"primary.connection_string": CLOUD, "primary.fully_qualified_namespace": fqns})
    assert c.primary.endpoint_host() == "contoso-dr.servicebus.windows.net"
    text = _refused(
        {
            "primary.connection_string": CLOUD,
            "primary.fully_qualified_namespace": "contoso.servicebus.windows.net",
        }
    )
    assert "fully_qualified_namespace differs from the connection string's Endpoint" in text
