"""Planning one batch's state writes and the handoff to executors (spark_sb.state.planning, SPEC S4-S6):
:func:`plan_batch` (events, entity records, rejects), :func:`throttled_millis`, :func:`reject_records`,
:func:`active_pulls` and :func:`apply_handoff`. Pure; a fake clock for the registry."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from azure.servicebus import exceptions as sbe

from servicebus_local.clock import FakeClock
from spark_sb.failover.outcome import ProbeRecord, SendOutcome, namespace_key
from spark_sb.failover.records import BacklogPull, EntityState, EntityStatus, StateTransition
from spark_sb.failover.registry import FailoverRegistry
from spark_sb.message.outbound import OutboundMessage, Reject
from spark_sb.sender.paired import PairedSender
from spark_sb.state.planning import active_pulls, apply_handoff, plan_batch, reject_records, throttled_millis
from spark_sb.state.records import (
    BACKLOG_PULLED,
    BACKLOG_RETURNED,
    BATCH_COMMITTED,
    DIVERTED,
    EVENTS,
    PROBE,
    REJECTED,
    SENT,
    STATE_CHANGE,
    THROTTLED,
    EntityRecord,
    PartitionResult,
    PulledQueue,
)
from spark_sb.wire.transport import PRIMARY, SECONDARY, Target
from tests.unit.fakes import FakeTransport
from tests.unit.sender.rig import QUEUES, make_config
from tests.unit.state.store_contract import BNS, NS, T0

H, F, FO = EntityState.HEALTHY, EntityState.FAILING, EntityState.FAILED_OVER


def _transition(entity: str, a: EntityState, b: EntityState, at: datetime, err: str | None = None) -> Any:
    return StateTransition(entity, a, b, at, err, "send failed", NS)


def _result(
    outcome: SendOutcome, *statuses: EntityStatus, host: str = "h1", rows: int = 0
) -> PartitionResult:
    return PartitionResult(host, rows, outcome, tuple(statuses))


def _plan(results: list[PartitionResult], previous: list[EntityRecord], **kw: Any) -> Any:
    args: dict[str, Any] = {
        "sink_id": "s",
        "batch_id": 1,
        "namespace": NS,
        "backlog_namespace": BNS,
        "now": T0,
    }
    args.update(kw)
    return plan_batch(results=results, previous=previous, **args)


# ------------------------------------------------------------------------------------------- pure helpers
def test_throttled_millis_rounds_and_never_reports_zero_for_a_wait() -> None:
    assert [throttled_millis(s) for s in (0.0001, 0.0015, 1.0, 61.2345)] == [1, 2, 1000, 61234]


def test_reject_records_are_rows_of_the_rejects_table_stamped_with_the_sink_and_batch() -> None:
    rejects = [
        Reject("longer than 128 characters (200)", "session_id", '{"body":"x"}', "orders", 4),
        Reject("too large", None, "{}", None),
    ]
    rows = reject_records(rejects, "s", 9, T0)
    assert [(r.time, r.sink_id, r.batch_id, r.entity, r.column, r.reason, r.row_json) for r in rows] == [
        (T0, "s", 9, "orders", "session_id", "longer than 128 characters (200)", '{"body":"x"}'),
        (T0, "s", 9, None, None, "too large", "{}"),
    ]
    assert reject_records([], "s", None, T0) == []


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        pytest.param([], {}, id="nothing recorded"),
        pytest.param(
            [EntityRecord(NS, "a", "failed_over", T0, pulled_backlog_queues=(PulledQueue("q0", T0),))],
            {},
            id="a pull ending now is over",
        ),
        pytest.param(
            [
                EntityRecord(
                    NS, "a", "failed_over", T0, pulled_backlog_queues=(PulledQueue("q0", T0 + timedelta(1)),)
                )
            ],
            {"q0": T0 + timedelta(1)},
            id="a pull still in force",
        ),
        pytest.param(
            [
                EntityRecord(
                    NS,
                    "a",
                    "failed_over",
                    T0,
                    pulled_backlog_queues=(PulledQueue("q0", T0 + timedelta(seconds=5)),),
                ),
                EntityRecord(
                    NS,
                    "b",
                    "failed_over",
                    T0,
                    pulled_backlog_queues=(PulledQueue("q0", T0 + timedelta(seconds=9)),),
                ),
                EntityRecord(
                    NS,
                    "c",
                    "failed_over",
                    T0,
                    pulled_backlog_queues=(PulledQueue("q0", T0 + timedelta(seconds=7)),),
                ),
            ],
            {"q0": T0 + timedelta(seconds=9)},
            id="the latest until of a queue recorded by several entities",
        ),
        pytest.param(
            [
                EntityRecord(
                    "other:5671",
                    "a",
                    "failed_over",
                    T0,
                    pulled_backlog_queues=(PulledQueue("q0", T0 + timedelta(1)),),
                )
            ],
            {},
            id="another primary namespace's pull",
        ),
    ],
)
def test_active_pulls_are_the_latest_unexpired_pull_of_each_queue_of_the_namespace(
    records: list[EntityRecord], expected: dict[str, datetime]
) -> None:
    assert {q: p.until for q, p in active_pulls(records, NS, T0).items()} == expected


# ------------------------------------------------------------------------------------------- plan_batch
def test_plan_records_counts_transitions_rejects_and_the_commit_marker() -> None:
    reject = Reject("longer than 128 characters (200)", "session_id", '{"body":"x"}', "orders", 4)
    o1 = SendOutcome(
        sent={"orders": 5},
        rejects=(reject,),
        transitions=(
            _transition("orders", H, F, T0, "quota_exceeded"),
            _transition("orders", F, FO, T0 + timedelta(seconds=1), "quota_exceeded"),
        ),
        diverted={QUEUES[1]: 3},
        diverted_by_entity={"orders": 3},
    )
    o2 = SendOutcome(sent={"orders": 2})
    fo = EntityStatus(NS, "orders", FO, T0 + timedelta(seconds=1), T0, "quota_exceeded")
    writes = plan_batch(
        sink_id="s",
        batch_id=9,
        namespace=NS,
        backlog_namespace=BNS,
        results=[_result(o1, fo, rows=9), _result(o2, host="h2", rows=2)],
        previous=[],
        now=T0 + timedelta(seconds=2),
    )
    kinds = [(e.event, e.entity, e.backlog_queue, e.count, e.executor_host) for e in writes.events]
    assert kinds == [
        (SENT, "orders", None, 5, "h1"),
        (DIVERTED, "orders", QUEUES[1], 3, "h1"),
        (REJECTED, "orders", None, 1, "h1"),
        (STATE_CHANGE, "orders", None, 1, "h1"),
        (STATE_CHANGE, "orders", None, 1, "h1"),
        (SENT, "orders", None, 2, "h2"),
        (BATCH_COMMITTED, None, None, 11, None),
    ]
    change = writes.events[4]
    assert (change.from_state, change.to_state, change.error_class) == (
        "failing",
        "failed_over",
        "quota_exceeded",
    )
    assert all(e.sink_id == "s" and e.batch_id == 9 for e in writes.events)
    (rec,) = writes.entities
    assert (rec.state, rec.since, rec.last_error_class) == (
        "failed_over",
        T0 + timedelta(seconds=1),
        "quota_exceeded",
    )
    (rej,) = writes.rejects
    assert (rej.column, rej.reason, rej.entity, rej.batch_id) == ("session_id", reject.reason, "orders", 9)


def test_plan_writes_entities_only_on_real_newer_transitions() -> None:
    recorded = EntityRecord(NS, "orders", "failed_over", T0, "timeout", BNS, (), T0, "s")
    kw: dict[str, Any] = {"sink_id": "s", "batch_id": 1, "namespace": NS, "backlog_namespace": BNS, "now": T0}
    # a worker restored from the table reports FAILED_OVER "since now" (status only, no transition): no write
    restored = EntityStatus(NS, "orders", FO, T0 + timedelta(seconds=5))
    assert plan_batch(results=[_result(SendOutcome(), restored)], previous=[recorded], **kw).entities == ()
    # no trouble at all: nothing to record
    assert plan_batch(results=[_result(SendOutcome(sent={"orders": 3}))], previous=[], **kw).entities == ()
    # an older transition (a slow task) does not overwrite newer recorded state
    old = _transition("orders", FO, H, T0 - timedelta(minutes=1))
    assert (
        plan_batch(results=[_result(SendOutcome(transitions=(old,)))], previous=[recorded], **kw).entities
        == ()
    )
    # a probe succeeded on some worker after the recorded failover: the newest transition wins
    back = _transition("orders", FO, H, T0 + timedelta(minutes=1))
    fail = _transition("orders", H, F, T0 + timedelta(seconds=30), "timeout")
    outcomes = [
        _result(SendOutcome(transitions=(fail,))),
        _result(SendOutcome(transitions=(back,)), host="h2"),
    ]
    (rec,) = plan_batch(results=outcomes, previous=[recorded], **kw).entities
    assert (rec.state, rec.since, rec.last_error_class) == ("healthy", T0 + timedelta(minutes=1), "timeout")


def test_plan_records_pulls_and_returns() -> None:
    until = T0 + timedelta(minutes=5)
    pull = BacklogPull(BNS, QUEUES[0], T0, until, "timeout", "send timed out")
    fo = EntityStatus(NS, "orders", FO, T0)
    went = _transition("orders", F, FO, T0, "timeout")
    writes = plan_batch(
        sink_id="s",
        batch_id=0,
        namespace=NS,
        backlog_namespace=BNS,
        results=[PartitionResult("h1", 1, SendOutcome(transitions=(went,), pulls=(pull,)), (fo,), (pull,))],
        previous=[],
        now=T0,
    )
    assert [e.event for e in writes.events] == [STATE_CHANGE, BACKLOG_PULLED, BATCH_COMMITTED]
    (rec,) = writes.entities
    assert rec.pulled_backlog_queues == (PulledQueue(QUEUES[0], until, "timeout"),)
    later = plan_batch(
        sink_id="s",
        batch_id=1,
        namespace=NS,
        backlog_namespace=BNS,
        results=[_result(SendOutcome(), fo)],
        previous=[rec],
        now=until + timedelta(seconds=1),
    )
    assert [(e.event, e.backlog_queue) for e in later.events] == [
        (BACKLOG_RETURNED, QUEUES[0]),
        (BATCH_COMMITTED, None),
    ]
    assert [r.pulled_backlog_queues for r in later.entities] == [()]


def test_a_throttled_entity_gets_an_event_with_the_milliseconds_backed_off_per_task() -> None:
    slow = SendOutcome(sent={"orders": 5, "audit": 1}, throttled={"orders": 2.3456, "audit": 0.0004})
    other = SendOutcome(sent={"orders": 4}, throttled={"orders": 0.5})
    calm = SendOutcome(sent={"orders": 3}, throttled={"orders": 0.0})  # a zero entry is no throttling
    writes = plan_batch(
        sink_id="s",
        batch_id=4,
        namespace=NS,
        backlog_namespace=None,
        results=[_result(slow, rows=6), _result(other, host="h2", rows=4), _result(calm, host="h3", rows=3)],
        previous=[],
        now=T0,
    )
    throttled = [
        (e.entity, e.count, e.executor_host, e.error_class, e.namespace)
        for e in writes.events
        if e.event == THROTTLED
    ]
    assert throttled == [
        ("audit", 1, "h1", "server_busy", NS),  # under a millisecond still says it happened
        ("orders", 2346, "h1", "server_busy", NS),
        ("orders", 500, "h2", "server_busy", NS),
    ]
    detail = next(e.detail for e in writes.events if e.event == THROTTLED and e.entity == "orders")
    assert "backed off 2.3 s" in detail
    assert writes.events[-1].event == BATCH_COMMITTED and writes.events[-1].count == 13
    assert all(e.batch_id == 4 and e.sink_id == "s" for e in writes.events)
    assert writes.entities == ()  # throttling is not an outage: no entity changes state
    assert THROTTLED in EVENTS


def test_no_throttled_event_without_throttling() -> None:
    writes = plan_batch(
        sink_id="s",
        batch_id=1,
        namespace=NS,
        backlog_namespace=None,
        results=[_result(SendOutcome(sent={"orders": 2}), rows=2)],
        previous=[],
        now=T0,
    )
    assert [e.event for e in writes.events] == [SENT, BATCH_COMMITTED]


def test_one_diverting_entity_is_named_on_its_queue_rows_and_several_get_a_row_each() -> None:
    one = SendOutcome(diverted={QUEUES[1]: 2, QUEUES[0]: 1}, diverted_by_entity={"orders": 3})
    several = SendOutcome(diverted={QUEUES[2]: 5}, diverted_by_entity={"orders": 2, "audit": 3})
    writes = _plan([_result(one), _result(several, host="h2")], [])
    rows = [
        (e.executor_host, e.entity, e.backlog_queue, e.count) for e in writes.events if e.event == DIVERTED
    ]
    assert rows == [
        ("h1", "orders", QUEUES[0], 1),
        ("h1", "orders", QUEUES[1], 2),
        ("h2", None, QUEUES[2], 5),  # the queue row cannot name one entity
        ("h2", "audit", None, 3),
        ("h2", "orders", None, 2),
    ]


def test_rejects_are_counted_per_entity_and_a_reject_without_an_entity_has_its_own_row() -> None:
    rejects = (
        Reject("bad", "body", "{}", "orders"),
        Reject("too large", None, "{}", None),
        Reject("bad", "body", "{}", "orders"),
        Reject("bad", "body", "{}", "audit"),
    )
    writes = _plan([_result(SendOutcome(rejects=rejects))], [], batch_id=5)
    assert [(e.entity, e.count) for e in writes.events if e.event == REJECTED] == [
        (None, 1),
        ("audit", 1),
        ("orders", 2),
    ]
    assert [(r.entity, r.batch_id) for r in writes.rejects] == [
        ("orders", 5),
        (None, 5),
        ("orders", 5),
        ("audit", 5),
    ]


def test_probes_and_pulls_are_events_at_their_own_time_saying_what_happened() -> None:
    probes = (
        ProbeRecord("orders", "peek", T0 + timedelta(seconds=3), True),
        ProbeRecord("orders", "send", T0 + timedelta(seconds=4), False, "timeout", "no answer"),
    )
    pull = BacklogPull(
        BNS, QUEUES[0], T0 + timedelta(seconds=5), T0 + timedelta(minutes=5), "timeout", "slow"
    )
    writes = _plan([_result(SendOutcome(probes=probes, pulls=(pull,)))], [], now=T0 + timedelta(seconds=9))
    rows = [(e.event, e.time, e.entity, e.backlog_queue, e.error_class, e.detail) for e in writes.events]
    assert rows[:3] == [
        (PROBE, T0 + timedelta(seconds=3), "orders", None, None, "peek ok"),
        (PROBE, T0 + timedelta(seconds=4), "orders", None, "timeout", "send failed: no answer"),
        (
            BACKLOG_PULLED,
            T0 + timedelta(seconds=5),
            None,
            QUEUES[0],
            "timeout",
            f"until {(T0 + timedelta(minutes=5)).isoformat()}: slow",
        ),
    ]
    assert rows[3][:2] == (BATCH_COMMITTED, T0 + timedelta(seconds=9))  # the marker is at planning time


def test_a_transition_in_another_namespace_is_an_event_but_not_a_recorded_state() -> None:
    elsewhere = StateTransition("orders", H, F, T0, "timeout", "", "other:5671")
    writes = _plan([_result(SendOutcome(transitions=(elsewhere,)))], [])
    (change,) = [e for e in writes.events if e.event == STATE_CHANGE]
    assert change.namespace == "other:5671"
    assert writes.entities == ()


def test_a_transition_to_the_recorded_state_writes_nothing_and_a_new_entity_is_recorded_whole() -> None:
    recorded = EntityRecord(NS, "orders", "failed_over", T0, "timeout", BNS)
    again = _transition("orders", F, FO, T0 + timedelta(minutes=1), "timeout")
    assert _plan([_result(SendOutcome(transitions=(again,)))], [recorded]).entities == ()
    new = _transition("audit", H, F, T0 + timedelta(seconds=2), "connection")
    (rec,) = _plan([_result(SendOutcome(transitions=(new,)))], [recorded], updated_by="sink s").entities
    assert rec == EntityRecord(
        NS, "audit", "failing", T0 + timedelta(seconds=2), "connection", BNS, (), T0, "sink s"
    )


def test_a_later_transition_with_no_error_class_keeps_the_recorded_one() -> None:
    recorded = EntityRecord(NS, "orders", "failed_over", T0, "quota_exceeded", BNS)
    back = _transition("orders", FO, H, T0 + timedelta(minutes=1))
    (rec,) = _plan([_result(SendOutcome(transitions=(back,)))], [recorded]).entities
    assert (rec.state, rec.last_error_class) == ("healthy", "quota_exceeded")


def test_pulls_of_another_backlog_namespace_or_already_over_are_not_recorded() -> None:
    fo = _transition("orders", F, FO, T0, "timeout")
    foreign = BacklogPull("third:5671", QUEUES[0], T0, T0 + timedelta(minutes=5))
    over = BacklogPull(BNS, QUEUES[1], T0 - timedelta(minutes=5), T0)
    kept = BacklogPull(BNS, QUEUES[2], T0, T0 + timedelta(minutes=5))
    results = [PartitionResult("h1", 0, SendOutcome(transitions=(fo,)), (), (foreign, over, kept))]
    (rec,) = _plan(results, []).entities
    assert [p.queue for p in rec.pulled_backlog_queues] == [QUEUES[2]]


def test_a_pull_extended_on_a_worker_rewrites_every_record_of_the_namespace() -> None:
    first = PulledQueue(QUEUES[0], T0 + timedelta(minutes=1), "timeout")
    a = EntityRecord(NS, "a", "failed_over", T0, "timeout", BNS, (first,), T0, "s")
    b = EntityRecord(NS, "b", "healthy", T0, None, BNS, (first,), T0, "s")
    elsewhere = EntityRecord("other:5671", "c", "healthy", T0)
    longer = BacklogPull(BNS, QUEUES[0], T0, T0 + timedelta(minutes=9), "timeout")
    now = T0 + timedelta(seconds=30)
    results = [PartitionResult("h1", 0, SendOutcome(), (), (longer,))]
    writes = _plan(results, [a, b, elsewhere], now=now, updated_by="sink s")
    assert [
        (r.entity, r.state, r.pulled_backlog_queues, r.updated_at, r.updated_by) for r in writes.entities
    ] == [
        ("a", "failed_over", (PulledQueue(QUEUES[0], T0 + timedelta(minutes=9), "timeout"),), now, "sink s"),
        ("b", "healthy", (PulledQueue(QUEUES[0], T0 + timedelta(minutes=9), "timeout"),), now, "sink s"),
    ]
    # the same pull again, or a shorter one (nothing new): nothing to write
    same = BacklogPull(BNS, QUEUES[0], T0, T0 + timedelta(minutes=1), "timeout")
    shorter = BacklogPull(BNS, QUEUES[0], T0, T0 + timedelta(seconds=45), "timeout")
    for pull in (same, shorter):
        assert _plan([PartitionResult("h1", 0, SendOutcome(), (), (pull,))], [a, b], now=now).entities == ()


# ------------------------------------------------------------------------------- the handoff (S4)
def test_fresh_worker_starts_failed_over_and_skips_pulled_queues() -> None:
    """A task on a worker that never saw the outage diverts at once (no failover_interval wait, no primary
    attempt) and avoids the backlog queue the table says is pulled."""
    config = make_config(failover_interval=60.0)
    clock = FakeClock(start=T0)
    registry = FailoverRegistry(clock)
    primary, secondary = namespace_key(config.primary), namespace_key(config.secondary)
    pulls = (
        PulledQueue(QUEUES[0], T0 + timedelta(minutes=5), "timeout"),
        PulledQueue(QUEUES[2], T0 + timedelta(minutes=5)),
    )
    records = [
        EntityRecord(
            primary, "orders", "failed_over", T0 - timedelta(seconds=30), "timeout", secondary, pulls
        )
    ]
    made = apply_handoff(
        registry,
        records,
        namespace=primary,
        backlog_namespace=secondary,
        failover_interval=60.0,
        ping_interval=30.0,
    )
    assert [(t.from_state, t.to_state) for t in made] == [(H, FO)]
    transport = FakeTransport(clock, op_seconds=1.0)
    transport.fail(lambda: sbe.ServiceBusConnectionError(message="refused"), namespace=PRIMARY)
    sender = PairedSender(config, transport=transport, registry=registry, clock=clock)
    start = clock.monotonic()
    outcome = sender.send(iter(_messages(5)))
    assert outcome.total_diverted == 5 and outcome.total_sent == 0
    assert transport.sends(PRIMARY) == []  # not even one attempt on the primary
    assert set(outcome.diverted) == {QUEUES[1]}
    assert clock.monotonic() - start < 60.0
    assert all(c[1] == Target(SECONDARY, QUEUES[1]) for c in transport.sends(SECONDARY))


def test_handoff_respects_newer_local_knowledge_and_ignores_other_namespaces() -> None:
    clock = FakeClock(start=T0)
    registry = FailoverRegistry(clock)
    kw: dict[str, Any] = {
        "namespace": NS,
        "backlog_namespace": BNS,
        "failover_interval": 60.0,
        "ping_interval": 30.0,
    }
    ef = registry.entity(NS, "orders", failover_interval=60.0, ping_interval=30.0)
    ef.restore(FO)
    clock.advance(10)
    ef.record_probe(True)  # healthy again, here, after what the table recorded
    old = EntityRecord(NS, "orders", "failed_over", T0 - timedelta(minutes=1))
    assert apply_handoff(registry, [old], **kw) == []
    assert ef.state is H
    newer = replace(old, since=T0 + timedelta(minutes=1))
    assert [t.to_state for t in apply_handoff(registry, [newer], **kw)] == [FO]
    other = EntityRecord("elsewhere:5671", "x", "failed_over", T0)
    assert apply_handoff(registry, [other], **kw) == []
    assert {s.entity for s in registry.statuses()} == {"orders"}
    failing = EntityRecord(NS, "new", "failing", T0)  # the timer is the worker's own: not copied
    assert apply_handoff(registry, [failing], **kw) == []


def _messages(n: int) -> list[Any]:
    return [OutboundMessage(body=f"b{i}", entity="orders", message_id=f"m{i}") for i in range(n)]


_HANDOFF: dict[str, Any] = {"namespace": NS, "failover_interval": 60.0, "ping_interval": 30.0}


def test_a_healthy_record_of_an_entity_the_worker_never_saw_changes_nothing_but_the_namespace_knowledge() -> (
    None
):
    registry = FailoverRegistry(FakeClock(start=T0))
    records = [EntityRecord(NS, "orders", "healthy", T0), EntityRecord(NS, "audit", "failing", T0)]
    assert apply_handoff(registry, records, backlog_namespace=BNS, **_HANDOFF) == []
    assert registry.statuses() == []  # no entity made for a healthy record
    health = registry.namespace(NS)
    assert health is not None and health.reached  # a healthy record: the namespace answered this sink before
    assert health.is_known("orders") and health.is_known("audit")
    assert not health.is_known("invoices")


def test_handoff_of_failed_over_entities_only_marks_the_namespace_known_not_reached() -> None:
    registry = FailoverRegistry(FakeClock(start=T0))
    apply_handoff(
        registry, [EntityRecord(NS, "orders", "failed_over", T0)], backlog_namespace=BNS, **_HANDOFF
    )
    health = registry.namespace(NS)
    assert health is not None and health.is_known("orders") and not health.reached
    assert apply_handoff(FailoverRegistry(FakeClock(start=T0)), [], backlog_namespace=BNS, **_HANDOFF) == []


def test_handoff_pulls_recorded_queues_until_their_time_on_the_workers_own_clock() -> None:
    clock = FakeClock(start=T0)
    registry = FailoverRegistry(clock)
    pulled = (
        PulledQueue(QUEUES[0], T0 + timedelta(seconds=90), "timeout"),
        PulledQueue(QUEUES[1], T0 - timedelta(seconds=1)),  # over already
    )
    records = [EntityRecord(NS, "orders", "failed_over", T0, "timeout", BNS, pulled)]
    apply_handoff(registry, records, backlog_namespace=BNS, **_HANDOFF)
    assert registry.rotation.available(BNS, QUEUES) == [q for q in QUEUES if q != QUEUES[0]]
    (pull,) = registry.rotation.pulled(BNS)
    assert (pull.queue, pull.until, pull.error_class) == (QUEUES[0], T0 + timedelta(seconds=90), "timeout")
    clock.advance(89.9)
    assert not registry.rotation.is_available(BNS, QUEUES[0])
    clock.advance(0.1)
    assert registry.rotation.is_available(BNS, QUEUES[0])


def test_handoff_leaves_a_queue_the_worker_pulled_itself_and_pulls_nothing_without_a_backlog() -> None:
    clock = FakeClock(start=T0)
    registry = FailoverRegistry(clock)
    mine = registry.rotation.pull(BNS, QUEUES[0], clock.monotonic() + 10, "connection", "mine")
    records = [
        EntityRecord(
            NS, "orders", "failed_over", T0, None, BNS, (PulledQueue(QUEUES[0], T0 + timedelta(minutes=5)),)
        )
    ]
    apply_handoff(registry, records, backlog_namespace=BNS, **_HANDOFF)
    assert registry.rotation.pulled(BNS) == [mine]
    alone = FailoverRegistry(FakeClock(start=T0))
    apply_handoff(alone, records, backlog_namespace=None, **_HANDOFF)
    assert alone.rotation.pulled() == []
