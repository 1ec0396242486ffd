"""Namespace-wide failure evidence (SPEC F1, F4), with a fake clock: one namespace fault starts every entity's
failover timer, an entity fault stays the entity's, the namespace is probed once per interval, and once it
answers every failed-over entity's probe is due at once."""

from __future__ import annotations

import pytest

from servicebus_local.clock import FakeClock
from spark_sb.core.errors import (
    CONNECTION,
    CONNECTION_QUOTA,
    ENTITY_DISABLED,
    QUOTA_EXCEEDED,
    SERVER_BUSY,
    TIMEOUT,
)
from spark_sb.failover.decisions import namespace_wide
from spark_sb.failover.records import EntityState
from spark_sb.failover.registry import FailoverRegistry

H, F, FO = EntityState.HEALTHY, EntityState.FAILING, EntityState.FAILED_OVER
NS = "primary.example:5671"


def registry(n: int, interval: float = 2.0, ping: float = 1.0) -> tuple[FakeClock, FailoverRegistry, list]:
    clock = FakeClock()
    reg = FailoverRegistry(clock)
    entities = [reg.entity(NS, f"q{i}", failover_interval=interval, ping_interval=ping) for i in range(n)]
    return clock, reg, entities


def test_namespace_wide_is_a_pure_decision() -> None:
    assert namespace_wide(CONNECTION, connection_answered=True)
    assert namespace_wide(CONNECTION_QUOTA, connection_answered=False)
    assert namespace_wide(TIMEOUT, connection_answered=False)  # the connection said nothing: the namespace
    assert not namespace_wide(TIMEOUT, connection_answered=True)  # it kept answering: one entity stalled
    for entity_fault in (QUOTA_EXCEEDED, ENTITY_DISABLED, SERVER_BUSY):
        assert not namespace_wide(entity_fault, connection_answered=False)


def test_one_namespace_fault_starts_every_entitys_timer_from_the_failing_attempts_start() -> None:
    clock, _, entities = registry(1000)
    clock.advance(10.0)
    started = clock.monotonic()
    clock.advance(0.5)  # the failing attempt took half a second
    transitions = entities[0].record_failure(CONNECTION, "refused", started, namespace_wide=True)
    # every entity of the namespace is FAILING now, each from the attempt's start
    assert {e.state for e in entities} == {F}
    assert len([t for t in transitions if t.to_state is F]) == 1000
    assert all(t.at == transitions[0].at for t in transitions)
    assert all(e.time_until_failover() == pytest.approx(1.5) for e in entities)
    clock.advance(1.5)  # failover_interval after the fault's start: all of them fail over together
    assert all(e.admit()[0].value == "backlog" for e in entities)
    assert {e.state for e in entities} == {FO}


def test_an_entity_fault_stays_the_entitys() -> None:
    clock, _, entities = registry(10)
    entities[3].record_failure(QUOTA_EXCEEDED, "full", clock.monotonic(), namespace_wide=False)
    clock.advance(5.0)
    entities[3].check()
    assert entities[3].state is FO
    assert [e.state for i, e in enumerate(entities) if i != 3] == [H] * 9


def test_an_entity_first_used_during_a_namespace_fault_joins_it() -> None:
    clock, reg, entities = registry(1)
    started = clock.monotonic()
    entities[0].record_failure(CONNECTION, "dropped", started, namespace_wide=True)
    clock.advance(2.5)
    late = reg.entity(NS, "new", failover_interval=2.0, ping_interval=1.0)
    route, transitions = late.admit()
    assert route.value == "backlog"  # the fault began 2.5 s ago: no second wait for a new entity
    assert [t.to_state for t in transitions] == [F, FO]


def test_any_answer_of_the_namespace_closes_the_fault_and_releases_entities_failing_only_because_of_it() -> (
    None
):
    clock, reg, entities = registry(5)
    entities[0].record_failure(CONNECTION, "dropped", clock.monotonic(), namespace_wide=True)
    entities[1].record_failure(QUOTA_EXCEEDED, "its own fault", clock.monotonic())
    clock.advance(0.5)
    transitions = entities[2].record_success()
    health = reg.namespace(NS)
    assert health is not None and not health.faulted
    assert entities[2].state is H  # its send succeeded
    assert [entities[i].state for i in (0, 3, 4)] == [H, H, H]  # failing only because of the namespace
    assert entities[1].state is F  # its own fault stays
    assert {t.entity for t in transitions if t.to_state is H} == {"q0", "q2", "q3", "q4"}


def test_an_unreachable_namespace_is_probed_once_per_interval_not_once_per_entity() -> None:
    clock, _, entities = registry(1000, interval=0.0, ping=1.0)
    entities[0].record_failure(CONNECTION, "refused", clock.monotonic(), namespace_wide=True)
    for e in entities:
        e.check()
    assert {e.state for e in entities} == {FO}
    for second in range(1, 6):
        clock.advance(1.0)
        claims = [e for e in entities if e.claim_probe()]
        assert len(claims) == 1, f"second {second}: {len(claims)} probes"
        claims[0].record_probe(False, "connection", "refused", namespace_wide=True)


def test_once_the_namespace_answers_every_entity_it_failed_over_returns_with_one_probe() -> None:
    clock, _, entities = registry(1000, interval=0.0, ping=30.0)
    own = entities[999]
    own.record_failure(ENTITY_DISABLED, "disabled", clock.monotonic())  # failed over for a fault of its own
    entities[0].record_failure(CONNECTION, "refused", clock.monotonic(), namespace_wide=True)
    for e in entities:
        e.check()
    assert {e.state for e in entities} == {FO}
    clock.advance(30.0)
    (prober,) = [e for e in entities[:999] if e.claim_probe()]  # one probe for the namespace
    transitions = prober.record_probe(True, None, "ping probe succeeded")
    # the namespace answered: every entity it failed over is back, without a probe of its own
    assert {e.state for e in entities[:999]} == {H}
    assert len([t for t in transitions if t.to_state is H]) == 999
    # the entity failed over for its own fault stays failed over, and its probe is due at once
    assert own.state is FO and own.claim_probe()
    own.record_probe(False, "entity_disabled", "still disabled")
    assert own.state is FO


def test_a_failed_probe_with_a_namespace_fault_makes_the_namespace_probe_once_per_interval() -> None:
    """Entities failed over for faults of their own; then the namespace becomes unreachable: the probes' failures
    are namespace-wide evidence, so the next round is one probe for the namespace, not one per entity."""
    clock, _, entities = registry(50, interval=0.0, ping=1.0)
    for e in entities:
        e.record_failure(ENTITY_DISABLED, "disabled", clock.monotonic())
    assert {e.state for e in entities} == {FO}
    clock.advance(1.0)
    first_round = [e for e in entities if e.claim_probe()]
    assert len(first_round) == 50  # no namespace fault known yet: each entity probes on its own
    first_round[0].record_probe(False, "connection", "refused", namespace_wide=True)
    for e in first_round[1:]:
        e.record_probe(False, "connection", "refused", namespace_wide=True)
    clock.advance(1.0)
    assert len([e for e in entities if e.claim_probe()]) == 1
