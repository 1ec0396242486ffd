"""``ordering`` with Spark (issue 31, setting a), without Spark: the refusals (``format('servicebus')`` does not keep
order; the sink and the syphon job need the state tables), and the driver/task handoff of
spark_sb/state/sessions.py on a fake clock - the real :class:`ServiceBusSink` driver steps and
:func:`send_partition` task code, tasks of consecutive micro-batches landing in two executor "processes" (each its
own failover registry and session book, one fake transport for both namespaces), a model of the syphon job (one
task per backlog queue, queue order, return markers acknowledged in the events table by the job's real
:class:`SyphonBatchWriter` after its micro-batch), the one memory state store in between. What a session receiver
on the primary gets is checked per session against the produced order."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from servicebus_local.clock import FakeClock
from spark_sb.core.errors import ConfigError
from spark_sb.failover.ordering import marker_of
from spark_sb.failover.registry import FailoverRegistry
from spark_sb.message.backlog import from_backlog
from spark_sb.sender.paired import PairedSender
from spark_sb.spark.datasource_options import parse_options
from spark_sb.spark.partition import send_partition
from spark_sb.spark.sink import ServiceBusSink
from spark_sb.spark.syphon_job import run_syphon, syphon_source
from spark_sb.spark.syphon_ledger import SyphonBatchWriter
from spark_sb.state.records import ACKNOWLEDGED, SESSION_HELD, SESSION_RETURNED, PartitionResult
from spark_sb.state.store import MemoryStateStore
from spark_sb.wire.transport import PRIMARY, SECONDARY, Target
from tests.unit.fakes import FakeTransport
from tests.unit.sender.rig import QUEUES, conn_error, make_config

PRIMARY_CS = "Endpoint=sb://primary.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=p-secret"
SECONDARY_CS = (
    "Endpoint=sb://secondary.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=s-secret"
)


# ------------------------------------------------------------------------------------------------ refusals
def _one_line(err: pytest.ExceptionInfo[ConfigError]) -> str:
    text = str(err.value)
    assert "\n" not in text
    assert [k for k, _ in err.value.errors] == ["ordering"]
    return text


class _NoSpark:
    """A session that fails the test if anything touches it (the check comes first)."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"spark.{name} touched before the ordering check")


@pytest.mark.parametrize("ordering", ["session", "entity"])
def test_format_servicebus_takes_the_ordering_option_with_path_tables_only(ordering: str) -> None:
    """(More in tests/unit/spark/test_datasource_ordering.py.)"""
    options = {"primary.connection_string": PRIMARY_CS, "secondary.connection_string": SECONDARY_CS}
    with pytest.raises(ConfigError) as err:
        parse_options({**options, "entity": "orders", "ORDERING": ordering})
    text = _one_line(err)
    assert text.startswith("format('servicebus'): option 'ordering': ") and "needs the state tables" in text
    parsed = parse_options({**options, "entity": "orders", "ORDERING": ordering, "state_location": "/tmp/sb"})
    assert parsed.config.ordering == ordering
    assert parse_options({**options, "entity": "orders", "ordering": "none"}).config.ordering == "none"


@pytest.mark.parametrize("ordering", ["session", "entity"])
def test_the_sink_and_the_syphon_job_take_ordering_only_with_state_tables(ordering: str) -> None:
    config = make_config(ordering=ordering)
    for build in (
        lambda: ServiceBusSink(config),
        lambda: run_syphon(_NoSpark(), config, checkpoint="/nowhere"),  # type: ignore[arg-type]
        lambda: syphon_source(config),
        lambda: SyphonBatchWriter(config),
    ):
        with pytest.raises(ConfigError) as err:
            build()
        assert "needs the state tables" in _one_line(err)
    tables = make_config(ordering=ordering, state_location="/tmp/state")
    assert ServiceBusSink(tables).config.ordering == ordering
    assert SyphonBatchWriter(tables).config.ordering == ordering
    assert ServiceBusSink(config, store=MemoryStateStore()).config.ordering == ordering


# ------------------------------------------------------------------------------------------------ the handoff
ENTITIES = ("orders", "invoices")
SESSIONS = [f"s{i:02d}" for i in range(20)]


def entity_of(session: str) -> str:
    return ENTITIES[int(session[1:]) % 2]


