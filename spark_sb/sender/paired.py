"""The paired sender (SPEC B2-B5, B7, B8, B10, S3): send to the primary namespace, divert to backlog queues in the
secondary when a primary entity is down, probe the primary and come back.

At least once: :meth:`PairedSender.send` returns only when every message was accepted by the primary entity,
accepted by a backlog queue (translated per B6; the syphon moves it on) or recorded as rejected (B7); otherwise it
raises a :class:`~spark_sb.core.errors.SendError` whose ``outcome`` counts what was confirmed. With ``ordering``
(:mod:`spark_sb.failover.ordering`; :mod:`spark_sb.sender.lines` here) a held line goes to its pinned queue, a
return marker follows each line the call diverted, and a line whose queue fails stops for the call (R1-R4); a
message's line is decided once, as it comes in, and its key goes along with it through the batches.

Where it runs: executors' Python workers (one sender per task, reused across micro-batches through the process's
pool) and plain applications. Not thread-safe, not picklable; built from the picklable configuration. Failover
state is shared with the process's other senders through a :class:`~spark_sb.failover.registry.FailoverRegistry`.
"""

from __future__ import annotations

import functools
import logging
import random
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.clock import Clock, SystemClock
from spark_sb.core.errors import SendError
from spark_sb.failover.decisions import MIN_ATTEMPT_BUDGET, WRONG_DESTINATION, RetryPolicy, Route, Verb, Where
from spark_sb.failover.machine import EntityFailover
from spark_sb.failover.ordering import NONE, order_key
from spark_sb.failover.outcome import SendOutcome, Tally, namespace_key
from spark_sb.failover.records import EntityState, Listener, log_transition
from spark_sb.failover.registry import FailoverRegistry, process_registry
from spark_sb.failover.rotation import BacklogChooser
from spark_sb.message.backlog import PROBE_MODES
from spark_sb.message.outbound import OutboundMessage, RejectError
from spark_sb.sender.ahead import Ahead
from spark_sb.sender.attempts import AttemptLoop, Progress, halves, open_links
from spark_sb.sender.context import SendContext
from spark_sb.sender.diverter import Diverter, Open, Rejects
from spark_sb.sender.lines import Keys, LineGate, OpenKeys, stopped
from spark_sb.sender.notices import never_reached, warn_throttled, wrong_destination
from spark_sb.sender.prober import Prober
from spark_sb.wire.admin_api import primary_namespace_name
from spark_sb.wire.parking import Parked
from spark_sb.wire.timing import PARK_AFTER, PARK_SOON
from spark_sb.wire.transport import PRIMARY, Batch, Target, Transport

__all__ = ["PairedSender"]

_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class ParkedBatch:
    """A batch whose send is parked (:class:`~spark_sb.wire.parking.Parked`), where its attempt loop stands, its
    index among :meth:`PairedSender._flush`'s batches (-1: a full batch parked while the call packed) and the line
    keys of its messages (:data:`~spark_sb.sender.lines.Keys`)."""

    parked: Parked
    index: int
    batch: Batch
    progress: Progress
    keys: Keys


