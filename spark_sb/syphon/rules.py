"""What the syphon decides, as pure rules on plain data (SPEC B9, B11, B12): the outcome of a drain
(:class:`SyphonOutcome`), what to forward for one backlog message (:func:`restore_for_primary`), which
dead-lettered messages stay parked (:func:`is_parked`), whether a failure is an expired token,
which primary entities may be moved to now (:class:`EntityGate`, on an injected clock), and what becomes of a
message the primary did not take (:func:`undelivered_verdict`: abandoned, or dead-lettered once its destination
has been missing for ``syphon.max_attempts`` deliveries).

Where it runs: wherever a :class:`~spark_sb.syphon.mover.Syphon` drains (executors' Python workers in the Spark syphon
job; the driver in tests and tools). No I/O and no Service Bus client here. :class:`SyphonOutcome` is small and
picklable (the syphon job's rows are made from it on executors); an :class:`EntityGate` stays in its process.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from spark_sb.core.clock import Clock
from spark_sb.core.counts import merge_fields
from spark_sb.message.backlog import from_backlog, is_backlog_message
from spark_sb.message.outbound import OutboundMessage

#: Dead-letter reasons written into the backlog queue's dead-letter sub-queue.
EXPIRED_IN_BACKLOG = "TTLExpiredInBacklog"
NOT_A_BACKLOG_MESSAGE = "NotABacklogMessage"
#: The primary entity named in ``x-ms-path`` does not exist (it answered not-found at the message's
#: ``syphon.max_attempts``-th delivery, SPEC F9).
DESTINATION_NOT_FOUND = "DestinationNotFound"
#: The primary entity takes messages smaller than this one (its ``max_message_size_in_kilobytes``): it never will
#: (SPEC B13).
TOO_LARGE_FOR_DESTINATION = "MessageTooLargeForDestination"
#: Dead-letter reasons that keep a message parked in a backlog queue's dead-letter queue (never moved): the
#: syphon's own, and the service's expiry (the backlog TTL is unlimited, so only a drifted queue gives it).
PARKED_REASONS = frozenset(
    {
        EXPIRED_IN_BACKLOG,
        NOT_A_BACKLOG_MESSAGE,
        DESTINATION_NOT_FOUND,
        TOO_LARGE_FOR_DESTINATION,
        "TTLExpiredException",
    }
)
#: The error class (:func:`spark_sb.core.errors.classify`) that says the destination does not exist.
ENTITY_NOT_FOUND = "entity_not_found"
#: What :func:`undelivered_verdict` decides.
ABANDON = "abandon"
DEAD_LETTER = "dead_letter"
#: Application properties the service adds to a dead-lettered message (not forwarded to the primary).
DEAD_LETTER_PROPERTIES = ("DeadLetterReason", "DeadLetterErrorDescription")

#: A message whose lock expires within this margin is not forwarded (B12): it would be redelivered anyway, and
#: completing it would fail. (A lock lost during a send: the complete fails, is counted, and the redelivered copy
#: is dropped by duplicate detection on the primary.)
LOCK_SAFETY_MARGIN = timedelta(seconds=2)
#: The backlog queues' lock duration as provisioned (seconds): a lock is measured from the local monotonic time of
#: the receive that took it, never the service's ``locked_until`` against this machine's wall clock (skew).
LOCK_DURATION = 60.0


@dataclass
class SyphonOutcome:
    """What one drain did. Small and picklable (the Spark syphon job returns these from executors).

    ``forwarded`` / ``expired_by_entity`` / ``abandoned_by_entity``: per primary entity. ``from_dead_letter``:
    of the forwarded, how many came from a backlog queue's dead-letter queue. ``parked``: dead-lettered messages
    left where they are on purpose. ``invalid``: messages without a destination, dead-lettered in the backlog.
    ``undeliverable`` / ``undeliverable_by_entity``: messages whose primary entity does not exist, dead-lettered
    in the backlog (reason ``DestinationNotFound``) after ``syphon.max_attempts`` deliveries, or that it can never
    take (``MessageTooLargeForDestination``, at once).
    """

    received: int = 0
    forwarded: dict[str, int] = field(default_factory=dict)
    expired: int = 0
    invalid: int = 0
    probes_dropped: int = 0
    abandoned: int = 0
    skipped_lock_expiring: int = 0
    settle_failures: int = 0
    errors: list[str] = field(default_factory=list)
    expired_by_entity: dict[str, int] = field(default_factory=dict)
    abandoned_by_entity: dict[str, int] = field(default_factory=dict)
    from_dead_letter: int = 0
    parked: int = 0
    undeliverable: int = 0
    undeliverable_by_entity: dict[str, int] = field(default_factory=dict)
    receive_calls: int = 0
    probes: int = 0
    #: Return markers passed (``ordering``): acknowledged and completed, never forwarded.
    markers: int = 0
    #: Ordering: messages deferred (held back behind their line's head without an attempt: their delivery count
    #: does not rise, no receive returns them again), deferred messages fetched by sequence number, the calls that
    #: fetched them, the peeks (browses) that proved the lines' heads and the messages they listed.
    deferred: int = 0
    fetched: int = 0
    fetch_calls: int = 0
    peek_calls: int = 0
    peeked: int = 0
    cancelled: bool = False
    #: (entity, message id) of each forwarded message, when the syphon records them (the Spark job's rows).
    moved_ids: list[tuple[str, str | None]] = field(default_factory=list)
    #: SPEC B14: per entity, the messages moved after its duplicate detection window had passed since their
    #: ambiguous primary send (it may have landed: the primary may hold them twice), and their (entity, message id).
    possible_duplicates: dict[str, int] = field(default_factory=dict)
    possible_duplicate_ids: list[tuple[str, str | None]] = field(default_factory=list)

    @property
    def forwarded_total(self) -> int:
        return sum(self.forwarded.values())

    def merge(self, other: SyphonOutcome) -> SyphonOutcome:
        """Field by field: per-entity counts merge, ``cancelled`` if either was, the rest add (counts) or
        concatenate (lists)."""
        return merge_fields(self, other)

    def _count(self, table: dict[str, int], entity: str | None, n: int = 1) -> None:
        key = entity or ""
        table[key] = table.get(key, 0) + n


def restore_for_primary(
    received: OutboundMessage, now: datetime
) -> tuple[OutboundMessage | None, str | None]:
    """Decide what to forward for one backlog message (pure; B9).

    Returns ``(message, None)`` with the message to send to the primary (entity set, remaining TTL, scheduled time
    kept only while still in the future) or ``(None, reason)`` when it must be dead-lettered in the backlog.
    """
    if not is_backlog_message(received):
        return None, NOT_A_BACKLOG_MESSAGE
    restored, entered = from_backlog(received)
    changes: dict[str, Any] = {}
    if restored.time_to_live is not None:
        remaining = restored.time_to_live - max(now - entered, timedelta(0))
        if remaining <= timedelta(0):
            return None, EXPIRED_IN_BACKLOG
        changes["time_to_live"] = remaining
    if restored.scheduled_enqueue_time is not None and restored.scheduled_enqueue_time <= now:
        changes["scheduled_enqueue_time"] = None
    if changes:
        restored = replace(restored, **changes)
    return restored, None


def past_window(attempted: datetime, moved: datetime, window: float | None) -> bool:
    """SPEC B14 (pure): is a message whose ambiguous primary send was attempted at ``attempted``, moved to the primary
    at ``moved``, a possible duplicate? Yes when the entity's duplicate detection window (``window`` seconds; 0: off)
    has passed since that attempt, or is unknown (None)."""
    return window is None or (moved - attempted).total_seconds() > window


def is_parked(dead_letter_reason: str | None) -> bool:
    """True when a message dead-lettered in a backlog queue with this reason stays there (pure)."""
    return (dead_letter_reason or "").split(":")[0].strip() in PARKED_REASONS


def attempt_of(delivery_count: int | None) -> int:
    """Which delivery of a backlog message this is, from its received ``delivery_count`` (the prior deliveries
    that were abandoned or whose lock ran out; 0 on the first, the AMQP header's count): 1 on the first."""
    return max(int(delivery_count or 0), 0) + 1


def undelivered_verdict(error_class: str | None, delivery_count: int | None, max_attempts: int) -> str:
    """What becomes of a backlog message the primary did not take (pure; SPEC B9, F9): :data:`DEAD_LETTER` when
    the send answered that the destination does not exist (``error_class`` :data:`ENTITY_NOT_FOUND`) and this is
    at least its ``max_attempts``-th delivery; :data:`ABANDON` (tried again later) otherwise. Any other failure
    (an outage, a timeout, a disabled or full entity, no answer at all: ``None``) abandons, however many
    deliveries: an outage never dead-letters."""
    if error_class == ENTITY_NOT_FOUND and attempt_of(delivery_count) >= max_attempts:
        return DEAD_LETTER
    return ABANDON


#: O7: an ordered line's message is abandoned after a failed attempt (its delivery count rises) only while its count
#: is below this; from then on a failed attempt defers it (the count stays). The count is the service's, shared by
#: every worker, and a line may wait behind its head for the whole of an outage.
ABANDONED_ATTEMPTS = 1


def keeps_count(error_class: str | None, delivery_count: int | None) -> bool:
    """O7 (pure): should a message of an ordered line that the primary did not take be deferred (its delivery count
    stays) rather than abandoned? Yes once its count reached :data:`ABANDONED_ATTEMPTS` - an entity whose probes
    answer while its sends fail gets a real attempt per pass from every worker new to it, and a backlog queue with
    a bounded ``MaxDeliveryCount`` would dead-letter the head (out of its line's order). Never for a destination
    that answered not-found: each delivery counts towards its verdict (F9)."""
    return error_class != ENTITY_NOT_FOUND and max(int(delivery_count or 0), 0) >= ABANDONED_ATTEMPTS


def due_for_verdict(delivery_count: int | None, max_attempts: int) -> bool:
    """True when a not-found answer to this delivery would dead-letter the message (pure)."""
    return undelivered_verdict(ENTITY_NOT_FOUND, delivery_count, max_attempts) == DEAD_LETTER


def not_found_description(entity: str, namespace: str, attempts: int) -> str:
    """The ``DeadLetterErrorDescription`` of a message whose destination does not exist (no secret: the
    namespace is its host name)."""
    return (
        f"{DESTINATION_NOT_FOUND}: the primary entity {entity!r} does not exist in namespace {namespace} "
        f"(entity_not_found at delivery {attempts}; syphon.max_attempts reached)"
    )


def too_large_description(entity: str, namespace: str, body_bytes: int, limit: int | None) -> str:
    """The ``DeadLetterErrorDescription`` of a message larger than its primary entity takes (SPEC B13; no secret:
    the namespace is its host name). ``limit``: the entity's message limit in bytes, None when only its refusal
    is known."""
    takes = (
        f"takes messages up to {limit} bytes" if limit else "refused it as too large (message size exceeded)"
    )
    return (
        f"{TOO_LARGE_FOR_DESTINATION}: the primary entity {entity!r} in namespace {namespace} {takes}; this "
        f"message's body alone is {body_bytes} bytes (the syphon leaves it here: raise the entity's "
        "max_message_size_in_kilobytes and resubmit it)"
    )


# ------------------------------------------------------------------------------------------- entity gate
class EntityGate:
    """Which primary entities the syphon may move to now (B9). Pure bookkeeping on an injected clock.

    ``decide(entity)`` returns ``"send"`` (a recent success, or the hints say healthy), ``"probe"`` (probe it
    first) or ``"wait"`` (backing off after a failure: abandon its messages). A failure that is the namespace's
    (:func:`spark_sb.failover.decisions.namespace_wide`) backs off every entity at once (SPEC F1, F4): a backlog holding
    messages for 200 entities costs one probe of a primary that does not answer, not 200. The per-entity maps
    are bounded by the entities met in the backlog.
    """

    def __init__(self, clock: Clock, *, ok_for: float, backoff: float) -> None:
        self.clock = clock
        self.ok_for = ok_for
        self.backoff = backoff
        self.hints: dict[str, str] = {}
        self._ok_until: dict[str, float] = {}
        self._backoff_until: dict[str, float] = {}
        self._namespace_until = 0.0  # the whole namespace backs off until then (a namespace-wide failure)

    def set_hints(self, hints: Mapping[str, str] | None) -> None:
        """The state table's view, entity -> state (``healthy`` / ``failing`` / ``failed_over``)."""
        self.hints = dict(hints or {})

    def decide(self, entity: str) -> str:
        now = self.clock.monotonic()
        if self._namespace_until > now or self._backoff_until.get(entity, 0.0) > now:
            return "wait"
        if self._ok_until.get(entity, 0.0) > now:
            return "send"
        if entity not in self._backoff_until and self.hints.get(entity) == "healthy":
            return "send"
        return "probe"

    def known_good(self, entity: str) -> bool:
        """A success of this process's, recent (``ok_for``): not a hint, which may be stale."""
        return self._ok_until.get(entity, 0.0) > self.clock.monotonic() and self.decide(entity) == "send"

    def succeeded(self, entity: str) -> None:
        self._backoff_until.pop(entity, None)
        self._namespace_until = 0.0  # the namespace answered
        self._ok_until[entity] = self.clock.monotonic() + self.ok_for

    def failed(self, entity: str, *, namespace_wide: bool = False) -> None:
        now = self.clock.monotonic()
        self._ok_until.pop(entity, None)
        self._backoff_until[entity] = now + self.backoff
        if namespace_wide:
            self._ok_until.clear()  # no entity of a namespace that does not answer is known good any more
            self._namespace_until = now + self.backoff
