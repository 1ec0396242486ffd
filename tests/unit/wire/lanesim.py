"""A deterministic simulation of :mod:`spark_sb.wire.lane` (SPEC F10; issue 47, "the lane gets the same at its own
level"): the REAL lane code, run on a fake clock under a seeded scheduler, through random schedules of direct,
started and submitted calls with deadlines, work that stalls, openings that stall, connections that die, resets
and abandonments - checked against the lane's promises after every schedule.

How it is deterministic: the lane's source is executed as a fresh module whose ``threading``, ``queue``, ``time``
and ``os`` are this module's stand-ins (:func:`load_lane`; nothing in ``spark_sb`` changes for it). Each simulated
thread is a real thread, but only one runs at a time: it holds the baton, and every lock, event, queue and clock
operation is a point where the seeded scheduler may hand the baton to another runnable thread. Fake time moves only
when every thread waits, to the earliest timed wake-up. Same seed, same schedule, same trace.

Runs in the test process only (tests/unit/wire/test_lane_simulation.py); nothing here is picklable.
"""

from __future__ import annotations

import builtins
import collections
import logging
import math
import queue as real_queue
import random
import threading as real_threading
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import spark_sb.wire.lane as lane_module
import spark_sb.wire.watchdog as watchdog_module
from spark_sb.core.errors import CLIENT_CLOSED, LaneClosed, classify

#: A call ends by its deadline plus this (fake seconds; the lane's waits end exactly at deadlines in fake time).
SLACK = 1e-6
#: Most schedules' times are multiples of this (an exact binary fraction): see :meth:`World.ticks`.
TICK = 1 / 64
#: A schedule's fake time may not pass this: a caller still waiting then is stuck (a violation).
HORIZON = 600.0
#: Scheduling steps a schedule may take (a guard against a loop that never waits).
MAX_STEPS = 400_000
#: Real seconds a schedule may take before it counts as hung (a stand-in blocking for real: a bug here).
REAL_TIMEOUT = 60.0


class SimExit(BaseException):
    """Raised in a simulated thread that the schedule's end kills (it unwinds and its real thread ends)."""


class OwnFault(ConnectionError):
    """A call's own connection failed (what the namespace did to this call): evidence the call may report."""


class Shut(ConnectionResetError):
    """A call's socket was shut down under it; ``by`` says who: ``network`` (its own connection died) or
    ``abandoned`` (a lane's worker was abandoned - by this call's caller or another)."""

    def __init__(self, gen: int, by: str) -> None:
        super().__init__(f"socket of context {gen} shut down ({by})")
        self.by = by


# ------------------------------------------------------------------------------------------------- the runtime


class Task:
    __slots__ = ("done", "exited", "fn", "go", "killed", "name", "pred", "state", "timed_out", "wake_at")

    def __init__(self, name: str, fn: Callable[[], None]) -> None:
        self.name = name
        self.fn = fn
        self.go = real_threading.Semaphore(0)  # the baton
        self.exited = real_threading.Event()
        self.state = "run"  # run | blocked
        self.pred: Callable[[], bool] | None = None
        self.wake_at: float | None = None
        self.timed_out = False
        self.done = False
        self.killed = False


