"""The syphon job's pure parts: the entity gate (B9), parked dead-letter reasons, the planner's choice of queues
from runtime counts (idle: nothing), the rows of an outcome, and the events a micro-batch writes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from servicebus_local.clock import FakeClock
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.spark.syphon_drain import outcome_rows
from spark_sb.spark.syphon_ledger import SyphonBatchWriter
from spark_sb.spark.syphon_planner import BacklogWatcher
from spark_sb.state.store import MemoryStateStore
from spark_sb.syphon.rules import EXPIRED_IN_BACKLOG, EntityGate, SyphonOutcome, is_parked

CONFIG = ServiceBusConfig.from_dict(
    {
        "primary": {
            "connection_string": "Endpoint=sb://p.example:5672;SharedAccessKeyName=k;SharedAccessKey=s1"
        },
        "secondary": {
            "connection_string": "Endpoint=sb://s.example:5672;SharedAccessKeyName=k;SharedAccessKey=s2"
        },
        "backlog_queue_count": 2,
    }
)
QUEUES = ["p/x-servicebus-transfer/0", "p/x-servicebus-transfer/1"]


def test_gate_sends_to_healthy_probes_the_rest_and_backs_off_after_a_failure() -> None:
    clock = FakeClock()
    gate = EntityGate(clock, ok_for=60, backoff=5)
    gate.set_hints({"a": "healthy", "b": "failed_over"})
    assert [gate.decide(e) for e in ("a", "b", "unknown")] == ["send", "probe", "probe"]
    gate.succeeded("b")  # answered a probe
    assert gate.decide("b") == "send"
    gate.failed("a")  # a send failed: back off, then probe (the table's word is not enough any more)
    assert gate.decide("a") == "wait"
    clock.advance(5)
    assert gate.decide("a") == "probe"
    clock.advance(60)
    assert gate.decide("b") == "probe"  # a success counts for ok_for seconds


def test_gate_backs_off_every_entity_after_a_namespace_wide_failure_and_one_answer_lifts_it() -> None:
    """SPEC F1/F4 for the syphon: a primary namespace that does not answer costs one probe, not one per entity."""
    clock = FakeClock()
    gate = EntityGate(clock, ok_for=60, backoff=5)
    entities = [f"tenant-{i}" for i in range(200)]
    gate.set_hints({e: "healthy" for e in entities})
    gate.succeeded(entities[0])
    gate.failed(entities[1], namespace_wide=True)  # connection refused: the namespace's fault
    assert {gate.decide(e) for e in entities} == {"wait"}  # even the ones known good or hinted healthy
    clock.advance(5)
    # after the back-off: the entity that met the failure is probed; the others' first send is the next try
    assert gate.decide(entities[1]) == "probe"
    assert {gate.decide(e) for e in entities if e != entities[1]} == {"send"}
    gate.succeeded(entities[1])  # the namespace answered
    assert gate.decide(entities[2]) == "send"
    gate.failed(entities[3])  # an entity's own fault backs off that entity only
    assert gate.decide(entities[3]) == "wait" and gate.decide(entities[4]) == "send"


@pytest.mark.parametrize(
    ("reason", "parked"),
    [
        (EXPIRED_IN_BACKLOG, True),
        ("NotABacklogMessage", True),
        ("TTLExpiredException", True),
        ("MaxDeliveryCountExceeded", False),
        ("MessageLockLost", False),
        (None, False),
    ],
)
def test_parked_reasons(reason: str | None, parked: bool) -> None:
    assert is_parked(reason) is parked


@dataclass
class Props:
    name: str
    active_message_count: int
    dead_letter_message_count: int


class FakeAdmin:
    def __init__(self) -> None:
        self.counts: dict[str, tuple[int, int]] = {q: (0, 0) for q in QUEUES}
        self.fail = False

    def list_queues_runtime_properties(self) -> list[Props]:
        if self.fail:
            raise ConnectionError("down")
        return [Props(q, a, d) for q, (a, d) in self.counts.items()]

    def get_queue_runtime_properties(self, queue: str) -> Props:
        raise AssertionError("the listing answered")


def test_planner_drains_only_queues_with_messages_and_new_dead_letters() -> None:
    admin = FakeAdmin()
    watcher = BacklogWatcher(CONFIG, QUEUES, admin=admin)
    assert watcher.work() == []  # idle: no receive at all
    admin.counts[QUEUES[1]] = (7, 0)
    assert watcher.work() == [(QUEUES[1], False)]
    admin.counts[QUEUES[1]] = (0, 3)  # dead-lettered in the backlog (max delivery count): a DLQ pass
    assert watcher.work() == [(QUEUES[1], True)]
    admin.counts[QUEUES[1]] = (0, 1)  # the pass left one (parked on purpose): not drained again
    assert watcher.work() == []
    assert watcher.work() == []
    admin.counts[QUEUES[1]] = (0, 2)  # a new one: drained again
    assert watcher.work() == [(QUEUES[1], True)]


class DownAdmin(FakeAdmin):
    """An admin endpoint that answers nothing: neither the listing nor a queue's properties."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = True

    def get_queue_runtime_properties(self, queue: str) -> Props:
        raise ConnectionError("down")


