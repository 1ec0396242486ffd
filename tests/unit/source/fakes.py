"""A fake Service Bus entity for the source's protocol (unit tests and tests/sim/source_world.py): sequence numbers,
states (active, locked, deferred), locks that lapse on the fake clock, delivery counts, MaxDeliveryCount
dead-lettering, delete by number failing the whole request with NotFound, peek of every state.

:class:`FakeLink` is an :class:`~spark_sb.source.transport.EntityLink`, :class:`FakePeeker` a
:class:`~spark_sb.source.transport.Peeker`. ``entity.hook(op, phase, link)`` runs before (``phase="before"``:
raising means nothing happened) and after (``"after"``: raising loses the reply of what happened) every call;
``op`` is the method's name, ``"read"`` for an executor's peek. Test code: one thread; bounded by the test.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from servicebus_local.clock import FakeClock
from spark_sb.source.transport import ACTIVE, DEFERRED, EntityCounts, NotFound, Peeked, Received

LOCKED = 9  # a fake-only state: peek shows it as ACTIVE

Hook = Callable[[str, str, "FakeLink | None"], None]


@dataclass
class FakeMessage:
    seq: int
    message_id: str
    body: bytes
    enqueued_time_utc: datetime
    state: int = ACTIVE
    delivery_count: int = 0
    locked_until: float = 0.0
    lock: tuple[int, int] | None = None  # (link id, lock number)

    @property
    def size(self) -> int:
        return len(self.body) + 50


@dataclass(frozen=True)
class Handle:
    link: int
    lock: int
    seq: int


@dataclass
class FakeEntity:
    clock: FakeClock
    name: str = "orders"
    lock_duration: float = 30.0
    max_delivery_count: int = 10
    created_at: str = "2026-01-01T00:00:00+00:00"
    hook: Hook | None = None
    messages: dict[int, FakeMessage] = field(default_factory=dict)  # by number, in number order
    dead_letters: list[FakeMessage] = field(default_factory=list)
    calls: Counter[str] = field(default_factory=Counter)
    #: Every delivery: (sequence number, the receiving link's tag).
    deliveries: list[tuple[int, object]] = field(default_factory=list)
    next_seq: int = 1
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def send(self, body: bytes | str = b"x", message_id: str | None = None) -> int:
        seq = self.next_seq
        self.next_seq += 1
        data = body.encode() if isinstance(body, str) else body
        self.messages[seq] = FakeMessage(seq, message_id or f"m{seq}", data, self.clock.now())
        return seq

    def link(self, tag: object = None) -> FakeLink:
        return FakeLink(self, next(self._ids), tag)

    def peeker(self) -> FakePeeker:
        return FakePeeker({self.name: self})

    # -- state ---------------------------------------------------------------------------------------------------
    def expire(self) -> None:
        now = self.clock.monotonic()
        for m in self.messages.values():
            if m.state == LOCKED and now >= m.locked_until:
                m.state, m.lock = ACTIVE, None

    def states(self) -> Counter[str]:
        self.expire()
        names = {ACTIVE: "active", LOCKED: "locked", DEFERRED: "deferred"}
        out = Counter(names[m.state] for m in self.messages.values())
        out["dead_lettered"] = len(self.dead_letters)
        return out

    def locked(self) -> list[int]:
        self.expire()
        return [s for s, m in self.messages.items() if m.state == LOCKED]

    def _call(self, op: str, phase: str, link: FakeLink | None) -> None:
        if phase == "before":
            self.calls[op] += 1
        if self.hook is not None:
            self.hook(op, phase, link)

    def peek(self, from_seq: int, count: int) -> list[Peeked]:
        self.expire()
        out = []
        for seq in sorted(s for s in self.messages if s >= from_seq)[:count]:
            m = self.messages[seq]
            out.append(Peeked(seq, DEFERRED if m.state == DEFERRED else ACTIVE, m))
        return out


class FakeLink:
    """A peek-lock receive link (prefetch 0). Its locks are its own: a handle of another link is a lost lock."""

    def __init__(self, entity: FakeEntity, ident: int, tag: object) -> None:
        self.entity = entity
        self.ident = ident
        self.tag = tag
        self.closed = False
        self._locks = itertools.count(1)

    def _valid(self, h: Handle) -> FakeMessage | None:
        m = self.entity.messages.get(h.seq)
        ok = (
            not self.closed
            and h.link == self.ident
            and m is not None
            and m.state == LOCKED
            and m.lock == (h.link, h.lock)
            and self.entity.clock.monotonic() < m.locked_until
        )
        return m if ok else None

    def receive(self, max_count: int, wait: float, timeout: float) -> list[Received]:
        e = self.entity
        e._call("receive", "before", self)
        e.expire()
        if not any(m.state == ACTIVE for m in e.messages.values()):
            e.clock.advance(wait)
            e.expire()
        out: list[Received] = []
        now = e.clock.monotonic()
        for seq in [s for s, m in e.messages.items() if m.state == ACTIVE]:
            if len(out) >= max_count:
                break
            m = e.messages[seq]
            if m.delivery_count >= e.max_delivery_count:
                e.dead_letters.append(e.messages.pop(seq))
                continue
            m.delivery_count += 1
            lock = next(self._locks)
            m.state, m.lock, m.locked_until = LOCKED, (self.ident, lock), now + e.lock_duration
            e.deliveries.append((seq, self.tag))
            out.append(Received(seq, m.size, m.delivery_count, Handle(self.ident, lock, seq), m.locked_until))
        e._call("receive", "after", self)
        return out

    def renew(self, held: Sequence[Received], timeout: float) -> dict[int, float]:
        e = self.entity
        e._call("renew", "before", self)
        out = {}
        for r in held:
            m = self._valid(r.handle)
            if m is not None:
                m.locked_until = e.clock.monotonic() + e.lock_duration
                out[r.seq] = m.locked_until
        e._call("renew", "after", self)
        return out

    def defer(self, held: Sequence[Received], timeout: float) -> set[int]:
        return self._settle("defer", held)

    def complete(self, held: Sequence[Received], timeout: float) -> set[int]:
        return self._settle("complete", held)

    def _settle(self, op: str, held: Sequence[Received]) -> set[int]:
        e = self.entity
        e._call(op, "before", self)
        done = set()
        for r in held:
            m = self._valid(r.handle)
            if m is None:
                continue
            if op == "defer":
                m.state, m.lock = DEFERRED, None
            else:
                del e.messages[r.seq]
            done.add(r.seq)
        e._call(op, "after", self)
        return done

    def delete(self, seqs: Sequence[int], timeout: float) -> None:
        e = self.entity
        e._call("delete", "before", self)
        if any(s not in e.messages or e.messages[s].state != DEFERRED for s in seqs):
            raise NotFound(f"not deferred among {list(seqs)[:5]}")
        for s in seqs:
            del e.messages[s]
        e._call("delete", "after", self)

    def peek(self, from_seq: int, count: int, timeout: float) -> list[Peeked]:
        self.entity._call("peek", "before", self)
        out = self.entity.peek(from_seq, count)
        self.entity._call("peek", "after", self)
        return out

    def counts(self, timeout: float) -> EntityCounts:
        e = self.entity
        e._call("counts", "before", self)
        s = e.states()
        total = len(e.messages) + len(e.dead_letters)
        # as the service (and the local namespace) count: a deferred message is active - no count tells them apart
        active = s["active"] + s["locked"] + s["deferred"]
        return EntityCounts(active, len(e.dead_letters), 0, 0, 0, total, e.created_at)

    def close(self) -> None:
        self.closed = True


class FakePeeker:
    """The executors' peeks (a process's cached client) over fake entities by name."""

    def __init__(self, entities: dict[str, FakeEntity]) -> None:
        self.entities = entities

    def peek(self, entity: str, from_seq: int, count: int, timeout: float) -> list[Peeked]:
        e = self.entities[entity]
        e._call("read", "before", None)
        out = e.peek(from_seq, count)
        e._call("read", "after", None)
        return out
