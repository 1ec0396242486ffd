"""The sink's driver logic without Spark: replay skipping, the handoff, bounded totals (SPEC S4-S6), plus the
config keys and row conversion it relies on (sink_id, message_id_mode, state_table_prefix)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.errors import ConfigError
from spark_sb.failover.outcome import SendOutcome, namespace_key
from spark_sb.failover.records import EntityState, EntityStatus, StateTransition
from spark_sb.message.outbound import Reject, message_id_from_content
from spark_sb.message.rows import row_to_message
from spark_sb.spark.sink import ServiceBusSink, SinkIdConflictError, default_sink_id
from spark_sb.state.records import (
    BATCH_COMMITTED,
    REPLAY_SKIPPED,
    BatchWrites,
    EntityRecord,
    Event,
    PartitionResult,
    RejectRecord,
)
from spark_sb.state.store import MemoryStateStore
from spark_sb.state.writer import EntityView, StateWriteError, StateWriter
from tests.unit.sender.rig import make_config

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


class Tasks:
    """Stands in for the batch's mapInArrow job: records the handoff, returns scripted partition results."""

    def __init__(self, *results: PartitionResult) -> None:
        self.results = list(results)
        self.handoffs: list[list[EntityRecord]] = []

    def __call__(self, handoff: Sequence[EntityRecord]) -> list[PartitionResult]:
        self.handoffs.append(list(handoff))
        return self.results


@pytest.fixture(autouse=True)
def _commit_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sinks' writers commit as soon as a batch is queued (the interval has its own test)."""
    import spark_sb.spark.sink as sink_module

    monkeypatch.setattr(sink_module, "COMMIT_INTERVAL", 0.0)


def _sink(store: MemoryStateStore, **cfg: Any) -> ServiceBusSink:
    return ServiceBusSink(make_config(**cfg), store=store)


def _result(rows: int = 3, **outcome: Any) -> PartitionResult:
    return PartitionResult("h1", rows, SendOutcome(sent={"orders": rows}, **outcome))


def test_replayed_batch_is_skipped_and_recorded() -> None:
    store = MemoryStateStore()
    first = _sink(store, sink_id="orders-stream")
    first.process_batch(0, Tasks(_result()), lambda: 3, store, now=lambda: T0)
    first.process_batch(1, Tasks(_result()), lambda: 3, store, now=lambda: T0)
    first.flush()  # the state writes reach the tables (asynchronous by default)
    restarted = _sink(store, sink_id="orders-stream")  # driver restart: batch 1 replays before its checkpoint
    tasks = Tasks(_result())
    assert restarted.process_batch(1, tasks, lambda: 3, store, now=lambda: T0) is None
    assert tasks.handoffs == []  # nothing sent
    events = store.read_events("orders-stream")
    skipped = [e for e in events if e.event == REPLAY_SKIPPED]
    assert [(e.batch_id, e.count) for e in skipped] == [(1, 3)]
    assert restarted.total.skipped_batches == 1 and restarted.total.batches == 0
    assert restarted.process_batch(2, tasks, lambda: 3, store, now=lambda: T0) is not None
    restarted.flush()
    assert [e.batch_id for e in events + store.read_events("orders-stream") if e.event == BATCH_COMMITTED][
        -1
    ] == 2


def test_sink_id_reused_by_another_query_is_an_error_not_a_silent_skip() -> None:
    store = MemoryStateStore()
    first = _sink(store, sink_id="s")
    first.process_batch(4, Tasks(_result()), lambda: 3, store)
    first.flush()
    other = _sink(store, sink_id="s")
    with pytest.raises(
        SinkIdConflictError, match="committed by sink_id 's' with 3 rows, and now arrives with 7"
    ):
        other.process_batch(4, Tasks(_result()), lambda: 7, store)
    with pytest.raises(SinkIdConflictError, match="never committed"):
        other.process_batch(2, Tasks(_result()), lambda: 3, store)
    fresh = _sink(store, sink_id="t")  # its own sink id: sends
    assert fresh.process_batch(2, Tasks(_result()), lambda: 3, store) is not None