def test_planner_drains_every_queue_when_the_counts_cannot_be_read() -> None:
    watcher = BacklogWatcher(CONFIG, QUEUES, admin=DownAdmin())
    assert watcher.work() == [(q, False) for q in QUEUES] and watcher.failures == 1


def test_available_now_drains_what_each_queue_held_at_the_start_in_as_many_batches_as_it_takes() -> None:
    """Issue 32 item 4: under Trigger.AvailableNow a queue is offered until the messages it held at the start have
    left it, however many micro-batches that takes; one that was empty at the start, or whose pass made no
    progress, is not (the run must end: Spark's contract reads nothing added after the start)."""
    admin = FakeAdmin()
    watcher = BacklogWatcher(CONFIG, QUEUES, admin=admin)
    admin.counts[QUEUES[0]] = (250, 0)  # 250 at the start; each pass moves 100 (its batch_duration)
    watcher.prepare_available_now()
    admin.counts[QUEUES[1]] = (40, 0)  # arrived after the start: the next run's
    assert watcher.work() == [(QUEUES[0], False)]
    admin.counts[QUEUES[0]] = (150 + 30, 0)  # 100 moved, 30 new arrived meanwhile
    assert watcher.work() == [(QUEUES[0], False)]  # at least 70 of the 250 gone: go on
    admin.counts[QUEUES[0]] = (80 + 30, 0)
    assert watcher.work() == [(QUEUES[0], False)]
    admin.counts[QUEUES[0]] = (10 + 30, 0)
    assert watcher.work() == [(QUEUES[0], False)]
    admin.counts[QUEUES[0]] = (0 + 30, 0)  # all 250 gone, but the counts show 220 (arrivals hide the rest)
    assert watcher.work() == [(QUEUES[0], False)]  # so one more pass, which moves the late 30 too
    admin.counts[QUEUES[0]] = (0, 0)
    assert watcher.work() == []  # 250 gone by the counts: done
    assert watcher.work() == []


def test_available_now_stops_offering_a_queue_whose_pass_made_no_progress() -> None:
    admin = FakeAdmin()
    watcher = BacklogWatcher(CONFIG, QUEUES, admin=admin)
    admin.counts[QUEUES[0]] = (20, 0)
    watcher.prepare_available_now()
    assert watcher.work() == [(QUEUES[0], False)]
    admin.counts[QUEUES[0]] = (20, 0)  # its entity is down: everything abandoned
    assert watcher.work() == []  # the run ends; the next one tries again


def test_available_now_without_counts_drains_every_queue_once_then_ends() -> None:
    watcher = BacklogWatcher(CONFIG, QUEUES, admin=DownAdmin())
    watcher.prepare_available_now()
    watcher.admin = DownAdmin()  # a failed read drops the client; the next is as deaf
    assert watcher.work() == [(q, False) for q in QUEUES]
    watcher.admin = DownAdmin()
    assert watcher.work() == []


