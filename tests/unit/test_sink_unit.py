"""The sink's driver logic without Spark: replay skipping, the handoff, bounded totals (SPEC S4-S6), plus the
config keys and row conversion it relies on (sink_id, message_id_mode, state_table_prefix, schema check)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from spark_sb.config import ConfigError, ServiceBusConfig
from spark_sb.failover import EntityState, EntityStatus, StateTransition
from spark_sb.mapping import Reject, SchemaError, message_id_from_content, row_to_message, validate_schema
from spark_sb.sender import SendOutcome, namespace_key
from spark_sb.sink import ServiceBusSink, SinkIdConflictError, default_sink_id
from spark_sb.state import BATCH_COMMITTED, REPLAY_SKIPPED, EntityRecord, MemoryStateStore, PartitionResult

from .test_sender import make_config

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


class Tasks:
    """Stands in for the batch's mapInArrow job: records the handoff, returns scripted partition results."""

    def __init__(self, *results: PartitionResult) -> None:
        self.results = list(results)
        self.handoffs: list[list[EntityRecord]] = []

    def __call__(self, handoff: Sequence[EntityRecord]) -> list[PartitionResult]:
        self.handoffs.append(list(handoff))
        return self.results


def _sink(store: MemoryStateStore, **cfg: Any) -> ServiceBusSink:
    return ServiceBusSink(make_config(**cfg), store=store)


def _result(rows: int = 3, **outcome: Any) -> PartitionResult:
    return PartitionResult("h1", rows, SendOutcome(sent={"orders": rows}, **outcome))


def test_replayed_batch_is_skipped_and_recorded() -> None:
    store = MemoryStateStore()
    first = _sink(store, sink_id="orders-stream")
    first.process_batch(0, Tasks(_result()), lambda: 3, store, now=lambda: T0)
    first.process_batch(1, Tasks(_result()), lambda: 3, store, now=lambda: T0)
    restarted = _sink(store, sink_id="orders-stream")  # driver restart: batch 1 replays before its checkpoint
    tasks = Tasks(_result())
    assert restarted.process_batch(1, tasks, lambda: 3, store, now=lambda: T0) is None
    assert tasks.handoffs == []  # nothing sent
    events = store.read_events("orders-stream")
    skipped = [e for e in events if e.event == REPLAY_SKIPPED]
    assert [(e.batch_id, e.count) for e in skipped] == [(1, 3)]
    assert restarted.total.skipped_batches == 1 and restarted.total.batches == 0
    assert restarted.process_batch(2, tasks, lambda: 3, store, now=lambda: T0) is not None
    assert [e.batch_id for e in events + store.read_events("orders-stream") if e.event == BATCH_COMMITTED][
        -1
    ] == 2


def test_sink_id_reused_by_another_query_is_an_error_not_a_silent_skip() -> None:
    store = MemoryStateStore()
    _sink(store, sink_id="s").process_batch(4, Tasks(_result()), lambda: 3, store)
    other = _sink(store, sink_id="s")
    with pytest.raises(
        SinkIdConflictError, match="committed by sink_id 's' with 3 rows, and now arrives with 7"
    ):
        other.process_batch(4, Tasks(_result()), lambda: 7, store)
    with pytest.raises(SinkIdConflictError, match="never committed"):
        other.process_batch(2, Tasks(_result()), lambda: 3, store)
    fresh = _sink(store, sink_id="t")  # its own sink id: sends
    assert fresh.process_batch(2, Tasks(_result()), lambda: 3, store) is not None


def test_tasks_get_the_recorded_entity_state_and_later_batches_see_the_failover() -> None:
    store = MemoryStateStore()
    config = make_config(sink_id="s")
    ns = namespace_key(config.primary)
    sb = ServiceBusSink(config, store=store)
    fo = EntityStatus(ns, "orders", EntityState.FAILED_OVER, T0, T0, "quota_exceeded")
    t = StateTransition("orders", EntityState.FAILING, EntityState.FAILED_OVER, T0, "quota_exceeded", "", ns)
    first = Tasks(PartitionResult("h1", 2, SendOutcome(transitions=(t,)), (fo,)))
    sb.process_batch(0, first, lambda: 2, store, now=lambda: T0)
    assert first.handoffs == [[]]
    second = Tasks(_result())
    sb.process_batch(1, second, lambda: 3, store, now=lambda: T0 + timedelta(seconds=5))
    (handed,) = second.handoffs
    assert [(r.entity, r.state, r.last_error_class) for r in handed] == [
        ("orders", "failed_over", "quota_exceeded")
    ]