class Runtime:
    """The scheduler and the stand-in modules the lane's source is given."""

    def __init__(self, seed: int, trace: Callable[[str], None]) -> None:
        self.rng = random.Random(seed)
        self.stay = self.rng.choice(
            [0.0, 0.5, 0.9]
        )  # how often the running thread keeps the baton at a point
        self.now = 1000.0
        self.tasks: list[Task] = []
        self.current: Task | None = None
        self.killing = False
        self.steps = 0
        self.ended = real_threading.Event()
        self.end_reason = ""
        self.crashes: list[str] = []
        self.trace = trace
        self.threading = _module("threading", self._threading_names())
        self.queue = _module("queue", {"SimpleQueue": self._queue_class(), "Empty": real_queue.Empty})
        self.time = _module("time", {"monotonic": self.monotonic, "time": self.monotonic})
        self.os = _module("os", {"register_at_fork": lambda **_: None})

    # -- the scheduler
    def spawn(self, fn: Callable[[], None], name: str) -> Task:
        task = Task(name, fn)
        self.tasks.append(task)
        real_threading.Thread(target=self._bootstrap, args=(task,), name=f"sim-{name}", daemon=True).start()
        return task

    def step(self) -> None:
        """A point where another runnable thread may take over."""
        if self.killing or self.current is None:
            return
        self._switch()

    def block(self, ready: Callable[[], bool], timeout: float | None) -> bool:
        """Wait until ``ready()`` (True) or ``timeout`` fake seconds passed (False)."""
        if ready():
            return True
        if self.killing:
            raise SimExit
        if timeout is not None and timeout <= 0:
            self.step()
            return ready()
        me = self.current
        assert me is not None
        me.state, me.pred = "blocked", ready
        me.wake_at = None if timeout is None else self.now + timeout
        self._switch()
        me.state, me.pred, me.wake_at = "run", None, None
        return ready()

    def monotonic(self) -> float:
        self.step()
        return self.now

    def sleep(self, seconds: float) -> None:
        self.block(lambda: False, seconds)

    def _ready(self) -> list[Task]:
        return [
            t for t in self.tasks if not t.done and (t.state == "run" or (t.pred is not None and t.pred()))
        ]

    def _pick(self) -> Task | None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            return self._end(f"more than {MAX_STEPS} steps at t={self.now:.3f} (a loop that never waits?)")
        ready = self._ready()
        if not ready:
            timed = [t for t in self.tasks if not t.done and t.state == "blocked" and t.wake_at is not None]
            if not timed:
                return self._end("deadlock: every thread waits with no deadline")
            self.now = max(self.now, min(t.wake_at for t in timed))  # type: ignore[type-var]
            if self.now - 1000.0 > HORIZON:
                return self._end(f"fake time passed {HORIZON} s")
            ready = [t for t in timed if t.wake_at is not None and t.wake_at <= self.now]
        me = self.current
        if me is not None and me in ready and self.rng.random() < self.stay:
            return me
        return self.rng.choice(ready)

    def _end(self, reason: str) -> None:
        self.end_reason = reason
        self.ended.set()
        return None

    def _switch(self) -> None:
        me = self.current
        nxt = self._pick()
        if nxt is me:
            return
        if nxt is not None:
            self.current = nxt
            nxt.go.release()
        assert me is not None
        me.go.acquire()
        if me.killed:
            raise SimExit

    def _bootstrap(self, task: Task) -> None:
        task.go.acquire()
        try:
            if not task.killed:
                task.fn()
        except SimExit:
            pass
        except BaseException as exc:
            if task.killed:  # what unwinding at the schedule's end broke on its way out: not the lane's doing
                return
            self.crashes.append(f"{task.name}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}")
        finally:
            task.done = True
            if self.killing:
                task.exited.set()
            elif task.name == "script":
                self._end(self.end_reason or "the script ended")
            else:
                nxt = self._pick()
                if nxt is not None:
                    self.current = nxt
                    nxt.go.release()
            task.exited.set()

    def run(self, script: Callable[[], None]) -> None:
        """Run ``script`` (and the threads it starts) until it ends; then end every thread still waiting."""
        first = self.spawn(script, "script")
        self.current = first
        first.go.release()
        if not self.ended.wait(REAL_TIMEOUT):
            self.end_reason = f"hung for {REAL_TIMEOUT} real seconds"
        self.killing = True
        while (
            True
        ):  # a killed thread may start another as it unwinds (an abandonment's unblocking): end it too
            alive = [t for t in self.tasks if not t.done and not t.killed]
            if not alive:
                break
            for task in alive:
                task.killed = True
                self.current = task
                task.go.release()
                task.exited.wait(5.0)

    # -- the stand-ins
    def _threading_names(self) -> dict[str, Any]:
        rt = self

        class Lock:
            def __init__(self) -> None:
                self.owner: Task | None = None
                self.held = False

            def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
                rt.step()
                if not self.held:
                    self.held = True
                    return True
                if not blocking:
                    return False
                if not rt.block(lambda: not self.held, None if timeout < 0 else timeout):
                    return False
                self.held = True
                return True

            def release(self) -> None:
                if not self.held:
                    raise RuntimeError("release unlocked lock")
                self.held = False
                rt.step()

            def locked(self) -> bool:
                return self.held

            def __enter__(self) -> bool:
                return self.acquire()

            def __exit__(self, *exc: object) -> None:
                self.release()

        class Event:
            def __init__(self) -> None:
                self.flag = False

            def is_set(self) -> bool:
                rt.step()
                return self.flag

            def set(self) -> None:
                self.flag = True
                rt.step()

            def clear(self) -> None:
                self.flag = False

            def wait(self, timeout: float | None = None) -> bool:
                rt.step()
                return rt.block(lambda: self.flag, timeout)

        class Condition:
            def __init__(self, lock: Lock | None = None) -> None:
                self.lock = lock if lock is not None else Lock()
                self.waiters: list[list[bool]] = []

            def __enter__(self) -> bool:
                return self.lock.acquire()

            def __exit__(self, *exc: object) -> None:
                self.lock.release()

            def wait(self, timeout: float | None = None) -> bool:
                token = [False]
                self.waiters.append(token)
                self.lock.release()
                try:
                    return rt.block(lambda: token[0], timeout)
                finally:
                    if token in self.waiters:
                        self.waiters.remove(token)
                    self.lock.acquire()

            def notify(self, n: int = 1) -> None:
                for token in self.waiters[:n]:
                    token[0] = True
                    self.waiters.remove(token)
                rt.step()

            def notify_all(self) -> None:
                self.notify(len(self.waiters))

        class Local:
            def __init__(self) -> None:
                object.__setattr__(self, "_values", {})

            def __getattr__(self, name: str) -> Any:
                values = object.__getattribute__(self, "_values").get(id(rt.current), {})
                if name in values:
                    return values[name]
                raise AttributeError(name)

            def __setattr__(self, name: str, value: Any) -> None:
                object.__getattribute__(self, "_values").setdefault(id(rt.current), {})[name] = value

        class Thread:
            _count = 0

            def __init__(
                self,
                group: None = None,
                target: Callable[..., Any] | None = None,
                name: str | None = None,
                args: tuple[Any, ...] = (),
                kwargs: dict[str, Any] | None = None,
                *,
                daemon: bool | None = None,
            ) -> None:
                Thread._count += 1
                self._target, self._args, self._kwargs = target, args, kwargs or {}
                self.name = name or f"Thread-{Thread._count}"
                self.daemon = daemon
                self._task: Task | None = None

            def start(self) -> None:
                self._task = rt.spawn(self.run, self.name)
                rt.step()

            def run(self) -> None:
                if self._target is not None:
                    self._target(*self._args, **self._kwargs)

            def is_alive(self) -> bool:
                return self._task is not None and not self._task.done

            def join(self, timeout: float | None = None) -> None:
                task = self._task
                if task is not None:
                    rt.block(lambda: task.done, timeout)

        return {
            "Lock": Lock,
            "Event": Event,
            "Condition": Condition,
            "local": Local,
            "Thread": Thread,
            "get_ident": lambda: id(rt.current),
        }

    def _queue_class(self) -> type:
        rt = self

        class SimpleQueue:
            def __init__(self) -> None:
                self.items: collections.deque[Any] = collections.deque()
                self.put_order: list[int] = []  # the simulated calls' ids, in the order they were queued
                self.last_got: Any = None  # the item the worker took last (the call it runs or waits to run)

            def put(self, item: Any) -> None:
                self.items.append(item)
                work = getattr(item, "fn", None)
                if isinstance(work, Work):
                    self.put_order.append(work.rec.id)
                rt.step()

            def get(self, block: bool = True, timeout: float | None = None) -> Any:
                rt.step()
                if not block:
                    return self.get_nowait()
                if not rt.block(lambda: bool(self.items), timeout):
                    raise real_queue.Empty
                self.last_got = self.items.popleft()
                return self.last_got

            def get_nowait(self) -> Any:
                if not self.items:
                    raise real_queue.Empty
                return self.items.popleft()

            def empty(self) -> bool:
                rt.step()
                return not self.items

        return SimpleQueue


