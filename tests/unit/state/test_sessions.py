"""The sink's held lines (spark_sb/state/sessions.py), pure: a line is held from its first mark until every pending
marker is acknowledged; a later batch's marker replaces the older one of its queue (it is behind it there), not
those of other queues; a task's book holds exactly the handed lines and never releases them; the ``sessions`` rows
round-trip; the memory store answers acknowledgements by marker, namespace and time."""

from __future__ import annotations

import pickle
from datetime import datetime, timedelta, timezone

import pytest

from servicebus_local.clock import FakeClock
from spark_sb.failover.ordering import SessionBook
from spark_sb.state.records import ACKNOWLEDGED, Event
from spark_sb.state.sessions import (
    ACK_SKEW,
    CATCH_UP_POLL,
    CATCH_UP_WAIT,
    HANDED,
    REMARK_AFTER,
    HeldLine,
    LineMark,
    SessionLedger,
    lines_from_rows,
    marks_of,
    restore_book,
    session_rows,
)
from spark_sb.state.store import MemoryStateStore

T0 = datetime(2026, 11, 27, 4, 0, tzinfo=timezone.utc)
Q0, Q1 = "p/x-servicebus-transfer/0", "p/x-servicebus-transfer/1"


def test_a_line_is_held_until_its_newest_marker_per_queue_is_acknowledged() -> None:
    ledger = SessionLedger()
    new = ledger.marked([LineMark("orders", "s", Q0, "m1")], T0)
    assert [line.key for line in new] == [("orders", "s")] and ledger.pending() == {"m1"}
    ledger.marked([LineMark("orders", "s", Q0, "m2")], T0 + timedelta(seconds=1))  # behind m1 in Q0
    assert ledger.pending() == {"m2"}
    assert ledger.acknowledged({"m1"}) == []  # an older marker says nothing of m2's batch
    assert len(ledger) == 1
    released = ledger.acknowledged({"m2"})
    assert [line.session for line in released] == ["s"] and len(ledger) == 0 and ledger.oldest() is None


def test_two_tasks_that_pinned_a_line_to_two_queues_keep_it_held_until_both_are_acknowledged() -> None:
    ledger = SessionLedger()
    ledger.marked([LineMark("orders", "s", Q1, "a"), LineMark("orders", "s", Q0, "b")], T0)
    assert ledger.handoff()[0].queue == Q0  # one queue for the next batch's tasks
    ledger.marked([LineMark("orders", "s", Q0, "c")], T0 + timedelta(seconds=1))  # replaces b, not a
    assert ledger.pending() == {"a", "c"}
    assert ledger.acknowledged({"c"}) == [] and ledger.pending() == {"a"}
    assert len(ledger.acknowledged({"a"})) == 1


def test_a_tasks_book_holds_exactly_the_handed_lines_and_reports_only_its_own_marks() -> None:
    book = SessionBook()
    restore_book(book, [HeldLine("orders", "stale", Q1, T0)])
    line = HeldLine("orders", "s", Q0, T0)
    restore_book(book, [line])  # the next task of the worker: the driver's handoff is the whole truth
    assert list(book.records()) == [("orders", "s")]
    assert book.route("orders", "s", entity_failed_over=False) == Q0  # HANDED is never acknowledged
    book.acknowledged("orders", "s", HANDED)
    assert book.route("orders", "s", entity_failed_over=False) == Q0
    assert marks_of(book) == ()
    assert book.diverted("orders", "s", [Q0, Q1], lambda q: True) == Q0
    marker = book.close_call("orders", "s", 1)
    assert marker is not None and marks_of(book) == (LineMark("orders", "s", Q0, marker),)
    assert pickle.loads(pickle.dumps(line)) == line


def test_session_rows_round_trip_one_row_per_pending_marker() -> None:
    ledger = SessionLedger()
    ledger.marked([LineMark("orders", "s", Q1, "a"), LineMark("orders", "s", Q0, "b")], T0)
    ledger.marked([LineMark("orders", "", Q0, "e")], T0)
    columns = ("sink_id", "entity", "session", "backlog_queue", "since", "marker", "issued")
    rows = [dict(zip(columns, r, strict=True)) for r in session_rows("sink", ledger.handoff())]
    assert len(rows) == 3
    back = SessionLedger()
    back.load(lines_from_rows(rows, lambda v: v))
    assert back.pending() == ledger.pending() and sorted(back.lines) == sorted(ledger.lines)


