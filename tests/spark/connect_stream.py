"""Stream through ``foreachBatch(ServiceBusSink(config))`` under Spark Connect; print what happened as JSON.

Run by ``connect_runs.py``, the child process of ``tests/spark/test_connect.py``: a Python process cannot hold a
classic SparkSession (the session-scoped test fixture) and a Spark Connect one at once. In its local Connect
server (``SparkSession.builder.remote("local[2]")`` with the Delta jars) it starts two local namespaces and
streams two micro-batches: the first with the primary healthy (plus one bad row), the second during a primary outage
(diverted to the backlog). Then it reads the state tables back and prints a JSON report on the last line.

Alone, in a Connect session of its own: ``python tests/spark/connect_stream.py <work dir>``
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.spark.streams import drain_ids, healthy_then_outage

#: A local Spark Connect server binds port 15002 (pyspark takes an ephemeral port only under SPARK_TESTING, which
#: changes Spark's own behaviour), so two of these children at once - pytest-xdist workers, two checkouts - would
#: meet on it: each holds this lock from before its server starts until the process exits (the child's runner,
#: ``child_report``, bounds the wait with its timeout).
CONNECT_PORT_LOCK = Path(tempfile.gettempdir()) / "spark-sb-connect-port-15002.lock"


def _hold_connect_port() -> None:
    fd = os.open(CONNECT_PORT_LOCK, os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel when this process ends; fd kept open until then


def _session(warehouse: Path | None = None) -> Any:
    from delta import configure_spark_with_delta_pip
    from pyspark.sql import SparkSession

    from spark_sb.spark.session import LOCAL_DEFAULTS

    _hold_connect_port()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = SparkSession.builder.remote("local[2]")
    settings = {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        **LOCAL_DEFAULTS,
    }
    if warehouse is not None:  # where catalog tables go (else ./spark-warehouse)
        settings["spark.sql.warehouse.dir"] = str(warehouse)
    if os.environ.get("SPARK_SB_IVY_DIR"):
        settings["spark.jars.ivy"] = os.environ["SPARK_SB_IVY_DIR"]
    for key, value in settings.items():
        builder = builder.config(key, value)
    return configure_spark_with_delta_pip(builder).getOrCreate()


def in_own_session(
    scenario: Callable[[Path, Any], dict[str, Any]], work: Path, warehouse: Path | None = None
) -> dict[str, Any]:
    """``scenario(work, spark)`` in a Connect session of its own (``warehouse``: see :func:`_session`), stopped after:
    each child script's ``main``."""
    spark = _session(warehouse)
    try:
        return scenario(work, spark)
    finally:
        spark.stop()


def main(work: Path) -> dict[str, Any]:
    """The scenario in a Connect session of its own."""
    return in_own_session(run, work)


def run(work: Path, spark: Any) -> dict[str, Any]:
    """The scenario in ``spark`` (a Connect session)."""
    from servicebus_local.model import QueueSettings
    from servicebus_local.server import LocalNamespace
    from spark_sb.admin.provisioning import provision_backlog_queues
    from spark_sb.config.service_bus import ServiceBusConfig
    from spark_sb.spark.sink import ServiceBusSink, batch_counts

    primary = LocalNamespace("primary").start()
    secondary = LocalNamespace("secondary").start()
    try:
        primary.broker.create_queue("orders", QueueSettings(requires_duplicate_detection=True))
        state = work / "state"
        config = ServiceBusConfig.from_dict(
            {
                "primary": {"connection_string": primary.connection_string, "namespace_name": "primary"},
                "secondary": {"connection_string": secondary.connection_string},
                "entity": "orders",
                "backlog_queue_count": 2,
                "failover_interval": 0,
                "ping_primary_interval": "1h",
                "send_timeout": "5s",
                "retry": {"total": 0, "backoff_factor": 0.05, "backoff_max": 0.2},
                "state_location": str(state),
                "sink_id": "connect",
            }
        )
        provision_backlog_queues(config, admin_client=secondary.admin_client(), retry_pause=0)
        folder = work / "in"
        folder.mkdir(parents=True)
        healthy = [{"body": f"b{i}", "message_id": f"h{i}"} for i in range(10)]
        bad = {"body": "x", "message_id": "bad", "session_id": "s" * 200}
        outage = [{"body": f"o{i}", "message_id": f"o{i}"} for i in range(10)]
        sb_sink = ServiceBusSink(config)
        query = (
            spark.readStream.schema("body STRING, message_id STRING, session_id STRING")
            .json(str(folder))
            .writeStream.foreachBatch(sb_sink)
            .option("checkpointLocation", str(work / "ckpt"))
            .start()
        )
        try:
            healthy_then_outage(query, folder, primary, [*healthy, bad], outage)
        finally:
            query.stop()
        error = query.exception()
        tables = {
            t: [r.asDict() for r in spark.read.format("delta").load(str(state / t)).collect()]
            for t in ("events", "entities", "rejects")
        }
        counts = {  # the counts read back from the events table: the route that works under Connect
            "batches": [r.asDict() for r in batch_counts(spark, config, "connect").collect()],
            "summary": sb_sink.summary(spark),
            "client_summary": sb_sink.summary(),  # the function ran beside the server: this object saw nothing
        }
        primary.faults.clear()
        return {
            "session": type(spark).__module__,
            "error": None if error is None else str(error)[:2000],
            "primary": sorted(drain_ids(primary.connection_string, "orders")),
            "backlog": sorted(
                mid
                for q in config.backlog_queue_names("primary")
                for mid in drain_ids(secondary.connection_string, q)
            ),
            "tables": tables,
            "counts": counts,
        }
    finally:
        secondary.stop()
        primary.stop()


if __name__ == "__main__":
    report = main(Path(sys.argv[1]))
    print(json.dumps(report, default=str))
