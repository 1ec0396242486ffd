"""Namespace verdicts from namespace facts (issue 29, SPEC F6, F7), on a fake clock with the fake transport: one
entity's timeout is never a namespace fault; several entities timing out with nothing heard is; any sign that the
namespace answers ends a fault; closing is evidence of nothing; probes carry a session id so that session entities
accept them. (The prober's own rules - rotation, a refused probe, a probe after close - are in test_prober.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from azure.servicebus import exceptions as sbe

from servicebus_local.clock import FakeClock
from spark_sb.core.errors import CONNECTION, TIMEOUT, LaneClosed, classify
from spark_sb.failover.records import EntityState
from spark_sb.failover.registry import FailoverRegistry
from spark_sb.message.backlog import PROBE_SESSION, PROBE_SESSION_PREFIX, is_probe, probe_message
from spark_sb.message.outbound import OutboundMessage
from spark_sb.sender.attempts import WireEvidence
from spark_sb.wire.parking import Parked
from spark_sb.wire.timing import NAMESPACE_SILENCE, PARK_AFTER, PARK_SOON
from spark_sb.wire.transport import PRIMARY, Target
from tests.unit.fakes import FakeTransport
from tests.unit.sender.rig import Rig, msgs

H, F, FO = EntityState.HEALTHY, EntityState.FAILING, EntityState.FAILED_OVER
NS = "primary.example:5671"


def conn_error() -> BaseException:
    return sbe.ServiceBusConnectionError(message="connection refused")


# ---------------------------------------------------------------------------------------------------------
# Session probes (item 0)


def test_every_probe_carries_a_session_id_and_is_recognised_by_it() -> None:
    ping = probe_message("q", "ping")
    scheduled = probe_message("q", "schedule-cancel")
    assert ping.session_id == PROBE_SESSION  # every ping probe goes to the one probe session
    assert scheduled.session_id is not None and scheduled.session_id.startswith(PROBE_SESSION_PREFIX)
    assert scheduled.session_id != probe_message("q").session_id  # a session of its own, each time
    assert len(scheduled.session_id) <= 128  # the service's limit on a session id
    # a message of the probe session is a probe even without the other marks
    assert is_probe(OutboundMessage(body=b"x", session_id=PROBE_SESSION))
    assert not is_probe(OutboundMessage(body=b"x", session_id="orders-1"))


# ---------------------------------------------------------------------------------------------------------
# One entity's timeout (F6, F7)


@pytest.mark.parametrize("interval", [0.0, 1.0, 10.0])
def test_one_entitys_timeout_on_a_live_connection_never_faults_the_namespace(interval: float) -> None:
    rig = Rig(failover_interval=interval, ping_primary_interval=2.0, send_timeout=5.0)
    rig.transport.stall(namespace=PRIMARY, entity="a")  # the connection keeps answering (heartbeats)
    for n in range(3):
        rig.sender.send(msgs(1, f"a{n}", entity="a"))
    assert rig.sender.entity_state("a") is FO
    health = rig.registry.namespace(rig.sender._primary_key)
    assert health is not None and not health.faulted
    out = rig.sender.send(msgs(5, "b", entity="b"))
    assert out.sent == {"b": 5} and out.total_diverted == 0
    assert rig.sender.entity_state("b") is H


def _wide(clock: FakeClock, transport: Any, target: Target, started: float, state: Any) -> bool:
    """The namespace verdict on a timeout of ``target`` that started at ``started``, given what ``transport`` heard."""
    return WireEvidence(TIMEOUT, target, started, state, transport, clock).namespace_wide()


class Heard:
    """A transport stub whose namespace was last heard at ``heard`` (the fake clock's monotonic time)."""

    def __init__(self, clock: FakeClock, heard: float | None) -> None:
        self.clock = clock
        self.heard = heard

    def answered_within(self, target: Target, seconds: float) -> bool:
        return self.heard is not None and self.clock.monotonic() - self.heard <= seconds


def test_several_entities_timing_out_with_nothing_heard_since_the_first_is_a_namespace_fault() -> None:
    clock = FakeClock()
    registry = FailoverRegistry(clock)
    heard = Heard(clock, clock.monotonic() - 0.1)  # the last heartbeat, just before the first attempt
    states = [registry.entity(NS, e, failover_interval=0.0, ping_interval=1.0) for e in "abc"]
    verdicts = []
    for (
        state
    ) in states:  # three short attempts in a row, 0.3 s each: silence 0.3, 0.6, 0.9 s (< NAMESPACE_SILENCE)
        started = clock.monotonic()
        clock.advance(0.3)
        verdicts.append(_wide(clock, heard, Target(PRIMARY, state.entity), started, state))
    assert clock.monotonic() - heard.heard < NAMESPACE_SILENCE  # the heartbeat rule alone could not tell
    assert verdicts == [False, False, True]


def test_several_entities_timing_out_on_a_connection_heard_meanwhile_stay_each_entitys() -> None:
    clock = FakeClock()
    registry = FailoverRegistry(clock)
    heard = Heard(clock, clock.monotonic())
    verdicts = []
    for entity in "abcdefg":
        state = registry.entity(NS, entity, failover_interval=0.0, ping_interval=1.0)
        started = clock.monotonic()
        clock.advance(0.3)
        heard.heard = clock.monotonic() - 0.1  # a heartbeat came during each attempt
        verdicts.append(_wide(clock, heard, Target(PRIMARY, entity), started, state))
    assert verdicts == [False] * 7


def test_probes_timing_out_together_on_the_isolated_connection_are_no_namespace_fault_if_it_answered_meanwhile() -> (
    None
):
    """Ten stalled, failed-over entities probed together on the isolated connection (which carries nothing but
    their probes, so it hears nothing) all time out at once, while the healthy entities' sends on the other
    connection succeeded during those probes: not several entities failing "with no success in between" (F7).
    Before the fix the ten timeouts made a namespace fault and every healthy entity was diverted at interval 0."""
    clock = FakeClock()
    registry = FailoverRegistry(clock)
    # the probes' connection: never heard (its only traffic is the stalled entities' probes)
    isolated = Heard(clock, None)
    healthy = registry.entity(NS, "healthy", failover_interval=0.0, ping_interval=1.0)
    stalled = [registry.entity(NS, f"s{i}", failover_interval=0.0, ping_interval=1.0) for i in range(10)]
    started = clock.monotonic()  # the probes start together
    for _ in range(5):  # healthy sends succeed while they wait
        clock.advance(0.3)
        healthy.record_success()
    verdicts = [_wide(clock, isolated, Target(PRIMARY, s.entity), started, s) for s in stalled]
    assert verdicts == [False] * 10
    health = registry.namespace(NS)
    assert health is not None and not health.faulted
    # the same ten timeouts with no answer anywhere since they started are the namespace's
    started = clock.monotonic()
    clock.advance(1.5)
    verdicts = [_wide(clock, isolated, Target(PRIMARY, s.entity), started, s) for s in stalled]
    assert True in verdicts


def test_a_connection_silent_past_its_heartbeat_makes_one_timeout_the_namespaces() -> None:
    clock = FakeClock()
    registry = FailoverRegistry(clock)
    heard = Heard(clock, clock.monotonic())
    state = registry.entity(NS, "a", failover_interval=2.0, ping_interval=1.0)
    started = clock.monotonic()
    clock.advance(NAMESPACE_SILENCE + 0.1)
    assert _wide(clock, heard, Target(PRIMARY, "a"), started, state)
    assert _wide(clock, Heard(clock, None), Target(PRIMARY, "a"), started, state)


# ---------------------------------------------------------------------------------------------------------
# The end of a namespace fault (F7)


def test_a_service_error_or_a_live_connection_ends_an_open_namespace_fault() -> None:
    rig = Rig(failover_interval=10.0, ping_primary_interval=2.0, send_timeout=5.0)
    rig.transport.fail(conn_error, namespace=PRIMARY, count=1)
    rig.sender.send(msgs(1, "x", entity="x"))  # a connection error: the namespace's fault opens...
    health = rig.registry.namespace(rig.sender._primary_key)
    assert health is not None
    # (the retry succeeded and closed it; open it again as evidence would)
    rig.registry.entity(
        rig.sender._primary_key, "x", failover_interval=10.0, ping_interval=2.0
    ).record_failure(CONNECTION, "refused", rig.clock.monotonic(), namespace_wide=True)
    assert health.faulted
    # an entity that stalls on a connection that keeps answering: the namespace answers
    rig.transport.stall(namespace=PRIMARY, entity="a", count=1)
    rig.sender.send(msgs(1, "a", entity="a"))
    assert not health.faulted
    assert rig.sender.entity_state("x") is H  # it was failing only because of the namespace


# ---------------------------------------------------------------------------------------------------------
# Closing is evidence of nothing (F7)


def test_lane_closed_is_a_closed_client_not_a_connection_fault() -> None:
    cls = classify(LaneClosed("the lane's worker was retired before the call started"))
    assert cls.name == "client_closed" and not cls.fail_over


def test_a_calls_last_batches_of_healthy_entities_go_before_those_of_a_failing_entity() -> None:
    rig = Rig(failover_interval=10.0, ping_primary_interval=5.0, send_timeout=5.0)
    rig.transport.stall(namespace=PRIMARY, entity="a")
    rig.sender._entity("a").record_failure(TIMEOUT, "stalled", rig.clock.monotonic())  # failing: 10 s to go
    assert rig.sender.entity_state("a") is F
    before = len(rig.transport.calls)
    rig.sender.send([*msgs(2, "x", entity="a"), *msgs(2, "y", entity="b")])
    order = [c[1].entity for c in rig.transport.calls[before:] if c[1].namespace == PRIMARY]
    assert order[0] == "b", order  # the healthy entity's batch did not wait behind the stalled one


# ---------------------------------------------------------------------------------------------------------
# Several stalled entities in one call (issue 29 item 1): parked, not waited for one after another


def _stalled_call(rig: Rig, sick: int, healthy: int) -> tuple[float, list[str]]:
    for i in range(sick):
        rig.transport.stall(namespace=PRIMARY, entity=f"s{i}")
    names = [*(f"s{i}" for i in range(sick)), *(f"h{i}" for i in range(healthy))]  # the sick ones first
    start = rig.clock.monotonic()
    out = rig.sender.send(m for name in names for m in msgs(2, f"{name}-", entity=name))
    assert out.sent == {f"h{i}": 2 for i in range(healthy)}
    assert out.diverted_by_entity == {f"s{i}": 2 for i in range(sick)}
    return rig.clock.monotonic() - start, [c[1].entity for c in rig.transport.calls if c[3] == "ok"]


def test_ten_stalled_entities_in_one_call_fail_over_together_within_one_interval() -> None:
    rig = Rig(failover_interval=10.0, ping_primary_interval=5.0, send_timeout=30.0)
    rig.transport.op_seconds = 0.01  # an answered call takes 10 ms
    when: dict[str, float] = {}
    check = rig.transport._check

    def timed(op: str, target: Target, n: int, timeout: float, on_slow: Any = None) -> None:
        when.setdefault(target.entity, rig.clock.monotonic())
        check(op, target, n, timeout, on_slow)

    rig.transport._check = timed  # type: ignore[method-assign]
    start = rig.clock.monotonic()
    took, ok = _stalled_call(rig, sick=10, healthy=20)
    # Each stalled send is parked (the first after PARK_AFTER, the next ones after PARK_SOON) and finished once the
    # call has nothing else to do; before, they were waited for one after another: 10 x 10 s.
    assert took <= 10.0 + PARK_AFTER + 9 * PARK_SOON + 0.5, took
    # the healthy entities were sent within 0.5 s of the call's start (SPEC F6), not after the stalled ones
    assert when["h0"] - start <= 0.5, when["h0"] - start
    for i in range(10):
        assert rig.sender.entity_state(f"s{i}") is FO
    # the healthy entities were sent while the stalled ones waited, not after them
    assert [e for e in ok if e.startswith("h")] == [f"h{i}" for i in range(20)]
    first_divert = next(i for i, c in enumerate(rig.transport.calls) if c[1].namespace != PRIMARY)
    assert all(
        c[1].entity.startswith("s") for c in rig.transport.calls[first_divert:] if c[1].namespace == PRIMARY
    )


def test_a_parked_send_answered_later_counts_as_sent() -> None:
    rig = Rig(failover_interval=10.0, ping_primary_interval=5.0, send_timeout=30.0)
    rule = rig.transport.stall(namespace=PRIMARY, entity="a")
    rig.transport.after_slow = None

    def heal_when_parked(*_: Any) -> None:
        rig.transport.heal(rule)

    names = ["a", "b", "c"]
    original = rig.transport.send

    def send(batch: Any, timeout: float, on_slow: Any = None, park_after: float | None = None) -> None:
        try:
            original(batch, timeout, on_slow, park_after)
        except Parked:
            heal_when_parked()  # the stalled entity answers while the call sends on
            raise

    rig.transport.send = send  # type: ignore[method-assign]
    out = rig.sender.send(m for name in names for m in msgs(2, f"{name}-", entity=name))
    assert out.sent == {"a": 2, "b": 2, "c": 2} and out.total_diverted == 0
    assert rig.sender.entity_state("a") is H
    assert rig.transport.ids(PRIMARY, "a") == ["a-0", "a-1"]


def test_a_parked_send_does_not_hold_back_a_due_retry() -> None:
    # "b" is refused twice (a busy entity), "a" stalls: b's retries are made while a's send is parked.
    rig = Rig(failover_interval=10.0, ping_primary_interval=5.0, send_timeout=30.0)
    rig.transport.stall(namespace=PRIMARY, entity="a")
    rig.transport.fail(lambda: sbe.ServiceBusServerBusyError(), namespace=PRIMARY, entity="b", count=2)
    out = rig.sender.send(
        [*msgs(2, "a-", entity="a"), *msgs(2, "b-", entity="b"), *msgs(1, "c-", entity="c")]
    )
    assert out.sent == {"b": 2, "c": 1} and out.diverted_by_entity == {"a": 2}
    b_ok = next(i for i, c in enumerate(rig.transport.calls) if c[1].entity == "b" and c[3] == "ok")
    a_end = max(
        i for i, c in enumerate(rig.transport.calls) if c[1].entity == "a" and c[1].namespace == PRIMARY
    )
    assert b_ok < a_end  # b was sent before a's parked send ended at its deadline


def test_stalled_entities_with_full_batches_in_one_call_fail_over_together_and_keep_their_order() -> None:
    from tests.unit.fakes import BATCH_BASE, fake_size

    registry = FailoverRegistry(FakeClock())
    clock = registry.clock
    assert isinstance(clock, FakeClock)
    rows = [
        OutboundMessage(body=f"{name}-{i:02}", message_id=f"{name}-{i:02}", entity=name)
        for i in range(12)
        for name in (*(f"s{i}" for i in range(5)), *(f"h{i}" for i in range(5)))
    ]
    limit = BATCH_BASE + 5 * max(fake_size(m) for m in rows)  # five messages per batch
    transport = FakeTransport(clock, max_batch=limit, op_seconds=0.01)
    rig = Rig(registry, transport, failover_interval=10.0, ping_primary_interval=5.0, send_timeout=30.0)
    sick, healthy = [f"s{i}" for i in range(5)], [f"h{i}" for i in range(5)]
    for name in sick:
        transport.stall(namespace=PRIMARY, entity=name)
    start = clock.monotonic()
    # rows interleaved over the entities, as in a partition: two full batches and a last one per entity
    out = rig.sender.send(iter(rows))
    took = clock.monotonic() - start
    assert out.sent == {n: 12 for n in healthy} and out.diverted_by_entity == {n: 12 for n in sick}
    assert took <= 10.0 + len(sick) * PARK_AFTER + 1.0, took  # not 5 x 10 s
    for name in healthy:
        assert transport.ids(PRIMARY, name) == [f"{name}-{i:02}" for i in range(12)]
    for name in sick:  # each backlog queue holds an entity's messages in order
        for target, got in transport.delivered.items():
            mine = [
                m.message_id
                for m in got
                if target.namespace != PRIMARY and (m.message_id or "").startswith(name)
            ]
            assert mine == sorted(mine)