def test_the_memory_store_keeps_a_sinks_lines_and_finds_acknowledgements_by_marker_and_time() -> None:
    store = MemoryStateStore()
    ledger = SessionLedger()
    ledger.marked([LineMark("orders", "s", Q0, "m1")], T0)
    store.write_sessions("sink", ledger.handoff())
    assert store.read_sessions("sink") == list(ledger.handoff()) and store.read_sessions("other") == []
    ack = Event(T0, "syphon/p", 1, ACKNOWLEDGED, namespace="p.example", entity="orders", detail="m1")
    store.append_events([ack])
    assert store.read_acknowledgements("p.example", {"m1", "m9"}, T0) == {"m1"}
    assert store.read_acknowledgements("other", {"m1"}, T0) == set()
    assert store.read_acknowledgements("P.Example:5671/", {"m1"}, T0) == {
        "m1"
    }  # another spelling of p.example
    assert store.read_acknowledgements("p.example", {"m1"}, T0 + timedelta(seconds=1)) == set()
    store.write_sessions("sink", ())
    assert store.read_sessions("sink") == []


# ---------------------------------------------------------------------------------------------------------
# Issue 47's suspicions at the ledger: namespace spellings, a driver restart, clock skew


@pytest.mark.parametrize(
    "syphon_wrote",
    [
        "Contoso.servicebus.windows.net",
        "contoso.servicebus.windows.net:5671",
        "CONTOSO.servicebus.windows.net./",
    ],
)
def test_an_acknowledgement_is_found_whatever_spelling_of_the_namespace_the_syphon_wrote(
    syphon_wrote: str,
) -> None:
    """Suspicion (proven at ce9de6a, where the read compared the host string as written): a sink configured with
    one spelling of its primary and a syphon job with another (case, port, trailing dot or slash) kept every held
    line held for ever. Another namespace's acknowledgements are still not read."""
    store = MemoryStateStore()
    ledger = SessionLedger()
    ledger.marked([LineMark("orders", "s", Q0, "m1")], T0)
    store.append_events(
        [
            Event(
                T0, "syphon/contoso", 1, ACKNOWLEDGED, namespace=syphon_wrote, entity="orders", detail="m1"
            ),
            Event(T0, "syphon/fabrikam", 1, ACKNOWLEDGED, namespace="fabrikam.example", detail="m1"),
        ]
    )
    ledger.loaded = True
    released = ledger.release(store, "contoso.servicebus.windows.net", "sink", T0)
    assert [line.session for line in released] == ["s"]
    assert store.read_acknowledgements("fabrikam.servicebus.windows.net", {"m1"}, T0) == set()
    assert store.read_acknowledgements("contoso.servicebus.windows.net:5680", {"m1"}, T0) == set()


def test_a_held_line_keeps_its_queue_across_a_driver_restart() -> None:
    """Suspicion (proven at ce9de6a): two tasks of one batch pinned a line to two queues; the driver pins it to
    the first by name (min), but a restarted driver read the newest marker's queue with ties broken by the last
    name - the next batch's tasks sent the line to another queue than before the restart."""
    ledger = SessionLedger()
    ledger.marked([LineMark("orders", "s", Q1, "a"), LineMark("orders", "s", Q0, "b")], T0)
    before = ledger.handoff()[0].queue
    columns = ("sink_id", "entity", "session", "backlog_queue", "since", "marker", "issued")
    rows = [dict(zip(columns, r, strict=True)) for r in session_rows("sink", ledger.handoff())]
    for order in (rows, rows[::-1]):
        restarted = SessionLedger()
        restarted.load(lines_from_rows(order, lambda v: v))
        assert restarted.handoff()[0].queue == before == Q0
    ledger.marked([LineMark("orders", "s", Q0, "c")], T0 + timedelta(seconds=1))  # a later batch, Q0
    rows = [dict(zip(columns, r, strict=True)) for r in session_rows("sink", ledger.handoff())]
    restarted = SessionLedger()
    restarted.load(lines_from_rows(rows, lambda v: v))
    assert restarted.handoff()[0].queue == Q0


