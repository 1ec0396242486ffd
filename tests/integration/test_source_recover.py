"""``spark-sb source recover`` (issue 48, SOURCE.md §6): deferred messages no offset names - a query's checkpoint
lost after its defer - returned to their queue without Spark, on a local namespace with the unmodified SDK."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from servicebus_local.model import QueueSettings
from spark_sb.admin.cli import main


def _orphans(ns: Any, queue: str, total: int, deferred: int) -> list[int]:
    """Send ``total`` messages (ids m0..), defer the first ``deferred`` as a killed query left them: their numbers."""
    with ServiceBusClient.from_connection_string(ns.connection_string) as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages([ServiceBusMessage(f"b{i}", message_id=f"m{i}") for i in range(total)])
        with client.get_queue_receiver(queue, prefetch_count=0) as receiver:
            got = receiver.receive_messages(max_message_count=deferred, max_wait_time=5)
            assert len(got) == deferred
            for m in got:
                receiver.defer_message(m)
            return [int(m.sequence_number) for m in got]


def _receive_all(ns: Any, queue: str) -> list[str]:
    ids: list[str] = []
    client = ServiceBusClient.from_connection_string(ns.connection_string)
    with client, client.get_queue_receiver(queue, prefetch_count=0) as receiver:
        while batch := receiver.receive_messages(max_message_count=50, max_wait_time=1):
            for m in batch:
                ids.append(str(m.message_id))
                receiver.complete_message(m)
    return ids


@pytest.fixture
def config(local_namespace: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SB_TEST_PRIMARY", local_namespace.connection_string)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", local_namespace.ca_file)
    path = tmp_path / "source.yaml"
    path.write_text('primary:\n  connection_string: "${env:SB_TEST_PRIMARY}"\n')
    return path


def test_recover_returns_exactly_the_orphan_deferred_messages_and_a_dry_run_changes_nothing(
    local_namespace: Any, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local_namespace.broker.create_queue("orders", QueueSettings())
    _orphans(local_namespace, "orders", total=12, deferred=7)

    assert main(["source", "recover", "--config", str(config), "--entity", "orders", "--dry-run"]) == 0
    assert "7 deferred messages" in capsys.readouterr().out
    assert main(["source", "recover", "--config", str(config), "--entity", "orders", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["found"], report["recovered"], report["failed"]) == (7, 7, 0)
    ids = _receive_all(local_namespace, "orders")
    assert sorted(ids) == sorted(
        f"m{i}" for i in range(12)
    )  # the 5 never received and the 7 orphans, once each
    props = local_namespace.admin_client().get_queue_runtime_properties("orders")
    assert props.total_message_count == 0  # no deferred original left behind


def test_recover_leaves_messages_within_the_duplicate_detection_window_deferred(
    local_namespace: Any, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local_namespace.broker.create_queue("dedup", QueueSettings(requires_duplicate_detection=True))
    numbers = _orphans(local_namespace, "dedup", total=3, deferred=3)

    assert main(["source", "recover", "--config", str(config), "--entity", "dedup"]) == 1
    assert (
        "3 left deferred: enqueued within the queue's duplicate-detection window" in capsys.readouterr().out
    )
    client = ServiceBusClient.from_connection_string(local_namespace.connection_string)
    with client, client.get_queue_receiver("dedup", prefetch_count=0) as receiver:
        still = receiver.receive_deferred_messages(numbers, timeout=5)
        assert sorted(str(m.message_id) for m in still) == ["m0", "m1", "m2"]  # not lost, still deferred


def test_recover_refuses_a_subscription_in_one_line(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["source", "recover", "--config", str(config), "--entity", "t1/subscriptions/s1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "recoverDeferred=true" in err
