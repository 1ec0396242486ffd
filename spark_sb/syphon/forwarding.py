"""Forwarding to the primary (SPEC B9, B11, F9, O7, B14): size-packed batches sent within ``send_timeout``, each
completed in the backlog after the primary accepted it; what was not taken abandoned, deferred or dead-lettered
(destination not found); return markers acknowledged and completed, never sent; a message whose ambiguous primary
send may have landed, moved after its entity's duplicate detection window, counted as a possible duplicate.

Part of :class:`~spark_sb.syphon.mover.Syphon` (:mod:`spark_sb.syphon.base` lists the parts); the verdicts on plain
data are :mod:`spark_sb.syphon.rules`, the settling :mod:`spark_sb.syphon.receivers`. Why: docs/design/syphon.md.
Where it runs: in the syphon's process, on the thread that drains.
"""

from __future__ import annotations

from spark_sb.failover.ordering import WHOLE_ENTITY, marker_of
from spark_sb.message.wire_size import body_size
from spark_sb.syphon.base import SyphonBase, log
from spark_sb.syphon.lines import ACTIVE, DEFERRED, QueueView
from spark_sb.syphon.receivers import (
    Held,
    Pairs,
    abandon,
    complete,
    dead_letter_action,
    defer,
    path_of,
    text_of,
)
from spark_sb.syphon.rules import (
    DEAD_LETTER,
    DESTINATION_NOT_FOUND,
    TOO_LARGE_FOR_DESTINATION,
    SyphonOutcome,
    attempt_of,
    keeps_count,
    not_found_description,
    past_window,
    too_large_description,
    undelivered_verdict,
)
from spark_sb.wire.receivers import ReceiverLane
from spark_sb.wire.sdk_batch import SdkBatch
from spark_sb.wire.sdk_transport import SdkTransport
from spark_sb.wire.transport import PRIMARY, Target


