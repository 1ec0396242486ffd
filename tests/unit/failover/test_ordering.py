"""The ordering rule (``ordering: session``, SPEC O1/O2; spark_sb/failover/ordering.py): pin, mark, return only when
drained, no hop - and a model of senders, backlog queues, a syphon and outages, run over many random interleavings,
in which every session reaches the primary in order (and, without the return rule, does not)."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

import pytest

from spark_sb.failover.ordering import Held, QueueUnavailableError, SessionBook, pinned_queue

QUEUES = ["b/0", "b/1", "b/2"]


def _all(_: str) -> bool:
    return True


def test_a_session_not_held_goes_where_its_entity_goes_and_is_pinned_when_diverted() -> None:
    book = SessionBook()
    assert book.route("orders", "s1", entity_failed_over=False) is None
    queue = book.diverted("orders", "s1", QUEUES, _all)
    assert queue == pinned_queue("s1", QUEUES, _all)
    assert book.route("orders", "s1", entity_failed_over=True) == queue
    assert (
        book.route("orders", "s1", entity_failed_over=False) == queue
    )  # healthy again, still behind its messages
    assert (
        book.diverted("orders", "s1", QUEUES, lambda q: q != QUEUES[(QUEUES.index(queue) + 1) % 3]) == queue
    )


def test_the_pinned_queue_is_the_same_in_every_process_and_skips_queues_pulled_at_pin_time() -> None:
    pins = {s: pinned_queue(s, QUEUES, _all) for s in (f"s{i}" for i in range(30))}
    assert set(pins.values()) == set(QUEUES)  # spread over the queues
    assert pins == {s: pinned_queue(s, QUEUES, _all) for s in pins}  # deterministic
    first = pins["s0"]
    assert first is not None
    other = pinned_queue("s0", QUEUES, lambda q: q != first)
    assert other is not None and other != first
    assert pinned_queue("s0", QUEUES, lambda q: False) is None


def test_a_held_session_returns_only_when_its_last_marker_is_acknowledged_and_nothing_followed_it() -> None:
    book = SessionBook()
    queue = book.diverted("e", "s", QUEUES, _all)
    assert book.route("e", "s", False) == queue  # no marker yet
    marker = book.close_call("e", "s", 1)
    assert marker is not None
    assert book.close_call("e", "t", 0) is None  # not held: no marker
    assert book.route("e", "s", False) == queue  # not acknowledged yet
    book.acknowledged("e", "s", marker)
    assert book.route("e", "s", True) == queue  # the entity is failed over: stays
    assert book.route("e", "s", False) is None  # drained and healthy: released
    assert book.held("e", "s") is None and len(book) == 0


def test_a_late_backlog_send_after_the_marker_keeps_the_session_held_until_a_newer_marker_is_acknowledged() -> (
    None
):
    book = SessionBook()
    queue = book.diverted("e", "s", QUEUES, _all)
    first = book.close_call("e", "s", 1)
    assert first is not None
    assert book.diverted("e", "s", QUEUES, _all) == queue  # another call diverts one more message
    book.acknowledged("e", "s", first)  # the syphon passes the first marker meanwhile
    assert book.route("e", "s", False) == queue  # the late message is behind it: not released
    second = book.close_call("e", "s", 1)
    assert second is not None and second != first
    book.acknowledged("e", "s", first)  # a pass that started before the second marker: still held
    assert book.route("e", "s", False) == queue
    book.acknowledged("e", "s", second)
    assert book.route("e", "s", False) is None


def test_a_held_sessions_queue_failing_fails_that_session_only() -> None:
    book = SessionBook()
    a = book.diverted("e", "a", QUEUES, _all)
    others = [s for s in (f"x{i}" for i in range(20)) if pinned_queue(s, QUEUES, _all) != a]
    with pytest.raises(QueueUnavailableError, match="'a'.*ordering: session"):
        book.diverted("e", "a", QUEUES, lambda q: q != a)
    assert book.diverted("e", others[0], QUEUES, lambda q: q != a) != a  # another session goes on


def test_two_executors_share_a_session_through_its_record() -> None:
    first, second = SessionBook(), SessionBook()
    queue = first.diverted("e", "s", QUEUES, _all)
    marker = first.close_call("e", "s", 1)
    assert marker is not None
    record = first.held("e", "s")
    assert record == Held(queue, marker, 0, None)
    second.restore("e", "s", record)  # the next micro-batch's task, on another executor
    assert second.route("e", "s", False) == queue
    second.acknowledged("e", "s", marker)
    assert second.route("e", "s", False) is None


# ---------------------------------------------------------------------------------------------------------------
# A model: senders, FIFO backlog queues, a syphon moving one message at a time, outages; random interleavings.


@dataclass
class World:
    book: SessionBook
    release_early: bool  # the control: release a session as soon as its entity is healthy (no R3)
    rng: random.Random
    failed_over: bool = False
    queues: dict[str, deque[tuple[str, str, object]]] = field(default_factory=dict)
    primary: dict[str, list[int]] = field(default_factory=dict)
    produced: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.queues = {q: deque() for q in QUEUES}

    def call(self, sessions: list[str]) -> None:
        """One sender call: a few messages of some sessions, in order; markers at its end."""
        touched: dict[str, int] = {}
        for s in sessions:
            for _ in range(self.rng.randint(1, 3)):
                n = self.produced.get(s, 0)
                self.produced[s] = n + 1
                queue = self.book.route("e", s, self.failed_over)
                if self.release_early and queue is not None and not self.failed_over:
                    self.book._held.pop(("e", s), None)  # noqa: SLF001 - the broken rule, for the control
                    queue = None
                if queue is None and not self.failed_over:
                    self.primary.setdefault(s, []).append(n)
                    continue
                queue = self.book.diverted("e", s, QUEUES, _all)
                self.queues[queue].append(("msg", s, n))
                touched[s] = touched.get(s, 0) + 1
        for s, n in touched.items():
            marker = self.book.close_call("e", s, n)
            if marker is not None:
                queue = self.book.held("e", s)
                assert queue is not None
                self.queues[queue.queue].append(("marker", s, marker))

    def syphon_step(self) -> None:
        """The syphon moves the head of one queue (one session's messages in queue order)."""
        queue = self.rng.choice(QUEUES)
        if not self.queues[queue]:
            return
        kind, s, value = self.queues[queue].popleft()
        if kind == "marker":
            assert isinstance(value, str)
            self.book.acknowledged("e", s, value)
        else:
            assert isinstance(value, int)
            self.primary.setdefault(s, []).append(value)

    def run(self, steps: int) -> None:
        sessions = [f"s{i}" for i in range(6)]
        for _ in range(steps):
            roll = self.rng.random()
            if roll < 0.05:
                self.failed_over = not self.failed_over
            elif roll < 0.5:
                self.call(self.rng.sample(sessions, self.rng.randint(1, 3)))
            else:
                self.syphon_step()
        self.failed_over = False
        while any(self.queues.values()):
            self.syphon_step()

    def out_of_order(self) -> list[str]:
        return [s for s, got in self.primary.items() if got != sorted(got)]


@pytest.mark.parametrize("seed", range(40))
def test_every_session_reaches_the_primary_in_order_through_any_interleaving(seed: int) -> None:
    world = World(SessionBook(), release_early=False, rng=random.Random(seed))
    world.run(400)
    assert world.out_of_order() == []
    assert {s: len(v) for s, v in world.primary.items()} == world.produced  # nothing lost, nothing twice


def test_without_the_return_rule_some_session_is_overtaken() -> None:
    broken = 0
    for seed in range(40):
        world = World(SessionBook(), release_early=True, rng=random.Random(seed))
        world.run(400)
        broken += bool(world.out_of_order())
    assert broken > 0  # the model can fail: releasing on health alone lets new messages overtake old ones


# ---------------------------------------------------------------------------------------------------------------
# The same with calls that overlap: threads whose calls divert, send and close at different steps (a late backlog
# send, a marker issued while another call of the session still sends), unsent primary batches (a line a call
# started on the primary stays there for the call; its open batch is diverted whole when its entity fails over).


class EarlyBook(SessionBook):
    """The control: a session is released as soon as its newest marker is acknowledged, calls still open or not."""

    def route(self, entity: str, session: str, entity_failed_over: bool) -> str | None:
        record = self.held(entity, session)
        acknowledged = (
            record is not None and record.marker is not None and record.acknowledged == record.marker
        )
        if record is not None and acknowledged and not entity_failed_over:
            self.restore(entity, session, Held(record.queue, record.marker, 0, record.acknowledged))
        return super().route(entity, session, entity_failed_over)


@dataclass
class Call:
    thread: int
    todo: list[tuple[str, int]]
    outbox: list[tuple[str | None, str, int]] = field(default_factory=list)  # (queue or None: primary, s, n)
    diverted: dict[str, int] = field(default_factory=dict)
    flushed: bool = False


@dataclass
class Overlapping:
    book: SessionBook
    rng: random.Random
    failed_over: bool = False
    queues: dict[str, deque[tuple[str, str, object]]] = field(default_factory=dict)
    primary: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # session -> (thread, n)
    produced: dict[tuple[int, str], int] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.queues = {q: deque() for q in QUEUES}

    def start(self, thread: int, sessions: list[str]) -> None:
        if any(c.thread == thread for c in self.calls):
            return  # one call at a time per thread
        todo = []
        for s in sessions:
            for _ in range(self.rng.randint(1, 3)):
                n = self.produced.get((thread, s), 0)
                self.produced[(thread, s)] = n + 1
                todo.append((s, n))
        self.calls.append(Call(thread, todo))

    def _divert(self, call: Call, s: str, n: int) -> None:
        queue = self.book.diverted("e", s, QUEUES, _all)
        call.diverted[s] = call.diverted.get(s, 0) + 1
        call.outbox.append((queue, s, n))

    def step(self, call: Call) -> None:
        if call.todo:  # route the next message
            s, n = call.todo.pop(0)
            unsent = [i for i, (q, s2, _) in enumerate(call.outbox) if q is None and s2 == s]
            if self.failed_over:
                for i in unsent:  # the open primary batch is diverted whole, in order
                    _, _, m = call.outbox[i]
                    call.outbox[i] = (self.book.diverted("e", s, QUEUES, _all), s, m)
                    call.diverted[s] = call.diverted.get(s, 0) + 1
                self._divert(call, s, n)
            elif unsent and s not in call.diverted:
                call.outbox.append((None, s, n))  # stays on the primary with its unsent message
            elif self.book.route("e", s, False) is not None:
                self._divert(call, s, n)
            else:
                call.outbox.append((None, s, n))
        elif not call.flushed:  # its batches go out
            for queue, s, n in call.outbox:
                if queue is None:
                    self.primary.setdefault(s, []).append((call.thread, n))
                else:
                    self.queues[queue].append(("msg", s, (call.thread, n)))
            call.flushed = True
        else:  # its end: markers behind its messages
            for s, count in call.diverted.items():
                marker = self.book.close_call("e", s, count)
                record = self.book.held("e", s)
                if marker is not None and record is not None:
                    self.queues[record.queue].append(("marker", s, marker))
            self.calls.remove(call)

    def syphon_step(self) -> None:
        queue = self.rng.choice(QUEUES)
        if self.queues[queue]:
            kind, s, value = self.queues[queue].popleft()
            if kind == "marker":
                assert isinstance(value, str)
                self.book.acknowledged("e", s, value)
            else:
                assert isinstance(value, tuple)
                self.primary.setdefault(s, []).append(value)

    def run(self, steps: int) -> None:
        sessions = [f"s{i}" for i in range(4)]
        for _ in range(steps):
            roll = self.rng.random()
            if roll < 0.04:
                self.failed_over = not self.failed_over
            elif roll < 0.2:
                self.start(self.rng.randrange(3), self.rng.sample(sessions, self.rng.randint(1, 2)))
            elif roll < 0.6 and self.calls:
                self.step(self.rng.choice(self.calls))
            else:
                self.syphon_step()
        while self.calls:
            self.step(self.calls[0])
        while any(self.queues.values()):
            self.syphon_step()

    def out_of_order(self) -> list[tuple[int, str]]:
        bad = []
        for s, got in self.primary.items():
            for thread in range(3):
                mine = [n for t, n in got if t == thread]
                if mine != sorted(mine):
                    bad.append((thread, s))
        return bad


@pytest.mark.parametrize("seed", range(40))
def test_overlapping_calls_of_three_threads_keep_each_threads_order(seed: int) -> None:
    world = Overlapping(SessionBook(), random.Random(seed))
    world.run(600)
    assert world.out_of_order() == []
    counts = {
        (t, s): len([x for x in got if x[0] == t]) for s, got in world.primary.items() for t in range(3)
    }
    assert {k: v for k, v in counts.items() if v} == world.produced  # nothing lost, nothing twice


def test_without_counting_open_calls_some_threads_session_is_overtaken() -> None:
    broken = 0
    for seed in range(40):
        world = Overlapping(EarlyBook(), random.Random(seed))
        world.run(600)
        broken += bool(world.out_of_order())
    assert (
        broken > 0
    )  # the model can fail: a marker acknowledged while another call still sends releases early
