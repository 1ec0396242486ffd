"""Fakes for unit tests (no network, no SDK I/O): a :class:`spark_sb.wire.transport.Transport` with scripted
failures, and a primary namespace's admin endpoint (:class:`PrimaryAdmin`: its entities' duplicate detection).

Sizes are a simple deterministic estimate (:func:`fake_size`), so batch boundaries are predictable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

from servicebus_local.clock import FakeClock
from spark_sb.core.errors import mark_written
from spark_sb.message.backlog import to_backlog
from spark_sb.message.outbound import OutboundMessage
from spark_sb.wire.lane import DeadlineExceeded
from spark_sb.wire.parking import Parked
from spark_sb.wire.timing import SLOW_MARGIN
from spark_sb.wire.transport import Target

BATCH_BASE = 10


def fake_size(m: OutboundMessage) -> int:
    """Deterministic stand-in for the encoded size: body + ids + properties + a fixed overhead."""
    body = m.body.encode() if isinstance(m.body, str) else m.body
    size = 20 + len(body)
    for v in (m.message_id, m.session_id, m.partition_key, m.correlation_id, m.content_type, m.subject):
        size += len(v) if v else 0
    for k, v in m.properties.items():
        size += len(k) + len(str(v))
    return size


class FakeBatch:
    """As :class:`~spark_sb.wire.sdk_batch.SdkBatch`: messages up to ``limit``; an empty batch takes one message
    up to ``single_limit`` that does not fit it, and then nothing more (``single``)."""

    def __init__(self, target: Target, limit: int, single_limit: int = 0) -> None:
        self.target = target
        self.limit = limit
        self.single_limit = single_limit
        self.single = False
        self.size = BATCH_BASE
        self._messages: list[OutboundMessage] = []

    @property
    def messages(self) -> list[OutboundMessage]:
        return self._messages

    def try_add(self, message: OutboundMessage) -> bool:
        cost = fake_size(message)
        if self.single:
            return False
        if self.size + cost > self.limit:
            if self._messages or self.size + cost > self.single_limit:
                return False
            self.single = True
        self.size += cost
        self._messages.append(message)
        return True

    def try_add_backlog(
        self,
        original: OutboundMessage,
        entity: str,
        enqueued: datetime,
        prepared: object | None = None,
        ambiguous: datetime | None = None,
    ) -> bool:
        if isinstance(prepared, OutboundMessage):  # made ahead by FakeTransport.prepare_backlog
            return self.try_add(prepared)
        return self.try_add(to_backlog(original, entity, enqueued, ambiguous))

    def __len__(self) -> int:
        return len(self._messages)


@dataclass
class Rule:
    """Fail operation ``op`` on targets matching ``namespace``/``entity`` (None = any) with ``make()``;
    ``count`` times (None = until removed)."""

    op: str
    namespace: str | None
    entity: str | None
    make: Callable[[], BaseException] | None  # None: a stall (the call hangs until its deadline)
    count: int | None = None
    skip: int = 0
    #: The failure ends a send whose batch was written to its link (it may have landed: SPEC B14)
    written: bool = False

    def matches(self, op: str, target: Target) -> bool:
        return (
            op == self.op
            and (self.namespace is None or self.namespace == target.namespace)
            and (self.entity is None or self.entity == target.entity)
        )


class FakeTransport:
    """Records what was accepted per target; fails as scripted; ``op_seconds`` advances the fake clock per call
    (a failing call to a real namespace takes time too)."""

    def __init__(
        self,
        clock: FakeClock | None = None,
        max_batch: int = 1000,
        op_seconds: float = 0.0,
        max_message: int | None = None,
    ) -> None:
        self.clock = clock
        self.max_batch = max_batch
        self.max_message = max_batch if max_message is None else max_message  # Premium: over max_batch
        self.op_seconds = op_seconds
        self.rules: list[Rule] = []
        self.delivered: dict[Target, list[OutboundMessage]] = {}
        self.calls: list[tuple[str, Target, int, str]] = []  # (op, target, n messages, "ok" | error name)
        self.timeouts: list[tuple[str, Target, float]] = []  # the deadline each call was given
        self.scheduled: dict[Target, dict[int, tuple[OutboundMessage, datetime]]] = {}
        self.cancelled: list[tuple[Target, int]] = []
        self.faults: list[str] = []
        self.warmed: list[Target] = []
        self.prepared_backlog = 0  # backlog translations made ahead (prepare_backlog)
        self.after_slow: Callable[[], None] | None = (
            None  # called after a stalled call's on_slow (tests await)
        )
        self.connected_targets: set[Target] = set()  # what connected() says (tests set it)
        self.answering: set[str] = set()  # namespaces whose connection keeps answering (answered_within)
        self.prepared: list[list[Target]] = []
        self.closed = 0
        self._seq = 0

    # -- scripting
    def fail(
        self,
        make: Callable[[], BaseException],
        *,
        op: str = "send",
        namespace: str | None = None,
        entity: str | None = None,
        count: int | None = None,
        skip: int = 0,
        written: bool = False,
    ) -> Rule:
        """Matching calls raise ``make()``; ``written``: after the batch was written (an ambiguous send, SPEC B14)."""
        rule = Rule(op, namespace, entity, make, count, skip, written)
        self.rules.append(rule)
        return rule

    def stall(
        self,
        *,
        op: str = "send",
        namespace: str | None = None,
        entity: str | None = None,
        count: int | None = None,
        written: bool = False,
    ) -> Rule:
        """Matching calls hang until their deadline: the clock advances by the call's timeout, then
        :class:`DeadlineExceeded` is raised (what a lane does with a call that never returns); ``written``: the
        batch was written before the silence (an entity that stalls on an open link: ambiguous, SPEC B14)."""
        rule = Rule(op, namespace, entity, None, count, written=written)
        self.rules.append(rule)
        return rule

    def heal(self, rule: Rule | None = None) -> None:
        if rule is None:
            self.rules.clear()
        elif rule in self.rules:
            self.rules.remove(rule)

    def _check(
        self, op: str, target: Target, n: int, timeout: float, on_slow: Callable[[], None] | None = None
    ) -> None:
        self.timeouts.append((op, target, timeout))
        for rule in self.rules:
            if rule.matches(op, target) and (rule.count is None or rule.count > 0):
                if rule.skip > 0:
                    rule.skip -= 1
                    continue
                if rule.count is not None:
                    rule.count -= 1
                if rule.make is None:  # a stall: nothing comes back before the deadline
                    if on_slow is not None and timeout > SLOW_MARGIN:
                        if self.clock is not None:
                            self.clock.advance(timeout - SLOW_MARGIN)
                        on_slow()
                        if self.after_slow is not None:
                            self.after_slow()
                        timeout = SLOW_MARGIN
                    if self.clock is not None:
                        self.clock.advance(timeout)
                    self.calls.append((op, target, n, "DeadlineExceeded"))
                    stalled = DeadlineExceeded(f"no answer within {timeout} s")
                    if rule.written:
                        mark_written(stalled)
                    raise stalled
                if self.clock is not None and self.op_seconds:
                    self.clock.advance(self.op_seconds)
                exc = rule.make()
                if rule.written:
                    mark_written(exc)
                self.calls.append((op, target, n, type(exc).__name__))
                raise exc
        if self.clock is not None and self.op_seconds:
            self.clock.advance(self.op_seconds)
        self.calls.append((op, target, n, "ok"))

    # -- views
    def at(self, namespace: str, entity: str) -> list[OutboundMessage]:
        return self.delivered.get(Target(namespace, entity), [])

    def ids(self, namespace: str, entity: str) -> list[str | None]:
        return [m.message_id for m in self.at(namespace, entity)]

    def sends(self, namespace: str | None = None) -> list[tuple[str, Target, int, str]]:
        return [
            c for c in self.calls if c[0] == "send" and (namespace is None or c[1].namespace == namespace)
        ]

    # -- Transport
    def max_batch_size(self, target: Target) -> int:
        return self.max_batch

    def max_message_size(self, target: Target) -> int:
        return self.max_message

    def new_batch(self, target: Target) -> FakeBatch:
        return FakeBatch(target, self.max_batch, self.max_message)

    def send(  # type: ignore[override]
        self,
        batch: FakeBatch,
        timeout: float,
        on_slow: Callable[[], None] | None = None,
        park_after: float | None = None,
    ) -> None:
        if (
            park_after is not None
            and self.clock is not None
            and park_after < timeout
            and self._parks(batch.target)
        ):
            started = self.clock.monotonic()
            self.clock.advance(park_after)
            self.calls.append(("send", batch.target, len(batch), "Parked"))
            raise Parked(batch.target, started, started + timeout, batch)
        self._check("send", batch.target, len(batch), timeout, on_slow)
        self.delivered.setdefault(batch.target, []).extend(batch.messages)

    def resume(
        self, parked: Parked, on_slow: Callable[[], None] | None = None, park_after: float | None = None
    ) -> None:
        """A parked send goes on: answered at once if its entity no longer stalls, else parked again at
        ``park_after`` or timed out at its deadline (a scripted stall)."""
        assert self.clock is not None
        batch: FakeBatch = parked.ticket
        left = max(0.0, parked.deadline - self.clock.monotonic())
        if park_after is not None and park_after < left and self._parks(batch.target):
            self.clock.advance(park_after)
            self.calls.append(("resume", batch.target, len(batch), "Parked"))
            raise parked
        try:
            self._check("send", batch.target, len(batch), left, on_slow)
        except Exception as exc:
            mark_written(exc)  # a parked batch was written (as SdkTransport.resume marks it)
            raise
        self.delivered.setdefault(batch.target, []).extend(batch.messages)

    def _parks(self, target: Target) -> bool:
        """A send to ``target`` would stall (a scripted stall of that one entity) while its namespace answers."""
        return any(
            r.make is None and r.skip == 0 and (r.count is None or r.count > 0) and r.matches("send", target)
            for r in self.rules
        ) and self.answered_within(target, 0.0)

    def connected(self, target: Target) -> bool:
        return target in self.connected_targets

    def schedule(self, target: Target, message: OutboundMessage, at: datetime, timeout: float) -> int:
        self._check("schedule", target, 1, timeout)
        self._seq += 1
        self.scheduled.setdefault(target, {})[self._seq] = (message, at)
        return self._seq

    def cancel_scheduled(self, target: Target, sequence_number: int, timeout: float) -> None:
        self._check("cancel", target, 1, timeout)
        self.scheduled.get(target, {}).pop(sequence_number, None)
        self.cancelled.append((target, sequence_number))

    def warm(self, target: Target) -> None:
        self.warmed.append(target)

    def prepare_backlog(self, original: OutboundMessage, entity: str, enqueued: datetime) -> OutboundMessage:
        self.prepared_backlog += 1
        return to_backlog(original, entity, enqueued)

    def isolated(self) -> FakeTransport:
        """The same scripted namespaces (the fake has no connections to keep apart)."""
        return self

    def answered_within(self, target: Target, seconds: float) -> bool:
        """The namespace kept answering (its heartbeats) unless it fails as a whole: a stall or failure scripted
        for one entity leaves the connection answering; one scripted for every entity does not."""
        if target.namespace in self.answering:
            return True
        return any(
            r.entity is not None
            and r.matches(r.op, Target(target.namespace, r.entity))
            and r.entity == target.entity
            for r in self.rules
        )

    def prepare(self, targets: Iterable[Target], silence: float) -> dict[Target, BaseException]:
        self.prepared.append(list(targets))
        return {}

    def fault(self, target: Target) -> None:
        self.faults.append(target.namespace)

    def close(self) -> None:
        self.closed += 1


class PrimaryAdmin:
    """The primary's admin endpoint: ``entities`` name -> (kind, duplicate detection on, window)."""

    def __init__(
        self,
        entities: dict[str, tuple[str, bool, timedelta]],
        fail: Exception | None = None,
        sizes: dict[str, int] | None = None,
    ) -> None:
        self.entities = entities
        self.fail = fail
        self.sizes = (
            sizes or {}
        )  # name -> max_message_size_in_kilobytes (a Premium entity's); else not reported
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.closed = False

    def _get(self, kind: str, name: str, kwargs: dict[str, Any]) -> Any:
        self.calls.append((kind, name, kwargs))
        if self.fail is not None:
            raise self.fail
        found = self.entities.get(name)
        if found is None or found[0] != kind:
            from azure.core.exceptions import ResourceNotFoundError

            raise ResourceNotFoundError(f"{kind} {name!r} does not exist")
        return SimpleNamespace(
            requires_duplicate_detection=found[1],
            duplicate_detection_history_time_window=found[2],
            **({"max_message_size_in_kilobytes": self.sizes[name]} if name in self.sizes else {}),
        )

    def get_queue(self, name: str, **kwargs: Any) -> Any:
        return self._get("queue", name, kwargs)

    def get_topic(self, name: str, **kwargs: Any) -> Any:
        return self._get("topic", name, kwargs)

    def close(self) -> None:
        self.closed = True
