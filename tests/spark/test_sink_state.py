"""The sink's Delta state tables on real Spark (local[2]) against two local namespaces (SPEC S2, S4-S6, R3).

Each test reads the three tables back (``<state_location>/events|entities|rejects``) and asserts their rows.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from servicebus_local.model import QueueSettings
from spark_sb.admin.provisioning import provision_backlog_queues
from spark_sb.admin.status import read_status
from spark_sb.failover.outcome import namespace_key
from spark_sb.spark.sink import ServiceBusSink
from spark_sb.state.delta import DeltaStateStore, StateTables
from spark_sb.state.records import BatchWrites, EntityRecord, Event, PulledQueue

from .streams import SINK_SCHEMA, drain_messages, run_sink_stream, sink_config, write_rows

pytestmark = pytest.mark.slow


def _tables(spark: Any, state: Path) -> dict[str, list[Any]]:
    return {
        t: spark.read.format("delta").load(str(state / t)).collect()
        for t in ("events", "entities", "rejects")
    }


def test_outage_failover_and_rejects_are_in_the_tables_without_secrets(
    spark: Any, namespace_pair: Any, tmp_path: Path
) -> None:
    primary, secondary = namespace_pair.primary, namespace_pair.secondary
    primary.broker.create_queue("orders", QueueSettings(requires_duplicate_detection=True))
    state = tmp_path / "state"
    config = sink_config(namespace_pair, state_location=str(state), sink_id="orders-stream")
    provision_backlog_queues(config, admin_client=secondary.admin_client(), retry_pause=0)
    sb_sink = ServiceBusSink(config)
    folder = tmp_path / "in"
    folder.mkdir()
    rows = [{"body": f"b{i}", "message_id": f"m{i}"} for i in range(20)]
    bad = {"body": "x", "message_id": "bad", "session_id": "s" * 200}

    def outage_batch() -> None:
        primary.faults.fail_sends("orders", "amqp:resource-limit-exceeded")  # the primary entity is full
        write_rows(folder, "a.json", [*rows, bad])

    run_sink_stream(spark, sb_sink, folder, tmp_path / "ckpt", [outage_batch])
    sb_sink.flush()  # the state writes are asynchronous: flush before reading the tables

    tables = _tables(spark, state)
    ns = namespace_key(config.primary)
    events = tables["events"]
    assert {e.sink_id for e in events} == {"orders-stream"} and {e.batch_id for e in events} == {0}
    changes = [(e.from_state, e.to_state, e.error_class) for e in events if e.event == "state_change"]
    assert changes == [("healthy", "failing", "quota_exceeded"), ("failing", "failed_over", "quota_exceeded")]
    assert sum(e["count"] for e in events if e.event == "diverted" and e.backlog_queue) == 20
    assert all(e.executor_host for e in events if e.event in ("diverted", "state_change", "rejected"))
    (commit,) = [e for e in events if e.event == "batch_committed"]
    assert commit["count"] == 21
    (entity,) = tables["entities"]
    assert (entity.namespace, entity.entity, entity.state, entity.last_error_class) == (
        ns,
        "orders",
        "failed_over",
        "quota_exceeded",
    )
    (reject,) = tables["rejects"]
    assert (reject.sink_id, reject.batch_id, reject.entity, reject.column) == (
        "orders-stream",
        0,
        "orders",
        "session_id",
    )
    assert "longer than 128 characters" in reject.reason and '"message_id": "bad"' in reject.row_json
    # the status command reads the same tables without Spark (delta-rs)
    if importlib.util.find_spec("deltalake") is not None:
        status = read_status(config, depths=False)
        assert [(r["entity"], r["state"]) for r in status.entities] == [("orders", "failed_over")]
        assert status.events[0]["event"] == "batch_committed"
    # R3: no key or connection string in any row of any table
    keys = re.findall(
        r"SharedAccessKey=([^;]+)", primary.connection_string + ";" + secondary.connection_string
    )
    text = repr(tables)
    assert keys and not any(k in text for k in keys) and "SharedAccessKey" not in text


@pytest.mark.parametrize("state_writes", ["async", "sync"])
def test_replayed_batch_is_skipped_and_recorded(
    spark: Any, namespace_pair: Any, tmp_path: Path, state_writes: str
) -> None:
    """With ``sync`` the batch's rows are in the tables when foreachBatch returns; with ``async`` this is the case
    where the background write landed before the driver died (``flush()``)."""
    primary = namespace_pair.primary
    primary.broker.create_queue("orders", QueueSettings())  # no duplicate detection: a resend would show
    state, ckpt, folder = tmp_path / "state", tmp_path / "ckpt", tmp_path / "in"
    folder.mkdir()
    config = sink_config(
        namespace_pair, state_location=str(state), sink_id="replay", state_writes=state_writes
    )
    batches = [[{"body": f"{n}-{i}", "message_id": f"{n}-{i}"} for i in range(5)] for n in range(2)]
    files = [lambda n=n: write_rows(folder, f"{n}.json", batches[n]) for n in range(2)]
    first = ServiceBusSink(config)
    run_sink_stream(spark, first, folder, ckpt, files)
    if state_writes == "async":
        first.flush()
    else:
        assert first._writer is None  # nothing in the background
    # The driver died after batch 1's sends and before its checkpoint commit: Spark runs batch 1 again.
    (ckpt / "commits" / "1").unlink()
    (ckpt / "commits" / ".1.crc").unlink(missing_ok=True)
    restarted = ServiceBusSink(config)
    run_sink_stream(spark, restarted, folder, ckpt, [lambda: None])
    restarted.flush()

    received = sorted(str(m.message_id) for m in drain_messages(primary, "orders"))
    assert received == sorted(r["message_id"] for b in batches for r in b)  # sent once, not twice
    events = _tables(spark, state)["events"]
    skipped = [(e.batch_id, e["count"]) for e in events if e.event == "replay_skipped"]
    assert skipped == [(1, 5)]
    assert sorted(e.batch_id for e in events if e.event == "batch_committed") == [0, 1]
    assert restarted.total.skipped_batches == 1 and restarted.total.total_sent == 0


def test_content_message_ids_make_a_resent_batch_harmless(
    spark: Any, namespace_pair: Any, tmp_path: Path
) -> None:
    """No state tables (so no replay skipping) and rows without ids: with message_id_mode content the replayed
    batch carries the same ids and duplicate detection on the primary keeps one copy of each."""
    primary = namespace_pair.primary
    primary.broker.create_queue("orders", QueueSettings(requires_duplicate_detection=True))
    config = sink_config(namespace_pair, message_id_mode="content")
    ckpt, folder = tmp_path / "ckpt", tmp_path / "in"
    folder.mkdir()
    rows = [{"body": f"order {i}"} for i in range(15)]
    run_sink_stream(spark, ServiceBusSink(config), folder, ckpt, [lambda: write_rows(folder, "0.json", rows)])
    (ckpt / "commits" / "0").unlink()
    (ckpt / "commits" / ".0.crc").unlink(missing_ok=True)
    again = ServiceBusSink(config)
    run_sink_stream(spark, again, folder, ckpt, [lambda: None])
    assert again.total.total_sent == 15  # sent a second time ...
    received = drain_messages(primary, "orders")
    assert sorted(str(m) for m in received) == sorted(r["body"] for r in rows)  # ... delivered once
    assert len({str(m.message_id) for m in received}) == 15


def test_two_queries_write_the_same_tables_at_once(spark: Any, namespace_pair: Any, tmp_path: Path) -> None:
    """Two sink queries (own sink ids) fail over the same entity and write the same state tables concurrently:
    conflicts are retried, both sinks' batches are committed, nothing is lost."""
    primary, secondary = namespace_pair.primary, namespace_pair.secondary
    primary.broker.create_queue("orders", QueueSettings())
    state = tmp_path / "state"
    base = sink_config(namespace_pair, state_location=str(state))
    provision_backlog_queues(base, admin_client=secondary.admin_client(), retry_pause=0)
    primary.faults.fail_sends("orders", "amqp:resource-limit-exceeded")
    queries, sinks, expected = [], [], []
    for name in ("q1", "q2"):
        folder = tmp_path / name
        folder.mkdir()
        for n in range(2):
            rows = [{"body": f"{name}-{n}-{i}", "message_id": f"{name}-{n}-{i}"} for i in range(5)]
            expected.extend(r["message_id"] for r in rows)
            write_rows(folder, f"{n}.json", rows)
        sink = ServiceBusSink(base.with_overrides(sink_id=name))
        sinks.append(sink)
        queries.append(
            spark.readStream.schema(SINK_SCHEMA)
            .option("maxFilesPerTrigger", 1)
            .json(str(folder))
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / f"ckpt-{name}"))
            .start()
        )
    try:
        for q in queries:
            q.processAllAvailable()
    finally:
        for q in queries:
            q.stop()
    assert all(q.exception() is None for q in queries)
    for sink in sinks:
        sink.flush()
    tables = _tables(spark, state)
    commits = sorted((e.sink_id, e.batch_id) for e in tables["events"] if e.event == "batch_committed")
    assert commits == [("q1", 0), ("q1", 1), ("q2", 0), ("q2", 1)]
    assert [(r.entity, r.state) for r in tables["entities"]] == [("orders", "failed_over")]
    backlog = [
        str(m.message_id) for q in base.backlog_queue_names("primary") for m in drain_messages(secondary, q)
    ]
    assert sorted(backlog) == sorted(expected)


