"""The paired sender: send to the primary namespace, divert to backlog queues in the secondary when a primary
entity is down, probe the primary and come back (SPEC B2-B5, B7, B8, B10, S3).

Delivery guarantee: at-least-once. :meth:`PairedSender.send` returns only when every message it was given is
either accepted by the primary entity, accepted by a backlog queue (translated per B6, the syphon moves it on),
or recorded as rejected (B7). Anything else raises a :class:`~spark_sb.errors.SendError` (the Spark task fails
and Spark retries it; with deterministic message ids and duplicate detection on the primary, the retry does not
duplicate). The exception's ``outcome`` counts what was confirmed before the failure, and only that.

Where it runs: on executors, inside a Python worker, one sender per partition task, reused across micro-batches
(the Spark sink keeps it in a process-level cache). It is not thread-safe and not picklable; it is built there
from the picklable :class:`~spark_sb.config.ServiceBusConfig`. Failover state and the backlog rotation are
shared with every other sender of the process through a :class:`~spark_sb.failover.FailoverRegistry`.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from spark_sb.ahead import Ahead
from spark_sb.backlog import PROBE_MODES
from spark_sb.clock import Clock, SystemClock
from spark_sb.config import ServiceBusConfig
from spark_sb.errors import (
    UNEXPECTED,
    ErrorClass,
    MessageRejectedError,
    NoBacklogAvailableError,
    SendError,
    ServerBusyError,
    ServiceBusConfigError,
    classify,
)
from spark_sb.failover import (
    MIN_ATTEMPT_BUDGET,
    BacklogChooser,
    Decision,
    EntityFailover,
    EntityState,
    FailoverRegistry,
    Listener,
    RetryPolicy,
    Route,
    StateTransition,
    Verb,
    Where,
    decide,
    log_transition,
    log_transitions,
    namespace_wide,
    process_registry,
)
from spark_sb.message import OutboundMessage, Reject, RejectError
from spark_sb.outcome import (
    ProbeRecord,
    SendOutcome,
    Tally,
    describe_error,
    message_row,
    namespace_description,
    namespace_key,
)
from spark_sb.prober import Prober
from spark_sb.provisioning import primary_namespace_name
from spark_sb.rows import row_to_json
from spark_sb.transport import PRIMARY, SECONDARY, Batch, SdkTransport, Target, Transport

__all__ = ["PairedSender", "ProbeRecord", "SendOutcome", "namespace_description", "namespace_key"]

_LOGGER = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------------------
# The sender


class _Open:
    """An open batch and, for a backlog batch, the original of each translated message in it."""

    __slots__ = ("batch", "entities", "originals", "started")

    def __init__(self, batch: Batch, started: datetime) -> None:
        self.batch = batch
        self.originals: list[OutboundMessage] = []
        self.entities: list[str] = []
        self.started = started  # the backlog enqueue time recorded in its messages (B6)


@dataclass
class _Attempted:
    """How an attempt loop ended: ``decision`` None means success."""

    decision: Decision | None = None
    error: BaseException | None = None
    error_class: ErrorClass | None = None


_SUCCEEDED = _Attempted()


@dataclass
class _Progress:
    """Where one batch's attempt loop stands, kept across deferred retries (see :meth:`PairedSender._flush`)."""

    began: float
    attempts: int = 0
    #: The batch's backlog translations made ahead (:class:`~spark_sb.ahead.Ahead`), if any by the divert.
    ahead: Callable[[], list[object | None] | None] | None = None


