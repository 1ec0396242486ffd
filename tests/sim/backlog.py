"""The simulation's backlog queues: peek-lock with the service's semantics (servicebus_local/broker.py models them),
on the fake clock, behind the receiver methods the syphon calls (the SDK's ``ServiceBusReceiver`` names).

* sequence numbers from 1; ``receive_messages`` locks the available messages oldest first for ``lock`` seconds;
* ``abandon`` and a lock that runs out make a message available again with its delivery count + 1, and a count
  reaching ``max_delivery_count`` dead-letters it (``MaxDeliveryCountExceeded``) into the queue's dead-letter queue;
* ``defer``: received again only by sequence number (``receive_deferred_messages``), never by ``receive_messages``;
* ``peek_messages`` shows every message from a sequence number on - locked and deferred too - and locks nothing;
* a settle with a lock that is not the message's current one (it ran out, or was settled) raises
  ``MessageLockLostError``.

:class:`SimLane` stands for the syphon's receiver lane (one per queue and sub-queue): each call may be refused,
fail, stall to its deadline on the fake clock, or lose its reply after the service acted (``World.fault``).
Test code only (not picklable, one thread); bounded by the messages the schedule's senders put in the queues.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from azure.servicebus import exceptions as sbe

from servicebus_local.clock import FakeClock
from spark_sb.failover.ordering import marker_of
from spark_sb.message.backlog import from_backlog
from spark_sb.message.outbound import OutboundMessage
from tests.unit.syphon.test_ordered import Delivered

if TYPE_CHECKING:  # pragma: no cover
    from tests.sim.world import World

READY, LOCKED, DEFERRED = "ready", "locked", "deferred"
LOCK_SECONDS = 60.0  # the provisioned backlog queues' lock duration


@dataclass
class Entry:
    """One message in a queue: the sender's translated message, its SDK form (encoded once), where it stands."""

    seq: int
    out: OutboundMessage  # the backlog message as sent (translated, B6)
    line: tuple[str, str] | None  # (entity, session) of the original; None for a marker-less unordered one
    marker: str | None
    sdk: Any = None
    state: str = READY
    count: int = 0  # the service's delivery count (deliveries that ended without a settle)
    locked_until: float = 0.0  # monotonic
    token: str = ""
    reason: str | None = None  # dead-letter reason (in a dead-letter queue)


@dataclass
class Delivery:
    """One lock of a message (a receive): kept for the O7 check."""

    queue: str
    seq: int
    message_id: str
    behind: bool  # an earlier message of its line (same queue) was locked or deferred at the receive
    attempted: bool = False  # the syphon sent it to the primary while it held this lock
    excused: bool = False  # the receive's reply was lost, or a fault cut the delivery short
    idle: bool = False  # it ended raising the delivery count without having been an attempt (O7)
    abandoned: bool = (
        False  # it ended in an abandon (the syphon's choice to raise the count; not a lock run out)
    )


