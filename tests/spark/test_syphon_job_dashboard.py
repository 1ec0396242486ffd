"""The failover dashboard on local Spark: its data preparation over a small Delta state written by the store, and
the notebook's cells run with small ``dbutils`` / ``display`` stand-ins (install and restart cells skipped)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from spark_sb.admin.dashboard import prepare
from spark_sb.state.delta import DeltaStateStore, StateTables
from spark_sb.state.records import BatchWrites, Event, RejectRecord

from ..unit.test_notebooks import cells

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def _state(spark: Any, location: Path) -> StateTables:
    tables = StateTables(location=str(location))
    store = DeltaStateStore(spark, tables)

    def ev(minute: int, batch: int | None, event: str, count: int = 1, **kw: Any) -> Event:
        sink = kw.pop("sink_id", "orders-stream")
        return Event(T0 + timedelta(minutes=minute), sink, batch, event, namespace="p:1", count=count, **kw)

    store.write_batch(
        "orders-stream",
        0,
        BatchWrites((ev(0, 0, "sent", 10, entity="orders"), ev(0, 0, "batch_committed", 10)), (), ()),
    )
    store.write_batch(
        "orders-stream",
        1,
        BatchWrites(
            (
                ev(1, 1, "state_change", entity="orders", from_state="healthy", to_state="failing"),
                ev(2, 1, "state_change", entity="orders", from_state="failing", to_state="failed_over"),
                ev(2, 1, "diverted", 8, entity="orders", backlog_queue="p/x-servicebus-transfer/0"),
                ev(2, 1, "sent", 2, entity="orders"),
                # a batch that diverts for two entities: one event per backlog queue, one more per entity without
                # a queue (state.planning); the messages are counted once
                ev(2, 1, "diverted", 5, backlog_queue="p/x-servicebus-transfer/1"),
                ev(2, 1, "diverted", 3, entity="orders"),
                ev(2, 1, "diverted", 2, entity="invoices"),
                ev(2, 1, "batch_committed", 16),
                ev(
                    2,
                    1,
                    "session_held",
                    entity="orders",
                    backlog_queue="p/x-servicebus-transfer/0",
                    detail="s1",
                ),
                ev(
                    2,
                    1,
                    "session_held",
                    entity="orders",
                    backlog_queue="p/x-servicebus-transfer/0",
                    detail="s2",
                ),
            ),
            (),
            (
                RejectRecord(
                    T0, "orders-stream", 1, "orders", "session_id", "longer than 128 characters (200)", "{}"
                ),
            ),
        ),
    )
    store.write_batch(
        "orders-stream",
        2,
        BatchWrites(
            (
                ev(
                    6,
                    2,
                    "session_returned",
                    entity="orders",
                    backlog_queue="p/x-servicebus-transfer/0",
                    detail="s1",
                ),
                ev(6, 2, "batch_committed", 3),
            ),
            (),
            (),
        ),
    )
    store.write_batch(
        "syphon/p",
        0,
        BatchWrites(
            (
                ev(
                    5,
                    0,
                    "moved",
                    6,
                    entity="orders",
                    sink_id="syphon/p",
                    backlog_queue="p/x-servicebus-transfer/0",
                ),
                ev(
                    5,
                    0,
                    "expired",
                    1,
                    entity="orders",
                    sink_id="syphon/p",
                    backlog_queue="p/x-servicebus-transfer/0",
                ),
            ),
            (),
            (),
        ),
    )
    return tables


def test_data_preparation_over_a_state_written_by_the_store(spark: Any, tmp_path: Path) -> None:
    charts = prepare(spark, _state(spark, tmp_path / "state"))
    timeline = [(r.entity, r.to_state, r.level) for r in charts["timeline"].collect()]
    assert timeline == [("orders", "failing", 1), ("orders", "failed_over", 2)]
    flow = [(r.sink_id, r.batch_id, r.sent, r.diverted) for r in charts["sent_vs_diverted"].collect()]
    assert flow == [("orders-stream", 0, 10, 0), ("orders-stream", 1, 2, 13)]
    depth = [
        (r.time.replace(tzinfo=timezone.utc), r.diverted, r.drained, r.depth)
        for r in charts["backlog_depth"].collect()
    ]
    assert depth == [(T0 + timedelta(minutes=2), 13, 0, 13), (T0 + timedelta(minutes=5), 0, 7, 6)]
    assert [(r.reason, r.rejected) for r in charts["rejects_by_reason"].collect()] == [
        ("longer than 128 characters (200)", 1)
    ]
    sessions = [
        (r.time.replace(tzinfo=timezone.utc), r.held, r.returned, r.draining)
        for r in charts["sessions"].collect()
    ]
    assert sessions == [(T0 + timedelta(minutes=2), 2, 0, 2), (T0 + timedelta(minutes=6), 0, 1, 1)]


class Widgets:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def text(self, name: str, default: str) -> None:
        self.values.setdefault(name, default)

    def get(self, name: str) -> str:
        return self.values[name]


class DbUtils:
    def __init__(self, values: dict[str, str]) -> None:
        self.widgets = Widgets(values)
        self.library = self

    def restartPython(self) -> None:  # noqa: N802 - the dbutils name
        pass


def test_the_dashboard_notebook_runs_with_stand_ins(spark: Any, tmp_path: Path) -> None:
    _state(spark, tmp_path / "state")
    shown: list[Any] = []
    scope: dict[str, Any] = {
        "spark": spark,
        "dbutils": DbUtils({"state_location": str(tmp_path / "state")}),
        "display": shown.append,
        "__name__": "__notebook__",
    }
    for kind, source in cells(ROOT / "notebooks" / "failover_dashboard.py"):
        if kind == "python":
            exec(compile(source, "failover_dashboard.py", "exec"), scope)  # noqa: S102 - the notebook under test
    assert len(shown) == 5
    assert [r.depth for r in shown[2].collect()] == [13, 6]
