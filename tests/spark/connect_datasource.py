"""Stream through ``format("servicebus")`` under Spark Connect; print what happened as JSON.

Run by ``connect_runs.py``, the child process of ``tests/spark/test_connect.py`` (a process cannot hold the
classic test session and a Connect one), with the Connect session, file writes and receives of ``connect_stream.py``.
Two micro-batches: the primary healthy (plus one bad row), then a primary outage (diverted to the backlog); the syphon
moves the backlog back. The state tables are catalog tables (``state_table_prefix``): the source records into its spool
and :func:`spark_sb.relay_state` copies it (its listener on the client, its ``foreachBatch`` on the server); the catalog
tables are read back.

Alone, in a Connect session of its own: ``python tests/spark/connect_datasource.py <work dir>``
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from tests.spark.connect_stream import in_own_session
from tests.spark.streams import drain_ids, healthy_then_outage


def main(work: Path) -> dict[str, Any]:
    """The scenario in a Connect session of its own (its catalog tables in ``work/warehouse``)."""
    return in_own_session(run, work, work / "warehouse")


def run(work: Path, spark: Any) -> dict[str, Any]:
    """The scenario in ``spark`` (a Connect session)."""
    from servicebus_local.model import QueueSettings
    from servicebus_local.server import LocalNamespace
    from spark_sb import register, relay_state
    from spark_sb.admin.provisioning import provision_backlog_queues
    from spark_sb.config.service_bus import ServiceBusConfig
    from spark_sb.syphon.mover import Syphon

    primary = LocalNamespace("primary").start()
    secondary = LocalNamespace("secondary").start()
    try:
        primary.broker.create_queue("orders", QueueSettings(requires_duplicate_detection=True))
        opts = {
            "primary.connection_string": primary.connection_string,
            "primary.namespace_name": "primary",
            "secondary.connection_string": secondary.connection_string,
            "entity": "orders",
            "backlog_queue_count": "2",
            "failover_interval": "0",
            "ping_primary_interval": "1h",
            "send_timeout": "5s",
            "retry.total": "0",
            "state_table_prefix": "default.connect_",
            "sink_id": "connect-ds",
        }
        config = ServiceBusConfig.from_options(opts)
        provision_backlog_queues(config, admin_client=secondary.admin_client(), retry_pause=0)
        register(spark)
        register(spark)  # idempotent
        folder = work / "in"
        folder.mkdir(parents=True)
        healthy = [{"body": f"b{i}", "message_id": f"h{i}"} for i in range(10)]
        bad = {"body": "x", "message_id": "bad", "session_id": "s" * 200}
        outage = [{"body": f"o{i}", "message_id": f"o{i}"} for i in range(10)]
        ckpt = str(work / "ckpt")
        # interval 1 s, not 30: the Connect client's start() returns after the query's first (no-data) progress
        # event, whose drain is then the interval's, and settle() below waited 30 s more for the next (CI, under
        # load: past its 120 s)
        relay = relay_state(spark, {**opts, "checkpointLocation": ckpt}, timeout=120, interval=1)
        query = (
            spark.readStream.schema("body STRING, message_id STRING, session_id STRING")
            .json(str(folder))
            .writeStream.format("servicebus")
            .options(**opts)
            .option("checkpointLocation", ckpt)
            .start()
        )
        timings: dict[str, float] = {}  # seconds per phase: what a failure in CI says took long
        started = time.monotonic()

        def settle() -> None:
            timings["first batch"] = round(time.monotonic() - started, 1)
            settled.append(
                relay.settle(240, wake=False, after=before)
            )  # two drains: ~20 s each here, 3x at load
            timings["settle"] = round(time.monotonic() - started - timings["first batch"], 1)

        try:
            before = relay.drains_started
            settled: list[bool] = []  # woken by the listener, after the first micro-batch
            healthy_then_outage(query, folder, primary, [*healthy, bad], outage, settle)
            timings["second batch"] = round(time.monotonic() - started, 1)
        finally:
            query.stop()
            mark = time.monotonic()
            relay.stop()  # the last drain
            timings["relay stop"] = round(time.monotonic() - mark, 1)
        error = query.exception()
        tables = {
            t: [r.asDict() for r in spark.table(f"default.connect_{t}").collect()]
            for t in ("events", "entities", "rejects")
        }
        backlog = sorted(
            mid
            for q in config.backlog_queue_names("primary")
            for mid in _peek(secondary.connection_string, q)
        )
        primary.faults.clear()
        with Syphon(config) as syphon:
            moved = syphon.drain_all(max_wait=0.5)
        return {
            "session": type(spark).__module__,
            "error": None if error is None else str(error)[:2000],
            "backlog": backlog,
            "moved": dict(moved.forwarded),
            "primary": sorted(drain_ids(primary.connection_string, "orders")),
            "tables": tables,
            "relay": {
                "settled": settled == [True],
                "error": None if relay.last_error is None else str(relay.last_error),
            },
            "drains": relay.drains_started,
            "timings": timings,
        }
    finally:
        secondary.stop()
        primary.stop()


def _peek(connection_string: str, queue: str) -> list[str]:
    from azure.servicebus import ServiceBusClient

    with (
        ServiceBusClient.from_connection_string(connection_string) as client,
        client.get_queue_receiver(queue) as receiver,
    ):
        return [str(m.message_id) for m in receiver.peek_messages(max_message_count=100)]


if __name__ == "__main__":
    report = main(Path(sys.argv[1]))
    print(json.dumps(report, default=str))