class World:
    """Two executor processes, one fake namespace pair, one state store, the sink's driver and the syphon job."""

    def __init__(self, ordering: str = "session", forget: bool = False) -> None:
        self.clock = FakeClock()
        self.transport = FakeTransport(self.clock, max_batch=1000, op_seconds=0.01)
        self.store = MemoryStateStore()
        self.config = make_config(ordering=ordering, entity=None, failover_interval=0.0)
        self.processes = []
        for i in range(2):
            registry = FailoverRegistry(self.clock)
            sender = PairedSender(
                self.config,
                transport=self.transport,
                clock=self.clock,
                registry=registry,
                rng=random.Random(i),
            )
            self.processes.append((registry, sender))
        self.forget = forget  # the control: the driver hands no held lines to its tasks
        self.sink = self.new_driver()
        self.produced: dict[str, list[str]] = {s: [] for s in SESSIONS}
        self.seq = 0
        self.syphon = SyphonModel(self)

    def new_driver(self) -> ServiceBusSink:
        return ServiceBusSink(self.config, store=self.store, sync_writes=True)

    def rows(self, per_session: int) -> list[list[dict[str, Any]]]:
        """One micro-batch's rows, two partitions by session id (the user's repartition)."""
        parts: list[list[dict[str, Any]]] = [[], []]
        for _ in range(per_session):
            for s in SESSIONS:
                mid = f"{s}-{self.seq:04d}"
                self.seq += 1
                self.produced[s].append(mid)
                parts[int(s[1:]) % 2].append(
                    {"body": b"x", "message_id": mid, "session_id": s, "entity": entity_of(s)}
                )
        return parts

    def batch(self, batch_id: int, per_session: int = 2) -> None:
        parts = self.rows(per_session)
        sink = self.sink

        def run_tasks(handoff: Any) -> list[PartitionResult]:
            held = () if self.forget else sink.held_lines
            out = []
            for p, rows in enumerate(parts):
                registry, sender = self.processes[(batch_id + p) % 2]  # a task lands in either process
                remark = sink.stale_lines if p == 0 and not self.forget else ()  # the first task's job
                out.append(
                    send_partition(sink.config, rows, handoff, held, remark, registry=registry, sender=sender)
                )
            return out

        sink.process_batch(batch_id, run_tasks, lambda: sum(map(len, parts)), self.store, now=self.clock.now)
        self.clock.advance(1.0)

    def received(self) -> dict[str, list[str]]:
        """What a session receiver per session gets from the primary (duplicate detection: first occurrence)."""
        got: dict[str, list[str]] = {s: [] for s in SESSIONS}
        seen: set[str] = set()
        for entity in ENTITIES:
            for m in self.transport.at(PRIMARY, entity):
                assert m.message_id is not None and m.session_id is not None
                if m.message_id not in seen:
                    seen.add(m.message_id)
                    got[m.session_id].append(m.message_id)
        return got


