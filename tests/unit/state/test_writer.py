"""The group commit of the state writes and the driver's view of the entities (spark_sb.state.writer):
:func:`coalesce`, :class:`EntityView` (a fake clock for its age), :class:`StateWriter` (when it commits, what it
raises, how it refreshes the view, finishing through deltalake once Spark is stopped) and :func:`session_gone`.
The writer's thread is awaited through the store it writes to (events, no sleeps)."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from servicebus_local.clock import FakeClock
from spark_sb.state.delta import StateTables
from spark_sb.state.records import BATCH_COMMITTED, SENT, BatchWrites, EntityRecord, Event, RejectRecord
from spark_sb.state.store import MemoryStateStore
from spark_sb.state.writer import (
    EntityView,
    StateWriteError,
    StateWriter,
    _fallback_for,
    coalesce,
    session_gone,
)
from tests.unit.state.store_contract import NS

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc)
WAIT = 10.0  # seconds a test waits at most for the writer's thread (it takes milliseconds)


# ------------------------------------------------------------------------------- group commit and the view
def test_coalesce_makes_one_commit_of_several_batches() -> None:
    t0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)

    def writes(batch: int, *records: EntityRecord, rejects: int = 0) -> BatchWrites:
        rej = tuple(RejectRecord(t0, "s", batch, "orders", "body", "null", "{}") for _ in range(rejects))
        return BatchWrites(
            (Event(t0, "s", batch, SENT), Event(t0, "s", batch, BATCH_COMMITTED)), records, rej
        )

    failed = EntityRecord(NS, "orders", "failed_over", t0 + timedelta(seconds=5))
    healthy_older = EntityRecord(NS, "orders", "healthy", t0)
    same_time_later_batch = replace(failed, updated_by="batch 9")
    other = EntityRecord(NS, "invoices", "failing", t0)
    version, merged = coalesce(
        [
            (9, writes(9, same_time_later_batch)),
            (7, writes(7, failed, rejects=2)),
            (8, writes(8, healthy_older, other)),
        ]
    )
    assert version == 9  # the highest batch id: the group's txnVersion
    assert [(e.batch_id, e.event) for e in merged.events if e.event == BATCH_COMMITTED] == [
        (7, BATCH_COMMITTED),
        (8, BATCH_COMMITTED),
        (9, BATCH_COMMITTED),
    ]
    assert len(merged.events) == 6 and [r.batch_id for r in merged.rejects] == [7, 7]
    assert merged.entities == (other, same_time_later_batch)  # newest per key; a tie goes to the later batch
    with pytest.raises(ValueError):
        coalesce([])


def test_entity_view_overlays_planned_records_until_a_later_read_has_them() -> None:
    t0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)
    clock = FakeClock()
    view = EntityView(clock.monotonic)
    assert not view.loaded and view.records() == [] and view.age() == float("inf")
    table = [EntityRecord(NS, "orders", "healthy", t0), EntityRecord(NS, "invoices", "failed_over", t0)]
    view.refreshed(table)
    clock.advance(7)
    assert view.age() == 7
    planned = EntityRecord(NS, "orders", "failed_over", t0 + timedelta(seconds=1))
    view.planned(1, [planned])
    assert view.loaded and view.records() == [table[1], planned]
    newer = EntityRecord(NS, "orders", "healthy", t0 + timedelta(seconds=9))
    view.refreshed([newer, table[1]])  # another writer's newer row wins over the planned one
    assert view.records() == [table[1], newer]
    view.refreshed(table)  # a read older than the planned record's commit: the planned record still counts
    assert view.records() == [table[1], planned]
    view.refreshed(table, written_through=1)  # taken after write 1: what the table says is the truth
    assert view.records() == [table[1], table[0]]
    view.reset()
    assert not view.loaded


def test_a_later_write_planning_an_older_record_does_not_replace_the_newer_planned_one() -> None:
    view = EntityView(FakeClock().monotonic)
    newer = EntityRecord(NS, "orders", "failed_over", NOW + timedelta(seconds=5))
    older = EntityRecord(NS, "orders", "healthy", NOW)
    same_time = replace(newer, updated_by="write 3")
    view.planned(1, [newer])
    view.planned(2, [older])
    assert view.records() == [newer]
    view.planned(3, [same_time])  # a tie goes to the later write
    assert view.records() == [same_time]
    view.refreshed([], written_through=2)  # write 3 is not in that read: its record stays
    assert view.records() == [same_time]


def test_confirming_the_view_restarts_its_age_and_drops_what_the_table_has_but_not_before_a_read() -> None:
    clock = FakeClock()
    view = EntityView(clock.monotonic)
    planned = EntityRecord(NS, "orders", "failed_over", NOW)
    view.planned(1, [planned])
    view.confirmed(1)  # nothing read yet: nothing to confirm
    assert not view.loaded and view.age() == float("inf") and view.records() == [planned]
    view.refreshed([])
    clock.advance(30)
    view.confirmed(0)  # write 1 is not known to be in the table yet
    assert view.age() == 0 and view.records() == [planned]
    clock.advance(5)
    view.confirmed(1)
    assert view.age() == 0 and view.records() == []
    clock.advance(5)
    view.confirmed()  # no write of this sink known to be in it: the age only
    assert view.age() == 0


# ------------------------------------------------------------------------------------------- the writer
def _batch(sink: str, batch_id: int) -> BatchWrites:
    return BatchWrites(
        (Event(NOW, sink, batch_id, "sent", count=3), Event(NOW, sink, batch_id, BATCH_COMMITTED, count=3)),
        (EntityRecord("primary", "orders", "failed_over", NOW, "refused"),) if batch_id == 1 else (),
        (),
    )


def _quiet(batch_id: int) -> BatchWrites:
    """A batch with no news (no entity record, no reject): it waits for the commit interval."""
    return BatchWrites((Event(NOW, "s", batch_id, BATCH_COMMITTED, count=1),), (), ())


class SignallingStore(MemoryStateStore):
    """The in-memory store, telling the test each group commit and each read of the entities table; a write can
    be held until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.written = threading.Semaphore(0)
        self.read = threading.Semaphore(0)
        self.go = threading.Event()
        self.go.set()
        self.groups: list[tuple[int, list[int]]] = []  # (txnVersion, the batch ids of the events)
        self.reads = 0

    def write_batch(self, sink_id: str, batch_id: int, writes: BatchWrites) -> None:
        assert self.go.wait(WAIT)
        super().write_batch(sink_id, batch_id, writes)
        self.groups.append((batch_id, sorted({e.batch_id for e in writes.events if e.batch_id is not None})))
        self.written.release()

    def read_entities(self) -> list[EntityRecord]:
        self.reads += 1
        try:
            return super().read_entities()
        finally:
            self.read.release()


