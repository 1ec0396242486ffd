"""Per-entity failover state machine, backlog rotation and backlog choice (SPEC B3, B4, B5, B8).

States per destination entity (queue or topic) of the primary namespace::

    HEALTHY --fail_over-class error--> FAILING --failover_interval without a success--> FAILED_OVER
       ^                                  |                                                   |
       +------- successful send ----------+                 (probe every ping_primary_interval)
       +----------------------------------------- successful probe --------------------------+

* ``failover_interval == 0`` fails over on the first such failure.
* While FAILED_OVER, sends to the primary stop and a probe is due every ``ping_primary_interval``;
  a good probe returns the entity to HEALTHY at once.

Everything reads time through an injected :class:`~spark_sb.clock.Clock` (monotonic for timers, UTC wall time
for what is recorded). Decisions are small pure functions (:func:`failover_due`, :func:`probe_due`,
:func:`backoff_delay`, :func:`choose_random`, :func:`choose_session_affine`) tested directly.

State is shared per process (SPEC B4/B5: every sender in the executor process learns at once): the
:class:`FailoverRegistry` holds the entity states (keyed by primary namespace + entity) and the
:class:`BacklogRotation` (keyed by secondary namespace + queue). :func:`process_registry` is the process-level
one; tests inject a fresh registry.

Runs in executors' Python workers (one registry per worker process); thread-safe; the records
(:class:`StateTransition`, :class:`EntityStatus`, :class:`BacklogPull`) are small and picklable so that they
travel back to the driver in the send outcome.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum

from spark_sb.clock import Clock, SystemClock
from spark_sb.errors import ErrorClass
from spark_sb.redact import redact

_LOGGER = logging.getLogger(__name__)


class EntityState(str, Enum):
    """Failover state of one primary entity."""

    HEALTHY = "healthy"
    FAILING = "failing"
    FAILED_OVER = "failed_over"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class StateTransition:
    """One state change of a primary entity; goes to the listener, the send outcome and the Delta event log."""

    entity: str
    from_state: EntityState
    to_state: EntityState
    at: datetime
    error_class: str | None = None
    detail: str = ""
    namespace: str | None = None


@dataclass(frozen=True)
class EntityStatus:
    """The current state of one entity (for the Delta current-state table, SPEC S4)."""

    namespace: str
    entity: str
    state: EntityState
    since: datetime
    first_failure: datetime | None = None
    last_error_class: str | None = None


@dataclass(frozen=True)
class BacklogPull:
    """A backlog queue pulled from the rotation until ``until`` (UTC)."""

    namespace: str
    queue: str
    at: datetime
    until: datetime
    error_class: str | None = None
    detail: str = ""


Listener = Callable[[StateTransition], None]


def log_transition(transition: StateTransition) -> None:
    """The default listener: WARNING when an entity leaves HEALTHY, INFO when it comes back."""
    level = logging.INFO if transition.to_state is EntityState.HEALTHY else logging.WARNING
    _LOGGER.log(
        level,
        "entity %r: %s -> %s (%s%s)",
        transition.entity,
        transition.from_state.value,
        transition.to_state.value,
        transition.error_class or "ok",
        f": {_safe(transition.detail)}" if transition.detail else "",
    )


def _safe(text: str) -> str:
    """Redact secrets from free text before it is logged or recorded."""
    return redact(text)


# ---------------------------------------------------------------------------------------------------------
# Pure decisions


def failover_due(first_failure: float, now: float, interval: float) -> bool:
    """True when ``interval`` seconds have passed since the first failure (0 -> at once)."""
    return now - first_failure >= interval


def probe_due(last_probe: float, now: float, interval: float) -> bool:
    """True when ``interval`` seconds have passed since the last probe (or since the failover)."""
    return now - last_probe >= interval


def backoff_delay(attempt: int, base: float, cap: float) -> float:
    """Exponential back-off before retry number ``attempt`` (1, 2, ...): ``base * 2**(attempt-1)``, capped.

    Never overflows (the exponent is clamped) and never negative.
    """
    if attempt < 1 or base <= 0 or cap <= 0:
        return 0.0
    return float(min(cap, base * (2.0 ** min(attempt - 1, 60))))


#: A healthy primary entity's attempt may run this much past ``failover_interval``: the failure it becomes is
#: then recorded from the attempt's start, so failover engages at once, within half a second of the interval.
FAILOVER_GRACE = 0.25

#: The shortest deadline of an attempt on a healthy primary entity that needs a new connection (when
#: ``failover_interval`` is shorter): the SDK's link-ready loop alone sleeps about 0.5 s, then SASL, CBS and attach
#: round trips. So with ``failover_interval`` below 1.25 s a primary that stalls a *new* connection is detected
#: after this long; on a connected link (the usual case: the sender was sending) the interval + grace holds, and
#: every other outage shape (refused, dropped, an error condition) fails over on its first failure anyway.
MIN_ATTEMPT_BUDGET = 1.5


def attempt_budget(
    send_timeout: float, failover_interval: float, failing_for: float | None, connected: bool = False
) -> float:
    """The deadline (seconds) of one attempt on a primary entity, so that failover engages on time (B3).

    ``failing_for``: seconds since the first failing attempt started (None while healthy). A healthy entity's
    attempt may take ``failover_interval`` + :data:`FAILOVER_GRACE` - at least :data:`MIN_ATTEMPT_BUDGET` unless
    ``connected`` (its link answered recently, so no new connection is needed); a failing entity's attempt only
    what is left of the interval - an attempt that has not succeeded by then is the failover. Never more than
    ``send_timeout``. Pure.
    """
    if failing_for is None:
        left = failover_interval + FAILOVER_GRACE
        if not connected:
            left = max(left, MIN_ATTEMPT_BUDGET)
    else:
        left = max(0.0, failover_interval - failing_for)
    return max(0.0, min(send_timeout, left))


def namespace_wide(error: ErrorClass, *, connection_answered: bool) -> bool:
    """True when a failure is evidence against the whole namespace, not only the entity it was met on (SPEC F1).

    A connection-class error (refused, dropped, DNS, a socket error, the connection closed by the service, the
    connection quota) is the namespace's. A timeout is the namespace's when the namespace's connection received
    nothing during the attempt (``connection_answered`` False: a stall before or after SASL, a silently dropped
    connection); when the connection kept answering (other links' answers, the service's heartbeats) only the
    entity stalled. Every other class (quota exceeded, entity disabled / not found, a service error on one entity,
    server busy) is the entity's. Pure.
    """
    if not error.fail_over:
        return False
    if error.name in NAMESPACE_CLASSES:
        return True
    if error.name == "timeout":
        return not connection_answered
    return False


#: The error classes that are always the namespace's fault (see :func:`namespace_wide`).
NAMESPACE_CLASSES = frozenset({"connection", "connection_quota"})


class Route(str, Enum):
    """Where a batch for an entity goes (:meth:`EntityFailover.admit`)."""

    PRIMARY = "primary"
    BACKLOG = "backlog"
    PROBE = "probe"


class Where(str, Enum):
    """What an attempt was: a send to the primary entity, a send to a backlog queue, a probe's cancel."""

    PRIMARY = "primary"
    BACKLOG = "backlog"
    PROBE = "probe"


