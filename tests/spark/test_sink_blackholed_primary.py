"""A Spark task never hangs on a dead namespace (SPEC B3, R1): the primary accepts TCP and never answers SASL -
the unmodified SDK would wait forever - and the micro-batch still finishes, every row diverted to the backlog."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from servicebus_local.model import QueueSettings
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.spark.sink import ServiceBusSink

pytestmark = pytest.mark.slow


def test_a_blackholed_primary_diverts_instead_of_hanging_the_task(
    spark: Any, namespace_pair: Any, tmp_path: Path
) -> None:
    pair = namespace_pair
    pair.primary.broker.create_queue("orders", QueueSettings())
    for i in range(2):
        pair.secondary.broker.create_queue(f"primary/x-servicebus-transfer/{i}", QueueSettings())
    config = ServiceBusConfig.from_dict(
        {
            "primary": {"connection_string": pair.primary.connection_string, "namespace_name": "primary"},
            "secondary": {"connection_string": pair.secondary.connection_string},
            "entity": "orders",
            "backlog_queue_count": 2,
            "failover_interval": "2s",
            "ping_primary_interval": "1h",
            # the defaults otherwise: send_timeout 30 s, 3 SDK retries - the deadline does not depend on them
        }
    )
    pair.primary.faults.stall(True, answer_sasl=False)
    folder = tmp_path / "in"
    folder.mkdir()
    rows = [{"body": f"b{i}", "message_id": f"m{i}"} for i in range(30)]
    (folder / "a.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sb_sink = ServiceBusSink(config)
    query = (
        spark.readStream.schema("body STRING, message_id STRING")
        .json(str(folder))
        .writeStream.foreachBatch(sb_sink)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .start()
    )
    started = time.monotonic()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    took = time.monotonic() - started
    assert query.exception() is None
    assert took < 30, f"the micro-batch took {took:.1f} s"
    outcome = sb_sink.last_outcome
    assert outcome is not None and outcome.total_sent == 0 and outcome.total_diverted == 30
    in_backlog = sum(
        pair.secondary.broker.counts(f"primary/x-servicebus-transfer/{i}").active_message_count
        for i in range(2)
    )
    assert in_backlog == 30