def test_other_triggers_drain_whatever_is_there() -> None:
    admin = FakeAdmin()
    watcher = BacklogWatcher(CONFIG, QUEUES, admin=admin)
    admin.counts[QUEUES[0]] = (20, 0)
    assert watcher.work() == [(QUEUES[0], False)]
    assert watcher.work() == [(QUEUES[0], False)]  # no progress, still drained: the entity may be back


def test_rows_one_per_message_moved_and_one_per_kind_else() -> None:
    outcome = SyphonOutcome(
        forwarded={"orders": 2},
        moved_ids=[("orders", "m1"), ("orders", "m2")],
        expired_by_entity={"orders": 1},
        abandoned_by_entity={"audit": 3},
        invalid=1,
        settle_failures=2,
        errors=["audit: send failed: ServiceBusError"],
    )
    rows = list(outcome_rows("q0", False, outcome))
    kinds = [(r[2], r[3], r[4]) for r in rows]
    assert kinds == [
        ("orders", "moved", 1),
        ("orders", "moved", 1),
        ("orders", "expired", 1),
        ("audit", "abandoned", 3),
        (None, "dead_lettered", 1),
        (None, "settle_failed", 2),
        (None, "syphon_error", 1),
    ]


def test_writer_appends_per_entity_events_idempotently_and_nothing_for_an_empty_batch() -> None:
    store = MemoryStateStore()
    writer = SyphonBatchWriter(CONFIG, store=store)
    at = datetime(2026, 3, 1, tzinfo=timezone.utc)
    writer.record(0, [], store, now=at)
    assert store.read_events() == []
    batch: list[Any] = [("q0", "orders", "moved", 5, None), ("q1", "orders", "expired", 1, None)]
    writer.record(1, batch, store, now=at)
    writer.record(1, batch, store, now=at)  # a replayed micro-batch is written once
    events = [(e.event, e.entity, e.backlog_queue, e.count) for e in store.read_events()]
    assert events == [
        ("expired", "orders", "q1", 1),
        ("moved", "orders", "q0", 5),
        ("batch_committed", None, None, 5),
    ]
    assert {e.sink_id for e in store.read_events()} == {"syphon/p"}
    assert writer.total.moved == 10 and writer.total.by_entity == {"orders": 10}


def test_settle_failures_are_counted_never_raised_and_a_replaced_receivers_messages_too() -> None:
    from spark_sb.syphon.mover import Syphon
    from spark_sb.syphon.receivers import Held
    from spark_sb.wire.lane import Lane

    class Receiver:
        def complete_message(self, msg: Any) -> None:
            raise ConnectionError("lock lost")

    class Ctx:
        receiver = Receiver()

    lane: Lane[Any] = Lane("test-receiver", Ctx, lambda ctx: None)
    syphon = Syphon(CONFIG, backlog_queues=QUEUES)
    try:
        outcome = SyphonOutcome()
        lane.call(lambda ctx: None, 5)  # the receiver of generation 1
        held = [Held(msg=object(), generation=1), Held(msg=object(), generation=1)]  # type: ignore[arg-type]
        syphon._settle(lane, held, lambda r, m: r.complete_message(m), outcome)
        assert outcome.settle_failures == 2
        lane.reset("faulted")
        lane.call(lambda ctx: None, 5)  # a new receiver (generation 2): the old locks cannot be settled on it
        syphon._settle(lane, [Held(msg=object(), generation=1)], lambda r, m: None, outcome)  # type: ignore[arg-type]
        assert outcome.settle_failures == 3
    finally:
        syphon.close()
        lane.close()