class Verb(str, Enum):
    """What to do after a failed attempt (:func:`decide`)."""

    RETRY = "retry"  # the same target again, after ``delay``
    DIVERT = "divert"  # the primary entity is failed over: send the messages to the backlog
    SPLIT = "split"  # too large for the service: halve the batch and send the halves
    REJECT = "reject"  # a single message too large for the service: record it as rejected (B7)
    PULL = "pull"  # pull the backlog queue from the rotation and send the messages to another (B5)
    RAISE = "raise"  # stop: a configuration error, a budget exhausted, a probe given up


@dataclass(frozen=True)
class Decision:
    verb: Verb
    delay: float = 0.0
    why: str = ""


@dataclass(frozen=True)
class RetryPolicy:
    """The retry budgets of the attempt loop.

    ``backoff_base`` / ``backoff_cap``: exponential back-off between attempts (config ``retry.backoff_factor`` /
    ``retry.backoff_max``); ``busy_retries`` / ``busy_wait``: how long "server busy" is retried before the task
    fails (never a failover); ``busy_first`` / ``busy_cap``: its back-off, short and capped at a quarter of the
    service's one-second credit window, so that a throttled sender resumes within a quarter second of its credits
    coming back instead of sleeping through them - the throughput stays near the granted rate (SPEC L4; a few
    refused requests a second cost the namespace nothing); ``backlog_attempts`` / ``backlog_budget``: tries and seconds on one backlog queue
    before it is pulled; ``cancel_attempts``: tries of a probe's cancel.
    """

    backoff_base: float = 0.8
    backoff_cap: float = 120.0
    busy_retries: int = 1000
    busy_wait: float = 120.0
    busy_first: float = 0.05
    busy_cap: float = 0.25
    fixed: bool = False
    backlog_attempts: int = 2
    backlog_budget: float = 30.0
    cancel_attempts: int = 3


