"""Where a sink's counts (sent, diverted, rejected) are seen (issue 32 item 3), on real Spark (local[2]) and real
Delta against two local namespaces: ``sink.summary()``, the events table read back (``batch_counts``,
``summary(spark)``), for the ``foreachBatch`` sink and ``format("servicebus")`` - and not in Structured Streaming's
query progress, which has no place a Python sink can fill (see the comment above ``batch_counts`` in
``spark_sb/spark/sink.py``). The progress checks fail when a Spark version starts carrying such counts: then use
that route."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servicebus_local.model import QueueSettings
from spark_sb import register
from spark_sb.admin.provisioning import provision_backlog_queues
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.spark.sink import ServiceBusSink, batch_counts

from .streams import SINK_SCHEMA, healthy_then_outage, sink_config, source_options, start_source

pytestmark = pytest.mark.slow

HEALTHY = [{"body": f"b{i}", "message_id": f"h{i}"} for i in range(10)]
BAD = {"body": "x", "message_id": "bad", "session_id": "s" * 200}  # session id > 128 characters: a reject
OUTAGE = [{"body": f"o{i}", "message_id": f"o{i}"} for i in range(5)]
#: (batch_id, rows, sent, diverted, rejected) of the two micro-batches: healthy plus a bad row, then an outage.
EXPECTED = [(0, 11, 10, 0, 1), (1, 5, 0, 5, 0)]


def _counts(spark: Any, config: ServiceBusConfig, sink_id: str) -> list[tuple[int, int, int, int, int]]:
    return [
        (r["batch_id"], r["rows"], r["sent"], r["diverted"], r["rejected"])
        for r in batch_counts(spark, config, sink_id).collect()
    ]


def _assert_progress_carries_no_sink_counts(query: Any, observed: set[str]) -> None:
    """What Spark reports per micro-batch: rows read, the user's own observations; nothing a Python sink did."""
    batches = [p for p in query.recentProgress if p.numInputRows > 0]
    assert [p.numInputRows for p in batches] == [11, 5]
    for p in batches:
        assert p.sink.metrics == {}, (
            f"Spark now reports sink metrics: {p.sink.metrics}; carry the counts there"
        )
        assert set(p.observedMetrics) == observed


def test_foreach_batch_counts_are_in_the_summary_and_the_events_table(
    spark: Any, namespace_pair: Any, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    primary, secondary = namespace_pair.primary, namespace_pair.secondary
    primary.broker.create_queue("orders", QueueSettings())
    config = sink_config(namespace_pair, state_location=str(tmp_path / "state"))
    provision_backlog_queues(config, admin_client=secondary.admin_client(), retry_pause=0)
    sb_sink = ServiceBusSink(config)
    folder = tmp_path / "in"
    folder.mkdir()
    # an observation of the input: it is reported, but it counts rows before the sink sent anything
    df = (
        spark.readStream.schema(SINK_SCHEMA)
        .json(str(folder))
        .observe("input", F.count(F.lit(1)).alias("rows"))
    )
    query = df.writeStream.foreachBatch(sb_sink).option("checkpointLocation", str(tmp_path / "ckpt")).start()
    try:
        healthy_then_outage(query, folder, primary, [*HEALTHY, BAD], OUTAGE)
    finally:
        query.stop()
    assert query.exception() is None

    assert sb_sink.summary() == (
        "sink primary/orders: 2 batches, 16 rows: 10 sent, 5 diverted, 1 rejected "
        "(longer than 128 characters (200): 1)"
    )
    assert sb_sink.summary(spark) == sb_sink.summary()  # flushed, then read back from the tables
    assert _counts(spark, config, sb_sink.sink_id) == EXPECTED
    _assert_progress_carries_no_sink_counts(query, {"input"})
    assert [p.observedMetrics["input"]["rows"] for p in query.recentProgress if p.numInputRows] == [11, 5]


def test_data_source_counts_are_in_the_events_table(spark: Any, namespace_pair: Any, tmp_path: Path) -> None:
    primary, secondary = namespace_pair.primary, namespace_pair.secondary
    primary.broker.create_queue("orders", QueueSettings())
    register(spark)
    opts = source_options(namespace_pair, tmp_path / "state")
    config = ServiceBusConfig.from_options(opts)
    provision_backlog_queues(config, admin_client=secondary.admin_client(), retry_pause=0)
    folder = tmp_path / "in"
    folder.mkdir()
    query = start_source(spark, folder, tmp_path / "ckpt", opts)
    try:
        healthy_then_outage(query, folder, primary, [*HEALTHY, BAD], OUTAGE)
    finally:
        query.stop()
    assert query.exception() is None

    assert _counts(spark, config, "ds") == EXPECTED
    assert ServiceBusSink(config).summary(spark) == (
        "sink ds: 2 batches, 16 rows: 10 sent, 5 diverted, 1 rejected (longer than 128 characters (200): 1)"
    )
    _assert_progress_carries_no_sink_counts(query, set())
    # the sink's numOutputRows is the rows handed to the writer, whatever became of them
    assert [p.sink.numOutputRows for p in query.recentProgress if p.numInputRows] == [11, 5]