def test_the_drain_takes_its_syphon_from_the_workers_pool_which_closes_it_after_idle_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from collections.abc import Iterator

    from spark_sb.sender.pool import SenderPool
    from spark_sb.spark import syphon_drain

    built: list[FakeSyphon] = []

    class FakeSyphon:
        def __init__(self, config: ServiceBusConfig, **kwargs: Any) -> None:
            self.kwargs = kwargs
            self.closed = False
            built.append(self)

        def set_hints(self, hints: Any) -> None:
            pass

        def drain_batches(self, queue: str, **kwargs: Any) -> Iterator[SyphonOutcome]:
            yield SyphonOutcome(moved_ids=[("orders", "m1")])

        def close(self) -> None:
            self.closed = True

    clock = FakeClock()
    monkeypatch.setattr(syphon_drain, "SYPHONS", SenderPool(clock=clock))
    monkeypatch.setattr(syphon_drain, "Syphon", FakeSyphon)
    rows = list(syphon_drain.drain_partition(CONFIG, QUEUES[0], False, queues=QUEUES))
    assert rows == [(QUEUES[0], False, "orders", "moved", 1, "m1", None)]
    # the next task takes the same syphon
    list(syphon_drain.drain_partition(CONFIG, QUEUES[1], False, queues=QUEUES))
    assert len(built) == 1 and built[0].kwargs == {"backlog_queues": QUEUES, "record_ids": True}
    assert syphon_drain.SYPHONS.idle() == 1 and not built[0].closed
    clock.advance(CONFIG.idle_timeout + 1)  # unused for longer than idle_timeout: closed at the next acquire
    list(syphon_drain.drain_partition(CONFIG, QUEUES[0], False, queues=QUEUES))
    assert len(built) == 2 and built[0].closed and not built[1].closed and syphon_drain.SYPHONS.idle() == 1


def test_an_ordered_available_now_run_waits_out_the_lock_duration_instead_of_ending_before_its_first_drain() -> (
    None
):
    """Issue 47 item 1 (found with its Spark test): with ordering the first drain waits one lock duration; under
    Trigger.AvailableNow an empty first offer ends the run, so the ordered run drained nothing. Now the watcher
    waits (on its clock) and offers the queues; another trigger still offers nothing until then."""
    from dataclasses import replace

    ordered = replace(CONFIG, ordering="session")
    admin = FakeAdmin()
    admin.counts[QUEUES[0]] = (3, 0)
    clock = FakeClock()
    watcher = BacklogWatcher(ordered, QUEUES, admin=admin, lock_wait=8.0, clock=clock)
    watcher.prepare_available_now()
    assert watcher.work() == [(QUEUES[0], False)]
    assert clock.sleeps == [8.0]
    continuous = BacklogWatcher(ordered, QUEUES, admin=admin, lock_wait=8.0, clock=FakeClock())
    assert continuous.work() == []
    continuous.clock.advance(8.0)  # type: ignore[attr-defined]
    assert continuous.work() == [(QUEUES[0], False)]


# ------------------------------------------------------------------------------------------- every run's ledger (O5)
def test_every_run_records_its_micro_batches_whatever_their_ids_and_a_pickled_writer_keeps_its_run() -> None:
    """Issue 47 item 1: a run on a fresh checkpoint (or a second job) counts batch ids from 0 again. Its appends
    go under a transaction id of its own (``syphon/<name>/<run id>``), so none is skipped; the events keep the sink
    id readers filter on. Within a run a batch id is written once."""
    import pickle

    store = MemoryStateStore()
    at = datetime(2026, 3, 1, tzinfo=timezone.utc)
    first = SyphonBatchWriter(CONFIG, store=store)
    first.start_run()
    first.record(3, [("q0", "orders", "moved", 5, None)], store, now=at)
    second = SyphonBatchWriter(CONFIG, store=store)  # a fresh checkpoint: batch ids from 0
    second.start_run()
    second.record(
        0, [("q0", "orders", "moved", 2, None), ("q0", "orders", "acknowledged", 1, "m1")], store, now=at
    )
    restarted = first.run_id
    first.start_run()  # the same writer's next query (the same checkpoint, a replayed batch 3 drained again)
    assert first.run_id != restarted and first.txn_id == f"syphon/p/{first.run_id}"
    first.record(3, [("q0", "orders", "moved", 4, None)], store, now=at)
    first.record(3, [("q0", "orders", "moved", 4, None)], store, now=at)  # the same run's batch: once
    events = store.read_events()
    assert sum(e.count for e in events if e.event == "moved") == 11
    assert [e.detail for e in events if e.event == "acknowledged"] == ["m1"]
    assert {e.sink_id for e in events} == {"syphon/p"}
    copy = pickle.loads(pickle.dumps(first))  # the foreachBatch function under Spark Connect
    assert copy.run_id == first.run_id and copy.txn_id == first.txn_id


