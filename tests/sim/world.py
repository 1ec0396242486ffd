"""The world of one simulated schedule (SPEC O9, issue 47): a primary namespace and a secondary with backlog queues,
Python workers each with its own process state, the Spark sink's driver and its tasks, syphon jobs and their tasks,
one state store - all on one fake clock, all real code but the namespaces and Spark.

* **Namespaces.** :class:`SimTransport` (the unit tests' :class:`~tests.unit.fakes.FakeTransport`, whose scripted
  rules are the outages that start and end) carries every send of the senders and the syphons. Any call may also
  meet a fault of its own (:meth:`World.fault`): refused, failed, stalled to its deadline on the fake clock, or its
  reply lost after the send landed. What lands on the primary is logged per entity in arrival order (a session
  receiver's view, duplicates dropped by message id within :data:`DUP_WINDOW`); what lands in the secondary is
  enqueued in :class:`~tests.sim.backlog.SimQueue` (peek-lock, lock expiry, defer, delivery counts).
* **Workers.** Each :class:`Worker` is one Python worker: its own failover registry (entity states, backlog
  rotation, session book), sender pool and syphon pool - the module-level ``SENDERS`` / ``SYPHONS`` and the
  ``PairedSender`` / ``Syphon`` factories are swapped to the worker's while a task of it runs (:meth:`World.worker`).
* **The sink** is :class:`~spark_sb.spark.sink.ServiceBusSink`'s ``process_batch`` (the driver steps: release,
  handoff, merge, sessions table) or, in half the schedules (:data:`SINK`), ``format('servicebus')``'s plan and
  commit (:func:`~spark_sb.spark.datasource.plan_from`, :func:`~spark_sb.spark.datasource.commit_to`: the ledger
  read from the sessions table at each), with tasks run through :func:`~spark_sb.spark.partition.send_partition`,
  retried up to 4 attempts in the same or another worker. A batch whose task fails 4 times stops the query; it is
  replayed.
* **The syphon job** is its planner (:class:`~spark_sb.spark.syphon_planner.BacklogWatcher` over a fake admin),
  :func:`~spark_sb.spark.syphon_drain.drain_partition` per queue in a worker, and ``SyphonBatchWriter.record``
  (rows aggregated as its ``foreachBatch`` does) into the store.

Test code: one thread, not picklable. Bounded by the schedule (a few sessions, a few dozen messages).
"""

from __future__ import annotations

import os
import random
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

from azure.servicebus import exceptions as sbe

from servicebus_local.clock import FakeClock
from spark_sb.failover.ordering import marker_of
from spark_sb.failover.registry import FailoverRegistry
from spark_sb.message.outbound import OutboundMessage
from spark_sb.sender.paired import PairedSender
from spark_sb.sender.pool import SenderPool
from spark_sb.spark import datasource, partition, syphon_drain, syphon_ledger, syphon_planner
from spark_sb.spark.sink import ServiceBusSink
from spark_sb.state.records import ACKNOWLEDGED, MOVED
from spark_sb.state.sessions import HeldLine
from spark_sb.state.store import MemoryStateStore
from spark_sb.syphon.mover import Syphon
from spark_sb.wire.lane import DeadlineExceeded
from spark_sb.wire.parking import Parked
from spark_sb.wire.transport import PRIMARY, SECONDARY, Target
from tests.sim.backlog import Delivery, SimLane, SimQueue
from tests.unit.fakes import FakeBatch, FakeTransport
from tests.unit.sender.rig import make_config
from tests.unit.syphon.test_ordered import received

ENTITIES = ("orders", "invoices")
#: The primary's duplicate detection window (seconds): longer than any schedule.
DUP_WINDOW = 3600.0
#: Spark's task attempts (spark.task.maxFailures) before a batch, and the query, fails.
TASK_ATTEMPTS = 4
#: O7: deliveries of a held-back message that were no attempt to move it.
MAX_IDLE_DELIVERIES = 3
#: O7: failed attempts after which the syphon abandoned a message (raising its delivery count): its count must not
#: follow the length of an outage (with the service's default MaxDeliveryCount 10 the head would be dead-lettered).
MAX_ABANDONED_ATTEMPTS = 3
FAULT_KINDS = ("refuse", "fail", "stall", "lost")
#: Batch limits (the fake transport's sizes): about 3 messages a primary batch; two translated messages or one
#: return marker a backlog batch - so that batches fill in the middle of a send call.
PRIMARY_BATCH, BACKLOG_BATCH = 100, 240


class QueryStopped(Exception):
    """A task failed all its attempts: Spark stops the query."""


#: A busy tail before the quiet one (:meth:`World.busy_tail`) in every ``BUSY_EVERY``-th schedule (by seed: the
#: schedules' draws are unchanged); SIM_BUSY_TAIL=1: in every schedule.
BUSY_EVERY = 8
BUSY_TAIL = os.environ.get("SIM_BUSY_TAIL") == "1"
#: The sink of a schedule: ``format('servicebus')``'s plan and commit (a fresh ledger from the ``sessions`` table at
#: each) in every other run of ``BUSY_EVERY`` seeds - half the schedules, half the busy tails - else the ``foreachBatch``
#: sink's driver; SIM_SINK=datasource / foreachbatch: every schedule.
SINK = os.environ.get("SIM_SINK", "")


