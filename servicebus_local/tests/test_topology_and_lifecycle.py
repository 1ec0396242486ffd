"""Topology files (unit) and namespace lifecycle details (connections released, fixtures)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from servicebus_local.durations import MAX_DURATION
from servicebus_local.fixtures import NamespacePair
from servicebus_local.server import LocalNamespace, verify_sas_token
from servicebus_local.topology import TopologyError, parse_duration, parse_topology

from .conftest import wait_for

TOPOLOGY = """
queues:
  - plain
  - name: payments
    lock_duration: 30s
    max_delivery_count: 5
    requires_duplicate_detection: true
    duplicate_detection_history_time_window: PT10M
    default_message_time_to_live: max
topics:
  - name: events
    settings:
      max_size_in_megabytes: 2048
    subscriptions:
      - audit
      - name: billing
        requires_session: true
        lock_duration: 2m
"""


def test_parse_topology() -> None:
    import yaml

    topo = parse_topology(yaml.safe_load(TOPOLOGY))
    assert [q.name for q in topo.queues] == ["plain", "payments"]
    payments = topo.queues[1].settings
    assert payments.lock_duration == timedelta(seconds=30)
    assert payments.max_delivery_count == 5
    assert payments.requires_duplicate_detection is True
    assert payments.duplicate_detection_history_time_window == timedelta(minutes=10)
    assert payments.default_message_time_to_live == MAX_DURATION
    (events,) = topo.topics
    assert events.settings.max_size_in_megabytes == 2048
    assert [s.name for s in events.subscriptions] == ["audit", "billing"]
    assert events.subscriptions[1].settings.requires_session is True
    assert events.subscriptions[1].settings.lock_duration == timedelta(minutes=2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("queues:\n  - name: q\n    lock_durationn: 1s\n", "unknown setting 'lock_durationn'"),
        ("queues:\n  - name: q\n    max_delivery_count: many\n", "an integer is expected"),
        ("queues:\n  - name: q\n    lock_duration: soon\n", "cannot read 'soon' as a duration"),
        ("queuez: []\n", "unknown keys"),
    ],
)
def test_topology_errors_name_the_key(text: str, message: str) -> None:
    import yaml

    with pytest.raises(TopologyError, match=message):
        parse_topology(yaml.safe_load(text))


def test_parse_duration_forms() -> None:
    assert parse_duration("PT1M", "x") == timedelta(minutes=1)
    assert parse_duration("P1DT2H", "x") == timedelta(days=1, hours=2)
    assert parse_duration(1.5, "x") == timedelta(seconds=1.5)
    assert parse_duration("500ms", "x") == timedelta(milliseconds=500)
    assert parse_duration("14d", "x") == timedelta(days=14)


def test_verify_sas_token() -> None:
    from azure.servicebus._pyamqp.utils import generate_sas_token

    token = generate_sas_token("sb://127.0.0.1:5672/q", "Root", "k3y", 4_000_000_000)
    assert verify_sas_token(token, "Root", "k3y", now=1.0) is None
    assert verify_sas_token(token, "Root", "other", now=1.0) == "invalid signature"
    assert verify_sas_token(token, "Other", "k3y", now=1.0) == "unknown shared access key name"
    assert verify_sas_token(token, "Root", "k3y", now=5_000_000_000) == "expired token"
    assert verify_sas_token("Bearer x", "Root", "k3y") is not None


def test_topology_file_creates_entities(tmp_path: Path) -> None:
    path = tmp_path / "topology.yaml"
    path.write_text(TOPOLOGY)
    with LocalNamespace("topo", topology=path) as ns:
        assert ns.broker.get_queue("payments").settings.max_delivery_count == 5
        assert ns.broker.get_subscription("events", "billing").settings.requires_session is True


def test_connections_are_released_when_clients_close(local_namespace: LocalNamespace) -> None:
    with (
        ServiceBusClient.from_connection_string(local_namespace.connection_string) as c,
        c.get_queue_sender("q1") as s,
    ):
        s.send_messages(ServiceBusMessage("x"))
        assert local_namespace.connection_count >= 1
    wait_for(lambda: local_namespace.connection_count == 0)
    assert "SharedAccessKey=" in local_namespace.connection_string
    assert "key" not in repr(local_namespace).lower()


def test_namespace_pair_fixture(namespace_pair: NamespacePair) -> None:
    assert namespace_pair.primary.name == "primary"
    assert namespace_pair.secondary.name == "secondary"
    assert namespace_pair.primary.port != namespace_pair.secondary.port
    namespace_pair.secondary.broker.create_queue("primary/x-servicebus-transfer/0")
    with (
        ServiceBusClient.from_connection_string(namespace_pair.secondary.connection_string) as c,
        c.get_queue_sender("primary/x-servicebus-transfer/0") as s,
    ):
        s.send_messages(ServiceBusMessage("x"))
    assert (
        namespace_pair.secondary.broker.get_queue(
            "primary/x-servicebus-transfer/0"
        ).runtime.active_message_count
        == 1
    )