def test_totals_keep_counts_only() -> None:
    store = MemoryStateStore()
    sb = _sink(store)
    reject = Reject("body is null", "body", "{}", "orders")
    for batch in range(50):
        sb.process_batch(batch, Tasks(_result(rows=4, rejects=(reject,) * 4)), lambda: 4, store)
    assert (sb.total.batches, sb.total.rows, sb.total.total_sent, sb.total.total_rejected) == (
        50,
        200,
        200,
        200,
    )
    assert all(isinstance(v, (int, dict)) for v in vars(sb.total).values())
    assert sb.last_outcome is not None and len(sb.last_outcome.rejects) == 4  # the last batch only


def test_without_state_tables_nothing_is_stored_and_every_batch_runs() -> None:
    sb = ServiceBusSink(make_config())
    tasks = Tasks(_result())
    for _ in range(2):
        sb.process_batch(0, tasks, lambda: 3, None)
    assert len(tasks.handoffs) == 2 and sb.total.total_sent == 6


# ------------------------------------------------------------------------------------------ config keys
def test_sink_id_default_and_state_keys() -> None:
    c = make_config()
    assert default_sink_id(c) == "primary/orders"  # <primary namespace name>/<entity>
    assert ServiceBusSink(c).sink_id == "primary/orders"
    base = {"primary.connection_string": "${env:CS}", "entity": "orders"}
    env = {"CS": "Endpoint=sb://a.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v"}
    loaded = ServiceBusConfig.from_options(
        {**base, "sink_id": "orders-1", "message_id_mode": "content", "state_table_prefix": "main.ops.sb_"},
        env=env,
    )
    assert (loaded.sink_id, loaded.message_id_mode, loaded.state_table_prefix) == (
        "orders-1",
        "content",
        "main.ops.sb_",
    )
    assert ServiceBusConfig.from_options(loaded.to_options(), env=env) == loaded
    with pytest.raises(ConfigError, match="message_id_mode: 'hash' is not one of 'column', 'content'"):
        ServiceBusConfig.from_options({**base, "message_id_mode": "hash"}, env=env)
    with pytest.raises(ConfigError, match="state_table_prefix: expected catalog.schema.prefix"):
        replace(c, state_table_prefix="no spaces allowed")
    with pytest.raises(ConfigError, match="not both"):
        replace(c, state_table_prefix="main.ops.sb_", state_location="/tmp/x")


# ----------------------------------------------------------------------------------- rows and schema
COLS = {c: c for c in ("body", "entity", "message_id", "properties")}


def test_content_message_ids_are_stable_and_cover_entity_body_and_properties() -> None:
    row = {"body": "b", "properties": [("k", "v")]}
    a = row_to_message(row, COLS, "orders", 262144, "content")
    b = row_to_message(dict(row), COLS, "orders", 262144, "content")
    assert a.message_id == b.message_id == message_id_from_content(replace(a, message_id=None))
    assert len(a.message_id or "") == 36
    others = [
        row_to_message(row, COLS, "invoices", 262144, "content"),
        row_to_message({**row, "body": "c"}, COLS, "orders", 262144, "content"),
        row_to_message({**row, "properties": [("k", "w")]}, COLS, "orders", 262144, "content"),
    ]
    assert len({m.message_id for m in [a, *others]}) == 4
    assert (
        row_to_message({**row, "message_id": "given"}, COLS, "orders", 262144, "content").message_id
        == "given"
    )
    assert row_to_message(row, COLS, "orders", 262144).message_id is None  # column mode: the SDK assigns one


def test_schema_check_names_the_column_and_the_accepted_types() -> None:
    from pyspark.sql import types as T

    good = T.StructType([T.StructField("body", T.StringType()), T.StructField("time_to_live", T.LongType())])
    validate_schema(good, COLS)
    bad = T.StructType([T.StructField("body", T.StringType()), T.StructField("session_id", T.IntegerType())])
    with pytest.raises(SchemaError, match="column 'session_id': expected string, found int") as info:
        validate_schema(bad, COLS)
    assert info.value.column == "session_id"
    with pytest.raises(SchemaError, match="column 'body': expected string, binary, struct, map or array"):
        validate_schema(T.StructType([T.StructField("body", T.DoubleType())]), COLS)