@dataclass
class Params:
    """What a schedule's seed draws besides its steps."""

    failover_interval: float
    chaos: float  # the probability that a call meets a fault of its own
    lane_chaos: float  # the same for the syphons' receiver calls
    max_delivery_count: int  # the backlog queues' (provisioned: unbounded; the service's default: 10)
    sessions: tuple[str, ...]
    steps: int
    driver_skew: float  # the syphon job's driver clock against the sink's (seconds, within ACK_SKEW)
    executor_skew: float  # an executor's wall clock against the service's (seconds)

    @staticmethod
    def draw(rng: random.Random) -> Params:
        return Params(
            failover_interval=rng.choice((0.0, 3.0, 10.0)),
            chaos=rng.choice((0.0, 0.02, 0.05, 0.1)),
            lane_chaos=rng.choice((0.0, 0.05, 0.15)),
            max_delivery_count=rng.choice((10, 2**31 - 1)),
            sessions=tuple(f"s{i}" for i in range(rng.randint(2, 4))),
            steps=rng.randint(10, 30),
            driver_skew=rng.uniform(-120.0, 120.0),
            executor_skew=rng.choice((0.0, 0.0, rng.uniform(-1.5, 1.5))),
        )


class SkewedClock:
    """An executor's clock: the world's, its wall time ``skew`` seconds off (monotonic time is the world's)."""

    def __init__(self, clock: FakeClock, skew: float) -> None:
        self._clock = clock
        self.skew = skew

    def monotonic(self) -> float:
        return self._clock.monotonic()

    def now(self) -> datetime:
        return self._clock.now() + timedelta(seconds=self.skew)

    def sleep(self, seconds: float) -> None:
        self._clock.sleep(seconds)


class DriverClock:
    """The sink driver's clock: the world's; a wait on it (the batch start's catch-up, R5) lets a syphon job's
    micro-batch that is committing meanwhile land (:attr:`World.committing`)."""

    def __init__(self, world: World) -> None:
        self._world = world

    def monotonic(self) -> float:
        return self._world.clock.monotonic()

    def now(self) -> datetime:
        return self._world.clock.now()

    def sleep(self, seconds: float) -> None:
        self._world.clock.advance(seconds)
        commit, self._world.committing = self._world.committing, None
        if commit is not None:
            commit()


class SimTransport(FakeTransport):
    """Both namespaces for every worker: the scripted outages (rules) and the world's per-call faults."""

    def __init__(self, world: World) -> None:
        super().__init__(world.clock, max_batch=PRIMARY_BATCH, op_seconds=0.01)
        self.world = world

    def max_batch_size(self, target: Target) -> int:
        return PRIMARY_BATCH if target.namespace == PRIMARY else BACKLOG_BATCH

    def new_batch(self, target: Target) -> FakeBatch:
        return FakeBatch(target, self.max_batch_size(target))

    def _check(self, op: str, target: Target, n: int, timeout: float, on_slow: Any = None) -> None:
        if op != "send":
            fault = self.world.fault(op, target.entity)
            if fault is not None:
                self.world.faults_met += 1
                _raise(fault, self.world.clock, timeout, landed=False)
        try:
            super()._check(op, target, n, timeout, on_slow)
        except BaseException:
            self.world.faults_met += 1
            raise

    def send(  # type: ignore[override]
        self, batch: Any, timeout: float, on_slow: Any = None, park_after: float | None = None
    ) -> None:
        self.world.attempted(batch.target, batch.messages)
        fault = self.world.fault("send", batch.target.entity)
        if fault is not None and fault != "lost":
            self.world.faults_met += 1
            _raise(fault, self.world.clock, timeout, landed=False)
        before = len(self.delivered.get(batch.target, []))
        try:
            super().send(batch, timeout, on_slow, park_after)
        except Parked:
            raise
        self.world.landed(batch.target, self.delivered[batch.target][before:])
        if fault == "lost":
            self.world.faults_met += 1
            _raise(fault, self.world.clock, timeout, landed=True)

    def resume(self, parked: Parked, on_slow: Any = None, park_after: float | None = None) -> None:
        batch = parked.ticket
        before = len(self.delivered.get(batch.target, []))
        super().resume(parked, on_slow, park_after)
        self.world.landed(batch.target, self.delivered[batch.target][before:])


def _raise(fault: str, clock: FakeClock, timeout: float, *, landed: bool) -> None:
    if fault in ("stall", "lost"):
        clock.advance(min(timeout, 35.0))
        raise DeadlineExceeded(f"no answer within {timeout} s")
    if fault == "fail":
        raise sbe.OperationTimeoutError(message="the service timed out")
    raise sbe.ServiceBusConnectionError(message="connection refused")


