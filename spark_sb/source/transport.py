"""What the source's protocol needs from a namespace: the driver's link on one entity and the executors' peeks.

The protocol code (:mod:`~spark_sb.source.planner`, :mod:`~spark_sb.source.settle`, :mod:`~spark_sb.source.reader`)
speaks only these protocols, so that it runs on a fake transport and a fake clock in unit tests and the seeded
simulation of crash windows, and on the SDK (:mod:`~spark_sb.source.sdk`) in production. Every call takes a
``timeout`` in seconds and returns or raises within it (SPEC F8); a namespace fault raises
:class:`~spark_sb.core.errors` classes the sender already knows (connection, throttling, timeout).

Where it runs: :class:`EntityLink` on the driver (the planner process), :class:`Peeker` on executors (one per
process, cached). Neither is picklable; :class:`Received` is not, :class:`Peeked` is not (it holds the SDK message).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

#: A message's state as peek shows it (``x-opt-message-state``): active 0, deferred 1, scheduled 2.
ACTIVE, DEFERRED, SCHEDULED = 0, 1, 2


class NotFound(Exception):
    """A delete by sequence number named a number that is not a deferred message of the entity (the service fails
    the whole request: ``com.microsoft:message-not-found``). The settle step bisects."""


@dataclass(frozen=True)
class Received:
    """A message the driver received peek-locked and holds until ``partitions()`` defers it."""

    seq: int
    #: Its encoded size in bytes (for ``maxBytesPerTrigger`` and the offset's ``bytes``).
    size: int
    delivery_count: int
    #: The transport's handle (the SDK message and the link generation that received it): settles go on that link.
    handle: Any
    #: When its lock ends, on the planner's monotonic clock.
    locked_until: float


@dataclass(frozen=True)
class Peeked:
    """A message peek showed: its number, state (ACTIVE, DEFERRED, SCHEDULED) and the message (a row's source)."""

    seq: int
    state: int
    message: Any


@dataclass(frozen=True)
class EntityCounts:
    """The admin counts of one entity (``CountDetails``) and when it was created (the offset's epoch)."""

    active: int
    dead_letter: int
    scheduled: int
    transfer: int
    transfer_dead_letter: int
    total: int
    created_at: str

    @property
    def deferred(self) -> int:
        """Deferred messages: the total less every other kind (SOURCE.md §6)."""
        return max(
            0,
            self.total
            - self.active
            - self.dead_letter
            - self.scheduled
            - self.transfer
            - self.transfer_dead_letter,
        )


class EntityLink(Protocol):
    """The driver's peek-lock receive link on one entity (prefetch 0) and its management calls. Settles of a
    :class:`Received` go on the link that received it; a handle from an older link fails as a lost lock."""

    def receive(self, max_count: int, wait: float, timeout: float) -> list[Received]:
        """Up to ``max_count`` messages, waiting at most ``wait`` for the first (then what is there)."""

    def renew(self, held: Sequence[Received], timeout: float) -> dict[int, float]:
        """Renew the locks of ``held`` (batched ``renew-lock``): new ``locked_until`` by sequence number; a number
        missing lost its lock."""

    def defer(self, held: Sequence[Received], timeout: float) -> set[int]:
        """Defer ``held`` on their link (``modified``, undeliverable-here; range dispositions, one wait): the
        sequence numbers deferred. A lost lock is left out, never raised."""

    def complete(self, held: Sequence[Received], timeout: float) -> set[int]:
        """Complete ``held`` on their link (range dispositions, one wait): the numbers completed."""

    def delete(self, seqs: Sequence[int], timeout: float) -> None:
        """Delete deferred messages by number (receive-by-sequence-number in receive-and-delete mode, one request,
        no retry). Raises :class:`NotFound` if any number is not a deferred message: nothing was deleted."""

    def peek(self, from_seq: int, count: int, timeout: float) -> list[Peeked]:
        """Up to ``count`` messages from ``from_seq`` in sequence order, any state, no side effects."""

    def counts(self, timeout: float) -> EntityCounts:
        """The entity's admin counts."""

    def close(self) -> None:
        """Close the link and its connection (in the background; never blocks past a short deadline)."""


class Peeker(Protocol):
    """The executors' side: peeks by sequence number through a process-level client cache (one connection per
    namespace, SPEC F2)."""

    def peek(self, entity: str, from_seq: int, count: int, timeout: float) -> list[Peeked]:
        """As :meth:`EntityLink.peek`, for ``entity`` (``queue`` or ``topic/subscriptions/name``)."""
