"""The foreachBatch sink on real Spark (local[2]) against two local namespaces (real SDK, real TCP)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servicebus_local.model import QueueSettings
from spark_sb.admin.provisioning import provision_backlog_queues
from spark_sb.spark.sink import ServiceBusSink
from spark_sb.syphon.mover import Syphon

from .streams import SINK_SCHEMA, drain_messages, run_sink_stream, sink_config, write_rows

pytestmark = pytest.mark.slow


def test_stream_sends_every_row_and_records_rejects(spark: Any, namespace_pair: Any, tmp_path: Path) -> None:
    namespace_pair.primary.broker.create_queue("orders", QueueSettings())
    sb_sink = ServiceBusSink(sink_config(namespace_pair))
    folder = tmp_path / "in"
    folder.mkdir()
    good = [{"body": f"b{i}", "message_id": f"m{i}", "properties": {"k": str(i)}} for i in range(40)]
    bad = {"body": "x", "message_id": "bad", "session_id": "s" * 200}  # session id > 128 chars: a reject
    run_sink_stream(
        spark, sb_sink, folder, tmp_path / "ckpt", [lambda: write_rows(folder, "a.json", [*good, bad])]
    )

    received = drain_messages(namespace_pair.primary, "orders")
    assert sorted(str(m.message_id) for m in received) == sorted(r["message_id"] for r in good)
    by_id = {str(m.message_id): m for m in received}
    assert str(by_id["m7"]) == "b7" and by_id["m7"].application_properties[b"k"] == b"7"
    assert sb_sink.total.total_sent == 40
    assert sb_sink.total.total_rejected == 1  # totals keep counts only (a bounded driver)
    assert sb_sink.last_outcome is not None
    assert [r.field for r in sb_sink.last_outcome.rejects] == ["session_id"]
    assert '"message_id": "bad"' in sb_sink.last_outcome.rejects[0].row_json.replace('":"', '": "')


def test_outage_diverts_to_backlog_and_syphon_restores_all(
    spark: Any, namespace_pair: Any, tmp_path: Path
) -> None:
    primary, secondary = namespace_pair.primary, namespace_pair.secondary
    primary.broker.create_queue("orders", QueueSettings(requires_duplicate_detection=True))
    config = sink_config(namespace_pair)
    provision_backlog_queues(config, admin_client=secondary.admin_client(), retry_pause=0)
    sb_sink = ServiceBusSink(config)
    folder = tmp_path / "in"
    folder.mkdir()
    rows = [{"body": f"b{i}", "message_id": f"m{i}"} for i in range(30)]

    def outage_batch() -> None:
        primary.faults.fail_sends("orders", "amqp:resource-limit-exceeded")  # the primary entity is full
        write_rows(folder, "a.json", rows)

    run_sink_stream(spark, sb_sink, folder, tmp_path / "ckpt", [outage_batch])
    assert sb_sink.total.total_sent == 0
    assert sb_sink.total.total_diverted == 30
    assert set(sb_sink.total.diverted) <= {
        "primary/x-servicebus-transfer/0",
        "primary/x-servicebus-transfer/1",
    }

    primary.faults.clear()
    with Syphon(config) as syphon:
        moved = syphon.drain_all(max_wait=0.5)
    assert moved.forwarded == {"orders": 30}
    received = drain_messages(primary, "orders")
    assert sorted(str(m.message_id) for m in received) == sorted(r["message_id"] for r in rows)


def test_a_refused_key_fails_the_batch_with_the_librarys_line_first(
    spark: Any, namespace_pair: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 32 item 2: the executor's ServiceBusConfigError names what to change; the driver raises it as the
    error's first line (Spark's trace is its cause) and logs it once, instead of a 5 KB py4j trace ending in it."""
    namespace_pair.primary.broker.create_queue("orders")
    namespace_pair.primary.faults.fail_sends(
        "orders", "amqp:unauthorized-access"
    )  # the key lacks the Send right
    sb_sink = ServiceBusSink(sink_config(namespace_pair))
    df = spark.createDataFrame([("hello", "m1", None, None)], SINK_SCHEMA)
    with caplog.at_level("ERROR", logger="spark_sb.spark.sink"), pytest.raises(Exception) as failed:
        sb_sink(df, 0)
    text = str(failed.value)
    assert text.splitlines()[0].startswith("ServiceBusConfigError: Service Bus refused the send"), text[:300]
    assert "unauthorized" in text.splitlines()[0] and len(text.splitlines()) == 1
    assert failed.value.__cause__ is not None  # Spark's own error, with the executor's trace
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        f"sink {sb_sink.sink_id} batch 0 failed: {text}"
    ]


@pytest.mark.parametrize("local_namespace_tier", ["premium"])
def test_premium_large_rows_go_alone_healthy_diverted_and_moved_back(
    spark: Any, namespace_pair: Any, tmp_path: Path
) -> None:
    """SPEC B13 through the sink: Premium namespaces (1 MB batches on the link), ``orders`` taking 20 MiB, the
    backlog queues as ``provision`` makes them; a micro-batch of small rows with 1.5 MB, 5 MB and 20 MB ones reaches
    the healthy primary whole, the same during an outage goes to the backlog, and the syphon moves it back."""
    from spark_sb.admin.report import backlog_spec_for

    primary, secondary = namespace_pair.primary, namespace_pair.secondary
    primary.broker.create_queue("orders", QueueSettings(max_message_size_in_kilobytes=20_480))
    # a 20 MB send on a loaded 2-core machine outlasted the file's 5 s send_timeout (the sink then diverted it, as
    # it should an ambiguous send): this test is about sizes, so its sends get a minute
    config = sink_config(namespace_pair, max_message_size=20 * 1024 * 1024, send_timeout="60s")
    provision_backlog_queues(
        config, admin_client=secondary.admin_client(), retry_pause=0, spec=backlog_spec_for([20_480])
    )
    sb_sink = ServiceBusSink(config)
    folder = tmp_path / "in"
    folder.mkdir()

    def rows(prefix: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [
            {"body": f"{prefix}{i}", "message_id": f"{prefix}{i}"} for i in range(20)
        ]
        for k, size in enumerate((1_500_000, 5_000_000, 20_000_000)):
            out.insert(5 * k + 2, {"body": chr(65 + k) * size, "message_id": f"{prefix}-large-{k}"})
        return out

    def outage_batch() -> None:
        primary.faults.fail_sends("orders", "amqp:resource-limit-exceeded")
        write_rows(folder, "b.json", rows("d"))

    run_sink_stream(
        spark,
        sb_sink,
        folder,
        tmp_path / "ckpt",
        [lambda: write_rows(folder, "a.json", rows("h")), outage_batch],
    )
    assert (sb_sink.total.total_sent, sb_sink.total.total_diverted, sb_sink.total.total_rejected) == (
        23,
        23,
        0,
    )
    healthy = {str(m.message_id): len(str(m)) for m in drain_messages(primary, "orders")}
    assert healthy == {r["message_id"]: len(r["body"]) for r in rows("h")}
    primary.faults.clear()
    with Syphon(config) as syphon:
        moved = syphon.drain_all(max_wait=0.5)
    assert moved.forwarded == {"orders": 23}, moved.errors
    back = {str(m.message_id): len(str(m)) for m in drain_messages(primary, "orders")}
    assert back == {r["message_id"]: len(r["body"]) for r in rows("d")}
