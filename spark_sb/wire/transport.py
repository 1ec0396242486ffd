"""The seam between the paired sender and Service Bus: the interface a transport offers.

:class:`Transport` is what :class:`~spark_sb.sender.paired.PairedSender` (and the syphon) need: size-bounded batches
(:class:`Batch`) for a :class:`Target` (namespace + entity), sending one batch, scheduling and cancelling a probe
message, telling a namespace's fault from an entity's, and closing. Every method may raise the SDK's exceptions;
:func:`spark_sb.core.errors.classify` says what they mean. The real one is :class:`~spark_sb.wire.sdk_transport.
SdkTransport`; unit tests use a fake behind this interface (``tests/unit/fakes.py``). No I/O here; picklable values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from spark_sb.message.outbound import OutboundMessage
from spark_sb.wire.parking import Parked

__all__ = ["PRIMARY", "SECONDARY", "Batch", "Target", "Transport"]

PRIMARY = "primary"
SECONDARY = "secondary"


@dataclass(frozen=True)
class Target:
    """Where a batch goes: ``namespace`` is ``"primary"`` or ``"secondary"``; ``entity`` a queue or topic."""

    namespace: str
    entity: str

    def __str__(self) -> str:
        return f"{self.namespace}:{self.entity}"


class Batch(Protocol):
    """A size-bounded batch of messages for one target, built by :meth:`Transport.new_batch`."""

    target: Target

    @property
    def messages(self) -> list[OutboundMessage]:
        """The messages added with :meth:`try_add`, in order (to re-send or divert them on failure)."""

    def try_add(self, message: OutboundMessage) -> bool:
        """Add ``message`` if it fits; False if it does not (the batch is unchanged). May raise
        ``spark_sb.message.outbound.RejectError`` / ``ValueError`` / ``TypeError`` when it cannot become an SDK message."""

    def try_add_backlog(
        self,
        original: OutboundMessage,
        entity: str,
        enqueued: datetime,
        prepared: object | None = None,
        ambiguous: datetime | None = None,
    ) -> bool:
        """Add the backlog translation (SPEC B6) of ``original``, destined for ``entity``, if it fits; translated
        and encoded once. ``prepared``: that translation made ahead by :meth:`Transport.prepare_backlog` (its
        ``enqueued`` time is then the one recorded). ``ambiguous``: when its primary send that may have landed was
        attempted (SPEC B14; never with ``prepared``). The caller keeps the originals. Raises like :meth:`try_add`."""

    def __len__(self) -> int: ...


class Transport(Protocol):
    """The paired sender's view of Service Bus. Every operation that does I/O takes ``timeout`` (seconds) and
    returns or raises within it (a :class:`~spark_sb.wire.lane.DeadlineExceeded` past it; :meth:`send` may take
    :data:`~spark_sb.wire.timing.RESCUE_ROOM` more to move to a fresh connection when its own is found dead
    while it waits, SPEC L1). May be called from the
    sender's thread and its probe thread."""

    def max_batch_size(self, target: Target) -> int:
        """The size limit in bytes of a batch for ``target`` (no I/O)."""

    def max_message_size(self, target: Target) -> int:
        """The size limit in bytes of one message for ``target`` (no I/O): at least :meth:`max_batch_size`; a
        message between the two goes alone, in a batch of its own (SPEC B13)."""

    def new_batch(self, target: Target) -> Batch:
        """An empty batch for ``target`` (no I/O)."""

    def send(
        self,
        batch: Batch,
        timeout: float,
        on_slow: Callable[[], None] | None = None,
        park_after: float | None = None,
    ) -> None:
        """Send one batch; returns when the service accepted it; raises SDK exceptions - one that ended the send
        after the batch was written to its link carries :func:`~spark_sb.core.errors.mark_written`'s mark (the
        batch may have landed: SPEC B14). ``on_slow`` is called
        (on the caller's thread or a watchdog thread: it must not block and must be thread-safe) if no answer has
        come :data:`~spark_sb.wire.timing.SLOW_MARGIN` before the deadline: the caller may prepare for the failure
        (e.g. open the backlog's link). ``park_after`` (seconds): a send not answered by then on a connection that
        answers raises :class:`~spark_sb.wire.parking.Parked` instead of waiting on (the batch stays on the wire);
        the caller finishes it with :meth:`resume`, and sends nothing else to that entity meanwhile."""

    def resume(
        self, parked: Parked, on_slow: Callable[[], None] | None = None, park_after: float | None = None
    ) -> None:
        """Finish a send that :meth:`send` parked: returns or raises as that send would have, within its deadline;
        ``park_after``: raises :class:`~spark_sb.wire.parking.Parked` again if not answered by then."""

    def schedule(self, target: Target, message: OutboundMessage, at: datetime, timeout: float) -> int:
        """Schedule ``message`` on ``target`` for ``at``; returns its sequence number."""

    def cancel_scheduled(self, target: Target, sequence_number: int, timeout: float) -> None:
        """Cancel a scheduled message."""

    def connected(self, target: Target) -> bool:
        """True when ``target``'s link answered a call within the last
        :data:`~spark_sb.wire.timing.CONNECTED_FRESH` seconds and its client was not replaced since: a send needs
        no new connection, so its deadline need not allow for one (no I/O)."""

    def answered_within(self, target: Target, seconds: float) -> bool:
        """True when ``target``'s namespace answered anything (on any link of its connection, heartbeats
        included) in the last ``seconds`` seconds: a failure then was the entity's, not the namespace's (SPEC F1,
        :func:`spark_sb.failover.decisions.namespace_wide`). No I/O."""

    def prepare(self, targets: Iterable[Target], silence: float) -> dict[Target, BaseException]:
        """Open the links to ``targets`` that are not open yet, concurrently (SPEC F3), within a deadline that
        grows with their number; the per-target errors are returned, a namespace's connection failure (or
        ``silence`` seconds without an answer) is raised."""

    def prepare_backlog(self, original: OutboundMessage, entity: str, enqueued: datetime) -> object:
        """The backlog translation of ``original`` made ahead of its batch (translated and encoded while the
        sender waits anyway), for :meth:`Batch.try_add_backlog`. No I/O; thread-safe; raises like
        :meth:`Batch.try_add`."""

    def warm(self, target: Target) -> None:
        """Open the link to ``target`` in the background (never blocks), so that a send soon after is fast."""

    def isolated(self) -> Transport:
        """The same namespaces over connections of their own, which healthy sends never use (SPEC F6): probes of
        failed-over entities go there, so that an entity that stalls holds its own connection, never the one the
        namespace's healthy entities send on. Closed with this transport. No I/O."""

    def fault(self, target: Target) -> None:
        """The client of ``target`` faulted (a connection-class error): close it (in the background); it is
        rebuilt on next use. Other targets' clients - the backlog's above all - stay open."""

    def close(self) -> None:
        """Close both clients (in the background: never blocks)."""
