"""What one receive batch becomes (SPEC B9, B11, B12, O6): probes dropped, parked kept, expired and invalid
dead-lettered, the rest forwarded per entity or held back; with ordering, each line moves in queue order behind
its head (the plan: which messages move now, which deferred ones are fetched).

Part of :class:`~spark_sb.syphon.mover.Syphon` (:mod:`spark_sb.syphon.base` lists the parts); it puts the other
parts to work. Why: docs/design/syphon.md. Where it runs: in the syphon's process, on the thread that drains.
"""

from __future__ import annotations

import time

from spark_sb.message.backlog import ambiguous_attempt
from spark_sb.syphon.forwarding import Forwarding
from spark_sb.syphon.lines import QueueView
from spark_sb.syphon.peeking import Peeking
from spark_sb.syphon.probing import Probing
from spark_sb.syphon.receivers import Pairs, complete, dead_letter_action, from_received, path_of
from spark_sb.syphon.rules import (
    EXPIRED_IN_BACKLOG,
    LOCK_SAFETY_MARGIN,
    NOT_A_BACKLOG_MESSAGE,
    SyphonOutcome,
    is_parked,
    restore_for_primary,
)
from spark_sb.wire.receivers import ReceiverLane
from spark_sb.wire.sdk_transport import SdkTransport