def test_quiet_batches_wait_for_the_interval_and_a_flush_commits_them_as_one_group() -> None:
    store = SignallingStore()
    writer = StateWriter(store, "s", EntityView(), refresh=False, commit_interval=3600)
    for batch_id in range(3):
        writer.submit(batch_id, batch_id, _quiet(batch_id))
    # nothing says "now": a commit within this (bounded) wait would be a commit before the interval
    assert not store.written.acquire(timeout=0.1)
    assert writer.pending == 3 and writer.commits == 0 and store.groups == []
    writer.flush(timeout=WAIT)
    assert store.groups == [(2, [0, 1, 2])] and writer.commits == 1 and writer.pending == 0
    assert store.last_committed("s") == 2
    writer.close(timeout=WAIT)


def test_a_quiet_batch_is_committed_by_itself_once_the_interval_is_over() -> None:
    store = SignallingStore()
    writer = StateWriter(store, "s", EntityView(), refresh=False, commit_interval=0.05)
    writer.submit(0, 0, _quiet(0))
    assert store.written.acquire(timeout=WAIT)  # no flush
    assert store.groups == [(0, [0])]
    writer.close(timeout=WAIT)


def test_the_commit_interval_runs_on_the_injected_clock() -> None:
    """An hour's interval on a clock that reads two hours later once the batch is queued: committed at once,
    without a flush and without waiting an hour of real time."""
    readings = iter([0.0])
    store = SignallingStore()
    writer = StateWriter(
        store,
        "s",
        EntityView(),
        refresh=False,
        commit_interval=3600,
        clock=lambda: next(readings, 7200.0),
    )
    writer.submit(0, 0, _quiet(0))
    assert store.written.acquire(timeout=WAIT)  # no flush
    assert store.groups == [(0, [0])]
    writer.close(timeout=WAIT)