def _lease(
    store: MemoryStateStore,
    clock: FakeClock,
    run_id: str,
    checkpoint: str = "/chk/job",
    queues: tuple[str, ...] | None = None,
    host: str = "host-a",
) -> Any:
    from spark_sb.spark.syphon_lease import SyphonLease, SyphonRun

    run = SyphonRun(run_id, host, checkpoint, clock.now(), queues)
    return SyphonLease(store, "syphon/p", "p.example:5671", run, clock=clock, stale=300, heartbeat=60)


def test_a_second_ordered_job_is_refused_in_one_line_naming_the_first_until_it_stops() -> None:
    from spark_sb.spark.syphon_lease import SyphonRefused

    store, clock = MemoryStateStore(), FakeClock()
    first = _lease(store, clock, "run-1", "/chk/job", host="driver-1")
    first.acquire()
    clock.advance(20)
    with pytest.raises(SyphonRefused) as refused:
        _lease(store, clock, "run-2", "/chk/notebook", host="driver-2").acquire()
    message = str(refused.value)
    assert "\n" not in message
    assert (
        "run run-1 on driver-1 (checkpoint /chk/job, started 2026-01-01 00:00:00 UTC, last seen 20 s ago)"
        in message
    )
    # the refused run left no lease behind: once the first stops, a third starts
    first.release()
    third = _lease(store, clock, "run-3", "/chk/notebook")
    third.acquire()
    with pytest.raises(SyphonRefused, match="run run-3 on host-a"):
        _lease(store, clock, "run-4", "/chk/other").acquire()


def test_a_lease_runs_out_without_heartbeats_and_holds_with_them() -> None:
    store, clock = MemoryStateStore(), FakeClock()
    first = _lease(store, clock, "run-1")
    first.acquire()
    for _ in range(10):  # ten minutes of heartbeats: still held
        clock.advance(60)
        assert first.beat()
        assert not first.beat()  # not due again yet
    from spark_sb.spark.syphon_lease import SyphonRefused

    with pytest.raises(SyphonRefused):
        _lease(store, clock, "run-2", "/chk/other").acquire()
    clock.advance(301)  # the first was killed: silent for longer than the stale time
    _lease(store, clock, "run-3", "/chk/other").acquire()


def test_a_restart_on_the_same_checkpoint_and_a_job_on_other_queues_are_not_refused() -> None:
    from spark_sb.spark.syphon_lease import SyphonRefused

    store, clock = MemoryStateStore(), FakeClock()
    _lease(store, clock, "run-1", "/chk/job", queues=(QUEUES[0],)).acquire()  # then killed
    _lease(store, clock, "run-2", "/chk/job", queues=(QUEUES[0],)).acquire()  # its restart
    _lease(store, clock, "run-3", "/chk/other", queues=(QUEUES[1],)).acquire()  # another queue
    with pytest.raises(SyphonRefused):
        _lease(store, clock, "run-4", "/chk/third").acquire()  # every queue: overlaps


def test_of_two_jobs_starting_together_one_at_least_is_refused() -> None:
    """Each run reads after its own write: the one whose read comes second sees the other's running lease."""
    from spark_sb.spark.syphon_lease import SyphonRefused

    store, clock = MemoryStateStore(), FakeClock()
    second = _lease(store, clock, "run-2", "/chk/b")

    class Interleaved(MemoryStateStore):
        def read_events(self, sink_id: str | None = None) -> list[Any]:
            if not hasattr(self, "raced"):  # the other starts between this one's write and its read
                self.raced = True
                second.store = self
                with pytest.raises(SyphonRefused):
                    second.acquire()
            return super().read_events(sink_id)

    racing = Interleaved()
    first = _lease(racing, clock, "run-1", "/chk/a")
    first.acquire()  # the second's lease was released when it was refused
    assert [e.event for e in racing.read_events()] == ["syphon_running", "syphon_running", "syphon_stopped"]