def test_tasks_get_the_recorded_entity_state_and_later_batches_see_the_failover() -> None:
    store = MemoryStateStore()
    config = make_config(sink_id="s")
    ns = namespace_key(config.primary)
    sb = ServiceBusSink(config, store=store)
    fo = EntityStatus(ns, "orders", EntityState.FAILED_OVER, T0, T0, "quota_exceeded")
    t = StateTransition("orders", EntityState.FAILING, EntityState.FAILED_OVER, T0, "quota_exceeded", "", ns)
    first = Tasks(PartitionResult("h1", 2, SendOutcome(transitions=(t,)), (fo,)))
    sb.process_batch(0, first, lambda: 2, store, now=lambda: T0)
    assert first.handoffs == [[]]
    second = Tasks(_result())
    sb.process_batch(1, second, lambda: 3, store, now=lambda: T0 + timedelta(seconds=5))
    (handed,) = second.handoffs
    assert [(r.entity, r.state, r.last_error_class) for r in handed] == [
        ("orders", "failed_over", "quota_exceeded")
    ]


def test_totals_keep_counts_only() -> None:
    store = MemoryStateStore()
    sb = _sink(store)
    reject = Reject("body is null", "body", "{}", "orders")
    for batch in range(50):
        sb.process_batch(batch, Tasks(_result(rows=4, rejects=(reject,) * 4)), lambda: 4, store)
    assert (sb.total.batches, sb.total.rows, sb.total.total_sent, sb.total.total_rejected) == (
        50,
        200,
        200,
        200,
    )
    assert all(isinstance(v, (int, dict)) for v in vars(sb.total).values())
    assert sb.last_outcome is not None and len(sb.last_outcome.rejects) == 4  # the last batch only


def test_a_batch_with_rejects_logs_one_warning_with_counts_per_reason_and_the_first_row_indexes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 32: rejects are never silent - one WARNING per batch, counts per reason, the first row indexes."""
    sb = _sink(MemoryStateStore(), sink_id="orders-sink")
    rejects = tuple(
        Reject("no destination entity: set the entity column", "entity", "{}", None, i) for i in range(7)
    )
    rejects += (Reject("message too large: 1258291 bytes", "body", "{}", "orders", 9),)
    clean = _result(rows=5)
    with caplog.at_level("WARNING", logger="spark_sb.spark.sink"):
        sb.process_batch(0, Tasks(clean), lambda: 5, None)
        assert [r for r in caplog.records if r.levelname == "WARNING"] == []  # no rejects, no warning
        sb.process_batch(1, Tasks(PartitionResult("h1", 8, SendOutcome(rejects=rejects))), lambda: 8, None)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    text = warnings[0]
    assert "orders-sink batch 1: 8 of 8 rows rejected" in text
    assert "no destination entity: 7" in text and "message too large: 1" in text
    assert "0, 1, 2, 3, 4" in text and "5, 6" not in text  # the first few only
    assert "1258291" not in text  # reasons are counted by kind, not listed row by row


def test_the_summary_line_counts_sent_diverted_rejected_and_replays_over_the_sinks_life() -> None:
    store = MemoryStateStore()
    sb = _sink(store, sink_id="s1")
    too_large = Reject("message too large: 2 MB", "body", "{}", "orders", 0)
    sb.process_batch(0, Tasks(_result(rows=4)), lambda: 4, store)
    sb.process_batch(
        1,
        Tasks(
            PartitionResult(
                "h1", 5, SendOutcome(sent={"orders": 2}, diverted={"q0": 2}, rejects=(too_large,))
            )
        ),
        lambda: 5,
        store,
    )
    sb.process_batch(1, Tasks(_result(rows=5)), lambda: 5, store)  # a replay of batch 1: skipped
    assert sb.summary() == (
        "sink s1: 2 batches, 9 rows: 6 sent, 2 diverted, 1 rejected (message too large: 1), "
        "1 replayed batches skipped"
    )


def test_without_state_tables_nothing_is_stored_and_every_batch_runs() -> None:
    sb = ServiceBusSink(make_config())
    tasks = Tasks(_result())
    for _ in range(2):
        sb.process_batch(0, tasks, lambda: 3, None)
    assert len(tasks.handoffs) == 2 and sb.total.total_sent == 6


# ------------------------------------------------------------------------- asynchronous state writes
class GatedStore(MemoryStateStore):
    """A memory store whose writes wait for ``gate`` and can be made to fail; records each write's batch id and
    counts reads of the entities table."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.writing = threading.Event()  # a write has started
        self.writes: list[tuple[int, BatchWrites]] = []
        self.entity_reads = 0
        self.reads_on_batch_path = 0  # reads by the thread that runs the batches (not the writer's)
        self.version_checks = 0
        self.fail: BaseException | None = None

    def entities_version(self) -> int | None:
        self.version_checks += 1
        return super().entities_version()

    def read_entities(self) -> list[EntityRecord]:
        self.entity_reads += 1
        if threading.current_thread() is threading.main_thread():
            self.reads_on_batch_path += 1
        return super().read_entities()

    def write_batch(self, sink_id: str, batch_id: int, writes: BatchWrites) -> None:
        self.writing.set()
        assert self.gate.wait(10), "test gate never opened"
        if self.fail is not None:
            raise self.fail
        self.writes.append((batch_id, writes))
        super().write_batch(sink_id, batch_id, writes)


