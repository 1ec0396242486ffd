"""Ordering in one send call (:mod:`spark_sb.failover.ordering`): :class:`LineGate` answers whether a line's next
message goes to its backlog queue although its entity is healthy (R3, R5), and whether a primary batch holds a line
the call diverted; :func:`stopped` is R4's error. Runs on the sender's thread; not picklable. Used only while the
session book holds something (the healthy path never gets here).
"""

from __future__ import annotations

from spark_sb.failover.ordering import QueueUnavailableError, order_key
from spark_sb.failover.outcome import Tally
from spark_sb.sender.context import SendContext
from spark_sb.wire.transport import Batch


class LineGate:
    """The ordering questions of one :class:`~spark_sb.sender.paired.PairedSender` (its :class:`SendContext`)."""

    def __init__(self, ctx: SendContext) -> None:
        self._ctx = ctx
        self._config = ctx.config

    def held(self, entity: str, key: str, tally: Tally, open_batch: Batch | None) -> bool:
        """Ordering: does the next message of the line (``entity``, ``key``), which its entity would send to the
        primary, go to its backlog queue instead? Yes while the line is held (R3; the book releases it when drained).
        A line with a message in the call's open primary batch (``open_batch``) stays on the primary for the call
        even when another thread holds it meanwhile - unless the call diverted it since: an unsent message is never
        overtaken through the backlog, nor a diverted one through the primary. Runs only while the book holds
        something (the healthy path never gets here)."""
        line = (entity, key)
        if line in tally.direct and line not in tally.ordered:
            return False
        book = self._ctx.book
        assert book is not None
        if book.route(entity, key, False) is None:
            return False
        if line not in tally.ordered and open_batch is not None and self.has_line(open_batch, line):
            tally.direct.add(line)
            return False
        if line not in tally.ordered and tally.return_wait > 0:
            # R5: its entity is back and the syphon is about to pass its newest marker: wait for it (bounded per
            # call) rather than divert behind it again - a steady sender would chase the syphon for ever
            tally.return_wait -= book.await_return(entity, key, tally.return_wait)
            if book.route(entity, key, False) is None:
                return False
        return True

    def has_line(self, batch: Batch, line: tuple[str, str]) -> bool:
        """Does ``batch`` hold a message of ``line``?"""
        ordering, default = self._config.ordering, self._config.entity
        return any(
            (m.entity or default or "", order_key(ordering, m.session_id)) == line for m in batch.messages
        )

    def diverted(self, batch: Batch, tally: Tally) -> bool:
        """Ordering: does a primary batch hold a message of a line this call diverted since it was packed (its
        entity failed over and back within the call)? Then the batch follows them to the backlog."""
        if self._ctx.book is None or not tally.ordered:
            return False
        ordering, default = self._config.ordering, self._config.entity
        return any(
            (m.entity or default or "", order_key(ordering, m.session_id)) in tally.ordered
            for m in batch.messages
        )


def stopped(tally: Tally) -> QueueUnavailableError:
    """R4: the lines whose pinned backlog queue failed in this call, in one error (the others went out)."""
    (entity, key), why = next(iter(tally.stopped.items()))
    more = f" (and {len(tally.stopped) - 1} more lines)" if len(tally.stopped) > 1 else ""
    return QueueUnavailableError(
        f"ordering: {why}{more}; the messages of these lines from there on were not sent (nothing of them "
        "went to another queue, which would let the syphon move later messages first); every other message "
        "of the call was sent or diverted"
    )
