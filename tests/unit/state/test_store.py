"""State records, batch planning, the handoff to executors and the in-memory store (SPEC S4-S6). No Spark.

:class:`StoreContract` is the one test mixin every :class:`~spark_sb.state.store.StateStore` runs (STYLE item 4):
here against :class:`MemoryStateStore`, in ``tests/spark/test_state_delta.py`` against the Delta store.
"""

from __future__ import annotations

import pickle
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from azure.servicebus import exceptions as sbe

from spark_sb.core.clock import FakeClock
from spark_sb.failover.outcome import SendOutcome, namespace_key
from spark_sb.failover.records import BacklogPull, EntityState, EntityStatus, StateTransition
from spark_sb.failover.registry import FailoverRegistry
from spark_sb.message.outbound import Reject
from spark_sb.sender.paired import PairedSender
from spark_sb.state.delta import StateTables, is_conflict
from spark_sb.state.planning import apply_handoff, plan_batch
from spark_sb.state.records import (
    BACKLOG_PULLED,
    BACKLOG_RETURNED,
    BATCH_COMMITTED,
    DIVERTED,
    REJECTED,
    SENT,
    STATE_CHANGE,
    BatchWrites,
    EntityRecord,
    Event,
    PartitionResult,
    PulledQueue,
    RejectRecord,
)
from spark_sb.state.store import MemoryStateStore
from spark_sb.state.writer import EntityView, coalesce
from spark_sb.wire.transport import PRIMARY, SECONDARY, Target
from tests.unit.fakes import FakeTransport
from tests.unit.sender.rig import QUEUES, SECRET, make_config
from tests.unit.state.store_contract import BNS, NS, T0, StoreContract

H, F, FO = EntityState.HEALTHY, EntityState.FAILING, EntityState.FAILED_OVER


class TestMemoryStore(StoreContract):
    @pytest.fixture(autouse=True)
    def _store(self) -> None:
        self.store = MemoryStateStore()


# ------------------------------------------------------------------------------- group commit and the view
def test_coalesce_makes_one_commit_of_several_batches() -> None:
    t0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)

    def writes(batch: int, *records: EntityRecord, rejects: int = 0) -> BatchWrites:
        rej = tuple(RejectRecord(t0, "s", batch, "orders", "body", "null", "{}") for _ in range(rejects))
        return BatchWrites(
            (Event(t0, "s", batch, SENT), Event(t0, "s", batch, BATCH_COMMITTED)), records, rej
        )

    failed = EntityRecord(NS, "orders", "failed_over", t0 + timedelta(seconds=5))
    healthy_older = EntityRecord(NS, "orders", "healthy", t0)
    same_time_later_batch = replace(failed, updated_by="batch 9")
    other = EntityRecord(NS, "invoices", "failing", t0)
    version, merged = coalesce(
        [
            (9, writes(9, same_time_later_batch)),
            (7, writes(7, failed, rejects=2)),
            (8, writes(8, healthy_older, other)),
        ]
    )
    assert version == 9  # the highest batch id: the group's txnVersion
    assert [(e.batch_id, e.event) for e in merged.events if e.event == BATCH_COMMITTED] == [
        (7, BATCH_COMMITTED),
        (8, BATCH_COMMITTED),
        (9, BATCH_COMMITTED),
    ]
    assert len(merged.events) == 6 and [r.batch_id for r in merged.rejects] == [7, 7]
    assert merged.entities == (other, same_time_later_batch)  # newest per key; a tie goes to the later batch
    with pytest.raises(ValueError):
        coalesce([])


def test_entity_view_overlays_planned_records_until_a_later_read_has_them() -> None:
    t0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)
    clock = FakeClock()
    view = EntityView(clock.monotonic)
    assert not view.loaded and view.records() == [] and view.age() == float("inf")
    table = [EntityRecord(NS, "orders", "healthy", t0), EntityRecord(NS, "invoices", "failed_over", t0)]
    view.refreshed(table)
    clock.advance(7)
    assert view.age() == 7
    planned = EntityRecord(NS, "orders", "failed_over", t0 + timedelta(seconds=1))
    view.planned(1, [planned])
    assert view.loaded and view.records() == [table[1], planned]
    newer = EntityRecord(NS, "orders", "healthy", t0 + timedelta(seconds=9))
    view.refreshed([newer, table[1]])  # another writer's newer row wins over the planned one
    assert view.records() == [table[1], newer]
    view.refreshed(table)  # a read older than the planned record's commit: the planned record still counts
    assert view.records() == [table[1], planned]
    view.refreshed(table, written_through=1)  # taken after write 1: what the table says is the truth
    assert view.records() == [table[1], table[0]]
    view.reset()
    assert not view.loaded