def test_recorded_failover_reaches_fresh_tasks(spark: Any, namespace_pair: Any, tmp_path: Path) -> None:
    """Another writer recorded 'invoices' as failed over and backlog queue 0 as pulled: this query's tasks (on
    workers that never saw the outage) divert at once to queue 1, with no failover_interval wait and no send to
    the (healthy) primary."""
    primary, secondary = namespace_pair.primary, namespace_pair.secondary
    primary.broker.create_queue("invoices", QueueSettings())
    state = tmp_path / "state"
    config = sink_config(
        namespace_pair, entity="invoices", state_location=str(state), failover_interval="10m", sink_id="fresh"
    )
    provision_backlog_queues(config, admin_client=secondary.admin_client(), retry_pause=0)
    now = datetime.now(timezone.utc)
    assert config.secondary is not None
    ns, backlog_ns = namespace_key(config.primary), namespace_key(config.secondary)
    pulled = (PulledQueue("primary/x-servicebus-transfer/0", now + timedelta(hours=1), "timeout"),)
    other_writer = DeltaStateStore(spark, StateTables(location=str(state)))
    other_writer.write_batch(
        "another-executor",
        7,
        BatchWrites(
            (Event(now, "another-executor", 7, "batch_committed"),),
            (EntityRecord(ns, "invoices", "failed_over", now, "timeout", backlog_ns, pulled, now, "x"),),
            (),
        ),
    )
    sb_sink = ServiceBusSink(config)
    folder = tmp_path / "in"
    folder.mkdir()
    rows = [{"body": f"b{i}", "message_id": f"i{i}"} for i in range(12)]
    run_sink_stream(spark, sb_sink, folder, tmp_path / "ckpt", [lambda: write_rows(folder, "a.json", rows)])
    sb_sink.flush()

    assert sb_sink.total.total_sent == 0
    assert sb_sink.total.diverted == {"primary/x-servicebus-transfer/1": 12}
    assert sb_sink.last_outcome is not None and sb_sink.last_outcome.elapsed < 60  # no 10 min wait
    assert drain_messages(primary, "invoices") == []
    backlog = drain_messages(secondary, "primary/x-servicebus-transfer/1")
    assert sorted(str(m.message_id) for m in backlog) == sorted(r["message_id"] for r in rows)


