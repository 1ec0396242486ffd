"""The attempt loop of a paired sender (SPEC B3, F1, L4): a call (a send, a backlog send, a probe's cancel) is made
until it succeeds or the decision says otherwise - retry after a back-off, divert, split, reject, pull the backlog
queue, or fail the task - each attempt with the deadline its entity's failover timer leaves it. The decision is
the failover state's: on the primary the entity's (:meth:`~spark_sb.failover.machine.EntityFailover.failed`, given
what the wire saw: :class:`WireEvidence`), elsewhere :func:`~spark_sb.failover.decisions.decide`'s; the loop
carries it out.

Where it runs: on the sender's thread (and a probe's), in an executor's Python worker; not picklable. Holds no
per-entity state of its own: the entity's :class:`~spark_sb.failover.machine.EntityFailover` carries it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from spark_sb.core.clock import Clock
from spark_sb.core.errors import (
    UNEXPECTED,
    ErrorClass,
    SendError,
    ServerBusyError,
    ServiceBusConfigError,
    classify,
    describe_error,
    is_ambiguous,
)
from spark_sb.failover.decisions import (
    Decision,
    Verb,
    Where,
    decide,
    namespace_wide,
)
from spark_sb.failover.machine import EntityFailover
from spark_sb.failover.outcome import Tally, namespace_description
from spark_sb.failover.records import EntityState
from spark_sb.sender.context import SendContext
from spark_sb.wire.parking import Parked
from spark_sb.wire.timing import NAMESPACE_SILENCE
from spark_sb.wire.transport import PRIMARY, Batch, Target, Transport

#: open_links' line is the sender's (what users configure is ``spark_sb.sender.paired``), as it was before it moved here.
_LOGGER = logging.getLogger("spark_sb.sender.paired")

#: Error classes that only the service sends back: the namespace answered the call (SPEC F7).
ANSWERED_BY_SERVICE = frozenset(
    {
        "quota_exceeded",
        "entity_disabled",
        "entity_not_found",
        "service_error",
        "server_busy",
        "message_too_large",
        "invalid_request",
    }
)


@dataclass
class Attempted:
    """How an attempt loop ended: ``decision`` None means success."""

    decision: Decision | None = None
    error: BaseException | None = None
    error_class: ErrorClass | None = None


SUCCEEDED = Attempted()


@dataclass
class Progress:
    """Where one batch's attempt loop stands, kept across deferred retries (see :meth:`PairedSender._flush`)."""

    began: float
    attempts: int = 0
    #: The batch's backlog translations made ahead (:class:`~spark_sb.sender.ahead.Ahead`), if any by the divert.
    ahead: Callable[[], list[object | None] | None] | None = None
    #: SPEC B14: when the first of its primary attempts that may have landed began (UTC wall time), if any: its
    #: messages, if diverted, carry it into the backlog (:data:`~spark_sb.message.backlog.BACKLOG_AMBIGUOUS`).
    ambiguous: datetime | None = None

    def attempted_ambiguously(self, at: datetime) -> None:
        """An attempt that began at ``at`` failed once its batch was written: the earliest such time is kept (the
        primary's duplicate detection window runs from the first copy that may have landed)."""
        if self.ambiguous is None or at < self.ambiguous:
            self.ambiguous = at


@dataclass(frozen=True)
class WireEvidence:
    """What the wire tells about one failed call to ``target`` that started at ``started`` (SPEC F1, F7): the
    :class:`~spark_sb.failover.machine.Evidence` that an entity's failover state asks for when it records the
    failure. ``transport``: the one the call used (a probe's isolated transport, or the sender's)."""

    error: ErrorClass
    target: Target
    started: float
    state: EntityFailover
    transport: Transport
    clock: Clock

    def namespace_wide(self) -> bool:
        """Is the failure evidence against the whole namespace? :func:`~spark_sb.failover.decisions.namespace_wide`
        on namespace facts: a connection-class error is; a timeout is when the connection has said nothing for
        :data:`~spark_sb.wire.timing.NAMESPACE_SILENCE` (past its heartbeat), or when several distinct entities
        of the namespace time out with nothing heard since the first of them started
        (:meth:`~spark_sb.failover.namespace_health.NamespaceHealth.entity_timed_out`). One entity's timeout alone never is,
        nor a timeout during which the namespace answered on any connection
        (:meth:`~spark_sb.failover.namespace_health.NamespaceHealth.answered_since`)."""
        if not self.error.fail_over:
            return False
        health = self.state.health
        if self.error.name == "timeout" and health is not None and health.answered_since(self.started):
            # The namespace answered on some connection while this attempt waited (the healthy entities' sends,
            # while probes of stalled entities time out on the isolated connection): the timeout is the entity's
            # or its connection's, never the namespace's.
            return False
        answered = self.transport.answered_within(self.target, NAMESPACE_SILENCE)
        if namespace_wide(self.error, connection_answered=answered):
            return True
        if self.error.name != "timeout" or health is None:
            return False
        first = health.first_timeout()
        since_first = self.clock.monotonic() - min(self.started, first if first is not None else self.started)
        silent = not self.transport.answered_within(self.target, max(0.0, since_first))
        return health.entity_timed_out(self.target.entity, self.started, silent)

    def answered(self) -> bool:
        """Did the namespace answer the call? Yes when the service sent an error condition back (an entity
        disabled, full, not found, busy, a refusal: the namespace itself spoke) or when the connection was heard
        within :data:`~spark_sb.wire.timing.NAMESPACE_SILENCE` of the failure (a timeout of one entity on a live
        connection). A connection-class error or a closed client says nothing."""
        if self.error.name in ANSWERED_BY_SERVICE:
            return True
        if self.error.name != "timeout":
            return False
        return self.transport.answered_within(self.target, NAMESPACE_SILENCE)


