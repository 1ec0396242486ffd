"""The syphon query under Spark Connect; print what happened as JSON on the last line.

Run by ``connect_runs.py``, the child process of ``tests/spark/test_connect.py`` (a process cannot hold a
classic and a Connect session at once), in its local Connect server with Delta. Starts two local namespaces,
puts backlog messages in two backlog queues, runs ``run_syphon`` until nothing is left, and reports the primary's
message ids, the events table and the query's progress rows.

Alone, in a Connect session of its own: ``python tests/spark/connect_syphon.py <work dir>``
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from servicebus_local.model import QueueSettings
from servicebus_local.server import LocalNamespace
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.message.backlog import to_backlog
from spark_sb.message.outbound import OutboundMessage
from spark_sb.spark.syphon_job import run_syphon, stop_gracefully
from tests.spark.connect_stream import in_own_session
from tests.spark.streams import drain_ids

BACKLOG = [f"primary/x-servicebus-transfer/{i}" for i in range(2)]


def main(work: Path) -> dict[str, Any]:
    """The scenario in a Connect session of its own."""
    return in_own_session(run, work)


def run(work: Path, spark: Any) -> dict[str, Any]:
    """The scenario in ``spark`` (a Connect session)."""
    from azure.servicebus import ServiceBusClient

    with LocalNamespace("primary") as primary, LocalNamespace("secondary") as secondary:
        primary.broker.create_queue("orders", QueueSettings(requires_duplicate_detection=True))
        now = datetime.now(timezone.utc)
        with ServiceBusClient.from_connection_string(secondary.connection_string) as client:
            for i, q in enumerate(BACKLOG):
                secondary.broker.create_queue(q)
                with client.get_queue_sender(q) as sender:
                    sender.send_messages(
                        [
                            to_backlog(
                                OutboundMessage(body="x", message_id=f"q{i}-{j}"), "orders", now
                            ).to_sdk()
                            for j in range(7)
                        ]
                    )
        config = ServiceBusConfig.from_dict(
            {
                "primary": {"connection_string": primary.connection_string, "namespace_name": "primary"},
                "secondary": {"connection_string": secondary.connection_string},
                "backlog_queue_count": 2,
                "send_timeout": "5s",
                "state_location": str(work / "state"),
            }
        )
        stop_file = str(work / "stop")
        query = run_syphon(
            spark,
            config,
            checkpoint=str(work / "chk"),
            trigger="1 second",
            admin_kwargs={"connection_verify": secondary.ca_file},
            stop_file=stop_file,
        )
        error = None
        try:
            query.processAllAvailable()
            rows = sum(p.numInputRows for p in query.recentProgress)
        except Exception as exc:  # noqa: BLE001 - reported
            error, rows = f"{type(exc).__name__}: {exc}", -1
        finally:
            stop_gracefully(query, stop_file, timeout=60)
        events = [
            r.asDict()
            for r in spark.read.format("delta")
            .load(str(work / "state" / "events"))
            .select("event", "entity", "count")
            .collect()
        ]
        report = {
            "session": type(spark).__module__,
            "error": error,
            "rows": rows,
            "primary": sorted(drain_ids(primary.connection_string, "orders")),
            "events": events,
        }
    return report


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1])), default=str))
