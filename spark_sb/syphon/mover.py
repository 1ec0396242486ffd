"""The syphon: moves messages from the backlog queues back to their primary entities (SPEC B9, B11, B12).

A :class:`Syphon` receives from the backlog queues of the *secondary* namespace in peek-lock mode (prefetch 0 by
default), restores each message with :func:`spark_sb.message.backlog.from_backlog`, sends it to the entity named in
``x-ms-path`` on the *primary*, and completes it in the backlog only after the primary accepted it.

* **Healthy entities only (B9).** An entity is moved to when the caller's hints (the state table) say it is
  healthy, when a send to it succeeded within ``ping_primary_interval``, or when it answers a probe (``probe_mode``:
  schedule-cancel or ping) now. A failed primary send abandons the messages and backs the entity off
  (``entity_backoff``); after the back-off it is probed again before anything is sent.
* **Reliable receive (B11).** Nothing raises out of a drain: errors are counted in the :class:`SyphonOutcome` and
  logged; settle failures (lock lost, connection lost) are counted and the loop goes on, expecting redelivery
  (message ids are preserved, so duplicate detection on the primary makes the replay harmless); a receiver whose
  call failed is replaced. :meth:`Syphon.cancel` (any thread) stops the drains: messages received and not yet
  forwarded are abandoned.
* **Locks and lifetimes (B12).** Prefetch ``syphon.prefetch`` (0), receive batches of ``syphon.batch_size``
  (forwarding one takes well under the lock duration); a message whose lock runs out within 2 s, or whose time
  to live ran out in the backlog, is not forwarded (expired ones are dead-lettered in the
  backlog with reason ``TTLExpiredInBacklog``); a scheduled time still in the future is kept; probes dropped.
* **Wrong destinations (F9).** A message whose entity does not exist is abandoned and tried again until its
  ``syphon.max_attempts``-th delivery (the backlog queue's delivery count: the service counts each abandon and
  lock expiry); a not-found answer to that delivery's send dead-letters it in the backlog with reason
  ``DestinationNotFound`` (a description naming entity and namespace), counted in
  :attr:`SyphonOutcome.undeliverable` and logged as a WARNING. A message due for that verdict is its entity's probe:
  sent itself on the isolated transport where a probe would be (:func:`~spark_sb.syphon.rules.undelivered_verdict`
  decides). Any other failure (an outage, a timeout, a disabled entity) abandons, however many deliveries.
* **Nothing stranded.** :meth:`Syphon.drain_queue` with ``dead_letter=True`` moves what a backlog queue
  dead-lettered on its own (max delivery count reached, lock lost); what the syphon parked there on purpose
  (expired in the backlog, not a backlog message, destination not found) stays, with its reason.
* **Order (``ordering: session`` / ``entity``).** A line - (entity, session id), or the entity - is moved in queue
  order, and a message not moved holds back the rest of its line until it comes back
  (:mod:`spark_sb.syphon.lines`, by sequence number); a return marker is never sent to the primary: reached after
  every earlier message of its line went in, it is acknowledged (``acks``: the process registry's
  :class:`~spark_sb.failover.ordering.SessionBook` by default, which the process's paired senders read; the rule is
  :mod:`spark_sb.failover.ordering`) and then completed. After a failed receive a queue is left alone until the
  locks it may have taken run out. With ``ordering: none`` the drain is as above and markers (from senders with
  another setting) are completed without an acknowledgement, with a warning.
* **Deadlines.** Every call has one that holds whatever the SDK does: sends to the primary go through
  :class:`~spark_sb.wire.transport.SdkTransport` lanes; the backlog receivers are links on one connection in one
  :class:`~spark_sb.wire.lane.Lane` (:mod:`spark_sb.wire.receivers`; receive: ``max_wait + send_timeout``; settle:
  ``send_timeout``), so a secondary that stopped answering (even before SASL) never hangs the caller: the
  connection is abandoned and rebuilt.

This module is the drain loop (receive, sort, probe, forward, settle). What it decides on plain data (the
outcome type, the restore and parking rules, the entity gate) is :mod:`spark_sb.syphon.rules`;
how received messages are settled is :mod:`spark_sb.syphon.receivers`, the receivers :mod:`spark_sb.wire.receivers`.

Where it runs: in whichever process calls it (executors' Python workers in the Spark syphon job,
:mod:`spark_sb.spark.syphon_job`; the driver in tests and tools). It builds its clients lazily from the (picklable)
:class:`~spark_sb.config.service_bus.ServiceBusConfig`; a ``Syphon`` itself is not picklable (what crosses processes is the
config and the picklable :class:`SyphonOutcome`); one thread drains at a time (:meth:`cancel` may be called from
any thread).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Generator, Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.clock import Clock, SystemClock
from spark_sb.core.errors import token_expired
from spark_sb.failover.ordering import NONE, WHOLE_ENTITY, Acknowledgements, marker_of, order_key
from spark_sb.failover.outcome import namespace_key
from spark_sb.failover.registry import FailoverRegistry, process_registry
from spark_sb.message.backlog import BACKLOG_SESSION_ID
from spark_sb.syphon.lines import LineKey, Lines
from spark_sb.syphon.receivers import (
    Held,
    Pairs,
    SettleAction,
    abandon,
    as_utc,
    complete,
    dead_letter_action,
    from_received,
    path_of,
    settle,
    text_of,
)
from spark_sb.syphon.rules import (
    DEAD_LETTER,
    DESTINATION_NOT_FOUND,
    EXPIRED_IN_BACKLOG,
    LOCK_SAFETY_MARGIN,
    NOT_A_BACKLOG_MESSAGE,
    EntityGate,
    SyphonOutcome,
    attempt_of,
    due_for_verdict,
    is_parked,
    not_found_description,
    restore_for_primary,
    undelivered_verdict,
)
from spark_sb.wire.lane import Lane
from spark_sb.wire.probe import probe_call, single_attempt
from spark_sb.wire.receivers import ReceiverLane, Receiving, SharedReceivers, receivers_lane
from spark_sb.wire.transport import PRIMARY, SdkBatch, SdkTransport, Target

if TYPE_CHECKING:  # pragma: no cover
    from azure.servicebus import ServiceBusReceivedMessage

__all__ = ["Syphon"]

log = logging.getLogger(__name__)


class Syphon:
    """Drains backlog queues into the primary namespace. See the module docstring for the guarantees.

    ``backlog_queues``: the queue names to drain (default: all ``backlog_queue_count`` names derived from
    ``primary_namespace_name``, itself defaulting to the primary's namespace name by the rule of SPEC B1, the same
    as provisioning's and the paired sender's). ``entity_backoff``: seconds an entity is left alone after a failed
    send or probe. ``healthy_hints``: entity -> state from the state table (``healthy`` ones are sent to without a
    probe). ``record_ids``: keep the (entity, message id) of every forwarded message in the outcome.
    ``acks``: where return markers are acknowledged with ``ordering`` on (default: the held sessions of ``registry``,
    itself the process registry with the system clock - the paired senders of this process read them).
    """

    def __init__(
        self,
        config: ServiceBusConfig,
        *,
        backlog_queues: Sequence[str] | None = None,
        primary_namespace_name: str | None = None,
        clock: Clock | None = None,
        entity_backoff: float = 5.0,
        healthy_hints: Mapping[str, str] | None = None,
        record_ids: bool = False,
        acks: Acknowledgements | None = None,
        registry: FailoverRegistry | None = None,
    ) -> None:
        if config.secondary is None:
            raise ValueError("the syphon needs a secondary namespace (config key 'secondary')")
        self.config = config
        self.clock = clock or SystemClock()
        if backlog_queues is None:
            from spark_sb.wire.admin_api import primary_namespace_name as resolve_name

            backlog_queues = config.backlog_queue_names(
                primary_namespace_name or resolve_name(config.primary)
            )
        self.backlog_queues = list(backlog_queues)
        self.entity_backoff = entity_backoff
        self.record_ids = record_ids
        self.gate = EntityGate(
            self.clock, ok_for=float(config.ping_primary_interval), backoff=float(entity_backoff)
        )
        self.gate.set_hints(healthy_hints)
        self.ordered = config.ordering != NONE
        if acks is None and self.ordered:
            if registry is None and isinstance(self.clock, SystemClock):
                registry = process_registry()
            acks = registry.sessions(namespace_key(config.primary)) if registry is not None else None
        self.acks = acks
        self.lines = Lines(self.clock)  # the lines held back (ordering on; bounded there)
        self._warned_markers = False
        # Sends to the primary go through lanes (one per entity): each has a deadline (send_timeout) that holds
        # whatever the SDK does, and a stuck client is abandoned and rebuilt (SPEC B3, R1).
        self._primary = SdkTransport(config)
        # Receivers: links on one connection to the secondary, in one lane (one thread): the queues are drained
        # one after another (SPEC F2). The views are bounded by the (backlog queue, sub-queue) pairs.
        self._receiving: Lane[SharedReceivers] = receivers_lane(config)
        self._receivers: dict[tuple[str, bool], ReceiverLane] = {}
        self._lock = threading.Lock()
        self._cancelled = threading.Event()

    # -- lifecycle -----------------------------------------------------------------------------------------
    def cancel(self) -> None:
        """Stop draining (any thread): the current drain abandons what it holds and returns; later drains do
        nothing until :meth:`resume`."""
        self._cancelled.set()

    def resume(self) -> None:
        self._cancelled.clear()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def set_hints(self, hints: Mapping[str, str] | None) -> None:
        """Replace the state table's view of the entities (entity -> state)."""
        self.gate.set_hints(hints)

    def close(self) -> None:
        """Close every receiver, sender and client (in the background: never blocks)."""
        with self._lock:
            self._receivers.clear()
        self._receiving.close()
        self._primary.close()

    def __enter__(self) -> Syphon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- receivers -----------------------------------------------------------------------------------------
    def _lane(self, queue: str, dead_letter: bool) -> ReceiverLane:
        key = (queue, dead_letter)
        with self._lock:
            lane = self._receivers.get(key)
            if lane is None:
                lane = self._receivers[key] = ReceiverLane(self._receiving, queue, dead_letter)
            return lane

    def _replace_receiver(self, queue: str, dead_letter: bool, why: str) -> None:
        """A faulted receiver is replaced: the receivers' connection is dropped (closed in the background) and
        opened again on next use. Draining is sequential: no other queue's messages are held now."""
        self._receiving.reset(f"{queue}{' (dead-letter)' if dead_letter else ''}: {why}")

    def _settle(
        self, lane: ReceiverLane, held: Sequence[Held], action: SettleAction, outcome: SyphonOutcome
    ) -> None:
        """Settle ``held`` on their receiver's lane thread (:func:`~spark_sb.syphon.receivers.settle`, deadline
        ``send_timeout``): failures are counted, never raised (B11)."""
        settle(lane, held, action, outcome, float(self.config.send_timeout))

    # -- draining ------------------------------------------------------------------------------------------
    def drain_all(
        self, *, max_wait: float = 1.0, max_batches_per_queue: int | None = None, dead_letter: bool = False
    ) -> SyphonOutcome:
        """Drain every backlog queue (one after another) until a receive comes back empty, the entities back
        off, or :meth:`cancel` is called. ``dead_letter``: also move what their dead-letter queues hold (B11)."""
        total = SyphonOutcome()
        for queue in self.backlog_queues:
            total = total.merge(self.drain_queue(queue, max_wait=max_wait, max_batches=max_batches_per_queue))
            if dead_letter:
                total = total.merge(
                    self.drain_queue(
                        queue, max_wait=max_wait, max_batches=max_batches_per_queue, dead_letter=True
                    )
                )
        return total

    def drain_queue(
        self,
        queue: str,
        *,
        max_wait: float | None = None,
        max_batches: int | None = None,
        dead_letter: bool = False,
        until: float | None = None,
    ) -> SyphonOutcome:
        """Move messages from one backlog queue (its dead-letter queue with ``dead_letter``) until a receive
        returns nothing, nothing could be moved, ``max_batches`` receive batches, the monotonic time ``until``, or
        :meth:`cancel`. Never raises on a message, receive or settle failure (B11): they are counted and logged."""
        outcome = SyphonOutcome()
        for _ in self.drain_batches(
            queue,
            max_wait=max_wait,
            max_batches=max_batches,
            dead_letter=dead_letter,
            until=until,
            into=outcome,
        ):
            pass
        return outcome

    def drain_batches(
        self,
        queue: str,
        *,
        max_wait: float | None = None,
        max_batches: int | None = None,
        dead_letter: bool = False,
        until: float | None = None,
        into: SyphonOutcome | None = None,
    ) -> Generator[SyphonOutcome, None, None]:
        """Like :meth:`drain_queue`, yielding the outcome of each receive batch as it is done (the Spark job
        streams them). ``into`` accumulates every batch's outcome. Closing the iterator early (a cancelled task)
        abandons what is held."""
        wait = self.config.syphon_max_wait if max_wait is None else max_wait
        count = self.config.syphon_batch_size

        def receive(ctx: Receiving) -> list[ServiceBusReceivedMessage]:
            return ctx.receiver.receive_messages(max_message_count=count, max_wait_time=wait)

        lane = self._lane(queue, dead_letter)
        if self.ordered and not dead_letter and self.lines.paused(queue):
            log.info(
                "syphon: %s is left alone until the locks of its failed receive run out (ordering)", queue
            )
            empty = SyphonOutcome()
            self._add(into, empty)
            yield empty
            return
        parked: Pairs = []  # dead-lettered on purpose: held (locked) through the pass, abandoned at its end
        batches = 0
        renewed = False  # one fresh receiver per drain for a token that expired while it idled (SPEC L3)
        try:
            while (max_batches is None or batches < max_batches) and not self._cancelled.is_set():
                if until is not None and self.clock.monotonic() >= until:
                    break
                outcome = SyphonOutcome()
                outcome.receive_calls += 1
                try:
                    messages = lane.call(receive, wait + float(self.config.send_timeout))
                except Exception as exc:  # noqa: BLE001 - B11: a faulted receiver is replaced; the loop goes on
                    if not renewed and token_expired(exc):
                        # The receiver idled past its token's life (the SDK renews a token only inside its own
                        # calls, and refuses to renew one that expired): a fresh receiver, with a fresh token.
                        renewed = True
                        log.info("syphon: the receiver of %s idled past its token's expiry; renewed", queue)
                        self._replace_receiver(queue, dead_letter, "token expired")
                        lane = self._lane(queue, dead_letter)
                        self._add(into, outcome)
                        continue
                    outcome.errors.append(f"{queue}: receive failed: {type(exc).__name__}")
                    log.warning(
                        "syphon: receive from %s failed (%s); receiver replaced",
                        queue,
                        type(exc).__name__,
                        exc_info=log.isEnabledFor(logging.DEBUG),
                    )
                    self._replace_receiver(queue, dead_letter, "receive failed")
                    if self.ordered and not dead_letter:  # what it locked comes back first, after the locks
                        self.lines.pause(queue)
                    self._add(into, outcome)
                    yield outcome
                    break
                if not messages:
                    self._add(into, outcome)
                    yield outcome
                    break
                batches += 1
                generation = lane.generation
                held = [Held(m, generation) for m in messages]
                outcome.received += len(held)
                try:
                    progressed = self._move(lane, held, outcome, dead_letter, parked)
                finally:
                    self._add(into, outcome)
                yield outcome
                if not progressed:
                    break
            if self._cancelled.is_set():
                self._add(into, SyphonOutcome(cancelled=True))
                yield SyphonOutcome(cancelled=True)
        finally:
            if parked:
                tail = SyphonOutcome()
                tail.parked += len(parked)
                self._settle(lane, parked, abandon, tail)
                self._add(into, tail)

    @staticmethod
    def _add(into: SyphonOutcome | None, outcome: SyphonOutcome) -> None:
        if into is not None:
            merged = into.merge(outcome)
            into.__dict__.update(merged.__dict__)

    def _move(
        self, lane: ReceiverLane, held: Pairs, outcome: SyphonOutcome, dead_letter: bool, parked: Pairs
    ) -> bool:
        """Sort one receive batch: probes dropped, parked kept, expired and invalid dead-lettered, the rest
        forwarded per entity (or abandoned). True when anything left the queue (worth another receive)."""
        from spark_sb.message.backlog import is_probe

        now = self.clock.now()
        # Not send_timeout too: a (drifted) queue whose lock is shorter than send_timeout would then never move.
        lock_floor = now + LOCK_SAFETY_MARGIN
        by_entity: dict[str, Pairs] = {}
        drop: Pairs = []
        dead: dict[str, Pairs] = {}
        skipped = 0
        parked_before = len(parked)
        pending = list(held)
        hold_back: Pairs = []  # ordering: not moved now, abandoned (the rest of a held line)
        try:
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
                line = self._line_of(lane, msg)
                if line is not None and not self.lines.admits(line, getattr(msg, "sequence_number", None)):
                    hold_back.append(h)  # behind a message of its line that was not moved
                    continue
                locked_until = getattr(msg, "locked_until_utc", None)
                if locked_until is not None and as_utc(locked_until) < lock_floor:
                    skipped += 1  # B12: it will be redelivered; do not forward it now
                    if line is not None:  # ordering: back now, first; the rest of its line behind it
                        self.lines.hold(line, getattr(msg, "sequence_number", None))
                        hold_back.append(h)
                    continue
                try:
                    restored, reason = restore_for_primary(from_received(msg, dead_letter), now)
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
                self._abandon(lane, hold_back, outcome)
            self._settle(lane, drop, complete, outcome)
            for reason, items in dead.items():
                if dead_letter:
                    # Already in the dead-letter queue: leave it there (parked) with the service's reason.
                    parked.extend(items)
                    continue
                short = reason.split(":")[0]
                self._settle(lane, items, dead_letter_action(short, reason), outcome)

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
                elif not self._allowed(entity, outcome):
                    self._abandon(lane, pairs, outcome)
                    continue
                started = time.monotonic()
                error = self._forward(lane, entity, pairs, outcome, dead_letter, parked, transport)
                if error is None:
                    self.gate.succeeded(entity)
                else:
                    self.gate.failed(
                        entity, namespace_wide=self._namespace_wide(entity, error, started, transport)
                    )
            left = outcome.forwarded_total + outcome.undeliverable + outcome.markers - moved_before
            return left > 0 or bool(drop) or bool(dead and not dead_letter) or len(parked) > parked_before
        finally:
            # Whatever is still held (cancelled, or an unexpected error): abandoned, never left locked (B11).
            rest = [h for items in by_entity.values() for h in items]
            if rest:
                outcome.cancelled = outcome.cancelled or self._cancelled.is_set()
                self._abandon(lane, rest, outcome)
            if pending:
                self._abandon(lane, pending, outcome)

    def _allowed(self, entity: str, outcome: SyphonOutcome) -> bool:
        """B9: may the syphon move to ``entity`` now? Probes it when the gate says so."""
        decision = self.gate.decide(entity)
        if decision == "send":
            return True
        if decision == "wait":
            return False
        outcome.probes += 1
        started = time.monotonic()
        try:
            self._probe(entity)
        except Exception as exc:  # noqa: BLE001 - the entity does not answer: back off
            outcome.errors.append(f"{entity}: probe failed: {type(exc).__name__}")
            from spark_sb.core.errors import classify, describe_error

            if classify(exc).fail_batch:  # a refusal no retry changes: said loudly, never a silent backlog
                log.error(
                    "syphon: probe of primary entity %s refused (%s: %s); its messages stay in the backlog "
                    "until this is fixed",
                    entity,
                    classify(exc).name,
                    describe_error(exc),
                )
            else:
                log.info(
                    "syphon: probe of primary entity %s failed (%s); backing off", entity, type(exc).__name__
                )
            self.gate.failed(
                entity, namespace_wide=self._namespace_wide(entity, exc, started, self._primary.isolated())
            )
            return False
        self.gate.succeeded(entity)
        return True

    def _namespace_wide(
        self, entity: str, exc: BaseException, started: float, transport: SdkTransport | None = None
    ) -> bool:
        """Is this failure of a call to ``entity`` that started at ``started`` (real monotonic time: it is set
        against the connection's real heartbeats) the primary namespace's (F1)?"""
        from spark_sb.core.errors import classify
        from spark_sb.failover.decisions import namespace_wide
        from spark_sb.wire.transport import NAMESPACE_SILENCE

        # Namespace facts (SPEC F7): its connection silent past the heartbeat, not one entity's slow answer.
        answered = (transport or self._primary).answered_within(Target(PRIMARY, entity), NAMESPACE_SILENCE)
        return namespace_wide(classify(exc), connection_answered=answered)

    def _probe(self, entity: str) -> None:
        """One probe of the primary entity (``probe_mode``), the sender's own (:func:`~spark_sb.wire.probe.probe_call`),
        each call within ``send_timeout``; the cancel of a scheduled probe is tried once."""
        timeout = float(self.config.send_timeout)
        target = Target(PRIMARY, entity)
        probe_call(
            self._primary.isolated(),  # its own connection: a stalled entity's probe never holds the forwards (F6)
            target,
            self.config.probe_mode,
            timeout,
            single_attempt(timeout),
            datetime.now(timezone.utc),
        )

    def _last_attempt(self, entity: str, pairs: Pairs) -> bool:
        """F9: instead of a probe, send ``pairs`` themselves when the gate would probe ``entity`` and one of them
        is due for a verdict (a not-found answer to this delivery dead-letters it, :func:`due_for_verdict`). A
        probe answers only whether the entity takes messages; the verdict needs the answer to the send itself."""
        limit = int(self.config.syphon_max_attempts)
        if not any(due_for_verdict(getattr(h.msg, "delivery_count", None), limit) for h in pairs):
            return False
        return self.gate.decide(entity) == "probe"

    def _isolated(self) -> SdkTransport | None:
        """The primary's isolated transport (a sick entity's sends never hold the healthy forwards, F6), or None
        once closed (the forward then fails as any call after close does)."""
        try:
            return self._primary.isolated()
        except Exception:  # noqa: BLE001 - closed: the main transport raises the same when used
            return None

    def _forward(
        self,
        lane: ReceiverLane,
        entity: str,
        pairs: Pairs,
        outcome: SyphonOutcome,
        dead_letter: bool,
        parked: Pairs | None = None,
        transport: SdkTransport | None = None,
    ) -> BaseException | None:
        """Send to the primary entity in size-packed batches, each within ``send_timeout`` (on ``transport``, the
        main one by default); complete each batch's messages after the primary accepted it. On a failure the rest
        is settled by :meth:`_undelivered` (abandoned, or dead-lettered when the entity does not exist) and the
        failure returned."""
        primary = transport or self._primary
        target = Target(PRIMARY, entity)
        sent = 0
        try:
            batch = primary.new_batch(target)
            in_batch: Pairs = []
            for h in pairs:
                if self._cancelled.is_set():
                    outcome.cancelled = True
                    break
                assert h.restored is not None
                if marker_of(h.restored) is not None:  # every message of its line before it goes in first
                    if in_batch:
                        self._send_and_complete(lane, batch, in_batch, entity, outcome, dead_letter, primary)
                        sent += len(in_batch)
                        in_batch = []
                        batch = primary.new_batch(target)
                    self._pass_marker(lane, entity, h, outcome, dead_letter)
                    sent += 1
                    continue
                if not batch.try_add(h.restored):  # batch full: send it, start anew
                    self._send_and_complete(lane, batch, in_batch, entity, outcome, dead_letter, primary)
                    sent += len(in_batch)
                    in_batch = []
                    batch = primary.new_batch(target)
                    if not batch.try_add(h.restored):
                        raise ValueError("a message does not fit an empty batch")
                in_batch.append(h)
            if in_batch:
                self._send_and_complete(lane, batch, in_batch, entity, outcome, dead_letter, primary)
                sent += len(in_batch)
            if sent < len(pairs):
                self._abandon(lane, pairs[sent:], outcome)
            return None
        except Exception as exc:  # noqa: BLE001 - B9/B11: abandon, back off, go on
            log.warning("syphon: send to primary entity %s failed (%s)", entity, type(exc).__name__)
            outcome.errors.append(f"{entity}: send failed: {type(exc).__name__}")
            self._undelivered(lane, entity, pairs[sent:], outcome, exc, dead_letter, parked)
            return exc

    def _undelivered(
        self,
        lane: ReceiverLane,
        entity: str,
        pairs: Pairs,
        outcome: SyphonOutcome,
        exc: BaseException,
        dead_letter: bool,
        parked: Pairs | None,
    ) -> None:
        """Settle what the primary did not take after ``exc`` (:func:`undelivered_verdict` per message): the
        messages due are dead-lettered in the backlog with reason ``DestinationNotFound`` (F9; from a dead-letter
        queue, where that cannot be done, they are parked for the rest of the pass), the others abandoned."""
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
            return
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
            return
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

    def _primary_host(self) -> str:
        """The primary namespace as logs and dead-letter descriptions name it: its host (never a secret)."""
        try:
            return str(self.config.primary.endpoint_host())
        except Exception:  # noqa: BLE001 - a description must not fail the settle
            return "(primary)"

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
        self._settle(lane, pending, complete, outcome)

    def _abandon(self, lane: ReceiverLane, pairs: Pairs, outcome: SyphonOutcome) -> None:
        for h in pairs:
            outcome.abandoned += 1
            outcome._count(outcome.abandoned_by_entity, h.restored.entity if h.restored else path_of(h.msg))
            line = self._line_of(lane, h.msg)
            if line is not None:  # ordering: nothing after it in its line moves before it is back
                self.lines.hold(line, getattr(h.msg, "sequence_number", None))
        self._settle(lane, pairs, abandon, outcome)

    # -- ordering ------------------------------------------------------------------------------------------
    def _line_of(self, lane: ReceiverLane, msg: ServiceBusReceivedMessage) -> LineKey | None:
        """The line of a received backlog message with ``ordering`` on - (queue, entity, session id or ``""``) -,
        None when it keeps no order (``ordering: none``, a dead-letter queue, no session id with ``session``)."""
        if not self.ordered or lane.dead_letter:
            return None
        entity = path_of(msg)
        if entity is None:
            return None
        props = getattr(msg, "application_properties", None) or {}
        raw = props.get(BACKLOG_SESSION_ID.encode(), props.get(BACKLOG_SESSION_ID))
        session = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        key = order_key(self.config.ordering, None if session is None else str(session))
        return None if key is None else (lane.queue, entity, key)

    def _pass_marker(
        self, lane: ReceiverLane, entity: str, h: Held, outcome: SyphonOutcome, dead_letter: bool
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
                self._abandon(lane, [h], outcome)
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
