"""Failover learned across executors, on ``local-cluster[2,1,1024]`` (two executor JVMs); prints a JSON report.

Run by ``tests/spark/test_cluster.py`` in a child process (a process holds one SparkContext; the test session
already has one). The primary entity is full for the whole run. Batch 0 (one file, one task) waits
``failover_interval`` on one executor and fails over; batch 1 (two files, two tasks, one core per executor) runs
on both executors: through the entity table, the executor that never saw the outage starts failed over.

Usage (from the repository root): ``python -m tests.spark.cluster_handoff <work dir>``
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

INTERVAL = 8.0


def main(work: Path) -> dict[str, Any]:
    import pyspark

    from spark_sb.config import ServiceBusConfig
    from spark_sb.local.model import QueueSettings
    from spark_sb.local.server import LocalNamespace
    from spark_sb.provisioning import provision_backlog_queues
    from spark_sb.session import build_spark_session
    from spark_sb.sink import ServiceBusSink
    from tests.spark.connect_stream import _drain, _write

    root = str(Path(__file__).resolve().parents[2])
    primary = LocalNamespace("primary").start()
    secondary = LocalNamespace("secondary").start()
    spark_work = Path(pyspark.__file__).parent / "work"
    before = set(spark_work.iterdir()) if spark_work.exists() else set()
    try:
        primary.broker.create_queue("orders", QueueSettings())
        config = ServiceBusConfig.from_dict(
            {
                "primary": {"connection_string": primary.connection_string, "namespace_name": "primary"},
                "secondary": {"connection_string": secondary.connection_string},
                "entity": "orders",
                "backlog_queue_count": 2,
                "failover_interval": INTERVAL,
                "ping_primary_interval": "1h",
                "send_timeout": "5s",
                "retry": {"total": 0, "backoff_factor": 0.05, "backoff_max": 0.2},
                "state_location": str(work / "state"),
            }
        )
        provision_backlog_queues(config, admin_client=secondary.admin_client(), retry_pause=0)
        primary.faults.fail_sends("orders", "amqp:resource-limit-exceeded")
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        spark = build_spark_session(
            "spark-sb-cluster",
            "local-cluster[2,1,1024]",
            {"spark.executorEnv.PYTHONPATH": root, "spark.executorEnv.SPARK_LOCAL_IP": "127.0.0.1"},
        )
        seen: list[list[dict[str, Any]]] = []
        try:
            sb_sink = ServiceBusSink(config)
            folder = work / "in"
            folder.mkdir()
            rows = [[{"body": f"{f}-{i}", "message_id": f"{f}-{i}"} for i in range(10)] for f in range(3)]
            query = (
                spark.readStream.schema("body STRING, message_id STRING")
                .json(str(folder))
                .writeStream.foreachBatch(sb_sink)
                .option("checkpointLocation", str(work / "ckpt"))
                .start()
            )
            try:
                for files in ((0,), (1, 2)):
                    for f in files:
                        _write(folder, f"{f}.json", rows[f])
                    query.processAllAvailable()
                    # The batch's state writes (a Delta commit: a Spark job whose task takes an executor's only
                    # core) are done before the next batch, so that its two tasks find both executors free.
                    sb_sink.flush()
                    seen.append(
                        [
                            {
                                "pid": r.pid,
                                "elapsed": r.outcome.elapsed,
                                "diverted": r.outcome.total_diverted,
                                "sent": r.outcome.total_sent,
                                "failing": sum(
                                    1 for t in r.outcome.transitions if t.to_state.value == "failing"
                                ),
                            }
                            for r in sb_sink.last_results
                        ]
                    )
            finally:
                query.stop()
            error = query.exception()
            sb_sink.flush()  # before spark.stop(): the state writes need the session
        finally:
            spark.stop()
        backlog = sorted(
            mid
            for q in config.backlog_queue_names("primary")
            for mid in _drain(secondary.connection_string, q)
        )
        return {
            "error": None if error is None else str(error)[:2000],
            "interval": INTERVAL,
            "batches": seen,
            "backlog": backlog,
            "expected": sorted(r["message_id"] for f in rows for r in f),
        }
    finally:
        secondary.stop()
        primary.stop()
        if spark_work.exists():  # per-run folders with copies of the jars (hundreds of MB)
            for run in set(spark_work.iterdir()) - before:
                shutil.rmtree(run, ignore_errors=True)


if __name__ == "__main__":
    report = main(Path(sys.argv[1]))
    print(json.dumps(report, default=str))