@pytest.mark.parametrize(
    "news",
    [
        pytest.param(BatchWrites((), (EntityRecord(NS, "orders", "failing", NOW),), ()), id="a state change"),
        pytest.param(
            BatchWrites((), (), (RejectRecord(NOW, "s", 0, None, None, "too large", "{}"),)), id="a reject"
        ),
    ],
)
def test_a_batch_with_news_is_committed_at_once(news: BatchWrites) -> None:
    store = SignallingStore()
    writer = StateWriter(store, "s", EntityView(), refresh=False, commit_interval=3600)
    writer.submit(0, 0, news)
    assert store.written.acquire(timeout=WAIT)  # no flush, and an hour's interval
    assert writer.commits == 1
    writer.close(timeout=WAIT)


def test_half_the_pending_limit_queued_is_committed_without_waiting_for_the_interval() -> None:
    store = SignallingStore()
    writer = StateWriter(store, "s", EntityView(), refresh=False, commit_interval=3600, max_pending=4)
    writer.submit(0, 0, _quiet(0))
    writer.submit(1, 1, _quiet(1))  # two of four: half the limit
    assert store.written.acquire(timeout=WAIT)  # no flush, and an hour's interval
    assert store.groups == [(1, [0, 1])]
    writer.close(timeout=WAIT)


class SignallingView(EntityView):
    """The view, telling the test each time the writer confirms it."""

    def __init__(self) -> None:
        super().__init__()
        self.confirmations = threading.Semaphore(0)

    def confirmed(self, written_through: int | None = None) -> None:
        super().confirmed(written_through)
        self.confirmations.release()


def test_after_a_commit_the_view_is_read_again_only_when_the_entities_table_moved() -> None:
    store = SignallingStore()
    view = SignallingView()
    writer = StateWriter(store, "s", view, commit_interval=3600)
    failing = EntityRecord(NS, "orders", "failing", NOW)
    writer.submit(0, 0, BatchWrites((Event(NOW, "s", 0, BATCH_COMMITTED),), (failing,), ()))
    assert store.written.acquire(timeout=WAIT)
    assert not view.loaded  # nobody needs the view before the next batch
    writer.submit(1, 1, _quiet(1))
    assert store.read.acquire(timeout=WAIT)  # the entity write moved the table's version: read it
    writer.flush(timeout=WAIT)  # commits batch 1: no entity write, the version stays
    assert view.loaded and view.records() == [failing] and store.reads == 1
    writer.submit(2, 2, _quiet(2))
    assert view.confirmations.acquire(timeout=WAIT)  # confirmed, not read again
    assert store.reads == 1
    writer.close(timeout=WAIT)
    assert [v for v, _ in store.groups] == [0, 1, 2]


def test_a_failed_write_is_raised_once_naming_its_batches_and_later_batches_are_written() -> None:
    class FailingOnce(SignallingStore):
        def write_batch(self, sink_id: str, batch_id: int, writes: BatchWrites) -> None:
            if not self.groups and not getattr(self, "failed", False):
                self.failed = True
                raise RuntimeError("disk full")
            super().write_batch(sink_id, batch_id, writes)

    store = FailingOnce()
    writer = StateWriter(store, "s", EntityView(), refresh=False, commit_interval=3600)
    writer.submit(0, 4, _quiet(4))
    writer.submit(1, 5, _quiet(5))
    with pytest.raises(StateWriteError, match=r"batches \[4, 5\] failed: RuntimeError: disk full") as raised:
        writer.flush(timeout=WAIT)
    assert isinstance(raised.value.__cause__, RuntimeError)
    writer.raise_error()  # raised once
    writer.submit(2, 6, _quiet(6))
    writer.close(timeout=WAIT)
    assert store.groups == [(6, [6])]


def test_a_flush_that_outlasts_its_timeout_says_how_many_writes_are_pending() -> None:
    store = SignallingStore()
    store.go.clear()
    writer = StateWriter(store, "s", EntityView(), refresh=False, commit_interval=3600)
    writer.submit(0, 0, _quiet(0))
    with pytest.raises(TimeoutError, match="1 write"):
        writer.flush(timeout=0.05)
    store.go.set()
    writer.close(timeout=WAIT)
    assert store.groups == [(0, [0])]


