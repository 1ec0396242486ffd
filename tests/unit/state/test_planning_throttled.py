"""Time spent backing off on "server busy" reaches the events table (issue 21 item 4, SPEC L4): ``plan_batch``
writes a ``throttled`` event per entity and task (``count`` = milliseconds), through the ``foreachBatch`` sink's
``record_batch`` and the data source's ``commit_write`` alike, and ``spark-sb status`` shows it in seconds."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from spark_sb.admin.status import format_status, read_status
from spark_sb.failover.outcome import SendOutcome
from spark_sb.spark.datasource import TaskReport, WritePlan, commit_write, parse_options
from spark_sb.spark.sink import ServiceBusSink
from spark_sb.state.planning import plan_batch, throttled_millis
from spark_sb.state.records import BATCH_COMMITTED, EVENTS, SENT, THROTTLED, PartitionResult
from spark_sb.state.store import MemoryStateStore
from tests.unit.sender.rig import make_config
from tests.unit.spark.test_datasource import _opts

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)
NS = "primary.servicebus.windows.net"


def _result(outcome: SendOutcome, host: str = "h1", rows: int = 0) -> PartitionResult:
    return PartitionResult(host, rows, outcome)


def test_a_throttled_entity_gets_an_event_with_the_milliseconds_backed_off_per_task() -> None:
    slow = SendOutcome(sent={"orders": 5, "audit": 1}, throttled={"orders": 2.3456, "audit": 0.0004})
    other = SendOutcome(sent={"orders": 4}, throttled={"orders": 0.5})
    calm = SendOutcome(sent={"orders": 3}, throttled={"orders": 0.0})  # a zero entry is no throttling
    writes = plan_batch(
        sink_id="s",
        batch_id=4,
        namespace=NS,
        backlog_namespace=None,
        results=[_result(slow, rows=6), _result(other, "h2", rows=4), _result(calm, "h3", rows=3)],
        previous=[],
        now=T0,
    )
    throttled = [
        (e.entity, e.count, e.executor_host, e.error_class, e.namespace)
        for e in writes.events
        if e.event == THROTTLED
    ]
    assert throttled == [
        ("audit", 1, "h1", "server_busy", NS),  # under a millisecond still says it happened
        ("orders", 2346, "h1", "server_busy", NS),
        ("orders", 500, "h2", "server_busy", NS),
    ]
    detail = next(e.detail for e in writes.events if e.event == THROTTLED and e.entity == "orders")
    assert "backed off 2.3 s" in detail
    assert writes.events[-1].event == BATCH_COMMITTED and writes.events[-1].count == 13
    assert all(e.batch_id == 4 and e.sink_id == "s" for e in writes.events)
    assert writes.entities == ()  # throttling is not an outage: no entity changes state
    assert THROTTLED in EVENTS


def test_no_throttled_event_without_throttling() -> None:
    writes = plan_batch(
        sink_id="s",
        batch_id=1,
        namespace=NS,
        backlog_namespace=None,
        results=[_result(SendOutcome(sent={"orders": 2}), rows=2)],
        previous=[],
        now=T0,
    )
    assert [e.event for e in writes.events] == [SENT, BATCH_COMMITTED]


def test_throttled_millis_rounds_and_never_reports_zero_for_a_wait() -> None:
    assert [throttled_millis(s) for s in (0.0001, 0.0015, 1.0, 61.2345)] == [1, 2, 1000, 61234]


def test_the_foreach_batch_sink_records_the_throttled_time() -> None:
    store = MemoryStateStore()
    sink = ServiceBusSink(make_config(sink_id="s"), store=store, sync_writes=True)
    outcome = SendOutcome(sent={"orders": 10}, throttled={"orders": 1.25})
    merged = sink.record_batch(3, [_result(outcome, rows=10)], [], store, now=lambda: T0)
    assert merged.throttled == {"orders": 1.25}
    rows = [(e.batch_id, e.entity, e.count) for e in store.read_events("s") if e.event == THROTTLED]
    assert rows == [(3, "orders", 1250)]


def test_the_data_source_commit_records_it_and_status_shows_it_in_seconds(tmp_path: Path) -> None:
    pytest.importorskip("deltalake")
    from spark_sb.state.deltars import DeltaRsStateStore

    state = tmp_path / "state"
    config = parse_options(_opts(entity="orders", sink_id="s", state_location=str(state))).config
    reports = [
        TaskReport(
            7, 3, PartitionResult("h1", 3, SendOutcome(sent={"orders": 3}, throttled={"orders": 4.2}))
        ),
        TaskReport(7, 2, PartitionResult("h2", 2, SendOutcome(sent={"orders": 2}))),
    ]
    outcome = commit_write(WritePlan(config, "s", str(state)), 7, reports)
    assert outcome is not None and outcome.throttled == {"orders": 4.2}
    events = DeltaRsStateStore(str(state)).read_events("s")
    assert [(e.batch_id, e.entity, e.count, e.executor_host) for e in events if e.event == THROTTLED] == [
        (7, "orders", 4200, "h1")
    ]

    status = read_status(config, depths=False)
    text = format_status(status, T0 + timedelta(days=1))
    (line,) = [x for x in text.splitlines() if " throttled " in x]
    assert "orders" in line and "backed off 4.2 s" in line and "(server_busy)" in line
    assert "count 4200" not in line