class SimQueue:
    """A backlog queue (or its dead-letter queue, ``dead_letter``) with peek-lock semantics on the fake clock."""

    def __init__(
        self, world: World, name: str, *, dead_letter: bool = False, max_delivery_count: int = 2**31 - 1
    ) -> None:
        self.world = world
        self.clock: FakeClock = world.clock
        self.name = name
        self.dead_letter = dead_letter
        self.max_delivery_count = max_delivery_count
        self.entries: dict[int, Entry] = {}  # seq -> entry; bounded by the schedule's messages
        self.seq = 0
        self.dlq: SimQueue | None = (
            None if dead_letter else SimQueue(world, name, dead_letter=True, max_delivery_count=2**31 - 1)
        )
        self.deliveries: list[Delivery] = []  # every lock taken (O7)
        self._open: dict[str, Delivery] = {}  # token -> its delivery while the lock holds

    # -- the service's side
    def enqueue(self, out: OutboundMessage) -> None:
        original, _ = from_backlog(out)
        marker = marker_of(original)
        self.seq += 1
        line = (original.entity or "", original.session_id or "") if original.entity else None
        self.entries[self.seq] = Entry(self.seq, out, line, marker)

    def _insert_dead(self, e: Entry, reason: str) -> None:
        assert self.dlq is not None
        self.dlq.seq = max(self.dlq.seq, e.seq)
        self.dlq.entries[e.seq] = Entry(e.seq, e.out, e.line, e.marker, e.sdk, READY, e.count, reason=reason)
        self.world.dead_lettered.add(str(e.out.message_id))
        self.world.note(f"{self.name[-1]}: {e.out.message_id} dead-lettered ({reason}, count {e.count})")

    def _unlock(self, e: Entry, *, count: bool = True) -> None:
        d = self._open.pop(e.token, None)
        if count and d is not None and d.behind and not d.attempted and not d.excused:
            d.idle = True  # its delivery count rose, and it was no attempt to move it (O7)
        e.token = ""
        if count:
            e.count += 1
        e.state = READY
        if count and not self.dead_letter and e.count >= self.max_delivery_count:
            del self.entries[e.seq]
            self._insert_dead(e, "MaxDeliveryCountExceeded")

    def tick(self) -> None:
        """Locks that ran out: the messages are available again (count + 1)."""
        now = self.clock.monotonic()
        for e in list(self.entries.values()):
            if e.state == LOCKED and e.locked_until <= now:
                was_deferred = e.token.startswith("d")
                self._unlock(e)
                if was_deferred:
                    e.state = DEFERRED

    def _lock(self, e: Entry, before: set[str], *, by_sequence: bool = False) -> Delivered:
        if e.sdk is None:
            e.sdk = self.world.encoded(e.out)
        now = self.clock.monotonic()
        self.world.locks += 1
        e.state = LOCKED
        e.locked_until = now + LOCK_SECONDS
        e.token = f"{'d' if by_sequence else 'l'}{self.world.locks}"
        # held back: an earlier message of its line is in the queue, not taken by this same call (``before``)
        behind = e.line is not None and any(
            o.line == e.line and o.seq < e.seq and (o.state != LOCKED or o.token in before)
            for o in self.entries.values()
        )
        d = Delivery(self.name, e.seq, str(e.out.message_id), behind)
        self.deliveries.append(d)
        self._open[e.token] = d
        self.world.open_deliveries[e.token] = d
        self.world.last_delivery[d.message_id] = d  # a send to the primary now is this delivery's attempt
        skew = self.world.executor_skew
        msg = Delivered(e.sdk, e.seq, self.clock.now() + timedelta(seconds=LOCK_SECONDS + skew), e.count)
        msg.lock_token = e.token
        if e.reason is not None:
            msg.dead_letter_reason = e.reason  # type: ignore[attr-defined]
        return msg

    def op(self, what: str, *ids: Any) -> None:
        """Record an operation when the world keeps an operation log (debugging a seed: ``World.oplog``)."""
        if self.world.oplog is not None:
            self.world.oplog.append(
                f"[{self.clock.monotonic() - 1000:7.1f}] {self.name[-1]}{'/DLQ' if self.dead_letter else ''} {what} {list(ids)}"
            )

    def _entry(self, msg: Any) -> Entry:
        """The entry a settle names by its lock; MessageLockLostError when that lock is gone."""
        self.tick()
        e = self.entries.get(int(msg.sequence_number))
        if e is None or e.state != LOCKED or e.token != msg.lock_token:
            raise sbe.MessageLockLostError(message="the lock supplied is invalid (expired or settled)")
        return e

    # -- the receiver's methods (SDK names)
    def receive_messages(
        self, max_message_count: int | None = 1, max_wait_time: float | None = None
    ) -> list[Any]:
        self.tick()
        out = []
        before = set(self._open)
        for seq in sorted(self.entries):
            e = self.entries[seq]
            if e.state != READY:
                continue
            out.append(self._lock(e, before))
            if len(out) >= (max_message_count or 1):
                break
        self.op("receive", *(m.message_id for m in out))
        if not out and max_wait_time:
            self.clock.advance(min(float(max_wait_time), 1.0))  # an empty receive waits (bounded)
        return out

    def peek_messages(self, max_message_count: int = 1, *, sequence_number: int = 0, **_: Any) -> list[Any]:
        self.tick()
        out = []
        for seq in sorted(self.entries):
            if seq < sequence_number:
                continue
            e = self.entries[seq]
            if e.sdk is None:
                e.sdk = self.world.encoded(e.out)
            msg = Delivered(e.sdk, e.seq, None, e.count)  # type: ignore[arg-type]
            msg.lock_token = None  # type: ignore[assignment]
            # ServiceBusMessageState: 1 deferred, 0 active
            msg.state = 1 if e.state == DEFERRED else 0  # type: ignore[attr-defined]
            if e.reason is not None:
                msg.dead_letter_reason = e.reason  # type: ignore[attr-defined]
            out.append(msg)
            if len(out) >= max_message_count:
                break
        self.op(f"peek from {sequence_number}", *(m.message_id for m in out))
        return out

    def receive_deferred_messages(self, sequence_numbers: Any, **_: Any) -> list[Any]:
        self.tick()
        seqs = [sequence_numbers] if isinstance(sequence_numbers, int) else list(sequence_numbers)
        found = []
        for s in seqs:
            e = self.entries.get(int(s))
            if e is None or e.state != DEFERRED:
                raise sbe.ServiceBusError(
                    message=f"Failed to retrieve deferred message with sequence number {s}."
                )
            found.append(e)
        self.op("receive deferred", *(e.out.message_id for e in found))
        before = set(self._open)
        return [self._lock(e, before, by_sequence=True) for e in found]

    def complete_message(self, msg: Any) -> None:
        self.op("complete", msg.message_id)
        e = self._entry(msg)
        self._open.pop(e.token, None)
        del self.entries[e.seq]

    def abandon_message(self, msg: Any, **_: Any) -> None:
        self.op("abandon", msg.message_id)
        e = self._entry(msg)
        deferred = e.token.startswith("d")
        d = self._open.get(e.token)
        if d is not None:
            d.abandoned = True
        self._unlock(e)
        if deferred and e.seq in self.entries:
            e.state = DEFERRED

    def defer_message(self, msg: Any, **_: Any) -> None:
        self.op("defer", msg.message_id)
        e = self._entry(msg)
        self._open.pop(e.token, None)
        e.token = ""
        e.state = DEFERRED

    def dead_letter_message(
        self, msg: Any, reason: str | None = None, error_description: str | None = None, **_: Any
    ) -> None:
        self.op(f"dead-letter ({reason})", msg.message_id)
        e = self._entry(msg)
        if self.dead_letter:
            raise sbe.ServiceBusError(
                message="A message in a dead-letter queue cannot be dead-lettered again."
            )
        self._open.pop(e.token, None)
        del self.entries[e.seq]
        self._insert_dead(e, reason or "")

    def renew_message_lock(self, msg: Any, **_: Any) -> Any:
        e = self._entry(msg)
        e.locked_until = self.clock.monotonic() + LOCK_SECONDS
        return self.clock.now() + timedelta(seconds=LOCK_SECONDS)

    # -- views
    def active(self) -> int:
        self.tick()
        return len(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


@dataclass
class SimLane:
    """The syphon's receiver lane of one (queue, dead_letter) in one worker's syphon: every call may meet a fault
    (``World.fault``). ``generation`` changes when the syphon replaces its receivers (a reset connection)."""

    world: World
    queue: str
    dead_letter: bool
    receiver: SimQueue
    generation: int = 0
    calls: list[str] = field(default_factory=list)

    def call(self, fn: Callable[[Any], Any], timeout: float) -> Any:
        fault = self.world.fault("lane", self.queue)
        ctx = SimpleNamespace(receiver=self.receiver)
        if fault is None:
            return fn(ctx)
        self.world.faults_met += 1
        if fault == "lost":  # the service acted, the answer never came: its locks stay taken
            before = set(self.world.open_deliveries)
            fn(ctx)
            for token in set(self.world.open_deliveries) - before:
                self.world.open_deliveries[token].excused = True
            self.clock_advance(timeout)
            raise sbe.OperationTimeoutError(message="the answer was lost")
        if fault == "stall":
            self.clock_advance(timeout)
            from spark_sb.wire.lane import DeadlineExceeded

            raise DeadlineExceeded(f"no answer within {timeout} s")
        raise sbe.ServiceBusConnectionError(message="connection refused")

    def clock_advance(self, seconds: float) -> None:
        self.world.clock.advance(min(seconds, 35.0))

    def reset(self, why: str) -> None:
        self.generation += 1
