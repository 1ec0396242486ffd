"""Diverting to the backlog (SPEC B4-B7): a failed-over entity's messages are translated once (B6), straight into
the open batch of their backlog queue - chosen at random and kept for the entity until the next batch boundary, or
by session (B4) - and sent; a queue that fails is pulled from the rotation and its messages go to another (B5).
Also the rejects of a call (B7, S6): a message that cannot become an SDK message, or does not fit a batch even
alone, is recorded (``on_reject: skip``) or fails the call (``on_reject: fail``).

Where it runs: on a paired sender's thread, in an executor's Python worker; not picklable. What bounds it: one
open backlog batch per backlog queue in a call (``backlog_queue_count``), the call's own messages.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from spark_sb.core.errors import MessageRejectedError, NoBacklogAvailableError, SendError, describe_error
from spark_sb.failover.decisions import Verb, Where
from spark_sb.failover.outcome import Tally, message_row, namespace_description
from spark_sb.message.outbound import OutboundMessage, Reject, RejectError
from spark_sb.message.rows import row_to_json
from spark_sb.sender.attempts import AttemptLoop, Progress
from spark_sb.sender.context import SendContext
from spark_sb.wire.transport import SECONDARY, Batch, Target


class Open:
    """An open batch and, for a backlog batch, the original of each translated message in it."""

    __slots__ = ("batch", "entities", "originals", "started")

    def __init__(self, batch: Batch, started: datetime) -> None:
        self.batch = batch
        self.originals: list[OutboundMessage] = []
        self.entities: list[str] = []
        self.started = started  # the backlog enqueue time recorded in its messages (B6)


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

    def oversize(
        self,
        tally: Tally,
        msg: OutboundMessage,
        entity: str,
        batch: Batch,
        index: int | None,
        translated: bool,
    ) -> None:
        limit = self._transport().max_batch_size(batch.target)
        when = "after backlog translation (B6 adds properties)" if translated else "encoded"
        reason = f"message too large {when}: it does not fit a batch of {limit} bytes (max_message_size)"
        self.reject(tally, msg, RejectError(reason), entity, index)

    def reject(
        self, tally: Tally, msg: OutboundMessage, err: RejectError, entity: str | None, index: int | None
    ) -> None:
        reject = Reject(
            reason=err.reason,
            field=err.field,
            row_json=row_to_json(message_row(msg)),
            entity=entity,
            row_index=index,
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

    def divert(
        self,
        messages: Iterable[OutboundMessage],
        backlog: dict[str, Open],
        tally: Tally,
        progress: Progress | None = None,
    ) -> None:
        """Translate ``messages`` (originals) into the open batches of their backlog queues (B4-B6); a full batch
        goes out at once, the rest with the call's other open backlog batches at its end. Not flushed here: a
        namespace outage diverts every entity's batch, and one backlog send per entity would cost a round trip
        per entity (F1)."""
        default = self.ctx.config.entity
        ahead = progress.ahead() if progress is not None and progress.ahead is not None else None
        for i, m in enumerate(messages):
            made = ahead[i] if ahead is not None else None
            self.to_backlog(backlog, m, m.entity or default or "", None, tally, made)

    def to_backlog(
        self,
        backlog: dict[str, Open],
        msg: OutboundMessage,
        entity: str,
        index: int | None,
        tally: Tally,
        made: object | None = None,
    ) -> bool:
        """Translate ``msg`` once, straight into the open batch of its backlog queue; True if a full batch was
        sent to make room."""
        session = msg.session_id
        queue = tally.sticky.get(entity) if session is None else None
        if queue is None:
            queue = self.ctx.chooser.choose(entity, session)
            if queue is None:
                raise self._no_backlog(entity)
            if session is None:  # the sticky choice holds until the next batch boundary (see _deliver)
                tally.sticky[entity] = queue
        slot = backlog.get(queue)
        if slot is None:
            slot = backlog[queue] = Open(
                self.ctx.transport().new_batch(Target(SECONDARY, queue)), self.ctx.clock.now()
            )
        try:  # the failed-over hot path (translated and encoded once)
            if slot.batch.try_add_backlog(msg, entity, slot.started, made):
                slot.originals.append(msg)
                slot.entities.append(entity)
                return False
        except (ValueError, TypeError) as err:  # RejectError is a ValueError
            self.rejects.cannot_build(tally, msg, err, entity, index)
            return False
        if len(slot.batch) == 0:
            self.rejects.oversize(tally, msg, entity, slot.batch, index, translated=True)
            return False
        del backlog[queue]
        self._send(slot, backlog, tally)
        self.to_backlog(backlog, msg, entity, index, tally, made)
        return True

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
        if not self.ctx.registry.rotation.is_available(self.ctx.secondary_key, batch.target.entity):
            # its queue was pulled while it was packed (settling the batch before it): send it elsewhere
            for m, entity in zip(slot.originals, slot.entities, strict=True):
                self.to_backlog(backlog, m, entity, None, tally)
            return
        queue = batch.target.entity
        transport = self.ctx.transport()
        result = self.loop.run(
            Where.BACKLOG,
            lambda timeout: transport.send(batch, timeout),
            tally,
            messages=len(batch),
            target=batch.target,
        )
        if result.decision is None:
            tally.count_diverted(batch.target.entity, len(batch), slot.entities)
            return
        verb = result.decision.verb
        if verb is Verb.SPLIT:
            half = len(slot.originals) // 2
            for lo, hi in ((0, half), (half, len(slot.originals))):
                sub = Open(self.ctx.transport().new_batch(batch.target), slot.started)
                for i in range(lo, hi):
                    if not sub.batch.try_add_backlog(slot.originals[i], slot.entities[i], slot.started):
                        raise SendError("internal error: a split batch does not fit")  # pragma: no cover
                    sub.originals.append(slot.originals[i])
                    sub.entities.append(slot.entities[i])
                self._send(sub, backlog, tally)
        elif verb is Verb.REJECT:
            reason = "message too large after backlog translation: refused by the service"
            for m, entity in zip(slot.originals, slot.entities, strict=True):
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
            for m, entity in zip(slot.originals, slot.entities, strict=True):
                self.to_backlog(backlog, m, entity, None, tally)
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
