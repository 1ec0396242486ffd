"""Lanes abort an opening that their ``unblock`` cannot reach (SPEC F8): code on a worker registers an abort with
:func:`~spark_sb.wire.lane.abort_when_abandoned` (the connection being opened, before it is the context's: the factory
itself may be opening it); abandoning the worker at a deadline or closing the lane calls it with the error the
opening should raise, so the worker exits within about its caller's deadline. Real threads; the "opening" blocks
on an event that only the abort sets, so nothing here sleeps to wait."""

from __future__ import annotations

import threading
import time

import pytest

from spark_sb.core.errors import LaneClosed
from spark_sb.wire.lane import DeadlineExceeded, Lane, abort_when_abandoned


class StuckOpening:
    """An opening that blocks until aborted (a SASL read on a socket that only a shutdown ends)."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.aborted = threading.Event()
        self.errors: list[BaseException] = []
        self.thread: threading.Thread | None = None

    def abort(self, error: BaseException) -> None:
        self.errors.append(error)
        self.aborted.set()

    def open(self) -> str:
        self.thread = threading.current_thread()
        with abort_when_abandoned(self.abort):
            self.started.set()
            if not self.aborted.wait(30.0):
                return "opened"
            raise self.errors[0]


def lane_opening_in_factory(opening: StuckOpening) -> Lane[str]:
    return Lane("abort", opening.open, lambda _ctx: None)


def test_abandoning_at_the_deadline_aborts_an_opening_in_the_factory() -> None:
    opening = StuckOpening()
    lane = lane_opening_in_factory(opening)
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        lane.call(lambda ctx: ctx, 0.2)
    assert opening.aborted.wait(2.0)
    assert isinstance(opening.errors[0], DeadlineExceeded)
    assert opening.thread is not None
    opening.thread.join(2.0)
    assert not opening.thread.is_alive()  # the abandoned worker exited
    assert time.monotonic() - t0 < 1.5
    lane.close()


def test_closing_the_lane_aborts_an_opening_and_the_waiting_caller_gets_lane_closed() -> None:
    opening = StuckOpening()
    lane = lane_opening_in_factory(opening)
    pending = lane.start(lambda ctx: ctx, 30.0)
    assert opening.started.wait(5.0)
    t0 = time.monotonic()
    lane.close()
    with pytest.raises(LaneClosed):
        pending.result()
    assert time.monotonic() - t0 < 1.0
    assert opening.thread is not None
    opening.thread.join(2.0)
    assert not opening.thread.is_alive()


def test_an_opening_registered_after_the_worker_was_abandoned_is_aborted_at_once() -> None:
    lane: Lane[int] = Lane("abort-late", lambda: 1, lambda _ctx: None)
    release = threading.Event()
    late: list[BaseException] = []

    def slow_then_open(_ctx: int) -> None:
        release.wait(5.0)
        with abort_when_abandoned(late.append):
            pass

    with pytest.raises(DeadlineExceeded):
        lane.call(slow_then_open, 0.1)
    release.set()
    deadline = time.monotonic() + 5.0
    while not late and time.monotonic() < deadline:
        time.sleep(0.01)
    assert late and isinstance(late[0], DeadlineExceeded)
    lane.close()


def test_a_finished_opening_is_not_aborted_and_a_reset_does_not_abort() -> None:
    aborts: list[BaseException] = []

    def build() -> int:
        with abort_when_abandoned(aborts.append):
            return 7

    lane: Lane[int] = Lane("abort-done", build, lambda _ctx: None)
    assert lane.call(lambda ctx: ctx, 5.0) == 7
    lane.reset("faulted")  # a reset lets the current call finish: its opening may serve that call
    assert lane.call(lambda ctx: ctx, 5.0) == 7
    lane.close()
    assert aborts == []


def test_outside_a_lane_it_does_nothing() -> None:
    aborts: list[BaseException] = []
    with abort_when_abandoned(aborts.append):
        pass
    assert aborts == []
