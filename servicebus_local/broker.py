"""The in-memory Service Bus broker of one local namespace: entities, messages, locks, time (SPEC E1).

No sockets here. The AMQP server (``servicebus_local.server``) turns wire operations into calls on
:class:`Broker`; the HTTPS admin endpoint (``servicebus_local.admin``) uses it as its
:class:`~servicebus_local.model.AdminStore`; tests may call it directly. Every public method is thread-safe
(one re-entrant lock) and reads time from the injected :class:`~servicebus_local.clock.Clock`, so lock expiry, TTL,
scheduled messages and duplicate detection are unit-tested with a ``FakeClock`` (time-driven changes are
applied lazily, at the start of each operation on the entity, and by :meth:`Broker.tick`).

Semantics follow the service:

* sequence numbers per queue / topic, from 1, increasing; a topic's copies share the topic's number;
* peek-lock: a lock token (16 random bytes, the AMQP delivery tag; ``UUID(bytes_le=tag)`` is the SDK's lock
  token) valid for the entity's lock duration; expiry or abandon -> available again with delivery count + 1;
  delivery count reaching ``max_delivery_count`` -> dead-letter ``MaxDeliveryCountExceeded``; release (the SDK
  returning unprocessed prefetched messages) -> available again, count unchanged;
* TTL = min(message TTL, entity default TTL) from enqueue time; an expired message is dead-lettered
  (``TTLExpiredException``) when ``dead_lettering_on_message_expiration``, else dropped; a locked message
  expires only when its lock ends; deferred messages do not expire; the dead-letter queue has no TTL;
* scheduled messages (sent with ``x-opt-scheduled-enqueue-time`` or through schedule-message) are invisible
  until due, then enqueued (fanned out for topics);
* duplicate detection by message id within the window: the duplicate is accepted and dropped;
* size limits: ``max_message_size_in_kilobytes`` per message (what the namespace's tier allows and gives by
  default: ``servicebus_local.tiers``), ``max_size_in_megabytes`` per entity;
* status ``Disabled`` / ``SendDisabled`` / ``ReceiveDisabled`` -> ``com.microsoft:entity-disabled``;
* settlement (SPEC E8): a lock is settled on the link that received it or, by lock token, over ``$management``
  of the same entity path only for a message received by sequence number (``strict_settlement``, the default;
  lenient, any receiver of an entity without sessions, as the service's cross-receiver settlement today); a
  session's messages only
  by the session's current owner (else ``com.microsoft:session-lock-lost``); lock duration at most 5 minutes;
* sessions: a session entity needs a session id on every message (a topic's subscription that requires sessions
  dead-letters a copy without one: ``Session id is null.``); a session receiver holds the session lock
  (the entity's lock duration), gets that session's messages in order, renews the lock, keeps session state;
  on an entity without sessions, and in any dead-letter queue, a session id is only a property (plain
  receivers get the message);
* topics: each subscription gets the copies its rules select (:mod:`servicebus_local.rules`; ``$Default`` is a
  true filter), evaluated when the message is enqueued; a filter that fails dead-letters the copy
  (``FilterEvaluationException``) when ``dead_lettering_on_filter_evaluation_exceptions``.
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from servicebus_local.amqp import Long, MessageParts, Symbol, Timestamp, parse_message
from servicebus_local.clock import Clock, SystemClock
from servicebus_local.faults import FaultController
from servicebus_local.forwarding import RECEIVER_REFUSED, Forwarding, forwards
from servicebus_local.model import (
    AdminFault,
    EntityExists,
    EntityNotFound,
    QueueInfo,
    QueueSettings,
    RuntimeCounts,
    SubscriptionInfo,
    SubscriptionSettings,
    TopicInfo,
    TopicSettings,
    check_lock_duration,
)
from servicebus_local.rules import (
    DEFAULT_RULE_NAME,
    FilterEvaluationError,
    MessageView,
    Rule,
    TrueFilter,
    default_rule,
    route,
)
from servicebus_local.tiers import STANDARD, Tier, message_size_exceeded, tier_named

__all__ = [
    "Broker",
    "BrokerError",
    "Delivered",
    "EntityAddress",
    "Message",
    "Outcome",
]

# AMQP error conditions, as the SDK maps them (azure/servicebus/_transport/_pyamqp_transport.py).
NOT_FOUND = "amqp:not-found"
NOT_ALLOWED = "amqp:not-allowed"
QUOTA_EXCEEDED = "amqp:resource-limit-exceeded"
MESSAGE_SIZE_EXCEEDED = "amqp:link:message-size-exceeded"
UNAUTHORIZED = "amqp:unauthorized-access"
ENTITY_DISABLED = "com.microsoft:entity-disabled"
SERVER_BUSY = "com.microsoft:server-busy"
TIMEOUT = "com.microsoft:timeout"
MESSAGE_LOCK_LOST = "com.microsoft:message-lock-lost"
MESSAGE_NOT_FOUND = "com.microsoft:message-not-found"
SESSION_LOCK_LOST = "com.microsoft:session-lock-lost"
SESSION_CANNOT_BE_LOCKED = "com.microsoft:session-cannot-be-locked"
ARGUMENT_ERROR = "com.microsoft:argument-error"

#: How a subscription that requires sessions dead-letters a topic message without a session id (the service's
#: words, github.com/Azure/azure-service-bus/issues/196).
SESSION_ID_NULL_REASON = "Session id is null."
SESSION_ID_NULL_DESCRIPTION = (
    "Session enabled entity doesn't allow a message whose session identifier is null."
)

DEAD_LETTER_REASON = "DeadLetterReason"
DEAD_LETTER_DESCRIPTION = "DeadLetterErrorDescription"

_MAX_MS = 2**62


class BrokerError(Exception):
    """A Service Bus error: ``condition`` is the AMQP error condition the SDK maps to its exception."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(f"{condition}: {description}")
        self.condition = condition
        self.description = description


class Outcome:
    """Settlement outcomes."""

    COMPLETE = "complete"
    ABANDON = "abandon"
    RELEASE = "release"
    DEAD_LETTER = "dead-letter"
    DEFER = "defer"


# Message states.
READY, LOCKED, DEFERRED, GONE = 0, 1, 2, 3


def _ms(td: timedelta) -> int:
    try:
        return min(_MAX_MS, int(td.total_seconds() * 1000))
    except OverflowError:
        return _MAX_MS


class Message:
    """A message held by the broker: the encoded parts as sent plus the broker's bookkeeping."""

    __slots__ = (
        "parts",
        "seq",
        "enqueued_ms",
        "expires_ms",
        "ttl_ms",
        "delivery_count",
        "state",
        "lock",
        "locked_until_ms",
        "lock_owner",
        "by_sequence",
        "deferred",
        "session_id",
        "scheduled_ms",
        "hops",
        "first_seq",
        "dl_source",
    )

    def __init__(self, parts: MessageParts, seq: int) -> None:
        self.parts = parts
        self.seq = seq
        self.enqueued_ms = 0
        self.expires_ms: int | None = None
        self.ttl_ms: int | None = None
        self.delivery_count = 0
        self.state = READY
        self.lock: bytes | None = None
        self.locked_until_ms = 0
        #: The receiver link that holds the lock (None: received by sequence number over $management, or in
        #: process).
        self.lock_owner: object | None = None
        #: The lock was taken by a receive by sequence number (a deferred message), not on a receiver link.
        self.by_sequence = False
        self.deferred = False
        self.session_id = parts.session_id
        self.scheduled_ms = parts.scheduled_ms
        #: Auto-forwarding (servicebus_local.forwarding): the forwards made, the sequence number in the first
        #: entity, and the entity that dead-lettered it when it came out of a dead-letter queue.
        self.hops = 0
        self.first_seq: int | None = None
        self.dl_source: str | None = None

    @property
    def size(self) -> int:
        return self.parts.size

    def copy(self) -> Message:
        return _with_parts(self, self.parts)

    def annotations(self, *, locked: bool, state: int | None = None) -> dict[str, Any]:
        """The broker annotations of a delivery of this message."""
        ann: dict[str, Any] = {
            "x-opt-sequence-number": Long(self.seq),
            "x-opt-enqueued-time": Timestamp(self.enqueued_ms),
        }
        if locked:
            ann["x-opt-locked-until"] = Timestamp(self.locked_until_ms)
        if state is not None:
            ann["x-opt-message-state"] = Long(state)
        if self.first_seq is not None:
            ann["x-opt-enqueue-sequence-number"] = Long(self.first_seq)
        if self.dl_source is not None:
            ann["x-opt-deadletter-source"] = self.dl_source
        return ann

    def render(self, *, locked: bool, state: int | None = None) -> bytes:
        """The encoded message as the client receives it."""
        return self.parts.render(
            delivery_count=self.delivery_count,
            annotations=self.annotations(locked=locked, state=state),
            ttl_ms=self.ttl_ms,
        )