# ---------------------------------------------------------------------------------------------------------
# The sender


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
        probe_budget = min(
            float(config.send_timeout), max(float(config.ping_primary_interval), MIN_ATTEMPT_BUDGET)
        )
        self._ctx = SendContext(
            config=config,
            clock=clock,
            policy=self._policy,
            registry=registry,
            chooser=self._chooser,
            primary_key=self._primary_key,
            secondary_key=self._secondary_key,
            listener=listener or log_transition,
            probe_budget=probe_budget,
            transport_given=transport,
            book=registry.sessions(self._primary_key) if config.ordering != NONE else None,
        )
        self._loop = AttemptLoop(self._ctx)
        self._probes = Prober(
            ctx=self._ctx,
            loop=self._loop,
            background=isinstance(clock, SystemClock) if background_probes is None else background_probes,
        )
        self._rejects = Rejects(self._ctx)
        self._diverter = Diverter(ctx=self._ctx, loop=self._loop, rejects=self._rejects)
        self._lines = LineGate(self._ctx)
        self._ahead: Ahead | None = None  # the running _flush's translations made ahead
        self._closed = False

    # -- properties
    @property
    def registry(self) -> FailoverRegistry:
        return self._registry

    @property
    def transport(self) -> Transport:
        """The sender's transport, built on first use (:meth:`SendContext.transport`). After :meth:`close` none is
        built (a probe still running meets :class:`~spark_sb.core.errors.LaneClosed`, which is evidence of nothing)."""
        return self._ctx.transport()

    @property
    def backlog_queues(self) -> list[str]:
        return list(self._chooser.queues)

    def entity_state(self, entity: str) -> EntityState:
        return self._entity(entity).state

    def _entity(self, entity: str) -> EntityFailover:
        return self._ctx.entity(entity)

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
        backlog: dict[str, Open] = {}  # backlog queue -> open backlog batch
        routes: dict[str, Route] = {}  # entity -> where its messages go in this call
        parked: dict[str, ParkedBatch] = {}  # entity -> its full batch's send, parked (one per entity)
        keys: OpenKeys = defaultdict(list)  # ordering on: entity -> the line keys of its open primary batch
        key: str | None = None  # the message's line key, decided once as it comes in (None: ordering off)
        default = self._config.entity
        book = self._ctx.book
        ordering, carry = self._config.ordering, book is not None  # carry: ordering on, the keys go along
        try:
            self._collect_probes(tally)
            for index, msg in enumerate(messages):
                entity = msg.entity or default
                if not entity:
                    self._rejects.no_entity(tally, msg, index)
                    continue
                route = routes.get(entity)
                if route is None:
                    route = routes[entity] = self._admit(entity, tally)
                if book is not None:  # ordering on: its line is (entity, key), carried with it from here
                    key = order_key(ordering, msg.session_id)
                    if key is not None and (tally.stopped or not book.empty):  # the healthy path: one look
                        if (entity, key) in tally.stopped:
                            continue  # R4: its queue failed; the rest of the line waits with it
                        if route is Route.PRIMARY and self._lines.held(entity, key, tally, keys):
                            route = Route.BACKLOG  # held (R3): behind its messages in its queue
                if route is Route.BACKLOG:
                    if entity in parked or len(primary.get(entity) or ()) > 0:
                        # O6: what the call holds of the entity for the primary goes before a later message
                        self._settle(entity, primary, keys, backlog, tally, parked)
                    if self._diverter.place(backlog, msg, entity, key, index, tally):
                        routes.clear()  # a backlog batch went out: admit again (a probe may have succeeded)
                    continue
                batch = primary.get(entity)
                if batch is None:
                    batch = primary[entity] = self.transport.new_batch(Target(PRIMARY, entity))
                if (added := self._rejects.try_add(batch, msg, tally, entity, index)) and carry:
                    keys[entity].append(key)  # its line goes with it
                if added is not False:
                    continue
                if len(batch) > 0:
                    del primary[entity]
                    self._deliver_full(batch, keys.pop(entity, ()), backlog, tally, parked)
                    routes[entity] = route = self._admit(entity, tally)
                    if route is Route.BACKLOG or self._lines.held(entity, key, tally, keys):
                        if entity in parked:
                            self._settle(entity, primary, keys, backlog, tally, parked)  # O6, as above
                        self._diverter.place(backlog, msg, entity, key, index, tally)
                        continue
                    batch = primary[entity] = self.transport.new_batch(Target(PRIMARY, entity))
                    if (added := self._rejects.try_add(batch, msg, tally, entity, index)) and carry:
                        keys[entity].append(key)
                    if added is not False:
                        continue
                self._rejects.oversize(tally, msg, entity, batch, index, translated=False)
            open_links(self._ctx, [e for e, b in primary.items() if len(b) > 0], tally)
            self._flush([b for b in primary.values() if len(b) > 0], backlog, tally, parked, keys)
            parked.clear()
            primary.clear()
            self._diverter.flush(backlog, tally)
            if tally.ordered:
                self._diverter.close_lines(backlog, tally)
            if tally.stopped:
                raise stopped(tally)
            self._collect_probes(tally)
        except SendError as err:
            self._collect_probes(tally)
            err.outcome = tally.build(self._clock.monotonic() - start)
            raise
        finally:
            if tally.ordered:  # the call failed: its lines are closed (the next call sends their markers)
                self._diverter.close_lines({}, tally, mark=False)
            self._ctx.log_emitted(tally)
            if tally.diverted:
                never_reached(self._registry, self._config.primary)
            if tally.throttled:
                warn_throttled(tally)
        return tally.build(self._clock.monotonic() - start)

    def _settle(
        self,
        entity: str,
        primary: dict[str, Batch],
        keys: OpenKeys,
        backlog: dict[str, Open],
        tally: Tally,
        parked: dict[str, ParkedBatch],
    ) -> None:
        """SPEC O6: the entity's next message goes to the backlog while the call still holds earlier ones of it
        for the primary - a send parked unanswered, an open batch (the entity failed over in the middle of the
        call). Those are settled first - sent, or diverted ahead of it - so that no line's later message enters
        a backlog queue before an earlier one. Synchronous (no parking): the entity is failed over, so this is
        mostly a translation into the open backlog batches."""
        self._finish_parked(entity, parked, backlog, tally)
        batch, lines = primary.pop(entity, None), keys.pop(entity, ())
        if batch is not None and len(batch) > 0:
            self._deliver(batch, lines, backlog, tally, Progress(self._clock.monotonic()))

    def remark(self, lines: Iterable[tuple[str, str]]) -> int:
        """Ordering (R2): send a fresh return marker, with no message, behind each held line of ``lines``
        ((entity, key) pairs) in its pinned queue - for a line whose newest marker's acknowledgement was lost and
        that has no message to send (the Spark sink's tasks, :mod:`spark_sb.state.sessions`). Lines not held are
        skipped. Returns how many markers were sent; raises like :meth:`send` when a queue does not take them.
        Runs on the calling thread."""
        return 0 if self._closed else self._diverter.remark(lines)

    def maintain(self) -> SendOutcome:
        """Start a probe of every failed-over entity whose probe is due (for callers that idle between sends),
        and report the probes that finished since the last call."""
        start = self._clock.monotonic()
        tally = Tally()
        self._probes.probe_due()
        self._collect_probes(tally)
        self._ctx.log_emitted(tally)
        return tally.build(self._clock.monotonic() - start)

    def close(self) -> None:
        """Close both clients (B10), in the background: never blocks. The sender can not be used afterwards."""
        self._closed = True
        self._probes.stop()
        self._ctx.close()

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
        self._ctx.emit(tally, transitions)
        if route is Route.PROBE:
            self._probes.start(entity, state)
            self._collect_probes(tally)  # an inline probe has finished already
            route = Route.BACKLOG if state.state is EntityState.FAILED_OVER else Route.PRIMARY
        if route is Route.BACKLOG:
            self._probes.ensure_running()
        return route

    # -- delivery to the primary
    def _finish_parked(
        self, entity: str, parked: dict[str, ParkedBatch], backlog: dict[str, Open], tally: Tally
    ) -> None:
        """The send of ``entity``'s full batch parked while the call packed, if any, gone on with to its end."""
        left = parked.pop(entity, None)
        if left is not None:
            self._send_primary(left.batch, left.keys, backlog, tally, left.progress, resume=left.parked)

    def _deliver(
        self,
        batch: Batch,
        keys: Keys,
        backlog: dict[str, Open],
        tally: Tally,
        progress: Progress | None = None,
        defer: bool = False,
        park_after: float | None = None,
    ) -> float | None:
        """Deliver one full primary batch - to the primary, or, failed over by now, to the backlog - and settle
        it (retried, diverted, split) before the caller packs on: one batch at a time, order holds. Sends are
        synchronous: measured (``bench/bench_overlap.py``), packing the next batch while one was on the wire
        gained nothing (sends on an open link run on this thread) and cost 3-13% with the GIL shared.
        ``keys``: the line keys of its messages, carried from :meth:`send`. ``park_after``: the send may raise
        :class:`~spark_sb.wire.parking.Parked` (see :meth:`_flush`)."""
        tally.sticky.clear()  # a batch boundary: a backlog queue may have been pulled since, choose again
        entity = batch.target.entity
        if self._admit(entity, tally) is Route.BACKLOG or self._lines.diverted(entity, keys, tally):
            self._diverter.divert_batch(batch, keys, backlog, tally, progress)
            return None
        return self._send_primary(batch, keys, backlog, tally, progress, defer, park_after)

    def _deliver_full(
        self, batch: Batch, keys: Keys, backlog: dict[str, Open], tally: Tally, parked: dict[str, ParkedBatch]
    ) -> None:
        """Deliver a full batch while the call packs on (:meth:`_deliver`); a send that an entity does not answer
        is parked in ``parked`` (one per entity: bounded by the call's entities) while the call packs and sends to
        the others, and finished before that entity's next batch goes (order holds) or in :meth:`_flush`."""
        self._finish_parked(batch.target.entity, parked, backlog, tally)
        progress, after = Progress(self._clock.monotonic()), PARK_SOON if parked else PARK_AFTER
        try:
            self._deliver(batch, keys, backlog, tally, progress, park_after=after)
        except Parked as p:
            parked[batch.target.entity] = ParkedBatch(p, -1, batch, progress, keys)

    def _flush(
        self,
        batches: list[Batch],
        backlog: dict[str, Open],
        tally: Tally,
        earlier: dict[str, ParkedBatch] | None = None,
        lasts: Mapping[str, Keys] | None = None,
    ) -> None:
        """Deliver the call's last batches, one per entity, waiting for their retries together: an entity whose
        send failed is tried again when its back-off is over while the others go on, so E entities failing at
        once (all disabled, say) cost about one ``failover_interval``, not E of them (SPEC F1). Each entity's
        messages stay in order (one batch per entity, retried whole). ``waiting`` is bounded by the batches.

        A send not answered within :data:`~spark_sb.wire.timing.PARK_AFTER` on a connection that answers (an
        entity that stalls) is parked while the next entities' batches go out, then finished - in the order of
        its deadline, its answer read meanwhile by every other send - while the retries wait: E stalled entities
        cost one attempt's budget together, not E of them (issue 29; 10 stalled at an interval of 10 s took 98 s),
        and delay the call's other entities by ``PARK_AFTER`` for the first and ``PARK_SOON`` for each next one.
        ``earlier``: sends of full batches parked while the call packed (:meth:`_deliver_full`); an entity's last
        batch goes once its earlier one is settled. ``lasts``: entity -> its last batch's line keys (ordering on).
        ``parked``, ``follow`` and ``firsts`` are bounded by the batches too."""
        earlier, lasts = earlier or {}, lasts or {}
        firsts = {e: p.keys for e, p in earlier.items()}  # entity -> its earlier batch's line keys
        waiting: list[tuple[float, int, Batch, Progress]] = []
        parked: list[ParkedBatch] = list(earlier.values())
        # Entities already failing go last (a stable sort: each entity has one batch here, so no entity's order
        # changes): their attempts may stall until the failover timer, and the healthy entities' batches of the
        # call are not made to wait behind them (SPEC F6).
        batches = sorted(batches, key=lambda b: self._entity(b.target.entity).state is EntityState.FAILING)
        # entity -> the index of its last batch, which waits behind its earlier batch's parked send
        follow = {b.target.entity: n for n, b in enumerate(batches) if b.target.entity in earlier}
        # While the namespace is down the wait is used to translate the waiting batches for the backlog (inline
        # before a sleep; on a helper thread while an attempt stalls, started by its slow signal).
        ahead = Ahead(batches, self.transport.prepare_backlog, self._clock, self._config.entity)
        self._ahead = ahead

        seen = bool(parked)  # a send of this call parked: the connection answers, the next ones park sooner

        def step(
            n: int, batch: Batch, progress: Progress, resume: Parked | None = None, park: bool = True
        ) -> None:
            """One delivery (or a parked one gone on with); its outcome filed: settled, waiting, or parked."""
            nonlocal seen
            if n >= 0:
                ahead.in_flight = n
            keys = (lasts if n >= 0 else firsts).get(batch.target.entity, ())
            try:
                if resume is None:
                    after = (PARK_SOON if seen else PARK_AFTER) if park else None
                    delay = self._deliver(batch, keys, backlog, tally, progress, defer=True, park_after=after)
                else:
                    due = min((w[0] for w in waiting), default=None)
                    until = None if due is None else max(0.0, due - self._clock.monotonic())
                    delay = self._send_primary(batch, keys, backlog, tally, progress, True, until, resume)
            except Parked as p:
                parked.append(ParkedBatch(p, n, batch, progress, keys))
                seen = True
                return
            finally:
                ahead.stop()  # a helper thread started by a stalled attempt: what it made is kept
            if delay is not None:
                waiting.append((self._clock.monotonic() + delay, n, batch, progress))
                return
            behind = follow.pop(batch.target.entity, None) if n < 0 else None
            if behind is not None:  # the entity's earlier batch is settled: its last batch goes now
                then = Progress(self._clock.monotonic(), ahead=functools.partial(ahead.get, behind))
                step(behind, batches[behind], then)

        try:
            last = max((n for n, b in enumerate(batches) if b.target.entity not in follow), default=-1)
            for n, batch in enumerate(batches):
                if batch.target.entity in follow:
                    continue  # behind its entity's parked batch
                progress = Progress(self._clock.monotonic(), ahead=functools.partial(ahead.get, n))
                if waiting and self._namespace_down():
                    # The namespace is down: this entity joins its fault (its timer runs from the fault's start)
                    # and waits with the others instead of trying a dead namespace once per entity (SPEC F4).
                    waiting.append((waiting[0][0], n, batch, progress))
                    continue
                step(n, batch, progress, park=n < last or bool(parked))
            while waiting or parked:
                if parked and min((w[0] for w in waiting), default=float("inf")) > self._clock.monotonic():
                    # go on with the parked send whose deadline comes first, until it ends or a retry is due
                    parked.sort(key=lambda q: q.parked.deadline)
                    first = parked.pop(0)
                    step(first.index, first.batch, first.progress, resume=first.parked)
                    continue
                waiting.sort(key=lambda w: w[0])
                due = waiting[0][0]
                if due > self._clock.monotonic():
                    self._ctx.log_emitted(tally)  # what happened so far is in the log while the call waits
                    if self._namespace_down():
                        ahead.prepare([w[1] for w in waiting if w[1] >= 0], until=due)
                    now = self._clock.monotonic()
                    if due > now:
                        self._clock.sleep(due - now)
                ready = [w for w in waiting if w[0] <= self._clock.monotonic()] or waiting[:1]
                taken = {id(w[2]) for w in ready}
                waiting = [w for w in waiting if id(w[2]) not in taken]
                retried: float | None = (
                    None  # when the namespace is down: the due time of the one that was tried
                )
                for _, n, batch, progress in ready:
                    if retried is not None and self._namespace_down() and self._entity_failing(batch):
                        waiting.append((retried, n, batch, progress))  # not tried again one by one (F4)
                        continue
                    before = len(waiting)
                    step(n, batch, progress, park=False)
                    if len(waiting) > before and retried is None:
                        retried = waiting[-1][0]
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
            self._ctx.warm_backlog(entity)
            ahead = self._ahead
            if ahead is not None and len(ahead) > 1:  # and the call's waiting batches translated for it
                ahead.start()

        return slow

    def _send_primary(
        self,
        batch: Batch,
        keys: Keys,
        backlog: dict[str, Open],
        tally: Tally,
        progress: Progress | None = None,
        defer: bool = False,
        park_after: float | None = None,
        resume: Parked | None = None,
    ) -> float | None:
        """Send ``batch`` to the primary and settle it; with ``defer``, a retry is not waited for here: its delay
        is returned (``progress`` holds the loop's state) and the caller delivers the batch again after it.
        ``park_after``: the attempt may raise :class:`~spark_sb.wire.parking.Parked` (unanswered by then);
        ``resume``: such a parked attempt, gone on with first. ``keys``: as :meth:`_deliver`'s."""
        entity, transport, slow = batch.target.entity, self.transport, self._slow(batch.target.entity)
        progress = progress or Progress(self._clock.monotonic())  # a divert takes its ambiguity (SPEC B14)

        def send(timeout: float) -> None:
            transport.send(batch, timeout, slow, park_after=park_after)

        def finish(parked: Parked) -> None:
            transport.resume(parked, slow, park_after)

        result = self._loop.run(
            Where.PRIMARY,
            send,
            tally,
            state=self._entity(entity),
            messages=len(batch),
            target=batch.target,
            progress=progress,
            defer=defer,
            resume=resume,
            finish=finish,
        )
        if result.decision is None:
            tally.count_sent(batch.target.entity, len(batch))
            return None
        verb = result.decision.verb
        if verb is Verb.RETRY:
            return result.decision.delay
        if verb is Verb.DIVERT:
            self._probes.ensure_running()  # a failed-over entity is probed (B8)
            self._diverter.divert_batch(batch, keys, backlog, tally, progress)
        elif verb is Verb.SPLIT:
            at = 0  # each half takes its messages' keys along
            for half in halves(self.transport, batch):
                self._deliver(half, keys[at : at + len(half)], backlog, tally)
                at += len(half)
        elif verb is Verb.REJECT and result.decision.why == WRONG_DESTINATION:
            wrong_destination(self._rejects, batch, tally, result.error, self._config.primary)
        elif verb is Verb.REJECT:
            reason = "message too large: refused by the service (message size exceeded)"
            for m in batch.messages:
                self._rejects.reject(tally, m, RejectError(reason), entity, None)
        else:
            raise self._loop.error(result, PRIMARY, entity)
        return None

    # -- probes (B8): run by the Prober, reported on this thread
    def _collect_probes(self, tally: Tally) -> None:
        for record, transitions in self._probes.collect():
            tally.probes.append(record)
            self._ctx.emit(tally, transitions)
