"""A held line comes back to the primary while its sender keeps sending (SPEC O3, R5 in spark_sb/failover/ordering.py).

Two breaks of bench/bench_ordering.py's recovery part (10 sessions, a round every 0.25 s, the syphon in the same
process): the sessions of one backlog queue never returned because ``Syphon.drain_all`` drained that queue to empty
before the next while the sender kept it fed; the others never returned because the syphon acknowledged each
marker just after the sender's next round had diverted again (a steady sender chases a steady syphon for ever).
On a fake clock, with the fake backlog queues of test_ordered.py."""

from __future__ import annotations

from collections.abc import Callable

from spark_sb.failover.ordering import RETURN_WAIT
from spark_sb.syphon.mover import TURN_BATCHES
from tests.unit.sender.rig import QUEUES
from tests.unit.syphon.test_ordered import World, msgs, queue_of


def two_queues() -> tuple[str, str]:
    """A session pinned to the first backlog queue drained and one pinned to a later queue."""
    first = next(f"s{i}" for i in range(50) if queue_of(f"s{i}") == QUEUES[0])
    later = next(f"s{i}" for i in range(50) if queue_of(f"s{i}") != QUEUES[0])
    return first, later


def test_drain_all_gives_every_queue_its_turn_while_a_sender_keeps_one_queue_fed() -> None:
    w = World()
    fed_line, other = two_queues()
    w.fail_over()
    w.rig.sender.send(msgs(fed_line, 0, 2) + msgs(other, 0, 2))
    w.recover()
    feeds = [0]
    other_back_after: list[int] = []

    def feed(_: object) -> None:  # a sender as fast as the drain: one message of the held line per receive
        if feeds[0] < 30:
            feeds[0] += 1
            w.rig.sender.send(msgs(fed_line, 1 + feeds[0], 1))
        record = w.book.held("orders", other)
        if not other_back_after and (record is None or record.drained):
            other_back_after.append(feeds[0])

    w.queues[queue_of(fed_line)].on_receive = feed
    w.drain()
    assert other_back_after, "the other queue's line was acknowledged only once the fed queue ran dry"
    assert other_back_after[0] <= TURN_BATCHES + 1
    assert w.per_session() == {fed_line: list(range(2 + feeds[0])), other: [0, 1]}
    w.syphon.close()


class LateAcks:
    """The syphon's acknowledgements reach the book ``delay`` seconds after it passed the marker (a syphon whose
    pass ends just after the sender's next round), delivered as the fake clock moves."""

    def __init__(self, w: World, delay: float) -> None:
        self.w, self.delay = w, delay
        self.due: list[tuple[float, str, str, str]] = []
        advance: Callable[[float], None] = w.clock.advance

        def moved(seconds: float) -> None:
            advance(seconds)
            now = w.clock.monotonic()
            ready = [d for d in self.due if d[0] <= now]
            self.due = [d for d in self.due if d[0] > now]
            for _, entity, session, marker in ready:
                w.book.acknowledged(entity, session, marker)

        w.clock.advance = moved  # type: ignore[method-assign] # FakeClock.sleep advances through it

    def acknowledged(self, entity: str, session: str, marker: str) -> None:
        self.due.append((self.w.clock.monotonic() + self.delay, entity, session, marker))


def chase(w: World, rounds: int, period: float) -> tuple[int | None, dict[str, list[int]]]:
    """A round of one message of session s every ``period`` s, the syphon's drain after each; the round whose
    message went to the primary directly (None: every one was diverted) and what the primary got."""
    w.fail_over()
    w.rig.sender.send(msgs("s", 0, 1))
    w.recover()
    back = None
    for n in range(1, rounds + 1):
        w.rig.sender.send(msgs("s", n, 1))
        if back is None and w.book.held("orders", "s") is None:
            back = n
        w.syphon.drain_all(max_wait=0)
        w.clock.advance(period)
    for _ in range(3):
        w.clock.advance(5)
        w.syphon.drain_all(max_wait=0)
    return back, w.per_session()


def test_a_line_its_sender_keeps_feeding_returns_once_its_entity_is_back() -> None:
    period, delay = 0.25, 0.25 + RETURN_WAIT / 2  # each acknowledgement lands after the next round
    w = World()
    w.rig.transport.op_seconds = 0.0  # the rounds' pace is the period alone
    w.syphon.acks = LateAcks(w, delay)
    back, got = chase(w, 20, period)
    assert back is not None and back <= 5, f"the line returned at round {back} of 20"
    assert got == {"s": list(range(21))}
    w.syphon.close()


def test_a_call_waits_at_most_return_wait_for_a_syphon_that_stopped_acknowledging() -> None:
    w = World()
    w.rig.transport.op_seconds = 0.0
    w.syphon.acks = LateAcks(w, 0.1)
    w.fail_over()
    w.rig.sender.send(msgs("s", 0, 2))
    w.recover()
    w.syphon.drain_all(max_wait=0)  # acknowledged (0.1 s later): acknowledgements reach the book
    w.rig.sender.send(msgs("s", 2, 1))  # back: s-2 direct
    w.rig.sender.send(msgs("t", 0, 1))
    w.fail_over()
    w.rig.sender.send(msgs("s", 3, 1))
    w.recover()
    w.syphon.acks = LateAcks(w, 3600.0)  # the syphon passes markers, its acknowledgements never come
    w.syphon.drain_all(max_wait=0)
    w.rig.sender.send(msgs("t", 1, 1))  # the entity is back (its probe)
    start = w.clock.monotonic()
    w.rig.sender.send(msgs("s", 4, 1))
    waited = w.clock.monotonic() - start
    assert RETURN_WAIT <= waited <= RETURN_WAIT + 1.0, waited
    assert w.book.held("orders", "s") is not None  # still held: s-4 went behind its marker
    w.clock.advance(60)  # no acknowledgement for ACKS_LIVE: the next call does not wait
    start = w.clock.monotonic()
    w.rig.sender.send(msgs("s", 5, 1))
    assert w.clock.monotonic() - start < RETURN_WAIT
    w.syphon.close()