def _with_parts(m: Message, parts: MessageParts) -> Message:
    """A fresh copy of ``m`` (same sequence number, enqueue and schedule time) with ``parts``."""
    out = Message(parts, m.seq)
    out.enqueued_ms = m.enqueued_ms
    out.scheduled_ms = m.scheduled_ms
    out.hops, out.first_seq, out.dl_source = m.hops, m.first_seq, m.dl_source
    return out


#: sys.* properties an action may write -> index in the AMQP properties list.
_WRITABLE_SYSTEM = {
    "MessageId": 0,
    "To": 2,
    "Label": 3,
    "ReplyTo": 4,
    "CorrelationId": 5,
    "ContentType": 6,
    "SessionId": 10,
    "ReplyToSessionId": 12,
}


def message_view(m: Message) -> MessageView:
    """What filters read of a message: its system properties and application properties."""
    parts = m.parts
    fields = parts.properties_fields()
    system: dict[str, Any] = {}
    for name, index in _WRITABLE_SYSTEM.items():
        value = fields[index]
        if value is not None:
            system[name] = str(value) if index == 6 else value
    system["Size"] = parts.size
    system["DeliveryCount"] = m.delivery_count
    system["SequenceNumber"] = m.seq
    system["EnqueuedSequenceNumber"] = m.seq
    system["EnqueuedTimeUtc"] = utc_from_ms(m.enqueued_ms)
    if m.scheduled_ms is not None:
        system["ScheduledEnqueueTimeUtc"] = utc_from_ms(m.scheduled_ms)
    if parts.ttl_ms is not None:
        system["TimeToLive"] = timedelta(milliseconds=parts.ttl_ms)
        system["ExpiresAtUtc"] = utc_from_ms(m.enqueued_ms + parts.ttl_ms)
    if parts.partition_key is not None:
        system["PartitionKey"] = parts.partition_key
    return MessageView(system, parts.application_properties())


def apply_view(parts: MessageParts, before: MessageView, after: MessageView) -> MessageParts:
    """``parts`` with what an action changed between ``before`` and ``after`` written back."""
    properties: list[Any] | None = None
    for name, index in _WRITABLE_SYSTEM.items():
        if before.system.get(name) != after.system.get(name):
            if properties is None:
                properties = parts.properties_fields()
            value = after.system.get(name)
            properties[index] = Symbol(str(value)) if index == 6 and value is not None else value
    app = after.user if after.user != before.user else None
    if properties is None and app is None:
        return parts
    return parts.with_sections(properties=properties, application_properties=app)


@dataclass(frozen=True)
class Delivered:
    """A message handed to a receiver: its bytes and, in peek-lock mode, its lock (tag) and expiry."""

    message: Message
    lock_token: bytes | None
    locked_until_ms: int
    payload: bytes


@dataclass(frozen=True)
class EntityAddress:
    """A resolved link address."""

    kind: str  # queue | topic | subscription
    path: str  # canonical display path (queue name, topic name, or topic/Subscriptions/sub)
    dead_letter: bool = False
    management: bool = False

    @property
    def entity_key(self) -> str:
        return self.path.lower()


class _Session:
    __slots__ = ("session_id", "state", "owner", "locked_until_ms")

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.state: bytes | None = None
        self.owner: object | None = None
        self.locked_until_ms = 0


class _Store:
    """The messages of a queue, a subscription, or one of their dead-letter sub-queues."""

    def __init__(self, dead_letter: bool) -> None:
        self.dead_letter = dead_letter
        #: Ready messages are grouped by session id only in a session entity's main store; elsewhere a
        #: message's session id is just a property (plain receivers get it, as from the service).
        self.by_session = False
        self.msgs: dict[int, Message] = {}
        #: The sequence numbers of ``msgs`` in order, for peek (a peek from a number walks from it, not over the
        #: whole store: the service's browse is indexed too). Removed numbers stay (skipped) until they outnumber
        #: the live ones (``order_stale``), so the list is bounded by twice the messages held.
        self.order: list[int] = []
        self.order_stale = 0
        self.ready: dict[str | None, list[int]] = {}
        self.expiry_heap: list[tuple[int, int]] = []
        self.size = 0
        #: Messages removed while ready: their sequence numbers stay in ``ready`` (popped lazily) until
        #: :meth:`compact`. Without it a queue that nobody receives from, whose messages expire, grows its ready
        #: heap by one entry per message sent, for ever (memory, and the collector's pause, grew with hours).
        self.stale = 0

    def add_ready(self, m: Message) -> None:
        m.state = READY
        key = m.session_id if self.by_session else None
        heap = self.ready.get(key)
        if heap is None:
            heap = self.ready[key] = []
        heapq.heappush(heap, m.seq)

    def rekey(self, by_session: bool) -> None:
        """Group ready messages by session (or not) after the entity's ``requires_session`` changed."""
        if by_session == self.by_session:
            return
        self.by_session = by_session
        ready = [m for m in self.msgs.values() if m.state == READY]
        self.ready = {}
        for m in ready:
            self.add_ready(m)

    def insert(self, m: Message) -> None:
        seq, order = m.seq, self.order
        if seq not in self.msgs:
            if not order or seq > order[-1]:
                order.append(seq)  # the common case: numbers are given in order
            else:
                i = bisect.bisect_left(order, seq)
                if i == len(order) or order[i] != seq:  # a stale entry of the same number is reused
                    order.insert(i, seq)
        self.msgs[seq] = m
        self.size += m.size
        self.add_ready(m)
        if m.expires_ms is not None and not self.dead_letter:
            heapq.heappush(self.expiry_heap, (m.expires_ms, m.seq))

    def remove(self, m: Message) -> None:
        if self.msgs.pop(m.seq, None) is not None:
            self.size -= m.size
            self.order_stale += 1
            if self.order_stale > max(1024, len(self.msgs)):
                msgs = self.msgs
                self.order = [seq for seq in self.order if seq in msgs]
                self.order_stale = 0
        if m.state == READY:
            self.stale += 1
        m.state = GONE

    def compact(self) -> None:
        """Drop the ready heaps' entries of messages that are gone or no longer ready, once they outnumber the
        live messages (amortized O(1) per removal). Bounds ``ready`` by the messages held (and the session keys
        by the sessions that hold a ready message). Called at the end of every ``_tick_receivable`` (the broker's
        tick, and the catch-up a receive, settle or renew does before it reads a heap), never while a receive
        walks one."""
        if self.stale <= max(1024, len(self.msgs)):
            return
        self.stale = 0
        msgs = self.msgs
        for key, heap in list(self.ready.items()):
            live = [seq for seq in heap if (m := msgs.get(seq)) is not None and m.state == READY]
            if live:
                heapq.heapify(live)
                heap[:] = live
            else:
                del self.ready[key]

    def has_ready(self, session_id: str | None) -> bool:
        heap = self.ready.get(session_id)
        if not heap:
            return False
        msgs = self.msgs
        while heap:
            m = msgs.get(heap[0])
            if m is not None and m.state == READY:
                return True
            heapq.heappop(heap)
        return False


class _Entity:
    def __init__(self, name: str, now: datetime) -> None:
        self.name = name
        self.created_at = now
        self.updated_at = now
        self.accessed_at = now


class _Sendable(_Entity):
    """Queue or topic: where messages are sent (sequence numbers, scheduling, duplicate detection)."""

    settings: QueueSettings | TopicSettings

    def __init__(self, name: str, now: datetime) -> None:
        super().__init__(name, now)
        self.next_seq = 1
        self.scheduled: dict[int, Message] = {}
        self.scheduled_heap: list[tuple[int, int]] = []
        self.scheduled_size = 0
        self.dedupe: OrderedDict[str, int] = OrderedDict()