def test_a_syphon_clock_behind_by_more_than_the_ack_skew_still_releases_the_line() -> None:
    """Suspicion (proven at ce9de6a): the acknowledgement read starts ACK_SKEW (10 min) before the oldest pending
    marker; a syphon driver whose clock is further behind dates its acknowledgement before that and the line is
    held for ever (a remark replaces the marker, whose acknowledgement is dated as far back). Once the oldest
    pending marker is REMARK_AFTER old the read is not bounded by time."""
    skew = ACK_SKEW + timedelta(minutes=5)
    store = MemoryStateStore()
    ledger = SessionLedger()
    ledger.marked([LineMark("orders", "s", Q0, "m1")], T0)
    ledger.loaded = True
    store.append_events([Event(T0 - skew, "syphon/p", 1, ACKNOWLEDGED, namespace="p.example", detail="m1")])
    assert ledger.release(store, "p.example", "sink", T0 + timedelta(seconds=10)) == []  # bounded read first
    released = ledger.release(store, "p.example", "sink", T0 + REMARK_AFTER)
    assert [line.session for line in released] == ["s"]


# ---------------------------------------------------------------------------------------------------------
# R5, the driver's catch-up: a line its stream keeps feeding


class LandingClock(FakeClock):
    """A fake clock whose first sleep lands a syphon job's acknowledgement (its micro-batch committing while the
    sink's next batch starts)."""

    def __init__(self, store: MemoryStateStore, marker: str, at: datetime) -> None:
        super().__init__()
        self.store, self.marker, self.at = store, marker, at

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        if self.marker:
            ack = Event(self.at, "syphon/p", 2, ACKNOWLEDGED, namespace="p.example", detail=self.marker)
            self.store.append_events([ack])
            self.marker = ""


def fed_line(store: MemoryStateStore) -> SessionLedger:
    """A line marked by two batches (m1, then m2 behind it); the syphon job acknowledged m1 only."""
    ledger = SessionLedger()
    ledger.loaded = True
    ledger.marked([LineMark("orders", "s", Q0, "m1")], T0)
    ledger.marked([LineMark("orders", "s", Q0, "m2")], T0 + timedelta(seconds=2))
    store.append_events(
        [Event(T0 + timedelta(seconds=3), "syphon/p", 1, ACKNOWLEDGED, namespace="p.example", detail="m1")]
    )
    return ledger


def test_a_line_whose_previous_marker_was_just_acknowledged_is_waited_for_and_released() -> None:
    store = MemoryStateStore()
    ledger = fed_line(store)
    assert ledger.release(store, "p.example", "sink", T0 + timedelta(seconds=4)) == []
    assert ledger.catching == {("orders", "s")}  # the syphon is right behind it
    clock = LandingClock(store, "m2", T0 + timedelta(seconds=5))
    released = ledger.catch_up(store, "p.example", CATCH_UP_WAIT, clock, T0 + timedelta(seconds=4))
    assert [line.session for line in released] == ["s"] and len(ledger) == 0
    assert sum(clock.sleeps) <= CATCH_UP_POLL  # one poll: it went as soon as the acknowledgement was there


def test_the_catch_up_waits_at_most_its_budget_and_not_for_lines_the_syphon_is_not_passing() -> None:
    store = MemoryStateStore()
    ledger = fed_line(store)
    ledger.marked([LineMark("orders", "t", Q1, "t1")], T0)  # no acknowledgement of t's: not catching
    ledger.release(store, "p.example", "sink", T0 + timedelta(seconds=4))
    assert ledger.catching == {("orders", "s")}
    clock = LandingClock(store, "", T0)  # m2's acknowledgement never comes
    assert ledger.catch_up(store, "p.example", CATCH_UP_WAIT, clock, T0 + timedelta(seconds=4)) == []
    assert CATCH_UP_WAIT - CATCH_UP_POLL <= sum(clock.sleeps) <= CATCH_UP_WAIT
    quiet = SessionLedger()
    quiet.loaded = True
    quiet.marked([LineMark("orders", "t", Q1, "t1")], T0)
    quiet.release(store, "p.example", "sink", T0 + timedelta(seconds=4))
    idle = FakeClock()
    assert quiet.catching == set() and quiet.catch_up(store, "p.example", CATCH_UP_WAIT, idle) == []
    assert idle.sleeps == []
