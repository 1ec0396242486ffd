"""SPEC B14, the exactly-once horizon, against two local namespaces with the unmodified SDK over TCP: ``spark-sb
provision`` and ``status`` show each primary entity's duplicate detection (text and JSON) and warn of one without it
and of one whose window is shorter than ``exactly_once_horizon``; a send to a stalled entity - its batch written,
no answer - is diverted with the time of that attempt, which the syphon strips, and counts as a possible duplicate
(and the job's ledger writes as an event that ``status`` sums) once the entity's window has passed since."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient

from servicebus_local.model import QueueSettings
from spark_sb.admin.cli import main
from spark_sb.config.namespace import RetryConfig
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.failover.records import EntityState
from spark_sb.failover.registry import FailoverRegistry
from spark_sb.message.backlog import BACKLOG_AMBIGUOUS
from spark_sb.message.outbound import OutboundMessage
from spark_sb.sender.paired import PairedSender
from spark_sb.spark.syphon_drain import outcome_rows
from spark_sb.spark.syphon_ledger import SyphonBatchWriter
from spark_sb.state.deltars import DeltaRsStateStore
from spark_sb.state.records import POSSIBLE_DUPLICATE
from spark_sb.syphon.mover import Syphon

from . import rigs
from .rigs import BACKLOG, take_messages

pytestmark = pytest.mark.slow

#: The short window of ``orders``: the syphon moves its diverted messages after it has passed.
SHORT = timedelta(seconds=2)


@pytest.fixture
def pair(namespace_pair: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The primary: ``orders`` (duplicate detection, a 2 s window), ``plain`` (none), ``kept`` (a 2 h window); the
    secondary: the backlog queues. The local CA trusted as a user trusts it (REQUESTS_CA_BUNDLE)."""
    broker = namespace_pair.primary.broker
    broker.create_queue(
        "orders",
        QueueSettings(requires_duplicate_detection=True, duplicate_detection_history_time_window=SHORT),
    )
    broker.create_queue("plain")
    broker.create_queue(
        "kept",
        QueueSettings(
            requires_duplicate_detection=True, duplicate_detection_history_time_window=timedelta(hours=2)
        ),
    )
    for name in BACKLOG:
        namespace_pair.secondary.broker.create_queue(name, QueueSettings(lock_duration=timedelta(seconds=30)))
    bundle = Path(namespace_pair.primary.ca_file).read_text()
    other = Path(namespace_pair.secondary.ca_file).read_text()
    path = Path(namespace_pair.primary.ca_file).with_name("horizon-bundle.pem")
    path.write_text(bundle if other == bundle else bundle + "\n" + other)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(path))
    return namespace_pair


def config_for(pair: Any, **overrides: Any) -> ServiceBusConfig:
    """The lifecycle tests' sender config (``orders``, the two backlog queues, 3 s a send, no retries), failing
    over after 1 s and probing the primary only every 30 s (the stalled entity stays failed over)."""
    base = rigs.config_for(pair.primary, pair.secondary, 1.0)
    retry = RetryConfig(total=0, backoff_factor=0.05, backoff_max=0.2)
    return replace(base, ping_primary_interval=30.0, retry=retry, **overrides)


def write_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pair: Any) -> Path:
    monkeypatch.setenv("SB_TEST_PRIMARY", pair.primary.connection_string)
    monkeypatch.setenv("SB_TEST_SECONDARY", pair.secondary.connection_string)
    path = tmp_path / "horizon.yaml"
    path.write_text(
        "primary:\n"
        '  connection_string: "${env:SB_TEST_PRIMARY}"\n'
        "  namespace_name: primary\n"
        "secondary:\n"
        '  connection_string: "${env:SB_TEST_SECONDARY}"\n'
        f"backlog_queue_count: {len(BACKLOG)}\n"
        "entity: orders\n"
        "exactly_once_horizon: 1h\n"
        f"state_location: {tmp_path / 'state'}\n"
    )
    return path