def test_close_stops_the_thread_and_a_later_submit_starts_another() -> None:
    store = SignallingStore()
    writer = StateWriter(store, "s", EntityView(), refresh=False, commit_interval=3600)
    writer.submit(0, 0, _quiet(0))
    first = writer._thread
    writer.close(timeout=WAIT)
    assert first is not None and not first.is_alive()
    writer.submit(1, 1, _quiet(1))
    assert writer._thread is not first and writer._thread is not None and writer._thread.is_alive()
    writer.close(timeout=WAIT)
    assert [v for v, _ in store.groups] == [0, 1]


# ------------------------------------------------------------------- when the program stopped Spark
@pytest.mark.parametrize(
    ("error", "gone"),
    [
        (AttributeError("'NoneType' object has no attribute 'sc'"), True),
        (
            RuntimeError("java.lang.IllegalStateException: Cannot call methods on a stopped SparkContext."),
            True,
        ),
        (RuntimeError("Job 7 cancelled because SparkContext was shut down"), True),
        (RuntimeError("ConcurrentAppendException: Files were added"), False),
        (ValueError("bad row"), False),
    ],
)
def test_session_gone(error: Exception, gone: bool) -> None:
    assert session_gone(error) is gone


class StoppedSparkStore:
    """A Delta store whose Spark session the program stopped: every write fails as PySpark does then."""

    def __init__(self, location: str) -> None:
        self.tables = StateTables(location=location)
        self.calls = 0

    def write_batch(self, sink_id: str, batch_id: int, writes: BatchWrites) -> None:
        self.calls += 1
        raise AttributeError("'NoneType' object has no attribute 'sc'")

    def entities_version(self) -> int | None:
        raise AttributeError("'NoneType' object has no attribute 'sc'")

    def read_entities(self) -> list[EntityRecord]:
        raise AttributeError("'NoneType' object has no attribute 'sc'")


def test_writes_queued_when_spark_stops_reach_the_tables_through_deltalake(tmp_path: Path) -> None:
    pytest.importorskip("deltalake")
    from spark_sb.state.deltars import DeltaRsStateStore

    location = str(tmp_path / "state")
    stopped = StoppedSparkStore(location)
    writer = StateWriter(stopped, "s", EntityView(), refresh=False, commit_interval=3600)  # type: ignore[arg-type]
    for batch_id in range(3):
        writer.submit(batch_id, batch_id, _batch("s", batch_id))
    writer.close(timeout=60)
    assert stopped.calls == 1  # tried once through Spark, then through deltalake
    tables = DeltaRsStateStore(location)
    commits = sorted(e.batch_id for e in tables.read_events("s") if e.event == BATCH_COMMITTED)
    assert commits == [0, 1, 2]
    assert [(r.entity, r.state) for r in tables.read_entities()] == [("orders", "failed_over")]
    # a later group goes on through deltalake; a repeated batch id is skipped (txnVersion), as with Spark
    writer.submit(3, 2, _batch("s", 2))
    writer.flush(timeout=60)
    writer.submit(4, 3, _batch("s", 3))
    writer.flush(timeout=60)
    commits = sorted(e.batch_id for e in tables.read_events("s") if e.event == BATCH_COMMITTED)
    assert commits == [0, 1, 2, 3]


def test_other_write_errors_are_raised_not_redirected(tmp_path: Path) -> None:
    class Failing(StoppedSparkStore):
        def write_batch(self, sink_id: str, batch_id: int, writes: BatchWrites) -> None:
            raise RuntimeError("disk full")

    writer = StateWriter(Failing(str(tmp_path)), "s", EntityView(), refresh=False)  # type: ignore[arg-type]
    writer.submit(0, 0, _batch("s", 0))
    with pytest.raises(StateWriteError, match="disk full"):
        writer.flush(timeout=60)
    assert not (tmp_path / "events").exists()


def test_there_is_no_fallback_for_catalog_tables_or_for_an_error_that_is_not_a_stopped_session() -> None:
    gone = AttributeError("'NoneType' object has no attribute 'sc'")
    catalog = StoppedSparkStore("/x")
    catalog.tables = StateTables(prefix="main.ops.sb_")
    assert _fallback_for(catalog, gone) is None  # type: ignore[arg-type]
    assert _fallback_for(StoppedSparkStore("/x"), RuntimeError("disk full")) is None  # type: ignore[arg-type]
    assert _fallback_for(MemoryStateStore(), gone) is None
