"""Benchmark: ``format("servicebus")`` against ``foreachBatch(ServiceBusSink)`` on the same rows, interleaved.

    .venv/bin/python bench/bench_datasource.py [--rows 20000] [--batches 5] [--rounds 3] [--latency 0]
                                               [--no-state | --catalog] [--smoke]

Real Spark (local[2], Delta) and two local namespaces in child processes. The input is a folder of parquet files,
two per micro-batch (``rows`` rows of 200-byte bodies with message ids, two partitions: both cores send). Each run
is one streaming query with ``trigger(availableNow=True)`` over that folder (``--batches`` micro-batches, then it
stops), timed from ``start()`` to its end; the ``foreachBatch`` run's time includes ``sink.flush()`` (its state
tables written in the background), the data source writes its tables in each micro-batch's commit. Every run
sends to a queue of its own, drained and counted afterwards (not timed). The runs alternate (source, sink, sink,
source, ...) after one unmeasured run of each, so that drift affects both alike. With state tables under
``state_location`` (default; ``--no-state``: none; ``--catalog``: catalog tables, ``state_table_prefix``: the
``foreachBatch`` sink writes them itself, the data source into its spool while :func:`spark_sb.relay_state` copies
the spool after each micro-batch; its run's time includes the relay's last drain, as the sink's includes
``flush()``).

Prints msgs/s of each run, the totals (rows / seconds over all measured runs) and the ratio data source /
foreachBatch (goal >= 0.95). ``--smoke`` (CI's smoke mode): 200 rows, one micro-batch, one run of each and no
warm-up run, the JVM compiling with C1 only (Spark's start and the tables' creation dominate: about 40 s).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


from harness.namespaces import namespaces  # noqa: E402
from harness.queues import take  # noqa: E402
from spark_sb import register, relay_state  # noqa: E402
from spark_sb.config.service_bus import ServiceBusConfig  # noqa: E402
from spark_sb.spark.session import LOCAL_DEFAULTS, build_spark_session  # noqa: E402
from spark_sb.spark.sink import ServiceBusSink  # noqa: E402

KINDS = ("datasource", "foreachBatch")
#: ``--smoke``: the driver's JVM compiles with C1 only - a run of seconds spends less CPU compiling code it runs a few
#: times (Spark's start and its first Delta operations about a fifth shorter, measured on the 2-core machine).
SMOKE_SPARK_CONF = {
    "spark.driver.extraJavaOptions": f"{LOCAL_DEFAULTS['spark.driver.extraJavaOptions']} -XX:TieredStopAtLevel=1"
}


def make_input(spark: Any, folder: str, rows: int, batches: int) -> None:
    """``batches`` x 2 parquet files of ``rows / 2`` rows each (not timed)."""
    for b in range(batches):
        (
            spark.range(b * rows, (b + 1) * rows, numPartitions=2)
            .selectExpr("repeat('x', 200) AS body", "concat('m', id) AS message_id")
            .write.mode("append")
            .parquet(folder)
        )


def run(spark: Any, kind: str, folder: str, options: dict[str, str], work: str) -> float:
    """One query over the whole folder; seconds from ``start()`` to its end (state tables written)."""
    reader = spark.readStream.schema("body STRING, message_id STRING").option("maxFilesPerTrigger", 2)
    df = reader.parquet(folder)
    ckpt = tempfile.mkdtemp(prefix="ckpt-", dir=work)
    started = time.perf_counter()
    if kind == "datasource":
        relay = None
        if "state_table_prefix" in options:
            relay = relay_state(spark, {**options, "checkpointLocation": ckpt})
        writer = df.writeStream.format("servicebus").options(**options)
        query = writer.option("checkpointLocation", ckpt).trigger(availableNow=True).start()
        query.awaitTermination()
        if relay is not None:
            relay.stop()  # the last drain: the catalog tables hold every batch
    else:
        sink = ServiceBusSink(ServiceBusConfig.from_options(options))
        writer = df.writeStream.foreachBatch(sink)
        query = writer.option("checkpointLocation", ckpt).trigger(availableNow=True).start()
        query.awaitTermination()
        sink.flush()
    elapsed = time.perf_counter() - started
    assert query.exception() is None, query.exception()
    return elapsed


def drain(conn: str, queue: str) -> int:
    """Receive (and delete) every message of ``queue``; how many there were (not timed)."""
    return len(take(conn, queue, wait=1, batch=1000, prefetch=1000, deadline=3600))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=20_000, help="rows per micro-batch (default 20000)")
    parser.add_argument("--batches", type=int, default=5, help="micro-batches per run (default 5)")
    parser.add_argument("--rounds", type=int, default=3, help="measured runs of each (default 3)")
    parser.add_argument("--latency", type=float, default=0.0, help="injected latency, seconds (default 0)")
    tables = parser.add_mutually_exclusive_group()
    tables.add_argument("--no-state", action="store_true", help="no state tables")
    tables.add_argument(
        "--catalog", action="store_true", help="catalog state tables (the data source: a relay)"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="200 rows, one micro-batch, one run of each (CI)"
    )
    args = parser.parse_args()
    if args.smoke:
        args.rows, args.batches, args.rounds = 200, 1, 1

    work = tempfile.mkdtemp(prefix="bench-datasource-")
    conf = {
        "spark.sql.warehouse.dir": os.path.join(work, "warehouse"),
        **(SMOKE_SPARK_CONF if args.smoke else {}),
    }
    spark = build_spark_session("bench-datasource", "local[2]", conf)
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    warmups = 0 if args.smoke else 1  # smoke: no unmeasured run (the figures mean nothing there)
    runs = args.rounds + warmups
    queues = tuple(f"orders-{kind}-{i}" for kind in KINDS for i in range(runs))
    folder = os.path.join(work, "in")
    make_input(spark, folder, args.rows, args.batches)
    total = args.rows * args.batches
    with namespaces({"primary": queues, "secondary": ()}) as ns:
        primary, secondary = ns["primary"].connection_string, ns["secondary"].connection_string
        ns["primary"].set_latency(args.latency)
        seconds: dict[str, list[float]] = {k: [] for k in KINDS}
        for i in range(runs):
            order = KINDS if i % 2 == 0 else KINDS[::-1]
            for kind in order:
                options = {
                    "primary.connection_string": primary,
                    "primary.namespace_name": "primary",
                    "secondary.connection_string": secondary,
                    "entity": f"orders-{kind}-{i}",
                    "backlog_queue_count": "1",
                    "sink_id": f"bench-{kind}-{i}",
                }
                if args.catalog:
                    options["state_table_prefix"] = f"default.bench_{kind.lower()}_"
                elif not args.no_state:
                    options["state_location"] = os.path.join(work, "state")
                took = run(spark, kind, folder, options, work)
                got = drain(primary, f"orders-{kind}-{i}")
                assert got == total, f"{kind} run {i}: {got} messages in the queue, expected {total}"
                label = "warm-up (not counted)" if i < warmups else f"run {i - warmups + 1}"
                print(f"{kind:>12} {label:>22}: {total / took:8.0f} msgs/s ({took:.2f} s)", flush=True)
                if i >= warmups:
                    seconds[kind].append(took)
    measured = {k: args.rounds * total / sum(v) for k, v in seconds.items()}
    print(
        f"rows {args.rows} x {args.batches} micro-batches, latency {args.latency}s, "
        f"state tables {'off' if args.no_state else 'catalog' if args.catalog else 'paths'}"
    )
    for kind in KINDS:
        print(f"{kind:>12}: {measured[kind]:8.0f} msgs/s over {args.rounds} runs")
    ratio = measured["datasource"] / measured["foreachBatch"]
    print(f"ratio datasource / foreachBatch: {ratio:.3f} (goal >= 0.95)")
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