class _Receivable(_Entity):
    """Queue or subscription: where messages are received (stores, locks, sessions)."""

    settings: QueueSettings | SubscriptionSettings

    def __init__(self, name: str, now: datetime) -> None:
        super().__init__(name, now)
        self.store = _Store(False)
        self.dlq = _Store(True)
        self.locks: dict[bytes, tuple[_Store, Message]] = {}
        self.lock_heap: list[tuple[int, bytes]] = []
        self.sessions: dict[str, _Session] = {}


class _Queue(_Sendable, _Receivable):
    def __init__(self, name: str, settings: QueueSettings, now: datetime) -> None:
        _Sendable.__init__(self, name, now)
        _Receivable.__init__(self, name, now)
        self.settings: QueueSettings = settings
        self.store.by_session = settings.requires_session


class _Topic(_Sendable):
    def __init__(self, name: str, settings: TopicSettings, now: datetime) -> None:
        super().__init__(name, now)
        self.settings: TopicSettings = settings
        self.subs: _Registry[_Subscription] = _Registry(lambda sub: f"{name}/Subscriptions/{sub}")


class _Subscription(_Receivable):
    def __init__(self, topic: _Topic, name: str, settings: SubscriptionSettings, now: datetime) -> None:
        super().__init__(name, now)
        self.topic = topic
        self.settings: SubscriptionSettings = settings
        self.store.by_session = settings.requires_session
        self.rules: dict[str, Rule] = {DEFAULT_RULE_NAME.lower(): default_rule(now)}
        #: Every rule is a true filter without action: every message is copied as it is (the fast path).
        self.pass_all = True

    def rules_changed(self) -> None:
        self.pass_all = bool(self.rules) and all(
            isinstance(r.filter, TrueFilter) and r.action is None for r in self.rules.values()
        )


E = TypeVar("E", bound=_Entity)
QS = TypeVar("QS", QueueSettings, TopicSettings)


class _Registry(dict[str, E]):
    """Entities of one kind by case-insensitive name (the one CRUD rule for queues, topics and a topic's
    subscriptions). A dict from lower-case name to entity; ``siblings`` share the name space (queues and topics
    may not have the same name)."""

    def __init__(self, describe: Callable[[str], str] = lambda name: name) -> None:
        super().__init__()
        self.describe = describe  # the name as errors show it
        self.siblings: tuple[_Registry[Any], ...] = ()

    @staticmethod
    def key(name: str) -> str:
        return name.strip("/").lower()

    def find(self, name: str) -> E:
        entity = self.get(self.key(name))
        if entity is None:
            raise EntityNotFound(self.describe(name))
        return entity

    def add(self, name: str, build: Callable[[str], E]) -> E:
        key = self.key(name)
        if key in self or any(key in other for other in self.siblings):
            raise EntityExists(self.describe(name))
        entity = self[key] = build(name)
        return entity

    def remove(self, name: str) -> None:
        self.find(name)
        del self[self.key(name)]

    def in_order(self) -> list[E]:
        return [entity for _, entity in sorted(self.items())]


def _strip_address(address: str) -> str:
    a = address.strip()
    if "://" in a:
        a = a.split("://", 1)[1]
        a = a.split("/", 1)[1] if "/" in a else ""
    return a.strip("/")


