"""A program that streams through ``foreachBatch(ServiceBusSink(config))`` (``state_writes: async``) and ends
without ``sink.flush()``: run by ``tests/spark/test_shutdown.py`` in a child process, which then looks for every
batch's state rows in the events table.

Usage: ``python tests/spark/shutdown_child.py <work dir> <how>``, ``how`` one of

* ``stop-after-query``: the query runs its batches (``availableNow``) and ends; ``spark.stop()`` at once;
* ``stop-while-running``: ``processAllAvailable()``, then ``spark.stop()`` with the query still active;
* ``sigterm``: streams until the parent sends SIGTERM (the main thread waits in ``awaitTermination()``).

Each batch id whose ``foreachBatch`` returned is appended to ``<work>/returned`` at once (the parent's record of
what must be in the tables). One local namespace in this process; the input is one JSON file per batch.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

FILES = 6


def _session() -> Any:
    from spark_sb.spark.session import build_spark_session

    spark = build_spark_session("shutdown-child", "local[2]", {"spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(work: Path, how: str) -> None:
    from servicebus_local.model import QueueSettings
    from servicebus_local.server import LocalNamespace
    from spark_sb.config.service_bus import ServiceBusConfig
    from spark_sb.spark.sink import ServiceBusSink

    primary = LocalNamespace("primary").start()
    try:
        primary.broker.create_queue("orders", QueueSettings(requires_duplicate_detection=True))
        config = ServiceBusConfig.from_dict(
            {
                "primary": {"connection_string": primary.connection_string, "namespace_name": "primary"},
                "entity": "orders",
                "send_timeout": "5s",
                "state_location": str(work / "state"),
                "state_writes": "async",
                "sink_id": "shutdown",
            }
        )
        folder = work / "in"
        folder.mkdir()
        for i in range(FILES):
            (folder / f"{i}.json").write_text(
                "".join(json.dumps({"body": f"b{i}-{j}", "message_id": f"m{i}-{j}"}) + "\n" for j in range(5))
            )
        sink = ServiceBusSink(config)
        returned = work / "returned"

        def each_batch(batch_df: Any, batch_id: int) -> None:
            sink(batch_df, batch_id)
            with open(returned, "a") as f:
                f.write(f"{batch_id}\n")
                f.flush()
                os.fsync(f.fileno())

        spark = _session()
        stream = (
            spark.readStream.schema("body STRING, message_id STRING")
            .option("maxFilesPerTrigger", 1)
            .json(str(folder))
            .writeStream.foreachBatch(each_batch)
            .option("checkpointLocation", str(work / "ckpt"))
        )
        if how == "stop-after-query":
            query = stream.trigger(availableNow=True).start()
            query.awaitTermination()
            spark.stop()
        elif how == "stop-while-running":
            query = stream.trigger(processingTime="0 seconds").start()
            query.processAllAvailable()
            spark.stop()
        elif how == "sigterm":
            query = stream.trigger(processingTime="1 second").start()
            print("streaming", flush=True)
            query.awaitTermination()
        else:
            raise SystemExit(f"unknown how: {how}")
    finally:
        primary.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
    print(json.dumps({"done": True}))
