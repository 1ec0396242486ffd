"""Probes of failed-over primary entities (:mod:`spark_sb.sender.prober`, SPEC B8, F4, F6, F7): a probe on the
transport's isolated connection within the probe budget, its record and transitions kept for the sender's thread;
a failed probe recorded as evidence (a connection-class one rebuilds the client); closing, a closed client or no
transport is evidence of nothing; the failed-over entities probed in turn, longest ago first, their links opened
together; probes due claimed once; inline or on helper threads that end when nothing is failed over."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

import pytest
from azure.servicebus import exceptions as sbe

from servicebus_local.clock import FakeClock
from spark_sb.core.errors import LaneClosed
from spark_sb.failover.machine import EntityFailover
from spark_sb.failover.records import EntityState
from spark_sb.failover.registry import FailoverRegistry
from spark_sb.message.backlog import is_probe
from spark_sb.sender.attempts import AttemptLoop
from spark_sb.sender.prober import Prober
from spark_sb.wire.transport import PRIMARY, SECONDARY, Target
from tests.unit.fakes import FakeTransport
from tests.unit.sender.rig import Rig, conn_error, make_context, msgs

H, F, FO = EntityState.HEALTHY, EntityState.FAILING, EntityState.FAILED_OVER


class Parts:
    """A prober over a sender's context alone (fake transport and clock, ping interval 5 s, probe budget 5 s)."""

    def __init__(
        self,
        transport: FakeTransport | None = None,
        *,
        background: bool = False,
        registry: FailoverRegistry | None = None,
        **cfg: Any,
    ) -> None:
        self.ctx = make_context(transport, registry=registry, ping_primary_interval=5.0, **cfg)
        built = self.ctx.transport()
        assert isinstance(built, FakeTransport)
        self.transport = built
        self.prober = Prober(ctx=self.ctx, loop=AttemptLoop(self.ctx), background=background)

    def failed_over(self, *entities: str) -> list[EntityFailover]:
        states = [self.ctx.entity(e) for e in entities]
        for state in states:
            state.restore(FO)
        return states

    def due(self, *entities: str) -> list[EntityFailover]:
        """``entities`` failed over, their probes due and claimed."""
        states = self.failed_over(*entities)
        self.ctx.clock.advance(5.0)
        assert all(s.claim_probe() for s in states)
        return states


class NoIsolated(FakeTransport):
    def isolated(self) -> FakeTransport:
        raise RuntimeError("no isolated connection")


class NoPrepare(FakeTransport):
    def prepare(self, targets: Iterable[Target], silence: float) -> dict[Target, BaseException]:
        raise RuntimeError("links not opened")


class Threads(FakeTransport):
    """Records the thread each probe's schedule call ran on."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.threads: list[int] = []

    def schedule(self, target: Target, message: Any, at: Any, timeout: float) -> int:
        self.threads.append(threading.get_ident())
        return super().schedule(target, message, at, timeout)


class Stopping(threading.Event):
    """The prober's stop event, saying when the probe thread starts waiting for its next probe."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        return super().wait(timeout)


def join(name: str) -> None:
    for thread in threading.enumerate():
        if thread.name == name:
            thread.join(5.0)
            assert not thread.is_alive()


# ---------------------------------------------------------------------------------------------------------
# One probe


def test_a_probe_that_answers_returns_the_entity_to_healthy_and_waits_for_collect() -> None:
    p = Parts()
    (state,) = p.due("orders")
    at = p.ctx.clock.now()
    p.prober.probe("orders", state)
    assert state.state is H
    ((record, transitions),) = p.prober.collect()
    assert (record.entity, record.mode, record.at, record.ok, record.error_class) == (
        "orders",
        "schedule-cancel",
        at,
        True,
        None,
    )
    assert record.sequence_number is not None and record.cancel_ok and record.cancel_attempts == 1
    assert [(t.from_state, t.to_state) for t in transitions] == [(FO, H)]
    assert p.prober.collect() == []  # collected once
    # on the probe budget, not send_timeout
    assert p.transport.timeouts[0] == ("schedule", Target(PRIMARY, "orders"), 5.0)


def test_a_probe_uses_the_configured_probe_mode() -> None:
    p = Parts(probe_mode="ping")
    (state,) = p.due("orders")
    p.prober.probe("orders", state)
    ((record, _),) = p.prober.collect()
    assert record.mode == "ping" and record.ok and record.sequence_number is None
    (ping,) = p.transport.at(PRIMARY, "orders")
    assert is_probe(ping)


