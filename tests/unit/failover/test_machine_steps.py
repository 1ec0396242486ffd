"""The failover state decides what follows a failed attempt (issue 30 item 3, SPEC B3, F1, F7, F9), on a fake clock:
:meth:`EntityFailover.next_attempt` (the attempt's deadline, or divert), :meth:`EntityFailover.failed` (record the
failure, give the decision) and :meth:`EntityFailover.probe_failed`, with the wire's evidence stubbed."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from servicebus_local.clock import FakeClock
from spark_sb.core.errors import (
    CONNECTION,
    ENTITY_DISABLED,
    ENTITY_NOT_FOUND,
    MESSAGE_TOO_LARGE,
    SERVER_BUSY,
    TIMEOUT,
    UNAUTHORIZED,
    ErrorClass,
)
from spark_sb.failover.decisions import MIN_SEND_BUDGET, RetryPolicy, Verb, Where
from spark_sb.failover.machine import EntityFailover, Step
from spark_sb.failover.records import EntityState
from spark_sb.failover.registry import FailoverRegistry

NS = "primary.example:5671"
POLICY = RetryPolicy(backoff_base=0.8, backoff_cap=120.0)
H, F, FO = EntityState.HEALTHY, EntityState.FAILING, EntityState.FAILED_OVER


@dataclass
class Seen:
    """The wire's evidence about one failed call; counts how often the state asked."""

    wide: bool = False
    heard: bool = False
    asked_wide: int = 0
    asked_heard: int = 0

    def namespace_wide(self) -> bool:
        self.asked_wide += 1
        return self.wide

    def answered(self) -> bool:
        self.asked_heard += 1
        return self.heard


def _entities(interval: float, *names: str) -> tuple[FakeClock, list[EntityFailover]]:
    clock = FakeClock()
    registry = FailoverRegistry(clock)
    return clock, [registry.entity(NS, n, failover_interval=interval, ping_interval=5.0) for n in names]


def _fail(
    state: EntityFailover,
    error: ErrorClass,
    clock: FakeClock,
    seen: Seen | None = None,
    *,
    attempts: int = 1,
    where: Where = Where.PRIMARY,
    messages: int = 10,
) -> Step:
    state.record_success()  # an entity that accepted messages before (not a wrong destination)
    return _fail_as_is(state, error, clock, seen or Seen(), attempts=attempts, where=where, messages=messages)


def _fail_as_is(
    state: EntityFailover,
    error: ErrorClass,
    clock: FakeClock,
    seen: Seen,
    *,
    attempts: int = 1,
    where: Where = Where.PRIMARY,
    messages: int = 10,
) -> Step:
    started = clock.monotonic()
    clock.advance(0.2)  # the attempt took 0.2 s
    return state.failed(
        where, error, "detail", started, seen, attempts=attempts, waited=0.2, messages=messages, policy=POLICY
    )


def test_an_outage_error_starts_the_timer_and_says_retry_within_what_is_left_of_the_interval() -> None:
    clock, (a,) = _entities(1.0, "a")
    step = _fail(a, TIMEOUT, clock, attempts=2)
    assert a.state is F and step.began_failing
    assert [t.to_state for t in step.transitions] == [F]
    assert step.decision.verb is Verb.RETRY
    # back-off of the 2nd attempt (1.6 s) is cut to what is left of the 1 s interval, from the attempt's start
    assert step.decision.delay == pytest.approx(0.8)
    again = _fail_as_is(a, TIMEOUT, clock, Seen(), attempts=3)
    assert not again.began_failing and again.decision.verb is Verb.RETRY


def test_interval_zero_fails_over_on_the_first_outage_error_and_says_divert() -> None:
    clock, (a,) = _entities(0.0, "a")
    step = _fail(a, ENTITY_DISABLED, clock)
    assert a.state is FO
    assert [t.to_state for t in step.transitions] == [F, FO]
    assert step.decision.verb is Verb.DIVERT


def test_next_attempt_gives_what_is_left_of_the_interval_then_none_once_the_timer_ran_out() -> None:
    clock, (a,) = _entities(10.0, "a")
    budget, transitions = a.next_attempt(30.0)
    assert transitions == [] and budget is not None and 10.0 <= budget <= 10.5  # healthy: the interval, about
    _fail(a, TIMEOUT, clock)
    clock.advance(4.0)
    budget, transitions = a.next_attempt(30.0)
    assert transitions == [] and budget is not None and budget == pytest.approx(10.0 - 4.2, abs=0.3)
    clock.advance(6.0)
    budget, transitions = a.next_attempt(30.0)
    assert budget is None  # failed over by now: divert instead of trying
    assert [t.to_state for t in transitions] == [FO]