class Forwarding(SyphonBase):
    """The syphon's part that sends to the primary and settles in the backlog."""

    def _forward(
        self,
        lane: ReceiverLane,
        entity: str,
        pairs: Pairs,
        outcome: SyphonOutcome,
        dead_letter: bool,
        parked: Pairs | None = None,
        transport: SdkTransport | None = None,
        view: QueueView | None = None,
    ) -> BaseException | None:
        """Send to the primary entity in size-packed batches, each within ``send_timeout`` (on ``transport``, the
        main one by default); complete each batch's messages after the primary accepted it. On a failure the rest
        is settled by :meth:`_undelivered` (abandoned, or dead-lettered when the entity does not exist) and the
        failure returned. With ordering, only what was in the failed send is abandoned (a real attempt: its delivery
        count rises), and only once (:meth:`_after_attempt`: then deferred); what comes after it is deferred (O7)."""
        primary = transport or self._primary
        target = Target(PRIMARY, entity)
        sent = 0
        in_batch: Pairs = []
        batch = primary.new_batch(target)

        def flush() -> None:  # what the batch holds goes (or is settled), and a new batch starts
            nonlocal batch, in_batch, sent
            if in_batch:
                self._deliver(lane, batch, in_batch, entity, outcome, dead_letter, primary, view, parked)
                sent += len(in_batch)
                in_batch = []
                batch = primary.new_batch(target)

        try:
            for h in pairs:
                if self._cancelled.is_set():
                    outcome.cancelled = True
                    break
                assert h.restored is not None
                if view is not None and view.held(self._line(lane, h), h.sequence):
                    break  # its line stopped (a marker whose acknowledgement failed): the rest waits
                if marker_of(h.restored) is not None:  # every message of its line before it goes in first
                    flush()
                    self._pass_marker(lane, entity, h, outcome, dead_letter, view)
                    sent += 1
                    continue
                if not batch.try_add(h.restored):  # batch full: send it, start anew
                    flush()
                    if not batch.try_add(h.restored):  # not even alone: the primary never takes it (B13)
                        limit = primary.max_message_size(target)
                        self._too_large(lane, entity, h, outcome, dead_letter, view, parked, limit)
                        sent += 1
                        continue
                in_batch.append(h)
            flush()
            if sent < len(pairs):
                self._hold(lane, pairs[sent:], outcome, view)
            return None
        except Exception as exc:  # noqa: BLE001 - B9/B11: abandon, back off, go on
            log.warning("syphon: send to primary entity %s failed (%s)", entity, type(exc).__name__)
            outcome.errors.append(f"{entity}: send failed: {type(exc).__name__}")
            rest = pairs[sent:]
            tried = len(in_batch) if self.ordered and view is not None else len(rest)
            if view is not None:
                for h in rest:
                    view.hold(self._line(lane, h), h.sequence)  # nothing more of them in this pass
            again, kept = self._after_attempt(lane, rest[:tried], exc, view)
            self._abandoned(lane, view, again)
            self._gone(view, self._undelivered(lane, entity, again, outcome, exc, dead_letter, parked))
            self._hold(lane, kept + rest[tried:], outcome, view)
            return exc

    def _after_attempt(
        self, lane: ReceiverLane, pairs: Pairs, exc: BaseException, view: QueueView | None
    ) -> tuple[Pairs, Pairs]:
        """O7: of ``pairs`` (a real attempt to move them failed with ``exc``), (those to abandon or dead-letter, those
        of an ordered line to defer - :func:`~spark_sb.syphon.rules.keeps_count`: their delivery count rose enough
        already, whatever the length of the outage and the number of workers that try them)."""
        if view is None or not self.ordered:
            return pairs, []
        from spark_sb.core.errors import classify

        error_class = classify(exc).name
        again: Pairs = []
        kept: Pairs = []
        for h in pairs:
            keep = self._line(lane, h) is not None and keeps_count(
                error_class, getattr(h.msg, "delivery_count", None)
            )
            (kept if keep else again).append(h)
        return again, kept

    def _undelivered(
        self,
        lane: ReceiverLane,
        entity: str,
        pairs: Pairs,
        outcome: SyphonOutcome,
        exc: BaseException,
        dead_letter: bool,
        parked: Pairs | None,
    ) -> Pairs:
        """Settle what the primary did not take after ``exc`` (:func:`undelivered_verdict` per message): the
        messages due are dead-lettered in the backlog with reason ``DestinationNotFound`` (F9; from a dead-letter
        queue, where that cannot be done, they are parked for the rest of the pass), the others abandoned. Returns
        the dead-lettered ones."""
        from spark_sb.core.errors import classify

        error_class = classify(exc).name
        limit = int(self.config.syphon_max_attempts)
        verdicts = [
            (h, undelivered_verdict(error_class, getattr(h.msg, "delivery_count", None), limit))
            for h in pairs
        ]
        dead = [h for h, verdict in verdicts if verdict == DEAD_LETTER]
        self._abandon(lane, [h for h, verdict in verdicts if verdict != DEAD_LETTER], outcome)
        if not dead:
            return []
        namespace = self._primary_host()
        attempts = max(attempt_of(getattr(h.msg, "delivery_count", None)) for h in dead)
        if dead_letter and parked is not None:
            parked.extend(dead)  # already in a dead-letter queue: left there, with the service's reason
            log.warning(
                "syphon: primary entity %s does not exist in namespace %s: %d messages stay in the dead-letter "
                "queue of %s",
                entity,
                namespace,
                len(dead),
                lane.queue,
            )
            return []
        outcome.undeliverable += len(dead)
        outcome._count(outcome.undeliverable_by_entity, entity, len(dead))
        log.warning(
            "syphon: primary entity %s does not exist in namespace %s (entity_not_found after %d deliveries, "
            "syphon.max_attempts %d): %d messages dead-lettered in backlog queue %s with reason %s",
            entity,
            namespace,
            attempts,
            limit,
            len(dead),
            lane.queue,
            DESTINATION_NOT_FOUND,
        )
        description = not_found_description(entity, namespace, attempts)
        self._settle(lane, dead, dead_letter_action(DESTINATION_NOT_FOUND, description), outcome)
        return dead

    def _primary_host(self) -> str:
        """The primary namespace as logs and dead-letter descriptions name it: its host (never a secret)."""
        try:
            return str(self.config.primary.endpoint_host())
        except Exception:  # noqa: BLE001 - a description must not fail the settle
            return "(primary)"

    def _deliver(
        self,
        lane: ReceiverLane,
        batch: SdkBatch,
        pending: Pairs,
        entity: str,
        outcome: SyphonOutcome,
        dead_letter: bool,
        transport: SdkTransport,
        view: QueueView | None,
        parked: Pairs | None,
    ) -> None:
        """Send ``batch`` (``pending``'s messages) and complete them; one message alone that the primary refused
        as too large is dead-lettered (:meth:`_too_large`) instead, and the pass goes on (SPEC B13)."""
        try:
            self._send_and_complete(lane, batch, pending, entity, outcome, dead_letter, transport)
        except Exception as exc:
            from spark_sb.core.errors import MESSAGE_TOO_LARGE, classify

            if len(pending) != 1 or classify(exc) is not MESSAGE_TOO_LARGE:
                raise
            self._too_large(lane, entity, pending[0], outcome, dead_letter, view, parked, None)
            return
        self._gone(view, pending)

    def _too_large(
        self,
        lane: ReceiverLane,
        entity: str,
        h: Held,
        outcome: SyphonOutcome,
        dead_letter: bool,
        view: QueueView | None,
        parked: Pairs | None,
        limit: int | None,
    ) -> None:
        """SPEC B13: ``h`` is larger than its primary entity takes (``limit`` bytes, the link's; None: the primary
        refused it). Dead-lettered in the backlog with reason ``MessageTooLargeForDestination`` and a description,
        so that the rest of its entity moves on; from a dead-letter queue, where that cannot be done, parked for
        the rest of the pass."""
        assert h.restored is not None
        size = body_size(h.restored)
        namespace = self._primary_host()
        log.warning(
            "syphon: a message for primary entity %s is larger than it takes (%s; its body %d bytes): %s in "
            "backlog queue %s with reason %s",
            entity,
            f"{limit} bytes" if limit else "refused as too large",
            size,
            "left in the dead-letter queue" if dead_letter else "dead-lettered",
            lane.queue,
            TOO_LARGE_FOR_DESTINATION,
        )
        if dead_letter and parked is not None:
            parked.append(h)
            return
        outcome.undeliverable += 1
        outcome._count(outcome.undeliverable_by_entity, entity, 1)
        description = too_large_description(entity, namespace, size, limit)
        self._settle(lane, [h], dead_letter_action(TOO_LARGE_FOR_DESTINATION, description), outcome)
        self._gone(view, [h])

    def _send_and_complete(
        self,
        lane: ReceiverLane,
        batch: SdkBatch,
        pending: Pairs,
        entity: str,
        outcome: SyphonOutcome,
        dead_letter: bool,
        transport: SdkTransport | None = None,
    ) -> None:
        (transport or self._primary).send(batch, float(self.config.send_timeout))
        outcome.forwarded[entity] = outcome.forwarded.get(entity, 0) + len(pending)
        if dead_letter:
            outcome.from_dead_letter += len(pending)
        if self.record_ids:
            outcome.moved_ids.extend((entity, text_of(h.msg.message_id)) for h in pending)
        self._late(entity, pending, outcome)
        self._settle(lane, pending, complete, outcome)

    def _late(self, entity: str, moved: Pairs, outcome: SyphonOutcome) -> None:
        """SPEC B14: of the messages the primary just took, those whose primary send was ambiguous (it may have
        landed) and whose entity's duplicate detection window has passed since (or is unknown: the window is asked
        of the primary's admin endpoint, once a while per entity) are possible duplicates - counted, and one
        WARNING for the batch."""
        doubtful = [h for h in moved if h.attempted is not None]
        if not doubtful:
            return
        found = self.windows.of(entity)
        now = self.clock.now()
        late = [
            h
            for h in doubtful
            if h.attempted is not None and past_window(h.attempted, now, found.drops_within)
        ]
        if not late:
            return
        ids = [text_of(h.msg.message_id) for h in late]
        outcome.possible_duplicates[entity] = outcome.possible_duplicates.get(entity, 0) + len(late)
        outcome.possible_duplicate_ids.extend((entity, i) for i in ids)
        shown = ", ".join(str(i) for i in ids[:5]) + (f", ... ({len(ids)} in all)" if len(ids) > 5 else "")
        log.warning(
            "syphon: %d messages moved to %s after its duplicate detection window since their ambiguous send (it "
            "may have landed): possible duplicates in the primary - duplicate detection %s; message ids %s",
            len(late),
            entity,
            found.describe(),
            shown,
        )

    def _abandon(self, lane: ReceiverLane, pairs: Pairs, outcome: SyphonOutcome) -> None:
        """Abandon ``pairs`` (a real attempt to move them failed: their delivery counts rise)."""
        for h in pairs:
            outcome.abandoned += 1
            outcome._count(outcome.abandoned_by_entity, h.restored.entity if h.restored else path_of(h.msg))
        self._settle(lane, pairs, abandon, outcome)

    def _hold(self, lane: ReceiverLane, pairs: Pairs, outcome: SyphonOutcome, view: QueueView | None) -> None:
        """Release ``pairs`` without an attempt to move them: deferred with ordering (O7: they keep their place,
        no receive returns them, their delivery counts stay; the view finds them again), abandoned without."""
        if self.ordered and view is not None:
            for h in pairs:
                view.hold(self._line(lane, h), h.sequence)
            self._defer(lane, pairs, outcome, view)
        else:
            self._abandon(lane, pairs, outcome)

    def _defer(self, lane: ReceiverLane, pairs: Pairs, outcome: SyphonOutcome, view: QueueView) -> None:
        if not pairs:
            return
        outcome.deferred += len(pairs)
        for h in pairs:
            view.mark(h.sequence, DEFERRED)
        self._settle(lane, pairs, defer, outcome)

    def _abandoned(self, lane: ReceiverLane, view: QueueView | None, pairs: Pairs) -> None:
        """``pairs`` were abandoned: back in the queue, not this pass's; their lines wait for the rest of it."""
        if view is not None:
            for h in pairs:
                view.mark(h.sequence, ACTIVE)
                view.hold(self._line(lane, h), h.sequence)

    def _pass_marker(
        self,
        lane: ReceiverLane,
        entity: str,
        h: Held,
        outcome: SyphonOutcome,
        dead_letter: bool,
        view: QueueView | None = None,
    ) -> None:
        """A return marker, reached after every earlier message of its line went into the primary: acknowledged
        (R3 reads it), then completed - never sent to the primary. From a dead-letter queue, or with ``ordering:
        none``, it is completed without an acknowledgement (its line was not moved in order there); an
        acknowledgement that fails abandons it (met again, its line held back behind it). Without ``acks`` (a fake
        clock and no registry) it is completed with a warning, as with ``ordering: none``."""
        assert h.restored is not None
        marker = marker_of(h.restored)
        assert marker is not None
        if self.ordered and not dead_letter and self.acks is not None:
            try:
                self.acks.acknowledged(entity, h.restored.session_id or WHOLE_ENTITY, marker)
            except Exception as exc:  # noqa: BLE001 - B11: the marker is met again
                outcome.errors.append(f"{entity}: acknowledging a return marker failed: {type(exc).__name__}")
                log.warning(
                    "syphon: acknowledging a return marker of %s failed (%s)", entity, type(exc).__name__
                )
                self._hold(lane, [h], outcome, view)
                return
        elif not dead_letter and not self._warned_markers:
            self._warned_markers = True
            log.warning(
                "syphon: backlog queue %s holds return markers (senders with ordering: session or entity) but this "
                "syphon %s: they are dropped without an acknowledgement, and those senders keep their sessions on "
                "the backlog; give the syphon the senders' ordering (and, outside their process, acks)",
                lane.queue,
                "runs with ordering: none" if not self.ordered else "has nowhere to acknowledge them (acks)",
            )
        outcome.markers += 1
        self._settle(lane, [h], complete, outcome)
        self._gone(view, [h])