class SimAdmin:
    """The secondary's admin endpoint as the syphon job's planner reads it."""

    def __init__(self, world: World) -> None:
        self.world = world

    def _props(self, q: str) -> SimpleNamespace:
        if self.world.fault("admin", q) is not None:
            raise sbe.ServiceBusConnectionError(message="admin endpoint down")
        queue = self.world.queues[q]
        assert queue.dlq is not None
        return SimpleNamespace(
            name=q, active_message_count=queue.active(), dead_letter_message_count=queue.dlq.active()
        )

    def list_queues_runtime_properties(self) -> list[SimpleNamespace]:
        return [self._props(q) for q in self.world.names]

    def get_queue_runtime_properties(self, q: str) -> SimpleNamespace:
        return self._props(q)

    def get_queue(self, q: str) -> SimpleNamespace:
        return SimpleNamespace(lock_duration=timedelta(seconds=60))


class Worker:
    """One Python worker's process state (the module globals of a real one)."""

    def __init__(self, world: World, number: int) -> None:
        self.number = number
        self.registry = FailoverRegistry(world.clock)
        self.senders: SenderPool[PairedSender] = SenderPool(clock=world.clock)
        self.syphons: SenderPool[Syphon] = SenderPool(clock=world.clock)


@dataclass
class Job:
    """One syphon job run: its checkpoint's batch ids, its planner, its ``foreachBatch`` writer."""

    name: str
    writer: syphon_ledger.SyphonBatchWriter
    watcher: syphon_planner.BacklogWatcher
    batch_id: int = 0


@dataclass
class Violation:
    prop: str
    detail: str

    def __str__(self) -> str:
        return f"{self.prop}: {self.detail}"