def _until(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def _open_gate_while_flushing(sb: ServiceBusSink, store: GatedStore) -> None:
    """Open the gate only once a flush waits, so that the writer knows of the flush when its write returns."""
    flusher = threading.Thread(target=sb.flush, kwargs={"timeout": 5})
    flusher.start()
    _until(lambda: sb._writer is not None and sb._writer._flushing > 0)
    store.gate.set()
    flusher.join(5)
    assert not flusher.is_alive()


def _commits(store: MemoryStateStore) -> list[int | None]:
    return [e.batch_id for e in store.read_events() if e.event == BATCH_COMMITTED]


def test_state_is_written_in_the_background_and_pending_batches_become_one_commit() -> None:
    store = GatedStore()
    sb = _sink(store, sink_id="s")
    assert sb.asynchronous
    store.gate.clear()
    sb.process_batch(0, Tasks(_result()), lambda: 3, store, now=lambda: T0)  # returns before its write
    assert store.writing.wait(5) and _commits(store) == []
    for batch in (1, 2, 3):  # the writer is busy with batch 0: these wait, and go as one group
        sb.process_batch(batch, Tasks(_result()), lambda: 3, store, now=lambda: T0)
    assert _commits(store) == []
    _open_gate_while_flushing(sb, store)
    sb.flush(timeout=5)  # raises a failed write, if any
    assert [b for b, _ in store.writes] == [0, 3]  # one commit per group, txnVersion = highest batch id
    (_, group) = store.writes[1]
    assert [e.batch_id for e in group.events if e.event == BATCH_COMMITTED] == [1, 2, 3]
    assert _commits(store) == [0, 1, 2, 3]
    assert store.last_committed("s") == 3 and store.committed("s", 2) is not None
    # the first batch's read only: the re-read due after commit 0 waits for the next batch (a flush is waiting
    # here, and a flush waits for writes only)
    assert store.entity_reads == 1


def test_queued_batches_wait_for_the_commit_interval_unless_flushed_or_half_the_bound() -> None:
    store = GatedStore()
    writer = StateWriter(store, "s", EntityView(), max_pending=8, commit_interval=60.0)

    def batch(b: int) -> BatchWrites:
        return BatchWrites((Event(T0, "s", b, BATCH_COMMITTED),), (), ())

    for b in (0, 1, 2):
        writer.submit(b + 1, b, batch(b))
    time.sleep(0.2)
    assert store.writes == [] and writer.pending == 3  # the oldest has not waited the interval yet
    writer.flush(timeout=5)  # a flush does not wait for the interval
    assert [b for b, _ in store.writes] == [2]
    for b in (3, 4, 5, 6):  # half of max_pending queued: committed without waiting for the interval
        writer.submit(b + 1, b, batch(b))
    _until(lambda: writer.pending == 0)
    assert [b for b, _ in store.writes] == [2, 6] and _commits(store) == [0, 1, 2, 3, 4, 5, 6]
    writer.commit_interval = 0.05
    writer.submit(8, 7, batch(7))  # alone: committed once it has waited the interval
    _until(lambda: writer.pending == 0)
    assert [b for b, _ in store.writes] == [2, 6, 7]
    writer.close(timeout=5)


@pytest.mark.parametrize("news", ["state change", "reject"])
def test_a_batch_with_news_is_committed_without_waiting_for_the_interval(news: str) -> None:
    """Routine batches wait for the group commit; a state change or a reject is committed at once, so other
    sinks, the syphon and ``status`` see it now."""
    store = GatedStore()
    writer = StateWriter(store, "s", EntityView(), max_pending=16, commit_interval=3600.0)
    writer.submit(1, 0, BatchWrites((Event(T0, "s", 0, BATCH_COMMITTED),), (), ()))
    entities = (EntityRecord("ns", "orders", "failed_over", T0, "timeout"),) if news == "state change" else ()
    rejects = (RejectRecord(T0, "s", 1, "orders", "body", "null body", "{}"),) if news == "reject" else ()
    writer.submit(2, 1, BatchWrites((Event(T0, "s", 1, BATCH_COMMITTED),), entities, rejects))
    _until(lambda: writer.pending == 0)
    assert [b for b, _ in store.writes] == [1]  # one commit of both batches, long before the interval
    writer.close(timeout=5)


def test_a_failed_write_fails_the_next_batch_before_it_sends() -> None:
    store = GatedStore()
    store.fail = OSError("the state location is read-only")
    sb = _sink(store, sink_id="s")
    sb.process_batch(0, Tasks(_result()), lambda: 3, store, now=lambda: T0)
    _until(lambda: sb._writer is not None and sb._writer.pending == 0)
    tasks = Tasks(_result())
    with pytest.raises(
        StateWriteError, match=r"batches \[0\] failed: OSError: the state location is read-only"
    ):
        sb.process_batch(1, tasks, lambda: 3, store, now=lambda: T0)
    assert tasks.handoffs == []  # nothing of batch 1 was sent: Spark runs it again after the restart
    store.fail = None
    reads = store.entity_reads
    assert sb.process_batch(1, tasks, lambda: 3, store, now=lambda: T0) is not None
    assert store.entity_reads == reads + 1  # after an error the view is read again at once, as at the start
    sb.flush(timeout=5)
    assert _commits(store) == [1]


def test_flush_raises_a_failed_write_once() -> None:
    store = GatedStore()
    store.fail = RuntimeError("DELTA_FILE_NOT_FOUND")
    sb = _sink(store, sink_id="s")
    sb.process_batch(0, Tasks(_result()), lambda: 3, store, now=lambda: T0)
    with pytest.raises(StateWriteError, match="DELTA_FILE_NOT_FOUND") as info:
        sb.flush(timeout=5)
    assert isinstance(info.value.__cause__, RuntimeError)
    sb.flush(timeout=5)  # raised once; nothing pending


def test_flush_times_out_while_a_write_hangs() -> None:
    store = GatedStore()
    store.gate.clear()
    sb = _sink(store, sink_id="s")
    sb.process_batch(0, Tasks(_result()), lambda: 3, store, now=lambda: T0)
    with pytest.raises(TimeoutError, match="still pending after 0.05 s"):
        sb.flush(timeout=0.05)
    store.gate.set()
    with sb:  # the context manager flushes (close) on exit
        pass
    assert _commits(store) == [0]


def test_more_pending_batches_than_the_bound_make_the_batch_wait() -> None:
    store = GatedStore()
    store.gate.clear()
    sb = ServiceBusSink(make_config(sink_id="s"), store=store, max_pending_writes=2)
    sb.process_batch(0, Tasks(_result()), lambda: 3, store, now=lambda: T0)
    assert store.writing.wait(5)  # batch 0 is being written
    sb.process_batch(1, Tasks(_result()), lambda: 3, store, now=lambda: T0)
    sb.process_batch(2, Tasks(_result()), lambda: 3, store, now=lambda: T0)  # two queued: the bound
    third = threading.Thread(
        target=sb.process_batch, args=(3, Tasks(_result()), lambda: 3, store), kwargs={"now": lambda: T0}
    )
    third.start()
    third.join(0.2)
    assert third.is_alive()  # waits for the writer
    store.gate.set()
    third.join(5)
    assert not third.is_alive()
    sb.flush(timeout=5)
    assert _commits(store) == [0, 1, 2, 3]


@pytest.mark.parametrize("bound", [0, -1, 1.5, True, None])
def test_a_pending_writes_bound_below_one_is_refused(bound: Any) -> None:
    """max_pending_writes=0 made the first asynchronous batch wait forever (for a writer thread that its own submit
    starts): refused when the sink is built, before any batch, naming the parameter."""
    with pytest.raises(ConfigError, match=r"^max_pending_writes: must be an integer >= 1 \(batches\)"):
        ServiceBusSink(make_config(sink_id="s"), store=MemoryStateStore(), max_pending_writes=bound)
    assert ServiceBusSink(make_config(sink_id="s"), max_pending_writes=1)  # the smallest bound that works


def test_replay_check_counts_batches_planned_but_not_yet_written() -> None:
    store = GatedStore()
    store.gate.clear()
    sb = _sink(store, sink_id="s")
    sb.process_batch(0, Tasks(_result()), lambda: 3, store, now=lambda: T0)
    sb.process_batch(1, Tasks(_result()), lambda: 3, store, now=lambda: T0)
    assert _commits(store) == []  # neither is in the table yet
    tasks = Tasks(_result())
    assert (
        sb.process_batch(1, tasks, lambda: 3, store, now=lambda: T0) is None
    )  # the query restarted: skipped
    assert tasks.handoffs == [] and sb.total.skipped_batches == 1
    with pytest.raises(SinkIdConflictError, match="with 3 rows, and now arrives with 5"):
        sb.process_batch(0, tasks, lambda: 5, store, now=lambda: T0)
    store.gate.set()
    sb.flush(timeout=5)
    assert _commits(store) == [0, 1]
    assert [e.batch_id for e in store.read_events("s") if e.event == REPLAY_SKIPPED] == [1]


def test_the_handoff_is_the_last_read_overlaid_with_this_sinks_planned_records() -> None:
    store = GatedStore()
    config = make_config(sink_id="s")
    ns = namespace_key(config.primary)
    other = EntityRecord(ns, "invoices", "failed_over", T0, "timeout", updated_by="other-sink")
    MemoryStateStore.write_batch(  # another sink's row, not through the gate
        store, "other-sink", 1, BatchWrites((Event(T0, "other-sink", 1, BATCH_COMMITTED),), (other,), ())
    )
    sb = ServiceBusSink(config, store=store)
    store.gate.clear()
    at = T0 + timedelta(seconds=1)
    t = StateTransition("orders", EntityState.FAILING, EntityState.FAILED_OVER, at, "quota_exceeded", "", ns)
    first = Tasks(PartitionResult("h1", 2, SendOutcome(transitions=(t,))))
    sb.process_batch(0, first, lambda: 2, store, now=lambda: at)
    assert [r.entity for r in first.handoffs[0]] == ["invoices"]  # the first batch reads the table
    assert store.writing.wait(5)  # batch 0's write has begun (and waits at the gate)
    second = Tasks(_result())
    sb.process_batch(1, second, lambda: 3, store, now=lambda: at)  # batch 0 not written yet
    assert [(r.entity, r.state) for r in second.handoffs[0]] == [
        ("invoices", "failed_over"),
        ("orders", "failed_over"),  # planned by this sink, handed on without waiting for the table
    ]
    # Meanwhile another writer returns invoices to healthy and records orders healthy later still.
    later = T0 + timedelta(seconds=30)
    MemoryStateStore.write_batch(  # not through the gate
        store,
        "other-sink",
        2,
        BatchWrites(
            (Event(later, "other-sink", 2, BATCH_COMMITTED),),
            (replace(other, state="healthy", since=later), EntityRecord(ns, "orders", "healthy", later)),
            (),
        ),
    )
    _open_gate_while_flushing(sb, store)  # writes batches 0 and 1; a flush does not wait for a re-read
    assert store.entity_reads == 1
    third = Tasks(_result())
    sb.process_batch(2, third, lambda: 3, store, now=lambda: later)  # queued: the writer re-reads the table
    assert [r.state for r in third.handoffs[0]] == ["failed_over", "failed_over"]  # not yet
    _until(lambda: store.entity_reads == 2)
    fourth = Tasks(_result())
    sb.process_batch(3, fourth, lambda: 3, store, now=lambda: later)
    assert [(r.entity, r.state) for r in fourth.handoffs[0]] == [
        ("invoices", "healthy"),
        ("orders", "healthy"),  # the other writer's newer record wins over this sink's planned one
    ]
    sb.flush(timeout=5)


def test_a_view_older_than_max_view_age_is_read_again_at_batch_start(monkeypatch: pytest.MonkeyPatch) -> None:
    import spark_sb.spark.sink as sink_module

    store = GatedStore()
    sb = _sink(store, sink_id="s")
    sb.process_batch(0, Tasks(_result()), lambda: 3, store, now=lambda: T0)
    sb.flush(timeout=5)
    assert store.reads_on_batch_path == 1  # the first batch's
    sb.process_batch(1, Tasks(_result()), lambda: 3, store, now=lambda: T0)
    assert store.reads_on_batch_path == 1  # a fresh view: no read on the batch's path
    monkeypatch.setattr(sink_module, "MAX_VIEW_AGE", 0.0)  # as after a long pause between batches
    sb.process_batch(2, Tasks(_result()), lambda: 3, store, now=lambda: T0)
    assert store.reads_on_batch_path == 2
    sb.flush(timeout=5)


def test_after_a_commit_the_entities_table_is_read_again_only_when_its_version_moved() -> None:
    store = GatedStore()
    sb = _sink(store, sink_id="s")
    now = [0.0]
    sb._view._clock = lambda: now[0]  # the view's age, under the test's control
    ns = namespace_key(sb.config.primary)
    sb.process_batch(0, Tasks(_result()), lambda: 3, store, now=lambda: T0)  # the first batch reads the table
    sb.flush(timeout=5)
    sb.process_batch(1, Tasks(_result()), lambda: 3, store, now=lambda: T0)  # queued: the writer catches up
    _until(lambda: store.version_checks == 1 and store.entity_reads == 2)  # version unknown yet: a read
    sb.flush(timeout=5)
    now[0] = 50.0
    sb.process_batch(2, Tasks(_result()), lambda: 3, store, now=lambda: T0)
    _until(lambda: sb._view.age() == 0.0)  # brought up to date at t=50 ...
    assert store.version_checks == 2 and store.entity_reads == 2  # ... by its version: nothing was read
    sb.flush(timeout=5)
    now[0] = 100.0  # 100 s after the last read, 50 s after the confirmation: younger than MAX_VIEW_AGE
    other = EntityRecord(ns, "invoices", "failed_over", T0, "timeout", updated_by="other-sink")
    MemoryStateStore.write_batch(  # another writer's entity change, not through the gate
        store, "other-sink", 1, BatchWrites((Event(T0, "other-sink", 1, BATCH_COMMITTED),), (other,), ())
    )
    sb.process_batch(3, Tasks(_result()), lambda: 3, store, now=lambda: T0)
    assert store.reads_on_batch_path == 1  # only the first batch's
    _until(lambda: store.version_checks == 3 and store.entity_reads == 3)  # the version moved: read
    fifth = Tasks(_result())
    sb.process_batch(4, fifth, lambda: 3, store, now=lambda: T0)
    assert [r.entity for r in fifth.handoffs[0]] == ["invoices"]
    sb.flush(timeout=5)


def test_sync_state_writes_read_and_write_within_the_batch() -> None:
    store = GatedStore()
    sb = _sink(store, sink_id="s", state_writes="sync")
    assert not sb.asynchronous
    for batch in range(3):
        sb.process_batch(batch, Tasks(_result()), lambda: 3, store, now=lambda: T0)
        assert _commits(store)[-1] == batch  # durable before the batch returns
    assert store.entity_reads == 3 and [b for b, _ in store.writes] == [0, 1, 2]
    assert sb._writer is None


def test_state_writes_key() -> None:
    assert make_config().state_writes == "async"
    base = {"primary.connection_string": "${env:CS}", "entity": "orders"}
    env = {"CS": "Endpoint=sb://a.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v"}
    loaded = ServiceBusConfig.from_options({**base, "state_writes": "sync"}, env=env)
    assert (
        loaded.state_writes == "sync"
        and ServiceBusConfig.from_options(loaded.to_options(), env=env) == loaded
    )
    with pytest.raises(ConfigError, match="state_writes: 'later' is not one of 'async', 'sync'"):
        ServiceBusConfig.from_options({**base, "state_writes": "later"}, env=env)


# ------------------------------------------------------------------------------------------ config keys
def test_sink_id_default_and_state_keys() -> None:
    c = make_config()
    assert default_sink_id(c) == "primary/orders"  # <primary namespace name>/<entity>
    assert ServiceBusSink(c).sink_id == "primary/orders"
    base = {"primary.connection_string": "${env:CS}", "entity": "orders"}
    env = {"CS": "Endpoint=sb://a.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v"}
    loaded = ServiceBusConfig.from_options(
        {**base, "sink_id": "orders-1", "message_id_mode": "content", "state_table_prefix": "main.ops.sb_"},
        env=env,
    )
    assert (loaded.sink_id, loaded.message_id_mode, loaded.state_table_prefix) == (
        "orders-1",
        "content",
        "main.ops.sb_",
    )
    assert ServiceBusConfig.from_options(loaded.to_options(), env=env) == loaded
    with pytest.raises(ConfigError, match="message_id_mode: 'hash' is not one of 'column', 'content'"):
        ServiceBusConfig.from_options({**base, "message_id_mode": "hash"}, env=env)
    with pytest.raises(ConfigError, match="state_table_prefix: expected catalog.schema.prefix"):
        replace(c, state_table_prefix="no spaces allowed")
    with pytest.raises(ConfigError, match="not both"):
        replace(c, state_table_prefix="main.ops.sb_", state_location="/tmp/x")


# ----------------------------------------------------------------------------------- rows
COLS = {c: c for c in ("body", "entity", "message_id", "properties")}


def test_content_message_ids_are_stable_and_cover_entity_body_and_properties() -> None:
    row = {"body": "b", "properties": [("k", "v")]}
    a = row_to_message(row, COLS, "orders", 262144, "content")
    b = row_to_message(dict(row), COLS, "orders", 262144, "content")
    assert a.message_id == b.message_id == message_id_from_content(replace(a, message_id=None))
    assert len(a.message_id or "") == 36
    others = [
        row_to_message(row, COLS, "invoices", 262144, "content"),
        row_to_message({**row, "body": "c"}, COLS, "orders", 262144, "content"),
        row_to_message({**row, "properties": [("k", "w")]}, COLS, "orders", 262144, "content"),
    ]
    assert len({m.message_id for m in [a, *others]}) == 4
    assert (
        row_to_message({**row, "message_id": "given"}, COLS, "orders", 262144, "content").message_id
        == "given"
    )
    assert row_to_message(row, COLS, "orders", 262144).message_id is None  # column mode: the SDK assigns one


def test_task_failure_finds_the_librarys_error_in_a_spark_job_error_and_nothing_else() -> None:
    from spark_sb.spark.totals import task_failure

    spark_text = (
        "An error occurred while calling o123.collectToPython.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 failed 1 times\n"
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/x/spark_sb/sender/paired.py", line 480, in _send_primary\n'
        "spark_sb.core.errors.NoBacklogAvailableError: entity 'orders' is failed over and no backlog queue works\n"
        "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(...)\n"
    )
    told = task_failure(RuntimeError(spark_text))
    assert told is not None and told.kind == "NoBacklogAvailableError"
    assert str(told) == "NoBacklogAvailableError: entity 'orders' is failed over and no backlog queue works"
    assert task_failure(RuntimeError("java.lang.OutOfMemoryError: Java heap space")) is None