def test_workers_that_never_saw_the_outage_start_the_next_batch_failed_over(
    spark: Any, namespace_pair: Any, tmp_path: Path
) -> None:
    """Batch 0 (one task) waits failover_interval and fails over; batch 1 runs two tasks at once, so at least one
    in a Python worker that never saw the outage: through the entity table it diverts at once. 0 lost."""
    primary, secondary = namespace_pair.primary, namespace_pair.secondary
    primary.broker.create_queue("orders", QueueSettings())
    interval = 8.0
    config = sink_config(namespace_pair, state_location=str(tmp_path / "state"), failover_interval=interval)
    provision_backlog_queues(config, admin_client=secondary.admin_client(), retry_pause=0)
    primary.faults.fail_sends("orders", "amqp:resource-limit-exceeded")  # the whole test: the primary is full
    sb_sink = ServiceBusSink(config)
    folder = tmp_path / "in"
    folder.mkdir()
    rows = [[{"body": f"{f}-{i}", "message_id": f"{f}-{i}"} for i in range(10)] for f in range(3)]
    seen: list[list[Any]] = []

    def batch(*files: int) -> Any:
        def write() -> None:
            for f in files:
                write_rows(folder, f"{f}.json", rows[f])

        return write

    def record() -> None:
        seen.append(list(sb_sink.last_results))

    run_sink_stream(spark, sb_sink, folder, tmp_path / "ckpt", [batch(0), record, batch(1, 2), record])
    sb_sink.flush()

    first, second = seen
    assert len(first) == 1 and first[0].outcome.elapsed >= interval  # the one task waited, then failed over
    assert len(second) == 2
    fresh = [r for r in second if r.pid != first[0].pid]
    assert fresh, "batch 1 ran only in the worker of batch 0"
    for r in second:
        assert r.outcome.elapsed < interval / 2, f"a task waited {r.outcome.elapsed:.1f} s"
        assert r.outcome.total_diverted == 10 and r.outcome.total_sent == 0
        assert not [t for t in r.outcome.transitions if t.to_state.value == "failing"]
    backlog = [
        str(m.message_id) for q in config.backlog_queue_names("primary") for m in drain_messages(secondary, q)
    ]
    assert sorted(backlog) == sorted(r["message_id"] for f in rows for r in f)  # 0 lost, 0 duplicated


def test_wrong_column_type_fails_the_first_batch_naming_the_column(
    spark: Any, namespace_pair: Any, tmp_path: Path
) -> None:
    namespace_pair.primary.broker.create_queue("orders", QueueSettings())
    config = sink_config(namespace_pair, on_reject="record")  # on_reject is about rows, not about the schema
    folder = tmp_path / "in"
    folder.mkdir()
    write_rows(folder, "a.json", [{"body": "b", "session_id": 5}])
    query = (
        spark.readStream.schema("body STRING, session_id INT")
        .json(str(folder))
        .writeStream.foreachBatch(ServiceBusSink(config))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .start()
    )
    with pytest.raises(Exception, match=r"column 'session_id': expected string, found int"):
        query.processAllAvailable()
    query.stop()
    assert drain_messages(namespace_pair.primary, "orders") == []
    shutil.rmtree(tmp_path / "ckpt", ignore_errors=True)
    assert SINK_SCHEMA  # the good schema is the one test_sink streams