def test_a_failed_probe_is_recorded_with_its_error_and_the_client_rebuilt_on_a_connection_error() -> None:
    p = Parts()
    p.transport.fail(conn_error, op="schedule", namespace=PRIMARY)
    (state,) = p.due("orders")
    p.prober.probe("orders", state)
    ((record, transitions),) = p.prober.collect()
    assert (record.ok, record.error_class, record.sequence_number, record.cancel_attempts) == (
        False,
        "connection",
        None,
        0,
    )
    assert "connection refused" in record.detail and transitions == []
    assert state.state is FO and p.transport.faults == [PRIMARY]
    health = p.ctx.registry.namespace("primary-key")
    assert health is not None and health.faulted  # a connection-class failure: evidence against the namespace
    assert not state._probing


def test_a_failed_probe_the_entity_answered_rebuilds_nothing_and_faults_no_namespace() -> None:
    p = Parts()
    p.transport.fail(lambda: sbe.MessagingEntityDisabledError(), op="schedule", namespace=PRIMARY)
    (state,) = p.due("orders")
    p.prober.probe("orders", state)
    ((record, _),) = p.prober.collect()
    assert not record.ok and record.error_class == "entity_disabled"
    assert p.transport.faults == [] and state.state is FO
    health = p.ctx.registry.namespace("primary-key")
    assert health is None or not health.faulted


def test_a_probe_after_stop_makes_no_call_records_nothing_and_gives_the_claim_back() -> None:
    p = Parts()
    (state,) = p.due("orders")
    p.prober.stop()
    p.prober.probe("orders", state)
    assert p.transport.calls == [] and p.prober.collect() == []
    assert state.state is FO and not state._probing


def test_a_probe_meeting_a_closed_client_records_nothing() -> None:
    p = Parts()
    p.transport.fail(lambda: LaneClosed("the lane was retired"), op="schedule", namespace=PRIMARY)
    (state,) = p.due("orders")
    p.prober.probe("orders", state)
    assert p.prober.collect() == [] and not state._probing
    assert state.status().last_error_class is None and p.transport.faults == []


def test_a_probe_without_an_isolated_transport_records_nothing_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    p = Parts(NoIsolated(make_context().clock))
    (state,) = p.due("orders")
    with caplog.at_level(logging.INFO, logger="spark_sb.sender.prober"):
        p.prober.probe("orders", state)
    assert p.prober.collect() == [] and not state._probing and p.transport.calls == []
    assert any(
        "not made" in r.getMessage() and "no isolated connection" in r.getMessage() for r in caplog.records
    )


def test_an_interrupted_probe_is_recorded_as_unexpected_and_the_interrupt_goes_on() -> None:
    p = Parts()
    p.transport.fail(KeyboardInterrupt, op="schedule", namespace=PRIMARY)
    (state,) = p.due("orders")
    with pytest.raises(KeyboardInterrupt):
        p.prober.probe("orders", state)
    assert state.status().last_error_class == "unexpected" and not state._probing
    assert state.state is FO and p.prober.collect() == []


# ---------------------------------------------------------------------------------------------------------
# Several probes, rotation, what is failed over


def test_several_claimed_probes_have_their_links_opened_together_first() -> None:
    p = Parts()
    states = p.due("a", "b", "c")
    p.prober.probe_all(states)
    assert p.transport.prepared == [[Target(PRIMARY, e) for e in "abc"]]
    assert [r.entity for r, _ in p.prober.collect()] == ["a", "b", "c"]


def test_a_single_probe_opens_no_links_ahead() -> None:
    p = Parts()
    p.prober.probe_all(p.due("a"))
    assert p.transport.prepared == [] and len(p.prober.collect()) == 1


def test_links_that_could_not_be_opened_together_leave_each_probe_to_go_on() -> None:
    p = Parts(NoPrepare(make_context().clock))
    p.prober.probe_all(p.due("a", "b"))
    assert [(r.entity, r.ok) for r, _ in p.prober.collect()] == [("a", True), ("b", True)]


def test_claimed_probes_left_after_stop_are_given_back_as_not_made() -> None:
    """Closing is no evidence (SPEC F7): the claims are given back and each entity's record is left as it was -
    as probe() does after stop - rather than recorded as an 'unexpected' probe failure."""
    p = Parts()
    states = p.due("a", "b")
    before = [s.status() for s in states]
    p.prober.stop()
    p.prober.probe_all(states)
    assert [c for c in p.transport.calls if c[0] != "prepare"] == [] and p.prober.collect() == []
    assert [s.status() for s in states] == before and not any(s._probing for s in states)
    assert all(s.state is FO for s in states)


def test_the_rotation_puts_the_entity_probed_longest_ago_first() -> None:
    p = Parts()
    for e in "cab":
        p.failed_over(e)
        p.ctx.clock.advance(1.0)
    assert [s.entity for s in p.prober.rotation()] == ["c", "a", "b"]