@dataclass(eq=False)
class AttemptLoop:
    """Carries out, for one sender (its :class:`~spark_sb.sender.context.SendContext`), what the failover state
    decides after each failed attempt: sleep and retry, or hand the decision back (divert, split, reject, pull,
    raise). The decision itself is the entity's (:meth:`~spark_sb.failover.machine.EntityFailover.failed`), or for
    calls without an entity (a backlog queue, a probe's cancel) :func:`~spark_sb.failover.decisions.decide`'s."""

    ctx: SendContext

    def run(
        self,
        where: Where,
        call: Callable[[float], object],
        tally: Tally | None,
        *,
        state: EntityFailover | None = None,
        messages: int = 1,
        target: Target,
        progress: Progress | None = None,
        defer: bool = False,
        resume: Parked | None = None,
        finish: Callable[[Parked], object] | None = None,
    ) -> Attempted:
        """Call ``call(timeout)`` until it succeeds or the decision says otherwise (after sleeping through each
        RETRY). On the primary, each attempt's deadline is what the entity's failover timer leaves it and each
        failure goes to the entity's state from the moment the failing attempt started. ``defer``: a RETRY is
        returned (its delay in the decision) instead of slept through, ``progress`` carrying the loop's state to
        the next call - so that the caller can wait for many entities' retries at once.

        A call may raise :class:`~spark_sb.wire.parking.Parked` (an attempt under way, not answered yet): it is
        raised on to the caller, which later goes on with ``resume`` (the parked attempt) and ``finish`` (the call
        that finishes it, instead of a new attempt first; it may park again)."""
        ctx = self.ctx
        if progress is None:
            progress = Progress(ctx.clock.monotonic())
        began = progress.began
        while True:
            if resume is not None and finish is not None:
                parked, resume = resume, None
                started = parked.started
                attempt: Callable[[], object] = functools.partial(finish, parked)
            else:
                timeout = self._budget(where, state, began, tally, target)
                if timeout is None:
                    return Attempted(Decision(Verb.DIVERT, why="failed over"))
                started = ctx.clock.monotonic()
                progress.attempts += 1
                attempt = functools.partial(call, timeout)
            try:
                attempt()
            except Parked:
                raise
            except Exception as exc:
                cls = classify(exc)
                if cls.rebuild_client:
                    ctx.fault(target)
                if where is Where.PRIMARY and is_ambiguous(
                    exc
                ):  # only a failed attempt: off the healthy path
                    progress.attempted_ambiguously(
                        ctx.clock.now() - timedelta(seconds=ctx.clock.monotonic() - started)
                    )
                decision = self._decide(where, cls, exc, started, state, tally, target, progress, messages)
                if decision.verb is Verb.RETRY:
                    if not defer:
                        ctx.clock.sleep(decision.delay)
                    if tally is not None:
                        tally.retries += 1
                        if decision.why == "throttled":
                            waited = tally.throttled.get(target.entity, 0.0)
                            tally.throttled[target.entity] = waited + decision.delay
                    if defer:
                        return Attempted(decision, exc, cls)
                    continue
                return Attempted(decision, exc, cls)
            if state is not None:
                ctx.emit(tally, state.record_success())
            return SUCCEEDED

    def _decide(
        self,
        where: Where,
        cls: ErrorClass,
        exc: BaseException,
        started: float,
        state: EntityFailover | None,
        tally: Tally | None,
        target: Target,
        progress: Progress,
        messages: int,
    ) -> Decision:
        ctx = self.ctx
        waited = ctx.clock.monotonic() - progress.began
        if state is None:
            return decide(
                where,
                cls,
                attempts=progress.attempts,
                waited=waited,
                state=EntityState.HEALTHY,
                remaining=None,
                messages=messages,
                policy=ctx.policy,
            )
        evidence = WireEvidence(cls, target, started, state, ctx.transport(), ctx.clock)
        step = state.failed(
            where,
            cls,
            describe_error(exc),
            started,
            evidence,
            attempts=progress.attempts,
            waited=waited,
            messages=messages,
            policy=ctx.policy,
        )
        ctx.emit(tally, step.transitions)
        if step.began_failing:
            ctx.warm_backlog(state.entity)
        return step.decision

    def retry_probe(
        self, call: Callable[[float], object], target: Target
    ) -> tuple[ErrorClass | None, BaseException | None]:
        """A probe's call (its cancel) under the retry policy for probes (the :data:`~spark_sb.wire.probe.Retry`
        that :func:`~spark_sb.wire.probe.probe_call` takes): the last error class and error, or None."""
        result = self.run(Where.PROBE, call, None, target=target)
        if result.decision is None:
            return None, None
        return result.error_class or UNEXPECTED, result.error

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
            budget, transitions = state.next_attempt(
                float(self.ctx.config.send_timeout), self.ctx.transport().connected(target)
            )
            self.ctx.emit(tally, transitions)
            return budget
        if where is Where.BACKLOG:
            return min(
                float(self.ctx.config.send_timeout),
                max(0.05, self.ctx.policy.backlog_budget - (self.ctx.clock.monotonic() - began)),
            )
        return self.ctx.probe_budget

    def error(self, result: Attempted, namespace: str, entity: str) -> SendError:
        """The :class:`SendError` a loop that ended without success (and without a decision the caller acts on)
        raises: a configuration error, throttling past its budget, or an unexpected error."""
        cls = result.error_class or UNEXPECTED
        exc = result.error or Exception("unknown error")
        if cls.fail_batch:
            return self._config_error(cls, exc, namespace, entity)
        if cls.retry and not cls.fail_over:
            busy = self.ctx.policy
            return ServerBusyError(
                f"the {namespace} namespace {namespace_description(self.ctx.config.primary)} kept answering "
                f"{cls.name} for entity {entity!r} (up to {busy.busy_retries} retries, {busy.busy_wait:.0f} s); "
                "not failing over (throttling is not an outage); the task fails so that Spark retries it",
                error_class=cls,
            )
        return SendError(
            f"unexpected {cls.name} error sending to entity {entity!r}: {describe_error(exc)}",
            error_class=cls,
        )

    def _config_error(self, cls: ErrorClass, exc: BaseException, namespace: str, entity: str) -> SendError:
        ns = self.ctx.config.primary if namespace == PRIMARY else self.ctx.config.secondary
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