def _module(name: str, names: dict[str, Any]) -> types.ModuleType:
    module = types.ModuleType(f"lanesim.{name}")
    module.__dict__.update(names)
    return module


_SOURCE = Path(lane_module.__file__).read_text()
_WATCHDOG_CODE = compile(Path(watchdog_module.__file__).read_text(), watchdog_module.__file__, "exec")
_CODE: dict[str, types.CodeType] = {}  # source -> compiled (the lane's, and a mutation run's variants)


def load_lane(rt: Runtime, source: str | None = None) -> types.ModuleType:
    """The lane's source (``source``: a variant of it, for mutation runs) executed as a new module whose
    ``threading``, ``queue``, ``time`` and ``os`` are ``rt``'s stand-ins, and so are the watchdog's it imports;
    everything else is the real thing."""
    fakes = {"threading": rt.threading, "queue": rt.queue, "time": rt.time, "os": rt.os}
    real_import = builtins.__import__

    def imports(
        name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
    ) -> Any:
        if level == 0 and name in fakes:
            return fakes[name]
        return real_import(name, globals, locals, fromlist, level)

    # the process's watchdog (spark_sb.wire.watchdog, which the lane imports) runs on the same stand-ins
    watchdog = types.ModuleType("lanesim_watchdog")
    watchdog.__dict__["__builtins__"] = {**vars(builtins), "__import__": imports}
    exec(_WATCHDOG_CODE, watchdog.__dict__)  # noqa: S102
    fakes["spark_sb.wire.watchdog"] = watchdog
    module = types.ModuleType("lanesim_lane")
    module.__dict__["__builtins__"] = {**vars(builtins), "__import__": imports}
    source = source or _SOURCE
    if source not in _CODE:
        _CODE[source] = compile(source, lane_module.__file__, "exec")
    exec(_CODE[source], module.__dict__)  # noqa: S102
    logging.getLogger("lanesim_lane").setLevel(logging.CRITICAL)
    return module