def test_provision_and_status_show_each_primary_entitys_duplicate_detection_and_warn(
    pair: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(write_config(tmp_path, monkeypatch, pair))
    named = ["--entity", "plain", "--entity", "kept"]
    assert main(["provision", "--config", config, *named]) == 0
    captured = capsys.readouterr()
    text = captured.out.split("duplicate detection of the primary entities (exactly_once_horizon 1 h):\n")[1]
    assert text.splitlines() == [
        "  orders                         queue  on, window 2 s",
        "    WARNING: orders: duplicate detection window 2 s is shorter than exactly_once_horizon 1 h - a message "
        "diverted after an ambiguous send that returns later than 2 s reaches it twice if that send had landed",
        "  plain                          queue  off",
        "    WARNING: plain: duplicate detection is off - a message diverted after an ambiguous send reaches it "
        "twice if that send had landed",
        "  kept                           queue  on, window 2 h",
    ]
    # orders' and plain's warnings, on stderr too
    assert captured.err.count("WARNING spark_sb: exactly-once horizon:") == 2

    assert main(["provision", "--config", config, "--json", *named]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["usable_queues"] == BACKLOG
    dedup = report["duplicate_detection"]
    assert dedup["exactly_once_horizon_seconds"] == 3600.0
    assert [
        (e["entity"], e["duplicate_detection"], e["window_seconds"], bool(e["warning"]))
        for e in dedup["entities"]
    ] == [
        ("orders", True, 2.0, True),
        ("plain", False, None, True),
        ("kept", True, 7200.0, False),
    ]

    assert (
        main(["status", "--config", config, "--entity", "plain", "--entity", "kept", "--entity", "nope"]) == 0
    )
    out = capsys.readouterr().out
    assert "WARNING: orders: duplicate detection window 2 s is shorter than exactly_once_horizon 1 h" in out
    assert "WARNING: plain: duplicate detection is off" in out
    assert "kept                           queue  on, window 2 h" in out
    assert "WARNING: nope: duplicate detection could not be read (no queue or topic of that name)" in out
    assert main(["status", "--config", config, "--json", "--no-depths", "--entity", "plain"]) == 0
    entities = json.loads(capsys.readouterr().out)["duplicate_detection"]["entities"]
    assert [(e["entity"], e["kind"], e["window_seconds"]) for e in entities] == [
        ("orders", "queue", 2.0),
        ("plain", "queue", None),
    ]


@pytest.fixture
def sender(pair: Any) -> Iterator[PairedSender]:
    s = PairedSender(config_for(pair), registry=FailoverRegistry())
    yield s
    s.close()


def _ambiguous_diversion(pair: Any, sender: PairedSender, entity: str, ids: list[str]) -> datetime:
    """``ids`` sent to ``entity`` while it stalls (its link open: the batch is written, never answered), until they
    are diverted; returns when that send began."""
    warm = sender.send([OutboundMessage(body=b"w", message_id=f"warm-{entity}", entity=entity)])
    assert warm.sent == {entity: 1}
    pair.primary.faults.stall_entity(entity)
    try:
        began = datetime.now(timezone.utc)
        out = sender.send([OutboundMessage(body=b"x", message_id=i, entity=entity) for i in ids])
        assert out.diverted_by_entity == {entity: len(ids)}, out
        assert sender.entity_state(entity) is EntityState.FAILED_OVER
    finally:
        pair.primary.faults.stall_entity(entity, False)
    return began


def _backlog_marks(pair: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    with ServiceBusClient.from_connection_string(pair.secondary.connection_string) as client:
        for name in BACKLOG:
            with client.get_queue_receiver(name) as receiver:
                for m in receiver.peek_messages(max_message_count=50):
                    props = {
                        (k.decode() if isinstance(k, bytes) else k): v
                        for k, v in (m.application_properties or {}).items()
                    }
                    found[str(m.message_id)] = props.get(BACKLOG_AMBIGUOUS)
    return found


def test_an_ambiguous_send_goes_through_the_backlog_and_is_a_possible_duplicate_once_its_window_passed(
    pair: Any,
    sender: PairedSender,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    began = _ambiguous_diversion(pair, sender, "orders", ["o-1", "o-2"])
    _ambiguous_diversion(pair, sender, "kept", ["k-1"])
    marks = _backlog_marks(pair)
    assert set(marks) == {"o-1", "o-2", "k-1"}
    for message_id in ("o-1", "o-2"):  # the SDK gives an AMQP timestamp back as milliseconds
        at = datetime.fromtimestamp(marks[message_id] / 1000, timezone.utc)
        assert began - timedelta(seconds=0.1) <= at <= began + timedelta(seconds=1.5)

    time.sleep(SHORT.total_seconds() + 0.5)  # orders' window passes; kept's (2 h) does not
    config = config_for(pair)
    with Syphon(config, healthy_hints={"orders": "healthy", "kept": "healthy"}, record_ids=True) as syphon:
        outcome = syphon.drain_all(max_wait=0.5)
    assert outcome.forwarded == {"orders": 2, "kept": 1}, outcome.errors
    assert outcome.possible_duplicates == {"orders": 2}
    assert sorted(i or "" for _, i in outcome.possible_duplicate_ids) == ["o-1", "o-2"]
    moved = take_messages(pair.primary, "orders")
    assert {str(m.message_id) for m in moved} >= {"o-1", "o-2"}
    for m in moved:  # the primary never sees the backlog form's properties
        assert not any(
            str(k).endswith(("ambiguous-attempt-utc", "x-ms-path")) for k in m.application_properties or {}
        )

    # the syphon job's ledger writes them as events, which `spark-sb status` sums per entity
    rows = [r for q in BACKLOG for r in outcome_rows(q, False, outcome) if r[3] == POSSIBLE_DUPLICATE][:1]
    store = DeltaRsStateStore(str(tmp_path / "state"))
    SyphonBatchWriter(config, store=store).record(0, [(r[0], r[2], r[3], r[4], r[6]) for r in rows], store)
    assert [(e.event, e.entity, e.count) for e in store.read_events() if e.event == POSSIBLE_DUPLICATE] == [
        (POSSIBLE_DUPLICATE, "orders", 2)
    ]
    path = write_config(tmp_path, monkeypatch, pair)
    assert main(["status", "--config", str(path), "--json", "--no-depths", "--no-duplicate-detection"]) == 0
    summed = json.loads(capsys.readouterr().out)["possible_duplicates"]
    assert [(d["entity"], d["count"]) for d in summed] == [("orders", 2)]
