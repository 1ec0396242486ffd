"""``format("servicebus")`` with catalog state tables (``state_table_prefix``): the source records into its spool
(path tables, deltalake) and :func:`spark_sb.relay_state` copies them into the catalog tables, on real Spark
(local[2]) and real Delta, against two local namespaces (real SDK, real TCP)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from servicebus_local.model import QueueSettings
from spark_sb import ConfigError, StateRelay, relay_state
from spark_sb.admin.provisioning import provision_backlog_queues
from spark_sb.config.service_bus import ServiceBusConfig

from .streams import drain_messages, healthy_then_outage, source_options, start_source

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("registered")]


def _prefix() -> str:
    return f"default.relay_{uuid.uuid4().hex[:8]}_"


def _catalog(spark: Any, prefix: str) -> dict[str, list[dict[str, Any]]]:
    return {
        t: [r.asDict(recursive=True) for r in spark.table(f"{prefix}{t}").collect()]
        for t in ("events", "entities", "rejects")
    }


def _spool(spark: Any, spool: Path) -> dict[str, list[dict[str, Any]]]:
    return {
        t: [r.asDict(recursive=True) for r in spark.read.format("delta").load(str(spool / t)).collect()]
        for t in ("events", "entities", "rejects")
    }


def _key(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(tuple(str(v) for v in r.values()) for r in rows)


def test_a_stream_with_catalog_tables_is_relayed_after_each_micro_batch_exactly_once(
    spark: Any, namespace_pair: Any, tmp_path: Path
) -> None:
    primary, secondary = namespace_pair.primary, namespace_pair.secondary
    primary.broker.create_queue("orders", QueueSettings(requires_duplicate_detection=True))
    prefix = _prefix()
    opts = source_options(namespace_pair, state_table_prefix=prefix)
    config = ServiceBusConfig.from_options(opts)
    provision_backlog_queues(config, admin_client=secondary.admin_client(), retry_pause=0)
    folder = tmp_path / "in"
    folder.mkdir()
    ckpt = tmp_path / "ckpt"
    healthy = [{"body": f"b{i}", "message_id": f"h{i}"} for i in range(20)]
    bad = {"body": "x", "message_id": "bad", "session_id": "s" * 200}  # a reject
    outage = [{"body": f"o{i}", "message_id": f"o{i}"} for i in range(30)]

    # interval 1 s: a drain woken by the query's first (no-data) progress event, before ``before`` is read, would
    # otherwise hold the one settle() waits for back 30 s
    relay = relay_state(spark, {**opts, "checkpointLocation": str(ckpt)}, timeout=120, interval=1)
    assert isinstance(relay, StateRelay)
    assert relay.spool == f"{ckpt}/servicebus_state"  # the default spool: beside the checkpoint
    query = start_source(spark, folder, ckpt, opts)
    before = relay.drains_started

    def relayed_after_the_first_micro_batch() -> None:
        # The listener wakes the relay's thread after the micro-batch: no explicit drain here.
        assert relay.settle(120, wake=False, after=before)
        assert relay.last_error is None
        first = _catalog(spark, prefix)["events"]
        assert [(e["batch_id"], e["count"]) for e in first if e["event"] == "batch_committed"] == [(0, 21)]

    try:
        healthy_then_outage(
            query, folder, primary, [*healthy, bad], outage, relayed_after_the_first_micro_batch
        )
    finally:
        query.stop()
        relay.stop()  # the last drain
    assert query.exception() is None

    tables = _catalog(spark, prefix)
    events = tables["events"]
    assert sorted((e["batch_id"], e["count"]) for e in events if e["event"] == "batch_committed") == [
        (0, 21),
        (1, 30),
    ]
    assert sum(e["count"] for e in events if e["event"] == "sent") == 20
    assert sum(e["count"] for e in events if e["event"] == "diverted" and e["backlog_queue"]) == 30
    assert [(r["entity"], r["state"]) for r in tables["entities"]] == [("orders", "failed_over")]
    assert [(r["column"], r["batch_id"], r["sink_id"]) for r in tables["rejects"]] == [
        ("session_id", 0, "ds")
    ]
    # The catalog tables hold exactly what the spool holds: nothing lost, nothing twice.
    spool = _spool(spark, ckpt / "servicebus_state")
    for table in ("events", "rejects"):
        assert _key(tables[table]) == _key(spool[table])

    # A new relay (a restart of the user's process) copies nothing again: the drains are checkpointed.
    again = StateRelay(spark, relay.spool, prefix, timeout=120)
    report = again.drain()
    assert report.rows == {"rejects": 0, "events": 0}
    assert _key(_catalog(spark, prefix)["events"]) == _key(events)
    received = {str(m.message_id) for m in drain_messages(primary, "orders")}
    assert received == {r["message_id"] for r in healthy}  # the outage's rows wait in the backlog


def test_a_batch_write_with_catalog_tables_needs_a_spool_and_is_relayed_under_its_job_id(
    spark: Any, namespace_pair: Any, tmp_path: Path
) -> None:
    namespace_pair.primary.broker.create_queue("orders", QueueSettings())
    prefix = _prefix()
    df = (
        spark.range(500).selectExpr("concat('b', id) AS body", "concat('m', id) AS message_id").repartition(2)
    )
    opts = source_options(namespace_pair, state_table_prefix=prefix, job_id="backfill-7")
    with pytest.raises(Exception, match="state_spool") as refused:  # no checkpoint in a batch write
        df.write.format("servicebus").options(**opts).mode("append").save()
    assert "required with state_table_prefix" in str(refused.value)
    assert drain_messages(namespace_pair.primary, "orders") == []  # refused before any send

    spool = tmp_path / "spool"
    opts["state_spool"] = str(spool)
    df.write.format("servicebus").options(**opts).mode("append").save()
    report = relay_state(spark, opts, timeout=120).stop()
    assert report is not None and report.rows["events"] > 0
    events = _catalog(spark, prefix)["events"]
    assert {e["sink_id"] for e in events} == {"ds/backfill-7"}
    assert [(e["batch_id"], e["count"]) for e in events if e["event"] == "batch_committed"] == [(0, 500)]
    assert len(drain_messages(namespace_pair.primary, "orders")) == 500

    # The same job id again: a replay (nothing sent), its replay_skipped row relayed too.
    df.write.format("servicebus").options(**opts).mode("append").save()
    relay_state(spark, opts, timeout=120).stop()
    assert drain_messages(namespace_pair.primary, "orders") == []
    events = _catalog(spark, prefix)["events"]
    assert [(e["sink_id"], e["count"]) for e in events if e["event"] == "replay_skipped"] == [
        ("ds/backfill-7", 500)
    ]
    assert [e["batch_id"] for e in events if e["event"] == "batch_committed"] == [0]


def test_relay_state_names_what_is_missing(spark: Any, namespace_pair: Any) -> None:
    opts = source_options(namespace_pair)
    with pytest.raises(ConfigError, match="'state_table_prefix': required"):
        relay_state(spark, opts)
    with pytest.raises(ConfigError, match="'state_spool': required"):
        relay_state(spark, {**opts, "state_table_prefix": _prefix()})


def test_relay_state_refuses_a_prefix_whose_catalog_or_schema_this_session_lacks_before_anything_runs(
    spark: Any, namespace_pair: Any, tmp_path: Any
) -> None:
    """The README's Databricks example (``main.ops.sb_``) on plain Spark: one line at relay_state(), naming the
    option and what to give instead - not a REQUIRES_SINGLE_PART_NAMESPACE error when the relay exits."""
    opts = {**source_options(namespace_pair), "state_spool": str(tmp_path / "spool")}
    running = len(spark.streams.active)
    with pytest.raises(ConfigError) as refused:
        relay_state(spark, {**opts, "state_table_prefix": "main.ops.sb_"})
    text = str(refused.value)
    assert "'state_table_prefix'" in text and "catalog 'main'" in text and "Unity Catalog" in text
    assert "'ops.sb_'" in text  # what to give on plain Spark
    with pytest.raises(ConfigError, match="schema 'no_such_schema_x' does not exist"):
        relay_state(spark, {**opts, "state_table_prefix": "no_such_schema_x.sb_"})
    assert len(spark.streams.active) == running  # nothing was started
