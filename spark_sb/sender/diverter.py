"""Diverting to the backlog (SPEC B4-B7): a failed-over entity's messages are translated once (B6), straight into
the open batch of their backlog queue - chosen at random and kept for the entity until the next batch boundary, or
by session (B4) - and sent; a queue that fails is pulled from the rotation and its messages go to another (B5).
Also the rejects of a call (B7, S6): a message that cannot become an SDK message, or does not fit a batch even
alone, is recorded (``on_reject: skip``) or fails the call (``on_reject: fail``).

With ``ordering`` ``session`` / ``entity`` (:mod:`spark_sb.failover.ordering`) a message of an ordered line goes to
the queue its line is pinned to (R1), never elsewhere (R4: when that queue fails the line stops for the rest of the
call, ``Tally.stopped``), and :meth:`Diverter.close_lines` puts a return marker behind each line the call diverted
(R2). Markers are never re-routed to another queue and never counted as diverted messages. A message's line comes
with it, decided where it entered the sender (:mod:`spark_sb.sender.lines`); :meth:`Diverter.divert` and
:meth:`Diverter.to_backlog` decide it for a caller that hands messages in without one.

Where it runs: on a paired sender's thread, in an executor's Python worker; not picklable. What bounds it: one
open backlog batch per backlog queue in a call (``backlog_queue_count``), the call's own messages.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from spark_sb.core.errors import MessageRejectedError, NoBacklogAvailableError, SendError, describe_error
from spark_sb.failover.decisions import Verb, Where, backoff_delay
from spark_sb.failover.ordering import QueueUnavailableError, order_key, return_marker
from spark_sb.failover.outcome import Tally, message_row, namespace_description
from spark_sb.message.backlog import ReturnMarker
from spark_sb.message.outbound import OutboundMessage, Reject, RejectError
from spark_sb.message.rows import row_to_json
from spark_sb.sender.attempts import AttemptLoop, Progress
from spark_sb.sender.context import SendContext
from spark_sb.sender.lines import Keys
from spark_sb.wire.transport import SECONDARY, Batch, Target


class Open:
    """An open batch and, for a backlog batch, the original of each translated message in it, its entity and -
    ``ordered`` (ordering on) - its line key, carried from where the message came in (:data:`Keys`); all three
    bounded by the batch's messages. Its return markers are the :class:`ReturnMarker` among the originals (the
    backlog translation, :func:`~spark_sb.message.backlog.to_backlog`, lets no other message carry a marker)."""

    __slots__ = ("ambiguous", "batch", "entities", "keys", "markers", "originals", "started")

    def __init__(self, batch: Batch, started: datetime, ordered: bool = False) -> None:
        self.batch = batch
        self.originals: list[OutboundMessage] = []
        self.entities: list[str] = []
        self.keys: list[str | None] | None = [] if ordered else None
        self.started = started  # the backlog enqueue time recorded in its messages (B6)
        self.markers = 0  # return markers among the originals (ordering): not messages of the caller's
        # SPEC B14: index of an original -> when its primary send that may have landed was attempted; made only for
        # such messages (a batch sent out with its primary attempt in doubt), bounded by the originals
        self.ambiguous: dict[int, datetime] | None = None

    def add(
        self, original: OutboundMessage, entity: str, key: str | None, ambiguous: datetime | None = None
    ) -> None:
        """Keep ``original``, added to the batch, with its entity and line key (a split, a marker: not the hot path,
        which :meth:`Diverter.place` keeps inline) and when its primary send was attempted, if in doubt."""
        self.originals.append(original)
        self.entities.append(entity)
        if self.keys is not None:
            self.keys.append(key)
        if isinstance(original, ReturnMarker):
            self.markers += 1
        if ambiguous is not None:
            self.doubt(len(self.originals) - 1, ambiguous)

    def doubt(self, i: int, at: datetime) -> None:
        """The ``i``-th original's primary send, attempted at ``at``, may have landed (SPEC B14)."""
        if self.ambiguous is None:
            self.ambiguous = {}
        self.ambiguous[i] = at

    def attempted(self, i: int) -> datetime | None:
        """When the ``i``-th original's primary send that may have landed was attempted (None: it did not)."""
        return None if self.ambiguous is None else self.ambiguous.get(i)

    def key(self, i: int) -> str | None:
        """The line key of the ``i``-th original (None: ordering off, or a message that keeps no order)."""
        return None if self.keys is None else self.keys[i]

    def holds_lines(self) -> bool:
        """Does the batch hold messages (or markers) of ordered lines, which cannot go to another queue?"""
        return bool(self.markers) or (self.keys is not None and any(k is not None for k in self.keys))

    def counted(self) -> tuple[int, list[str]]:
        """The caller's messages in the batch and the entity of each (return markers left out)."""
        if not self.markers:
            return len(self.originals), self.entities
        entities = [
            e for m, e in zip(self.originals, self.entities, strict=True) if not isinstance(m, ReturnMarker)
        ]
        return len(entities), entities


