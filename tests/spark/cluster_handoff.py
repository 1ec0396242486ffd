"""Failover learned across executors, on ``local-cluster[2,1,1024]`` (two executor JVMs); prints a JSON report.

Run by ``tests/spark/test_cluster.py`` through ``cluster_runs.py``, in a child process (a process holds one
SparkContext; the test session already has one). The primary entity is full for the whole run. Batch 0 (one file, one
task) waits ``failover_interval`` on one executor and fails over; batch 1 (two files, two tasks, one core per executor)
runs on both executors: through the entity table, the executor that never saw the outage starts failed over.

Usage (from the repository root): ``python -m tests.spark.cluster_handoff <work dir>``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

INTERVAL = 8.0


def main(work: Path) -> dict[str, Any]:
    """The scenario in a local cluster of its own."""
    from tests.spark.cluster_harness import cluster_session, spark_work_cleaned

    with spark_work_cleaned():
        spark = cluster_session("spark-sb-cluster")
        try:
            return run(work, spark)
        finally:
            spark.stop()


def run(work: Path, spark: Any) -> dict[str, Any]:
    """The scenario in ``spark`` (a ``cluster_session``; ``cluster_runs.py`` runs every cluster scenario in one)."""
    from servicebus_local.model import QueueSettings
    from spark_sb.admin.provisioning import provision_backlog_queues
    from spark_sb.config.service_bus import ServiceBusConfig
    from spark_sb.spark.sink import ServiceBusSink
    from tests.spark.cluster_harness import run_batches, two_namespaces
    from tests.spark.streams import drain_ids

    with two_namespaces() as (primary, secondary):
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
        rows = [[{"body": f"{f}-{i}", "message_id": f"{f}-{i}"} for i in range(10)] for f in range(3)]
        seen, error = run_batches(
            spark, ServiceBusSink(config), "body STRING, message_id STRING", work, rows, ((0,), (1, 2))
        )
        backlog = sorted(
            mid
            for q in config.backlog_queue_names("primary")
            for mid in drain_ids(secondary.connection_string, q)
        )
        return {
            "error": error,
            "interval": INTERVAL,
            "batches": seen,
            "backlog": backlog,
            "expected": sorted(r["message_id"] for f in rows for r in f),
        }


if __name__ == "__main__":
    report = main(Path(sys.argv[1]))
    print(json.dumps(report, default=str))
