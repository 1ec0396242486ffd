"""The retry/failover policy as pure functions, tested as tables (SPEC B3, B5, B7, B8): ``decide``,
``attempt_budget`` and ``EntityFailover.admit`` with a fake clock."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from servicebus_local.clock import FakeClock
from spark_sb.core.errors import (
    CLIENT_CLOSED,
    CONNECTION,
    ENTITY_DISABLED,
    ENTITY_NOT_FOUND,
    INVALID_REQUEST,
    MESSAGE_NOT_FOUND,
    MESSAGE_TOO_LARGE,
    QUOTA_EXCEEDED,
    SERVER_BUSY,
    SERVICE_ERROR,
    TIMEOUT,
    UNAUTHORIZED,
    UNEXPECTED,
    ErrorClass,
)
from spark_sb.failover.decisions import (
    FAILOVER_GRACE,
    MIN_ATTEMPT_BUDGET,
    MIN_SEND_BUDGET,
    Decision,
    RetryPolicy,
    Route,
    Verb,
    Where,
    attempt_budget,
    decide,
)
from spark_sb.failover.machine import EntityFailover
from spark_sb.failover.records import EntityState

H, F, FO = EntityState.HEALTHY, EntityState.FAILING, EntityState.FAILED_OVER
P, B, PR = Where.PRIMARY, Where.BACKLOG, Where.PROBE
POLICY = RetryPolicy(
    backoff_base=1.0,
    backoff_cap=8.0,
    busy_retries=3,
    busy_wait=10.0,
    busy_first=0.05,
    busy_cap=0.25,
    backlog_attempts=2,
    backlog_budget=30.0,
)

# (where, error, attempts, waited, state after the failure was recorded, seconds left on the timer, messages)
#   -> (verb, delay)
TABLE: list[tuple[Where, ErrorClass, int, float, EntityState, float | None, int, Verb, float]] = [
    # primary: an outage keeps retrying while the timer runs, the rebuilt client at once, then backing off
    (P, CONNECTION, 1, 0.0, F, 60.0, 10, Verb.RETRY, 0.0),
    (P, CONNECTION, 2, 1.0, F, 59.0, 10, Verb.RETRY, 2.0),
    (P, CONNECTION, 5, 20.0, F, 40.0, 10, Verb.RETRY, 8.0),  # capped
    (P, CONNECTION, 5, 58.5, F, 1.5, 10, Verb.RETRY, 1.5),  # never sleeps past the failover
    (P, TIMEOUT, 1, 0.0, F, 0.5, 10, Verb.RETRY, 0.0),
    (P, QUOTA_EXCEEDED, 1, 0.0, F, 60.0, 10, Verb.RETRY, 1.0),  # not a client fault: backs off at once
    (P, ENTITY_DISABLED, 2, 3.0, F, 57.0, 10, Verb.RETRY, 2.0),
    (P, SERVICE_ERROR, 3, 3.0, F, 57.0, 10, Verb.RETRY, 4.0),
    # ... and diverts once the timer says so (interval 0: the first failure)
    (P, CONNECTION, 1, 0.0, FO, None, 10, Verb.DIVERT, 0.0),
    (P, ENTITY_NOT_FOUND, 1, 0.0, FO, None, 10, Verb.DIVERT, 0.0),
    (P, QUOTA_EXCEEDED, 7, 60.0, FO, None, 10, Verb.DIVERT, 0.0),
    # primary: throttling is never an outage; retried within its budget, then the task fails
    # throttled: a short back-off that doubles up to a quarter of the credit window, never past busy_wait
    (P, SERVER_BUSY, 1, 0.0, H, None, 10, Verb.RETRY, 0.05),
    (P, SERVER_BUSY, 3, 7.0, H, None, 10, Verb.RETRY, 0.2),
    (P, SERVER_BUSY, 3, 9.9, H, None, 10, Verb.RETRY, 0.1),
    (P, SERVER_BUSY, 4, 7.0, H, None, 10, Verb.RAISE, 0.0),  # more than busy_retries
    (P, SERVER_BUSY, 2, 10.0, H, None, 10, Verb.RAISE, 0.0),  # busy_wait spent
    (P, CLIENT_CLOSED, 1, 0.0, H, None, 10, Verb.RETRY, 1.0),
    # primary: configuration errors raise, never divert
    (P, UNAUTHORIZED, 1, 0.0, H, None, 10, Verb.RAISE, 0.0),
    (P, INVALID_REQUEST, 1, 0.0, H, None, 10, Verb.RAISE, 0.0),
    (P, UNEXPECTED, 1, 0.0, H, None, 10, Verb.RAISE, 0.0),
    # too large for the service: halve, then reject the single message (B7)
    (P, MESSAGE_TOO_LARGE, 1, 0.0, H, None, 10, Verb.SPLIT, 0.0),
    (P, MESSAGE_TOO_LARGE, 1, 0.0, H, None, 1, Verb.REJECT, 0.0),
    (B, MESSAGE_TOO_LARGE, 1, 0.0, H, None, 2, Verb.SPLIT, 0.0),
    (B, MESSAGE_TOO_LARGE, 1, 0.0, H, None, 1, Verb.REJECT, 0.0),
    # backlog: a transient error is retried on the same queue within its budget, then the queue is pulled (B5)
    (B, CONNECTION, 1, 0.0, H, None, 10, Verb.RETRY, 1.0),
    (B, TIMEOUT, 1, 29.5, H, None, 10, Verb.RETRY, 0.5),  # never past the budget
    (B, TIMEOUT, 1, 30.0, H, None, 10, Verb.PULL, 0.0),  # budget spent
    (B, CONNECTION, 2, 1.0, H, None, 10, Verb.PULL, 0.0),  # attempts spent
    (B, SERVER_BUSY, 2, 1.0, H, None, 10, Verb.PULL, 0.0),
    (B, ENTITY_DISABLED, 1, 0.0, H, None, 10, Verb.PULL, 0.0),  # not transient: pulled at once
    (B, QUOTA_EXCEEDED, 1, 0.0, H, None, 10, Verb.PULL, 0.0),
    (B, UNAUTHORIZED, 1, 0.0, H, None, 10, Verb.RAISE, 0.0),
    # a probe's cancel: retried, given up after cancel_attempts; nothing to cancel stops at once
    (PR, CONNECTION, 1, 0.0, FO, None, 1, Verb.RETRY, 1.0),
    (PR, TIMEOUT, 2, 1.0, FO, None, 1, Verb.RETRY, 2.0),
    (PR, CONNECTION, 3, 3.0, FO, None, 1, Verb.RAISE, 0.0),
    (PR, MESSAGE_NOT_FOUND, 1, 0.0, FO, None, 1, Verb.RAISE, 0.0),
    (PR, UNAUTHORIZED, 1, 0.0, FO, None, 1, Verb.RAISE, 0.0),
]


@pytest.mark.parametrize(
    ("where", "error", "attempts", "waited", "state", "remaining", "messages", "verb", "delay"),
    TABLE,
    ids=[f"{r[0].value}-{r[1].name}-{r[2]}-{r[4].value}-{r[7].value}" for r in TABLE],
)
def test_decide(
    where: Where,
    error: ErrorClass,
    attempts: int,
    waited: float,
    state: EntityState,
    remaining: float | None,
    messages: int,
    verb: Verb,
    delay: float,
) -> None:
    got = decide(
        where,
        error,
        attempts=attempts,
        waited=waited,
        state=state,
        remaining=remaining,
        messages=messages,
        policy=POLICY,
    )
    assert (got.verb, got.delay) == (verb, pytest.approx(delay))


def test_decide_is_pure() -> None:
    args = dict(attempts=2, waited=1.0, state=F, remaining=5.0, messages=3, policy=POLICY)
    assert decide(P, CONNECTION, **args) == decide(P, CONNECTION, **args) == Decision(Verb.RETRY, 2.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("send_timeout", "interval", "failing_for", "connected", "budget"),
    [
        (30.0, 60.0, None, False, 30.0),  # healthy: send_timeout bounds it
        (30.0, 2.0, None, False, 2.0 + FAILOVER_GRACE),  # healthy: the interval (+ grace) bounds it
        (30.0, 0.0, None, False, MIN_ATTEMPT_BUDGET),  # long enough for a new connection
        (30.0, 0.0, None, True, MIN_SEND_BUDGET),  # a connected link needs no new connection, but a send
        (30.0, 0.1, None, True, MIN_SEND_BUDGET),
        (30.0, 0.5, None, True, 0.5 + FAILOVER_GRACE),
        (30.0, 2.0, None, True, 2.0 + FAILOVER_GRACE),
        (1.0, 0.0, None, False, 1.0),  # never more than send_timeout
        (30.0, 60.0, 45.0, False, 15.0),  # failing: what is left of the interval
        (10.0, 60.0, 45.0, True, 10.0),
        (30.0, 2.0, 2.0, False, 0.0),  # the interval has passed: nothing left
        (30.0, 2.0, 3.0, True, 0.0),
    ],
)
def test_attempt_budget(
    send_timeout: float, interval: float, failing_for: float | None, connected: bool, budget: float
) -> None:
    assert attempt_budget(send_timeout, interval, failing_for, connected) == pytest.approx(budget)


def test_a_stalled_attempt_fails_over_within_the_grace_whatever_send_timeout() -> None:
    """The worst case of B3: the first failing attempt hangs until its deadline. Failover engages at the
    attempt's start + interval + grace at the latest, whatever send_timeout is."""
    for send_timeout in (1.0, 5.0, 30.0, 300.0):
        for interval in (0.0, 1.0, 2.0, 10.0, 60.0):
            clock = FakeClock()
            state = EntityFailover("q", failover_interval=interval, ping_interval=60.0, clock=clock)
            started = clock.monotonic()
            while state.state is not FO:
                budget = state.attempt_budget(send_timeout)
                clock.advance(budget)  # the attempt hangs to its deadline
                state.record_failure(TIMEOUT, "stalled", started if state.state is H else None)
                state.check()
                assert (
                    clock.monotonic() - started <= max(interval + FAILOVER_GRACE, MIN_ATTEMPT_BUDGET) + 1e-9
                )
                assert (
                    FAILOVER_GRACE <= 0.1
                )  # an outage's cost past the interval stays small (SPEC F1: +0.5 s)
            assert clock.monotonic() - started >= min(interval, send_timeout) - 1e-9