def test_failed_over_lists_this_primarys_failed_over_entities_only() -> None:
    registry = FailoverRegistry(make_context().clock)
    p = Parts(registry=registry)
    p.failed_over("orders")
    p.ctx.entity("healthy")
    other = registry.entity("other-primary", "x", failover_interval=0.0, ping_interval=5.0)
    other.restore(FO)
    assert [s.entity for s in p.prober.failed_over()] == ["orders"]
    assert p.prober.failed_over()[0] is p.ctx.entity("orders")


def test_probe_due_probes_only_the_entities_whose_probe_is_due() -> None:
    p = Parts()
    p.failed_over("a")
    p.ctx.clock.advance(3.0)
    p.failed_over("b")
    p.ctx.clock.advance(2.0)  # a's probe is due, b's in 3 s
    p.prober.probe_due()
    assert [r.entity for r, _ in p.prober.collect()] == ["a"]
    p.prober.probe_due()  # nothing due
    assert p.prober.collect() == []
    p.ctx.clock.advance(3.0)
    p.prober.probe_due()
    assert [r.entity for r, _ in p.prober.collect()] == ["b"]


def test_start_probes_inline_without_background() -> None:
    p = Parts(Threads(make_context().clock))
    (state,) = p.due("orders")
    p.prober.start("orders", state)
    assert [r.ok for r, _ in p.prober.collect()] == [True] and state.state is H
    assert isinstance(p.transport, Threads) and p.transport.threads == [
        threading.get_ident()
    ]  # on this thread


# ---------------------------------------------------------------------------------------------------------
# Background threads


def test_inline_or_after_stop_no_probe_thread_is_started() -> None:
    p = Parts()
    p.failed_over("orders")
    p.prober.ensure_running()
    assert p.prober._thread is None
    q = Parts(background=True)
    q.failed_over("orders")
    q.prober.stop()
    q.prober.ensure_running()
    assert q.prober._thread is None


def test_the_probe_thread_probes_the_failed_over_entities_and_ends_when_none_is() -> None:
    p = Parts(background=True)
    p.failed_over("orders")
    p.ctx.clock.advance(5.0)
    p.prober.ensure_running()
    thread = p.prober._thread
    assert thread is not None and thread.name == "spark-sb-prober"
    thread.join(5.0)
    assert not thread.is_alive()
    assert [(r.entity, r.ok) for r, _ in p.prober.collect()] == [("orders", True)]
    assert p.ctx.entity("orders").state is H


def test_one_probe_thread_runs_while_an_entity_stays_failed_over_and_stop_ends_it() -> None:
    p = Parts(background=True)
    p.transport.fail(conn_error, op="schedule", namespace=PRIMARY)
    p.failed_over("orders")
    p.ctx.clock.advance(5.0)
    p.prober._stopping = stopping = Stopping()
    p.prober.ensure_running()
    first = p.prober._thread
    assert first is not None
    assert stopping.waiting.wait(5.0)  # the thread probed once and waits for the next probe
    p.prober.ensure_running()  # still waiting for the next probe: the same thread
    assert p.prober._thread is first and first.is_alive()
    p.prober.stop()
    first.join(5.0)
    assert not first.is_alive()
    assert [(r.entity, r.ok) for r, _ in p.prober.collect()] == [("orders", False)]


def test_in_background_a_started_probe_runs_on_a_helper_thread() -> None:
    p = Parts(background=True)
    (state,) = p.due("orders")
    p.prober.start("orders", state)
    join("spark-sb-probe-orders")
    assert [r.ok for r, _ in p.prober.collect()] == [True]


def test_in_background_due_probes_run_on_a_helper_thread() -> None:
    p = Parts(background=True)
    p.failed_over("a", "b")
    p.ctx.clock.advance(5.0)
    p.prober.probe_due()
    join("spark-sb-probes")
    assert sorted(r.entity for r, _ in p.prober.collect()) == ["a", "b"]


# ---------------------------------------------------------------------------------------------------------
# Through the paired sender (moved from test_paired.py and test_attempts.py)


def not_allowed() -> BaseException:
    err = sbe.ServiceBusError("The SessionId was not set on a message, and it cannot be sent to the entity.")
    err._condition = "amqp:not-allowed"  # type: ignore[attr-defined]
    return err


