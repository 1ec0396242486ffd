"""Lane hand-offs (SPEC F10): a call queued behind another caller's call - a direct call on the calling thread
above all - is withdrawn at its deadline and never abandons the worker that call uses; a call cut short by
another caller's abandonment gets an error that is evidence of nothing (F7). Real threads; the calls block on
events, so nothing here sleeps to wait (the waits are the deadlines under test)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from spark_sb.core.errors import CLIENT_CLOSED, LaneClosed, classify
from spark_sb.wire import lane as lane_module
from spark_sb.wire.lane import DeadlineExceeded, Finished, Lane, Withdrawn


class Ctx:
    """A context whose calls behave like the SDK's on a socket: they fail once it is shut down (``unblock``)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.unblocked = threading.Event()
        self.closed = threading.Event()

    def use(self) -> int:
        if self.unblocked.is_set():
            raise ConnectionResetError("socket shut down")
        return self.n


class Rig:
    def __init__(self) -> None:
        self.built: list[Ctx] = []
        self.lane: Lane[Ctx] = Lane(
            "handoff", self.build, lambda c: c.closed.set(), lambda c: c.unblocked.set()
        )

    def build(self) -> Ctx:
        self.built.append(Ctx(len(self.built) + 1))
        return self.built[-1]


def direct_in_thread(
    rig: Rig, timeout: float, release: threading.Event
) -> tuple[threading.Thread, list[Any]]:
    """A direct call on another thread that waits for ``release`` (an answer) or its socket shut down."""
    inside = threading.Event()
    out: list[Any] = []

    def fn(ctx: Ctx) -> int:
        inside.set()
        while not release.is_set():
            if ctx.unblocked.wait(0.01):
                raise ConnectionResetError("socket shut down")
        return ctx.use()

    def run() -> None:
        finished = rig.lane.direct(fn, timeout)
        assert isinstance(finished, Finished)
        try:
            out.append(finished.result())
        except Exception as exc:
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    assert inside.wait(5)
    return thread, out


def test_a_call_queued_behind_a_direct_call_is_withdrawn_at_its_deadline_and_the_direct_call_goes_on() -> (
    None
):
    # issue 47 item 5: the queued call was marked started before it held the context, so at its deadline it
    # abandoned the worker and shut the socket the direct call was using (which then failed after 0.4 s of its
    # 2 s with a connection-class error: namespace-wide evidence to a ping-mode probe)
    rig = Rig()
    rig.lane.call(lambda ctx: None, 5.0)
    release = threading.Event()
    thread, out = direct_in_thread(rig, 2.0, release)
    ran: list[int] = []
    started = time.monotonic()
    with pytest.raises(Withdrawn, match="never started"):
        rig.lane.call(lambda ctx: ran.append(ctx.use()), 0.4)
    assert 0.4 <= time.monotonic() - started < 1.5
    assert (
        rig.lane.abandoned == 0 and not rig.built[0].unblocked.is_set()
    )  # the direct call's socket untouched
    release.set()
    thread.join(5)
    assert out == [1]  # the direct call got its answer on the context it used
    assert rig.lane.call(lambda ctx: ctx.use(), 5.0) == 1  # and the lane goes on with it
    assert ran == [] and len(rig.built) == 1


def test_a_call_queued_behind_a_direct_call_abandoned_at_its_own_deadline_never_runs_on_the_shut_context() -> (
    None
):
    # the direct call's own deadline passes first: the watchdog abandons the worker (its socket shut down); the
    # call queued behind it is cut short by that abandonment, which is evidence of nothing (F7): LaneClosed, not
    # the shut socket's connection error
    rig = Rig()
    rig.lane.call(lambda ctx: None, 5.0)
    thread, out = direct_in_thread(rig, 0.3, threading.Event())
    with pytest.raises(LaneClosed) as info:
        rig.lane.call(lambda ctx: ctx.use(), 3.0)
    assert classify(info.value) is CLIENT_CLOSED
    thread.join(5)
    assert len(out) == 1 and isinstance(out[0], DeadlineExceeded)  # the direct call's own deadline
    assert rig.lane.abandoned == 1
    assert rig.lane.call(lambda ctx: ctx.use(), 5.0) == 2  # the next call builds a fresh context


def test_a_reset_for_an_older_worker_leaves_the_current_one_and_its_context() -> None:
    rig = Rig()
    rig.lane.call(lambda ctx: None, 5.0)
    rig.lane.reset("faulted")  # worker 1 retired; the next call builds worker 2
    assert rig.lane.call(lambda ctx: ctx.use(), 5.0) == 2 and rig.lane.generation == 2
    assert rig.lane.context(1) is None and rig.lane.context(2) is rig.built[1]
    assert rig.lane.reset("faulted", generation=1) is False  # a failure met on worker 1
    assert rig.lane.call(lambda ctx: ctx.use(), 5.0) == 2 and not rig.built[1].closed.is_set()
    assert rig.lane.reset("faulted", generation=2) is True
    assert rig.built[1].closed.wait(5) and rig.lane.call(lambda ctx: ctx.use(), 5.0) == 3


def test_no_direct_call_starts_on_a_worker_a_queued_calls_caller_has_decided_to_abandon() -> None:
    # the interleaving, held still: a queued call reached its deadline unstarted with nothing timed running (the
    # direct call it waited behind had just let go), so withdraw said no and its caller goes on to abandon the
    # worker; a direct call of another caller that came in between ran on the worker and had its socket shut
    # under it by that abandonment (another caller's abandonment cutting a call short, F10)
    rig = Rig()
    rig.lane.call(lambda ctx: None, 5.0)
    worker = rig.lane._worker
    assert worker is not None
    queued = lane_module._Call(lambda ctx: None, timed=True)  # its turn had not come
    assert worker.withdraw(queued) is False  # its caller abandons the worker next
    assert rig.lane.direct(lambda ctx: ctx.use(), 2.0) is None  # so nothing starts on it meanwhile
