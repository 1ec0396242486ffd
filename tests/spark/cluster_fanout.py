"""A stream whose rows name 200 entities, through a primary namespace outage, on ``local-cluster[2,1,1024]``
(two executor JVMs); prints a JSON report (SPEC F1, F2, issue 20).

Run by ``tests/spark/test_cluster.py`` through ``cluster_runs.py``, in a child process (a process holds one
SparkContext). Batch 0 (one file) goes to the healthy primary: 200 links on one connection per executor process. Then
the primary refuses and drops connections. Batch 1 (two files, two tasks, one per executor) diverts every row: each task
costs about ``failover_interval``, not 200 times it.

Usage (from the repository root): ``python -m tests.spark.cluster_fanout <work dir>``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

INTERVAL = 4.0
ENTITIES = [f"tenant-{i:03d}" for i in range(200)]


def main(work: Path) -> dict[str, Any]:
    """The scenario in a local cluster of its own."""
    from tests.spark.cluster_harness import cluster_session, spark_work_cleaned

    with spark_work_cleaned():
        spark = cluster_session("spark-sb-cluster-fanout")
        try:
            return run(work, spark)
        finally:
            spark.stop()


def run(work: Path, spark: Any) -> dict[str, Any]:
    """The scenario in ``spark`` (a ``cluster_session``; ``cluster_runs.py`` runs every cluster scenario in one)."""
    from spark_sb.admin.provisioning import provision_backlog_queues
    from spark_sb.config.service_bus import ServiceBusConfig
    from spark_sb.spark.sink import ServiceBusSink
    from tests.spark.cluster_harness import run_batches, two_namespaces
    from tests.spark.streams import drain_ids

    with two_namespaces() as (primary, secondary):
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
        peaks: list[int] = []

        def before(group: tuple[int, ...]) -> None:
            if group == (1, 2):  # the outage: every connection refused, the live ones dropped
                peaks.append(primary.counters()["connections_peak"])
                primary.faults.refuse_connections()
                primary.faults.drop_connections()

        rows = [
            [
                {"body": f"{f}-{j}-{e}", "message_id": f"{f}-{j}-{e}", "entity": e}
                for j in range(2)
                for e in ENTITIES
            ]
            for f in range(3)
        ]
        seen, error = run_batches(
            spark,
            ServiceBusSink(config),
            "body STRING, message_id STRING, entity STRING",
            work,
            rows,
            ((0,), (1, 2)),
            before,
        )
        backlog = sorted(
            mid
            for q in config.backlog_queue_names("primary")
            for mid in drain_ids(secondary.connection_string, q)
        )
        on_primary = sum(primary.broker.counts(e).active_message_count for e in ENTITIES)
        return {
            "error": error,
            "interval": INTERVAL,
            "entities": len(ENTITIES),
            "batches": seen,
            "connections_peak_before_outage": peaks[0] if peaks else None,
            "on_primary": on_primary,
            "backlog": backlog,
            "expected_backlog": sorted(r["message_id"] for f in (1, 2) for r in rows[f]),
            "expected_primary": len(rows[0]),
        }


if __name__ == "__main__":
    report = main(Path(sys.argv[1]))
    print(json.dumps(report, default=str))