# ------------------------------------------------------------------------------------------------- the world


@dataclass
class Rec:
    """One call as its caller sees it."""

    id: int
    caller: str
    kind: str  # send (direct first, then the worker) | call | start | submit
    timeout: float
    work: float
    fault: bool
    began: float = math.nan
    asked: float = -math.inf  # when its caller asked for the result of a started call
    via: str = ""  # direct | worker
    entered: int = 0  # times its work started (at most once)
    entered_ctx: Ctx | None = None
    outcome: str = ""
    ended: float = math.nan

    @property
    def deadline(self) -> float:
        return self.began + self.timeout

    def __str__(self) -> str:
        return f"#{self.id}({self.kind} by {self.caller}, {self.timeout:g} s, work {self.work:g} s)"


@dataclass(eq=False)
class Ctx:
    """A context (a connection): ``shut`` is its socket shut down."""

    gen: int
    worker: Any
    shut: Any
    shut_by: str = ""
    closed: int = 0
    running: list[Rec] = field(default_factory=list)
    tending: bool = False


class Work:
    """A simulated call's function: it takes ``work`` fake seconds on its context, unless the context's socket is
    shut down meanwhile (it then fails at once, as the SDK does); a call with ``fault`` fails on its own."""

    def __init__(self, world: World, rec: Rec) -> None:
        self.world = world
        self.rec = rec

    def __call__(self, ctx: Ctx) -> int:
        world, rec = self.world, self.rec
        world.enter(rec, ctx)
        try:
            if ctx.shut.wait(rec.work):
                raise Shut(ctx.gen, ctx.shut_by)
            if ctx.shut_by:
                raise Shut(ctx.gen, ctx.shut_by)
            if rec.fault:
                raise OwnFault(f"{rec}: its own connection failed")
            return rec.id
        finally:
            world.leave(rec, ctx)


