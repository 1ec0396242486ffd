"""Time spent backing off on "server busy" reaches the events table (issue 21 item 4, SPEC L4): the ``throttled``
event that ``plan_batch`` writes per entity and task (``count`` = milliseconds; tested in ``test_planning.py``) is
recorded through the ``foreachBatch`` sink's ``record_batch`` and the data source's ``commit_write`` alike, and
``spark-sb status`` shows it in seconds."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from spark_sb.admin.status import format_status, read_status
from spark_sb.failover.outcome import SendOutcome
from spark_sb.spark.datasource import TaskReport, WritePlan, commit_write
from spark_sb.spark.datasource_options import parse_options
from spark_sb.spark.sink import ServiceBusSink
from spark_sb.state.records import THROTTLED, PartitionResult
from spark_sb.state.store import MemoryStateStore
from tests.unit.sender.rig import make_config
from tests.unit.spark.test_datasource import _opts

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


def _result(outcome: SendOutcome, host: str = "h1", rows: int = 0) -> PartitionResult:
    return PartitionResult(host, rows, outcome)


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
