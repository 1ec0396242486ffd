"""A paired sender's shared parts (:mod:`spark_sb.sender.context`): the transport built on first use and never
after close, a connection fault handed to the built transport only, the backlog link warmed for a failing entity,
the registry's failover state under the configuration's intervals, and state transitions handed to the outcome and
the listener - the default (logging) listener's grouped at the call's end, a failing listener never failing the
send."""

from __future__ import annotations

import logging
import random
from datetime import datetime, timezone

import pytest

from servicebus_local.clock import FakeClock
from spark_sb.core.errors import LaneClosed
from spark_sb.failover.outcome import Tally
from spark_sb.failover.records import EntityState, StateTransition, log_transition
from spark_sb.failover.registry import FailoverRegistry
from spark_sb.failover.rotation import BacklogChooser
from spark_sb.sender.paired import PairedSender
from spark_sb.wire.sdk_transport import SdkTransport
from spark_sb.wire.transport import PRIMARY, SECONDARY, Target
from tests.unit.fakes import FakeTransport
from tests.unit.sender.rig import QUEUES, Rig, conn_error, make_config, make_context, msgs

H, F, FO = EntityState.HEALTHY, EntityState.FAILING, EntityState.FAILED_OVER
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def moves(entities: str) -> list[StateTransition]:
    return [StateTransition(e, H, F, T0, "connection", "refused") for e in entities]


# ---------------------------------------------------------------------------------------------------------
# The transport


def test_the_given_transport_is_the_senders_transport() -> None:
    transport = FakeTransport(FakeClock())
    ctx = make_context(transport)
    assert ctx.transport() is transport and ctx.transport() is transport


def test_without_a_given_transport_one_sdk_transport_is_built_on_first_use_and_kept() -> None:
    ctx = make_context(given=False)
    assert ctx._transport is None  # nothing built before the first use
    built = ctx.transport()
    try:
        assert isinstance(built, SdkTransport) and ctx.transport() is built
    finally:
        ctx.close()


def test_close_closes_the_built_transport_once_and_marks_the_context_closed() -> None:
    ctx = make_context()
    transport = ctx.transport()
    assert isinstance(transport, FakeTransport)
    ctx.close()
    assert ctx.closed and transport.closed == 1


def test_after_close_no_transport_is_built_and_using_one_raises_lane_closed() -> None:
    ctx = make_context(given=False)
    ctx.close()
    with pytest.raises(LaneClosed):
        ctx.transport()
    assert ctx._transport is None


def test_a_fault_goes_to_the_built_transport_for_that_target_namespace() -> None:
    ctx = make_context()
    ctx.fault(Target(PRIMARY, "orders"))
    ctx.fault(Target(SECONDARY, QUEUES[0]))
    transport = ctx.transport()
    assert isinstance(transport, FakeTransport) and transport.faults == [PRIMARY, SECONDARY]


def test_a_fault_before_any_transport_is_built_builds_none() -> None:
    ctx = make_context(given=False)
    ctx.fault(Target(PRIMARY, "orders"))
    assert ctx._transport is None


def test_the_sender_builds_no_transport_after_close() -> None:
    from spark_sb.sender.paired import PairedSender

    sender = PairedSender(make_config())
    sender.close()
    with pytest.raises(LaneClosed):
        _ = sender.transport


# ---------------------------------------------------------------------------------------------------------
# Warming the backlog link


def test_a_failing_entity_has_the_link_to_its_chosen_backlog_queue_opened() -> None:
    ctx = make_context()
    ctx.warm_backlog("orders")
    chosen = ctx.chooser.choose("orders")  # the sticky choice the divert will use
    transport = ctx.transport()
    assert isinstance(transport, FakeTransport)
    assert transport.warmed == [Target(SECONDARY, str(chosen))] and chosen in QUEUES


def test_nothing_is_warmed_without_a_secondary_namespace() -> None:
    transport = FakeTransport(FakeClock())
    ctx = make_context(transport, secondary=None)
    ctx.chooser = BacklogChooser(
        QUEUES, ctx.registry.rotation, "", rng=random.Random(1)
    )  # queues given anyway
    ctx.warm_backlog("orders")
    assert transport.warmed == []


def test_nothing_is_warmed_when_every_backlog_queue_is_pulled() -> None:
    transport = FakeTransport(FakeClock())
    ctx = make_context(transport)
    for q in QUEUES:
        ctx.registry.rotation.pull(ctx.secondary_key, q, ctx.clock.monotonic() + 60.0)
    ctx.warm_backlog("orders")
    assert transport.warmed == []


# ---------------------------------------------------------------------------------------------------------
# Failover state