def test_admit_routes_and_claims_one_probe_per_interval() -> None:
    clock = FakeClock()
    state = EntityFailover("q", failover_interval=10.0, ping_interval=5.0, clock=clock)
    assert state.admit() == (Route.PRIMARY, [])
    state.record_failure(CONNECTION, "refused", clock.monotonic())
    assert state.admit()[0] is Route.PRIMARY  # failing: keep trying the primary
    clock.advance(10.0)
    route, transitions = state.admit()  # the timer applies on admission
    assert route is Route.BACKLOG and [(t.from_state, t.to_state) for t in transitions] == [(F, FO)]
    clock.advance(4.9)
    assert state.admit()[0] is Route.BACKLOG
    clock.advance(0.1)
    assert state.admit()[0] is Route.PROBE  # claimed by this caller
    clock.advance(60.0)
    assert state.admit()[0] is Route.BACKLOG  # never a second probe while one is in flight
    assert state.claim_probe() is False
    state.record_probe(False, "connection", "still down")
    assert state.admit()[0] is Route.PROBE  # overdue: at once
    state.record_probe(True)
    assert state.admit() == (Route.PRIMARY, [])


def test_the_timer_starts_when_the_first_failing_attempt_started() -> None:
    clock = FakeClock()
    state = EntityFailover("q", failover_interval=10.0, ping_interval=5.0, clock=clock)
    started = clock.monotonic()
    clock.advance(4.0)  # the attempt took 4 s to fail
    (failing,) = state.record_failure(TIMEOUT, "slow", started)
    assert failing.at == clock.now() - timedelta(seconds=4)
    assert state.time_until_failover() == pytest.approx(6.0)
    clock.advance(6.0)
    assert state.admit()[0] is Route.BACKLOG


def test_fixed_mode_backs_off_by_the_same_step_every_time() -> None:
    """retry.mode: fixed - every back-off is backoff_factor (capped by backoff_max), never doubling; throttling
    keeps its own short back-off."""
    fixed = replace(POLICY, fixed=True)
    for attempts in (1, 2, 5):
        got = decide(
            P, CONNECTION, attempts=attempts, waited=1.0, state=F, remaining=60.0, messages=1, policy=fixed
        )
        assert got == Decision(Verb.RETRY, 1.0) if attempts > 1 else got.delay == 0.0
    backlog = decide(B, CONNECTION, attempts=1, waited=0.0, state=H, remaining=None, messages=1, policy=fixed)
    assert backlog.delay == 1.0
    busy = decide(P, SERVER_BUSY, attempts=3, waited=1.0, state=H, remaining=None, messages=1, policy=fixed)
    assert busy.delay == pytest.approx(0.2)
