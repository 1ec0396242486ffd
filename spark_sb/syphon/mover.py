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
  (forwarding one takes well under the lock duration); a lock is measured on the local monotonic clock from the
  receive that took it (``lock_duration``; never the service's timestamp against this machine's wall clock, which
  may be skewed); a message whose lock runs out within 2 s, or whose time
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
  order, proven against the queue itself (:mod:`spark_sb.syphon.lines`: a peek shows a line's head locked by any
  worker, or deferred; only ahead of the first received message and in the gaps between received sequence numbers
  is peeked); what waits behind its head is deferred (its delivery count stays; O7) and fetched by
  sequence number when the line moves; a return marker is never sent to the primary: reached after every earlier
  message of its line went in, it is acknowledged (``acks``: the process registry's
  :class:`~spark_sb.failover.ordering.SessionBook` by default, which the process's paired senders read; the rule is
  :mod:`spark_sb.failover.ordering`) and then completed. After a failed receive a queue is left alone until the
  locks it may have taken run out. With ``ordering: none`` the drain is as above without the proof (deferred
  messages an ordered syphon left are fetched once a receive comes back empty) and markers (from senders with
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
from spark_sb.syphon.lines import (
    ACTIVE,
    CLEAR_FOR,
    DEFERRED,
    PEEK_PAGE,
    LineKey,
    Lines,
    QueueView,
    next_peek,
)
from spark_sb.syphon.receivers import (
    Held,
    Pairs,
    SettleAction,
    abandon,
    as_utc,
    complete,
    dead_letter_action,
    defer,
    from_received,
    path_of,
    settle,
    text_of,
)
from spark_sb.syphon.rules import (
    DEAD_LETTER,
    DESTINATION_NOT_FOUND,
    ENTITY_NOT_FOUND,
    EXPIRED_IN_BACKLOG,
    LOCK_DURATION,
    LOCK_SAFETY_MARGIN,
    NOT_A_BACKLOG_MESSAGE,
    EntityGate,
    SyphonOutcome,
    attempt_of,
    due_for_verdict,
    is_parked,
    keeps_count,
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


#: Receive batches a queue drains in its turn of :meth:`Syphon.drain_all` before the next queue's turn.
TURN_BATCHES = 4


class Syphon:
    """Drains backlog queues into the primary namespace. See the module docstring for the guarantees.

    ``backlog_queues``: the queue names to drain (default: all ``backlog_queue_count`` names derived from
    ``primary_namespace_name``, itself defaulting to the primary's namespace name by the rule of SPEC B1, the same
    as provisioning's and the paired sender's). ``entity_backoff``: seconds an entity is left alone after a failed
    send or probe. ``healthy_hints``: entity -> state from the state table (``healthy`` ones are sent to without a
    probe). ``record_ids``: keep the (entity, message id) of every forwarded message in the outcome.
    ``acks``: where return markers are acknowledged with ``ordering`` on (default: the held sessions of ``registry``,
    itself the process registry with the system clock - the paired senders of this process read them).
    ``lock_duration``: the backlog queues' lock (seconds; provisioned at 60): a message's lock is measured from the
    local monotonic time of the receive that took it (B12), so a clock skewed against the service's changes nothing.
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
        lock_duration: float = LOCK_DURATION,
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
        self.lines = Lines(self.clock)  # queues paused after a failed receive (ordering on; bounded there)
        self.lock_duration = float(lock_duration)
        # The start of the last receive per (queue, sub-queue) (monotonic): with prefetch, what a receive returns may
        # have been locked since then. Bounded by the (queue, sub-queue) pairs drained.
        self._last_receive: dict[tuple[str, bool], float] = {}
        # Entities whose last probe answered that they do not exist (F9); bounded by the entities met.
        self._missing: dict[str, bool] = {}
        # Ordering: per backlog queue, (n, t): a pass ended with nothing up to sequence number n left in the queue
        # (its view empty, not failed), its proof starting from the queue's start at monotonic time t. No message
        # can appear up to n again (numbers only grow), so a pass within CLEAR_FOR of t starts its view at n.
        # Bounded by the backlog queues.
        self._clear: dict[str, tuple[int, float]] = {}
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
        """Drain every backlog queue until each receive comes back empty, the entities back off, or :meth:`cancel`
        is called. ``dead_letter``: also move what their dead-letter queues hold (B11).

        The queues take turns, :data:`TURN_BATCHES` receive batches each (O3): a queue that senders feed as fast as
        it drains never keeps the others waiting - their held lines' markers are passed in the same round, so their
        sessions return to the primary."""
        total = SyphonOutcome()
        left = {
            (queue, dlq): max_batches_per_queue
            for queue in self.backlog_queues
            for dlq in ((False, True) if dead_letter else (False,))
        }
        # ``left``: bounded by the backlog queues (two entries per queue with their dead-letter queues)
        while left and not self._cancelled.is_set():
            for key in list(left):
                queue, dlq = key
                budget = left[key]
                turn = TURN_BATCHES if budget is None else min(TURN_BATCHES, budget)
                batches, into = 0, SyphonOutcome()
                for outcome in self.drain_batches(
                    queue, max_wait=max_wait, max_batches=turn, dead_letter=dlq, into=into
                ):
                    batches += 1 if outcome.received else 0
                total = total.merge(into)
                if budget is not None:
                    left[key] = budget - batches
                # the queue came back empty, its entities backed off, or it used its budget
                if batches < turn or left[key] == 0:
                    del left[key]
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
        # The queue as peeks show it, for this pass (O6, O7): ordering proves every line's head with it; without
        # ordering it finds deferred messages (left by an ordered syphon) once nothing else comes.
        view = None if dead_letter else QueueView(queue)
        proven = self.clock.monotonic()  # when the view's proof started from the queue's start
        carried = 0
        clear = self._clear.get(queue)
        if view is not None and self.ordered and clear is not None and proven - clear[1] < CLEAR_FOR:
            carried, proven = clear
            view.through = carried
        batches = 0
        renewed = False  # one fresh receiver per drain for a token that expired while it idled (SPEC L3)
        try:
            while (max_batches is None or batches < max_batches) and not self._cancelled.is_set():
                if until is not None and self.clock.monotonic() >= until:
                    break
                outcome = SyphonOutcome()
                outcome.receive_calls += 1
                key = (queue, dead_letter)
                started = self.clock.monotonic()
                # With prefetch, a message may have been locked into the buffer since the previous receive began.
                since = self._last_receive.get(key, started) if self.config.syphon_prefetch else started
                self._last_receive[key] = started
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
                if not messages and (view is None or view.failed):
                    self._add(into, outcome)
                    yield outcome
                    break
                if messages:
                    batches += 1
                generation = lane.generation
                held = self._held(messages, generation, since)
                outcome.received += len(held)
                if carried and any(h.sequence is not None and h.sequence <= carried for h in held):
                    # a message the last clear pass saw leave is back (its completion failed): prove from the start
                    self._clear.pop(queue, None)
                if view is not None and (self.ordered or not messages):
                    # Ordering: every message before the last one received, whoever holds it; the end of the
                    # queue once a receive comes back empty (what is left there is locked or deferred).
                    if messages and all(h.sequence is None for h in held):
                        view.failed = True  # no sequence numbers: nothing can be placed
                    else:
                        self._look(lane, view, held if messages else None, outcome)
                try:
                    progressed = self._move(
                        lane,
                        held,
                        outcome,
                        dead_letter,
                        parked,
                        view if self.ordered or not messages else None,
                    )
                finally:
                    self._add(into, outcome)
                yield outcome
                if not progressed:
                    break
            if self._cancelled.is_set():
                self._add(into, SyphonOutcome(cancelled=True))
                yield SyphonOutcome(cancelled=True)
        finally:
            if view is not None and self.ordered and not view.failed and len(view) == 0 and view.through:
                self._clear[queue] = (view.through, proven)
            if parked:
                tail = SyphonOutcome()
                tail.parked += len(parked)
                self._settle(lane, parked, abandon, tail)
                self._add(into, tail)

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

    @staticmethod
    def _add(into: SyphonOutcome | None, outcome: SyphonOutcome) -> None:
        if into is not None:
            merged = into.merge(outcome)
            into.__dict__.update(merged.__dict__)

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

    def _abandoned(self, lane: ReceiverLane, view: QueueView | None, pairs: Pairs) -> None:
        """``pairs`` were abandoned: back in the queue, not this pass's; their lines wait for the rest of it."""
        if view is not None:
            for h in pairs:
                view.mark(h.sequence, ACTIVE)
                view.hold(self._line(lane, h), h.sequence)

    @staticmethod
    def _gone(view: QueueView | None, pairs: Pairs) -> None:
        if view is not None:
            for h in pairs:
                view.gone(h.sequence)

    @staticmethod
    def _redelivered(pairs: Pairs) -> bool:
        """O7: was one of ``pairs`` delivered before and not moved (an earlier attempt failed, here or in another
        worker)? Then a worker that did not send to its entity recently probes before it tries again."""
        return any((getattr(h.msg, "delivery_count", None) or 0) > 1 for h in pairs)

    def _allowed(self, entity: str, outcome: SyphonOutcome, *, proven: bool = False) -> bool:
        """B9: may the syphon move to ``entity`` now? Probes it when the gate says so - and, with ``proven``,
        unless this process sent to it recently (a hint of the state table may be stale: a worker new to the
        entity would make a delivery, and fail, where a probe costs none)."""
        decision = self.gate.decide(entity)
        if decision == "send" and (not proven or self.gate.known_good(entity)):
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
            self._missing[entity] = classify(exc).name == ENTITY_NOT_FOUND
            self.gate.failed(
                entity, namespace_wide=self._namespace_wide(entity, exc, started, self._primary.isolated())
            )
            return False
        self._missing.pop(entity, None)
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
        try:
            batch = primary.new_batch(target)
            for h in pairs:
                if self._cancelled.is_set():
                    outcome.cancelled = True
                    break
                assert h.restored is not None
                if view is not None and view.held(self._line(lane, h), h.sequence):
                    break  # its line stopped (a marker whose acknowledgement failed): the rest waits
                if marker_of(h.restored) is not None:  # every message of its line before it goes in first
                    if in_batch:
                        self._send_and_complete(lane, batch, in_batch, entity, outcome, dead_letter, primary)
                        self._gone(view, in_batch)
                        sent += len(in_batch)
                        in_batch = []
                        batch = primary.new_batch(target)
                    self._pass_marker(lane, entity, h, outcome, dead_letter, view)
                    sent += 1
                    continue
                if not batch.try_add(h.restored):  # batch full: send it, start anew
                    self._send_and_complete(lane, batch, in_batch, entity, outcome, dead_letter, primary)
                    self._gone(view, in_batch)
                    sent += len(in_batch)
                    in_batch = []
                    batch = primary.new_batch(target)
                    if not batch.try_add(h.restored):
                        raise ValueError("a message does not fit an empty batch")
                in_batch.append(h)
            if in_batch:
                self._send_and_complete(lane, batch, in_batch, entity, outcome, dead_letter, primary)
                self._gone(view, in_batch)
                sent += len(in_batch)
                in_batch = []
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

    # -- ordering ------------------------------------------------------------------------------------------
    def _line(self, lane: ReceiverLane, h: Held) -> LineKey | None:
        """:meth:`_line_of` of a held message, worked out once."""
        line = h.line
        if line is False:
            line = h.line = self._line_of(lane, h.msg)
        return line

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