class Broker(Forwarding):
    """One namespace's entities and messages. Implements :class:`~servicebus_local.model.AdminStore`.

    Thread-safe; runs in the server thread, the admin endpoint's threads and test threads alike.
    """

    def __init__(
        self,
        name: str = "local",
        *,
        clock: Clock | None = None,
        faults: FaultController | None = None,
        strict_settlement: bool = True,
        tier: str | Tier = STANDARD,
    ) -> None:
        self._name = name
        #: The namespace's tier (servicebus_local.tiers): what an entity's max_message_size_in_kilobytes may be.
        self.tier = tier_named(tier)
        #: Settle a lock by token over ``$management`` only for a message received by sequence number (deferred);
        #: off (the service's behaviour): any receiver of an entity without sessions may (see :meth:`settle`).
        self.strict_settlement = strict_settlement
        self._clock: Clock = clock or SystemClock()
        self.faults = faults or FaultController()
        self._lock = threading.RLock()
        self._queues: _Registry[_Queue] = _Registry()
        self._topics: _Registry[_Topic] = _Registry()
        self._queues.siblings = (self._topics,)
        self._topics.siblings = (self._queues,)
        self._created_at = self._clock.now()
        self._listeners: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ basics

    @property
    def namespace_name(self) -> str:
        return self._name

    @property
    def created_at(self) -> datetime:
        return self._created_at

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def messaging_sku(self) -> str:
        return self.tier.sku

    def message_limit(self, addr: EntityAddress) -> int:
        """The most one message (or batched transfer) sent to ``addr`` may weigh, in bytes: its queue's or topic's
        ``max_message_size_in_kilobytes`` (the tier's default for an entity not found)."""
        with self._lock:
            settings: QueueSettings | TopicSettings
            try:
                if addr.kind == "queue":
                    settings = self._queues.find(addr.path).settings
                elif addr.kind == "topic":
                    settings = self._topics.find(addr.path).settings
                else:
                    return self.tier.default_message_kb * 1024
            except EntityNotFound:
                return self.tier.default_message_kb * 1024
            return self.tier.message_kb(settings.max_message_size_in_kilobytes, addr.path) * 1024

    def _sized(self, name: str, settings: QS) -> QS:
        """``settings`` with the message limit the tier gives them (:meth:`Tier.message_kb`: ``None`` is the
        tier's default; a limit the tier does not allow -> ``InvalidSettings``)."""
        kb = self.tier.message_kb(settings.max_message_size_in_kilobytes, name)
        return replace(settings, max_message_size_in_kilobytes=kb)

    def admin_fault(self, method: str, path: str) -> AdminFault | None:
        return self.faults.admin_fault(method, path)

    def add_listener(self, callback: Callable[[], None]) -> None:
        """``callback()`` is called (outside the lock) whenever messages may have become available."""
        with self._lock:
            self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if callback in self._listeners:
                self._listeners.remove(callback)

    def _notify(self) -> None:
        for cb in list(self._listeners):
            with contextlib.suppress(Exception):  # a listener must not break the broker
                cb()

    def now_ms(self) -> int:
        return int(self._clock.now().timestamp() * 1000)

    # ------------------------------------------------------------------ addresses

    def resolve(self, address: str) -> EntityAddress:
        """Resolve a link address (``amqps://host:port/<path>``, ``<path>``, with ``/$management`` or
        ``/$deadletterqueue``); paths are case-insensitive and may contain ``/``."""
        path = _strip_address(address)
        lower = path.lower()
        management = False
        dead_letter = False
        if lower.endswith("/$management"):
            management = True
            path, lower = path[: -len("/$management")], lower[: -len("/$management")]
        if lower.endswith("/$deadletterqueue"):
            dead_letter = True
            path, lower = path[: -len("/$deadletterqueue")], lower[: -len("/$deadletterqueue")]
        with self._lock:
            q = self._queues.get(lower)
            if q is not None:
                return EntityAddress("queue", q.name, dead_letter, management)
            t = self._topics.get(lower)
            if t is not None:
                if dead_letter:
                    raise BrokerError(
                        NOT_FOUND, f"The messaging entity '{path}/$DeadLetterQueue' could not be found."
                    )
                return EntityAddress("topic", t.name, False, management)
            head, sep, sub = lower.rpartition("/subscriptions/")
            if sep:
                t = self._topics.get(head)
                if t is not None:
                    s = t.subs.get(sub)
                    if s is not None:
                        return EntityAddress(
                            "subscription", f"{t.name}/Subscriptions/{s.name}", dead_letter, management
                        )
        raise BrokerError(
            NOT_FOUND,
            f"The messaging entity '{self._name}:{path}' could not be found. To know more visit "
            "https://aka.ms/sbResourceMgrExceptions.",
        )

    def _receivable(self, address: str | EntityAddress) -> tuple[_Receivable, EntityAddress]:
        addr = address if isinstance(address, EntityAddress) else self.resolve(address)
        key = addr.entity_key
        if addr.kind == "queue":
            q = self._queues.get(key)
            if q is not None:
                return q, addr
        elif addr.kind == "subscription":
            topic, _, sub = key.rpartition("/subscriptions/")
            t = self._topics.get(topic)
            if t is not None and sub in t.subs:
                return t.subs[sub], addr
        elif addr.kind == "topic":
            raise BrokerError(
                NOT_ALLOWED, f"Cannot receive from topic '{addr.path}': receive from a subscription."
            )
        raise BrokerError(NOT_FOUND, f"The messaging entity '{self._name}:{addr.path}' could not be found.")

    def _sendable(self, address: str | EntityAddress) -> tuple[_Sendable, EntityAddress]:
        addr = address if isinstance(address, EntityAddress) else self.resolve(address)
        key = addr.entity_key
        if addr.kind == "queue" and not addr.dead_letter:
            q = self._queues.get(key)
            if q is not None:
                return q, addr
        elif addr.kind == "topic":
            t = self._topics.get(key)
            if t is not None:
                return t, addr
        elif addr.kind == "subscription" or addr.dead_letter:
            raise BrokerError(NOT_ALLOWED, f"Cannot send to '{addr.path}': send to a queue or a topic.")
        raise BrokerError(NOT_FOUND, f"The messaging entity '{self._name}:{addr.path}' could not be found.")

    def held_messages(self) -> int:
        """How many messages the namespace holds (every store, dead-letter queues and scheduled ones too)."""
        with self._lock:
            n = 0
            for q in self._queues.values():
                n += len(q.store.msgs) + len(q.dlq.msgs) + len(q.scheduled)
            for t in self._topics.values():
                n += len(t.scheduled)
                for s in t.subs.values():
                    n += len(s.store.msgs) + len(s.dlq.msgs)
            return n

    # ------------------------------------------------------------------ time

    def tick(self) -> None:
        """Apply every time-driven change (due scheduled messages, expired locks, expired messages)."""
        with self._lock:
            now = self.now_ms()
            changed = False
            for q in self._queues.values():
                changed |= self._tick_sendable(q, now)
                changed |= self._tick_receivable(q, now)
            for t in self._topics.values():
                changed |= self._tick_sendable(t, now)
                for s in t.subs.values():
                    changed |= self._tick_receivable(s, now)
        if changed:
            self._notify()

    def _tick_sendable(self, e: _Sendable, now: int) -> bool:
        heap = e.scheduled_heap
        changed = False
        while heap and heap[0][0] <= now:
            due, seq = heapq.heappop(heap)
            sm = e.scheduled.pop(seq, None)
            if sm is None:
                continue
            e.scheduled_size -= sm.size
            sm.enqueued_ms = due
            self._enqueue(e, [sm], now)
            changed = True
        return changed

    def _tick_receivable(self, e: _Receivable, now: int) -> bool:
        changed = False
        heap = e.lock_heap
        while heap and heap[0][0] <= now:
            until, tag = heapq.heappop(heap)
            entry = e.locks.get(tag)
            if entry is None:
                continue
            store, m = entry
            if m.locked_until_ms != until:
                continue  # renewed; a later heap entry holds the new expiry
            if m.session_id is not None and m.session_id in e.sessions and e.settings.requires_session:
                continue  # session messages are held by the session lock
            self._unlock(e, store, m, now, count_delivery=True)
            changed = True
        if e.sessions:
            for sess in list(e.sessions.values()):
                if sess.owner is not None and sess.locked_until_ms <= now:
                    self._release_session(e, sess, now, count_delivery=True)
                    changed = True
        store = e.store
        eheap = store.expiry_heap
        while eheap and eheap[0][0] <= now:
            _, seq = heapq.heappop(eheap)
            em = store.msgs.get(seq)
            if em is None or em.state != READY:
                continue  # settled, locked (expires when unlocked) or deferred (never expires)
            self._expire(e, store, em, now)
        store.compact()
        return changed

    # ------------------------------------------------------------------ sending

    def send(self, address: str | EntityAddress, payloads: Sequence[bytes | MessageParts]) -> list[int]:
        """Send encoded messages (one transfer, or the messages of one batched transfer) atomically.

        Returns the sequence numbers assigned (a duplicate gets none). Raises :class:`BrokerError`."""
        parts = [p if isinstance(p, MessageParts) else parse_message(p) for p in payloads]
        with self._lock:
            e, addr = self._sendable(address)
            now = self.now_ms()
            self._tick_sendable(e, now)
            seqs = self._admit(e, addr, parts, now, schedule=False)
        self._notify()
        return seqs

    def schedule(self, address: str | EntityAddress, payloads: Sequence[bytes | MessageParts]) -> list[int]:
        """schedule-message: every message is held until its ``x-opt-scheduled-enqueue-time``.
        Returns one sequence number per message (a duplicate still gets one, as the service answers)."""
        parts = [p if isinstance(p, MessageParts) else parse_message(p) for p in payloads]
        with self._lock:
            e, addr = self._sendable(address)
            now = self.now_ms()
            self._tick_sendable(e, now)
            return self._admit(e, addr, parts, now, schedule=True)

    def cancel_scheduled(self, address: str | EntityAddress, sequence_numbers: Iterable[int]) -> None:
        """cancel-scheduled-message. Unknown numbers -> ``com.microsoft:message-not-found``."""
        with self._lock:
            e, _ = self._sendable(address)
            self._tick_sendable(e, self.now_ms())
            seqs = list(sequence_numbers)
            missing = [s for s in seqs if s not in e.scheduled]
            if missing:
                raise BrokerError(
                    MESSAGE_NOT_FOUND,
                    f"The scheduled message with sequence number {missing[0]} could not be found in '{e.name}'.",
                )
            for s in seqs:
                m = e.scheduled.pop(s)
                e.scheduled_size -= m.size

    def _entity_size(self, e: _Sendable) -> int:
        if isinstance(e, _Queue):
            return e.store.size + e.dlq.size + e.scheduled_size
        assert isinstance(e, _Topic)
        subs = [s.store.size + s.dlq.size for s in e.subs.values()]
        return (max(subs) if subs else 0) + e.scheduled_size

    def _admit(
        self,
        e: _Sendable,
        addr: EntityAddress,
        parts: list[MessageParts],
        now: int,
        *,
        schedule: bool,
        carry: Message | None = None,
        dl_source: str | None = None,
    ) -> list[int]:
        """``carry``: the message this one is a forward of (``dl_source``: out of that entity's dead-letter queue);
        a forward reaches a disabled destination, as on the service (servicebus_local.forwarding)."""
        settings = e.settings
        if carry is None and settings.status in ("Disabled", "SendDisabled"):
            raise BrokerError(
                ENTITY_DISABLED, f"Messaging entity '{self._name}:{e.name}' is currently disabled."
            )
        max_msg = self.tier.message_kb(settings.max_message_size_in_kilobytes, e.name) * 1024
        incoming = 0
        for p in parts:
            if p.size > max_msg:
                raise BrokerError(MESSAGE_SIZE_EXCEEDED, message_size_exceeded(p.size, max_msg))
            incoming += p.size
        if isinstance(e, _Queue) and e.settings.requires_session:
            for p in parts:
                if p.session_id is None:
                    raise BrokerError(
                        NOT_ALLOWED,
                        "The SessionId was not set on a message, and it cannot be sent to the entity. Entities "
                        "that have session support enabled can only receive messages that have the SessionId set "
                        "to a valid value.",
                    )
        max_size = settings.max_size_in_megabytes * 1024 * 1024
        size = self._entity_size(e)
        if size + incoming > max_size:
            raise BrokerError(
                QUOTA_EXCEEDED,
                f"The maximum entity size has been reached or exceeded for {'Queue' if isinstance(e, _Queue) else 'Topic'}: "
                f"'{self._name}:{e.name}'. Size of entity in bytes:{size}, Max entity size in bytes:{max_size}.",
            )
        dedupe = settings.requires_duplicate_detection
        if dedupe:
            window = _ms(settings.duplicate_detection_history_time_window)
            d = e.dedupe
            while d:
                first_key = next(iter(d))
                if d[first_key] + window > now:
                    break
                del d[first_key]
        seqs: list[int] = []
        fresh: list[Message] = []
        for p in parts:
            if dedupe:
                mid = p.message_id_str
                if mid is not None:
                    if mid in e.dedupe:
                        if schedule:
                            seqs.append(e.next_seq)
                            e.next_seq += 1
                        continue
                    e.dedupe[mid] = now
            m = Message(p, e.next_seq)
            e.next_seq += 1
            seqs.append(m.seq)
            if carry is not None:
                m.hops = carry.hops + 1
                m.first_seq = carry.seq if carry.first_seq is None else carry.first_seq
                m.dl_source = dl_source
            if schedule and m.scheduled_ms is None:
                m.scheduled_ms = now
            if m.scheduled_ms is not None and (schedule or m.scheduled_ms > now):
                e.scheduled[m.seq] = m
                e.scheduled_size += m.size
                heapq.heappush(e.scheduled_heap, (m.scheduled_ms, m.seq))
                continue
            m.enqueued_ms = now
            fresh.append(m)
        if fresh:
            self._enqueue(e, fresh, now)
        e.updated_at = self._clock.now()
        return seqs

    def _enqueue(self, e: _Sendable, msgs: list[Message], now: int) -> None:
        entity_ttl = _ms(e.settings.default_message_time_to_live)
        if isinstance(e, _Queue):
            for m in msgs:
                if not self._forwarded(e, m, entity_ttl):
                    self._insert(e, m, entity_ttl)
            return
        assert isinstance(e, _Topic)
        subs = list(e.subs.values())
        views: dict[int, MessageView] = {}
        for sub in subs:
            for orig in msgs:
                if sub.pass_all:
                    self._insert_copy(sub, orig if len(subs) == 1 else orig.copy(), entity_ttl)
                    continue
                view = views.get(orig.seq)
                if view is None:
                    view = views[orig.seq] = message_view(orig)
                try:
                    routed = route(sub.rules, view)
                except FilterEvaluationError as exc:
                    if sub.settings.dead_lettering_on_filter_evaluation_exceptions:
                        m = orig.copy()
                        self._insert(sub, m, entity_ttl)
                        self._dead_letter(sub, sub.store, m, "FilterEvaluationException", str(exc))
                    continue
                for routed_view in routed:
                    m = orig.copy()
                    if routed_view is not view:
                        m = _with_parts(orig, apply_view(orig.parts, view, routed_view))
                    self._insert_copy(sub, m, entity_ttl)

    def _insert_copy(self, sub: _Subscription, m: Message, entity_ttl: int) -> None:
        """A topic message's copy into a subscription. A subscription that requires sessions dead-letters a copy
        without a session id, as the service does (the topic accepted the send)."""
        if self._forwarded(sub, m, entity_ttl):
            return
        self._insert(sub, m, entity_ttl)
        if m.session_id is None and sub.settings.requires_session:
            self._dead_letter(sub, sub.store, m, SESSION_ID_NULL_REASON, SESSION_ID_NULL_DESCRIPTION)

    def _insert(self, target: _Receivable, m: Message, entity_ttl: int) -> None:
        ttl_default = min(entity_ttl, _ms(target.settings.default_message_time_to_live))
        ttl = m.parts.ttl_ms
        ttl = ttl_default if ttl is None else min(ttl, ttl_default)
        m.ttl_ms = ttl if ttl < _MAX_MS else None
        m.expires_ms = m.enqueued_ms + ttl if ttl < _MAX_MS else None
        target.store.insert(m)

    # ------------------------------------------------------------------ receiving

    def check_receiver(self, address: str | EntityAddress, *, session: bool) -> EntityAddress:
        """Validate a receiver attach: a session entity needs a session receiver and vice versa."""
        with self._lock:
            e, addr = self._receivable(address)
            if forwards(e.settings, dead_letter=addr.dead_letter):
                raise BrokerError(NOT_ALLOWED, f"{RECEIVER_REFUSED} Entity:{addr.path}")
            requires = bool(e.settings.requires_session) and not addr.dead_letter
            if requires and not session:
                raise BrokerError(
                    NOT_ALLOWED,
                    f"It is not possible for an entity that requires sessions to create a non-sessionful message "
                    f"receiver. TrackingId:{os.urandom(4).hex()}, Entity:{e.name}",
                )
            if session and not requires:
                raise BrokerError(
                    NOT_ALLOWED,
                    f"It is not possible for an entity that does not require sessions to create a sessionful "
                    f"message receiver. Entity:{e.name}",
                )
            return addr

    def receive(
        self,
        address: str | EntityAddress,
        max_count: int,
        *,
        peek_lock: bool = True,
        session_id: str | None = None,
        owner: object | None = None,
    ) -> list[Delivered]:
        """Take up to ``max_count`` available messages, oldest first (session receivers: that session's)."""
        if max_count <= 0:
            return []
        with self._lock:
            e, addr = self._receivable(address)
            if e.settings.status in ("Disabled", "ReceiveDisabled"):
                raise BrokerError(
                    ENTITY_DISABLED, f"Messaging entity '{self._name}:{e.name}' is currently disabled."
                )
            now = self.now_ms()
            self._tick_all_for(e, now)
            if session_id is not None:
                sess = e.sessions.get(session_id)
                if sess is None or sess.owner is not owner or sess.locked_until_ms <= now:
                    raise BrokerError(
                        SESSION_LOCK_LOST, f"The session lock has expired on the session '{session_id}'."
                    )
            store = e.dlq if addr.dead_letter else e.store
            heap = store.ready.get(session_id)
            out: list[Delivered] = []
            if not heap:
                return out
            msgs = store.msgs
            lock_ms = _ms(e.settings.lock_duration)
            until = now + lock_ms
            heappop = heapq.heappop
            while heap and len(out) < max_count:
                seq = heappop(heap)
                m = msgs.get(seq)
                if m is None or m.state != READY:
                    continue
                if m.expires_ms is not None and m.expires_ms <= now and not store.dead_letter:
                    self._expire(e, store, m, now)
                    continue
                if peek_lock:
                    tag = os.urandom(16)
                    m.state = LOCKED
                    m.lock = tag
                    m.locked_until_ms = until
                    m.lock_owner = owner
                    m.by_sequence = False
                    e.locks[tag] = (store, m)
                    heapq.heappush(e.lock_heap, (until, tag))
                    out.append(Delivered(m, tag, until, m.render(locked=True)))
                else:
                    store.remove(m)
                    out.append(Delivered(m, None, 0, m.render(locked=False)))
            e.accessed_at = self._clock.now()
            return out

    def has_available(self, address: str | EntityAddress, session_id: str | None = None) -> bool:
        """Whether a receive would return something now (after applying time-driven changes)."""
        with self._lock:
            try:
                e, addr = self._receivable(address)
            except BrokerError:
                return False
            now = self.now_ms()
            changed = self._tick_all_for(e, now)
            store = e.dlq if addr.dead_letter else e.store
            result = store.has_ready(session_id)
        if changed:
            self._notify()
        return result

    def _tick_all_for(self, e: _Receivable, now: int) -> bool:
        changed = False
        if isinstance(e, _Queue):
            changed |= self._tick_sendable(e, now)
        elif isinstance(e, _Subscription):
            changed |= self._tick_sendable(e.topic, now)
        changed |= self._tick_receivable(e, now)
        return changed

    def settle(
        self,
        address: str | EntityAddress,
        lock_token: bytes,
        outcome: str,
        *,
        reason: str | None = None,
        description: str | None = None,
        owner: object | None = None,
        requesters: Collection[object] | None = None,
    ) -> None:
        """Settle a peek-locked message by lock token (the 16-byte tag). Raises message-lock-lost, or
        session-lock-lost on an entity that requires sessions.

        Who may settle, as on the service: ``owner`` is the receiver link a disposition arrived on (the lock must
        be that link's); ``requesters`` are the receiver links of the connection that asked over ``$management``
        (update-disposition), which settles any lock of an entity without sessions (the service's cross-receiver
        settlement) but a session's message only for the session's current owner. With neither (an in-process
        call) nothing is checked but the lock itself. A lock is the settling address's: a dead-letter queue's
        lock is not settled through its entity, nor the other way round. With :attr:`strict_settlement`,
        ``$management`` settles only messages received by sequence number (deferred)."""
        with self._lock:
            e, addr = self._receivable(address)
            now = self.now_ms()
            entry = e.locks.get(lock_token)
            if entry is not None and entry[0].dead_letter != addr.dead_letter:
                entry = None  # another sub-queue's lock: that entity path holds no such lock
            sess: _Session | None = None
            if entry is not None:
                store, m = entry
                sess = self._session_holding(e, store, m)
                if sess is not None:
                    if sess.locked_until_ms <= now:
                        self._release_session(e, sess, now, count_delivery=True)
                        entry = None
                elif m.locked_until_ms <= now:
                    self._tick_receivable(e, now)
                    entry = None
            if entry is None:
                if e.settings.requires_session and not addr.dead_letter:
                    raise BrokerError(SESSION_LOCK_LOST, "The session lock has expired or was lost.")
                raise BrokerError(MESSAGE_LOCK_LOST, _LOCK_LOST)
            store, m = entry
            if owner is not None and m.lock_owner is not owner:
                # A delivery tag names a delivery of the link that carried it; nothing else is settled there.
                raise BrokerError(SESSION_LOCK_LOST if sess is not None else MESSAGE_LOCK_LOST, _LOCK_LOST)
            if sess is not None and (
                (owner is not None and sess.owner is not owner)
                or (requesters is not None and sess.owner not in requesters)
            ):
                raise BrokerError(SESSION_LOCK_LOST, _session_not_held(sess.session_id))
            if self.strict_settlement and requesters is not None and not m.by_sequence:
                # Strict: update-disposition is for messages received by sequence number; a lock a receiver
                # link holds is settled on that link only.
                raise BrokerError(SESSION_LOCK_LOST if sess is not None else MESSAGE_LOCK_LOST, _LOCK_LOST)
            m.lock_owner = None
            if outcome == Outcome.COMPLETE:
                del e.locks[lock_token]
                m.lock = None
                store.remove(m)
            elif outcome == Outcome.ABANDON:
                self._unlock(e, store, m, now, count_delivery=True)
            elif outcome == Outcome.RELEASE:
                self._unlock(e, store, m, now, count_delivery=False)
            elif outcome == Outcome.DEFER:
                del e.locks[lock_token]
                m.lock = None
                m.deferred = True
                m.state = DEFERRED
            elif outcome == Outcome.DEAD_LETTER:
                if store.dead_letter:
                    raise BrokerError(
                        NOT_ALLOWED, "A message in a dead-letter queue cannot be dead-lettered again."
                    )
                del e.locks[lock_token]
                m.lock = None
                self._dead_letter(e, store, m, reason, description)
            else:
                raise ValueError(f"unknown outcome {outcome!r}")
        if outcome in (Outcome.ABANDON, Outcome.RELEASE):
            self._notify()

    def renew_lock(self, address: str | EntityAddress, lock_tokens: Iterable[bytes]) -> list[int]:
        """renew-lock: new expiry (ms) per token. Raises message-lock-lost for an unknown/expired one."""
        with self._lock:
            e, addr = self._receivable(address)
            now = self.now_ms()
            self._tick_receivable(e, now)
            until = now + _ms(e.settings.lock_duration)
            out = []
            for tag in lock_tokens:
                entry = e.locks.get(tag)
                if entry is None or entry[0].dead_letter != addr.dead_letter:
                    raise BrokerError(
                        MESSAGE_LOCK_LOST,
                        "The lock supplied is invalid. Either the lock expired, or the message has already been "
                        "removed from the queue.",
                    )
                m = entry[1]
                m.locked_until_ms = until
                heapq.heappush(e.lock_heap, (until, tag))
                out.append(until)
            return out

    def peek(
        self,
        address: str | EntityAddress,
        from_sequence: int,
        count: int,
        *,
        session_id: str | None = None,
    ) -> list[bytes]:
        """peek-message: encoded messages with sequence number >= ``from_sequence`` (active, locked,
        deferred and scheduled; not locked by the peek)."""
        with self._lock:
            e, addr = self._receivable(address)
            now = self.now_ms()
            self._tick_all_for(e, now)
            store = e.dlq if addr.dead_letter else e.store
            candidates: list[tuple[int, Message, int]] = []
            msgs, order = store.msgs, store.order
            i, wanted = bisect.bisect_left(order, from_sequence), max(0, count)
            while i < len(order) and len(candidates) < wanted:
                m = msgs.get(order[i])
                i += 1
                if m is not None and (session_id is None or m.session_id == session_id):
                    candidates.append((m.seq, m, 1 if m.state == DEFERRED else 0))
            if not addr.dead_letter:
                sendable = e if isinstance(e, _Queue) else e.topic if isinstance(e, _Subscription) else None
                if sendable is not None:
                    for seq, m in sendable.scheduled.items():
                        if seq >= from_sequence and (session_id is None or m.session_id == session_id):
                            candidates.append((seq, m, 2))
            candidates.sort(key=lambda c: c[0])
            return [m.render(locked=False, state=state) for _, m, state in candidates[: max(0, count)]]

    def receive_deferred(
        self,
        address: str | EntityAddress,
        sequence_numbers: Iterable[int],
        *,
        peek_lock: bool = True,
        session_id: str | None = None,
        requesters: Collection[object] | None = None,
    ) -> list[Delivered]:
        """receive-by-sequence-number: deferred messages by number (locked, or removed in
        receive-and-delete mode). Unknown or not deferred -> ``com.microsoft:message-not-found``.
        ``requesters`` (the receiver links of the asking connection): a session's deferred messages are
        received only by the session's current owner (else session-lock-lost); None (in process): not checked."""
        with self._lock:
            e, addr = self._receivable(address)
            now = self.now_ms()
            self._tick_all_for(e, now)
            if requesters is not None and e.settings.requires_session and not addr.dead_letter:
                sess = e.sessions.get(session_id) if session_id is not None else None
                if (
                    sess is None
                    or sess.owner is None
                    or sess.owner not in requesters
                    or sess.locked_until_ms <= now
                ):
                    raise BrokerError(SESSION_LOCK_LOST, _session_not_held(session_id or ""))
            store = e.dlq if addr.dead_letter else e.store
            seqs = list(sequence_numbers)
            found = []
            for s in seqs:
                m = store.msgs.get(s)
                if (
                    m is None
                    or m.state != DEFERRED
                    or (session_id is not None and m.session_id != session_id)
                ):
                    raise BrokerError(
                        MESSAGE_NOT_FOUND, f"Failed to retrieve deferred message with sequence number {s}."
                    )
                found.append(m)
            out = []
            until = now + _ms(e.settings.lock_duration)
            for m in found:
                if peek_lock:
                    tag = os.urandom(16)
                    m.state = LOCKED
                    m.lock = tag
                    m.locked_until_ms = until
                    m.lock_owner = None
                    m.by_sequence = True
                    e.locks[tag] = (store, m)
                    heapq.heappush(e.lock_heap, (until, tag))
                    out.append(Delivered(m, tag, until, m.render(locked=True)))
                else:
                    store.remove(m)
                    out.append(Delivered(m, None, 0, m.render(locked=False)))
            return out

    # ------------------------------------------------------------------ sessions

    def accept_session(
        self, address: str | EntityAddress, session_id: str | None, owner: object
    ) -> tuple[str, int] | None:
        """Lock a session for ``owner``: the named one, or (``None``) the next with available messages that
        no one holds. Returns (session id, locked until ms), or None when no session is available now.
        Raises ``com.microsoft:session-cannot-be-locked`` if the named session is held by another owner."""
        with self._lock:
            e, addr = self._receivable(address)
            now = self.now_ms()
            self._tick_all_for(e, now)
            until = now + _ms(e.settings.lock_duration)
            if session_id is not None:
                sess = e.sessions.get(session_id)
                if sess is None:
                    sess = e.sessions[session_id] = _Session(session_id)
                if sess.owner is not None and sess.owner is not owner and sess.locked_until_ms > now:
                    raise BrokerError(
                        SESSION_CANNOT_BE_LOCKED,
                        f"The requested session '{session_id}' cannot be accepted. It may be locked by another "
                        "receiver.",
                    )
                sess.owner = owner
                sess.locked_until_ms = until
                return session_id, until
            store = e.store
            best: tuple[int, str] | None = None
            for sid, heap in store.ready.items():
                if sid is None or not store.has_ready(sid):
                    continue
                sess = e.sessions.get(sid)
                if sess is not None and sess.owner is not None and sess.locked_until_ms > now:
                    continue
                first = heap[0]
                if best is None or first < best[0]:
                    best = (first, sid)
            if best is None:
                return None
            sid = best[1]
            sess = e.sessions.get(sid)
            if sess is None:
                sess = e.sessions[sid] = _Session(sid)
            sess.owner = owner
            sess.locked_until_ms = until
            return sid, until

    def release_session(self, address: str | EntityAddress, session_id: str, owner: object) -> None:
        """The owner's link closed: its locked messages of that session become available again."""
        with self._lock:
            try:
                e, _ = self._receivable(address)
            except BrokerError:
                return
            sess = e.sessions.get(session_id)
            if sess is not None and sess.owner is owner:
                self._release_session(e, sess, self.now_ms(), count_delivery=False)
        self._notify()

    def renew_session_lock(self, address: str | EntityAddress, session_id: str) -> int:
        with self._lock:
            e, _ = self._receivable(address)
            now = self.now_ms()
            self._tick_receivable(e, now)
            sess = e.sessions.get(session_id)
            if sess is None or sess.owner is None or sess.locked_until_ms <= now:
                raise BrokerError(
                    SESSION_LOCK_LOST, f"The session lock has expired on the session '{session_id}'."
                )
            sess.locked_until_ms = now + _ms(e.settings.lock_duration)
            return sess.locked_until_ms

    def session_state(self, address: str | EntityAddress, session_id: str) -> bytes | None:
        with self._lock:
            e, _ = self._receivable(address)
            sess = e.sessions.get(session_id)
            return sess.state if sess is not None else None

    def set_session_state(self, address: str | EntityAddress, session_id: str, state: bytes | None) -> None:
        with self._lock:
            e, _ = self._receivable(address)
            sess = e.sessions.get(session_id)
            if sess is None:
                sess = e.sessions[session_id] = _Session(session_id)
            sess.state = state

    def list_sessions(self, address: str | EntityAddress, skip: int = 0, top: int = 100) -> list[str]:
        """Sessions with messages or state."""
        with self._lock:
            e, _ = self._receivable(address)
            ids = {m.session_id for m in e.store.msgs.values() if m.session_id is not None}
            ids |= {sid for sid, s in e.sessions.items() if s.state is not None}
            return sorted(ids)[skip : skip + top]

    def _release_session(self, e: _Receivable, sess: _Session, now: int, *, count_delivery: bool) -> None:
        sess.owner = None
        sess.locked_until_ms = 0
        for store, m in list(e.locks.values()):
            if m.session_id == sess.session_id and not store.dead_letter:
                self._unlock(e, store, m, now, count_delivery=count_delivery)

    # ------------------------------------------------------------------ internal transitions

    @staticmethod
    def _session_holding(e: _Receivable, store: _Store, m: Message) -> _Session | None:
        """The session whose lock holds ``m`` (a message of a session entity's main store), or None."""
        if m.session_id is None or store.dead_letter or not e.settings.requires_session:
            return None
        return e.sessions.get(m.session_id)

    def _unlock(self, e: _Receivable, store: _Store, m: Message, now: int, *, count_delivery: bool) -> None:
        if m.lock is not None:
            e.locks.pop(m.lock, None)
            m.lock = None
        m.lock_owner = None
        if count_delivery:
            m.delivery_count += 1
        if m.deferred:
            m.state = DEFERRED
            return
        if not store.dead_letter:
            max_dc = e.settings.max_delivery_count
            if count_delivery and m.delivery_count >= max_dc:
                self._dead_letter(
                    e,
                    store,
                    m,
                    "MaxDeliveryCountExceeded",
                    f"Message could not be consumed after {max_dc} delivery attempts.",
                )
                return
            if m.expires_ms is not None and m.expires_ms <= now:
                self._expire(e, store, m, now)
                return
            if e.settings.forward_to:  # set by an update while the message was locked
                store.remove(m)
                self._forward(e, m, dead_letter=False)
                return
        store.add_ready(m)

    def _expire(self, e: _Receivable, store: _Store, m: Message, now: int) -> None:
        if e.settings.dead_lettering_on_message_expiration:
            self._dead_letter(
                e, store, m, "TTLExpiredException", "The message expired and was dead lettered."
            )
        else:
            store.remove(m)

    def _dead_letter(
        self, e: _Receivable, store: _Store, m: Message, reason: str | None, description: str | None
    ) -> None:
        store.remove(m)
        extra: dict[str, Any] = {}
        if reason is not None:
            extra[DEAD_LETTER_REASON] = reason
        if description is not None:
            extra[DEAD_LETTER_DESCRIPTION] = description
        parts = m.parts.with_application_properties(extra) if extra else m.parts
        d = Message(parts, m.seq)
        d.enqueued_ms = m.enqueued_ms
        d.delivery_count = m.delivery_count
        d.ttl_ms = m.ttl_ms
        d.expires_ms = None
        d.hops, d.first_seq = m.hops, m.first_seq
        if e.settings.forward_dead_lettered_messages_to and self._forward(e, d, dead_letter=True):
            return
        e.dlq.insert(d)

    # ------------------------------------------------------------------ AdminStore: queues

    def _now_dt(self) -> datetime:
        return self._clock.now()

    def _check_name(self, name: str) -> str:
        n = name.strip("/")
        if not n or len(n) > 260:
            raise ValueError(f"invalid entity name {name!r}")
        return n

    # Generic CRUD over a registry; the typed AdminStore methods below are one line each.

    def _create(self, registry: _Registry[E], name: str, build: Callable[[str, datetime], E]) -> E:
        name = self._check_name(name)
        return registry.add(name, lambda n: build(n, self._now_dt()))

    def _update(self, entity: _Entity, settings: Any) -> None:
        entity.settings = replace(settings)  # type: ignore[attr-defined]
        if isinstance(entity, _Receivable):
            entity.store.rekey(entity.settings.requires_session)
            self._forward_held(entity)
        entity.updated_at = self._now_dt()

    def create_queue(self, name: str, settings: QueueSettings | None = None) -> QueueInfo:
        with self._lock:
            if settings is not None:
                check_lock_duration(settings.lock_duration)
                self._check_forwarding(name, settings)
            sized = self._sized(name, settings or QueueSettings())
            q = self._create(self._queues, name, lambda n, now: _Queue(n, sized, now))
            return self._queue_info(q)

    def update_queue(self, name: str, settings: QueueSettings) -> QueueInfo:
        with self._lock:
            check_lock_duration(settings.lock_duration)
            q = self._queues.find(name)
            self._check_forwarding(q.name, settings)
            self._update(q, self._sized(q.name, settings))
            return self._queue_info(q)

    def get_queue(self, name: str) -> QueueInfo:
        with self._lock:
            return self._queue_info(self._queues.find(name))

    def delete_queue(self, name: str) -> None:
        with self._lock:
            self._queues.remove(name)

    def list_queues(self) -> list[QueueInfo]:
        with self._lock:
            return [self._queue_info(q) for q in self._queues.in_order()]

    def _queue_info(self, q: _Queue) -> QueueInfo:
        now = self.now_ms()
        self._tick_sendable(q, now)
        self._tick_receivable(q, now)
        counts = RuntimeCounts(
            active_message_count=len(q.store.msgs),
            dead_letter_message_count=len(q.dlq.msgs),
            scheduled_message_count=len(q.scheduled),
            size_in_bytes=q.store.size + q.dlq.size + q.scheduled_size,
            created_at=q.created_at,
            updated_at=q.updated_at,
            accessed_at=q.accessed_at,
        )
        return QueueInfo(q.name, replace(q.settings), counts)

    # ------------------------------------------------------------------ AdminStore: topics

    def create_topic(self, name: str, settings: TopicSettings | None = None) -> TopicInfo:
        with self._lock:
            sized = self._sized(name, settings or TopicSettings())
            t = self._create(self._topics, name, lambda n, now: _Topic(n, sized, now))
            return self._topic_info(t)

    def update_topic(self, name: str, settings: TopicSettings) -> TopicInfo:
        with self._lock:
            t = self._topics.find(name)
            self._update(t, self._sized(t.name, settings))
            return self._topic_info(t)

    def get_topic(self, name: str) -> TopicInfo:
        with self._lock:
            return self._topic_info(self._topics.find(name))

    def delete_topic(self, name: str) -> None:
        with self._lock:
            self._topics.remove(name)

    def list_topics(self) -> list[TopicInfo]:
        with self._lock:
            return [self._topic_info(t) for t in self._topics.in_order()]

    def _topic_info(self, t: _Topic) -> TopicInfo:
        self._tick_sendable(t, self.now_ms())
        counts = RuntimeCounts(
            scheduled_message_count=len(t.scheduled),
            size_in_bytes=self._entity_size(t),
            subscription_count=len(t.subs),
            created_at=t.created_at,
            updated_at=t.updated_at,
            accessed_at=t.accessed_at,
        )
        return TopicInfo(t.name, replace(t.settings), counts)

    # ------------------------------------------------------------------ AdminStore: subscriptions

    def create_subscription(
        self, topic: str, name: str, settings: SubscriptionSettings | None = None
    ) -> SubscriptionInfo:
        with self._lock:
            if settings is not None:
                check_lock_duration(settings.lock_duration)
            t = self._topics.find(topic)
            if settings is not None:
                self._check_forwarding(f"{t.name}/Subscriptions/{name}", settings)
            sub = self._create(
                t.subs,
                name,
                lambda n, now: _Subscription(t, n, replace(settings or SubscriptionSettings()), now),
            )
            return self._sub_info(sub)

    def update_subscription(self, topic: str, name: str, settings: SubscriptionSettings) -> SubscriptionInfo:
        with self._lock:
            check_lock_duration(settings.lock_duration)
            sub = self._get_sub(topic, name)
            self._check_forwarding(f"{sub.topic.name}/Subscriptions/{sub.name}", settings)
            self._update(sub, settings)
            return self._sub_info(sub)

    def get_subscription(self, topic: str, name: str) -> SubscriptionInfo:
        with self._lock:
            return self._sub_info(self._get_sub(topic, name))

    def delete_subscription(self, topic: str, name: str) -> None:
        with self._lock:
            self._topics.find(topic).subs.remove(name)

    def list_subscriptions(self, topic: str) -> list[SubscriptionInfo]:
        with self._lock:
            return [self._sub_info(sub) for sub in self._topics.find(topic).subs.in_order()]

    def _get_sub(self, topic: str, name: str) -> _Subscription:
        return self._topics.find(topic).subs.find(name)

    def _sub_info(self, s: _Subscription) -> SubscriptionInfo:
        now = self.now_ms()
        self._tick_sendable(s.topic, now)
        self._tick_receivable(s, now)
        counts = RuntimeCounts(
            active_message_count=len(s.store.msgs),
            dead_letter_message_count=len(s.dlq.msgs),
            size_in_bytes=s.store.size + s.dlq.size,
            created_at=s.created_at,
            updated_at=s.updated_at,
            accessed_at=s.accessed_at,
        )
        return SubscriptionInfo(s.topic.name, s.name, replace(s.settings), counts)

    # ------------------------------------------------------------------ AdminStore: rules

    def create_rule(self, topic: str, subscription: str, rule: Rule) -> Rule:
        """Add a rule to a subscription (``EntityExists`` if one of that name exists); stamps ``created_at``."""
        with self._lock:
            s = self._get_sub(topic, subscription)
            key = rule.name.lower()
            if key in s.rules:
                raise EntityExists(f"{topic}/Subscriptions/{subscription}/Rules/{rule.name}")
            stored = s.rules[key] = replace(rule, created_at=self._now_dt())
            s.rules_changed()
            return stored

    def update_rule(self, topic: str, subscription: str, rule: Rule) -> Rule:
        """Replace a rule's filter and action (``EntityNotFound`` if there is no rule of that name)."""
        with self._lock:
            s = self._get_sub(topic, subscription)
            key = rule.name.lower()
            old = s.rules.get(key)
            if old is None:
                raise EntityNotFound(f"{topic}/Subscriptions/{subscription}/Rules/{rule.name}")
            stored = s.rules[key] = replace(rule, name=old.name, created_at=old.created_at)
            s.rules_changed()
            return stored

    def get_rule(self, topic: str, subscription: str, name: str) -> Rule:
        with self._lock:
            rule = self._get_sub(topic, subscription).rules.get(name.lower())
            if rule is None:
                raise EntityNotFound(f"{topic}/Subscriptions/{subscription}/Rules/{name}")
            return rule

    def delete_rule(self, topic: str, subscription: str, name: str) -> None:
        with self._lock:
            s = self._get_sub(topic, subscription)
            if s.rules.pop(name.lower(), None) is None:
                raise EntityNotFound(f"{topic}/Subscriptions/{subscription}/Rules/{name}")
            s.rules_changed()

    def list_rules(self, topic: str, subscription: str) -> list[Rule]:
        with self._lock:
            return list(self._get_sub(topic, subscription).rules.values())

    def set_rules(self, topic: str, subscription: str, rules: Iterable[Rule]) -> None:
        """Replace every rule of a subscription (topology files)."""
        with self._lock:
            s = self._get_sub(topic, subscription)
            now = self._now_dt()
            s.rules = {r.name.lower(): replace(r, created_at=now) for r in rules}
            s.rules_changed()

    # ------------------------------------------------------------------ convenience

    def ensure_queue(self, name: str, settings: QueueSettings | None = None) -> QueueInfo:
        """Create the queue unless it exists (then return it unchanged)."""
        with self._lock:
            try:
                return self.get_queue(name)
            except EntityNotFound:
                return self.create_queue(name, settings)

    def ensure_topic(
        self, name: str, subscriptions: Iterable[str] = (), settings: TopicSettings | None = None
    ) -> TopicInfo:
        """Create the topic and its subscriptions unless they exist."""
        with self._lock:
            try:
                self.get_topic(name)
            except EntityNotFound:
                self.create_topic(name, settings)
            for sub in subscriptions:
                try:
                    self.get_subscription(name, sub)
                except EntityNotFound:
                    self.create_subscription(name, sub)
            return self.get_topic(name)

    def locked_count(self, address: str | EntityAddress) -> int:
        """Messages of a queue or subscription held under a peek-lock now (their locks not yet lapsed or settled):
        what a test awaits after killing a receiver, until its locks lapse. Not a count the service reports."""
        with self._lock:
            e, _addr = self._receivable(address)
            self._tick_all_for(e, self.now_ms())
            return sum(1 for m in e.store.msgs.values() if m.state == LOCKED)

    def counts(self, address: str) -> RuntimeCounts:
        """Runtime counts of a queue, topic or subscription by address."""
        addr = self.resolve(address)
        if addr.kind == "queue":
            return self.get_queue(addr.path).runtime
        if addr.kind == "topic":
            return self.get_topic(addr.path).runtime
        topic, _, sub = addr.path.rpartition("/Subscriptions/")
        return self.get_subscription(topic, sub).runtime

    def status(self) -> dict[str, Any]:
        """Entities and counts as plain data (the control API's ``GET /status``)."""
        out: dict[str, Any] = {"namespace": self._name, "queues": {}, "topics": {}}
        for q in self.list_queues():
            out["queues"][q.name] = _counts_dict(q.runtime) | {"status": q.settings.status}
        for t in self.list_topics():
            subs = {
                s.name: _counts_dict(s.runtime) | {"status": s.settings.status}
                for s in self.list_subscriptions(t.name)
            }
            out["topics"][t.name] = {
                "scheduled": t.runtime.scheduled_message_count,
                "status": t.settings.status,
                "subscriptions": subs,
            }
        return out


_LOCK_LOST = (
    "The lock supplied is invalid. Either the lock expired, or the message has already been removed from the "
    "queue, or was received by a different receiver instance."
)


def _session_not_held(session_id: str) -> str:
    return (
        f"The session lock was lost: the session '{session_id}' is not held by this receiver. A session's "
        "messages are settled only by the receiver that holds the session; accept the session to settle them."
    )


def _counts_dict(c: RuntimeCounts) -> dict[str, Any]:
    return {
        "active": c.active_message_count,
        "dead_letter": c.dead_letter_message_count,
        "scheduled": c.scheduled_message_count,
        "size_in_bytes": c.size_in_bytes,
    }


def utc_from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000.0, tz=timezone.utc)