class PairedSender:
    """Sends :class:`OutboundMessage` streams to the primary namespace with failover to backlog queues.

    Every network call has a deadline (``send_timeout``, shortened to what is left of ``failover_interval``
    while an entity is failing) enforced from outside the SDK, so failover engages ``failover_interval`` after
    an outage began whatever its shape (refused, dropped, stalled before or after SASL). Once an entity is
    failed over its messages are translated and packed once, straight into a backlog batch; probes of the
    primary run on a helper thread and never hold up sends to the backlog.

    Args:
        config: the frozen configuration (primary, optional secondary, intervals, limits).
        transport: the Service Bus seam; default :class:`SdkTransport` built lazily on first use.
        clock: injected time (default the system clock; a fake clock makes the sender never really sleep).
        listener: called with every :class:`StateTransition` (default: log it), on the sender's thread.
        registry: the shared failover state (default: the process registry, or a private one when a
            non-system clock is injected).
        backlog_queues: override the backlog queue names (default ``config.backlog_queue_names(...)``).
        rng: randomness for the backlog choice.
        max_busy_retries / max_busy_wait: the "server busy" budget per batch; beyond it
            :class:`ServerBusyError` is raised (never a failover).
        backlog_attempts: tries of a retryable error on one backlog queue before it is pulled (all of them
            within ``send_timeout``).
        cancel_attempts: tries of a probe's cancel before it is recorded as failed.
        background_probes: run probes on a helper thread (default: yes with the system clock; with an
            injected clock they run inline so that tests are deterministic).
    """

    def __init__(
        self,
        config: ServiceBusConfig,
        *,
        transport: Transport | None = None,
        clock: Clock | None = None,
        listener: Listener | None = None,
        registry: FailoverRegistry | None = None,
        backlog_queues: Sequence[str] | None = None,
        rng: random.Random | None = None,
        max_busy_retries: int = 1000,
        max_busy_wait: float = 120.0,
        backlog_attempts: int = 2,
        cancel_attempts: int = 3,
        background_probes: bool | None = None,
    ) -> None:
        if config.probe_mode not in PROBE_MODES:
            raise ValueError(f"probe_mode must be one of {', '.join(PROBE_MODES)}, not {config.probe_mode!r}")
        self._config = config
        if clock is None:
            clock = registry.clock if registry is not None else SystemClock()
        self._clock: Clock = clock
        if registry is None:
            registry = process_registry() if isinstance(clock, SystemClock) else FailoverRegistry(clock)
        self._registry = registry
        self._transport: Transport | None = transport
        self._listener: Listener = listener or log_transition
        self._primary_key = namespace_key(config.primary)
        self._secondary_key = namespace_key(config.secondary) if config.secondary is not None else ""
        if backlog_queues is None:
            backlog_queues = (
                config.backlog_queue_names(primary_namespace_name(config.primary))
                if config.secondary is not None
                else []
            )
        self._chooser = BacklogChooser(
            list(backlog_queues),
            registry.rotation,
            self._secondary_key,
            selection=config.backlog_selection,
            rng=rng,
        )
        base = max(0.01, float(config.retry.backoff_factor))
        self._policy = RetryPolicy(
            backoff_base=base,
            backoff_cap=max(base, float(config.retry.backoff_max)),
            fixed=config.retry.mode == "fixed",
            busy_retries=max_busy_retries,
            busy_wait=max_busy_wait,
            backlog_attempts=max(1, backlog_attempts),
            backlog_budget=float(config.send_timeout),
            cancel_attempts=max(1, cancel_attempts),
        )
        # A probe's calls: over before the next probe is due, but long enough to open a new connection.
        self._probes = Prober(
            primary_key=self._primary_key,
            mode=config.probe_mode,
            registry=registry,
            clock=clock,
            transport=lambda: self.transport,
            entity=self._entity,
            budget=min(
                float(config.send_timeout), max(float(config.ping_primary_interval), MIN_ATTEMPT_BUDGET)
            ),
            retry=self._retry_probe,
            namespace_wide=self._namespace_wide,
            background=isinstance(clock, SystemClock) if background_probes is None else background_probes,
        )
        self._transport_lock = threading.Lock()
        self._ahead: Ahead | None = None  # the running _flush's translations made ahead
        self._closed = False

    # -- properties
    @property
    def registry(self) -> FailoverRegistry:
        return self._registry

    @property
    def transport(self) -> Transport:
        if self._transport is None:
            with self._transport_lock:
                if self._transport is None:
                    self._transport = SdkTransport(self._config)
        return self._transport

    @property
    def backlog_queues(self) -> list[str]:
        return list(self._chooser.queues)

    def entity_state(self, entity: str) -> EntityState:
        return self._entity(entity).state

    def _entity(self, entity: str) -> EntityFailover:
        return self._registry.entity(
            self._primary_key,
            entity,
            failover_interval=float(self._config.failover_interval),
            ping_interval=float(self._config.ping_primary_interval),
        )

    # -- public API
    def send(self, messages: Iterable[OutboundMessage]) -> SendOutcome:
        """Send ``messages`` (streamed: one open size-bounded batch per entity, never the whole iterable).

        Returns the outcome; raises a :class:`SendError` (with ``outcome`` set) when not every message could
        be sent, diverted or rejected. Runs on the calling thread; returns within the deadlines of its calls.
        """
        if self._closed:
            raise RuntimeError("the paired sender is closed")
        start = self._clock.monotonic()
        tally = Tally()
        primary: dict[str, Batch] = {}  # entity -> open primary batch
        backlog: dict[str, _Open] = {}  # backlog queue -> open backlog batch
        routes: dict[str, Route] = {}  # entity -> where its messages go in this call
        default = self._config.entity
        try:
            self._collect_probes(tally)
            for index, msg in enumerate(messages):
                entity = msg.entity or default
                if not entity:
                    self._reject(
                        tally,
                        msg,
                        RejectError("no destination entity: set the entity column or option", "entity"),
                        None,
                        index,
                    )
                    continue
                route = routes.get(entity)
                if route is None:
                    route = routes[entity] = self._admit(entity, tally)
                if route is Route.BACKLOG:
                    if self._to_backlog(backlog, msg, entity, index, tally):
                        routes.clear()  # a backlog batch went out: admit again (a probe may have succeeded)
                    continue
                batch = primary.get(entity)
                if batch is None:
                    batch = primary[entity] = self.transport.new_batch(Target(PRIMARY, entity))
                if self._try_add(batch, msg, tally, entity, index) is not False:
                    continue
                if len(batch) > 0:
                    del primary[entity]
                    self._deliver(batch, backlog, tally)
                    routes[entity] = route = self._admit(entity, tally)
                    if route is Route.BACKLOG:
                        self._to_backlog(backlog, msg, entity, index, tally)
                        continue
                    batch = primary[entity] = self.transport.new_batch(Target(PRIMARY, entity))
                    if self._try_add(batch, msg, tally, entity, index) is not False:
                        continue
                self._reject_oversize(tally, msg, entity, batch, index, translated=False)
            self._prepare([e for e, b in primary.items() if len(b) > 0], tally)
            self._flush([b for b in primary.values() if len(b) > 0], backlog, tally)
            primary.clear()
            self._flush_backlog(backlog, tally)
            self._collect_probes(tally)
        except SendError as err:
            self._collect_probes(tally)
            err.outcome = tally.build(self._clock.monotonic() - start)
            raise
        finally:
            self._log_emitted(tally)
            if tally.throttled:
                throttled = sorted(tally.throttled.items(), key=lambda kv: -kv[1])
                _LOGGER.warning(
                    "%s throttled by the primary namespace (server busy): backed off %s in this call; not an "
                    "outage, nothing diverted",
                    f"entity {throttled[0][0]!r} was"
                    if len(throttled) == 1
                    else f"{len(throttled)} entities (most: {throttled[0][0]!r}) were",
                    f"{throttled[0][1]:.1f} s"
                    if len(throttled) == 1
                    else f"{sum(tally.throttled.values()):.1f} s in all",
                )
        return tally.build(self._clock.monotonic() - start)

    def maintain(self) -> SendOutcome:
        """Start a probe of every failed-over entity whose probe is due (for callers that idle between sends),
        and report the probes that finished since the last call."""
        start = self._clock.monotonic()
        tally = Tally()
        self._probes.probe_due()
        self._collect_probes(tally)
        self._log_emitted(tally)
        return tally.build(self._clock.monotonic() - start)

    def close(self) -> None:
        """Close both clients (B10), in the background: never blocks. The sender can not be used afterwards."""
        self._closed = True
        self._probes.stop()
        if self._transport is not None:
            self._transport.close()

    def __enter__(self) -> PairedSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PairedSender(primary={self._primary_key!r}, backlog_queues={len(self._chooser.queues)})"

    # -- routing
    def _admit(self, entity: str, tally: Tally) -> Route:
        """PRIMARY or BACKLOG for the next batch of ``entity``; starts a probe when one is due (B8)."""
        state = self._entity(entity)
        route, transitions = state.admit()
        self._emit(tally, transitions)
        if route is Route.PROBE:
            self._probes.start(entity, state)
            self._collect_probes(tally)  # an inline probe has finished already
            route = Route.BACKLOG if state.state is EntityState.FAILED_OVER else Route.PRIMARY
        if route is Route.BACKLOG:
            self._probes.ensure_running()
        return route

    def _prepare(self, entities: list[str], tally: Tally | None) -> None:
        """Open the links of ``entities`` (primary) concurrently before their batches go out (SPEC F3: a cold
        start costs about one round of link openings, not one per entity). A namespace fault met here is
        namespace-wide evidence from the moment the opening started (F1); per-entity errors are met again, and
        handled, by each entity's own send."""
        transport = self.transport
        targets = [t for t in (Target(PRIMARY, e) for e in entities) if not transport.connected(t)]
        if len(targets) < 2:
            return
        first = self._entity(targets[0].entity)
        self._emit(tally, first.check())
        if first.state is EntityState.FAILED_OVER:
            return
        silence = first.attempt_budget(float(self._config.send_timeout))
        started = self._clock.monotonic()
        try:
            transport.prepare(targets, silence)
        except Exception as exc:  # the transport closed what faulted already
            cls = classify(exc)
            if cls.fail_over and self._namespace_wide(cls, targets[0], started):
                self._emit(
                    tally, first.record_failure(cls, describe_error(exc), started, namespace_wide=True)
                )
            _LOGGER.info("opening %d links failed (%s); each entity's send meets it", len(targets), cls.name)

    # -- packing
    def _try_add(
        self, batch: Batch, msg: OutboundMessage, tally: Tally, entity: str, index: int | None
    ) -> bool | None:
        """True added, False does not fit, None rejected (cannot become an SDK message)."""
        try:
            return batch.try_add(msg)
        except (ValueError, TypeError) as err:  # RejectError is a ValueError
            self._cannot_build(tally, msg, err, entity, index)
        return None

    def _cannot_build(
        self, tally: Tally, msg: OutboundMessage, err: Exception, entity: str, index: int | None
    ) -> None:
        if not isinstance(err, RejectError):
            err = RejectError(f"cannot build the message: {describe_error(err)}")
        self._reject(tally, msg, err, entity, index)

    def _reject_oversize(
        self,
        tally: Tally,
        msg: OutboundMessage,
        entity: str,
        batch: Batch,
        index: int | None,
        translated: bool,
    ) -> None:
        limit = self.transport.max_batch_size(batch.target)
        when = "after backlog translation (B6 adds properties)" if translated else "encoded"
        reason = f"message too large {when}: it does not fit a batch of {limit} bytes (max_message_size)"
        self._reject(tally, msg, RejectError(reason), entity, index)

    def _reject(
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

    # -- the attempt loop (primary sends, backlog sends, probe cancels)
    def _attempts(
        self,
        where: Where,
        call: Callable[[float], object],
        tally: Tally | None,
        *,
        state: EntityFailover | None = None,
        messages: int = 1,
        target: Target,
        progress: _Progress | None = None,
        defer: bool = False,
    ) -> _Attempted:
        """Call ``call(timeout)`` until it succeeds or :func:`decide` says otherwise (after sleeping through
        each RETRY). On the primary, each failure goes to the entity's failover timer (from the moment the
        failing attempt started) and each attempt's deadline is what is left of the interval. ``defer``: a RETRY
        is returned (its delay in the decision) instead of slept through, ``progress`` carrying the loop's state
        to the next call - so that the caller can wait for many entities' retries at once."""
        if progress is None:
            progress = _Progress(self._clock.monotonic())
        began = progress.began
        while True:
            timeout = self._budget(where, state, began, tally, target)
            if timeout is None:
                return _Attempted(Decision(Verb.DIVERT, why="failed over"))
            attempt = functools.partial(call, timeout)
            started = self._clock.monotonic()
            progress.attempts += 1
            attempts = progress.attempts
            try:
                attempt()
            except Exception as exc:
                cls = classify(exc)
                if cls.rebuild_client and self._transport is not None:
                    self._transport.fault(target)
                remaining: float | None = None
                entity_state = EntityState.HEALTHY
                if state is not None:
                    if cls.fail_over:
                        failing = state.record_failure(
                            cls,
                            describe_error(exc),
                            started,
                            namespace_wide=self._namespace_wide(cls, target, started),
                        )
                        self._emit(tally, failing)
                        if failing and failing[0].to_state is EntityState.FAILING:
                            self._warm_backlog(state.entity)
                    entity_state = state.state
                    remaining = state.time_until_failover()
                decision = decide(
                    where,
                    cls,
                    attempts=attempts,
                    waited=self._clock.monotonic() - began,
                    state=entity_state,
                    remaining=remaining,
                    messages=messages,
                    policy=self._policy,
                )
                if decision.verb is Verb.RETRY:
                    if not defer:
                        self._clock.sleep(decision.delay)
                    if tally is not None:
                        tally.retries += 1
                        if decision.why == "throttled":
                            waited = tally.throttled.get(target.entity, 0.0)
                            tally.throttled[target.entity] = waited + decision.delay
                    if defer:
                        return _Attempted(decision, exc, cls)
                    continue
                return _Attempted(decision, exc, cls)
            if state is not None:
                self._emit(tally, state.record_success())
            return _SUCCEEDED

    def _namespace_wide(self, cls: ErrorClass, target: Target, started: float) -> bool:
        """Is a failure of an attempt that started at ``started`` evidence against the whole namespace (F1)?"""
        if not cls.fail_over:
            return False
        answered = self.transport.answered_within(target, max(0.0, self._clock.monotonic() - started))
        return namespace_wide(cls, connection_answered=answered)

    def _budget(
        self,
        where: Where,
        state: EntityFailover | None,
        began: float,
        tally: Tally | None,
        target: Target,
    ) -> float | None:
        """The deadline of the next attempt; None when ``state`` is failed over by now (divert instead)."""
        if state is not None:
            self._emit(tally, state.check())
            if state.state is EntityState.FAILED_OVER:
                return None
            return state.attempt_budget(float(self._config.send_timeout), self.transport.connected(target))
        if where is Where.BACKLOG:
            return min(
                float(self._config.send_timeout),
                max(0.05, self._policy.backlog_budget - (self._clock.monotonic() - began)),
            )
        return self._probes.budget

    def _count(self, batch: Batch, slot: _Open | None, tally: Tally) -> None:
        if slot is None:
            entity = batch.target.entity
            tally.sent[entity] = tally.sent.get(entity, 0) + len(batch)
            return
        queue = batch.target.entity
        tally.diverted[queue] = tally.diverted.get(queue, 0) + len(batch)
        for entity in slot.entities:
            tally.diverted_by_entity[entity] = tally.diverted_by_entity.get(entity, 0) + 1

    # -- delivery to the primary
    def _deliver(
        self,
        batch: Batch,
        backlog: dict[str, _Open],
        tally: Tally,
        progress: _Progress | None = None,
        defer: bool = False,
    ) -> float | None:
        """Deliver one full primary batch - to the primary, or, failed over by now, to the backlog - and settle
        it (retried, diverted, split) before the caller packs on: one batch at a time, order holds. Sends are
        synchronous: measured (``bench/bench_overlap.py``), packing the next batch while one was on the wire
        gained nothing (sends on an open link run on this thread) and cost 3-13% with the GIL shared."""
        tally.sticky.clear()  # a batch boundary: a backlog queue may have been pulled since, choose again
        if self._admit(batch.target.entity, tally) is Route.BACKLOG:
            self._divert(batch.messages, backlog, tally, progress)
            return None
        return self._send_primary(batch, backlog, tally, progress, defer)

    def _flush(self, batches: list[Batch], backlog: dict[str, _Open], tally: Tally) -> None:
        """Deliver the call's last batches, one per entity, waiting for their retries together: an entity whose
        send failed is tried again when its back-off is over while the others go on, so E entities failing at
        once (all disabled, say) cost about one ``failover_interval``, not E of them (SPEC F1). Each entity's
        messages stay in order (one batch per entity, retried whole). ``waiting`` is bounded by the batches."""
        waiting: list[tuple[float, int, Batch, _Progress]] = []
        # While the namespace is down the wait is used to translate the waiting batches for the backlog (inline
        # before a sleep; on a helper thread while an attempt stalls, started by its slow signal).
        ahead = Ahead(batches, self.transport.prepare_backlog, self._clock, self._config.entity)
        self._ahead = ahead
        try:
            for n, batch in enumerate(batches):
                progress = _Progress(self._clock.monotonic(), ahead=functools.partial(ahead.get, n))
                if waiting and self._namespace_down():
                    # The namespace is down: this entity joins its fault (its timer runs from the fault's start)
                    # and waits with the others instead of trying a dead namespace once per entity (SPEC F4).
                    waiting.append((waiting[0][0], n, batch, progress))
                    continue
                ahead.in_flight = n
                delay = self._deliver(batch, backlog, tally, progress, defer=True)
                ahead.stop()  # a helper thread started by a stalled attempt: what it made is kept
                if delay is not None:
                    waiting.append((self._clock.monotonic() + delay, n, batch, progress))
            while waiting:
                waiting.sort(key=lambda w: w[0])
                due = waiting[0][0]
                if due > self._clock.monotonic():
                    self._log_emitted(tally)  # what happened so far is in the log while the call waits
                    if self._namespace_down():
                        ahead.prepare([w[1] for w in waiting], until=due)
                    now = self._clock.monotonic()
                    if due > now:
                        self._clock.sleep(due - now)
                ready = [w for w in waiting if w[0] <= self._clock.monotonic()] or waiting[:1]
                taken = {w[1] for w in ready}
                waiting = [w for w in waiting if w[1] not in taken]
                retried: float | None = (
                    None  # when the namespace is down: the due time of the one that was tried
                )
                for _, n, batch, progress in ready:
                    if retried is not None and self._namespace_down() and self._entity_failing(batch):
                        waiting.append((retried, n, batch, progress))  # not tried again one by one (F4)
                        continue
                    ahead.in_flight = n
                    delay = self._deliver(batch, backlog, tally, progress, defer=True)
                    ahead.stop()
                    if delay is not None:
                        due = self._clock.monotonic() + delay
                        waiting.append((due, n, batch, progress))
                        retried = due if retried is None else retried
        finally:
            self._ahead = None
            ahead.stop()

    def _namespace_down(self) -> bool:
        """The primary namespace has an open fault (namespace-wide evidence, SPEC F1)."""
        health = self._registry.namespace(self._primary_key)
        return health is not None and health.faulted

    def _entity_failing(self, batch: Batch) -> bool:
        """The batch's entity is not failed over (a failed-over one is diverted at once, without a try). Reads the
        state as it is; the transitions are reported by the check of the batch's next delivery."""
        return self._entity(batch.target.entity).state is not EntityState.FAILED_OVER

    def _slow(self, entity: str) -> Callable[[], None]:
        def slow() -> None:  # no answer yet, close to the deadline: have the backlog's link ready
            self._warm_backlog(entity)
            ahead = self._ahead
            if ahead is not None and len(ahead) > 1:  # and the call's waiting batches translated for it
                ahead.start()

        return slow

    def _send_primary(
        self,
        batch: Batch,
        backlog: dict[str, _Open],
        tally: Tally,
        progress: _Progress | None = None,
        defer: bool = False,
    ) -> float | None:
        """Send ``batch`` to the primary and settle it; with ``defer``, a retry is not waited for here: its delay
        is returned (``progress`` holds the loop's state) and the caller delivers the batch again after it."""
        entity = batch.target.entity
        transport = self.transport
        slow = self._slow(entity)
        result = self._attempts(
            Where.PRIMARY,
            lambda timeout: transport.send(batch, timeout, slow),
            tally,
            state=self._entity(entity),
            messages=len(batch),
            target=batch.target,
            progress=progress,
            defer=defer,
        )
        if result.decision is None:
            self._count(batch, None, tally)
            return None
        verb = result.decision.verb
        if verb is Verb.RETRY:
            return result.decision.delay
        if verb is Verb.DIVERT:
            self._divert(batch.messages, backlog, tally, progress)
        elif verb is Verb.SPLIT:
            for half in self._halves(batch):
                self._deliver(half, backlog, tally)
        elif verb is Verb.REJECT:
            reason = "message too large: refused by the service (message size exceeded)"
            for m in batch.messages:
                self._reject(tally, m, RejectError(reason), entity, None)
        else:
            raise self._raise(result, PRIMARY, entity)
        return None

    def _halves(self, batch: Batch) -> list[Batch]:
        msgs = list(batch.messages)
        half = len(msgs) // 2
        out = []
        for part in (msgs[:half], msgs[half:]):
            sub = self.transport.new_batch(batch.target)
            for m in part:
                if not sub.try_add(m):  # pragma: no cover - a half always fits where the whole did
                    raise SendError("internal error: a split batch does not fit")
            out.append(sub)
        return out

    # -- diverting to the backlog
    def _divert(
        self,
        messages: Iterable[OutboundMessage],
        backlog: dict[str, _Open],
        tally: Tally,
        progress: _Progress | None = None,
    ) -> None:
        """Translate ``messages`` (originals) into the open batches of their backlog queues (B4-B6); a full batch
        goes out at once, the rest with the call's other open backlog batches at its end. Not flushed here: a
        namespace outage diverts every entity's batch, and one backlog send per entity would cost a round trip
        per entity (F1)."""
        self._probes.ensure_running()
        default = self._config.entity
        ahead = progress.ahead() if progress is not None and progress.ahead is not None else None
        for i, m in enumerate(messages):
            made = ahead[i] if ahead is not None else None
            self._to_backlog(backlog, m, m.entity or default or "", None, tally, made)

    def _to_backlog(
        self,
        backlog: dict[str, _Open],
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
            queue = self._chooser.choose(entity, session)
            if queue is None:
                raise self._no_backlog(entity)
            if session is None:  # the sticky choice holds until the next batch boundary (see _deliver)
                tally.sticky[entity] = queue
        slot = backlog.get(queue)
        if slot is None:
            slot = backlog[queue] = _Open(
                self.transport.new_batch(Target(SECONDARY, queue)), self._clock.now()
            )
        try:  # the failed-over hot path (translated and encoded once)
            if slot.batch.try_add_backlog(msg, entity, slot.started, made):
                slot.originals.append(msg)
                slot.entities.append(entity)
                return False
        except (ValueError, TypeError) as err:  # RejectError is a ValueError
            self._cannot_build(tally, msg, err, entity, index)
            return False
        if len(slot.batch) == 0:
            self._reject_oversize(tally, msg, entity, slot.batch, index, translated=True)
            return False
        del backlog[queue]
        self._send_backlog(slot, backlog, tally)
        self._to_backlog(backlog, msg, entity, index, tally, made)
        return True

    def _flush_backlog(self, backlog: dict[str, _Open], tally: Tally) -> None:
        """Send every open backlog batch (sending one may open more: a pulled queue's messages go elsewhere)."""
        while backlog:
            queue = next(iter(backlog))
            slot = backlog.pop(queue)
            if len(slot.batch) > 0:
                self._send_backlog(slot, backlog, tally)

    def _send_backlog(self, slot: _Open, backlog: dict[str, _Open], tally: Tally) -> None:
        """Send one translated batch and settle it: on the queue's failure pull it and send the originals
        elsewhere (B5)."""
        tally.sticky.clear()  # a batch boundary: a queue may be pulled now (here or by another sender)
        batch = slot.batch
        if not self._registry.rotation.is_available(self._secondary_key, batch.target.entity):
            # its queue was pulled while it was packed (settling the batch before it): send it elsewhere
            for m, entity in zip(slot.originals, slot.entities, strict=True):
                self._to_backlog(backlog, m, entity, None, tally)
            return
        queue = batch.target.entity
        transport = self.transport
        result = self._attempts(
            Where.BACKLOG,
            lambda timeout: transport.send(batch, timeout),
            tally,
            messages=len(batch),
            target=batch.target,
        )
        if result.decision is None:
            self._count(batch, slot, tally)
            return
        verb = result.decision.verb
        if verb is Verb.SPLIT:
            half = len(slot.originals) // 2
            for lo, hi in ((0, half), (half, len(slot.originals))):
                sub = _Open(self.transport.new_batch(batch.target), slot.started)
                for i in range(lo, hi):
                    if not sub.batch.try_add_backlog(slot.originals[i], slot.entities[i], slot.started):
                        raise SendError("internal error: a split batch does not fit")  # pragma: no cover
                    sub.originals.append(slot.originals[i])
                    sub.entities.append(slot.entities[i])
                self._send_backlog(sub, backlog, tally)
        elif verb is Verb.REJECT:
            reason = "message too large after backlog translation: refused by the service"
            for m, entity in zip(slot.originals, slot.entities, strict=True):
                self._reject(tally, m, RejectError(reason), entity, None)
        elif verb is Verb.PULL:
            assert result.error_class is not None and result.error is not None
            until = self._clock.monotonic() + float(self._config.backlog_retry_interval)
            tally.pulls.append(
                self._registry.rotation.pull(
                    self._secondary_key, queue, until, result.error_class.name, describe_error(result.error)
                )
            )
            for m, entity in zip(slot.originals, slot.entities, strict=True):
                self._to_backlog(backlog, m, entity, None, tally)
        else:
            raise self._raise(result, SECONDARY, queue)

    def _warm_backlog(self, entity: str) -> None:
        """The entity started failing: open the link to its backlog queue now, so a failover diverts at once."""
        queue = self._chooser.choose(entity) if self._config.secondary is not None else None
        if queue is not None:
            self.transport.warm(Target(SECONDARY, queue))

    def _no_backlog(self, entity: str) -> NoBacklogAvailableError:
        if self._config.secondary is None or not self._chooser.queues:
            why = "no secondary namespace / backlog queues are configured"
        else:
            pulled = ", ".join(p.queue for p in self._registry.rotation.pulled(self._secondary_key))
            why = f"every backlog queue is pulled from the rotation ({pulled})"
        return NoBacklogAvailableError(
            f"entity {entity!r} is failed over on the primary namespace "
            f"{namespace_description(self._config.primary)} and {why}; the task fails so that Spark retries "
            "the batch (messages not counted as sent were not sent)"
        )

    # -- probes (B8): run by the Prober, reported on this thread
    def _collect_probes(self, tally: Tally) -> None:
        for record, transitions in self._probes.collect():
            tally.probes.append(record)
            self._emit(tally, transitions)

    def _retry_probe(
        self, call: Callable[[float], object], target: Target
    ) -> tuple[ErrorClass | None, BaseException | None]:
        """A probe's call (its cancel) under the retry policy for probes: the last error class and error, or None."""
        result = self._attempts(Where.PROBE, call, None, target=target)
        if result.decision is None:
            return None, None
        return result.error_class or UNEXPECTED, result.error

    # -- helpers
    def _raise(self, result: _Attempted, namespace: str, entity: str) -> SendError:
        cls = result.error_class or UNEXPECTED
        exc = result.error or Exception("unknown error")
        if cls.fail_batch:
            return self._config_error(cls, exc, namespace, entity)
        if cls.retry and not cls.fail_over:
            busy = self._policy
            return ServerBusyError(
                f"the {namespace} namespace {namespace_description(self._config.primary)} kept answering "
                f"{cls.name} for entity {entity!r} (up to {busy.busy_retries} retries, {busy.busy_wait:.0f} s); "
                "not failing over (throttling is not an outage); the task fails so that Spark retries it",
                error_class=cls,
            )
        return SendError(
            f"unexpected {cls.name} error sending to entity {entity!r}: {describe_error(exc)}",
            error_class=cls,
        )

    def _config_error(self, cls: ErrorClass, exc: BaseException, namespace: str, entity: str) -> SendError:
        ns = self._config.primary if namespace == PRIMARY else self._config.secondary
        where = f"entity {entity!r} in the {namespace} namespace {namespace_description(ns)}"
        if cls.name == "unauthorized":
            text = (
                f"Service Bus refused the send to {where}: unauthorized ({type(exc).__name__}). The SAS policy "
                "or Azure AD identity needs the 'Send' right on it. This is a configuration error: nothing was "
                "diverted to the backlog."
            )
            return ServiceBusConfigError(text, error_class=cls)
        text = f"Service Bus refused the send to {where}: {cls.name} ({describe_error(exc)}). Nothing was diverted."
        return ServiceBusConfigError(text, error_class=cls)

    def _emit(self, tally: Tally | None, transitions: list[StateTransition]) -> None:
        """Hand ``transitions`` to the outcome and the listener. The default listener (logging) gets them at the
        call's end, grouped by kind (:meth:`_log_emitted`): a namespace outage over E entities is two lines."""
        for t in transitions:
            if tally is not None:
                tally.transitions.append(t)
                if self._listener is log_transition:
                    tally.unlogged.append(t)
                    continue
            try:
                self._listener(t)
            except Exception as exc:  # the listener is observability only; its failure must not fail the send
                _LOGGER.error("state transition listener failed: %s", describe_error(exc))

    def _log_emitted(self, tally: Tally) -> None:
        if tally.unlogged:
            unlogged, tally.unlogged = tally.unlogged, []
            log_transitions(unlogged)