def _made_ahead(progress: Progress | None) -> tuple[list[object | None] | None, datetime | None]:
    """The translations of a batch made ahead, and when its primary attempt that may have landed began (SPEC B14):
    then its messages carry that time, and what was made ahead without it is not used."""
    doubt = progress.ambiguous if progress is not None else None
    if doubt is not None or progress is None or progress.ahead is None:
        return None, doubt
    return progress.ahead(), None


class Rejects:
    """A call's rejected messages (B7, S6): recorded in the tally, or - ``on_reject: fail`` - raised."""

    def __init__(self, ctx: SendContext) -> None:
        self._config = ctx.config
        self._transport = ctx.transport

    def try_add(
        self, batch: Batch, msg: OutboundMessage, tally: Tally, entity: str, index: int | None
    ) -> bool | None:
        """True added, False does not fit, None rejected (cannot become an SDK message)."""
        try:
            return batch.try_add(msg)
        except (ValueError, TypeError) as err:  # RejectError is a ValueError
            self.cannot_build(tally, msg, err, entity, index)
        return None

    def cannot_build(
        self, tally: Tally, msg: OutboundMessage, err: Exception, entity: str, index: int | None
    ) -> None:
        if not isinstance(err, RejectError):
            err = RejectError(f"cannot build the message: {describe_error(err)}")
        self.reject(tally, msg, err, entity, index)

    def no_entity(self, tally: Tally, msg: OutboundMessage, index: int | None) -> None:
        why = RejectError("no destination entity: set the entity column or option", "entity")
        self.reject(tally, msg, why, None, index)

    def oversize(
        self,
        tally: Tally,
        msg: OutboundMessage,
        entity: str,
        batch: Batch,
        index: int | None,
        translated: bool,
    ) -> None:
        limit = self._transport().max_message_size(batch.target)
        when = "after backlog translation (B6 adds properties)" if translated else "encoded"
        reason = (
            f"message too large {when}: over the limit of {limit} bytes for one message (max_message_size)"
        )
        self.reject(tally, msg, RejectError(reason), entity, index)

    def reject(
        self, tally: Tally, msg: OutboundMessage, err: RejectError, entity: str | None, index: int | None
    ) -> None:
        row = message_row(msg)
        reject = Reject(
            reason=err.reason, field=err.field, row_json=row_to_json(row), entity=entity, row_index=index
        )
        if self._config.on_reject == "fail":
            raise MessageRejectedError(f"message rejected (on_reject = 'fail'): {err}", reject=reject)
        tally.rejects.append(reject)


