"""Lanes: every call has a deadline whatever the call does; a stuck call's context is abandoned (unblocked and
closed in the background, never awaited) and the next call gets a fresh one. Real threads; the calls block on
events, so nothing here sleeps to wait."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from spark_sb.core.errors import LaneClosed, classify
from spark_sb.wire.lane import DeadlineExceeded, Lane, Withdrawn


class Ctx:
    def __init__(self, n: int) -> None:
        self.n = n
        self.closed = threading.Event()
        self.unblocked = threading.Event()
        self.thread: str | None = None


class Rig:
    def __init__(self) -> None:
        self.built: list[Ctx] = []
        self.lane: Lane[Ctx] = Lane("test", self.build, self.close, self.unblock)

    def build(self) -> Ctx:
        ctx = Ctx(len(self.built) + 1)
        self.built.append(ctx)
        return ctx

    @staticmethod
    def close(ctx: Ctx) -> None:
        ctx.closed.set()

    @staticmethod
    def unblock(ctx: Ctx) -> None:
        ctx.unblocked.set()


def test_a_call_runs_on_the_lane_thread_with_its_context() -> None:
    rig = Rig()

    def where(ctx: Ctx) -> tuple[int, str]:
        return ctx.n, threading.current_thread().name

    n, name = rig.lane.call(where, 5.0)
    assert n == 1 and name.startswith("spark-sb-test-") and name != threading.current_thread().name
    assert rig.lane.call(where, 5.0)[0] == 1  # the same context, kept across calls
    assert len(rig.built) == 1


def test_an_error_of_the_call_is_raised_to_the_caller() -> None:
    rig = Rig()

    def boom(ctx: Ctx) -> None:
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        rig.lane.call(boom, 5.0)
    assert rig.lane.call(lambda ctx: ctx.n, 5.0) == 1  # the lane goes on


def test_a_stuck_call_is_abandoned_at_its_deadline_and_the_next_call_gets_a_fresh_context() -> None:
    rig = Rig()
    release = threading.Event()
    rig.lane.call(lambda ctx: None, 5.0)  # context 1 built
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="no answer within 0.2 s") as info:
        rig.lane.call(lambda ctx: release.wait(30), 0.2)
    assert 0.2 <= time.monotonic() - started < 2.0
    assert classify(info.value).name == "timeout"  # retried / failed over like any timeout
    assert rig.built[0].unblocked.wait(5)  # its socket is shut down in the background
    assert not rig.built[0].closed.is_set()  # ... but nobody waits for the stuck call to return
    assert rig.lane.call(lambda ctx: ctx.n, 5.0) == 2  # a new worker, a new context
    assert rig.lane.abandoned == 1 and rig.lane.generation == 2
    release.set()  # the stuck call returns at last: its worker closes the abandoned context and ends
    assert rig.built[0].closed.wait(5)
    assert not rig.built[1].closed.is_set()


def test_reset_closes_the_context_in_the_background_and_the_next_call_builds_anew() -> None:
    rig = Rig()
    rig.lane.call(lambda ctx: None, 5.0)
    assert rig.lane.live
    rig.lane.reset("faulted")
    assert not rig.lane.live
    assert rig.built[0].closed.wait(5)
    assert rig.lane.call(lambda ctx: ctx.n, 5.0) == 2


def test_close_refuses_further_calls() -> None:
    rig = Rig()
    rig.lane.call(lambda ctx: None, 5.0)
    rig.lane.close()
    assert rig.built[0].closed.wait(5)
    with pytest.raises(LaneClosed):
        rig.lane.call(lambda ctx: None, 5.0)
    # closing is evidence of nothing (SPEC F7): not a connection fault, never a failover
    assert classify(LaneClosed("x")).name == "client_closed" and not classify(LaneClosed("x")).fail_over


def test_submit_does_not_wait_and_a_later_call_runs_after_it() -> None:
    rig = Rig()
    gate = threading.Event()
    order: list[str] = []

    def opening(ctx: Ctx) -> None:
        gate.wait(5)
        order.append("open")

    started = time.monotonic()
    rig.lane.submit(opening)
    assert time.monotonic() - started < 0.5  # returned at once
    gate.set()
    rig.lane.call(lambda ctx: order.append("send"), 5.0)
    assert order == ["open", "send"]


def test_a_call_queued_behind_a_stuck_one_keeps_its_own_deadline() -> None:
    rig = Rig()
    release = threading.Event()
    rig.lane.submit(lambda ctx: release.wait(30))
    with pytest.raises(DeadlineExceeded):
        rig.lane.call(lambda ctx: None, 0.2)
    assert rig.lane.call(lambda ctx: ctx.n, 5.0) == 2
    release.set()


def test_a_call_queued_behind_one_with_a_deadline_of_its_own_is_withdrawn_and_the_worker_kept() -> None:
    # SPEC F6: ten probes of stalled entities queued on the isolated connection reach their deadlines together;
    # a busy worker is not a stuck one, so they are withdrawn and the connection kept, not torn down in turn
    rig = Rig()
    release = threading.Event()
    running = threading.Event()
    ran: list[str] = []

    def slow(ctx: Ctx) -> int:
        running.set()
        release.wait(30)
        return ctx.n

    first: list[int] = []
    holder = threading.Thread(target=lambda: first.append(rig.lane.call(slow, 5.0)))
    holder.start()
    assert running.wait(5)
    started = time.monotonic()
    with pytest.raises(Withdrawn, match="never started") as info:
        rig.lane.call(lambda ctx: ran.append("queued"), 0.2)
    assert 0.2 <= time.monotonic() - started < 2.0
    assert (
        isinstance(info.value, DeadlineExceeded) and classify(info.value).name == "timeout"
    )  # to its caller
    assert rig.lane.abandoned == 0 and not rig.built[0].unblocked.is_set()  # the worker and its context kept
    release.set()
    holder.join(5)
    assert first == [1]  # the running call finished on its context
    assert rig.lane.call(lambda ctx: ctx.n, 5.0) == 1  # and the next call has the same one
    assert ran == []  # the withdrawn call never ran, not even once the worker was free
    assert len(rig.built) == 1 and rig.lane.generation == 1


def test_a_running_call_past_its_own_deadline_is_abandoned_by_its_caller_the_queued_ones_withdrawn() -> None:
    rig = Rig()
    release = threading.Event()
    running = threading.Event()
    errors: list[BaseException] = []

    def stuck(ctx: Ctx) -> None:
        running.set()
        release.wait(30)

    def call(fn: Any, timeout: float) -> None:
        try:
            rig.lane.call(fn, timeout)
        except DeadlineExceeded as exc:
            errors.append(exc)

    holder = threading.Thread(target=call, args=(stuck, 0.3))
    holder.start()
    assert running.wait(5)
    queued = [threading.Thread(target=call, args=(lambda ctx: None, 0.3)) for _ in range(3)]
    for t in queued:
        t.start()
    for t in [holder, *queued]:
        t.join(5)
    # the stuck call's own caller abandons the worker at its deadline, once; the calls queued behind it (their
    # deadlines a little later) are withdrawn, and never run
    assert rig.lane.abandoned == 1
    assert sorted(type(e).__name__ for e in errors) == [
        "DeadlineExceeded",
        "Withdrawn",
        "Withdrawn",
        "Withdrawn",
    ]
    assert rig.built[0].unblocked.wait(5)
    release.set()
    assert rig.lane.call(lambda ctx: ctx.n, 5.0) == 2


def test_many_threads_share_a_lane_one_call_at_a_time() -> None:
    rig = Rig()
    inside = 0
    peak = 0
    lock = threading.Lock()

    def work(ctx: Any) -> None:
        nonlocal inside, peak
        with lock:
            inside += 1
            peak = max(peak, inside)
        time.sleep(0.001)
        with lock:
            inside -= 1

    threads = [
        threading.Thread(target=lambda: [rig.lane.call(work, 5.0) for _ in range(20)]) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak == 1 and len(rig.built) == 1


def test_a_started_call_runs_while_the_caller_works_and_its_deadline_counts_from_the_start() -> None:
    rig = Rig()
    release = threading.Event()
    ran = threading.Event()

    def work(ctx: Ctx) -> int:
        ran.set()
        release.wait(10)
        return ctx.n

    pending = rig.lane.start(work, 5.0)
    assert ran.wait(5) and not pending.done  # running on the lane while this thread goes on
    release.set()
    assert pending.result() == 1 and pending.done

    stuck = threading.Event()
    late = rig.lane.start(lambda ctx: stuck.wait(10), 0.2)
    time.sleep(0.3)  # the caller is busy (packing the next batch) past the call's deadline
    began = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        late.result()
    assert time.monotonic() - began < 0.1  # no second wait: the deadline was counted from the start
    assert rig.built[0].unblocked.wait(5) and rig.lane.abandoned == 1
    stuck.set()
    assert rig.lane.call(lambda ctx: ctx.n, 5.0) == 2  # a fresh context


# --------------------------------------------------------------------------------- direct calls (Lane.direct)


def test_a_direct_call_runs_on_the_calling_thread_once_the_context_is_built() -> None:
    rig = Rig()

    def where(ctx: Ctx) -> tuple[int, str]:
        return ctx.n, threading.current_thread().name

    assert rig.lane.direct(where, 5.0) is None  # no context yet: connecting is the worker's job
    assert rig.built == []
    rig.lane.call(where, 5.0)
    finished = rig.lane.direct(where, 5.0)
    assert finished is not None
    assert finished.result() == (1, threading.current_thread().name)
    assert finished.generation == rig.lane.generation == 1


def test_a_direct_call_hands_its_error_to_the_caller() -> None:
    rig = Rig()
    rig.lane.call(lambda ctx: None, 5.0)

    def boom(ctx: Ctx) -> None:
        raise ValueError("bad")

    finished = rig.lane.direct(boom, 5.0)
    assert finished is not None
    with pytest.raises(ValueError, match="bad"):
        finished.result()
    assert rig.lane.call(lambda ctx: ctx.n, 5.0) == 1  # the lane and its context go on


def test_no_direct_call_while_the_worker_is_busy_or_after_a_reset() -> None:
    rig = Rig()
    rig.lane.call(lambda ctx: None, 5.0)
    gate, running = threading.Event(), threading.Event()

    def busy(ctx: Ctx) -> None:
        running.set()
        gate.wait(5)

    pending = rig.lane.start(busy, 5.0)
    assert running.wait(5)
    assert rig.lane.direct(lambda ctx: ctx.n, 5.0) is None  # the worker is using the context
    gate.set()
    pending.result()
    rig.lane.reset("faulted")
    assert rig.lane.direct(lambda ctx: ctx.n, 5.0) is None  # a new context is built on the worker first


def test_the_worker_waits_while_a_direct_call_uses_the_context() -> None:
    rig = Rig()
    rig.lane.call(lambda ctx: None, 5.0)
    order: list[str] = []

    def direct(ctx: Ctx) -> None:
        order.append("direct starts")
        queued = rig.lane.start(lambda c: order.append("worker"), 5.0)
        assert not queued._job.done.wait(0.3)  # it would have run by now if the context were not held
        order.append("direct ends")
        holder.append(queued)

    holder: list[Any] = []
    finished = rig.lane.direct(direct, 5.0)
    assert finished is not None
    finished.result()
    holder[0].result()
    assert order == ["direct starts", "direct ends", "worker"]


def test_a_direct_call_past_its_deadline_is_unblocked_abandoned_and_closed_only_once_it_let_go() -> None:
    rig = Rig()
    rig.lane.call(lambda ctx: None, 5.0)
    seen: list[str] = []

    def stuck(ctx: Ctx) -> None:  # an SDK call stuck on its socket until the socket is shut down
        if ctx.unblocked.wait(10):
            seen.append("closed while in use" if ctx.closed.is_set() else "unblocked")
            raise ConnectionResetError("socket shut down")

    started = time.monotonic()
    finished = rig.lane.direct(stuck, 0.3)
    assert finished is not None
    with pytest.raises(DeadlineExceeded, match="no answer within 0.3 s") as info:
        finished.result()
    assert 0.3 <= time.monotonic() - started < 2.0
    assert isinstance(info.value.__cause__, ConnectionResetError)
    assert seen == ["unblocked"]
    assert rig.built[0].closed.wait(5)  # the abandoned worker closed the context after the call let go
    assert rig.lane.abandoned == 1
    assert rig.lane.call(lambda ctx: ctx.n, 5.0) == 2  # the next call builds a fresh context


def test_a_slow_direct_call_gets_on_slow_from_the_watchdog_and_still_finishes() -> None:
    rig = Rig()
    rig.lane.call(lambda ctx: None, 5.0)
    slow = threading.Event()
    where: list[str] = []

    def on_slow() -> None:
        where.append(threading.current_thread().name)
        slow.set()

    finished = rig.lane.direct(lambda ctx: slow.wait(5) and ctx.n, 5.0, slow_after=0.1, on_slow=on_slow)
    assert finished is not None
    assert finished.result() == 1
    assert where == ["spark-sb-watchdog"]
    assert rig.lane.abandoned == 0


def test_the_watchdog_fires_the_earliest_deadline_first_and_never_a_cancelled_one() -> None:
    from spark_sb.wire.watchdog import WATCHDOG

    fired: list[str] = []
    done = threading.Event()
    now = time.monotonic()
    WATCHDOG.watch(now + 0.4, lambda: (fired.append("late"), done.set()))
    cancelled = WATCHDOG.watch(now + 0.05, lambda: fired.append("cancelled"))
    WATCHDOG.watch(now + 0.1, lambda: fired.append("early"))  # earlier than the sleeping watchdog's wake-up
    assert cancelled.cancel()
    assert done.wait(5)
    assert fired == ["early", "late"]
    assert cancelled.cancel()  # cancelling twice: still cancelled, never fired


def test_a_forked_child_gets_a_watchdog_of_its_own() -> None:
    """Spark forks Python workers: a child must not inherit the parent's watchdog thread or a lock held at the
    fork (here held on purpose; without the at-fork reset the child's first deadline would block for ever)."""
    import os
    import signal

    from spark_sb.wire.watchdog import WATCHDOG

    fired = threading.Event()
    WATCHDOG.watch(time.monotonic() + 0.01, fired.set)
    assert fired.wait(5)  # the parent's watchdog thread is running
    with WATCHDOG._cond:
        pid = os.fork()
        if pid == 0:  # the child: kill itself if anything blocks
            signal.alarm(10)
            ok = threading.Event()
            WATCHDOG.watch(time.monotonic() + 0.05, ok.set)
            os._exit(0 if ok.wait(5) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_an_idle_lane_tends_its_context_between_calls_never_during_one() -> None:
    """The idle hook runs on the worker with the built context when no call came for idle_every seconds; a call
    in progress is never tended; the hook's errors are logged, not raised, and the lane goes on."""
    tended: list[tuple[int, str]] = []
    twice = threading.Event()
    in_call = threading.Event()
    release = threading.Event()
    during_call: list[int] = []

    def idle(ctx: Ctx) -> None:
        if in_call.is_set() and not release.is_set():
            during_call.append(ctx.n)
        tended.append((ctx.n, threading.current_thread().name))
        if len(tended) >= 2:
            twice.set()
        raise RuntimeError("tending failed")  # logged; the lane keeps working

    built: list[Ctx] = []

    def build() -> Ctx:
        built.append(Ctx(len(built) + 1))
        return built[-1]

    lane: Lane[Ctx] = Lane("tend", build, Rig.close, Rig.unblock, idle=idle, idle_every=0.02)
    assert not twice.wait(0.1) and tended == []  # no context built yet: nothing to tend
    assert lane.call(lambda ctx: ctx.n, 5.0) == 1
    assert twice.wait(5.0)
    assert {n for n, _ in tended} == {1} and all(name.startswith("spark-sb-tend-") for _, name in tended)

    def long_call(ctx: Ctx) -> int:
        in_call.set()
        release.wait(5.0)
        return ctx.n

    pending = lane.start(long_call, 5.0)
    assert in_call.wait(5.0)
    time.sleep(0.1)  # five idle periods pass while the call holds the context
    release.set()
    assert pending.result() == 1
    assert during_call == []
    assert lane.call(lambda ctx: ctx.n, 5.0) == 1  # the hook's errors did not retire the context
    lane.close()
