"""The attempt loop of a paired sender (SPEC B3, F1, L4): a call (a send, a backlog send, a probe's cancel) is made
until it succeeds or the decision table (:func:`~spark_sb.failover.decisions.decide`) says otherwise - retry after a
back-off, divert, split, reject, pull the backlog queue, or fail the task - each attempt with the deadline its
entity's failover timer leaves it. On the primary, every failure goes to the entity's failover state from the
moment the failing attempt started, as evidence against the entity or, when the connection did not answer,
against the whole namespace.

Where it runs: on the sender's thread (and a probe's), in an executor's Python worker; not picklable. Holds no
per-entity state of its own: the entity's :class:`~spark_sb.failover.machine.EntityFailover` carries it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.clock import Clock
from spark_sb.core.errors import (
    UNEXPECTED,
    ErrorClass,
    SendError,
    ServerBusyError,
    ServiceBusConfigError,
    classify,
    describe_error,
)
from spark_sb.failover.decisions import (
    WRONG_DESTINATION,
    Decision,
    RetryPolicy,
    Verb,
    Where,
    decide,
    namespace_wide,
)
from spark_sb.failover.machine import EntityFailover
from spark_sb.failover.outcome import Tally, namespace_description
from spark_sb.failover.records import EntityState, StateTransition
from spark_sb.wire.transport import NAMESPACE_SILENCE, PRIMARY, Target, Transport

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

Emit = Callable[[Tally | None, list[StateTransition]], None]


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


@dataclass(eq=False, kw_only=True)
class AttemptLoop:
    """Runs calls under the retry policy and the failover timers of one sender.

    Args:
        config: the sender's configuration (``send_timeout``, the namespaces for error texts).
        clock: the sender's clock (sleeps between attempts go through it).
        policy: the retry policy (back-off, the "server busy" budget, backlog and cancel attempts).
        transport: returns the sender's transport (built lazily).
        fault: a call met a connection-class error on ``target``: replace its client.
        emit: hands transitions to the outcome and the listener.
        warm_backlog: an entity started failing: open its backlog link now.
        probe_budget: the deadline of each probe call.
    """

    config: ServiceBusConfig
    clock: Clock
    policy: RetryPolicy
    transport: Callable[[], Transport]
    fault: Callable[[Target], None]
    emit: Emit
    warm_backlog: Callable[[str], None]
    probe_budget: float

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
    ) -> Attempted:
        """Call ``call(timeout)`` until it succeeds or :func:`decide` says otherwise (after sleeping through
        each RETRY). On the primary, each failure goes to the entity's failover timer (from the moment the
        failing attempt started) and each attempt's deadline is what is left of the interval. ``defer``: a RETRY
        is returned (its delay in the decision) instead of slept through, ``progress`` carrying the loop's state
        to the next call - so that the caller can wait for many entities' retries at once."""
        if progress is None:
            progress = Progress(self.clock.monotonic())
        began = progress.began
        while True:
            timeout = self._budget(where, state, began, tally, target)
            if timeout is None:
                return Attempted(Decision(Verb.DIVERT, why="failed over"))
            attempt = functools.partial(call, timeout)
            started = self.clock.monotonic()
            progress.attempts += 1
            attempts = progress.attempts
            try:
                attempt()
            except Exception as exc:
                cls = classify(exc)
                if cls.rebuild_client:
                    self.fault(target)
                remaining: float | None = None
                entity_state = EntityState.HEALTHY
                known = state is None or where is not Where.PRIMARY or state.accepted
                if state is not None:
                    wide = False
                    if cls.fail_over and (known or cls.name != WRONG_DESTINATION):
                        wide = self.namespace_wide(cls, target, started, state)
                        failing = state.record_failure(cls, describe_error(exc), started, namespace_wide=wide)
                        self.emit(tally, failing)
                        if failing and failing[0].to_state is EntityState.FAILING:
                            self.warm_backlog(state.entity)
                    if not wide and self.namespace_answered(cls, target):
                        self.emit(tally, state.namespace_answered_here())
                    entity_state = state.state
                    remaining = state.time_until_failover()
                decision = decide(
                    where,
                    cls,
                    attempts=attempts,
                    waited=self.clock.monotonic() - began,
                    state=entity_state,
                    remaining=remaining,
                    messages=messages,
                    policy=self.policy,
                    known=known,
                )
                if decision.verb is Verb.RETRY:
                    if not defer:
                        self.clock.sleep(decision.delay)
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
                self.emit(tally, state.record_success())
            return SUCCEEDED

    def namespace_wide(
        self,
        cls: ErrorClass,
        target: Target,
        started: float,
        state: EntityFailover | None = None,
        transport: Transport | None = None,
    ) -> bool:
        """Is a failure of an attempt that started at ``started`` evidence against the whole namespace (SPEC F1,
        F7)? :func:`~spark_sb.failover.decisions.namespace_wide` on namespace facts: a connection-class error is; a timeout
        is when the connection the attempt used (``transport``, default the sender's) has said nothing for
        :data:`~spark_sb.wire.transport.NAMESPACE_SILENCE` (past its heartbeat), or when it makes several distinct
        entities of ``state``'s namespace time out with nothing heard since the first of them started
        (:meth:`~spark_sb.failover.machine.NamespaceHealth.entity_timed_out`). One entity's timeout alone never is."""
        if not cls.fail_over:
            return False
        transport = transport or self.transport()
        answered = transport.answered_within(target, NAMESPACE_SILENCE)
        if namespace_wide(cls, connection_answered=answered):
            return True
        health = state.health if state is not None else None
        if cls.name != "timeout" or health is None:
            return False
        first = health.first_timeout()
        since_first = self.clock.monotonic() - min(started, first if first is not None else started)
        silent = not transport.answered_within(target, max(0.0, since_first))
        return health.entity_timed_out(target.entity, started, silent)

    def namespace_answered(self, cls: ErrorClass, target: Target, transport: Transport | None = None) -> bool:
        """Did a failed call to ``target`` show that the namespace answers (SPEC F7)? Yes when the service sent an
        error condition back (an entity disabled, full, not found, busy, a refusal: the namespace itself spoke) or
        when the connection was heard within :data:`~spark_sb.wire.transport.NAMESPACE_SILENCE` of the failure (a
        timeout of one entity on a live connection). A connection-class error or a closed client says nothing."""
        if cls.name in ANSWERED_BY_SERVICE:
            return True
        if cls.name != "timeout":
            return False
        return (transport or self.transport()).answered_within(target, NAMESPACE_SILENCE)

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
            self.emit(tally, state.check())
            if state.state is EntityState.FAILED_OVER:
                return None
            return state.attempt_budget(float(self.config.send_timeout), self.transport().connected(target))
        if where is Where.BACKLOG:
            return min(
                float(self.config.send_timeout),
                max(0.05, self.policy.backlog_budget - (self.clock.monotonic() - began)),
            )
        return self.probe_budget

    def error(self, result: Attempted, namespace: str, entity: str) -> SendError:
        """The :class:`SendError` a loop that ended without success (and without a decision the caller acts on)
        raises: a configuration error, throttling past its budget, or an unexpected error."""
        cls = result.error_class or UNEXPECTED
        exc = result.error or Exception("unknown error")
        if cls.fail_batch:
            return self._config_error(cls, exc, namespace, entity)
        if cls.retry and not cls.fail_over:
            busy = self.policy
            return ServerBusyError(
                f"the {namespace} namespace {namespace_description(self.config.primary)} kept answering "
                f"{cls.name} for entity {entity!r} (up to {busy.busy_retries} retries, {busy.busy_wait:.0f} s); "
                "not failing over (throttling is not an outage); the task fails so that Spark retries it",
                error_class=cls,
            )
        return SendError(
            f"unexpected {cls.name} error sending to entity {entity!r}: {describe_error(exc)}",
            error_class=cls,
        )

    def _config_error(self, cls: ErrorClass, exc: BaseException, namespace: str, entity: str) -> SendError:
        ns = self.config.primary if namespace == PRIMARY else self.config.secondary
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