def test_a_released_lease_is_released_once_and_a_failing_store_does_not_raise() -> None:
    store, clock = MemoryStateStore(), FakeClock()
    lease = _lease(store, clock, "run-1")
    lease.acquire()
    lease.release()
    lease.release()
    assert not lease.beat()
    assert [e.event for e in store.read_events()] == ["syphon_running", "syphon_stopped"]

    class Down(MemoryStateStore):
        def append_events(self, events: Any) -> None:
            raise OSError("the table is gone")

    _lease(Down(), clock, "run-2").release()  # runs out after the stale time instead


def test_the_ordered_drain_measures_its_locks_with_the_queues_own_lock_duration(
    monkeypatch: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 47 (the syphon measures a lock from its receive plus the lock duration, SPEC O6): a backlog queue
    created by hand may lock for 30 s, not the provisioned 60. The planner reads each queue's lock once and the
    partition carries it; a pooled syphon drains each queue with that queue's own. Unread: the provisioned lock."""
    import logging
    from collections.abc import Iterator
    from dataclasses import replace
    from datetime import timedelta

    from spark_sb.sender.pool import SenderPool
    from spark_sb.spark import syphon_drain
    from spark_sb.syphon.rules import LOCK_DURATION

    class LockAdmin(FakeAdmin):
        reads = 0

        def get_queue(self, queue: str) -> Any:
            LockAdmin.reads += 1
            return SimpleNamespace(
                lock_duration=timedelta(seconds=30 if queue == QUEUES[0] else 45),
                max_delivery_count=10 if queue == QUEUES[1] else 2147483647,
            )

    watcher = BacklogWatcher(CONFIG, QUEUES, admin=LockAdmin())
    with caplog.at_level(logging.WARNING, logger="spark_sb.spark.syphon_job"):
        assert watcher.lock_durations() == {QUEUES[0]: 30.0, QUEUES[1]: 45.0, **{q: 45.0 for q in QUEUES[2:]}}
    assert not caplog.records  # ordering none: a bounded MaxDeliveryCount costs no order
    ordered = BacklogWatcher(replace(CONFIG, ordering="session"), QUEUES, admin=LockAdmin())
    with caplog.at_level(logging.WARNING, logger="spark_sb.spark.syphon_job"):
        ordered.lock_durations()
    (warning,) = caplog.records  # said once, naming the queue created by hand
    assert QUEUES[1] in warning.getMessage() and "spark-sb provision" in warning.getMessage()
    assert QUEUES[0] not in warning.getMessage()
    LockAdmin.reads = 0
    watcher.lock_durations()
    assert LockAdmin.reads == 0  # read once, before the count was reset
    assert BacklogWatcher(CONFIG, QUEUES, admin=DownAdmin()).lock_durations() == {}

    seen: list[float] = []

    class FakeSyphon:
        lock_duration = -1.0

        def __init__(self, config: ServiceBusConfig, **kwargs: Any) -> None:
            pass

        def set_hints(self, hints: Any) -> None:
            pass

        def drain_batches(self, queue: str, **kwargs: Any) -> Iterator[SyphonOutcome]:
            seen.append(self.lock_duration)
            yield SyphonOutcome()

    monkeypatch.setattr(syphon_drain, "SYPHONS", SenderPool(clock=FakeClock()))
    monkeypatch.setattr(syphon_drain, "Syphon", FakeSyphon)
    list(syphon_drain.drain_partition(CONFIG, QUEUES[0], False, queues=QUEUES, lock_duration=30.0))
    list(syphon_drain.drain_partition(CONFIG, QUEUES[1], False, queues=QUEUES, lock_duration=45.0))
    list(syphon_drain.drain_partition(CONFIG, QUEUES[1], False, queues=QUEUES))
    assert seen == [30.0, 45.0, LOCK_DURATION]
