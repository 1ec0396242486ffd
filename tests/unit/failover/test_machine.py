"""The failover state machine (spark_sb.failover.machine) and the pure decisions it and the backlog choice rest on,
tested with a fake clock (SPEC B3-B5, B8). The records, the registry and the rotation have their own files:
``test_records.py``, ``test_registry.py``, ``test_rotation.py``."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from servicebus_local.clock import FakeClock
from spark_sb.core.errors import CONNECTION, QUOTA_EXCEEDED
from spark_sb.failover.decisions import (
    backoff_delay,
    choose_random,
    choose_session_affine,
    failover_due,
    probe_due,
)
from spark_sb.failover.machine import EntityFailover
from spark_sb.failover.records import EntityState

H, F, FO = EntityState.HEALTHY, EntityState.FAILING, EntityState.FAILED_OVER


def machine(clock: FakeClock, interval: float = 60.0, ping: float = 30.0) -> EntityFailover:
    return EntityFailover(
        "orders", failover_interval=interval, ping_interval=ping, clock=clock, namespace="ns"
    )


# -- pure decisions


def test_failover_due_boundaries() -> None:
    assert not failover_due(100.0, 159.999, 60.0)
    assert failover_due(100.0, 160.0, 60.0)
    assert failover_due(100.0, 100.0, 0.0)


def test_probe_due_boundaries() -> None:
    assert not probe_due(10.0, 39.99, 30.0)
    assert probe_due(10.0, 40.0, 30.0)


def test_backoff_delay() -> None:
    assert [backoff_delay(i, 0.5, 3.0) for i in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff_delay(0, 0.5, 3.0) == 0.0
    assert backoff_delay(10_000, 0.5, 3.0) == 3.0  # no overflow


# -- the state machine at the exact boundaries


def test_first_failure_starts_timer_and_failover_exactly_at_interval() -> None:
    clock = FakeClock()
    m = machine(clock)
    t = m.record_failure(CONNECTION, "refused")
    assert [(x.from_state, x.to_state) for x in t] == [(H, F)]
    assert t[0].error_class == "connection" and t[0].at == clock.now() and t[0].entity == "orders"
    clock.advance(59.999)
    assert m.record_failure(CONNECTION) == [] and m.state is F
    assert m.check() == []
    assert m.time_until_failover() == pytest.approx(0.001)
    clock.advance(0.001)
    t = m.check()
    assert [(x.from_state, x.to_state) for x in t] == [(F, FO)]
    assert m.state is FO


def test_failure_after_interval_fails_over_in_the_same_call() -> None:
    clock = FakeClock()
    m = machine(clock)
    m.record_failure(QUOTA_EXCEEDED)
    clock.advance(60.0)
    t = m.record_failure(QUOTA_EXCEEDED)
    assert [(x.from_state, x.to_state) for x in t] == [(F, FO)]


def test_interval_zero_fails_over_on_first_failure() -> None:
    m = machine(FakeClock(), interval=0.0)
    t = m.record_failure(CONNECTION)
    assert [(x.from_state, x.to_state) for x in t] == [(H, F), (F, FO)]
    assert m.state is FO


def test_success_resets_the_timer() -> None:
    clock = FakeClock()
    m = machine(clock)
    m.record_failure(CONNECTION)
    clock.advance(59.0)
    t = m.record_success()
    assert [(x.from_state, x.to_state) for x in t] == [(F, H)]
    assert m.record_success() == []
    clock.advance(30.0)
    m.record_failure(CONNECTION)  # a new timer starts here
    clock.advance(59.0)
    assert m.check() == [] and m.state is F
    clock.advance(1.0)
    assert m.check() and m.state is FO


def test_probe_due_every_ping_interval_and_good_probe_heals() -> None:
    clock = FakeClock()
    m = machine(clock, interval=0.0, ping=30.0)
    assert not m.claim_probe()  # healthy: nothing to probe
    m.record_failure(CONNECTION)
    assert not m.claim_probe()  # first probe one ping interval after the failover
    clock.advance(29.999)
    assert not m.claim_probe()
    clock.advance(0.001)
    assert m.claim_probe()
    assert not m.claim_probe()  # claimed once per interval (shared by every sender)
    assert m.record_probe(False, "connection") == [] and m.state is FO
    clock.advance(30.0)
    assert m.next_probe_in() == 0.0
    assert m.claim_probe()
    t = m.record_probe(True)
    assert [(x.from_state, x.to_state) for x in t] == [(FO, H)]
    assert m.state is H and not m.claim_probe()


def test_restore_failed_over_from_state_table() -> None:
    clock = FakeClock()
    m = machine(clock)
    t = m.restore(FO)
    assert [(x.from_state, x.to_state) for x in t] == [(H, FO)] and m.state is FO
    status = m.status()
    assert status.state is FO and status.entity == "orders"


# -- the backlog choice (pure)


def test_choose_random_and_empty() -> None:
    assert choose_random([], random.Random(1)) is None
    counts = Counter(choose_random(["a", "b", "c"], random.Random(i)) for i in range(300))
    assert set(counts) == {"a", "b", "c"}


def test_session_affine_is_stable_and_moves_only_pulled_sessions() -> None:
    queues = [f"q{i}" for i in range(10)]
    sessions = [f"session-{i}" for i in range(200)]
    before = {s: choose_session_affine(queues, s) for s in sessions}
    assert before == {s: choose_session_affine(list(reversed(queues)), s) for s in sessions}
    assert len(set(before.values())) >= 8  # spread
    remaining = [q for q in queues if q != "q3"]
    after = {s: choose_session_affine(remaining, s) for s in sessions}
    for s in sessions:
        if before[s] != "q3":
            assert after[s] == before[s]
        else:
            assert after[s] != "q3"
    assert choose_session_affine([], "s") is None


def test_invalid_intervals() -> None:
    with pytest.raises(ValueError):
        machine(FakeClock(), interval=-1)
    with pytest.raises(ValueError):
        machine(FakeClock(), ping=0)
