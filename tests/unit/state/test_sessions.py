"""The sink's held lines (spark_sb/state/sessions.py), pure: a line is held from its first mark until every pending
marker is acknowledged; a later batch's marker replaces the older one of its queue (it is behind it there), not
those of other queues; a task's book holds exactly the handed lines and never releases them; the ``sessions`` rows
round-trip; the memory store answers acknowledgements by marker, namespace and time."""

from __future__ import annotations

import pickle
from datetime import datetime, timedelta, timezone

from spark_sb.failover.ordering import SessionBook
from spark_sb.state.records import ACKNOWLEDGED, Event
from spark_sb.state.sessions import (
    HANDED,
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
    assert store.read_acknowledgements("p.example", {"m1"}, T0 + timedelta(seconds=1)) == set()
    store.write_sessions("sink", ())
    assert store.read_sessions("sink") == []
