"""A stream whose rows name 200 entities, through a primary namespace outage, on ``local-cluster[2,1,1024]``
(two executor JVMs); prints a JSON report (SPEC F1, F2, issue 20).

Run by ``tests/spark/test_cluster.py`` in a child process (a process holds one SparkContext). Batch 0 (one file)
goes to the healthy primary: 200 links on one connection per executor process. Then the primary refuses and drops
connections. Batch 1 (two files, two tasks, one per executor) diverts every row: each task costs about
``failover_interval``, not 200 times it.

Usage (from the repository root): ``python -m tests.spark.cluster_fanout <work dir>``
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

INTERVAL = 4.0
ENTITIES = [f"tenant-{i:03d}" for i in range(200)]


def main(work: Path) -> dict[str, Any]:
    import pyspark

    from spark_sb.config import ServiceBusConfig
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
        for name in ENTITIES:
            primary.broker.create_queue(name)
        config = ServiceBusConfig.from_dict(
            {
                "primary": {"connection_string": primary.connection_string, "namespace_name": "primary"},
                "secondary": {"connection_string": secondary.connection_string},
                "backlog_queue_count": 2,
                "failover_interval": INTERVAL,
                "ping_primary_interval": "1h",
                "send_timeout": "10s",
                "retry": {"total": 0, "backoff_factor": 0.05, "backoff_max": 0.2},
                "state_location": str(work / "state"),
            }
        )
        provision_backlog_queues(config, admin_client=secondary.admin_client(), retry_pause=0)
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        spark = build_spark_session(
            "spark-sb-cluster-fanout",
            "local-cluster[2,1,1024]",
            {"spark.executorEnv.PYTHONPATH": root, "spark.executorEnv.SPARK_LOCAL_IP": "127.0.0.1"},
        )
        seen: list[list[dict[str, Any]]] = []
        peaks: list[int] = []
        try:
            sb_sink = ServiceBusSink(config)
            folder = work / "in"
            folder.mkdir()
            rows = [
                [
                    {"body": f"{f}-{j}-{e}", "message_id": f"{f}-{j}-{e}", "entity": e}
                    for j in range(2)
                    for e in ENTITIES
                ]
                for f in range(3)
            ]
            query = (
                spark.readStream.schema("body STRING, message_id STRING, entity STRING")
                .json(str(folder))
                .writeStream.foreachBatch(sb_sink)
                .option("checkpointLocation", str(work / "ckpt"))
                .start()
            )
            try:
                for files in ((0,), (1, 2)):
                    if files == (1, 2):  # the outage: every connection refused, the live ones dropped
                        peaks.append(primary.counters()["connections_peak"])
                        primary.faults.refuse_connections()
                        primary.faults.drop_connections()
                    for f in files:
                        _write(folder, f"{f}.json", rows[f])
                    query.processAllAvailable()
                    seen.append(
                        [
                            {
                                "pid": r.pid,
                                "elapsed": r.outcome.elapsed,
                                "diverted": r.outcome.total_diverted,
                                "sent": r.outcome.total_sent,
                                "rejected": r.outcome.total_rejected,
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
        on_primary = sum(primary.broker.counts(e).active_message_count for e in ENTITIES)
        return {
            "error": None if error is None else str(error)[:2000],
            "interval": INTERVAL,
            "entities": len(ENTITIES),
            "batches": seen,
            "connections_peak_before_outage": peaks[0] if peaks else None,
            "on_primary": on_primary,
            "backlog": backlog,
            "expected_backlog": sorted(r["message_id"] for f in (1, 2) for r in rows[f]),
            "expected_primary": len(rows[0]),
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
