"""The backlog queue as the syphon sees it (SPEC B12, O6, O7): received messages with the local time their locks
run out, the queue's view extended by peeks (only where a message not received could be), deferred messages
fetched by sequence number.

Part of :class:`~spark_sb.syphon.mover.Syphon` (:mod:`spark_sb.syphon.base` lists the parts); the view and the
peek rule are :mod:`spark_sb.syphon.lines`. Why: docs/design/syphon.md. Where it runs: in the syphon's process,
on the thread that drains.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from spark_sb.syphon.base import SyphonBase, log
from spark_sb.syphon.lines import ACTIVE, PEEK_PAGE, QueueView, next_peek
from spark_sb.syphon.receivers import Held, Pairs, as_utc
from spark_sb.syphon.rules import SyphonOutcome
from spark_sb.wire.receivers import ReceiverLane, Receiving

if TYPE_CHECKING:  # pragma: no cover
    from azure.servicebus import ServiceBusReceivedMessage


class Peeking(SyphonBase):
    """The syphon's part that looks at a backlog queue: locks, peeks, fetches."""

    def _held(self, messages: Sequence[ServiceBusReceivedMessage], generation: int, since: float) -> Pairs:
        """The received messages, each with the local monotonic time its lock runs out (B12): ``since`` (the receive
        began; the lock was taken after) plus the lock duration, less how much older its lock is than the newest of
        the batch (the service's timestamps compared with each other only: no skew)."""
        stamps = [getattr(m, "locked_until_utc", None) for m in messages]
        newest = max((as_utc(t) for t in stamps if t is not None), default=None)
        out: Pairs = []
        for m in messages:
            locked_until = getattr(m, "locked_until_utc", None)
            ends = None
            if locked_until is not None and newest is not None:
                older = (newest - as_utc(locked_until)).total_seconds()
                ends = since + self.lock_duration - max(older, 0.0)
            out.append(Held(m, generation, lock_ends=ends))
        return out

    def _look(
        self,
        lane: ReceiverLane,
        view: QueueView,
        held: Pairs | None,
        outcome: SyphonOutcome,
    ) -> None:
        """Extend ``view`` by peeks, each within ``send_timeout``: with ``held`` (a receive batch, every one with a
        sequence number) through the last of them, peeking only where a message they are not could be
        (:func:`~spark_sb.syphon.lines.next_peek`); without (a receive came back empty), to the end of the queue in
        pages of :data:`PEEK_PAGE`. A failed peek marks the view failed (nothing past what it covers moves)."""
        if held is None:
            self._look_to_end(lane, view, outcome)
            return
        for h in held:  # present, locked by this pass
            if h.sequence is not None:
                view.add(h.sequence, self._line(lane, h), ACTIVE)
        received = sorted({h.sequence for h in held if h.sequence is not None})
        covered = view.through
        while True:
            covered, wanted = next_peek(covered, received)
            if wanted is None:
                break
            start, count = wanted
            fresh = self._peek(lane, view, start, count, outcome)
            if fresh is None:
                break
            if not fresh:  # nothing present from ``start`` on: nothing hides before the last received
                covered = max(covered, received[-1])
                break
            covered = max(covered, fresh[-1])
        view.through = max(view.through, covered)

    def _look_to_end(self, lane: ReceiverLane, view: QueueView, outcome: SyphonOutcome) -> None:
        while True:
            fresh = self._peek(lane, view, view.through + 1, PEEK_PAGE, outcome)
            if not fresh:
                return
            view.through = max(view.through, fresh[-1])
            if len(fresh) < PEEK_PAGE:  # the end of the queue, as of this peek
                return

    def _peek(
        self, lane: ReceiverLane, view: QueueView, start: int, count: int, outcome: SyphonOutcome
    ) -> list[int] | None:
        """One peek of up to ``count`` messages from sequence number ``start`` into ``view``: the sequence numbers it
        listed from ``start`` on, in order; None when it failed (the view is marked failed)."""
        timeout = float(self.config.send_timeout)

        def peek(ctx: Receiving) -> list[ServiceBusReceivedMessage]:
            # sequence_number 0 would mean "after the last peeked" to the SDK: the queue starts at 1
            return ctx.receiver.peek_messages(
                max_message_count=count, sequence_number=max(start, 1), timeout=timeout
            )

        outcome.peek_calls += 1
        try:
            page = lane.call(peek, timeout)
        except Exception as exc:  # noqa: BLE001 - B11: nothing past the view moves in this pass
            view.failed = True
            if self.ordered:
                outcome.errors.append(f"{view.queue}: peek failed: {type(exc).__name__}")
                log.warning("syphon: peek of %s failed (%s)", view.queue, type(exc).__name__)
            else:  # only a look for deferred messages (left by an ordered syphon): the next pass looks again
                log.info("syphon: peek of %s failed (%s)", view.queue, type(exc).__name__)
            return None
        outcome.peeked += len(page)
        listed: list[int] = []
        for m in page:
            seq = getattr(m, "sequence_number", None)
            if seq is None or seq < start:
                continue
            state = int(getattr(m, "state", ACTIVE) or ACTIVE)
            view.add(seq, self._line_of(lane, m), state)
            listed.append(seq)
        return sorted(listed)

    def _fetch(
        self, lane: ReceiverLane, sequences: list[int], outcome: SyphonOutcome
    ) -> list[ServiceBusReceivedMessage] | None:
        """Deferred messages by sequence number (locked now, settled through ``$management``); None when the call
        failed (another syphon holds one of them, or the connection failed)."""
        timeout = float(self.config.send_timeout)

        def fetch(ctx: Receiving) -> list[ServiceBusReceivedMessage]:
            return ctx.receiver.receive_deferred_messages(sequences, timeout=timeout)

        outcome.fetch_calls += 1
        try:
            got = lane.call(fetch, timeout)
        except Exception as exc:  # noqa: BLE001 - the line waits; nothing is lost
            log.info("syphon: fetching %d deferred messages failed (%s)", len(sequences), type(exc).__name__)
            return None
        outcome.fetched += len(got)
        return got
