"""The same integration tests against the local namespaces and, when configured, a real Azure pair.

``backend`` is parametrized: ``local`` (two in-process local namespaces, always) and ``azure`` (the namespaces of
``SB_PRIMARY_CONNECTION_STRING`` / ``SB_SECONDARY_CONNECTION_STRING``; skipped when they are not set). Against
Azure the tests create uniquely named queues with the admin client (the keys need the Manage right) and delete
them afterwards; backlog queues get a unique primary-namespace prefix so that they never touch real ones.
No faults are injected here (a real namespace cannot be told to fail): the fault tests run locally only.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusReceiveMode

from servicebus_local.clock import FakeClock
from spark_sb.admin.provisioning import provision_backlog_queues
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.failover.outcome import namespace_key
from spark_sb.failover.records import EntityState
from spark_sb.message.backlog import is_probe
from spark_sb.message.outbound import OutboundMessage
from spark_sb.sender.paired import PairedSender


@dataclass
class Backend:
    """Two namespaces (connection strings), admin clients for them, and what to clean up."""

    name: str
    primary: str
    secondary: str
    primary_admin: Any
    secondary_admin: Any
    prefix: str = field(default_factory=lambda: f"sparksb{uuid.uuid4().hex[:8]}")
    created_primary: list[str] = field(default_factory=list)
    created_secondary: list[str] = field(default_factory=list)

    def queue(self, suffix: str, **settings: Any) -> str:
        name = f"{self.prefix}-{suffix}"
        self.primary_admin.create_queue(name, **settings)
        self.created_primary.append(name)
        return name

    def config(self, entity: str, **overrides: Any) -> ServiceBusConfig:
        settings: dict[str, Any] = {
            "primary": {"connection_string": self.primary, "namespace_name": self.prefix},
            "secondary": {"connection_string": self.secondary},
            "entity": entity,
            "backlog_queue_count": 2,
            "failover_interval": "30s",
            "ping_primary_interval": "1s",
            "send_timeout": "30s",
            "retry": {"backoff_factor": 0.5, "backoff_max": 5},
        }
        settings.update(overrides)
        return ServiceBusConfig.from_dict(settings)

    def cleanup(self) -> None:
        for admin, names in (
            (self.primary_admin, self.created_primary),
            (self.secondary_admin, self.created_secondary),
        ):
            for name in names:
                with contextlib.suppress(Exception):  # best-effort clean-up
                    admin.delete_queue(name)
            admin.close()


@pytest.fixture(params=["local", "azure"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    from azure.servicebus.management import ServiceBusAdministrationClient

    if request.param == "local":
        pair = request.getfixturevalue("namespace_pair")
        b = Backend(
            "local",
            pair.primary.connection_string,
            pair.secondary.connection_string,
            pair.primary.admin_client(),
            pair.secondary.admin_client(),
        )
    else:
        primary, secondary = request.getfixturevalue("azure_connection_strings")  # skips when not set
        b = Backend(
            "azure",
            primary,
            secondary,
            ServiceBusAdministrationClient.from_connection_string(primary),
            ServiceBusAdministrationClient.from_connection_string(secondary),
        )
    try:
        yield b
    finally:
        b.cleanup()


def _receive_all(conn: str, queue: str, expected: int, wait: float = 5) -> list[Any]:
    out: list[Any] = []
    with (
        ServiceBusClient.from_connection_string(conn) as client,
        client.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver,
    ):
        while len(out) < expected:
            batch = receiver.receive_messages(max_message_count=100, max_wait_time=wait)
            if not batch:
                break
            out.extend(batch)
    return out


def test_paired_sender_healthy_path_round_trips_every_property(backend: Backend) -> None:
    queue = backend.queue("props")
    when = datetime(2026, 5, 1, 12, 30, 15, 123000, tzinfo=timezone.utc)
    originals = [
        OutboundMessage(
            body=f"body-{i}",
            message_id=f"id-{i}",
            correlation_id=f"corr-{i}",
            content_type="text/plain",
            subject="subject",
            to="someone",
            reply_to="reply-queue",
            time_to_live=timedelta(hours=1),
            properties={"s": "x", "i": i, "f": 1.5, "b": True, "when": when, "u": uuid.UUID(int=i)},
        )
        for i in range(20)
    ]
    with PairedSender(backend.config(queue)) as sender:
        outcome = sender.send(originals)
    assert outcome.sent == {queue: 20} and outcome.total_diverted == 0
    received = {str(m.message_id): m for m in _receive_all(backend.primary, queue, 20)}
    assert sorted(received) == sorted(f"id-{i}" for i in range(20))
    for original in originals:
        got = received[str(original.message_id)]
        assert str(got) == original.body
        assert (got.correlation_id, got.content_type, got.subject, got.to, got.reply_to) == (
            original.correlation_id,
            "text/plain",
            "subject",
            "someone",
            "reply-queue",
        )
        assert got.time_to_live == timedelta(hours=1)
        props = {k.decode() if isinstance(k, bytes) else k: v for k, v in got.application_properties.items()}
        assert props["i"] == original.properties["i"] and props["b"] is True and props["f"] == 1.5
        assert got.sequence_number is not None and got.enqueued_time_utc is not None


def test_schedule_cancel_probe_leaves_nothing_deliverable(backend: Backend) -> None:
    queue = backend.queue("probe")
    config = backend.config(queue, failover_interval=0)
    clock = FakeClock()  # the state machine's time; the network is real
    with PairedSender(config, clock=clock) as sender:
        # Put the entity in FAILED_OVER as the state table would at batch start, then let the probe run.
        sender.registry.entity(
            namespace_key(config.primary),
            queue,
            failover_interval=0.0,
            ping_interval=config.ping_primary_interval,
        ).restore(EntityState.FAILED_OVER)
        assert sender.maintain().probes == ()  # not due before the ping interval
        clock.advance(config.ping_primary_interval)
        outcome = sender.maintain()
    assert [p.ok for p in outcome.probes] == [True]
    assert sender.entity_state(queue) is EntityState.HEALTHY
    runtime = backend.primary_admin.get_queue_runtime_properties(queue)
    assert (runtime.active_message_count, runtime.scheduled_message_count) == (0, 0)
    leftovers = _receive_all(backend.primary, queue, 1, wait=2)
    assert not [m for m in leftovers if is_probe(m)] and not leftovers


def test_provisioning_is_idempotent(backend: Backend) -> None:
    config = backend.config("unused", backlog_queue_count=2)
    first = provision_backlog_queues(config, admin_client=backend.secondary_admin, retry_pause=1)
    backend.created_secondary.extend(first.created)
    assert first.created == [f"{backend.prefix}/x-servicebus-transfer/{i}" for i in range(2)]
    second = provision_backlog_queues(config, admin_client=backend.secondary_admin, retry_pause=1)
    assert second.created == [] and second.summary().endswith("all 2 present")
    props = backend.secondary_admin.get_queue(first.created[0])
    assert props.max_delivery_count == 2147483647
    assert props.lock_duration == timedelta(minutes=1)
    assert props.dead_lettering_on_message_expiration is True
