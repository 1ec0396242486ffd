"""Ordering in one send call (:mod:`spark_sb.failover.ordering`): :class:`LineGate` answers whether a line's next
message goes to its backlog queue although its entity is healthy (R3, R5), and whether a primary batch holds a line
the call diverted; :func:`stopped` is R4's error. Runs on the sender's thread; not picklable. Used only while the
session book holds something (the healthy path never gets here).

A message's line - (entity, key) - is decided once, where it comes into
:meth:`~spark_sb.sender.paired.PairedSender.send` (:func:`~spark_sb.failover.ordering.order_key`), and its key
travels with it (:data:`Keys`): beside the messages of its open primary batch, of that batch once it leaves (parked,
delivered, split, diverted), and of its open backlog batch (:class:`~spark_sb.sender.diverter.Open`). The gate, the
sender and the diverter read it there; none decides it again. With ``ordering: none`` no keys are kept.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from spark_sb.failover.ordering import QueueUnavailableError
from spark_sb.failover.outcome import Tally
from spark_sb.sender.context import SendContext

#: The line keys of a batch's messages, in their order: each message's session id (``ordering: session``; None
#: for a message without one, which keeps no order) or :data:`~spark_sb.failover.ordering.WHOLE_ENTITY`
#: (``entity``); the line's entity is the batch's. Empty with ``ordering: none`` (no keys are kept). Bounded by the
#: batch's messages.
Keys = Sequence[str | None]
#: A call's open primary batches' line keys, by entity (ordering on; bounded by those batches' messages).
OpenKeys = defaultdict[str, list[str | None]]


class LineGate:
    """The ordering questions of one :class:`~spark_sb.sender.paired.PairedSender` (its :class:`SendContext`)."""

    def __init__(self, ctx: SendContext) -> None:
        self._ctx = ctx

    def held(self, entity: str, key: str | None, tally: Tally, open_keys: Mapping[str, Keys]) -> bool:
        """Ordering: does the next message of the line (``entity``, ``key``), which its entity would send to the
        primary, go to its backlog queue instead? Yes while the line is held (R3; the book releases it when drained);
        never for a message that keeps no order (``key`` None; ordering off).
        A line with a message in the call's open primary batch (``open_keys``: by entity) stays on the primary
        for the call even when another thread holds it meanwhile - unless the call diverted it since: an unsent
        message is never overtaken through the backlog, nor a diverted one through the primary. Runs only while the
        book holds something (the healthy path never gets here)."""
        if key is None:
            return False
        line = (entity, key)
        if line in tally.direct and line not in tally.ordered:
            return False
        book = self._ctx.book
        assert book is not None
        if book.route(entity, key, False) is None:
            return False
        if line not in tally.ordered and key in open_keys.get(entity, ()):
            tally.direct.add(line)
            return False
        if line not in tally.ordered and tally.return_wait > 0:
            # R5: its entity is back and the syphon is about to pass its newest marker: wait for it (bounded per
            # call) rather than divert behind it again - a steady sender would chase the syphon for ever
            tally.return_wait -= book.await_return(entity, key, tally.return_wait)
            if book.route(entity, key, False) is None:
                return False
        return True

    @staticmethod
    def diverted(entity: str, keys: Keys, tally: Tally) -> bool:
        """Ordering: does a primary batch of ``entity`` (its messages' line keys: ``keys``) hold a message of a line
        this call diverted since it was packed (its entity failed over and back within the call)? Then the batch
        follows them to the backlog."""
        if not keys or not tally.ordered:
            return False
        return any((entity, key) in tally.ordered for key in keys)


def stopped(tally: Tally) -> QueueUnavailableError:
    """R4: the lines whose pinned backlog queue failed in this call, in one error (the others went out)."""
    (entity, key), why = next(iter(tally.stopped.items()))
    more = f" (and {len(tally.stopped) - 1} more lines)" if len(tally.stopped) > 1 else ""
    return QueueUnavailableError(
        f"ordering: {why}{more}; the messages of these lines from there on were not sent (nothing of them "
        "went to another queue, which would let the syphon move later messages first); every other message "
        "of the call was sent or diverted"
    )
