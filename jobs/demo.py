"""The embedded demo: local Spark + two local Service Bus namespaces + a primary outage + the syphon.

Run: ``make demo`` (or ``python jobs/demo.py``). Everything is local: a primary and a secondary namespace run
in this process (``servicebus_local``), backlog queues are provisioned in the secondary, and a Structured Streaming
query (file source -> ``foreachBatch(ServiceBusSink)``) sends three micro-batches:

1. primary healthy: every message goes to the primary queue;
2. primary down (connections refused): after ``failover_interval`` the sink diverts to the backlog queues;
3. primary back: the syphon job (the Structured Streaming query of ``jobs/syphon.py``) moves the backlog to the
   primary, the probe returns the entity to healthy, and the next micro-batch goes to the primary again.

At the end every produced message id is compared with what the primary queue holds: 0 lost, 0 duplicated.
Exit code 0 when that holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from servicebus_local.server import LocalNamespace
from spark_sb.admin.provisioning import provision_backlog_queues
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.clock import SystemClock
from spark_sb.failover.outcome import SendOutcome
from spark_sb.spark.session import build_spark_session
from spark_sb.spark.sink import ServiceBusSink
from spark_sb.spark.syphon_job import run_syphon
from spark_sb.spark.syphon_ledger import SyphonBatchWriter

ENTITY = "orders"


def say(text: str = "") -> None:
    print(text, flush=True)


def describe(outcome: SendOutcome | None) -> str:
    if outcome is None:
        return "no outcome"
    parts = [f"sent to primary: {outcome.total_sent}", f"diverted to backlog: {outcome.total_diverted}"]
    if outcome.diverted:
        parts.append("backlog queues: " + ", ".join(f"{q}={n}" for q, n in sorted(outcome.diverted.items())))
    if outcome.total_rejected:
        parts.append(f"rejected: {outcome.total_rejected}")
    return "; ".join(parts)


def transitions(outcome: SendOutcome | None) -> list[str]:
    if outcome is None:
        return []
    return [
        f"    {t.entity}: {t.from_state.value} -> {t.to_state.value} ({t.error_class or t.detail})"
        for t in outcome.transitions
    ]


def write_batch(input_dir: Path, phase: str, start: int, count: int) -> list[str]:
    ids = [f"{phase}-{i:05d}" for i in range(start, start + count)]
    rows = [
        {"body": json.dumps({"order": i, "phase": phase}), "message_id": mid, "subject": phase}
        for i, mid in zip(range(start, start + count), ids, strict=True)
    ]
    tmp = input_dir / f".{phase}.tmp"
    tmp.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    tmp.rename(input_dir / f"{phase}.json")  # atomic: the file source never sees half a file
    return ids


def receive_all(ns: LocalNamespace, entity: str) -> list[str]:
    from azure.servicebus import ServiceBusClient, ServiceBusReceiveMode

    ids: list[str] = []
    with (
        ServiceBusClient.from_connection_string(ns.connection_string) as client,
        client.get_queue_receiver(entity, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver,
    ):
        while True:
            batch = receiver.receive_messages(max_message_count=500, max_wait_time=1)
            if not batch:
                return ids
            ids.extend(str(m.message_id) for m in batch)


def syphon_once(spark: Any, config: ServiceBusConfig, secondary: LocalNamespace, checkpoint: Path) -> str:
    """One micro-batch of the syphon job (the Structured Streaming query `jobs/syphon.py` runs), on the same
    checkpoint each time; returns what it moved."""
    writer = SyphonBatchWriter(config)
    query = run_syphon(
        spark,
        config,
        checkpoint=str(checkpoint),
        once=True,
        admin_kwargs={"connection_verify": secondary.ca_file},  # trust the local namespace's development CA
        writer=writer,
    )
    query.awaitTermination()
    total = writer.total
    moved = ", ".join(f"{e}={n}" for e, n in sorted(total.by_entity.items())) or "none"
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(total.by_kind.items())) or "nothing to do"
    return f"syphon job: moved {moved} ({kinds})"


def run(per_batch: int, workdir: Path) -> bool:
    clock = SystemClock()
    with LocalNamespace("primary", queues=[ENTITY]) as primary, LocalNamespace("secondary") as secondary:
        say(f"primary namespace   sb://{primary.host}:{primary.port} (queue '{ENTITY}')")
        say(f"secondary namespace sb://{secondary.host}:{secondary.port}")
        config = ServiceBusConfig.from_dict(
            {
                "primary": {"connection_string": primary.connection_string, "namespace_name": "primary"},
                "secondary": {"connection_string": secondary.connection_string},
                "entity": ENTITY,
                "backlog_queue_count": 3,
                "failover_interval": "1s",
                "ping_primary_interval": "1s",
                "send_timeout": "5s",
                "retry": {"total": 0, "backoff_factor": 0.2, "backoff_max": 1},
            }
        )
        say("\n== provisioning backlog queues in the secondary")
        report = provision_backlog_queues(config, admin_client=secondary.admin_client(), clock=clock)
        say(report.format_table())

        spark = build_spark_session("spark-servicebus-demo")
        spark.sparkContext.setLogLevel("ERROR")
        input_dir = workdir / "input"
        input_dir.mkdir(parents=True)
        stream = spark.readStream.schema("body STRING, message_id STRING, subject STRING").json(
            str(input_dir)
        )
        sb_sink = ServiceBusSink(config)
        query = (
            stream.writeStream.foreachBatch(sb_sink)
            .option("checkpointLocation", str(workdir / "checkpoint"))
            .start()
        )
        produced: list[str] = []
        try:
            say("\n== batch 1: primary healthy")
            produced += write_batch(input_dir, "healthy", 0, per_batch)
            query.processAllAvailable()
            say("  " + describe(sb_sink.last_outcome))

            say("\n== batch 2: primary outage (connections refused)")
            primary.faults.refuse_connections()
            primary.faults.drop_connections()
            produced += write_batch(input_dir, "outage", per_batch, per_batch)
            query.processAllAvailable()
            say("  " + describe(sb_sink.last_outcome))
            for line in transitions(sb_sink.last_outcome):
                say(line)

            say("\n== primary back; the syphon job drains the backlog")
            primary.faults.accept_connections()
            say("  " + syphon_once(spark, config, secondary, workdir / "syphon-checkpoint"))

            say("\n== batch 3: after the probe interval the primary is used again")
            time.sleep(config.ping_primary_interval)  # real time: the demo shows the real probe interval
            produced += write_batch(input_dir, "recovered", 2 * per_batch, per_batch)
            query.processAllAvailable()
            say("  " + describe(sb_sink.last_outcome))
            for line in transitions(sb_sink.last_outcome):
                say(line)
            late = sb_sink.last_outcome.total_diverted if sb_sink.last_outcome is not None else 0
            if late:
                # A Python worker that had not yet learned of the recovery diverted this batch (its probe runs
                # beside the sends, never in their way); the syphon brings those messages back too.
                say("\n== the syphon job moves what was diverted while the probe ran")
                say("  " + syphon_once(spark, config, secondary, workdir / "syphon-checkpoint"))
        finally:
            try:
                query.stop()
                sb_sink.flush()  # what the sink holds for its state tables (if any) needs the session
                say("\n" + sb_sink.summary())
            finally:
                spark.stop()

        say("\n== checking the primary queue")
        received = receive_all(primary, ENTITY)
        lost = sorted(set(produced) - set(received))
        duplicates = len(received) - len(set(received))
        say(
            f"  produced {len(produced)}, in primary {len(received)}, lost {len(lost)}, duplicates {duplicates}"
        )
        return not lost and duplicates == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages-per-batch", type=int, default=50)
    parser.add_argument("--workdir", type=Path, default=None, help="kept after the run when given")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="spark-sb-demo-"))
    try:
        ok = run(args.messages_per_batch, workdir)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    say("\nDEMO OK: every message reached the primary exactly once" if ok else "\nDEMO FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
