"""The foreachBatch sink on real Spark (local[2]) against two local namespaces (real SDK, real TCP)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servicebus_local.model import QueueSettings
from spark_sb.admin.provisioning import provision_backlog_queues
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.spark.sink import ServiceBusSink
from spark_sb.syphon.mover import Syphon

pytestmark = pytest.mark.slow

SCHEMA = "body STRING, message_id STRING, session_id STRING, properties MAP<STRING, STRING>"


def _config(pair: Any, **overrides: Any) -> ServiceBusConfig:
    settings: dict[str, Any] = {
        "primary": {"connection_string": pair.primary.connection_string, "namespace_name": "primary"},
        "secondary": {"connection_string": pair.secondary.connection_string},
        "entity": "orders",
        "backlog_queue_count": 2,
        "failover_interval": 0,
        "ping_primary_interval": "1h",
        "send_timeout": "5s",
        "retry": {"total": 0, "backoff_factor": 0.05, "backoff_max": 0.2},
    }
    settings.update(overrides)
    return ServiceBusConfig.from_dict(settings)


def _write(folder: Path, name: str, rows: list[dict[str, Any]]) -> None:
    tmp = folder / f".{name}"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.rename(folder / name)


def _drain(ns: Any, entity: str) -> list[Any]:
    from azure.servicebus import ServiceBusClient, ServiceBusReceiveMode

    out: list[Any] = []
    with (
        ServiceBusClient.from_connection_string(ns.connection_string) as client,
        client.get_queue_receiver(entity, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver,
    ):
        while batch := receiver.receive_messages(max_message_count=200, max_wait_time=0.5):
            out.extend(batch)
    return out


def _run_stream(spark: Any, sb_sink: ServiceBusSink, folder: Path, ckpt: Path, files: list[Any]) -> None:
    query = (
        spark.readStream.schema(SCHEMA)
        .json(str(folder))
        .writeStream.foreachBatch(sb_sink)
        .option("checkpointLocation", str(ckpt))
        .start()
    )
    try:
        for write in files:
            write()
            query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None


def test_stream_sends_every_row_and_records_rejects(spark: Any, namespace_pair: Any, tmp_path: Path) -> None:
    namespace_pair.primary.broker.create_queue("orders", QueueSettings())
    sb_sink = ServiceBusSink(_config(namespace_pair))
    folder = tmp_path / "in"
    folder.mkdir()
    good = [{"body": f"b{i}", "message_id": f"m{i}", "properties": {"k": str(i)}} for i in range(40)]
    bad = {"body": "x", "message_id": "bad", "session_id": "s" * 200}  # session id > 128 chars: a reject
    _run_stream(spark, sb_sink, folder, tmp_path / "ckpt", [lambda: _write(folder, "a.json", [*good, bad])])

    received = _drain(namespace_pair.primary, "orders")
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
    config = _config(namespace_pair)
    provision_backlog_queues(config, admin_client=secondary.admin_client(), retry_pause=0)
    sb_sink = ServiceBusSink(config)
    folder = tmp_path / "in"
    folder.mkdir()
    rows = [{"body": f"b{i}", "message_id": f"m{i}"} for i in range(30)]

    def outage_batch() -> None:
        primary.faults.fail_sends("orders", "amqp:resource-limit-exceeded")  # the primary entity is full
        _write(folder, "a.json", rows)

    _run_stream(spark, sb_sink, folder, tmp_path / "ckpt", [outage_batch])
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
    received = _drain(primary, "orders")
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
    sb_sink = ServiceBusSink(_config(namespace_pair))
    df = spark.createDataFrame([("hello", "m1", None, None)], SCHEMA)
    with caplog.at_level("ERROR", logger="spark_sb.spark.sink"), pytest.raises(Exception) as failed:
        sb_sink(df, 0)
    text = str(failed.value)
    assert text.splitlines()[0].startswith("ServiceBusConfigError: Service Bus refused the send"), text[:300]
    assert "unauthorized" in text.splitlines()[0] and len(text.splitlines()) == 1
    assert failed.value.__cause__ is not None  # Spark's own error, with the executor's trace
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        f"sink {sb_sink.sink_id} batch 0 failed: {text}"
    ]