class Sorting(Peeking, Forwarding, Probing):
    """The syphon's part that sorts a receive batch and plans an ordered line's moves."""

    def _plan(
        self, lane: ReceiverLane, held: Pairs, view: QueueView, outcome: SyphonOutcome
    ) -> tuple[Pairs, Pairs]:
        """Ordering (O6): (the messages to move now - received, or deferred and fetched now - in queue order; the
        received ones held back). A line moves in queue order up to the first message of it that is in the queue and
        not in this pass's hands (locked by another worker or a lost call), or that could not be fetched."""
        mine = {h.sequence: self._line(lane, h) for h in held if h.sequence is not None}
        unplaced = [h for h in held if h.sequence is None]
        if view.failed:
            covered = {s for s in mine if view.covers(s)}
            mine = {s: line for s, line in mine.items() if s in covered or line is None}
        movable, fetch = view.plan(mine, max(int(self.config.syphon_batch_size), 1))
        # A line whose entity backs off is not fetched: it would only be deferred again, and fetching by sequence
        # number is a delivery (O7: its count rises only on an attempt to move it). Unless this process sent to the
        # entity recently, a probe is made first (the hints may be stale), so an entity still down costs no fetch;
        # one that does not exist (F9) is fetched: each delivery counts towards its verdict.
        for line in list(fetch):
            if line is None or self._missing.get(line[1]):
                continue
            if not self._allowed(line[1], outcome, proven=True):
                del fetch[line]
                view.hold(line, None)
                movable -= {s for s, k in mine.items() if k == line}
        fetched: Pairs = []
        if fetch:
            wanted = sorted(s for seqs in fetch.values() for s in seqs)
            started = self.clock.monotonic()
            got = self._fetch(lane, wanted, outcome)
            per_line = (
                [got] if got is not None else [self._fetch(lane, seqs, outcome) for seqs in fetch.values()]
            )
            generation = lane.generation
            arrived = {
                h.sequence: h
                for batch in per_line
                if batch
                for h in self._held(batch, generation, started)
                if h.sequence is not None
            }
            for line, seqs in fetch.items():
                missing = next((s for s in seqs if s not in arrived), None)
                if missing is None or line is None:
                    continue
                # the line stops at the first it could not fetch: what it holds of the line after that waits
                view.hold(line, missing)
                movable -= {s for s, k in mine.items() if k == line and s > missing}
                late = [arrived.pop(s) for s in seqs if s > missing and s in arrived]
                if late:
                    self._defer(lane, late, outcome, view)
            fetched = list(arrived.values())
        by_seq = {h.sequence: h for h in held if h.sequence is not None}
        moving = [by_seq[s] for s in movable if s in by_seq] + fetched + unplaced
        moving.sort(key=lambda h: h.sequence if h.sequence is not None else -1)
        waiting = [h for s, h in by_seq.items() if s not in movable]
        return moving, waiting

    def _move(
        self,
        lane: ReceiverLane,
        held: Pairs,
        outcome: SyphonOutcome,
        dead_letter: bool,
        parked: Pairs,
        view: QueueView | None = None,
    ) -> bool:
        """Sort one receive batch: probes dropped, parked kept, expired and invalid dead-lettered, the rest
        forwarded per entity (or held back). With ``view`` (ordering, or deferred messages to pick up): each line
        moves in queue order behind its head (:meth:`_plan`). True when anything left the queue (worth another
        receive)."""
        from spark_sb.message.backlog import is_probe

        now = self.clock.now()
        # Not send_timeout too: a (drifted) queue whose lock is shorter than send_timeout would then never move.
        lock_floor = self.clock.monotonic() + LOCK_SAFETY_MARGIN.total_seconds()
        by_entity: dict[str, Pairs] = {}
        drop: Pairs = []
        dead: dict[str, Pairs] = {}
        skipped = 0
        parked_before = len(parked)
        pending: Pairs = list(held)
        hold_back: Pairs = []  # ordering: not moved now, held back (deferred): the rest of a held line
        try:
            if view is not None:
                pending, hold_back = self._plan(lane, held, view, outcome)
            while pending:
                h = pending.pop(0)
                msg = h.msg
                if dead_letter and is_parked(getattr(msg, "dead_letter_reason", None)):
                    parked.append(h)
                    continue
                if is_probe(msg):
                    outcome.probes_dropped += 1
                    drop.append(h)
                    continue
                line = self._line(lane, h)
                if view is not None and view.held(line, h.sequence):
                    hold_back.append(h)  # behind a message of its line that was not moved
                    continue
                if h.lock_ends is not None and h.lock_ends < lock_floor:
                    skipped += 1  # B12: it will be redelivered; do not forward it now
                    if (
                        view is not None and line is not None
                    ):  # ordering: the rest of its line waits behind it
                        view.hold(line, h.sequence)
                        hold_back.append(h)
                    continue
                try:
                    received = from_received(msg, dead_letter)
                    restored, reason = restore_for_primary(received, now)
                    h.attempted = ambiguous_attempt(received)  # B14: None but for an ambiguous diversion
                except Exception as exc:  # noqa: BLE001 - a malformed message must not stop the syphon
                    restored, reason = None, f"{NOT_A_BACKLOG_MESSAGE}: {type(exc).__name__}: {exc}"
                if restored is None:
                    assert reason is not None
                    if reason == EXPIRED_IN_BACKLOG:
                        outcome.expired += 1
                        entity = path_of(msg)
                        outcome._count(outcome.expired_by_entity, entity)
                    else:
                        outcome.invalid += 1
                    dead.setdefault(reason, []).append(h)
                    continue
                assert restored.entity is not None
                h.restored = restored
                by_entity.setdefault(restored.entity, []).append(h)
            outcome.skipped_lock_expiring += skipped
            if hold_back:
                self._hold(lane, hold_back, outcome, view)
            self._settle(lane, drop, complete, outcome)
            self._gone(view, drop)
            for reason, items in dead.items():
                if dead_letter:
                    # Already in the dead-letter queue: leave it there (parked) with the service's reason.
                    parked.extend(items)
                    continue
                short = reason.split(":")[0]
                self._settle(lane, items, dead_letter_action(short, reason), outcome)
                self._gone(view, items)

            moved_before = outcome.forwarded_total + outcome.undeliverable + outcome.markers
            entities = list(by_entity)
            while entities:
                if self._cancelled.is_set():
                    outcome.cancelled = True
                    break
                entity = entities.pop(0)
                pairs = by_entity.pop(entity)
                transport: SdkTransport | None = None
                if self._last_attempt(entity, pairs):
                    # F9: the messages are the entity's probe, on a connection of their own
                    transport = self._isolated()
                elif not self._allowed(entity, outcome, proven=self._redelivered(pairs)):
                    if self._missing.get(entity):  # F9: each delivery counts towards the verdict
                        self._abandon(lane, pairs, outcome)
                        self._abandoned(lane, view, pairs)
                    else:  # an outage: no attempt was made, the delivery counts stay (O7)
                        self._hold(lane, pairs, outcome, view)
                    continue
                started = time.monotonic()
                error = self._forward(lane, entity, pairs, outcome, dead_letter, parked, transport, view)
                if error is None:
                    self.gate.succeeded(entity)
                else:
                    self.gate.failed(
                        entity, namespace_wide=self._namespace_wide(entity, error, started, transport)
                    )
            left = outcome.forwarded_total + outcome.undeliverable + outcome.markers - moved_before
            return left > 0 or bool(drop) or bool(dead and not dead_letter) or len(parked) > parked_before
        finally:
            # Whatever is still held (cancelled, or an unexpected error): released, never left locked (B11).
            rest = [h for items in by_entity.values() for h in items]
            if rest:
                outcome.cancelled = outcome.cancelled or self._cancelled.is_set()
                self._hold(lane, rest, outcome, view)
            if pending:
                self._hold(lane, pending, outcome, view)