@dataclass(eq=False, kw_only=True)
class Diverter:
    """Sends a failed-over entity's messages to the backlog queues of the secondary namespace, for one sender.

    Args:
        ctx: the sender's context (configuration, clock, registry - the rotation of pulled queues is the
            registry's -, backlog choice, transport).
        loop: the sender's attempt loop (backlog sends are retried by :data:`Where.BACKLOG`'s rules).
        rejects: the call's rejects.
    """

    ctx: SendContext
    loop: AttemptLoop
    rejects: Rejects

    def divert_batch(
        self,
        batch: Batch,
        keys: Keys,
        backlog: dict[str, Open],
        tally: Tally,
        progress: Progress | None = None,
    ) -> None:
        """Translate the messages of a primary ``batch`` (originals) into the open batches of their backlog queues
        (B4-B6); a full batch goes out at once, the rest with the call's other open backlog batches at its end.
        ``keys``: their line keys, carried with them from the sender (empty: ordering off). Not flushed here: a
        namespace outage diverts every entity's batch, and one backlog send per entity would cost a round trip
        per entity (F1)."""
        entity = batch.target.entity
        ahead, doubt = _made_ahead(progress)
        for i, m in enumerate(batch.messages):
            made = ahead[i] if ahead is not None else None
            self.place(backlog, m, entity, keys[i] if keys else None, None, tally, made, doubt)

    def divert(
        self,
        messages: Iterable[OutboundMessage],
        backlog: dict[str, Open],
        tally: Tally,
        progress: Progress | None = None,
    ) -> None:
        """:meth:`divert_batch` for messages handed in without their lines (of any entities): each message's line is
        decided here, once."""
        default = self.ctx.config.entity
        ahead, doubt = _made_ahead(progress)
        for i, m in enumerate(messages):
            made = ahead[i] if ahead is not None else None
            self.to_backlog(backlog, m, m.entity or default or "", None, tally, made, doubt)

    def to_backlog(
        self,
        backlog: dict[str, Open],
        msg: OutboundMessage,
        entity: str,
        index: int | None,
        tally: Tally,
        made: object | None = None,
        doubt: datetime | None = None,
    ) -> bool:
        """:meth:`place` for a message handed in without its line: its line is decided here, once."""
        key = order_key(self.ctx.config.ordering, msg.session_id) if self.ctx.book is not None else None
        return self.place(backlog, msg, entity, key, index, tally, made, doubt)

    def place(
        self,
        backlog: dict[str, Open],
        msg: OutboundMessage,
        entity: str,
        key: str | None,
        index: int | None,
        tally: Tally,
        made: object | None = None,
        doubt: datetime | None = None,
    ) -> bool:
        """Translate ``msg``, of the line (``entity``, ``key``) - decided where it came in; ``key`` None: it keeps
        no order - once, straight into the open batch of its backlog queue; True if a full batch was sent to make
        room. ``doubt``: when its primary send that may have landed was attempted (SPEC B14)."""
        session = msg.session_id
        queue: str | None
        if key is not None:  # an ordered line: its pinned queue or nowhere (R1, R4)
            book = self.ctx.book
            assert book is not None
            line = (entity, key)
            if line in tally.stopped:
                return False
            if not self.ctx.chooser.queues:
                raise self._no_backlog(entity)
            try:
                queue = book.diverted(
                    entity, key, self.ctx.chooser.queues, self._available, lambda q: self._try(q, tally)
                )
            except QueueUnavailableError as err:
                tally.stopped[line] = str(err)
                return False
            tally.ordered[line] = tally.ordered.get(line, 0) + 1
        else:
            queue = tally.sticky.get(entity) if session is None else None
        if queue is None:
            queue = self.ctx.chooser.choose(entity, session)
            if queue is None:
                raise self._no_backlog(entity)
            if session is None:  # the sticky choice holds until the next batch boundary (see _deliver)
                tally.sticky[entity] = queue
        slot = backlog.get(queue)
        if slot is None:
            slot = backlog[queue] = self._open(queue)
        try:  # the failed-over hot path (translated and encoded once)
            if slot.batch.try_add_backlog(msg, entity, slot.started, made, doubt):
                slot.originals.append(msg)
                slot.entities.append(entity)
                if slot.keys is not None:
                    slot.keys.append(key)  # its line goes with it
                if doubt is not None:
                    slot.doubt(len(slot.originals) - 1, doubt)
                return False
        except (ValueError, TypeError) as err:  # RejectError is a ValueError
            self.rejects.cannot_build(tally, msg, err, entity, index)
            return False
        if len(slot.batch) == 0:
            if (
                doubt is not None
            ):  # too large with its mark (B14): it goes without - no reject for a diagnostic
                return self.place(backlog, msg, entity, key, index, tally, made)
            self.rejects.oversize(tally, msg, entity, slot.batch, index, translated=True)
            return False
        del backlog[queue]
        self._send(slot, backlog, tally)
        self.place(backlog, msg, entity, key, index, tally, made, doubt)
        return True

    def _open(self, queue: str) -> Open:
        """An open batch for backlog ``queue``; with ordering on, its originals' line keys are kept beside them."""
        target = Target(SECONDARY, queue)
        return Open(self.ctx.transport().new_batch(target), self.ctx.clock.now(), self.ctx.book is not None)

    def _available(self, queue: str) -> bool:
        return self.ctx.registry.rotation.is_available(self.ctx.secondary_key, queue)

    @staticmethod
    def _try(queue: str, tally: Tally) -> bool:
        """SPEC O8: may a held line's pulled queue be tried in this call? Once: granted at the first meeting, refused
        after that try failed - so a blip shorter than the pull never stops a query (each task attempt tries)."""
        return tally.pinned_tries.setdefault(queue, True)

    def close_lines(self, backlog: dict[str, Open], tally: Tally, *, mark: bool = True) -> None:
        """R2, at the end of a call (after :meth:`flush`: the lines' messages are confirmed): close every line the
        call diverted in the book and, with ``mark``, send each its fresh return marker, behind its messages in
        its pinned queue - one batch per queue for all its lines. A line stopped by its queue (R4) gets no marker
        (the queue does not answer); nor does any line of a call that failed (``mark`` False): their markers come
        with their next call. A marker that cannot be sent leaves its line held until a newer one is acknowledged.
        """
        book = self.ctx.book
        lines, tally.ordered = tally.ordered, {}
        if book is None:
            return
        for (entity, key), diverted in lines.items():
            marker = book.close_call(entity, key, diverted)
            record = book.held(entity, key)
            if marker is None or record is None or not mark or (entity, key) in tally.stopped:
                continue
            self._try(record.queue, tally)  # O8: a pulled queue is tried once for its lines' markers too
            self._mark(backlog, record.queue, return_marker(entity, key, marker), (entity, key), tally)
        self.flush(backlog, tally)

    def remark(self, lines: Iterable[tuple[str, str]]) -> int:
        """R2 without a message (:meth:`~spark_sb.sender.paired.PairedSender.remark`): a fresh return marker behind
        each held line of ``lines`` ((entity, key) pairs) in its pinned queue; lines not held are skipped. Returns
        how many markers were sent; raises like :meth:`close_lines`."""
        book = self.ctx.book
        if book is None:
            return 0
        tally = Tally()
        tally.ordered = {line: 0 for line in lines if book.held(*line) is not None}
        count = len(tally.ordered)
        if count:
            self.close_lines({}, tally)
        return count

    def _mark(
        self,
        backlog: dict[str, Open],
        queue: str,
        marker: OutboundMessage,
        line: tuple[str, str],
        tally: Tally,
    ) -> None:
        slot = backlog.get(queue)
        if slot is None:
            slot = backlog[queue] = self._open(queue)
        if slot.batch.try_add_backlog(marker, line[0], slot.started):
            slot.add(marker, *line)
            return
        if len(slot.batch) == 0:  # pragma: no cover - an empty message always fits
            raise SendError("internal error: a return marker does not fit an empty batch")
        del backlog[queue]
        self._send(slot, backlog, tally)
        self._mark(backlog, queue, marker, line, tally)

    def _again(self, slot: Open, backlog: dict[str, Open], tally: Tally) -> None:
        """The originals of a batch its queue did not take go to the backlog again (B5), with the lines they came
        with; return markers do not (a marker elsewhere would say nothing of its line's queue: the line waits for
        a newer one)."""
        for i, (m, entity) in enumerate(zip(slot.originals, slot.entities, strict=True)):
            if not slot.markers or not isinstance(m, ReturnMarker):
                self.place(backlog, m, entity, slot.key(i), None, tally, None, slot.attempted(i))

    def flush(self, backlog: dict[str, Open], tally: Tally) -> None:
        """Send every open backlog batch (sending one may open more: a pulled queue's messages go elsewhere)."""
        while backlog:
            queue = next(iter(backlog))
            slot = backlog.pop(queue)
            if len(slot.batch) > 0:
                self._send(slot, backlog, tally)

    def _send(self, slot: Open, backlog: dict[str, Open], tally: Tally) -> None:
        """Send one translated batch and settle it: on the queue's failure pull it and send the originals
        elsewhere (B5)."""
        tally.sticky.clear()  # a batch boundary: a queue may be pulled now (here or by another sender)
        batch = slot.batch
        queue = batch.target.entity
        rotation, namespace = self.ctx.registry.rotation, self.ctx.secondary_key
        pulled = not rotation.is_available(namespace, queue)
        if pulled and not tally.pinned_tries.get(queue, False):
            # its queue was pulled while it was packed (settling the batch before it): send it elsewhere
            self._again(slot, backlog, tally)
            return
        transport = self.ctx.transport()
        # O8: a batch of ordered lines has nowhere else to go: its queue is tried for up to the backlog budget
        # (send_timeout) before it is pulled and the lines stop - once per call and queue. Whether the batch holds
        # such lines is looked at only once a send failed (a scan of the batch: not on the healthy backlog path).
        persist: bool | None = None
        progress = Progress(self.ctx.clock.monotonic())
        while True:
            result = self.loop.run(
                Where.BACKLOG,
                lambda timeout: transport.send(batch, timeout),
                tally,
                messages=len(batch),
                target=batch.target,
                progress=progress,
            )
            decision, cls = result.decision, result.error_class
            if decision is None:
                break
            if persist is None:
                persist = tally.pinned_tries.get(queue, True) and slot.holds_lines()
            if not persist or decision.verb is not Verb.PULL or cls is None or not cls.retry:
                break
            policy, clock = self.ctx.policy, self.ctx.clock
            left = policy.backlog_budget - (clock.monotonic() - progress.began)
            if left <= 0:
                break
            clock.sleep(min(backoff_delay(progress.attempts, policy.backoff_base, policy.backoff_cap), left))
        if result.decision is None:
            count, entities = slot.counted()
            tally.count_diverted(batch.target.entity, count, entities)
            if pulled:  # a held line's pulled queue answered (O8): back in the rotation for everyone
                rotation.mark_good(namespace, queue)
            return
        if persist:
            tally.pinned_tries[queue] = False
        verb = result.decision.verb
        if verb is Verb.SPLIT:
            half = len(slot.originals) // 2
            for lo, hi in ((0, half), (half, len(slot.originals))):
                sub = Open(self.ctx.transport().new_batch(batch.target), slot.started, slot.keys is not None)
                for i in range(lo, hi):
                    at = slot.attempted(i)
                    if not sub.batch.try_add_backlog(
                        slot.originals[i], slot.entities[i], slot.started, None, at
                    ):
                        raise SendError("internal error: a split batch does not fit")  # pragma: no cover
                    sub.add(slot.originals[i], slot.entities[i], slot.key(i), at)
                self._send(sub, backlog, tally)
        elif verb is Verb.REJECT:
            reason = "message too large after backlog translation: refused by the service"
            for m, entity in zip(slot.originals, slot.entities, strict=True):
                if not slot.markers or not isinstance(m, ReturnMarker):
                    self.rejects.reject(tally, m, RejectError(reason), entity, None)
        elif verb is Verb.PULL:
            assert result.error_class is not None and result.error is not None
            until = self.ctx.clock.monotonic() + float(self.ctx.config.backlog_retry_interval)
            tally.pulls.append(
                self.ctx.registry.rotation.pull(
                    self.ctx.secondary_key,
                    queue,
                    until,
                    result.error_class.name,
                    describe_error(result.error),
                )
            )
            self._again(slot, backlog, tally)
        else:
            raise self.loop.error(result, SECONDARY, queue)

    def _no_backlog(self, entity: str) -> NoBacklogAvailableError:
        if self.ctx.config.secondary is None or not self.ctx.chooser.queues:
            why = "no secondary namespace / backlog queues are configured"
        else:
            pulled = ", ".join(p.queue for p in self.ctx.registry.rotation.pulled(self.ctx.secondary_key))
            why = f"every backlog queue is pulled from the rotation ({pulled})"
        return NoBacklogAvailableError(
            f"entity {entity!r} is failed over on the primary namespace "
            f"{namespace_description(self.ctx.config.primary)} and {why}; the task fails so that Spark retries "
            "the batch (messages not counted as sent were not sent)"
        )
