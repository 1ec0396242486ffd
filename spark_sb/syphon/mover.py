"""The syphon: moves messages from the backlog queues back to their primary entities (SPEC B9, B11, B12, F9).

A :class:`Syphon` receives from the backlog queues of the *secondary* namespace in peek-lock mode (prefetch 0 by
default), restores each message (:func:`spark_sb.message.backlog.from_backlog`), sends it to the entity named in
``x-ms-path`` on the *primary*, and completes it in the backlog only after the primary accepted it. It moves only to
healthy entities (hints, a recent success, or a probe); nothing raises out of a drain (errors are counted in the
:class:`~spark_sb.syphon.rules.SyphonOutcome` and logged); a lock is measured on the local monotonic clock; a
message whose destination does not exist is dead-lettered after ``syphon.max_attempts`` deliveries; with
``ordering`` each line moves in queue order, proven against the queue; every call has a deadline.

This module is the class and its drain loop (:meth:`Syphon.drain_all` - the queues take turns -,
:meth:`Syphon.drain_queue`, :meth:`Syphon.drain_batches`). The class is put together from parts, a module each
(:mod:`spark_sb.syphon.base` lists them); the guarantees, point by point, and why: docs/design/syphon.md.

Where it runs: in whichever process calls it (executors' Python workers in the Spark syphon job,
:mod:`spark_sb.spark.syphon_job`; the driver in tests and tools). It builds its clients lazily from the (picklable)
:class:`~spark_sb.config.service_bus.ServiceBusConfig`; a ``Syphon`` itself is not picklable (what crosses
processes is the config and the picklable outcome); one thread drains at a time (:meth:`Syphon.cancel` may be
called from any thread).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Generator, Mapping, Sequence
from typing import TYPE_CHECKING

from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.clock import Clock, SystemClock
from spark_sb.core.errors import token_expired
from spark_sb.failover.ordering import NONE, Acknowledgements
from spark_sb.failover.outcome import namespace_key
from spark_sb.failover.registry import FailoverRegistry, process_registry
from spark_sb.syphon.lines import CLEAR_FOR, Lines, QueueView
from spark_sb.syphon.receivers import Pairs, abandon
from spark_sb.syphon.rules import LOCK_DURATION, EntityGate, SyphonOutcome
from spark_sb.syphon.sorting import Sorting
from spark_sb.wire.duplicate_detection import PrimaryWindows
from spark_sb.wire.lane import Lane
from spark_sb.wire.receivers import ReceiverLane, Receiving, SharedReceivers, receivers_lane
from spark_sb.wire.sdk_transport import SdkTransport

if TYPE_CHECKING:  # pragma: no cover
    from azure.servicebus import ServiceBusReceivedMessage

__all__ = ["Syphon"]

log = logging.getLogger(__name__)


#: Receive batches a queue drains in its turn of :meth:`Syphon.drain_all` before the next queue's turn.
TURN_BATCHES = 4


class Syphon(Sorting):
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
    ``windows``: the primary entities' duplicate detection windows (B14; default: asked of the primary's admin
    endpoint, only for the entities of messages whose primary send was ambiguous).
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
        windows: PrimaryWindows | None = None,
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
        # SPEC B14: the primary's duplicate detection windows, asked only for the entities of ambiguous messages
        self.windows = windows or PrimaryWindows(
            self.clock, primary=config.primary, timeout=float(config.send_timeout)
        )
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
        self.windows.close()

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