class SyphonModel:
    """The syphon job: one task per backlog queue, a line in queue order; a return marker passed becomes an
    ``acknowledged`` row that the job's :class:`SyphonBatchWriter` writes after the micro-batch (never before the
    moves it stands for). ``kill``: the micro-batch dies before its ``foreachBatch`` (its rows are not written)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.writer = SyphonBatchWriter(world.config, store=world.store)
        self.taken = dict.fromkeys(QUEUES, 0)
        self.batch_id = 0
        self.unwritten: list[tuple[str | None, str | None, str, int, str | None]] = []

    def pending(self) -> int:
        return sum(len(self.world.transport.at(SECONDARY, q)) - self.taken[q] for q in QUEUES)

    def micro_batch(
        self, limit: int = 1000, *, first: int | None = None, write: bool = True, kill: bool = False
    ) -> None:
        """Drain each queue up to ``limit`` messages (the first queue up to ``first``)."""
        rows: list[tuple[str | None, str | None, str, int, str | None]] = []
        for queue in QUEUES:
            backlog = self.world.transport.at(SECONDARY, queue)
            for _ in range(first if first is not None and queue == QUEUES[0] else limit):
                n = self.taken[queue]
                if n >= len(backlog):
                    break
                self.taken[queue] = n + 1
                restored, _ = from_backlog(backlog[n])
                assert restored.entity is not None
                marker = marker_of(restored)
                if marker is not None:
                    rows.append((queue, restored.entity, ACKNOWLEDGED, 1, marker))
                else:
                    self.world.transport.delivered.setdefault(Target(PRIMARY, restored.entity), []).append(
                        restored
                    )
        if kill:
            return
        self.unwritten.extend(rows)
        if write:
            self.write()

    def write(self) -> None:
        """The job's ``foreachBatch``: the micro-batch's rows into the events table."""
        self.batch_id += 1
        rows, self.unwritten = self.unwritten, []
        self.writer.record(self.batch_id, rows, self.world.store, now=self.world.clock.now())


def outage(world: World) -> Callable[[], None]:
    world.transport.fail(conn_error, namespace=PRIMARY)

    def recover() -> None:
        world.transport.heal()
        world.clock.advance(31)  # ping_primary_interval: the next admit probes the primary

    return recover


def run(world: World) -> list[int]:
    """The issue's shape: 12 micro-batches, the primary refusing over batches 3-6, one entity stalled over 8-9.
    The syphon job from batch 7: the first backlog queue caught up at once (its sessions return to the primary at
    batch 7, and those of the stalled entity are diverted again at 8), the others slowly (their sessions stay on
    the backlog behind their messages); a pass straddling the sink's read at batch 8; a run killed mid-drain at
    batch 9 (markers passed, their acknowledgements never written), when the sink's driver restarts (its held
    lines come from the sessions table); everything caught up at 10. Returns the held lines of each batch."""
    held: list[int] = []
    recover: Callable[[], None] | None = None
    for b in range(12):
        if b == 3:
            recover = outage(world)
        if b == 7 and recover is not None:
            recover()
        if b == 8:
            stall = world.transport.stall(namespace=PRIMARY, entity="invoices")
        if b == 9:
            world.sink = world.new_driver()  # its held lines come from the sessions table
        if b == 10:
            world.transport.heal(stall)
            world.clock.advance(31)
        if b in (7, 8, 9):
            world.syphon.micro_batch(limit=6, first=1000, write=b != 8, kill=b == 9)
        elif b >= 10:
            world.syphon.micro_batch()
        world.batch(b)
        held.append(len(world.sink.held_lines))
        if b == 8:
            world.syphon.write()  # the pass that started before the sink's read is written after it
    for extra in range(6):  # the syphon finishes; batches without rows let the driver release the rest
        world.syphon.micro_batch()
        world.batch(12 + extra, per_session=0)
    return held


def test_every_session_reaches_the_primary_in_order_across_processes_batches_and_restarts() -> None:
    world = World()
    held = run(world)
    # (the held lines handed to each batch's tasks) all held through the outage; the first queue's sessions back at
    # batch 7; the stalled entity's diverted again at 8 (held from 9); every one back once the syphon caught up
    assert held[6] == len(SESSIONS) and 0 < held[7] < held[6] and held[9] > held[8] and held[10] == 0
    got = world.received()
    for s in SESSIONS:
        assert got[s] == world.produced[s], s  # in order, none lost, none twice
    events = world.store.read_events()
    held = {(e.entity, e.detail) for e in events if e.event == SESSION_HELD}
    returned = {(e.entity, e.detail) for e in events if e.event == SESSION_RETURNED}
    assert len(held) >= 10 and returned == held  # diverted sessions, every one back on the primary
    assert len(world.sink.held_lines) == 0 and world.store.read_sessions(world.sink.sink_id) == []
    assert world.syphon.pending() == 0


def test_the_control_without_the_handoff_loses_order() -> None:
    """The same run with a driver that hands its tasks no held lines (each process knows only what it diverted
    itself, what step 1 refused): at least one session overtakes itself."""
    world = World(forget=True)
    run(world)
    got = world.received()
    assert any(got[s] != sorted(got[s]) for s in SESSIONS)


def test_with_ordering_none_at_least_one_session_is_out_of_order() -> None:
    world = World(ordering="none")
    run(world)
    got = world.received()
    assert any(got[s] != sorted(got[s]) for s in SESSIONS)


def test_the_control_a_restarted_driver_without_the_sessions_table_loses_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The restart at batch 9 with a sessions table that reads empty: the held lines of the killed syphon run
    (acknowledgements lost) go straight to the primary ahead of their backlog."""
    world = World()
    monkeypatch.setattr(world.store, "read_sessions", lambda sink_id: [])
    run(world)
    got = world.received()
    assert any(got[s] != sorted(got[s]) for s in SESSIONS)


class _Admin:
    """The secondary's admin client as the planner sees it: every backlog queue holds messages."""

    def __init__(self, lock: float | None) -> None:
        self.lock = lock

    def list_queues_runtime_properties(self) -> list[Any]:
        from types import SimpleNamespace

        return [SimpleNamespace(name=q, active_message_count=5, dead_letter_message_count=0) for q in QUEUES]

    def get_queue(self, queue: str) -> Any:
        from datetime import timedelta
        from types import SimpleNamespace

        if self.lock is None:
            raise ConnectionError("down")
        return SimpleNamespace(lock_duration=timedelta(seconds=self.lock))


