"""The world of one simulated schedule of the ``servicebus`` source (SOURCE.md §4's crash windows, §13 A1): the real
planner, settle step and reader over the fake entity of tests/unit/source/fakes.py, on one fake clock, driven by a
simulated Spark micro-batch loop.

* **Spark.** An offset log (WAL), a commit log and an idempotent sink keyed by batch id (as Delta's), all durable
  across driver kills. The loop is MicroBatchExecution's: ``latestOffset(start)`` -> WAL -> ``commit(previous)`` ->
  ``partitions`` (sometimes twice) -> tasks (up to 4 attempts) -> sink -> commit log. A restart replays from the
  logs: an uncommitted batch is planned again from the WAL (``partitions(start, end)``); on the 4.0/4.1 path
  ``latestOffset()`` has no start and a restart calls ``partitions(o, o)``.
* **Kills.** The driver dies (:class:`Killed`, a BaseException the code under test cannot catch) at every point of
  §13 A1: mid-receive, after ``latestOffset`` before the WAL, after the WAL before the defer, mid-read, after the
  sink commit before the commit log, after the commit log before settle - and mid-settle. A restart comes after a
  random delay (shorter or longer than a lock).
* **Faults.** Any link call may fail before it acts or lose its reply after (lost settle replies among them); an
  executor's peek may fail its task (retried); the lock keeper may starve through a slow WAL; batches may run
  for several lock durations.
* **Checks** after a final drain without faults: every produced message in the sink exactly once; the entity
  empty (0 active, 0 deferred, 0 dead-lettered); a message delivered at most once plus once per fault window it
  was locked in (a kill, a starved keeper, a failed lock call, any stalled call: the keeper waits for the planner
  meanwhile) - A1's "max delivery count <= 2 per kill window". A message that met MaxDeliveryCount - 1 such windows
  is dead-lettered by the service: that is allowed (it is in the dead-letter queue, and noted), nothing else is.

Test code: one thread, not picklable. Bounded by the schedule (<= 60 messages, <= MAX_TRIGGERS triggers).
"""

from __future__ import annotations

import logging
import random
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from servicebus_local.clock import FakeClock
from spark_sb.source.batch import PlannerLimits
from spark_sb.source.manifest import PartitionSpec
from spark_sb.source.planner import SourcePlanner
from spark_sb.source.reader import DataLossError, read_partition
from tests.unit.source.fakes import FakeEntity, FakeLink

ENTITY = "orders"
TASK_ATTEMPTS = 4
MAX_KILLS = 3
MAX_TRIGGERS = 400
#: Calls whose fault can leave a message locked until its lock lapses (a redelivery window).
LOCK_OPS = {"receive", "renew", "defer", "complete"}


class Killed(BaseException):
    """The driver process dies here (SIGKILL): nothing of the code under test sees it."""


class RunEnded(Exception):
    """An AvailableNow run ended (its latestOffset returned its start): the user starts the next run."""


class TaskFailed(Exception):
    """An executor's Python worker died mid-read: Spark retries the task."""


@dataclass(frozen=True)
class Violation:
    prop: str
    detail: str

    def __str__(self) -> str:
        return f"{self.prop}: {self.detail}"


@dataclass
class Params:
    """What a schedule's seed draws besides its steps."""

    messages: int
    lock: float
    limits: PlannerLimits
    spark40: bool
    kill_rate: float
    chaos: float
    max_rows: int | None
    available_now: bool
    lose_checkpoint: bool
    factory: bool  # the planner gets a link factory (a fault drops the link and a new one opens)
    defer_later: (
        bool  # partitions() leaves the defer to run_defer (production's defer thread): run at any point
    )
    read_ahead: (
        bool  # the next batch is received while this one is read (production's defer thread after the defer)
    )


def draw(rng: random.Random) -> Params:
    lock = rng.choice([5.0, 10.0, 30.0])
    lose = rng.random() < 0.1
    limits = PlannerLimits(
        max_messages=rng.randint(1, 12),
        receive_batch=rng.randint(1, 5),
        min_messages=rng.choice([0, 0, 0, 3]),
        max_trigger_delay=rng.choice([5.0, 20.0]),
        max_receive_time=rng.choice([2.0, 10.0]),
        receive_wait=1.0,
        min_partitions=rng.choice([None, 1, 3]),
        max_per_partition=rng.randint(1, 8),
        max_offset_ranges=rng.choice([2, 10_000]),
        call_timeout=2.0,
        settle_timeout=20.0,
        recover_deferred=lose,
        defer_after=rng.choice(
            [0.0, 1.0, 5.0, 60.0]
        ),  # with defer_later: the keeper defers, or commit completes
    )
    return Params(
        messages=rng.randint(10, 40),
        lock=lock,
        limits=limits,
        spark40=rng.random() < 0.3,
        kill_rate=rng.choice([0.02, 0.05, 0.1]),
        chaos=rng.choice([0.0, 0.03, 0.08]),
        max_rows=rng.choice([None, None, 5]),
        available_now=rng.random() < 0.2,
        lose_checkpoint=lose,
        factory=rng.random() < 0.5,
        defer_later=rng.random() < 0.5,
        read_ahead=rng.random() < 0.5,
    )


