"""Pure decisions of the failover state machine and the attempt loop (SPEC B3, B5, B8, F1): timers, back-off,
attempt budgets, whether a failure is evidence against the whole namespace, the decision table (:func:`decide`)
and the backlog choice. No state, no I/O, no clock: table-tested directly. Runs anywhere."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from spark_sb.core.errors import ErrorClass
from spark_sb.failover.records import EntityState


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
#: then recorded from the attempt's start, so failover engages at once. Any positive margin does that; all of it
#: is added to an outage's cost (one send() to 1,000 entities of a stalled namespace, failover_interval 2 s:
#: 2.49 s with 0.25 here, 2.24-2.29 s with 0.05; tools: bench/bench_fanout.py), so it is small. A short interval is bounded below by :data:`MIN_SEND_BUDGET`.
FAILOVER_GRACE = 0.05

#: The shortest deadline of an attempt on a healthy primary entity whose link is open (a short or zero
#: ``failover_interval``): a send of a full batch on an open link. ``failover_interval: 0`` means a send slower
#: than this fails over, so it is as long as B3 allows (failover within the interval + 0.5 s) less a margin: at
#: 0.25 s, 100 healthy entities sent to back to back on one connection (20 messages each, a local namespace on the
#: same 2 cores) had a send now and then pass it with nothing wrong - 135 entity sends diverted in 16 s, no sick
#: entity at all; at 0.45 s none (bench/bench_isolation.py --sick 0 --configs 0/60/5, issue 29).
MIN_SEND_BUDGET = 0.45

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
    attempt may take ``failover_interval`` + :data:`FAILOVER_GRACE` - at least :data:`MIN_SEND_BUDGET`, and at
    least :data:`MIN_ATTEMPT_BUDGET` unless ``connected`` (its link answered recently, so no new connection is
    needed); a failing entity's attempt only
    what is left of the interval - an attempt that has not succeeded by then is the failover. Never more than
    ``send_timeout``. Pure.
    """
    if failing_for is None:
        left = max(failover_interval + FAILOVER_GRACE, MIN_SEND_BUDGET)
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


#: The reject reason (and error class) of a message for a primary entity that does not exist and never did for this
#: sink: a typo in the ``entity`` column or option (SPEC F9).
WRONG_DESTINATION = "entity_not_found"


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
    known: bool = True,
) -> Decision:
    """What to do after attempt number ``attempts`` failed with ``error`` (pure; the whole retry policy).

    ``waited``: seconds since the first attempt on this target started; ``state``: the primary entity's state
    after the failure was recorded; ``remaining``: seconds left on its failover timer (None unless failing);
    ``messages``: how many messages the failed batch held; ``known``: the primary entity accepted a message for
    this sink before (SPEC F9: a not-found from an entity never seen to exist is a wrong destination - its
    messages are rejected with :data:`WRONG_DESTINATION` - not an outage).
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
    if where is Where.PRIMARY and error.name == WRONG_DESTINATION and not known:
        return Decision(Verb.REJECT, why=WRONG_DESTINATION)
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