def decide(
    where: Where,
    error: ErrorClass,
    *,
    attempts: int,
    waited: float,
    state: EntityState,
    remaining: float | None,
    messages: int,
    policy: RetryPolicy,
) -> Decision:
    """What to do after attempt number ``attempts`` failed with ``error`` (pure; the whole retry policy).

    ``waited``: seconds since the first attempt on this target started; ``state``: the primary entity's state
    after the failure was recorded; ``remaining``: seconds left on its failover timer (None unless failing);
    ``messages``: how many messages the failed batch held.
    """

    def backoff(n: int) -> float:
        if policy.fixed:
            return min(policy.backoff_base, policy.backoff_cap) if n >= 1 else 0.0
        return backoff_delay(n, policy.backoff_base, policy.backoff_cap)

    if error.fail_batch:
        return Decision(Verb.RAISE, why="configuration error")
    if where is Where.PROBE:
        if error.name == "message_not_found":
            return Decision(Verb.RAISE, why="nothing to cancel")
        if attempts < policy.cancel_attempts:
            return Decision(Verb.RETRY, backoff(attempts))
        return Decision(Verb.RAISE, why="cancel attempts exhausted")
    if error.reject_message:
        return (
            Decision(Verb.SPLIT) if messages > 1 else Decision(Verb.REJECT, why="too large for the service")
        )
    if where is Where.BACKLOG:
        left = policy.backlog_budget - waited
        if error.retry and attempts < policy.backlog_attempts and left > 0:
            delay = min(backoff(attempts), left)
            return Decision(Verb.RETRY, delay)
        return Decision(Verb.PULL, why=error.name)
    if error.fail_over:
        if state is EntityState.FAILED_OVER:
            return Decision(Verb.DIVERT, why=error.name)
        # A connection-class error on a client that was fine: the rebuilt client is tried at once.
        delay = 0.0 if attempts == 1 and error.rebuild_client else backoff(attempts)
        if remaining is not None:
            delay = min(delay, remaining)
        return Decision(Verb.RETRY, delay)
    if error.retry:  # server busy, a client closed under us: never an outage
        if attempts > policy.busy_retries or waited >= policy.busy_wait:
            return Decision(Verb.RAISE, why="busy budget exhausted")
        if error.name == "server_busy":  # throttled: back off briefly, capped at about the throttling window
            delay = backoff_delay(attempts, policy.busy_first, policy.busy_cap)
            return Decision(Verb.RETRY, min(delay, policy.busy_wait - waited), why="throttled")
        return Decision(Verb.RETRY, backoff(attempts))
    return Decision(Verb.RAISE, why=f"unexpected {error.name}")