def test_failed_over_entity_diverts_at_once_and_probes_each_ping_interval() -> None:
    rig = Rig(failover_interval=0.0, ping_primary_interval=30.0)
    rule = rig.transport.fail(conn_error, namespace=PRIMARY)
    rig.sender.send(msgs(2, "a"))
    primary_calls = len(rig.transport.calls)
    out = rig.sender.send(msgs(2, "b"))  # within the ping interval: no primary traffic at all
    assert rig.transport.calls[primary_calls:] and all(
        c[1].namespace == SECONDARY for c in rig.transport.calls[primary_calls:]
    )
    assert out.probes == () and out.diverted_by_entity == {"orders": 2}

    rig.clock.advance(30.0)  # probe due; primary still down
    rig.transport.fail(conn_error, op="schedule", namespace=PRIMARY)
    out = rig.sender.send(msgs(2, "c"))
    assert [(p.mode, p.ok, p.error_class) for p in out.probes] == [("schedule-cancel", False, "connection")]
    assert out.diverted_by_entity == {"orders": 2} and rig.sender.entity_state("orders") is FO

    rig.clock.advance(27.0)  # not yet due again (the failed probe and the divert took 2 s)
    assert rig.sender.send(msgs(1, "d")).probes == ()

    rig.transport.heal()  # primary back
    rig.clock.advance(2.0)
    out = rig.sender.send(msgs(3, "e"))
    (probe,) = out.probes
    assert probe.ok and probe.cancel_ok and probe.sequence_number is not None
    assert rig.transport.scheduled[Target(PRIMARY, "orders")] == {}  # cancelled: nothing deliverable
    assert [(t.from_state, t.to_state) for t in out.transitions] == [(FO, H)]
    assert out.sent == {"orders": 3} and rig.transport.ids(PRIMARY, "orders") == ["e0", "e1", "e2"]
    assert rule not in rig.transport.rules


def test_maintain_probes_idle_failed_over_entities() -> None:
    rig = Rig(failover_interval=0.0, ping_primary_interval=5.0)
    rig.transport.fail(conn_error, namespace=PRIMARY, count=1)
    rig.sender.send(msgs(1))
    assert rig.sender.maintain().probes == ()
    rig.clock.advance(5.0)
    out = rig.sender.maintain()
    assert [p.ok for p in out.probes] == [True]
    assert rig.sender.entity_state("orders") is H


def test_a_probe_refused_for_good_is_logged_as_an_error_and_stays_failed_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rig = Rig(failover_interval=0.0, ping_primary_interval=5.0)
    rig.transport.fail(conn_error, namespace=PRIMARY, count=1)
    rig.sender.send(msgs(1))
    assert rig.sender.entity_state("orders") is FO
    rig.transport.fail(not_allowed, op="schedule", namespace=PRIMARY)
    rig.clock.advance(5.0)
    with caplog.at_level(logging.ERROR, logger="spark_sb.sender.prober"):
        out = rig.sender.send(msgs(1, "z"))
    assert [(p.ok, p.error_class) for p in out.probes] == [(False, "invalid_request")]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and r.name == "spark_sb.sender.prober"]
    assert len(errors) == 1 and "'orders'" in errors[0].getMessage() and "refused" in errors[0].getMessage()
    assert rig.sender.entity_state("orders") is FO  # diverted, nothing lost, and said loudly


def test_probes_rotate_so_a_permanently_sick_entity_never_holds_the_namespace_fault() -> None:
    rig = Rig(failover_interval=0.0, ping_primary_interval=5.0)
    rule = rig.transport.fail(conn_error, namespace=PRIMARY)
    for e in "abc":
        rig.sender.send(msgs(1, e, entity=e))
    assert {rig.sender.entity_state(e) for e in "abc"} == {FO}
    rig.transport.heal(rule)
    rig.transport.fail(conn_error, namespace=PRIMARY, entity="a")  # `a` alone stays sick, for good
    probed: list[str] = []
    for _ in range(4):
        rig.clock.advance(5.0)
        out = rig.sender.maintain()
        probed.extend(p.entity for p in out.probes)
        if rig.sender.entity_state("b") is H:
            break
    # one probe per interval for the namespace, not always of `a`: the second interval's probe is another's
    assert rig.sender.entity_state("b") is H and rig.sender.entity_state("c") is H, probed
    assert probed[0] == "a" or len(probed) == 1


def test_a_probe_after_close_builds_nothing_and_records_nothing() -> None:
    clock = FakeClock()
    registry = FailoverRegistry(clock)
    transport = FakeTransport(clock)
    rig = Rig(registry=registry, transport=transport, failover_interval=0.0, ping_primary_interval=5.0)
    transport.stall(namespace=PRIMARY, entity="orders", count=1)  # its own fault: the namespace answers
    rig.sender.send(msgs(1))
    state = rig.sender._entity("orders")
    assert state.state is FO
    rig.sender.close()
    clock.advance(5.0)
    assert state.claim_probe()
    before = len(transport.calls)
    rig.sender._probes.probe("orders", state)
    assert len(transport.calls) == before  # nothing was tried
    assert rig.sender._probes.collect() == []  # nothing recorded
    assert state.state is FO and not state._probing  # the claim was given back
    health = registry.namespace(rig.sender._primary_key)
    assert health is None or not health.faulted
