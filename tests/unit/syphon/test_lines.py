"""The lines of the syphon's ordered drain (:class:`spark_sb.syphon.lines.Lines`) on a fake clock: a line is held
back behind its head until the head (or anything before it) is met again or the horizon passes, and a queue is
paused for a while after a failed receive."""

from __future__ import annotations

from servicebus_local.clock import FakeClock
from spark_sb.syphon.lines import HORIZON, RECEIVE_FAILURE_PAUSE, Lines

LINE = ("q", "orders", "s")


def test_lines_hold_a_line_behind_its_head_until_the_head_is_met_again() -> None:
    clock = FakeClock()
    lines = Lines(clock, horizon=100.0)
    line = ("q", "orders", "s")
    assert lines.admits(line, 7)
    lines.hold(line, 10)
    lines.hold(line, 12)  # a later one held back too: the head stays 10
    assert not lines.admits(line, 11) and not lines.admits(line, 12)
    assert lines.admits(("q", "orders", "t"), 11)  # other lines go on
    assert lines.admits(line, 10) and len(lines) == 0  # the head is back: the line moves again
    lines.hold(line, 20)
    clock.advance(101)
    assert lines.admits(line, 25) and len(lines) == 0  # its head never came back (left the queue otherwise)


def test_lines_pause_a_queue_for_a_while() -> None:
    clock = FakeClock()
    lines = Lines(clock)
    lines.pause("q")
    assert lines.paused("q") and not lines.paused("r")
    clock.advance(RECEIVE_FAILURE_PAUSE)
    assert not lines.paused("q")


def test_an_earlier_message_held_back_becomes_the_head() -> None:
    lines = Lines(FakeClock())
    lines.hold(LINE, 12)
    lines.hold(LINE, 10)
    assert not lines.admits(LINE, 11)  # behind the new head 10
    assert lines.admits(LINE, 9) and len(lines) == 0  # before the head: the line is released


def test_a_message_before_the_head_releases_the_line() -> None:
    lines = Lines(FakeClock())
    lines.hold(LINE, 10)
    assert lines.admits(LINE, 3)
    assert lines.held() == [] and lines.admits(LINE, 50)


def test_a_message_without_a_sequence_number_is_never_held_and_never_passes_a_head() -> None:
    lines = Lines(FakeClock())
    lines.hold(LINE, None)
    assert len(lines) == 0 and lines.admits(LINE, 11)
    lines.hold(LINE, 10)
    assert not lines.admits(LINE, None)
    assert lines.held() == [LINE]


def test_a_head_is_awaited_for_the_whole_horizon_and_dropped_after_it() -> None:
    clock = FakeClock()
    lines = Lines(clock)
    assert lines.horizon == HORIZON == 600.0  # ten times the backlog queues' lock (60 s)
    lines.hold(LINE, 10)
    clock.advance(600.0)
    assert not lines.admits(LINE, 11)  # exactly the horizon: still held
    assert len(lines) == 1
    clock.advance(0.001)
    assert lines.admits(LINE, 11) and len(lines) == 0


def test_the_horizon_runs_from_the_first_hold_of_the_head() -> None:
    clock = FakeClock()
    lines = Lines(clock, horizon=100.0)
    lines.hold(LINE, 10)
    clock.advance(60)
    lines.hold(LINE, 11)  # behind the head: the head and its time stay
    clock.advance(41)
    assert lines.admits(LINE, 12)


def test_held_lists_the_lines_held_back_of_one_queue_or_all() -> None:
    lines = Lines(FakeClock())
    a, b, c = ("q1", "orders", "s"), ("q1", "orders", ""), ("q2", "orders", "s")
    for n, line in enumerate((a, b, c)):
        lines.hold(line, n)
    assert lines.held("q1") == [a, b]
    assert lines.held("q2") == [c]
    assert lines.held("q3") == []
    assert lines.held() == [a, b, c] and len(lines) == 3


def test_a_pause_lasts_the_seconds_given_then_ends_on_its_own() -> None:
    clock = FakeClock()
    lines = Lines(clock)
    lines.pause("q", seconds=5.0)
    clock.advance(4.999)
    assert lines.paused("q")
    clock.advance(0.001)
    assert not lines.paused("q")
    assert not lines.paused("q")  # and stays ended


def test_a_new_pause_replaces_the_old_one() -> None:
    clock = FakeClock()
    lines = Lines(clock)
    lines.pause("q", seconds=5.0)
    clock.advance(4.0)
    lines.pause("q", seconds=5.0)
    clock.advance(4.0)
    assert lines.paused("q")


def test_the_default_pause_outlasts_the_backlog_queues_lock() -> None:
    clock = FakeClock()
    lines = Lines(clock)
    lines.pause("q")
    clock.advance(60.0)  # the provisioned lock duration
    assert lines.paused("q")