class World:
    """One schedule: the lane, its callers, and the checks (``violations``)."""

    def __init__(self, seed: int, source: str | None = None) -> None:
        self.seed = seed
        self.lines: list[str] = []
        self.rt = Runtime(seed, self.log)
        self.rng = random.Random(seed * 7919 + 1)
        self.mod = load_lane(self.rt, source)
        self.violations: list[str] = []
        self.recs: list[Rec] = []
        self.ctxs: list[Ctx] = []
        self.abandoned: dict[int, float] = {}  # worker id -> when abandoned
        self.entries: dict[int, list[int]] = {}  # worker id -> ids of worker calls in the order they started
        self.queues: dict[int, Any] = {}  # worker id -> its call queue
        rng = self.rng
        self.grid = rng.random() < 0.8
        took, stall = rng.choice([(0.0, 0.0), (0.01, 0.0), (0.05, 0.15), (0.05, 0.3)])
        self.opening = (self.ticks(took), stall)  # how long an opening takes; how often it stalls
        self.tend = rng.random() < 0.4
        self.lane = self.mod.Lane(
            "sim",
            self.factory,
            self.closer,
            self.unblock,
            idle=self.tend_ctx if self.tend else None,
            idle_every=rng.choice([0.05, 0.2, 0.5]),
        )
        abandon = self.lane._abandon

        def observed_abandon(worker: Any, why: str) -> None:
            self.on_abandon(worker, why)
            abandon(worker, why)

        self.lane._abandon = observed_abandon

    # -- trace and checks
    def log(self, line: str) -> None:
        who = self.rt.current.name if self.rt.current is not None else "-"
        self.lines.append(f"t={self.rt.now - 1000.0:8.3f} {who:>18}: {line}")

    def violate(self, what: str) -> None:
        self.log(f"VIOLATION {what}")
        self.violations.append(f"t={self.rt.now - 1000.0:.3f}: {what}")

    # -- the context's life
    def factory(self) -> Ctx:
        worker = self.mod._CURRENT.worker
        ctx = Ctx(len(self.ctxs) + 1, worker, self.rt.threading.Event())
        self.ctxs.append(ctx)
        self.queues[id(worker)] = worker.calls
        took, stall = self.opening
        took = 100.0 if self.rng.random() < stall else took
        self.log(f"opening context {ctx.gen} ({took:g} s)")

        def abort(error: BaseException) -> None:
            ctx.shut_by = ctx.shut_by or "abandoned"
            ctx.shut.set()

        with self.mod.abort_when_abandoned(abort):
            if took and ctx.shut.wait(took):
                raise Shut(ctx.gen, ctx.shut_by)
        return ctx

    def closer(self, ctx: Ctx) -> None:
        if ctx.running or ctx.tending:
            self.violate(f"context {ctx.gen} closed while {[str(r) for r in ctx.running]} use it")
        ctx.closed += 1
        if ctx.closed > 1:
            self.violate(f"context {ctx.gen} closed twice")
        self.log(f"context {ctx.gen} closed")

    def unblock(self, ctx: Ctx) -> None:
        ctx.shut_by = ctx.shut_by or "abandoned"
        self.log(f"context {ctx.gen}: socket shut down (abandoned)")
        ctx.shut.set()

    def tend_ctx(self, ctx: Ctx) -> None:
        if ctx.running:
            self.violate(f"context {ctx.gen} tended during {[str(r) for r in ctx.running]}")
        ctx.tending = True
        try:
            ctx.shut.wait(self.ticks(self.rng.choice([0.0, 0.01])))
        finally:
            ctx.tending = False

    def enter(self, rec: Rec, ctx: Ctx) -> None:
        rec.entered += 1
        rec.entered_ctx = ctx
        on_worker = self.rt.current is not None and self.rt.current.name.startswith("spark-sb-")
        self.log(f"{rec} starts on context {ctx.gen} ({'worker' if on_worker else 'calling thread'})")
        if rec.entered > 1:
            self.violate(f"{rec} ran twice")
        if rec.outcome in ("Withdrawn", "DeadlineExceeded", "LaneClosed"):
            self.violate(f"{rec} ran after its caller was told it {rec.outcome}")
        if ctx.closed:
            self.violate(f"{rec} ran on context {ctx.gen}, closed")
        if ctx.running or ctx.tending:
            self.violate(
                f"{rec} ran on context {ctx.gen} at the same time as {[str(r) for r in ctx.running]}"
            )
        if rec.kind != "submit" and id(ctx.worker) in self.abandoned:
            self.violate(f"{rec} started on context {ctx.gen} after its worker was abandoned")
        if on_worker:
            self.entries.setdefault(id(ctx.worker), []).append(rec.id)
        ctx.running.append(rec)

    def leave(self, rec: Rec, ctx: Ctx) -> None:
        ctx.running.remove(rec)

    def on_abandon(self, worker: Any, why: str) -> None:
        now = self.rt.now
        self.abandoned.setdefault(id(worker), now)
        using: list[Rec] = []
        got = worker.calls.last_got
        if got is not None and got.started and not got.done.flag and isinstance(got.fn, Work):
            using.append(got.fn.rec)
        ctx = worker.context
        if ctx is not None:
            using += [r for r in ctx.running if r not in using]
        self.log(f"worker {worker.generation} abandoned ({why}) while {[str(r) for r in using]} use it")
        for rec in using:
            if rec.kind != "submit" and rec.deadline > now + SLACK:
                self.violate(
                    f"worker {worker.generation} abandoned while {rec} of {rec.caller} uses it, "
                    f"{rec.deadline - now:.3f} s before that call's deadline"
                )

    # -- the callers
    def ticks(self, seconds: float) -> float:
        """``seconds`` on the schedule's grid (if it has one): times that are exact binary fractions make calls
        end and deadlines fall at the very same instant - where hand-offs race."""
        return round(seconds / TICK) * TICK if self.grid else round(seconds, 4)

    def new_rec(self, caller: str, kind: str) -> Rec:
        rng = self.rng
        timeout = self.ticks(rng.choice([0.15, 0.3, 0.4, 0.5, 1.0, 2.0]))
        work = rng.choice(
            [
                rng.uniform(0.0, 0.05),
                rng.uniform(0.0, 0.05),
                rng.uniform(0.05, 0.6),
                timeout * rng.uniform(0.8, 1.5),
                100.0,
            ]
        )
        rec = Rec(len(self.recs) + 1, caller, kind, timeout, self.ticks(work), rng.random() < 0.1)
        self.recs.append(rec)
        return rec

    def caller(self, name: str, ops: int) -> None:
        rng, lane = self.rng, self.lane
        for _ in range(ops):
            if rng.random() < 0.6:
                self.rt.sleep(self.ticks(rng.choice([0.0, 0.0, 0.01, 0.1, 0.3, 1.0])))
            kind = rng.choice(["send", "send", "send", "call", "start", "submit"])
            rec = self.new_rec(name, kind)
            rec.began = self.rt.now
            self.log(f"{rec} begins")
            generation: int | None = None
            try:
                if kind == "submit":
                    lane.submit(Work(self, rec))
                    rec.outcome = "submitted"
                    continue
                if (
                    kind == "send"
                ):  # as the transport sends: on this thread if the lane allows, else the worker
                    finished = lane.direct(Work(self, rec), rec.timeout)
                    if finished is not None:
                        rec.via = "direct"
                        generation = finished.generation
                        finished.result()
                    else:
                        left = rec.deadline - self.rt.now
                        pending = lane.start(Work(self, rec), left)
                        rec.via, generation = "worker", pending.generation
                        pending.result()
                elif kind == "call":
                    rec.via = "worker"
                    lane.call(Work(self, rec), rec.timeout)
                else:
                    pending = lane.start(Work(self, rec), rec.timeout)
                    rec.via, generation = "worker", pending.generation
                    # other work meanwhile (packing the next batch), past the deadline at times
                    self.rt.sleep(self.ticks(rng.choice([0.0, 0.05, rec.timeout / 2, rec.timeout * 1.2])))
                    rec.asked = self.rt.now
                    pending.result()
                rec.outcome = "ok"
            except Exception as exc:
                rec.outcome = type(exc).__name__
                self.judge(rec, exc)
                if isinstance(exc, (OwnFault, Shut)) and rng.random() < 0.7:
                    self.log(f"{name} resets worker {generation} (faulted)")
                    lane.reset("faulted", generation)
            finally:
                rec.ended = self.rt.now
                self.log(f"{rec} ends: {rec.outcome}")
                # by its deadline, or at once if its caller asked for the result only after it
                if kind != "submit" and rec.ended > max(rec.deadline, rec.asked) + SLACK:
                    self.violate(f"{rec} ended {rec.ended - rec.deadline:.3f} s past its deadline")

    def judge(self, rec: Rec, exc: Exception) -> None:
        """Is the error one its caller may get? Its own fault, its own deadline, or nothing that is evidence."""
        now = self.rt.now
        if isinstance(exc, OwnFault):
            return
        if isinstance(exc, self.mod.Withdrawn):
            if now < rec.deadline - SLACK:
                self.violate(f"{rec} withdrawn {rec.deadline - now:.3f} s before its deadline")
            if rec.entered:
                self.violate(f"{rec} withdrawn, yet it ran")
            return
        if isinstance(exc, self.mod.DeadlineExceeded):
            if now < rec.deadline - SLACK:
                self.violate(f"{rec} timed out {rec.deadline - now:.3f} s before its deadline")
            return
        if isinstance(exc, LaneClosed) and classify(exc) is CLIENT_CLOSED:
            return  # cut short by another's reset or abandonment: evidence of nothing (F7)
        if isinstance(exc, Shut) and exc.by == "network":
            return  # its own connection died
        self.violate(
            f"{rec} cut short with {type(exc).__name__}: {exc} ({classify(exc).name}-class) "
            f"{rec.deadline - now:.3f} s before its deadline"
        )

    def network(self) -> None:
        """The connection dies now and then (a silent drop found by the SDK: its socket fails)."""
        for _ in range(self.rng.randint(1, 3)):
            self.rt.sleep(self.ticks(self.rng.uniform(0.0, 2.0)))
            ctx = self.lane.context()
            if ctx is not None and not ctx.shut_by:
                self.log(f"context {ctx.gen}: the network drops it")
                ctx.shut_by = "network"
                ctx.shut.set()

    def script(self) -> None:
        rng = self.rng
        threads = []
        if rng.random() < 0.5:  # a context built first, so that direct calls can run at once
            rec = self.new_rec("script", "call")
            rec.timeout, rec.work, rec.fault, rec.began = 5.0, 0.0, False, self.rt.now
            try:
                self.lane.call(Work(self, rec), rec.timeout)
            except Exception as exc:
                self.judge(rec, exc)
        for i in range(rng.randint(2, 4)):
            t = self.rt.threading.Thread(
                target=self.caller, args=(f"caller-{i}", rng.randint(1, 4)), name=f"caller-{i}"
            )
            t.start()
            threads.append(t)
        if rng.random() < 0.3:
            net = self.rt.threading.Thread(target=self.network, name="network")
            net.start()
            threads.append(net)
        for t in threads:
            t.join()
        if rng.random() < 0.2:
            self.lane.close()

    def run(self) -> list[str]:
        self.rt.run(self.script)
        self.violations += [f"a simulated thread crashed: {c}" for c in self.rt.crashes]
        if self.rt.end_reason != "the script ended":
            self.violate(f"the schedule did not end: {self.rt.end_reason}")
        for worker_id, started in self.entries.items():  # one at a time, in the order queued (worker calls)
            order = self.queues[worker_id].put_order
            position = {call: n for n, call in enumerate(order)}
            seen = [position[c] for c in started if c in position]
            if seen != sorted(seen):
                self.violations.append(f"a worker ran calls out of their order: {started} (queued {order})")
        return self.violations

    def report(self, last: int = 60) -> str:
        lines = self.lines[-last:]
        return "\n".join([*(f"  {v}" for v in self.violations), "  trace (last lines):", *lines])


def run_schedule(seed: int, source: str | None = None) -> World:
    world = World(seed, source)
    world.run()
    return world
