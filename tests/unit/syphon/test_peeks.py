"""What the ordered syphon's proof costs (SPEC O3, O6, O7; spark_sb/syphon/lines.py ``next_peek``): sequence numbers
are gapless, so a message a pass did not receive lies ahead of its first received one or in a gap between two - only
those are peeked. A contiguous receive batch costs no peek; a locked message ahead or in a gap still holds its line.
On the fake world of test_ordered.py (peeks counted by the fake queue)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from spark_sb.syphon.lines import CLEAR_FOR, PEEK_MERGE, PEEK_PAGE, next_peek
from tests.unit.syphon.test_ordered import LOCK, Delivered, FakeQueue, World, msgs, queue_of
from tests.unit.syphon.test_seams import backlogged


@pytest.fixture
def world() -> Iterator[World]:
    w = World()
    yield w
    w.syphon.close()


def lock_elsewhere(queue: FakeQueue, *ids: str) -> list[Delivered]:
    """Another worker's receive locks ``ids`` (from the queue's head; what it took besides them it abandons)."""
    taken = queue.receive_messages(max_message_count=len(queue), max_wait_time=0)
    kept = [m for m in taken if m.message_id in ids]
    for m in taken:
        if m.message_id not in ids:
            queue.abandon_message(m)
    assert len(kept) == len(ids)
    return kept


def marker_acknowledged(world: World) -> bool:
    record = world.book.held("orders", "s")
    return record is not None and record.drained


# ------------------------------------------------------------------------------------------------- the plan
def test_nothing_covered_yet_one_message_from_the_start_shows_what_is_ahead() -> None:
    assert next_peek(0, [1000, 1001]) == (0, (1, 1))
    assert next_peek(0, [1, 2, 3]) == (3, None)  # the queue's first numbers: nothing can be ahead


def test_a_contiguous_run_after_what_is_covered_needs_no_peek() -> None:
    assert next_peek(1000, [1001, 1002, 1003]) == (1003, None)
    assert next_peek(1003, [999, 1002, 1003]) == (1003, None)  # received again below the view: covered


def test_a_gap_is_peeked_with_as_many_messages_as_it_has_numbers() -> None:
    assert next_peek(1000, [1001, 1005, 1006]) == (1001, (1002, 3))
    assert next_peek(990, [1001]) == (990, (991, 10))  # between what is covered and the first received


def test_gaps_a_few_received_messages_apart_are_peeked_together_far_apart_one_by_one() -> None:
    near = [1001, *range(1003, 1003 + PEEK_MERGE), 1003 + PEEK_MERGE + 1]
    assert next_peek(1001, near) == (1001, (1002, PEEK_MERGE + 2))
    far = [1001, *range(1003, 1003 + PEEK_MERGE + 1), 1003 + PEEK_MERGE + 2]
    assert next_peek(1001, far) == (1001, (1002, 1))


def test_a_peek_never_asks_for_more_than_a_page() -> None:
    assert next_peek(1, [5000]) == (1, (2, PEEK_PAGE))
    assert next_peek(1, [3, 3 + PEEK_PAGE]) == (1, (2, 1))  # merged, it would pass a page


# ------------------------------------------------------------------------------------------------- the drain
def test_a_contiguous_receive_batch_costs_no_peek() -> None:
    """300 messages in receive batches of 100: the first batch's one-message peek shows nothing ahead of it, the
    other batches continue the run, the empty receive's peek of the rest finds nothing. Before: every message was
    peeked (pages of 250 from the queue's start)."""
    w = World(batch_size=100)
    queue = backlogged(w, ("s", 0, 300))
    batches = list(w.syphon.drain_batches(queue_of("s"), max_wait=0))
    assert w.per_session() == {"s": list(range(300))} and marker_acknowledged(w)
    # 301 messages (the marker): four batches, then an empty receive's look at the rest of the queue (empty)
    assert [b.peek_calls for b in batches] == [1, 0, 0, 0, 1] and batches[-1].received == 0
    assert queue.peeked == 1
    w.syphon.close()


def test_a_locked_message_ahead_of_the_first_received_holds_its_line(world: World) -> None:
    """Another worker holds s-0..s-2 (1000..1002): the one-message peek finds 1000 ahead of the first received
    (1003); the rest of the ahead part is peeked once (2 messages); nothing of s moves, the marker waits."""
    queue = backlogged(world, ("s", 0, 6))
    lock_elsewhere(queue, "s-0", "s-1", "s-2")
    out = world.syphon.drain_queue(queue_of("s"), max_wait=0)
    assert world.primary() == [] and not marker_acknowledged(world)
    assert out.peek_calls == 2 and queue.peeked == 3 and out.deferred == 4
    world.clock.advance(LOCK.total_seconds() + 1)  # the other worker's locks run out
    world.drain()
    assert world.per_session() == {"s": list(range(6))} and marker_acknowledged(world)


def test_a_gap_hiding_a_locked_message_of_the_line_holds_the_rest_of_it(world: World) -> None:
    """Another worker holds s-2 (1002); the receive gets 1000, 1001, 1003.. around it. The gap is peeked (one message)
    and s-2 found there: s-0, s-1 move, s-3.. and the marker wait for it."""
    queue = backlogged(world, ("s", 0, 6))
    lock_elsewhere(queue, "s-2")
    out = world.syphon.drain_queue(queue_of("s"), max_wait=0)
    assert world.per_session() == {"s": [0, 1]} and not marker_acknowledged(world)
    # the start (1000, received), the gap (1002); the empty receive's look past 1006 (nothing)
    assert out.peek_calls == 3 and queue.peeked == 2
    world.clock.advance(LOCK.total_seconds() + 1)
    world.drain()
    assert world.per_session() == {"s": list(range(6))} and marker_acknowledged(world)


def test_a_peek_answer_running_past_its_gap_proves_what_it_lists(world: World) -> None:
    """Another worker holds s-2 and s-4 at the receive (gaps 1002 and 1004, one received message apart: one peek);
    by the peek it has dead-lettered s-2. The answer (3 messages from 1002) runs past the gap: 1003 (received), 1004
    (locked: s-4 holds the rest), 1005 (received) - no other peek. s-0, s-1, s-3 move, s-5 and the marker wait."""
    queue = backlogged(world, ("s", 0, 6))
    s2, _ = lock_elsewhere(queue, "s-2", "s-4")

    def meanwhile(_: list[Delivered]) -> None:
        queue.on_receive = None
        queue.dead_letter_message(s2, reason="r", error_description="d")

    queue.on_receive = meanwhile
    out = world.syphon.drain_queue(queue_of("s"), max_wait=0)
    assert world.per_session() == {"s": [0, 1, 3]} and not marker_acknowledged(world)
    assert out.peek_calls == 3 and queue.peeked == 1 + 3  # and the empty receive's look past 1006 (nothing)
    world.clock.advance(LOCK.total_seconds() + 1)
    world.drain()
    assert world.per_session() == {"s": [0, 1, 3, 4, 5]} and marker_acknowledged(world)


def test_a_later_receive_batch_peeks_only_past_what_the_view_covers() -> None:
    """Batches of 3; another worker holds s-4 (1004). Batch 1 (1000..1002): one peek (nothing ahead). Batch 2
    (1003, 1005, 1006): only the gap 1004 is peeked - not again from the start."""
    w = World(batch_size=3)
    queue = backlogged(w, ("s", 0, 8))
    lock_elsewhere(queue, "s-4")
    batches = w.syphon.drain_batches(queue_of("s"), max_wait=0)
    first, second = next(batches), next(batches)
    assert (first.peek_calls, second.peek_calls) == (1, 1)
    assert queue.peeked == 1 + 1
    for _ in batches:
        pass
    assert w.per_session() == {"s": [0, 1, 2, 3]} and not marker_acknowledged(w)
    w.syphon.close()


# ------------------------------------------------------------------------------------------------- across passes
def test_a_pass_after_one_that_left_the_queue_clear_costs_no_peek_until_the_carry_runs_out() -> None:
    """Passes of one receive batch each (the bench's drain): the first proves from the queue's start (one message
    peeked); it left nothing up to its last received message in the queue, so the next passes start there and
    their contiguous batches cost no peek - until CLEAR_FOR after that proof, when a pass proves from the start
    again."""
    w = World(batch_size=10)
    queue = backlogged(w, ("s", 0, 60))
    name = queue_of("s")
    peeks = [w.syphon.drain_queue(name, max_wait=0, max_batches=1).peek_calls for _ in range(3)]
    assert peeks == [1, 0, 0] and queue.peeked == 1
    w.clock.advance(CLEAR_FOR)
    assert w.syphon.drain_queue(name, max_wait=0, max_batches=1).peek_calls == 1
    w.drain()
    assert w.per_session() == {"s": list(range(60))} and marker_acknowledged(w)
    w.syphon.close()


def test_a_pass_that_left_a_held_line_behind_carries_nothing_to_the_next(world: World) -> None:
    """Another worker holds s-2: the pass moves s-0, s-1 and defers s-3.. and the marker (its view is not empty).
    The sender keeps the session on the backlog: s-6 (and a marker) come behind them. The next pass receives only
    those; it must prove from the start (s-2 locked, s-3.. deferred) and not move s-6. (Carrying the view's end would
    move it.)"""
    queue = backlogged(world, ("s", 0, 6))
    lock_elsewhere(queue, "s-2")
    name = queue_of("s")
    world.syphon.drain_queue(name, max_wait=0)
    assert world.per_session() == {"s": [0, 1]}
    world.rig.sender.send(msgs("s", 6, 1))
    assert world.per_session() == {"s": [0, 1]}  # held: behind the backlog
    out = world.syphon.drain_queue(name, max_wait=0)
    assert out.received == 2 and out.deferred == 2 and world.per_session() == {"s": [0, 1]}
    world.clock.advance(LOCK.total_seconds() + 1)
    world.drain()
    world.drain()
    assert world.per_session() == {"s": list(range(7))}
