"""The syphon's ordered drain (``ordering: session`` / ``entity``; spark_sb/syphon/lines.py and Syphon in
spark_sb/syphon/mover.py) on a fake clock: a fake backlog queue with peek-lock semantics (sequence numbers, locks
that run out, abandon puts a message back in its place), the fake transport as the primary, and paired senders of
the same process sharing the registry's book. What reaches the primary entity is what a session receiver sees."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceivedMessage
from azure.servicebus._common.utils import transform_outbound_messages
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport

from servicebus_local.clock import FakeClock
from spark_sb.failover.ordering import WHOLE_ENTITY, pinned_queue, return_marker
from spark_sb.message.backlog import to_backlog
from spark_sb.message.outbound import OutboundMessage
from spark_sb.syphon.lines import RECEIVE_FAILURE_PAUSE
from spark_sb.syphon.mover import Syphon
from spark_sb.syphon.rules import SyphonOutcome
from spark_sb.wire.transport import PRIMARY, SECONDARY, Target
from tests.unit.sender.rig import QUEUES, Rig, conn_error, make_config

LOCK = timedelta(seconds=60)


# ------------------------------------------------------------------------------------------------- fakes
def received(msg: OutboundMessage) -> ServiceBusReceivedMessage:
    out = transform_outbound_messages(
        msg.to_sdk(), ServiceBusMessage, PyamqpTransport.to_outgoing_amqp_message
    )
    return ServiceBusReceivedMessage.from_bytes(bytes(PyamqpTransport.encode_message(out)))


class Delivered:
    """A received (or peeked) message as the syphon sees it: the SDK's decoding, the broker's fields set by the fake
    queue."""

    def __init__(
        self,
        inner: ServiceBusReceivedMessage,
        sequence: int,
        locked_until: datetime | None,
        count: int,
        token: str = "",
        *,
        by_sequence: bool = False,
        state: int = 0,
    ) -> None:
        self._inner = inner
        self.sequence_number = sequence
        self.locked_until_utc = locked_until
        self.delivery_count = count
        self.lock_token = token
        self._is_deferred_message = by_sequence
        self.state = state

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@dataclass
class Entry:
    msg: ServiceBusReceivedMessage
    deliveries: int = 0  # the service's delivery count: abandons and lock expiries
    locked_until: datetime | None = None
    token: str = ""
    deferred: bool = False


class LockLost(Exception):
    pass


class FakeQueue:
    """A backlog queue with peek-lock semantics on the fake clock, as the local namespace has them
    (servicebus_local/broker.py): a receive locks available messages in sequence order; abandon and a lock that runs
    out count a delivery; defer keeps a message in its place, invisible to receives, its count unchanged; a peek shows
    every message present from a sequence number on, at most the count asked (locked ones as active, deferred ones
    as deferred while unlocked); receive-by-sequence locks deferred ones. Sequence numbers are gapless and
    increasing, from 1000 (the service's rule; a peek from 1 finds the oldest). Settling needs the current lock. ``skew``: the service's clock is this much behind the executor's
    (``locked_until_utc`` is in service time). Fed from ``source`` (what senders put there)."""

    def __init__(
        self, clock: FakeClock, source: Callable[[], list[OutboundMessage]], skew: timedelta = timedelta(0)
    ) -> None:
        self.clock = clock
        self.source = source
        self.skew = skew
        self.taken = 0
        self.entries: dict[int, Entry] = {}
        self.fail_receives = 0  # receives that lock messages, then fail (the answer is lost)
        self.fail_abandons: set[str] = set()  # message ids whose abandon fails (they stay locked)
        self.receives = 0  # receive calls that returned messages
        self.delivered = 0  # messages handed out (receive and receive-by-sequence)
        self.peeks = 0
        self.peeked = 0  # messages the peeks listed
        #: Called with what a receive returns, before the syphon gets it (another worker acting meanwhile).
        self.on_receive: Callable[[list[Delivered]], None] | None = None
        self._serial = 0

    def _ingest(self) -> None:
        new = self.source()[self.taken :]
        for i, m in enumerate(new):  # sequence numbers only grow
            self.entries[self.taken + i + 1000] = Entry(received(m))
        self.taken += len(new)
        now = self.clock.now()
        for e in self.entries.values():
            if e.locked_until is not None and e.locked_until <= now:  # the lock ran out: a delivery counted
                e.locked_until = None
                e.deliveries += 1

    def _lock(self, seq: int, e: Entry, *, by_sequence: bool = False) -> Delivered:
        self._serial += 1
        e.locked_until = self.clock.now() + LOCK
        e.token = f"lock-{seq}-{self._serial}"
        self.delivered += 1
        return Delivered(
            e.msg, seq, e.locked_until - self.skew, e.deliveries, e.token, by_sequence=by_sequence
        )

    def receive_messages(self, max_message_count: int, max_wait_time: float) -> list[Delivered]:
        self._ingest()
        out = []
        for seq in sorted(self.entries):
            e = self.entries[seq]
            if e.locked_until is not None or e.deferred:
                continue
            out.append(self._lock(seq, e))
            if len(out) == max_message_count:
                break
        if self.fail_receives and out:
            self.fail_receives -= 1
            raise ConnectionError("the receive's answer was lost")
        if out:
            self.receives += 1
        if self.on_receive is not None:
            self.on_receive(out)
        return out

    def peek_messages(
        self, max_message_count: int = 1, *, sequence_number: int = 0, timeout: float | None = None
    ) -> list[Delivered]:
        self._ingest()
        self.peeks += 1
        out = []
        for seq in sorted(self.entries):
            e = self.entries[seq]
            if seq >= sequence_number:
                state = 1 if e.deferred and e.locked_until is None else 0
                out.append(Delivered(e.msg, seq, None, e.deliveries, state=state))
            if len(out) == max_message_count:
                break
        self.peeked += len(out)
        return out

    def receive_deferred_messages(
        self, sequence_numbers: list[int], *, timeout: float | None = None
    ) -> list[Delivered]:
        self._ingest()
        found = []
        for seq in sequence_numbers:
            e = self.entries.get(seq)
            if e is None or not e.deferred or e.locked_until is not None:
                raise LookupError(f"Failed to retrieve deferred message with sequence number {seq}.")
            found.append((seq, e))
        return [self._lock(seq, e, by_sequence=True) for seq, e in found]

    def _held(self, m: Delivered) -> Entry:
        self._ingest()
        e = self.entries.get(m.sequence_number)
        if e is None or e.locked_until is None or e.token != m.lock_token:
            raise LockLost(f"the lock of {m.sequence_number} was lost")
        return e

    def complete_message(self, m: Delivered) -> None:
        self._held(m)
        del self.entries[m.sequence_number]

    def abandon_message(self, m: Delivered) -> None:
        if m.message_id in self.fail_abandons:
            self.fail_abandons.discard(m.message_id)
            raise ConnectionError("abandon lost")
        e = self._held(m)
        e.locked_until = None
        e.deliveries += 1

    def defer_message(self, m: Delivered) -> None:
        e = self._held(m)
        e.locked_until = None
        e.deferred = True

    def dead_letter_message(self, m: Delivered, *, reason: str, error_description: str) -> None:
        self._held(m)
        del self.entries[m.sequence_number]

    def counts(self) -> dict[str, int]:
        """Delivery count per message id (what is still in the queue)."""
        self._ingest()
        return {str(e.msg.message_id): e.deliveries for e in self.entries.values()}

    def __len__(self) -> int:
        self._ingest()
        return len(self.entries)


class FakeLane:
    def __init__(self, queue: str, receiver: FakeQueue) -> None:
        self.queue = queue
        self.dead_letter = False
        self.generation = 0
        self.receiver = receiver

    def call(self, fn: Callable[[Any], Any], timeout: float) -> Any:
        return fn(SimpleNamespace(receiver=self.receiver))


class World:
    """Paired senders (fake transport) and a Syphon of one process: the backlog queues are fed by the senders'
    backlog sends; the syphon forwards to the same fake transport's primary."""

    def __init__(self, ordering: str = "session", batch_size: int = 100, max_batch: int = 1000) -> None:
        self.rig = Rig(ordering=ordering, failover_interval=0.0)
        self.clock = self.rig.clock
        self.book = self.rig.registry.sessions("primary.servicebus.windows.net")
        config = make_config(ordering=ordering, syphon_batch_size=batch_size)
        self.syphon = Syphon(
            config,
            backlog_queues=QUEUES,
            clock=self.clock,
            healthy_hints={"orders": "healthy"},
            acks=self.book,
        )
        self.queues = {q: FakeQueue(self.clock, self._source(q)) for q in QUEUES}
        self.lanes = {q: FakeLane(q, self.queues[q]) for q in QUEUES}
        self.syphon._primary.close()
        self.syphon._primary = self.rig.transport  # type: ignore[assignment]
        self.syphon._lane = lambda queue, dead_letter: self.lanes[queue]  # type: ignore[assignment,method-assign]
        self.syphon._replace_receiver = lambda *a: None  # type: ignore[method-assign]
        self.rig.transport.max_batch = max_batch

    def worker(self, **config: Any) -> Syphon:
        """Another Python worker's syphon on the same queues, primary and acknowledgements (no process state
        shared with :attr:`syphon`)."""
        other = Syphon(
            make_config(ordering=self.syphon.config.ordering, **config),
            backlog_queues=QUEUES,
            clock=self.clock,
            healthy_hints={"orders": "healthy"},
            acks=self.book,
        )
        lanes = {q: FakeLane(q, self.queues[q]) for q in QUEUES}
        other._primary.close()
        other._primary = self.rig.transport  # type: ignore[assignment]
        other._lane = lambda queue, dead_letter: lanes[queue]  # type: ignore[assignment,method-assign]
        other._replace_receiver = lambda *a: None  # type: ignore[method-assign]
        return other

    def _source(self, queue: str) -> Callable[[], list[OutboundMessage]]:
        return lambda: self.rig.transport.at(SECONDARY, queue)

    def drain(self, max_wait: float = 0.0) -> SyphonOutcome:
        return self.syphon.drain_all(max_wait=max_wait)

    def primary(self) -> list[str]:
        return [m.message_id or "" for m in self.rig.transport.at(PRIMARY, "orders")]

    def per_session(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for i in self.primary():
            s, n = i.rsplit("-", 1)
            out.setdefault(s, []).append(int(n))
        return out

    def fail_over(self) -> None:
        self.rig.transport.fail(conn_error, namespace=PRIMARY)

    def recover(self) -> None:
        self.rig.transport.heal()
        self.clock.advance(31)


def msgs(session: str, start: int, n: int) -> list[OutboundMessage]:
    return [
        OutboundMessage(body=b"x" * 100, session_id=session, message_id=f"{session}-{i}")
        for i in range(start, start + n)
    ]


def queue_of(session: str) -> str:
    queue = pinned_queue(session, QUEUES, lambda _: True)
    assert queue is not None
    return queue


@pytest.fixture
def world() -> Iterator[World]:
    w = World()
    yield w
    w.syphon.close()


# ------------------------------------------------------------------------------------------------- the drain
def test_a_line_moves_in_queue_order_and_its_marker_is_acknowledged_never_forwarded(world: World) -> None:
    world.fail_over()
    world.rig.sender.send(msgs("s", 0, 3) + msgs("t", 0, 2))
    world.recover()
    record = world.book.held("orders", "s")
    assert record is not None and record.marker is not None
    out = world.drain()
    assert world.per_session() == {"s": [0, 1, 2], "t": [0, 1]}
    assert out.markers == 2 and out.forwarded_total == 5
    assert all("return" not in i for i in world.primary())
    held = world.book.held("orders", "s")
    assert held is not None and held.drained
    world.rig.sender.send(msgs("s", 3, 1))
    assert world.primary()[-1] == "s-3" and len(world.book) == 1  # s released; t released at its next message


def test_a_failed_forward_holds_the_rest_of_its_line_back_and_it_comes_back_first() -> None:
    w = World(max_batch=400)  # a few messages per primary batch
    w.fail_over()
    w.rig.sender.send(msgs("s", 0, 12))
    w.recover()
    w.rig.transport.fail(
        conn_error, namespace=PRIMARY, skip=1, count=1
    )  # the second batch to the primary fails
    first = w.drain()
    assert first.abandoned > 0 and w.per_session()["s"] == sorted(w.per_session()["s"])
    w.clock.advance(6)  # the entity's back-off
    w.drain()
    assert w.per_session() == {"s": list(range(12))}
    assert len(w.queues[queue_of("s")]) == 0
    w.syphon.close()


def test_a_held_back_message_whose_abandon_failed_still_comes_first() -> None:
    """The head's abandon fails: it stays locked while the rest of its line is available - the next receive hands
    over s-4 before s-3. Nothing of the line moves until s-3 is back (its lock runs out)."""
    w = World(max_batch=400)
    w.fail_over()
    w.rig.sender.send(msgs("s", 0, 8))
    w.recover()
    w.rig.transport.fail(conn_error, namespace=PRIMARY, skip=1, count=1)
    w.queues[queue_of("s")].fail_abandons.add("s-3")  # the head of what the failure leaves
    w.drain()
    moved = w.per_session()["s"]
    assert moved == [0, 1, 2]
    w.clock.advance(6)
    w.drain()  # s-3 still locked: s-4.. are received and held back
    assert w.per_session()["s"] == [0, 1, 2]
    w.clock.advance(61)  # s-3's lock ran out
    w.drain()
    assert w.per_session() == {"s": list(range(8))}
    w.syphon.close()


def test_without_ordering_the_same_failure_lets_a_later_message_overtake() -> None:
    """The control: the same script with ordering: none moves s-4 before s-3 (so the test above can fail)."""
    w = World(ordering="none", max_batch=400)
    w.rig.transport.fail(conn_error, namespace=PRIMARY)
    w.rig.sender.send(msgs("s", 0, 8))
    w.recover()
    queue = next(q for q in QUEUES if w.rig.transport.at(SECONDARY, q))
    w.rig.transport.fail(conn_error, namespace=PRIMARY, skip=1, count=1)
    w.queues[queue].fail_abandons.add("s-3")
    w.drain()
    w.clock.advance(6)
    w.drain()
    w.clock.advance(61)
    w.drain()
    got = w.per_session()["s"]
    assert sorted(got) == list(range(8)) and got != sorted(got)
    w.syphon.close()


def test_a_message_whose_lock_is_about_to_run_out_holds_its_line(world: World) -> None:
    world.fail_over()
    world.rig.sender.send(msgs("s", 0, 4))
    world.recover()
    queue = world.queues[queue_of("s")]
    real = queue.receive_messages

    def receive(max_message_count: int, max_wait_time: float) -> list[Delivered]:
        out = real(max_message_count, max_wait_time)
        for m in out:
            if m.message_id == "s-1":
                m.locked_until_utc = world.clock.now() + timedelta(seconds=1)  # about to run out
        return out

    queue.receive_messages = receive  # type: ignore[method-assign]
    first = world.syphon.drain_queue(queue_of("s"), max_wait=0, max_batches=1)
    assert first.skipped_lock_expiring == 1 and world.per_session()["s"] == [0]
    queue.receive_messages = real  # type: ignore[method-assign]
    world.drain()
    assert world.per_session() == {"s": [0, 1, 2, 3]}


def test_after_a_failed_receive_the_queue_waits_for_the_locks_it_may_have_taken(world: World) -> None:
    world.fail_over()
    world.rig.sender.send(msgs("s", 0, 3))
    world.recover()
    name = queue_of("s")
    world.queues[name].fail_receives = 1  # locks s-0.. and the answer is lost
    out = world.syphon.drain_queue(name, max_wait=0)
    assert out.errors and world.primary() == []
    world.clock.advance(30)
    assert world.syphon.drain_queue(name, max_wait=0).receive_calls == 0  # left alone: the locks still run
    world.clock.advance(RECEIVE_FAILURE_PAUSE)
    world.syphon.drain_queue(name, max_wait=0)
    assert world.per_session() == {"s": [0, 1, 2]}


def test_with_ordering_none_a_marker_is_dropped_with_a_warning_never_forwarded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = World(ordering="none")
    queue = QUEUES[0]
    w.rig.transport.delivered[Target(SECONDARY, queue)] = [
        to_backlog(m, "orders", w.clock.now())
        for m in [*msgs("s", 0, 1), return_marker("orders", "s", "m1"), *msgs("s", 1, 1)]
    ]
    with caplog.at_level(logging.WARNING):
        out = w.drain()
    assert w.primary() == ["s-0", "s-1"] and out.markers == 1
    assert "ordering: none" in caplog.text
    w.syphon.close()


def test_ordering_entity_drains_every_message_of_an_entity_as_one_line() -> None:
    w = World(ordering="entity", max_batch=400)
    w.fail_over()
    w.rig.sender.send(
        [
            OutboundMessage(body=b"x" * 20, message_id=f"e-{i}", session_id=None if i % 2 else f"s{i}")
            for i in range(10)
        ]
    )
    w.recover()
    w.rig.transport.fail(conn_error, namespace=PRIMARY, skip=1, count=1)
    w.drain()
    w.clock.advance(6)
    w.drain()
    assert w.primary() == [f"e-{i}" for i in range(10)]
    record = w.book.held("orders", WHOLE_ENTITY)
    assert record is not None and record.drained
    w.syphon.close()


# ------------------------------------------------------------------------------------------------- the races
def test_a_syphon_pass_that_starts_before_and_ends_after_a_senders_check(world: World) -> None:
    world.syphon.config = make_config(ordering="session", syphon_batch_size=2)
    world.fail_over()
    world.rig.sender.send(msgs("s", 0, 5))
    world.recover()
    name = queue_of("s")
    pass_ = world.syphon.drain_batches(name, max_wait=0)
    next(pass_)  # the pass has moved s-0, s-1
    world.rig.sender.send(msgs("s", 5, 1))  # the sender's check: no acknowledgement yet - behind them
    assert "s-5" not in world.primary()
    for _ in pass_:  # the pass ends after the check: s-2..4, marker, s-5, its marker
        pass
    world.rig.sender.send(msgs("s", 6, 1))
    assert world.per_session() == {"s": list(range(7))}


def test_new_messages_keep_coming_while_the_syphon_drains_and_no_session_is_overtaken() -> None:
    import random

    rng = random.Random(7)
    w = World(max_batch=400)
    produced: dict[str, int] = {}
    sessions = [f"s{i}" for i in range(8)]
    for step in range(60):
        if step == 10:
            w.fail_over()
        if step == 30:
            w.recover()
        if step > 30 and rng.random() < 0.2:
            w.rig.transport.fail(
                conn_error, namespace=PRIMARY, entity="orders", count=1
            )  # the syphon's sends fail
        batch = []
        for s in rng.sample(sessions, 3):
            n = rng.randint(1, 3)
            batch += msgs(s, produced.get(s, 0), n)
            produced[s] = produced.get(s, 0) + n
        w.rig.sender.send(batch)
        if step > 30:
            w.drain()
            w.clock.advance(6)
    w.rig.transport.heal()
    for _ in range(5):
        w.clock.advance(70)
        w.drain()
    assert w.per_session() == {s: list(range(n)) for s, n in produced.items()}
    assert all(len(q) == 0 for q in w.queues.values())
    w.syphon.close()
