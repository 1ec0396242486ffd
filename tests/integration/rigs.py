"""Helpers of the integration tests that more than one file uses (the namespace fixtures themselves come from the
servicebus-local pytest plugin): the lifecycle tests' paired-sender config, messages and receive-all, and the
syphon tests' config, plain SDK put and take. Helpers, not tests: test files import them from here, not from each
other."""

from __future__ import annotations

from typing import Any

from azure.servicebus import ServiceBusClient

from harness.queues import take, take_ids
from servicebus_local.server import LocalNamespace
from spark_sb.config.namespace import NamespaceConfig, RetryConfig
from spark_sb.config.secret import Secret
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.message.outbound import OutboundMessage

ENTITY = "orders"
#: The backlog queues of a two-queue pair whose primary is named ``primary``.
BACKLOG = [f"primary/x-servicebus-transfer/{i}" for i in range(2)]


def config_for(primary: LocalNamespace, secondary: LocalNamespace, interval: float) -> ServiceBusConfig:
    """The paired sender's config of the lifecycle tests: ``orders``, two backlog queues, ``interval`` to fail over,
    probes every second, 3 s per send, no retries."""
    return ServiceBusConfig(
        primary=NamespaceConfig(
            connection_string=Secret(primary.connection_string), namespace_name="primary"
        ),
        secondary=NamespaceConfig(connection_string=Secret(secondary.connection_string)),
        entity=ENTITY,
        backlog_queue_count=len(BACKLOG),
        failover_interval=interval,
        ping_primary_interval=1.0,
        send_timeout=3.0,
        retry=RetryConfig(total=0, backoff_factor=0.1, backoff_max=0.5),
    )


def received_ids(ns: LocalNamespace, entity: str) -> set[str]:
    """The ids of every message ``entity`` holds, received and deleted (up to 15 s)."""
    expected = ns.broker.counts(entity).active_message_count
    return set(take_ids(ns.connection_string, entity, expected=expected, wait=1, deadline=15))


def batch(prefix: str, n: int = 50) -> list[OutboundMessage]:
    """``n`` messages of 100 bytes with ids ``<prefix>-<i>``."""
    return [OutboundMessage(body=b"x" * 100, message_id=f"{prefix}-{i}") for i in range(n)]


def syphon_config(pair: Any) -> ServiceBusConfig:
    """The syphon's config for a namespace pair: two backlog queues, no retries."""
    return ServiceBusConfig.from_dict(
        {
            "primary": {"connection_string": pair.primary.connection_string, "namespace_name": "primary"},
            "secondary": {"connection_string": pair.secondary.connection_string},
            "backlog_queue_count": 2,
            "send_timeout": "5s",
            "retry": {"total": 0, "backoff_factor": 0.05, "backoff_max": 0.1},
        }
    )


def put_messages(ns: Any, queue: str, messages: list[OutboundMessage]) -> None:
    """``messages`` sent to ``queue`` of the local namespace ``ns`` with a plain SDK sender."""
    with (
        ServiceBusClient.from_connection_string(ns.connection_string) as client,
        client.get_queue_sender(queue) as sender,
    ):
        sender.send_messages([m.to_sdk() for m in messages])


def take_messages(ns: Any, entity: str, sub_queue: Any = None, subscription: str | None = None) -> list[Any]:
    """Every message of ``entity`` (its ``sub_queue``, or its ``subscription``), received and deleted."""
    return take(ns.connection_string, entity, sub_queue=sub_queue, subscription=subscription, batch=100)
