"""Auto-forwarding as the service does it (SPEC E9): a queue's or a subscription's ``forward_to`` and
``forward_dead_lettered_messages_to``. :class:`Forwarding` is a base of :class:`~servicebus_local.broker.Broker`
and runs inside it, under its lock; the README's forwarding table cites the service's documentation row by row.

* The destination is a queue or a topic of the namespace that exists when the source is created or updated,
  else HTTP 400 ``SubCode=40400``; a session-enabled source cannot forward (400). An update that makes a queue
  forward to itself is accepted, as the service accepts it (a create cannot: the destination does not exist yet).
* A message arriving in the source (sent, scheduled and due, a topic's copy, back from a lock) goes on at once as
  a new message of the destination (its sequence number, delivery count 0) with its message id, properties,
  application properties, session id and body; ``x-opt-enqueue-sequence-number`` keeps the sequence number it
  had in its first entity. A dead-lettered message goes on to ``forward_dead_lettered_messages_to`` likewise,
  with ``x-opt-deadletter-source`` naming the entity that dead-lettered it.
* :data:`MAX_HOPS` forwards at most: a message forwarded 4 times that should go on is dead-lettered where it is
  (``MaxTransferHopCountExceeded``), and stays in that dead-letter queue even if it forwards.
* A destination that refuses the message (deleted, full, a session queue and no session id, too large): the source
  dead-letters it; out of a dead-letter queue it stays there.
* No receiver on a forwarding entity, nor on a forwarding dead-letter queue (``amqp:not-allowed``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from servicebus_local import broker as _broker
from servicebus_local.model import InvalidSettings, QueueSettings, SubscriptionSettings

if TYPE_CHECKING:
    from servicebus_local.amqp import MessageParts
    from servicebus_local.broker import (
        EntityAddress,
        Message,
        _Queue,
        _Receivable,
        _Registry,
        _Sendable,
        _Store,
        _Topic,
    )

__all__ = ["HOP_DESCRIPTION", "HOP_REASON", "MAX_HOPS", "RECEIVER_REFUSED", "Forwarding", "destination_name"]

#: The most forwards a message makes; the next one dead-letters it (the service's value, "set to 4").
MAX_HOPS = 4
HOP_REASON = "MaxTransferHopCountExceeded"
HOP_DESCRIPTION = (
    "The maximum number of allowed hops when forwarding between queues has been exceeded. "
    "This value is set to 4."
)
RECEIVER_REFUSED = "Cannot create a message receiver on an entity with auto-forwarding enabled."


def destination_name(forward_to: str) -> str:
    """The entity a ``forward_to`` names: the path of ``sb://<namespace>/<name>`` (what the SDK sends for a bare
    name, and what the service gives back), or the name as written."""
    text = forward_to.strip()
    if "://" in text:
        text = urlsplit(text).path
    return text.strip("/")


def forwards(settings: QueueSettings | SubscriptionSettings, *, dead_letter: bool) -> str | None:
    """Where an entity (``dead_letter``: its dead-letter queue) forwards to, or None."""
    target = settings.forward_dead_lettered_messages_to if dead_letter else settings.forward_to
    return target or None


def _path(e: _Receivable) -> str:
    topic = getattr(e, "topic", None)
    return f"{topic.name}/Subscriptions/{e.name}" if topic is not None else e.name


class Forwarding:
    """The broker's forwarding: checks at create and update, the move itself, the receivers it refuses."""

    if TYPE_CHECKING:
        _queues: _Registry[_Queue]
        _topics: _Registry[_Topic]

        def now_ms(self) -> int: ...
        def _insert(self, target: _Receivable, m: Message, entity_ttl: int) -> None: ...
        def _dead_letter(
            self, e: _Receivable, store: _Store, m: Message, reason: str | None, description: str | None
        ) -> None: ...
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
        ) -> list[int]: ...

    def _forward_destination(self, forward_to: str) -> _Queue | _Topic | None:
        key = destination_name(forward_to).lower()
        return self._queues.get(key) or self._topics.get(key)

    def _check_forwarding(self, path: str, settings: QueueSettings | SubscriptionSettings) -> None:
        """Refuse, as the service does (HTTP 400), a destination that is not an existing queue or topic, and a
        session-enabled entity that forwards."""
        for field, target in (
            ("ForwardTo", settings.forward_to),
            ("ForwardDeadLetteredMessagesTo", settings.forward_dead_lettered_messages_to),
        ):
            if target and self._forward_destination(target) is None:
                raise InvalidSettings(
                    f"SubCode=40400. The auto forwarding destination entity does not exist: "
                    f"'{destination_name(target)}' ({field} of '{path}'): forward to an existing queue or topic."
                )
        if settings.forward_to and settings.requires_session:
            raise InvalidSettings(
                f"SubCode=40000. Bad Request. '{path}' requires sessions: autoforwarding (ForwardTo) is not "
                "supported for session-enabled queues or subscriptions."
            )

    def _forwarded(self, target: _Receivable, m: Message, entity_ttl: int) -> bool:
        """``m`` arrives in ``target``'s main store: when ``target`` forwards, it goes on (or is dead-lettered
        there) and the answer is True; else False, and the caller stores it."""
        if not target.settings.forward_to:
            return False
        self._forward(target, m, dead_letter=False, entity_ttl=entity_ttl)
        return True

    def _forward(self, source: _Receivable, m: Message, *, dead_letter: bool, entity_ttl: int = 0) -> bool:
        """Move ``m`` (arriving in ``source``, or in its dead-letter queue) to the destination. A main-store message
        that cannot go is dead-lettered in ``source``; a dead-letter queue's stays where it is (False)."""
        target = forwards(source.settings, dead_letter=dead_letter)
        assert target is not None
        if m.hops >= MAX_HOPS:
            refusal = (HOP_REASON, HOP_DESCRIPTION)
        else:
            dest = self._forward_destination(target)
            if dest is None:
                refusal = (
                    _broker.NOT_FOUND,
                    f"The auto forwarding destination entity '{destination_name(target)}' does not exist.",
                )
            else:
                kind = "topic" if isinstance(dest, _broker._Topic) else "queue"
                try:
                    self._admit(
                        dest,
                        _broker.EntityAddress(kind, dest.name),
                        [m.parts],
                        self.now_ms(),
                        schedule=False,
                        carry=m,
                        dl_source=_path(source) if dead_letter else None,
                    )
                    return True
                except _broker.BrokerError as exc:
                    refusal = (exc.condition, exc.description)
        if dead_letter:
            return False
        self._insert(source, m, entity_ttl or _broker._MAX_MS)
        self._dead_letter(source, source.store, m, *refusal)
        return True

    def _forward_held(self, e: _Receivable) -> None:
        """After an update: what ``e`` (and its dead-letter queue) holds ready goes on to the new destination."""
        if e.settings.forward_to:
            for m in _ready(e.store):
                e.store.remove(m)
                self._forward(e, m, dead_letter=False)
        if e.settings.forward_dead_lettered_messages_to:
            for m in _ready(e.dlq):
                if self._forward(e, m, dead_letter=True):
                    e.dlq.remove(m)


def _ready(store: _Store) -> list[Message]:
    """The ready messages of ``store``, oldest first."""
    return sorted((m for m in store.msgs.values() if m.state == _broker.READY), key=lambda m: m.seq)