def test_a_failing_entity_with_too_little_left_for_an_attempt_waits_the_interval_out_and_fails_over() -> None:
    """An attempt shorter than MIN_SEND_BUDGET would end at the lane's deadline, not the SDK's own timeout, and
    that abandons the namespace's shared connection (seen under load: 0.03 s left after a slow first attempt). No
    attempt: the clock waits out the interval - not a moment before it - and the entity is failed over."""
    clock, (a,) = _entities(10.0, "a")
    failing_since = clock.monotonic()  # the failing attempt's start: the timer's
    _fail(a, TIMEOUT, clock)  # took 0.2 s
    clock.advance(10.0 - 0.2 - MIN_SEND_BUDGET / 2)
    budget, transitions = a.next_attempt(30.0)
    assert budget is None and [t.to_state for t in transitions] == [FO]
    assert clock.monotonic() - failing_since == pytest.approx(10.0)  # on time: waited the rest, not earlier


def test_a_failing_entity_with_enough_left_still_gets_its_attempt() -> None:
    clock, (a,) = _entities(10.0, "a")
    _fail(a, TIMEOUT, clock)  # took 0.2 s
    clock.advance(10.0 - 0.2 - 2 * MIN_SEND_BUDGET)
    before = clock.monotonic()
    budget, transitions = a.next_attempt(30.0)
    assert transitions == [] and budget == pytest.approx(2 * MIN_SEND_BUDGET, abs=1e-6)
    assert clock.monotonic() == before  # no wait


def test_a_not_found_from_an_entity_that_never_accepted_a_message_is_a_wrong_destination() -> None:
    clock, (a,) = _entities(0.0, "typo")
    seen = Seen(wide=True)
    step = _fail_as_is(a, ENTITY_NOT_FOUND, clock, seen)
    assert step.decision.verb is Verb.REJECT and step.decision.why == "entity_not_found"
    assert a.state is H and step.transitions == []
    assert seen.asked_wide == 0  # never evidence against anything
    # the same error from an entity that accepted messages before is an outage (a deleted queue, SPEC F9)
    step = _fail(a, ENTITY_NOT_FOUND, clock)
    assert step.decision.verb is Verb.DIVERT and a.state is FO


@pytest.mark.parametrize("error", [UNAUTHORIZED, MESSAGE_TOO_LARGE, SERVER_BUSY])
def test_errors_that_are_not_outages_leave_the_state_alone(error: ErrorClass) -> None:
    clock, (a,) = _entities(0.0, "a")
    seen = Seen(wide=True)
    step = _fail(a, error, clock, seen, messages=1)
    assert a.state is H and seen.asked_wide == 0
    expected = {UNAUTHORIZED: Verb.RAISE, MESSAGE_TOO_LARGE: Verb.REJECT, SERVER_BUSY: Verb.RETRY}[error]
    assert step.decision.verb is expected


def test_namespace_wide_evidence_starts_every_entity_of_the_namespace() -> None:
    clock, (a, b, c) = _entities(1.0, "a", "b", "c")
    for e in (b, c):
        e.record_success()
    step = _fail(a, CONNECTION, clock, Seen(wide=True))
    assert step.decision.verb is Verb.RETRY
    clock.advance(1.0)
    b_budget, b_transitions = b.next_attempt(30.0)
    assert b_budget is None and b.state is FO  # b's timer ran from a's failing attempt
    assert [t.to_state for t in b_transitions] == [F, FO] or [t.to_state for t in b_transitions] == [FO]


def test_one_entitys_failure_that_the_namespace_answered_closes_an_open_namespace_fault() -> None:
    clock, (a, b) = _entities(0.0, "a", "b")
    for e in (a, b):
        e.record_success()
    _fail(a, CONNECTION, clock, Seen(wide=True))
    health = a.health
    assert health is not None and health.faulted
    seen = Seen(wide=False, heard=True)
    step = _fail_as_is(b, ENTITY_DISABLED, clock, seen)  # the service said: b is disabled
    assert seen.asked_heard == 1
    assert not health.faulted
    assert step.decision.verb is Verb.DIVERT and b.state is FO


def test_a_failure_that_is_the_namespaces_never_counts_as_its_answer() -> None:
    clock, (a,) = _entities(1.0, "a")
    seen = Seen(wide=True, heard=True)
    _fail(a, CONNECTION, clock, seen)
    assert seen.asked_heard == 0
    assert a.health is not None and a.health.faulted


def test_a_failed_probe_follows_the_same_rule() -> None:
    clock, (a, b) = _entities(0.0, "a", "b")
    for e in (a, b):
        _fail(e, ENTITY_DISABLED, clock)
        assert e.state is FO
    clock.advance(5.0)  # ping_primary_interval: a probe is due
    assert a.claim_probe()
    a.probe_failed(CONNECTION, "refused", Seen(wide=True))
    assert a.health is not None and a.health.faulted and a.state is FO
    clock.advance(5.0)
    assert b.claim_probe()
    b.probe_failed(ENTITY_DISABLED, "disabled", Seen(wide=False, heard=True))
    assert not a.health.faulted and b.state is FO