def test_an_entitys_state_is_the_registrys_under_the_primary_key_with_the_configured_intervals() -> None:
    registry = FailoverRegistry(FakeClock())
    ctx = make_context(registry=registry, failover_interval=12.0, ping_primary_interval=7.0)
    state = ctx.entity("orders")
    assert state is ctx.entity("orders")
    assert state.failover_interval == 12.0 and state.ping_interval == 7.0
    assert state.namespace == "primary-key" and state.entity == "orders"
    other = make_context(registry=registry)  # another sender of the process: the same state
    assert other.entity("orders") is state
    assert ctx.entity("billing") is not state


# ---------------------------------------------------------------------------------------------------------
# Transitions: the outcome and the listener


def test_a_listener_of_the_callers_gets_each_transition_at_once_and_the_outcome_records_them() -> None:
    got: list[StateTransition] = []
    ctx = make_context(listener=got.append)
    tally = Tally()
    transitions = moves("ab")
    ctx.emit(tally, transitions)
    assert got == transitions and tally.transitions == transitions and tally.unlogged == []


def test_the_default_listener_gets_the_transitions_grouped_at_the_calls_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ctx = make_context(listener=log_transition)
    tally = Tally()
    with caplog.at_level(logging.INFO, logger="spark_sb.failover"):
        ctx.emit(tally, moves("abc"))
        assert caplog.records == []  # kept for the call's end
        assert [t.entity for t in tally.unlogged] == ["a", "b", "c"] and len(tally.transitions) == 3
        ctx.log_emitted(tally)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("3 entities"), lines
    assert tally.unlogged == [] and len(tally.transitions) == 3
    caplog.clear()
    ctx.log_emitted(tally)  # nothing left to log
    assert caplog.records == []


def test_without_an_outcome_the_default_listener_logs_each_transition_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ctx = make_context(listener=log_transition)
    with caplog.at_level(logging.INFO, logger="spark_sb.failover"):
        ctx.emit(None, moves("ab"))
    assert len(caplog.records) == 2


def test_a_failing_listener_is_logged_and_the_other_transitions_still_reach_the_outcome(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[str] = []

    def broken(t: StateTransition) -> None:
        seen.append(t.entity)
        raise RuntimeError("listener bug")

    ctx = make_context(listener=broken)
    tally = Tally()
    with caplog.at_level(logging.ERROR, logger="spark_sb.sender.context"):
        ctx.emit(tally, moves("ab"))
    assert seen == ["a", "b"] and [t.entity for t in tally.transitions] == ["a", "b"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and all("listener bug" in e for e in errors)


def test_listener_failure_does_not_fail_the_send() -> None:
    clock = FakeClock()
    transport = FakeTransport(clock)
    transport.fail(conn_error, namespace=PRIMARY)

    def broken(_: StateTransition) -> None:
        raise RuntimeError("listener bug")

    sender = PairedSender(
        make_config(failover_interval=0.0),
        transport=transport,
        clock=clock,
        listener=broken,
        rng=random.Random(1),
    )
    assert sender.send(msgs(2)).total_diverted == 2


def test_a_namespace_outage_over_many_entities_logs_a_line_per_kind_of_change_not_per_entity(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With the default listener, the transitions of one call are logged by kind (from, to, error, detail): 200
    entities failing over in one outage make a few lines naming a few entities, not 400 lines; every transition
    is still in the outcome. A listener of the caller's own still gets each one."""
    rig = Rig(failover_interval=10.0)
    rig.transport.op_seconds = 0.01
    logged = PairedSender(
        rig.config, transport=rig.transport, clock=rig.clock, registry=rig.registry, rng=random.Random(1)
    )
    rig.transport.fail(conn_error, namespace=PRIMARY)
    entities = [f"e{i}" for i in range(200)]
    with caplog.at_level("INFO", logger="spark_sb.failover"):
        out = logged.send([m for e in entities for m in msgs(1, prefix=f"{e}-", entity=e)])
    assert out.total_diverted == 200 and len(out.transitions) == 400
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("spark_sb.failover")]
    assert 2 <= len(lines) <= 4, lines
    assert any(
        line.startswith("199 entities ('e1', 'e2', 'e3', 'e4', 'e5' and 194 more)") for line in lines
    ), lines
    assert any("-> failed_over" in line and line.startswith("200 entities") for line in lines), lines
    own = Rig(failover_interval=10.0)
    own.transport.op_seconds = 0.01
    own.transport.fail(conn_error, namespace=PRIMARY)
    own.sender.send([m for e in entities for m in msgs(1, prefix=f"{e}-", entity=e)])
    assert len(own.transitions) == 400