def choose_random(available: Sequence[str], rng: random.Random) -> str | None:
    """A backlog queue picked uniformly at random (None if none is available)."""
    if not available:
        return None
    return available[rng.randrange(len(available))]


def choose_session_affine(available: Sequence[str], session_id: str) -> str | None:
    """Rendezvous (highest-random-weight) hashing: the same session id maps to the same queue while that
    queue is available; when it is pulled only its sessions move."""
    if not available:
        return None

    def weight(queue: str) -> int:
        digest = hashlib.blake2b(f"{queue}\x00{session_id}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big")

    return max(available, key=lambda q: (weight(q), q))


# ---------------------------------------------------------------------------------------------------------
# Namespace-wide evidence (F1, F4)


class NamespaceHealth:
    """Whether one primary namespace is answering, shared by its entities' state machines (SPEC F1, F4).

    A namespace-wide fault (:func:`namespace_wide`) opens a *fault* that started when the failing attempt started:
    every entity of the namespace that the process sends to is FAILING from that moment (its failover timer
    starts then, whichever entity met the fault), so a batch that touches E entities has all of them diverted
    within ``failover_interval`` of the fault, not E times it. Any answer of the namespace (a send or a probe
    that succeeded on any entity) closes the fault. While the fault is open and the entities are failed over, the
    namespace is probed once per ``ping_primary_interval`` (:meth:`claim_probe`), not once per entity; once it
    answers, every failed-over entity's probe is due at once (:meth:`answered` returns True to say so).

    O(1) per call; one per primary namespace in a :class:`FailoverRegistry`. Thread-safe; never takes an entity's
    lock (entities take this one inside theirs).
    """

    def __init__(self, namespace: str, *, ping_interval: float, clock: Clock) -> None:
        self.namespace = namespace
        self.ping_interval = ping_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._since: float | None = None  # monotonic start of the open fault
        self._since_wall: datetime | None = None
        self._error_class: str | None = None
        self._detail = ""
        self._last_probe: float | None = None
        self._probing = False
        self.epoch = 0  # bumped when a fault opens: entities join each fault once
        self._entities: list[
            EntityFailover
        ] = []  # bounded like the registry's entities (see FailoverRegistry)

    def add(self, entity: EntityFailover) -> None:
        with self._lock:
            self._entities.append(entity)

    def entities(self) -> list[EntityFailover]:
        """The namespace's entities (a copy)."""
        with self._lock:
            return list(self._entities)

    def fault(self) -> tuple[float, datetime, str | None, str, int] | None:
        """The open fault: (monotonic start, wall start, error class, detail, epoch), or None."""
        with self._lock:
            if self._since is None:
                return None
            assert self._since_wall is not None
            return self._since, self._since_wall, self._error_class, self._detail, self.epoch

    @property
    def faulted(self) -> bool:
        return self._since is not None

    def record_fault(self, error_class: str, detail: str, started: float) -> bool:
        """A namespace-wide failure of an attempt that started at ``started`` (monotonic). True when this opened a
        new fault (the caller moves the namespace's other entities to FAILING)."""
        with self._lock:
            self._error_class = error_class
            self._detail = detail
            if self._since is not None:
                return False
            now = self._clock.monotonic()
            began = min(started, now)
            self._since = began
            self._since_wall = self._clock.now() - timedelta(seconds=now - began)
            self._last_probe = None
            self.epoch += 1
            return True

    def answered(self) -> bool:
        """The namespace answered (a send or a probe succeeded). True when that closed an open fault."""
        if self._since is None:  # the hot path: no lock while healthy
            return False
        with self._lock:
            if self._since is None:
                return False
            self._since = None
            self._since_wall = None
            self._last_probe = None
            self._probing = False
            return True

    def claim_probe(self) -> bool | None:
        """While a fault is open: True once per ``ping_primary_interval`` for the whole namespace (the caller
        probes one entity for the namespace), False otherwise. None when no fault is open (entities probe on their
        own schedule)."""
        with self._lock:
            if self._since is None:
                return None
            now = self._clock.monotonic()
            if self._probing:
                return False
            if self._last_probe is not None and not probe_due(self._last_probe, now, self.ping_interval):
                return False
            self._last_probe = now
            self._probing = True
            return True

    def probe_done(self) -> None:
        """The namespace probe claimed with :meth:`claim_probe` finished (whatever its result)."""
        with self._lock:
            self._probing = False

    def next_probe_in(self) -> float | None:
        """Seconds until the namespace's next probe is due while a fault is open (None otherwise)."""
        with self._lock:
            if self._since is None:
                return None
            if self._last_probe is None:
                return 0.0
            return max(0.0, self._last_probe + self.ping_interval - self._clock.monotonic())


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
            )

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
            out = [] if self._state is EntityState.HEALTHY else [self._back_to_healthy(detail)]
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
            if ok and self._state is not EntityState.HEALTHY:
                out.append(self._back_to_healthy(detail or "probe succeeded"))
            if not ok:
                self._last_error_class = error_class
        if self._health is not None:
            if shared:
                self._health.probe_done()
            if ok:
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
            detail=_safe(detail),
            namespace=self.namespace or None,
        )
        self._state = to
        self._since_wall = transition.at
        return transition