@dataclass
class World:
    seed: int
    rng: random.Random = field(init=False)
    params: Params = field(init=False)
    clock: FakeClock = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.params = Params.draw(self.rng)
        self.clock = FakeClock(start=datetime(2030, 1, 1, tzinfo=datetime.now().astimezone().tzinfo))
        self.trace: deque[str] = deque(maxlen=int(os.environ.get("SIM_TRACE", "36")))
        self.oplog: list[str] | None = [] if os.environ.get("SIM_OPS") else None  # every queue operation
        self.step_no = 0
        self.quiet = False  # the healthy tail: no faults of any kind
        # a syphon job's micro-batch that lands at the sink driver's next wait (DriverClock)
        self.committing: Callable[[], None] | None = None
        self.faults_met = 0
        self.locks = 0
        self.open_deliveries: dict[str, Delivery] = {}
        self.last_delivery: dict[str, Delivery] = {}
        self.violations: list[Violation] = []
        self.sdk_cache: dict[str, Any] = {}  # message id -> its SDK form (bounded by the schedule's messages)
        self.dead_lettered: set[str] = set()  # message ids a backlog queue dead-lettered at some point
        self.executor_skew = self.params.executor_skew
        self.config = make_config(
            ordering="session",
            entity=None,
            failover_interval=self.params.failover_interval,
            syphon_batch_size=2,
            syphon_max_wait=1.0,
        )
        self.names = self.config.backlog_queue_names(self.config.primary.effective_namespace_name())
        self.transport = SimTransport(self)
        self.queues = {
            q: SimQueue(self, q, max_delivery_count=self.params.max_delivery_count) for q in self.names
        }
        self.store = MemoryStateStore()
        self.datasource = SINK == "datasource" or (not SINK and self.seed // BUSY_EVERY % 2 == 1)
        self.workers = [Worker(self, n) for n in range(3)]
        self.worker_count = 3
        self.sink = self.new_driver()
        self.sink_batch_id = 0
        self.pending: list[list[dict[str, Any]]] | None = None  # a batch to replay (the query stopped)
        self.produced: dict[str, list[str]] = {s: [] for s in self.params.sessions}
        self.ids: set[str] = set()
        self.counter = 0
        # the primary: per entity, (arrival time, message id, session id) in arrival order
        self.primary: dict[str, list[tuple[float, str, str | None]]] = {e: [] for e in ENTITIES}
        self.jobs: list[Job] = [self.new_job("job-1")]
        self.recorded: dict[str, int] = {MOVED: 0, ACKNOWLEDGED: 0}  # rows handed to a foreachBatch
        self.zombies: list[Any] = []  # drains of killed workers (never closed: their locks stay taken)
        self.outages: list[tuple[str, Any, str]] = []  # (description, rule, queue for lane outages)
        self.lane_down: set[str] = set()

    # ------------------------------------------------------------------------------------------ the namespaces
    def note(self, text: str) -> None:
        self.trace.append(f"  [{self.clock.monotonic() - 1000:7.1f}] {text}")

    def fault(self, op: str, where: str) -> str | None:
        """Whether this call meets a fault of its own (and which), from the schedule's random stream."""
        if self.quiet:
            return None
        if op in ("lane", "admin") and where in self.lane_down:
            return "refuse"
        chaos = self.params.lane_chaos if op == "lane" else self.params.chaos
        if chaos and self.rng.random() < chaos:
            kind = self.rng.choice(FAULT_KINDS)
            self.note(f"fault: {op} {where}: {kind}")
            return kind
        return None

    def encoded(self, out: OutboundMessage) -> Any:
        """The SDK's received form of a backlog message, encoded once per message id (a copy sent again differs only
        in its backlog enqueue time, which no check reads): the encoding is a fifth of a schedule's time."""
        key = str(out.message_id)
        found = self.sdk_cache.get(key)
        if found is None:
            found = self.sdk_cache[key] = received(out)
        return found

    def attempted(self, target: Target, messages: list[OutboundMessage]) -> None:
        """A send to the primary: the syphon's current delivery of each message was an attempt to move it (O7)."""
        if target.namespace != PRIMARY:
            return
        for m in messages:
            d = self.last_delivery.get(str(m.message_id))
            if d is not None:
                d.attempted = True

    def landed(self, target: Target, messages: list[OutboundMessage]) -> None:
        if target.namespace == SECONDARY:
            queue = self.queues.get(target.entity)
            assert queue is not None, target
            for m in messages:
                queue.enqueue(m)
            return
        now = self.clock.monotonic()
        for m in messages:
            if marker_of(m) is not None:
                self.violations.append(
                    Violation("marker", f"a return marker reached the primary: {m.message_id}")
                )
            if m.message_id in self.ids:
                self.primary[target.entity].append((now, str(m.message_id), m.session_id))

    # ------------------------------------------------------------------------------------------ workers
    @contextmanager
    def worker(self, w: Worker) -> Iterator[None]:
        """Run a task in ``w``: the module-level process state is ``w``'s while it runs."""
        saved = (
            partition.SENDERS,
            partition.PairedSender,
            syphon_drain.SYPHONS,
            syphon_drain.Syphon,
            syphon_drain.time,
        )
        world = self

        def sender(config: Any) -> PairedSender:
            return PairedSender(
                config,
                transport=world.transport,
                clock=world.clock,
                registry=w.registry,
                rng=random.Random(world.rng.random()),
            )

        def syphon(config: Any, **kwargs: Any) -> Syphon:
            return world.build_syphon(config, **kwargs)

        partition.SENDERS = w.senders  # type: ignore[misc]
        partition.PairedSender = sender  # type: ignore[misc,assignment]
        syphon_drain.SYPHONS = w.syphons  # type: ignore[misc]
        syphon_drain.Syphon = syphon  # type: ignore[misc,assignment]
        # drain_partition's batch duration runs on the world's clock, as the syphon it drives does
        syphon_drain.time = SimpleNamespace(monotonic=self.clock.monotonic, sleep=self.clock.sleep)  # type: ignore[assignment]
        try:
            yield
        finally:
            (
                partition.SENDERS,
                partition.PairedSender,
                syphon_drain.SYPHONS,
                syphon_drain.Syphon,
                syphon_drain.time,
            ) = saved  # type: ignore[misc]

    def build_syphon(self, config: Any, **kwargs: Any) -> Syphon:
        s = Syphon(config, clock=SkewedClock(self.clock, self.executor_skew), **kwargs)
        s._primary.close()
        s._receiving.close()
        s._primary = self.transport  # type: ignore[assignment]
        lanes: dict[tuple[str, bool], SimLane] = {}

        def lane(queue: str, dead_letter: bool) -> SimLane:
            got = lanes.get((queue, dead_letter))
            if got is None:
                q = self.queues[queue]
                receiver = q.dlq if dead_letter else q
                assert receiver is not None
                got = lanes[(queue, dead_letter)] = SimLane(self, queue, dead_letter, receiver)
            return got

        def replace(queue: str, dead_letter: bool, why: str) -> None:
            for one in lanes.values():
                one.reset(why)

        s._lane = lane  # type: ignore[method-assign,assignment]
        s._replace_receiver = replace  # type: ignore[method-assign]
        return s

    def pick_worker(self, avoid: Worker | None = None) -> Worker:
        if avoid is not None and self.rng.random() < 0.5:
            return avoid  # a retry in the same worker
        return self.rng.choice(self.workers)

    def kill_worker(self) -> None:
        """A Python worker dies; a new one takes its place (nothing of its process state survives). Half the time it
        dies in the middle of a syphon task: what that task holds stays locked until the locks run out."""
        n = self.rng.randrange(len(self.workers))
        w = self.workers[n]
        queue = self.rng.choice(self.names)
        if self.rng.random() < 0.5:
            with self.worker(w):
                drain = syphon_drain.drain_partition(self.config, queue, False, None, self.names)
                try:
                    next(drain)
                    self.zombies.append(drain)  # never closed: its locks are held by a dead process
                    self.note(f"worker {w.number} killed mid-drain of {queue}")
                except StopIteration:
                    pass
        self.worker_count += 1
        self.workers[n] = Worker(self, self.worker_count)
        self.note(f"worker {w.number} killed; worker {self.worker_count} started")

    # ------------------------------------------------------------------------------------------ the sink
    def new_driver(self) -> ServiceBusSink:
        return ServiceBusSink(self.config, store=self.store, sync_writes=True, clock=DriverClock(self))

    def rows(self) -> list[list[dict[str, Any]]]:
        """A micro-batch's rows: a few sessions, a few messages each, two partitions by session id."""
        parts: list[list[dict[str, Any]]] = [[], []]
        chosen = self.rng.sample(self.params.sessions, self.rng.randint(1, len(self.params.sessions)))
        for s in chosen:
            n = self.rng.choice((1, 2, 3, 5))
            for _ in range(n):
                mid = f"{s}-{self.counter}"
                self.counter += 1
                self.produced[s].append(mid)
                self.ids.add(mid)
                entity = entity_of(s)
                parts[int(s[1:]) % 2].append(
                    {"body": b"x", "message_id": mid, "session_id": s, "entity": entity}
                )
        for p in parts:  # interleave the sessions of a partition, each in its order
            order = sorted(range(len(p)), key=lambda i: (self.rng.random(), 0))
            by_session: dict[str, list[dict[str, Any]]] = {}
            for r in p:
                by_session.setdefault(r["session_id"], []).append(r)
            keys = [p[i]["session_id"] for i in order]
            p[:] = [by_session[k].pop(0) for k in keys]
        return parts

    def held(self) -> tuple[HeldLine, ...]:
        """The sink's held lines: its driver's ledger, or the ``sessions`` table for the data source."""
        if self.datasource:
            return tuple(self.store.read_sessions(self.sink.sink_id))
        return self.sink.held_lines

    def sink_batch(self, empty: bool = False) -> None:
        """One micro-batch of the sink (a replay of the one that stopped the query, if any): the ``foreachBatch``
        sink's ``process_batch``, or the data source's plan, tasks and commit."""
        if self.pending is None:
            self.pending = [[], []] if empty else self.rows()
        parts = self.pending
        batch_id = self.sink_batch_id
        ids = [r["message_id"] for p in parts for r in p]
        try:
            if self.datasource:
                self._planned_batch(batch_id, parts)
            else:
                sink = self.sink
                sink.process_batch(
                    batch_id,
                    lambda handoff: self._tasks(batch_id, parts, handoff, sink.held_lines, sink.stale_lines),
                    lambda: sum(map(len, parts)),
                    self.store,
                    now=self.clock.now,
                )
        except QueryStopped as stop:
            restart = self.rng.random() < 0.5
            self.note(
                f"sink batch {batch_id} {ids}: query stopped ({stop}); {'driver restarts' if restart else 'restarted'}"
            )
            if restart:
                self.sink = self.new_driver()
            return
        self.note(
            f"sink batch {batch_id} {ids}: held {[(h.entity, h.session, h.queue[-1]) for h in self.held()]}"
        )
        self.sink_batch_id += 1
        self.pending = None

    def _planned_batch(self, batch_id: int, parts: list[list[dict[str, Any]]]) -> None:
        """The data source's micro-batch (``format('servicebus')``): the plan read on the driver (its catch-up waits
        on the driver's clock: a syphon job's commit lands there), the tasks, the commit - a fresh ledger from the
        ``sessions`` table at the plan and again at the commit."""
        plan = datasource.plan_from(
            self.store, self.config, self.sink.sink_id, None, self.clock.now(), DriverClock(self)
        )
        if plan.replayed(batch_id):
            reports = [datasource.TaskReport(batch_id, len(rows), None) for rows in parts]
        else:
            results = self._tasks(batch_id, parts, plan.handoff, plan.held, plan.remark)
            reports = [datasource.TaskReport(batch_id, r.rows, r) for r in results]
        datasource.commit_to(self.store, plan, batch_id, reports, now=self.clock.now)

    def _tasks(
        self,
        batch_id: int,
        parts: list[list[dict[str, Any]]],
        handoff: Any,
        held: tuple[HeldLine, ...],
        stale: tuple[tuple[str, str], ...],
    ) -> list[Any]:
        """A sink batch's tasks, one per partition, each retried up to :data:`TASK_ATTEMPTS` times in the same or
        another worker (:class:`QueryStopped` after the last)."""
        results = []
        for p, rows in enumerate(parts):
            remark = stale if p == 0 else ()
            w: Worker | None = None
            for attempt in range(TASK_ATTEMPTS):
                w = self.pick_worker(w)
                met = self.faults_met
                try:
                    with self.worker(w):
                        result = partition.send_partition(
                            self.config, list(rows), handoff, held, remark, registry=w.registry
                        )
                except Exception as exc:
                    self.note(
                        f"sink batch {batch_id} task {p} attempt {attempt} in worker {w.number}: {type(exc).__name__}"
                    )
                    if self.faults_met == met and "is unavailable" in str(exc):  # a held line's queue
                        self.violations.append(
                            Violation(
                                "O8",
                                f"sink batch {batch_id} task {p} attempt {attempt} failed without meeting a fault: "
                                f"{type(exc).__name__}: {exc}",
                            )
                        )
                    if attempt == TASK_ATTEMPTS - 1:
                        raise QueryStopped(str(exc)) from exc
                    continue
                results.append(result)
                break
        return results

    # ------------------------------------------------------------------------------------------ the syphon job
    def new_job(self, name: str, batch_id: int = 0) -> Job:
        writer = syphon_ledger.SyphonBatchWriter(self.config, store=self.store)
        if hasattr(writer, "start_run"):
            writer.start_run()  # as run_syphon does at each query start
        admin = SimAdmin(self)
        watcher = syphon_planner.BacklogWatcher(self.config, self.names, admin=admin, clock=self.clock)
        # never a real client, even after a failed read
        watcher._admin = lambda: admin  # type: ignore[method-assign]
        return Job(name, writer, watcher, batch_id)

    def job_batch(self, job: Job, *, kill: bool = False, meanwhile: Any = None) -> None:
        """One micro-batch of a syphon job: its tasks drain, then its foreachBatch records their rows - with
        ``meanwhile`` run between (a sink batch that starts while the job's batch is still committing: the commit
        lands at the sink driver's first wait, :class:`DriverClock`, else after the sink batch)."""
        self.committing = self._drain(job, kill)
        if meanwhile is not None:
            meanwhile()
        commit, self.committing = self.committing, None
        if commit is not None:
            commit()

    def _drain(self, job: Job, kill: bool) -> Callable[[], None] | None:
        """The job's tasks; the commit of what they did (None: no work, or the job was killed before it)."""
        work = job.watcher.work()
        if not work:
            self.note(f"{job.name}: no work")
            return None
        rows: list[tuple[Any, ...]] = []
        for queue, dead_letter in work:
            w = self.pick_worker()
            with self.worker(w):
                rows.extend(syphon_drain.drain_partition(self.config, queue, dead_letter, None, self.names))
        moved = [r[5] for r in rows if r[3] == MOVED]
        acks = [r[5] for r in rows if r[3] == ACKNOWLEDGED]
        if kill:
            self.note(
                f"{job.name} batch {job.batch_id}: moved {moved}, acks {len(acks)}; killed before foreachBatch"
            )
            self.jobs[self.jobs.index(job)] = self.new_job(job.name, job.batch_id)
            return None
        return lambda: self._record(job, rows, moved, acks)

    def _record(self, job: Job, rows: list[tuple[Any, ...]], moved: list[Any], acks: list[Any]) -> None:
        """The syphon job's foreachBatch: its micro-batch's rows into the events table."""
        aggregated: dict[tuple[Any, ...], list[Any]] = {}
        for queue, _dl, entity, kind, count, message_id, detail in rows:
            key = (queue, entity, kind, message_id if kind == ACKNOWLEDGED else None)
            slot = aggregated.setdefault(key, [0, None])
            slot[0] += count
            slot[1] = slot[1] if slot[1] is not None else detail
        flat = [(q, e, k, int(n), m or d) for (q, e, k, m), (n, d) in aggregated.items()]
        self.recorded[MOVED] += len(moved)
        self.recorded[ACKNOWLEDGED] += len(acks)
        at = self.clock.now() + timedelta(seconds=self.params.driver_skew)
        job.writer.record(job.batch_id, flat, self.store, now=at)
        self.note(f"{job.name} batch {job.batch_id}: moved {moved}, acks {len(acks)}")
        job.batch_id += 1

    # ------------------------------------------------------------------------------------------ the schedule
    def outage(self) -> None:
        kind = self.rng.choice(
            ("ns-refuse", "ns-stall", "entity-refuse", "entity-stall", "queue", "queue-lane")
        )
        entity = self.rng.choice(ENTITIES)
        queue = self.rng.choice(self.names)
        rule: Any = None
        skip = self.rng.choice((0, 0, 1, 2, 4))  # it may start in the middle of the next send call
        if kind == "ns-refuse":
            rule = self.transport.fail(_refused, namespace=PRIMARY, skip=skip)
        elif kind == "ns-stall":
            rule = self.transport.stall(namespace=PRIMARY)
            rule.skip = skip
        elif kind == "entity-refuse":
            rule = self.transport.fail(_refused, namespace=PRIMARY, entity=entity, skip=skip)
        elif kind == "entity-stall":
            rule = self.transport.stall(namespace=PRIMARY, entity=entity)
            rule.skip = skip
        elif kind == "queue":
            rule = self.transport.fail(
                _refused, namespace=SECONDARY, entity=queue, count=self.rng.randint(1, 3)
            )
        else:
            self.lane_down.add(queue)
        what = kind + (
            f" {entity}" if kind.startswith("entity") else f" {queue[-1]}" if kind.startswith("queue") else ""
        )
        self.outages.append((what, rule, queue if kind == "queue-lane" else ""))
        self.note(f"outage starts: {what}")

    def heal(self, all_: bool = False) -> None:
        while self.outages:
            what, rule, lane = self.outages.pop(self.rng.randrange(len(self.outages)))
            if rule is not None:
                # by identity: two outages of one kind are equal rules, and FakeTransport.heal removes the first
                # equal one - once a rule's skip had changed, its twin was left in force for ever (seed 2703)
                self.transport.rules = [r for r in self.transport.rules if r is not rule]
            self.lane_down.discard(lane)
            self.note(f"outage ends: {what}")
            if not all_:
                return

    def step(self) -> None:
        self.step_no += 1
        roll = self.rng.random()
        if roll < 0.33:
            self.sink_batch()
        elif roll < 0.56:  # the syphon job: one micro-batch, or a few at a 10 s trigger
            job = self.rng.choice(self.jobs)
            for n in range(self.rng.choice((1, 1, 3, 5))):
                if n:
                    self.clock.advance(10.0)
                self.job_batch(job)
        elif roll < 0.62:
            seconds = self.rng.choice((1.0, 5.0, 20.0, 40.0, 70.0))
            self.clock.advance(seconds)
            self.note(f"clock +{seconds:.0f} s")
        elif roll < 0.74:
            self.outage()
        elif roll < 0.82:
            self.heal()
        elif roll < 0.85:
            self.sink = self.new_driver()
            self.note("sink driver restarts (held lines from the sessions table)")
        elif roll < 0.88:
            self.kill_worker()
        elif roll < 0.91:
            n = self.rng.randrange(len(self.jobs))
            fresh = self.rng.random() < 0.5
            self.jobs[n] = self.new_job(self.jobs[n].name, 0 if fresh else self.jobs[n].batch_id)
            self.note(
                f"{self.jobs[n].name} restarts {'on a fresh checkpoint' if fresh else 'on its checkpoint'}"
            )
        elif roll < 0.93:
            if len(self.jobs) < 2:
                self.jobs.append(self.new_job("job-2"))
                self.note("a second syphon job starts (its own checkpoint)")
        elif roll < 0.96:
            self.job_batch(self.rng.choice(self.jobs), kill=True)
        else:
            self.clock.advance(self.rng.uniform(0.0, 3.0))

    def tail(self) -> None:
        """The quiet, healthy end: every outage over, no faults; the syphon jobs and the sink go on (batches without
        rows) until every held line is back - within O3's bound (drain time and a ping interval per round; a
        line whose acknowledgement a killed run lost waits for REMARK_AFTER's fresh marker)."""
        self.heal(all_=True)
        self.quiet = True
        self.note("quiet tail")
        self.clock.advance(70.0)  # the locks of killed workers ran out
        for round_ in range(14):
            if round_ == 6:
                self.clock.advance(600.0)  # REMARK_AFTER: idle held lines get a fresh marker
            for job in list(self.jobs):
                self.job_batch(job)
            self.sink_batch(empty=self.pending is None)
            if self.settled():
                return
            self.clock.advance(31.0)

    def busy_tail(self, rounds: int = 8) -> None:
        """Every ``BUSY_EVERY``-th schedule (all with SIM_BUSY_TAIL=1): before the quiet tail, every outage over, the sink keeps sending every
        session while the syphon job runs, each sink batch starting while the job's batch is still committing (O3
        under traffic: a held line must come back although its sender never pauses). A line held through every
        of the last ``rounds`` (after a warm-up that outlasts a restarted job's lock wait) is a violation."""
        self.heal(all_=True)
        self.quiet = True
        self.note("busy tail")
        self.clock.advance(70.0)
        self.sink_batch()  # the entities come back (their probes)
        warm = self.clock.monotonic() + 80.0  # a restarted ordered job's first drain waits out a lock (65 s)
        while self.clock.monotonic() < warm:
            self.busy_round()
        held = {(h.entity, h.session) for h in self.held()}
        for _ in range(rounds):
            self.busy_round()
            held &= {(h.entity, h.session) for h in self.held()}
        if held:
            self.violations.append(
                Violation(
                    "O3-busy", f"held through {rounds} busy rounds with the primary healthy: {sorted(held)}"
                )
            )

    def busy_round(self) -> None:
        """Each syphon job's micro-batch with a sink batch (rows of every kind) starting while it commits."""
        for job in list(self.jobs):
            self.job_batch(job, meanwhile=self.sink_batch)
        self.clock.advance(2.0)

    def settled(self) -> bool:
        return (
            self.pending is None
            and not self.held()
            and all(len(q) == 0 and q.dlq is not None and len(q.dlq) == 0 for q in self.queues.values())
            and all(len(self.received(s, [])) == len(self.produced[s]) for s in self.produced)
        )

    # ------------------------------------------------------------------------------------------ the checks
    def received(self, session: str, violations: list[Violation]) -> list[str]:
        """What a session receiver on the primary gets of ``session``: arrival order, duplicates within the window
        dropped (a duplicate past the window is delivered again: a violation of its own)."""
        entity = entity_of(session)
        seen: dict[str, float] = {}
        out = []
        for at, mid, s in self.primary[entity]:
            if s != session:
                continue
            first = seen.get(mid)
            if first is not None and at - first <= DUP_WINDOW:
                continue
            if first is not None:
                violations.append(Violation("duplicates", f"{mid} delivered again after the window"))
            seen[mid] = at
            out.append(mid)
        return out

    def check(self) -> list[Violation]:
        v = list(self.violations)
        got_by = {s: self.received(s, v) for s in self.produced}
        for s, produced in self.produced.items():
            got = got_by[s]
            place = {mid: i for i, mid in enumerate(produced)}
            positions = [place[m] for m in got]
            if positions != sorted(positions):
                late = [m for i, m in enumerate(got) if any(place[o] > place[m] for o in got[:i])]
                # a message that came late through a dead-letter queue (MaxDeliveryCountExceeded): O7's break
                prop = "O1-dlq" if set(late) <= self.dead_lettered else "O1"
                v.append(Violation(prop, f"session {s}: sink order {produced}, primary received {got}"))
            missing = [m for m in produced if m not in set(got)]
            if missing:
                where = {m: self.where(m) for m in missing}
                prop = "liveness-dlq" if all(w.startswith("DLQ") for w in where.values()) else "loss/liveness"
                v.append(Violation(prop, f"session {s}: not on the primary after the tail: {where}"))
        if self.held():
            v.append(
                Violation(
                    "O3",
                    f"held after the quiet tail: {[(h.entity, h.session) for h in self.held()]}",
                )
            )
        events = self.store.read_events()
        for kind in (MOVED, ACKNOWLEDGED):
            written = sum(e.count for e in events if e.event == kind and e.sink_id.startswith("syphon/"))
            if written != self.recorded[kind]:
                v.append(
                    Violation(
                        "O5",
                        f"{self.recorded[kind]} {kind} rows recorded by foreachBatch, {written} in the events table",
                    )
                )
        for q in self.queues.values():
            idle: dict[tuple[int, str], int] = {}
            tried: dict[tuple[int, str], int] = {}
            for d in q.deliveries:
                if d.idle:
                    idle[(d.seq, d.message_id)] = idle.get((d.seq, d.message_id), 0) + 1
                if d.abandoned and d.attempted:
                    tried[(d.seq, d.message_id)] = tried.get((d.seq, d.message_id), 0) + 1
            worst = max(idle.items(), key=lambda kv: kv[1], default=None)
            if worst is not None and worst[1] > MAX_IDLE_DELIVERIES:
                v.append(
                    Violation(
                        "O7",
                        f"{q.name}: {worst[0][1]} delivery count raised {worst[1]} times while held back, by no attempt to move it",
                    )
                )
            worst = max(tried.items(), key=lambda kv: kv[1], default=None)
            if worst is not None and worst[1] > MAX_ABANDONED_ATTEMPTS:
                v.append(
                    Violation(
                        "O7",
                        f"{q.name}: {worst[0][1]} abandoned after {worst[1]} failed attempts "
                        "(its delivery count follows the outage)",
                    )
                )
        return v

    def where(self, mid: str) -> str:
        for q in self.queues.values():
            for sub in (q, q.dlq):
                assert sub is not None
                for e in sub.entries.values():
                    if e.out.message_id == mid:
                        return f"{'DLQ ' if sub.dead_letter else ''}{q.name[-1]}:{e.state}"
        return "nowhere"

    def run(self) -> list[Violation]:
        self.note(
            f"seed {self.seed} ({'data source' if self.datasource else 'foreachBatch'} sink): {self.params}"
        )
        random.seed(self.seed)  # what the code under test draws from the module's stream (back-off jitter)
        try:
            for _ in range(self.params.steps):
                self.step()
            if BUSY_TAIL or self.seed % BUSY_EVERY == BUSY_EVERY - 1:
                self.busy_tail()
            self.tail()
            return self.check()
        finally:
            self.bury()

    def bury(self) -> None:
        """Close the killed workers' drains now, in a worker of their own. Left to the garbage collector, a drain's
        ``finally`` ran in whatever came next - another schedule's worker, its pool, its queues - at any allocation:
        once inside that pool's ``acquire``, whose lock it then waited for for ever (a run of seeds 0-5999 hung so)."""
        self.quiet = True
        with self.worker(Worker(self, -1)):
            while self.zombies:
                self.zombies.pop().close()


def entity_of(session: str) -> str:
    """A session's entity: s0, s1 orders, s2, s3 invoices (a partition, by session id parity, holds both)."""
    return ENTITIES[int(session[1:]) // 2 % 2]


def _refused() -> BaseException:
    return sbe.ServiceBusConnectionError(message="connection refused")