def open_links(ctx: SendContext, entities: list[str], tally: Tally | None) -> None:
    """Open the links of ``entities`` (primary) concurrently before their batches go out (SPEC F3: a cold
    start costs about one round of link openings, not one per entity). A namespace fault met here is
    namespace-wide evidence from the moment the opening started (F1); per-entity errors are met again, and
    handled, by each entity's own send."""
    transport = ctx.transport()
    targets = [t for t in (Target(PRIMARY, e) for e in entities) if not transport.connected(t)]
    if len(targets) < 2:
        return
    first = ctx.entity(targets[0].entity)
    silence, transitions = first.next_attempt(float(ctx.config.send_timeout))
    ctx.emit(tally, transitions)
    if silence is None:
        return
    started = ctx.clock.monotonic()
    try:
        transport.prepare(targets, silence)
    except Exception as exc:  # the transport closed what faulted already
        cls = classify(exc)
        evidence = WireEvidence(cls, targets[0], started, first, transport, ctx.clock)
        if cls.fail_over and evidence.namespace_wide():
            ctx.emit(tally, first.record_failure(cls, describe_error(exc), started, namespace_wide=True))
        _LOGGER.info("opening %d links failed (%s); each entity's send meets it", len(targets), cls.name)


def halves(transport: Transport, batch: Batch) -> list[Batch]:
    """``batch`` as two batches of its halves (the service refused it as too large: SPLIT)."""
    msgs = list(batch.messages)
    half = len(msgs) // 2
    out = []
    for part in (msgs[:half], msgs[half:]):
        sub = transport.new_batch(batch.target)
        for m in part:
            if not sub.try_add(m):  # pragma: no cover - a half always fits where the whole did
                raise SendError("internal error: a split batch does not fit")
        out.append(sub)
    return out