@pytest.mark.parametrize(("lock", "wait"), [(20.0, 25.0), (None, 65.0)])
def test_the_ordered_syphon_job_drains_nothing_before_a_killed_runs_locks_ran_out(
    lock: float | None, wait: float
) -> None:
    """A run of the syphon job that starts after one was killed mid-drain: the killed run's locked messages come
    back to their queues when their locks run out, before anything behind them; draining earlier would move a
    session's later messages first. So the first drain waits the queues' longest lock duration + 5 s (65 s when
    it cannot be read), on the injected clock; with ordering: none nothing waits."""
    from spark_sb.spark.syphon_planner import BacklogWatcher

    clock = FakeClock()
    config = make_config(ordering="session", state_location="/tmp/state")
    watcher = BacklogWatcher(config, QUEUES, admin=_Admin(lock), clock=clock)
    assert watcher.work() == []
    clock.advance(wait - 0.5)
    assert watcher.work() == []
    clock.advance(0.5)
    assert watcher.work() == [(q, False) for q in QUEUES]
    unordered = BacklogWatcher(make_config(), QUEUES, admin=_Admin(lock), clock=FakeClock())
    assert unordered.work() == [(q, False) for q in QUEUES]


def test_a_drain_yields_one_acknowledged_row_per_marker_its_syphon_passed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Executor side of the syphon job: the pooled syphon acknowledges to a :class:`CollectedAcks`; the drain yields
    each marker passed as an ``acknowledged`` row (message id and detail: the marker id) after the receive batch's
    rows - the job's ``foreachBatch`` writes them to the events table after the micro-batch."""
    from collections.abc import Iterator

    from spark_sb.sender.pool import SenderPool
    from spark_sb.spark import syphon_drain
    from spark_sb.syphon.rules import SyphonOutcome

    class FakeSyphon:
        def __init__(self, config: Any, **kwargs: Any) -> None:
            self.acks = kwargs["acks"]

        def drain_batches(self, queue: str, **kwargs: Any) -> Iterator[SyphonOutcome]:
            self.acks.acknowledged("orders", "s1", "m1")
            yield SyphonOutcome(moved_ids=[("orders", "s1-0")])

        def close(self) -> None:
            pass

    monkeypatch.setattr(syphon_drain, "SYPHONS", SenderPool(clock=FakeClock()))
    monkeypatch.setattr(syphon_drain, "Syphon", FakeSyphon)
    config = make_config(ordering="session", state_location="/tmp/state")
    rows = list(syphon_drain.drain_partition(config, QUEUES[0], False, queues=QUEUES))
    assert rows == [
        (QUEUES[0], False, "orders", "moved", 1, "s1-0", None),
        (QUEUES[0], False, "orders", ACKNOWLEDGED, 1, "m1", "m1"),
    ]


def test_the_ordered_syphon_job_refuses_prefetch() -> None:
    """A pooled syphon's prefetched messages stay locked in its worker after the task while the next micro-batch may
    drain their queue from another worker: with ordering, syphon.prefetch must be 0 (one line naming the key)."""
    config = make_config(ordering="session", state_location="/tmp/state", syphon_prefetch=10)
    for build in (
        lambda: run_syphon(_NoSpark(), config, checkpoint="/nowhere"),  # type: ignore[arg-type]
        lambda: syphon_source(config),
    ):
        with pytest.raises(ConfigError) as err:
            build()
        assert str(err.value).startswith(
            "syphon.prefetch: must be 0 with ordering: session"
        ) and "\n" not in str(err.value)
    syphon_source(make_config(syphon_prefetch=10))  # without ordering, prefetch is the user's call


def test_an_idle_session_whose_acknowledgement_was_lost_gets_a_fresh_marker_and_returns() -> None:
    """A syphon run killed after it passed the sessions' newest markers, before it wrote their acknowledgements:
    sessions with nothing more to send stay held (never released early) until their newest marker is
    REMARK_AFTER old; then the batch's first task sends each a fresh marker, which the syphon acknowledges, and
    the next batch returns them to the primary - in order."""
    from spark_sb.state.sessions import REMARK_AFTER

    world = World()
    recover = outage(world)
    world.batch(0, per_session=1)  # diverted: every session held, its marker behind its message
    recover()
    world.syphon.micro_batch(kill=True)  # moved everything, markers passed, no acknowledgement written
    world.batch(1, per_session=0)
    assert len(world.sink.held_lines) == len(SESSIONS) and world.sink.stale_lines == ()
    world.clock.advance(REMARK_AFTER.total_seconds())
    world.batch(2, per_session=0)  # the first task marks the idle sessions afresh
    assert len(world.sink.stale_lines) == len(SESSIONS)
    world.syphon.micro_batch()
    world.batch(3, per_session=1)  # released at the batch's start: these go straight to the primary
    assert world.sink.held_lines == ()
    got = world.received()
    assert all(got[s] == world.produced[s] for s in SESSIONS)
    assert world.store.read_sessions(world.sink.sink_id) == []