# ---------------------------------------------------------------------------------------------------------
# Backlog rotation


class BacklogRotation:
    """Which backlog queues are pulled from the rotation, shared by every sender of the process (B5).

    Keyed by (secondary namespace, queue). A pulled queue returns after its ``until`` (monotonic seconds) or
    when :meth:`mark_good` is called. Thread-safe.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._pulled: dict[tuple[str, str], tuple[float, BacklogPull]] = {}

    def pull(
        self, namespace: str, queue: str, until: float, error_class: str | None = None, detail: str = ""
    ) -> BacklogPull:
        """Pull ``queue`` until the monotonic time ``until``; returns the record."""
        now = self._clock.monotonic()
        wall = self._clock.now()
        record = BacklogPull(
            namespace=namespace,
            queue=queue,
            at=wall,
            until=wall + timedelta(seconds=max(0.0, until - now)),
            error_class=error_class,
            detail=_safe(detail),
        )
        with self._lock:
            self._pulled[(namespace, queue)] = (until, record)
        _LOGGER.warning(
            "backlog queue %r pulled from the rotation until %s (%s)",
            queue,
            record.until.isoformat(),
            error_class or "error",
        )
        return record

    def mark_good(self, namespace: str, queue: str) -> None:
        """Return ``queue`` to the rotation now."""
        with self._lock:
            self._pulled.pop((namespace, queue), None)

    def is_available(self, namespace: str, queue: str) -> bool:
        with self._lock:
            return self._available_locked(namespace, queue, self._clock.monotonic())

    def available(self, namespace: str, queues: Sequence[str]) -> list[str]:
        """The queues of ``queues`` in the rotation, in their given order."""
        now = self._clock.monotonic()
        with self._lock:
            return [q for q in queues if self._available_locked(namespace, q, now)]

    def pulled(self, namespace: str | None = None) -> list[BacklogPull]:
        """The currently pulled queues (expired pulls are dropped)."""
        now = self._clock.monotonic()
        with self._lock:
            for key in [k for k, (until, _) in self._pulled.items() if until <= now]:
                del self._pulled[key]
            return [rec for (ns, _), (_, rec) in self._pulled.items() if namespace is None or ns == namespace]

    def _available_locked(self, namespace: str, queue: str, now: float) -> bool:
        entry = self._pulled.get((namespace, queue))
        if entry is None:
            return True
        if entry[0] <= now:
            del self._pulled[(namespace, queue)]
            return True
        return False


class BacklogChooser:
    """The backlog queue choice of ONE sender (B4/B5): random and sticky per entity until the queue is pulled,
    or session-affine (same session id -> same queue while it is in the rotation). Not shared."""

    def __init__(
        self,
        queues: Sequence[str],
        rotation: BacklogRotation,
        namespace: str,
        *,
        selection: str = "random",
        rng: random.Random | None = None,
    ) -> None:
        if selection not in ("random", "session-affine"):
            raise ValueError(
                f"backlog_selection must be one of 'random', 'session-affine', not {selection!r}"
            )
        self.queues = list(queues)
        self.rotation = rotation
        self.namespace = namespace
        self.selection = selection
        self._rng = rng or random.Random()
        self._sticky: dict[str, str] = {}

    def choose(self, entity: str, session_id: str | None = None) -> str | None:
        """The queue to divert a message of ``entity`` to, or None when every queue is pulled. Called for every
        diverted message: the sticky choice is checked alone, the whole rotation only when it must change."""
        affine = self.selection == "session-affine" and session_id is not None
        current = None if affine else self._sticky.get(entity)
        if current is not None and self.rotation.is_available(self.namespace, current):
            return current
        available = self.rotation.available(self.namespace, self.queues)
        if not available:
            return None
        if affine:
            assert session_id is not None
            return choose_session_affine(available, session_id)
        chosen = choose_random(available, self._rng)
        assert chosen is not None
        self._sticky[entity] = chosen
        return chosen

    def available(self) -> list[str]:
        return self.rotation.available(self.namespace, self.queues)


# ---------------------------------------------------------------------------------------------------------
# The process-level registry


class FailoverRegistry:
    """Entity states and the backlog rotation shared by every sender of one process (B4, B5)."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or SystemClock()
        self.rotation = BacklogRotation(self.clock)
        self._lock = threading.Lock()
        # Bounded by the (namespace, entity) pairs this process sends to; one health per primary namespace.
        self._entities: dict[tuple[str, str], EntityFailover] = {}
        self._health: dict[str, NamespaceHealth] = {}

    def entity(
        self, namespace: str, entity: str, *, failover_interval: float, ping_interval: float
    ) -> EntityFailover:
        """The shared state of ``entity`` in the primary ``namespace`` (created HEALTHY on first use)."""
        key = (namespace, entity)
        with self._lock:
            found = self._entities.get(key)
            if found is None:
                health = self._health.get(namespace)
                if health is None:
                    health = self._health[namespace] = NamespaceHealth(
                        namespace, ping_interval=ping_interval, clock=self.clock
                    )
                found = EntityFailover(
                    entity,
                    failover_interval=failover_interval,
                    ping_interval=ping_interval,
                    clock=self.clock,
                    namespace=namespace,
                    health=health,
                )
                health.add(found)
                self._entities[key] = found
            return found

    def namespace(self, namespace: str) -> NamespaceHealth | None:
        """The namespace-wide evidence of the primary ``namespace`` (None before its first entity)."""
        with self._lock:
            return self._health.get(namespace)

    def statuses(self) -> list[EntityStatus]:
        with self._lock:
            entities = list(self._entities.values())
        return [e.status() for e in entities]

    def clear(self) -> None:
        with self._lock:
            self._entities.clear()
            self._health.clear()
        self.rotation = BacklogRotation(self.clock)


_PROCESS_REGISTRY: FailoverRegistry | None = None
_PROCESS_LOCK = threading.Lock()


def process_registry() -> FailoverRegistry:
    """The registry of this process (an executor's Python worker), created on first use with the system clock."""
    global _PROCESS_REGISTRY
    with _PROCESS_LOCK:
        if _PROCESS_REGISTRY is None:
            _PROCESS_REGISTRY = FailoverRegistry(SystemClock())
        return _PROCESS_REGISTRY
