"""The per-entity failover state machine (SPEC B3, B8); the namespace-wide evidence its entities share is
:mod:`spark_sb.failover.namespace_health` (F1, F4). Runs in executors' Python workers (and the driver's syphon); thread-safe; not picklable (locks): the records it
returns are."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from spark_sb.core.clock import Clock
from spark_sb.core.errors import ErrorClass
from spark_sb.failover.decisions import (
    MIN_SEND_BUDGET,
    WRONG_DESTINATION,
    Decision,
    RetryPolicy,
    Route,
    Where,
    attempt_budget,
    decide,
    failover_due,
    probe_due,
)
from spark_sb.failover.namespace_health import NamespaceHealth
from spark_sb.failover.records import EntityState, EntityStatus, StateTransition, redacted


class Evidence(Protocol):
    """What the wire can tell about one failed call (SPEC F7), asked by the entity's state only when it needs it
    (asking may record a timeout in the namespace's health): :meth:`namespace_wide` - the failure is evidence against
    the whole namespace (its connection was silent past its heartbeat, or several entities timed out together);
    :meth:`answered` - the namespace answered the call (a service error condition, or its connection was heard)."""

    def namespace_wide(self) -> bool: ...

    def answered(self) -> bool: ...


@dataclass(frozen=True)
class Step:
    """What follows a failed attempt on a primary entity (:meth:`EntityFailover.failed`): the ``decision`` (retry
    after a pause, divert, split, reject, raise), the ``transitions`` that recording the failure caused, and
    ``began_failing``: the entity went FAILING with this failure (its backlog link is worth opening now)."""

    decision: Decision
    transitions: list[StateTransition]
    began_failing: bool = False


# ---------------------------------------------------------------------------------------------------------
# Per-entity state machine


class EntityFailover:
    """The failover state of one primary entity, shared by every sender of the process. Thread-safe.

    Methods return the transitions they caused (possibly none); the caller hands them to its listener and
    its send outcome.
    """

    def __init__(
        self,
        entity: str,
        *,
        failover_interval: float,
        ping_interval: float,
        clock: Clock,
        namespace: str = "",
        health: NamespaceHealth | None = None,
    ) -> None:
        if failover_interval < 0:
            raise ValueError("failover_interval must be >= 0")
        if ping_interval <= 0:
            raise ValueError("ping_primary_interval must be > 0")
        self.entity = entity
        self.namespace = namespace
        self.failover_interval = failover_interval
        self.ping_interval = ping_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._state = EntityState.HEALTHY
        self._since_wall = clock.now()
        self._first_failure: float | None = None
        self._first_failure_wall: datetime | None = None
        self._last_probe: float = 0.0
        self._probing = False
        self._last_error_class: str | None = None
        self._health = health
        self._joined = (
            -1
        )  # the namespace fault (its epoch) this entity joined; a new entity joins an open one
        self._by_namespace = False  # FAILING because of the namespace's fault, not one of its own
        self._failed_by_namespace = False  # FAILED_OVER because of the namespace's fault, not one of its own
        self._namespace_probe = False  # the probe in flight probes the namespace for all its entities
        self._accepted = False  # see :attr:`accepted`

    # -- reading
    @property
    def state(self) -> EntityState:
        with self._lock:
            return self._state

    def status(self) -> EntityStatus:
        with self._lock:
            return EntityStatus(
                namespace=self.namespace,
                entity=self.entity,
                state=self._state,
                since=self._since_wall,
                first_failure=self._first_failure_wall,
                last_error_class=self._last_error_class,
                accepted=self._accepted_locked(),
            )

    @property
    def accepted(self) -> bool:
        """The entity accepted a message or a probe for this sink (here, or as the state table says): a not-found
        answer from it is an outage (it was deleted), not a wrong destination (SPEC F9)."""
        with self._lock:
            return self._accepted_locked()

    def _accepted_locked(self) -> bool:
        if self._accepted:
            return True
        if self._health is not None and self._health.is_known(self.entity):
            self._accepted = True
        return self._accepted

    @property
    def health(self) -> NamespaceHealth | None:
        """The namespace-wide evidence this entity shares with the other entities of its namespace."""
        return self._health

    @property
    def probed_at(self) -> float:
        """When this entity's probe was last claimed (monotonic): probes rotate by it (SPEC F7)."""
        with self._lock:
            return self._last_probe

    def namespace_answered_here(self) -> list[StateTransition]:
        """A call to this entity failed but the namespace answered it (a service error condition, or its connection
        was heard during the attempt): evidence that the namespace answers (SPEC F7). Closes an open namespace
        fault (the namespace's other entities learn it); this entity's own state is unchanged."""
        return self._namespace_answered_by_me()

    def time_until_failover(self) -> float | None:
        """Seconds left on the failover timer (None unless FAILING)."""
        with self._lock:
            if self._state is not EntityState.FAILING or self._first_failure is None:
                return None
            return max(0.0, self._first_failure + self.failover_interval - self._clock.monotonic())

    # -- events
    def record_failure(
        self,
        error_class: ErrorClass | str,
        detail: str = "",
        started: float | None = None,
        *,
        namespace_wide: bool = False,
    ) -> list[StateTransition]:
        """A fail_over-class error on a send to the primary entity (B3). ``started`` (monotonic) is when the
        failing attempt started: the failover timer runs from there (default: now). ``namespace_wide``
        (:func:`namespace_wide`): the failure is evidence against the whole namespace - every entity of it that
        the process sends to starts its timer from ``started`` too (F1); their transitions are returned as well."""
        name = error_class if isinstance(error_class, str) else error_class.name
        now = self._clock.monotonic()
        began = now if started is None else min(started, now)
        opened = (
            self._health.record_fault(name, detail, began)
            if namespace_wide and self._health is not None
            else False
        )
        with self._lock:
            self._last_error_class = name
            out: list[StateTransition] = []
            if self._state is EntityState.HEALTHY:
                self._first_failure = began
                self._first_failure_wall = self._clock.now() - timedelta(seconds=now - began)
                self._by_namespace = namespace_wide
                out.append(self._move(EntityState.FAILING, name, detail, at=self._first_failure_wall))
            elif self._state is EntityState.FAILING and not namespace_wide:
                self._by_namespace = False
            if self._health is not None:
                self._joined = self._health.epoch
            out.extend(self._check_locked(name, detail))
        if opened:
            assert self._health is not None
            for other in self._health.entities():
                if other is not self:
                    out.extend(other.check())
        return out

    def record_success(self, detail: str = "send succeeded") -> list[StateTransition]:
        """A successful send to the primary entity: back to HEALTHY (resets the timer). The namespace answered:
        an open namespace fault closes (:meth:`NamespaceHealth.answered`), and the other entities learn it."""
        with self._lock:
            self._accepted = True
            out = [] if self._state is EntityState.HEALTHY else [self._back_to_healthy(detail)]
        if self._health is not None:
            self._health.reached = True
        out.extend(self._namespace_answered_by_me())
        return out

    def _namespace_answered_by_me(self) -> list[StateTransition]:
        """This entity's namespace answered: if that closed a fault, release the namespace's other entities."""
        out: list[StateTransition] = []
        if self._health is not None and self._health.answered():
            for other in self._health.entities():
                if other is not self:
                    out.extend(other.namespace_answered())
        return out

    def namespace_answered(self) -> list[StateTransition]:
        """The namespace's fault closed (another entity's send or probe succeeded). Evidence is scoped: an entity
        that is FAILING or FAILED_OVER because of the namespace's fault only returns to HEALTHY now - the
        namespace's evidence put it there and the namespace's answer takes it out, so a thousand entities come
        back with one probe (F4); should it have a fault of its own as well, its next send meets it and it fails
        over again after ``failover_interval``. An entity failed over for a fault of its own is probed now."""
        with self._lock:
            if self._state is EntityState.FAILING and self._by_namespace:
                return [self._back_to_healthy("the namespace answered again")]
            if self._state is EntityState.FAILED_OVER:
                if self._failed_by_namespace:
                    return [
                        self._back_to_healthy("the namespace answered again (the failover was its fault)")
                    ]
                if not self._probing:
                    self._last_probe = self._clock.monotonic() - self.ping_interval
            return []

    def check(self) -> list[StateTransition]:
        """Apply the timer: FAILING for ``failover_interval`` without a success -> FAILED_OVER."""
        with self._lock:
            return self._check_locked(self._last_error_class, "failover interval passed without a success")

    def admit(self) -> tuple[Route, list[StateTransition]]:
        """Where a batch for this entity goes now, and the transitions that deciding caused (the one entry point
        for callers; it applies the failover timer):

        * :attr:`Route.PRIMARY` - healthy or failing: send to the primary;
        * :attr:`Route.BACKLOG` - failed over: divert;
        * :attr:`Route.PROBE` - failed over and a probe is due: this caller has claimed it (once per
          ``ping_primary_interval`` for the whole process, and never while another probe is in flight); it
          starts the probe and diverts meanwhile, then reports with :meth:`record_probe`.
        """
        with self._lock:
            transitions = self._check_locked(
                self._last_error_class, "failover interval passed without a success"
            )
            if self._state is not EntityState.FAILED_OVER:
                return Route.PRIMARY, transitions
            return (Route.PROBE if self._claim_locked() else Route.BACKLOG), transitions

    def attempt_budget(self, send_timeout: float, connected: bool = False) -> float:
        """The deadline of the next attempt on the primary entity (see :func:`attempt_budget`)."""
        with self._lock:
            self._join_locked()  # transitions are reported by the check() that precedes every attempt
            waited = None
            if self._state is EntityState.FAILING and self._first_failure is not None:
                waited = self._clock.monotonic() - self._first_failure
            return attempt_budget(send_timeout, self.failover_interval, waited, connected)

    def next_attempt(
        self, send_timeout: float, connected: bool = False
    ) -> tuple[float | None, list[StateTransition]]:
        """Before an attempt on the primary entity: its deadline (what is left of the failover timer, see
        :func:`attempt_budget`), or None when the entity is failed over by now (divert instead); and the
        transitions that applying the timer caused. A failing entity with less than :data:`MIN_SEND_BUDGET` of its
        interval left makes no attempt: the call waits that out on the clock and gets None."""
        transitions = self.check()
        if self.state is EntityState.FAILED_OVER:
            return None, transitions
        budget = self.attempt_budget(send_timeout, connected)
        if budget < MIN_SEND_BUDGET and self.state is EntityState.FAILING:
            # Too little of the interval is left for an attempt that the SDK's own timeout can end: it would end
            # at the lane's deadline, which abandons the namespace's shared connection - every healthy entity's
            # (F7; seen on a loaded machine: 0.03 s left after a slow first attempt). Wait the interval out
            # instead; the entity is then failed over, as it would be after that attempt.
            self._clock.sleep(budget)
            transitions.extend(self.check())
            if self.state is EntityState.FAILED_OVER:
                return None, transitions
            budget = self.attempt_budget(send_timeout, connected)
        return budget, transitions

    def failed(
        self,
        where: Where,
        error: ErrorClass,
        detail: str,
        started: float,
        evidence: Evidence,
        *,
        attempts: int,
        waited: float,
        messages: int,
        policy: RetryPolicy,
    ) -> Step:
        """An attempt on this entity (``where``: a send to it, a probe's cancel) that started at ``started``
        (monotonic) failed with ``error``: record it and say what follows (the whole rule, SPEC B3, F1, F7, F9).

        * A fail_over-class error goes to the failover timer from ``started`` - against the whole namespace when
          the ``evidence`` says so - unless it is a not-found from an entity never seen to accept a message (a
          wrong destination, F9: rejected, not an outage).
        * A failure that is not the namespace's and that the namespace answered (a service error condition, a
          connection heard during the call) closes an open namespace fault: the other entities learn it.
        * The decision is :func:`decide` on the state as it stands after the failure."""
        known = where is not Where.PRIMARY or self.accepted
        transitions: list[StateTransition] = []
        began_failing = False
        wide = False
        if error.fail_over and (known or error.name != WRONG_DESTINATION):
            wide = evidence.namespace_wide()
            failing = self.record_failure(error, detail, started, namespace_wide=wide)
            transitions.extend(failing)
            began_failing = bool(failing) and failing[0].to_state is EntityState.FAILING
        if not wide and evidence.answered():
            transitions.extend(self.namespace_answered_here())
        decision = decide(
            where,
            error,
            attempts=attempts,
            waited=waited,
            state=self.state,
            remaining=self.time_until_failover(),
            messages=messages,
            policy=policy,
            known=known,
        )
        return Step(decision, transitions, began_failing)

    def probe_failed(self, error: ErrorClass, detail: str, evidence: Evidence) -> list[StateTransition]:
        """A probe of this failed-over entity failed with ``error``: recorded by the same rule as a failed send
        (:meth:`failed`): against the namespace when the ``evidence`` says so, and an answer of the namespace
        closes its fault. The entity stays failed over; the next probe is due in ``ping_primary_interval``."""
        wide = evidence.namespace_wide()
        transitions = self.record_probe(False, error.name, detail, namespace_wide=wide)
        if not wide and evidence.answered():
            transitions.extend(self.namespace_answered_here())
        return transitions

    def claim_probe(self) -> bool:
        """True (once per ``ping_primary_interval`` for the whole process) when this caller should probe now;
        while the namespace has an open fault, once per interval for the whole namespace (F4)."""
        with self._lock:
            return self._state is EntityState.FAILED_OVER and self._claim_locked()

    def next_probe_in(self) -> float | None:
        """Seconds until the next probe is due (None unless FAILED_OVER)."""
        with self._lock:
            if self._state is not EntityState.FAILED_OVER:
                return None
            own = max(0.0, self._last_probe + self.ping_interval - self._clock.monotonic())
            shared = self._health.next_probe_in() if self._health is not None else None
            return own if shared is None else max(own, shared)

    def release_probe(self) -> None:
        """Give back a claimed probe that was not made (the sender closed, say): nothing is recorded - closing is
        never evidence (SPEC F7) - and the next probe is due on the usual schedule."""
        with self._lock:
            self._probing = False
            shared, self._namespace_probe = self._namespace_probe, False
        if shared and self._health is not None:
            self._health.probe_done()

    def record_probe(
        self, ok: bool, error_class: str | None = None, detail: str = "", *, namespace_wide: bool = False
    ) -> list[StateTransition]:
        """The result of a probe: a good one returns the entity to HEALTHY (B8) and closes the namespace's fault
        (its other failed-over entities are probed at once). A failed one with a namespace-wide error
        (:func:`namespace_wide`) opens a namespace fault: the namespace is then probed once per interval, not once
        per entity (F4)."""
        with self._lock:
            self._probing = False
            shared, self._namespace_probe = self._namespace_probe, False
            out: list[StateTransition] = []
            if ok:
                self._accepted = True
            if ok and self._state is not EntityState.HEALTHY:
                out.append(self._back_to_healthy(detail or "probe succeeded"))
            if not ok:
                self._last_error_class = error_class
        if self._health is not None:
            if shared:
                self._health.probe_done()
            if ok:
                self._health.reached = True
                out.extend(self._namespace_answered_by_me())
            elif namespace_wide:
                self._health.record_fault(error_class or "connection", detail, self._clock.monotonic())
        return out

    def restore(
        self, state: EntityState, detail: str = "restored from the state table"
    ) -> list[StateTransition]:
        """Start in ``state`` (e.g. FAILED_OVER known from the Delta state table, S4): no second wait."""
        with self._lock:
            if state is self._state:
                return []
            if state is EntityState.HEALTHY:
                return [self._back_to_healthy(detail)]
            if state is EntityState.FAILING:
                self._first_failure = self._clock.monotonic()
                self._first_failure_wall = self._clock.now()
                return [self._move(EntityState.FAILING, self._last_error_class, detail)]
            return [self._enter_failed_over(self._last_error_class, detail)]

    # -- internals (lock held)
    def _claim_locked(self) -> bool:
        """Claim the probe if one is due and none is in flight (the state is FAILED_OVER). While the namespace has
        an open fault the claim is the namespace's: one probe per interval whichever entity makes it."""
        now = self._clock.monotonic()
        if self._probing or not probe_due(self._last_probe, now, self.ping_interval):
            return False
        if self._health is not None:
            shared = self._health.claim_probe()
            if shared is not None:
                if shared:
                    self._last_probe = now
                    self._probing = self._namespace_probe = True
                return shared
        self._last_probe = now
        self._probing = True
        return True

    def _join_locked(self) -> list[StateTransition]:
        """Join the namespace's open fault, once per fault (F1): a HEALTHY entity becomes FAILING from the fault's
        start; a FAILING one's timer starts at the earlier of its own first failure and the fault's start."""
        health = self._health
        if health is None or health.epoch == self._joined or not health.faulted:
            return []
        fault = health.fault()
        if fault is None:
            return []
        since, since_wall, error_class, detail, epoch = fault
        self._joined = epoch
        if self._state is EntityState.HEALTHY:
            self._first_failure = since
            self._first_failure_wall = since_wall
            self._by_namespace = True
            self._last_error_class = error_class
            return [self._move(EntityState.FAILING, error_class, f"namespace fault: {detail}", at=since_wall)]
        if (
            self._state is EntityState.FAILING
            and self._first_failure is not None
            and since < self._first_failure
        ):
            self._first_failure = since
            self._first_failure_wall = since_wall
        return []

    def _check_locked(self, error_class: str | None, detail: str) -> list[StateTransition]:
        joined = self._join_locked()
        if joined:
            error_class = self._last_error_class
        if (
            self._state is EntityState.FAILING
            and self._first_failure is not None
            and failover_due(self._first_failure, self._clock.monotonic(), self.failover_interval)
        ):
            return [*joined, self._enter_failed_over(error_class, detail)]
        return joined

    def _enter_failed_over(self, error_class: str | None, detail: str) -> StateTransition:
        self._last_probe = self._clock.monotonic()  # first probe one ping interval after the failover
        self._failed_by_namespace = self._by_namespace
        return self._move(EntityState.FAILED_OVER, error_class, detail)

    def _back_to_healthy(self, detail: str) -> StateTransition:
        self._by_namespace = self._failed_by_namespace = False
        self._first_failure = None
        self._first_failure_wall = None
        return self._move(EntityState.HEALTHY, None, detail)

    def _move(
        self, to: EntityState, error_class: str | None, detail: str, at: datetime | None = None
    ) -> StateTransition:
        transition = StateTransition(
            entity=self.entity,
            from_state=self._state,
            to_state=to,
            at=at or self._clock.now(),
            error_class=error_class,
            detail=redacted(detail),
            namespace=self.namespace or None,
        )
        self._state = to
        self._since_wall = transition.at
        return transition
