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

from spark_sb.config.service_bus import ServiceBusConfig, load_config
from spark_sb.core.clock import FakeClock
from spark_sb.core.errors import ConfigError
from spark_sb.failover.registry import FailoverRegistry
from spark_sb.message.outbound import OutboundMessage
from spark_sb.sender.paired import PairedSender
from spark_sb.wire.transport import PRIMARY, SdkTransport
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