# ------------------------------------------------------------------------------------------- planning
def _transition(entity: str, a: EntityState, b: EntityState, at: datetime, err: str | None = None) -> Any:
    return StateTransition(entity, a, b, at, err, "send failed", NS)


def _result(
    outcome: SendOutcome, *statuses: EntityStatus, host: str = "h1", rows: int = 0
) -> PartitionResult:
    return PartitionResult(host, rows, outcome, tuple(statuses))


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


def test_records_redact_secrets_and_pickle() -> None:
    make_config()  # loading a config registers its secrets with spark_sb.core.redact
    e = Event(T0, "s", 1, STATE_CHANGE, detail=f"SharedAccessKey={SECRET} refused")
    r = RejectRecord(T0, "s", 1, "orders", "body", f"bad {SECRET}", f'{{"k": "{SECRET}"}}')
    assert SECRET not in e.detail and SECRET not in r.reason and SECRET not in r.row_json
    rec = EntityRecord(NS, "orders", "failed_over", T0, pulled_backlog_queues=(PulledQueue("q", T0),))
    assert pickle.loads(pickle.dumps(rec)) == rec


def test_state_tables_names_and_conflicts() -> None:
    assert StateTables(location="/x/state/").sql_name("events") == "delta.`/x/state/events`"
    assert StateTables(prefix="main.ops.sb_").sql_name("entities") == "main.ops.sb_entities"
    with pytest.raises(ValueError, match="exactly one"):
        StateTables()
    assert is_conflict(RuntimeError("[DELTA_CONCURRENT_APPEND] ConcurrentAppendException: files were added"))
    assert not is_conflict(RuntimeError("[PATH_NOT_FOUND] no such path"))
    # another query's half-made table: retried while creating tables, an error for an append
    race = RuntimeError("[DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION] Cannot create table ... is not empty")
    assert is_conflict(race, creating=True)
    assert not is_conflict(race)


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
    from spark_sb.message.outbound import OutboundMessage

    return [OutboundMessage(body=f"b{i}", entity="orders", message_id=f"m{i}") for i in range(n)]


def test_delta_writes_retry_conflicts_with_other_writers_and_nothing_else() -> None:
    from spark_sb.state.delta import DeltaStateStore

    waits: list[float] = []
    store = DeltaStateStore(None, StateTables(location="/x"), attempts=4, backoff=0.1, sleep=waits.append)  # type: ignore[arg-type]
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("[DELTA_CONCURRENT_APPEND] ConcurrentAppendException: Files were added")
        return "done"

    assert store._retry("events", flaky) == "done"
    assert len(calls) == 3 and waits == [0.1, 0.2]

    def always() -> None:
        raise RuntimeError("ConcurrentTransactionException")

    with pytest.raises(RuntimeError, match="ConcurrentTransaction"):
        store._retry("events", always)
    assert len(waits) == 2 + 3  # gave up after `attempts`

    def broken() -> None:
        calls.append(1)
        raise RuntimeError("[PATH_NOT_FOUND] gone")

    before = len(calls)
    with pytest.raises(RuntimeError, match="PATH_NOT_FOUND"):
        store._retry("events", broken)
    assert len(calls) == before + 1  # not a conflict: not retried


def test_creating_the_tables_waits_out_another_writer_creating_them() -> None:
    """Two queries sharing a state location start together: one finds the other's table folder without its first
    commit yet. ensure() retries that; an append never does."""
    from spark_sb.state.delta import DeltaStateStore

    statements: list[str] = []

    class Result:
        def collect(self) -> list[Any]:
            return []

    class Spark:
        def sql(self, sql: str) -> Result:
            statements.append(sql)
            if len(statements) < 3:
                raise RuntimeError("[DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION] location is not empty")
            return Result()

    waits: list[float] = []
    store = DeltaStateStore(Spark(), StateTables(location="/x"), backoff=0.1, sleep=waits.append)  # type: ignore[arg-type]
    store.ensure()
    assert waits == [0.1, 0.2]
    assert len(statements) == 2 + 3 and all("CREATE TABLE IF NOT EXISTS" in s for s in statements)