class SourceWorld:
    """One schedule. ``run()`` returns the violations; ``trace`` holds the last steps."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.p = draw(self.rng)
        self.clock = FakeClock()
        self.entity = FakeEntity(self.clock, ENTITY, lock_duration=self.p.lock, hook=self._hook)
        self.peeker = self.entity.peeker()
        self.trace: deque[str] = deque(maxlen=40)
        # Spark's durable state: the offset log, the commit log, the sink (rows by batch id)
        self.offsets: dict[int, dict[str, Any]] = {}
        self.commits: set[int] = set()
        self.sink: dict[int, list[str]] = {}
        self.produced: list[str] = []
        # A7: the rows of a checkpoint since deleted, and the messages on the entity then (at-least-once for those)
        self.lost_rows: list[str] = []
        self.at_least_once: set[str] = set()
        self.allowance: Counter[int] = Counter()  # redelivery windows a message was locked in
        self.kills = 0
        self.incarnation = 0
        self.faulty = True  # off in the final drain
        self.planner: SourcePlanner | None = None
        self.initial: dict[str, Any] | None = None
        self.violations: list[Violation] = []
        self.triggers = 0

    # -- faults --------------------------------------------------------------------------------------------------
    def note(self, text: str) -> None:
        self.trace.append(f"  t={self.clock.monotonic() - 1000:7.1f} d{self.incarnation} {text}")

    def _window(self) -> None:
        for seq in self.entity.locked():
            self.allowance[seq] += 1

    def kill(self, point: str) -> None:
        if self.faulty and self.kills < MAX_KILLS and self.rng.random() < self.p.kill_rate:
            self.kills += 1
            self.note(f"KILL {point}")
            self._window()
            raise Killed(point)

    def _hook(self, op: str, phase: str, link: FakeLink | None) -> None:
        if not self.faulty:
            return
        if op == "read":
            if phase == "before" and self.rng.random() < self.p.chaos:
                raise TaskFailed("executor lost")
            if phase == "after":
                self.kill("mid-read")
            return
        if op == "receive" and phase == "after":
            self.kill("mid-receive")
        if op in ("delete", "complete"):
            self.kill(f"mid-settle ({op} {phase})")
        if op == "defer" and phase == "before":
            self.kill("after the WAL, before the defer")
        if self.rng.random() < self.p.chaos:
            kind = self.rng.choice(["fail", "stall"])
            self.note(f"fault {op} {phase} {kind}")
            if op in LOCK_OPS or kind == "stall":
                self._window()  # a failed lock call, or a stall: the keeper waits for the planner meanwhile
            if kind == "stall":
                self.clock.advance(self.p.limits.call_timeout)
            raise TimeoutError(f"{op} {phase}") if kind == "stall" else ConnectionError(f"{op} {phase}")

    # -- time ----------------------------------------------------------------------------------------------------
    def elapse(self, seconds: float, starve: bool = False) -> None:
        """Time passes with the planner's keeper thread ticking every quarter lock (unless it starves)."""
        if starve and self.faulty:
            self.note(f"keeper starved {seconds:.1f}s")
            self._window()
            self.clock.advance(seconds)
            return
        step = self.p.lock / 4
        while seconds > 0:
            self.clock.advance(min(step, seconds))
            seconds -= step
            if self.planner is not None:
                self.planner.keep_locks()

    def produce(self, most: int) -> None:
        for _ in range(self.rng.randint(0, most)):
            if len(self.produced) < self.p.messages:
                mid = f"id-{len(self.produced)}"
                self.entity.send(mid, message_id=mid)
                self.produced.append(mid)

    # -- Spark ---------------------------------------------------------------------------------------------------
    def start_of(self, batch: int) -> dict[str, Any]:
        if batch == 0:
            if self.initial is None:
                assert self.planner is not None
                self.initial = self.planner.initial_offset()
            return self.initial
        return self.offsets[batch - 1]

    def driver(self) -> None:
        """One driver process: restart from the logs, then triggers until the drain is done."""
        self.incarnation += 1
        self.initial = None
        tag = self.incarnation
        link: Any = (lambda: self.entity.link(tag=tag)) if self.p.factory else self.entity.link(tag=tag)
        self.planner = p = SourcePlanner(
            ENTITY,
            link,
            self.clock,
            self.p.limits,
            max_delivery_count=10,
            defer_later=self.p.defer_later,
            read_ahead=self.p.read_ahead,
        )
        if self.offsets:
            last = max(self.offsets)
            if self.p.spark40:
                p.partitions(self.offsets[last], self.offsets[last])  # setLatestSeenOffset
            if last not in self.commits:
                self.note(f"replay batch {last}")
                self.run_batch(last)
        if self.p.available_now:
            watermark = p.prepare_available_now()
            self.note(f"AvailableNow run up to {watermark}")
            # A6: each trigger but the last emits a message at or below W (each at most once a run), or ends it
            budget = sum(1 for seq in self.entity.messages if seq <= watermark) + 2
        run_start = self.triggers
        idle = 0
        while self.triggers < MAX_TRIGGERS:
            self.triggers += 1
            self.produce(3 if self.faulty else 0)
            last = max(self.offsets) if self.offsets else -1
            start = self.offsets[last] if last >= 0 else self.start_of(0)
            # Spark's admission limit for this trigger (a composite ReadLimit's can change from one to the next)
            max_rows = self.rng.randint(1, self.p.max_rows) if self.p.max_rows else None
            end = p.latest_offset(None if self.p.spark40 else start, max_rows)
            self.kill("after latestOffset, before the WAL")
            if end == start and self.p.available_now:
                self.note(f"AvailableNow run ended after {self.triggers - run_start} triggers")
                took = self.triggers - run_start
                if took > budget:
                    self.violations.append(
                        Violation("available-now", f"a run took {took} triggers, over {budget}")
                    )
                if not self.faulty and not self.entity.messages:
                    return
                self._window()  # a carried lock (the range cut) lapses with the run's planner
                p.stop()
                self.elapse(self.p.lock + 1 if not self.faulty else 1.0)
                if self.faulty and len(self.produced) >= self.p.messages:
                    self.faulty = False
                    self.note("drain")
                raise RunEnded()
            if end == start:
                idle += 1
                if self.faulty and len(self.produced) >= self.p.messages and idle >= 3:
                    self.faulty = False
                    self.note("drain")
                if not self.faulty and idle >= 2 and not self.entity.messages:
                    return
                self.elapse(self.rng.choice([0.5, 2.0]) if self.faulty else self.p.lock + 1)
                continue
            idle = 0
            batch = last + 1
            self.note(f"latest b={end['b']} m={end['m']} owed={end['owed']}")
            limit = min(self.p.limits.max_messages, max_rows or self.p.limits.max_messages)
            if (
                not self.p.lose_checkpoint and end["n"] > limit
            ):  # recoverDeferred's adopted numbers come on top
                self.violations.append(
                    Violation("admission", f"batch {batch} holds {end['n']} messages, over {limit}")
                )
            slow = self.rng.choice([0.0, 0.1, 0.7, 2.5]) * self.p.lock
            self.elapse(slow, starve=self.rng.random() < self.p.chaos)  # the WAL write
            self.offsets[batch] = end
            self.note(f"WAL {batch}")
            self.kill("after the WAL, before the defer")
            if batch > 0:
                p.commit(self.offsets[batch - 1])
                if self.rng.random() < 0.2:
                    self.read_ahead()  # the defer thread, late: after the commit
            self.run_batch(batch)

    def run_batch(self, batch: int) -> None:
        assert self.planner is not None
        start, end = self.start_of(batch), self.offsets[batch]
        specs = self.planner.partitions(start, end)
        if self.rng.random() < 0.2:
            again = self.planner.partitions(start, end)
            if again != specs:
                self.violations.append(Violation("pure", f"partitions of batch {batch} changed: {again}"))
        # defer_later: the defer thread runs before a task, after them all, after a long batch, or never (the next
        # commit or latestOffset runs it)
        # read-ahead: the defer thread receives after the defer, at any point of the batch (before its defer it
        # does nothing), or not before the next call
        defer_at = self.rng.randint(0, len(specs) + 2)
        ahead_at = self.rng.randint(0, len(specs) + 2)
        rows: list[str] = []
        for i, spec in enumerate(specs):
            if i == defer_at:
                self.planner.run_defer()
            if i == ahead_at:
                self.read_ahead()
            rows += self.task(spec)
        if defer_at == len(specs):
            self.planner.run_defer()
        if ahead_at == len(specs):
            self.read_ahead()
        self.elapse(
            self.rng.choice([0.0, 1.0, 3.0 * self.p.lock])
        )  # a long batch: deferred messages hold no lock (nor, till their defer, renewed ones)
        if defer_at == len(specs) + 1:
            self.planner.run_defer()
        if ahead_at == len(specs) + 1:
            self.read_ahead()
        if batch not in self.sink:  # Delta's idempotence by batch id
            self.sink[batch] = rows
        self.note(f"sink {batch}: {len(rows)} rows")
        self.kill("after the sink commit, before the commit log")
        self.commits.add(batch)
        self.kill("after the commit log, before settle")

    def read_ahead(self) -> None:
        assert self.planner is not None
        if self.faulty:
            self.produce(2)  # sent while the batch runs
        got = self.planner.read_ahead()
        if got:
            self.note(f"read ahead {got}")
        if got and not self.p.read_ahead:
            self.violations.append(Violation("read-ahead", f"a planner without read_ahead received {got}"))

    def task(self, spec: PartitionSpec) -> list[str]:
        for attempt in range(TASK_ATTEMPTS):
            try:
                return [p.message.message_id for p in read_partition(spec, self.peeker, timeout=2.0)]
            except TaskFailed:
                self.note(f"task {spec.ranges} attempt {attempt} failed")
        raise TaskFailed(f"task {spec.ranges} failed {TASK_ATTEMPTS} times")

    # -- the schedule --------------------------------------------------------------------------------------------
    def run(self) -> list[Violation]:
        logging.disable(logging.CRITICAL)
        try:
            while self.triggers < MAX_TRIGGERS:
                try:
                    self.driver()
                    break
                except Killed:
                    self.planner = None
                    if self.p.lose_checkpoint and not self.lost_rows and self.rng.random() < 0.5:
                        self.lose_checkpoint()
                    self.clock.advance(self.rng.choice([1.0, self.p.lock / 2, self.p.lock * 1.5]))
                except DataLossError as exc:
                    self.violations.append(Violation("loss", f"the query failed: {exc}"))
                    return self.violations
                except RunEnded:
                    self.planner = None
                except TaskFailed as exc:  # four attempts failed: the query stops; the user restarts it
                    self.note(f"query stopped: {exc}")
                    self._window()  # its carried locks lapse
        finally:
            logging.disable(logging.NOTSET)
        return self.check()

    def lose_checkpoint(self) -> None:
        """The user deletes the checkpoint (SOURCE.md §6, A7): the next driver starts from ``initialOffset``, with
        ``recoverDeferred``; a new query id, so the sink's batch ids start again."""
        self.note("CHECKPOINT LOST")
        self.lost_rows = [mid for rows in self.sink.values() for mid in rows] or ["-"]
        self.at_least_once = {m.message_id for m in self.entity.messages.values()}
        for seq in self.entity.messages:
            self.allowance[seq] += 1
        self.offsets.clear()
        self.commits.clear()
        self.sink.clear()

    def check(self) -> list[Violation]:
        v = self.violations
        if self.triggers >= MAX_TRIGGERS:
            v.append(Violation("liveness", f"not drained after {MAX_TRIGGERS} triggers"))
        got = Counter(mid for rows in self.sink.values() for mid in rows)
        got.update(m for m in self.lost_rows if m != "-")
        # the service dead-letters a message delivered MaxDeliveryCount times: allowed (not lost: it is in the DLQ)
        # only when every delivery but one came in a fault window
        most = self.entity.max_delivery_count
        dead = {m.message_id for m in self.entity.dead_letters if self.allowance[m.seq] >= most - 1}
        if dead:
            self.note(f"dead-lettered through {most} fault windows: {sorted(dead)}")
        lost = [m for m in self.produced if m not in got and m not in dead]
        dup = sorted(m for m, c in got.items() if c > 1 and m not in self.at_least_once)
        if lost:
            v.append(Violation("lost", f"{len(lost)} messages never in the sink: {lost[:8]}"))
        if dup:
            v.append(Violation("duplicate", f"{len(dup)} messages in the sink twice or more: {dup[:8]}"))
        states = self.entity.states()
        states["dead_lettered"] -= len(dead)
        left = {k: c for k, c in states.items() if c}
        if left:
            v.append(Violation("entity", f"the entity is not empty after the drain: {left}"))
        deliveries = Counter(seq for seq, _ in self.entity.deliveries)
        over = {s: c for s, c in deliveries.items() if c > 1 + self.allowance[s]}
        if over:
            s = min(over)
            v.append(
                Violation(
                    "delivery",
                    f"{len(over)} messages delivered more often than their fault windows allow, e.g. seq {s}: "
                    f"{over[s]} deliveries, {self.allowance[s]} windows",
                )
            )
        return v

    def summary(self) -> str:
        return (
            f"{self.p.messages} messages, lock {self.p.lock}s, {self.kills} kills, chaos {self.p.chaos}, "
            f"spark40={self.p.spark40}, available_now={self.p.available_now}, lost={bool(self.lost_rows)}, {len(self.offsets)} batches, {self.triggers} triggers, {self.p.limits}"
        )
