"""The ``servicebus`` data source (``format("servicebus")``) on real Spark (local[2]) and real Delta, against two
local namespaces (real SDK, real TCP): a stream through a primary outage, a batch write, a replayed micro-batch,
rejects, options refused before anything is sent. The same stream under Spark Connect, with catalog state tables
through the relay, is in ``test_connect.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servicebus_local.model import QueueSettings
from spark_sb.admin.provisioning import provision_backlog_queues
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.syphon.mover import Syphon

from .streams import drain_messages, healthy_then_outage, source_options, start_source, write_rows

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("registered")]


def _tables(spark: Any, state: Path) -> dict[str, list[dict[str, Any]]]:
    return {
        t: [r.asDict(recursive=True) for r in spark.read.format("delta").load(str(state / t)).collect()]
        for t in ("events", "entities", "rejects")
    }


def test_stream_through_a_primary_outage_diverts_records_and_the_syphon_restores_all(
    spark: Any, namespace_pair: Any, tmp_path: Path
) -> None:
    primary, secondary = namespace_pair.primary, namespace_pair.secondary
    primary.broker.create_queue("orders", QueueSettings(requires_duplicate_detection=True))
    state = tmp_path / "state"
    opts = source_options(namespace_pair, state)
    config = ServiceBusConfig.from_options(opts)
    provision_backlog_queues(config, admin_client=secondary.admin_client(), retry_pause=0)
    folder = tmp_path / "in"
    folder.mkdir()
    healthy = [{"body": f"b{i}", "message_id": f"h{i}"} for i in range(20)]
    bad = {"body": "x", "message_id": "bad", "session_id": "s" * 200}  # session id > 128 chars: a reject
    outage = [{"body": f"o{i}", "message_id": f"o{i}"} for i in range(30)]

    query = start_source(spark, folder, tmp_path / "ckpt", opts)
    try:
        healthy_then_outage(
            query, folder, primary, [*healthy, bad], outage
        )  # then the primary entity is full
    finally:
        query.stop()
    assert query.exception() is None

    tables = _tables(spark, state)
    events = tables["events"]
    commits = sorted((e["batch_id"], e["count"]) for e in events if e["event"] == "batch_committed")
    assert commits == [(0, 21), (1, 30)]
    assert all(e["sink_id"] == "ds" for e in events)
    assert sum(e["count"] for e in events if e["event"] == "sent") == 20
    assert sum(e["count"] for e in events if e["event"] == "diverted" and e["backlog_queue"]) == 30
    assert [(e["from_state"], e["to_state"]) for e in events if e["event"] == "state_change"] == [
        ("healthy", "failing"),
        ("failing", "failed_over"),
    ]
    assert [(r["entity"], r["state"]) for r in tables["entities"]] == [("orders", "failed_over")]
    assert [(r["column"], r["batch_id"], r["sink_id"]) for r in tables["rejects"]] == [
        ("session_id", 0, "ds")
    ]
    assert json.loads(tables["rejects"][0]["row_json"])["message_id"] == "bad"

    primary.faults.clear()
    with Syphon(config) as syphon:
        moved = syphon.drain_all(max_wait=0.5)
    assert moved.forwarded == {"orders": 30}
    received = [str(m.message_id) for m in drain_messages(primary, "orders")]
    assert sorted(received) == sorted(r["message_id"] for r in healthy + outage)  # 0 lost, no duplicates


def test_batch_write_of_10000_rows_is_recorded_under_its_own_job_id(
    spark: Any, namespace_pair: Any, tmp_path: Path
) -> None:
    namespace_pair.primary.broker.create_queue("orders", QueueSettings())
    state = tmp_path / "state"
    df = (
        spark.range(10_000)
        .selectExpr("concat('b', id) AS body", "concat('m', id) AS message_id")
        .repartition(2)
    )
    opts = source_options(namespace_pair, state, job_id="backfill-1")
    df.write.format("servicebus").options(**opts).mode("append").save()

    received = {str(m.message_id) for m in drain_messages(namespace_pair.primary, "orders")}
    assert received == {f"m{i}" for i in range(10_000)}
    events = _tables(spark, state)["events"]
    assert {e["sink_id"] for e in events} == {"ds/backfill-1"}
    assert [(e["batch_id"], e["count"]) for e in events if e["event"] == "batch_committed"] == [(0, 10_000)]
    assert sum(e["count"] for e in events if e["event"] == "sent") == 10_000

    # The same job id again: a replay of a committed write, nothing sent. Another job id: sent, recorded apart.
    df.write.format("servicebus").options(**opts).mode("append").save()
    assert drain_messages(namespace_pair.primary, "orders") == []
    spark.range(3).selectExpr("concat('c', id) AS body").write.format("servicebus").options(
        **source_options(namespace_pair, state)
    ).mode("append").save()
    assert len(drain_messages(namespace_pair.primary, "orders")) == 3
    events = _tables(spark, state)["events"]
    assert [(e["sink_id"], e["count"]) for e in events if e["event"] == "replay_skipped"] == [
        ("ds/backfill-1", 10_000)
    ]
    (job,) = {e["sink_id"] for e in events} - {"ds/backfill-1"}
    assert job.startswith("ds/write-")


def test_a_replayed_micro_batch_is_skipped_and_recorded(
    spark: Any, namespace_pair: Any, tmp_path: Path
) -> None:
    namespace_pair.primary.broker.create_queue(
        "orders", QueueSettings()
    )  # no duplicate detection: a resend shows
    state = tmp_path / "state"
    opts = source_options(namespace_pair, state)
    folder = tmp_path / "in"
    folder.mkdir()
    ckpt = tmp_path / "ckpt"
    write_rows(folder, "0.json", [{"body": f"b{i}", "message_id": f"m{i}"} for i in range(10)])
    query = start_source(spark, folder, ckpt, opts)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert len(drain_messages(namespace_pair.primary, "orders")) == 10

    # The driver died after the data source's commit, before Spark wrote the batch to the checkpoint's commit log.
    for name in ("0", ".0.crc"):
        (ckpt / "commits" / name).unlink(missing_ok=True)
    query = start_source(spark, folder, ckpt, opts)
    try:
        query.processAllAvailable()
        write_rows(folder, "1.json", [{"body": "n", "message_id": "n1"}])
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None
    assert [str(m.message_id) for m in drain_messages(namespace_pair.primary, "orders")] == ["n1"]
    events = _tables(spark, state)["events"]
    assert [(e["batch_id"], e["count"]) for e in events if e["event"] == "replay_skipped"] == [(0, 10)]
    assert sorted(e["batch_id"] for e in events if e["event"] == "batch_committed") == [0, 1]


def test_on_reject_fail_aborts_the_micro_batch(spark: Any, namespace_pair: Any, tmp_path: Path) -> None:
    namespace_pair.primary.broker.create_queue("orders", QueueSettings())
    state = tmp_path / "state"
    folder = tmp_path / "in"
    folder.mkdir()
    write_rows(folder, "0.json", [{"body": "x", "message_id": "bad", "session_id": "s" * 200}])
    query = start_source(
        spark, folder, tmp_path / "ckpt", source_options(namespace_pair, state, on_reject="fail")
    )
    with pytest.raises(Exception, match="RejectedRowsError") as failed:
        query.processAllAvailable()
    query.stop()
    assert "session_id" in str(failed.value)
    events = _tables(spark, state)["events"]
    assert [e for e in events if e["event"] == "batch_committed"] == []


@pytest.mark.parametrize(
    ("extra", "mode", "expected"),
    [
        (
            {"failover_intervall": "5s"},
            "append",
            "option 'failover_intervall': unknown option \\(did you mean 'failover_interval'",
        ),
        ({"failover_interval": "soon"}, "append", "option 'failover_interval'"),
        ({"on_reject": "drop"}, "append", "option 'on_reject': .*'record', 'fail'"),
        ({"entity": None}, "append", "option 'entity': required"),
        ({}, "overwrite", "option 'mode': 'overwrite' is not supported; valid: append"),
        ({"ordering": "session"}, "append", "option 'ordering': applies to streams"),  # a batch write
        (
            {"ordering": "session", "state_location": None},
            "append",
            "option 'ordering': 'session' needs the state tables",
        ),
        (
            {"ordering": "session", "state_location": None, "state_table_prefix": "main.sb."},
            "append",
            "option 'ordering' with option 'state_table_prefix'.*use state_location",
        ),
        (
            {"state_spool": "/spool"},  # beside state_location
            "append",
            "option 'state_spool': applies with state_table_prefix only",
        ),
    ],
)
def test_bad_options_are_refused_before_any_send(
    spark: Any, namespace_pair: Any, tmp_path: Path, extra: dict[str, Any], mode: str, expected: str
) -> None:
    namespace_pair.primary.broker.create_queue("orders", QueueSettings())
    opts = {
        k: v
        for k, v in {**source_options(namespace_pair, tmp_path / "state"), **extra}.items()
        if v is not None
    }
    df = spark.createDataFrame([("b", "m1")], "body STRING, message_id STRING")
    with pytest.raises(Exception, match=expected):
        df.write.format("servicebus").options(**opts).mode(mode).save()
    assert drain_messages(namespace_pair.primary, "orders") == []


def test_a_streaming_schema_error_names_the_column(spark: Any, namespace_pair: Any, tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    write_rows(folder, "0.json", [{"payload": "x"}])
    query = (
        spark.readStream.schema("payload STRING")
        .json(str(folder))
        .writeStream.format("servicebus")
        .options(**source_options(namespace_pair))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .start()
    )
    with pytest.raises(Exception, match="body"):
        query.processAllAvailable()
    query.stop()
