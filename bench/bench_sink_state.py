"""Benchmark: the foreachBatch sink with its Delta state tables on vs off, at 1,000-row and 50,000-row batches.

    .venv/bin/python bench/bench_sink_state.py [--batches 5] [--sizes 1000,50000] [--latency 0.002]

Real Spark (local[2], Delta) and two local namespaces in child processes. The sink is called as Spark calls it
(``sink(batch_df, batch_id)``) on a cached DataFrame of ``size`` rows of 200-byte bodies; each configuration
first runs one unmeasured batch (it creates the state tables), then ``--batches`` measured ones, interleaved
on / off so that drift affects both alike. Prints msgs/s of each, the ratio on / off (goal >= 0.95) and the
state's cost per batch; and, as the baseline of the run, the raw SDK batch sender sending the same number of
messages from one process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_failover import raw_sdk  # noqa: E402 - sibling script
from bench_local_namespace import namespace  # noqa: E402 - sibling script

from spark_sb.config import ServiceBusConfig  # noqa: E402
from spark_sb.session import build_spark_session  # noqa: E402
from spark_sb.sink import ServiceBusSink  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--sizes", default="1000,50000")
    parser.add_argument("--latency", type=float, default=0.002)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    spark = build_spark_session("bench-sink-state", "local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    queues = tuple(f"orders-{n}-{kind}" for n in sizes for kind in ("on", "off", "raw"))
    with (
        namespace(False, "primary", queues) as (primary, set_latency),
        namespace(False, "secondary", ()) as (
            secondary,
            _,
        ),
    ):
        set_latency(args.latency)
        for size in sizes:
            df = spark.range(size).selectExpr("repeat('x', 200) AS body", "uuid() AS message_id").cache()
            df.count()
            state_dir = tempfile.mkdtemp(prefix="bench-sink-state-")
            sinks = {}
            for kind in ("on", "off"):
                options = {
                    "primary": {"connection_string": primary, "namespace_name": "primary"},
                    "secondary": {"connection_string": secondary},
                    "entity": f"orders-{size}-{kind}",
                    "backlog_queue_count": 1,
                    "sink_id": f"bench-{size}-{kind}",
                }
                if kind == "on":
                    options["state_location"] = state_dir
                sinks[kind] = ServiceBusSink(ServiceBusConfig.from_dict(options))
                sinks[kind](df, 0)  # unmeasured: clients, links, table creation
            seconds: dict[str, list[float]] = {"on": [], "off": []}
            for batch_id in range(1, args.batches + 1):
                for kind in ("on", "off"):
                    started = time.perf_counter()
                    sinks[kind](df, batch_id)
                    seconds[kind].append(time.perf_counter() - started)
                    outcome = sinks[kind].last_outcome
                    assert outcome is not None and outcome.total_sent == size, outcome
            raw = size / raw_sdk(primary, f"orders-{size}-raw", size, b"x" * 200)
            on, off = (size / statistics.median(seconds[k]) for k in ("on", "off"))
            cost = statistics.median(seconds["on"]) - statistics.median(seconds["off"])
            print(
                f"latency {args.latency * 1000:.0f} ms, {size}-row batches: state on {on:,.0f} msgs/s, off "
                f"{off:,.0f} msgs/s, ratio {on / off:.2f} (goal >= 0.95); the state costs {cost:.2f} s per batch; "
                f"raw SDK batch sender from one process {raw:,.0f} msgs/s",
                flush=True,
            )
            df.unpersist()
    spark.stop()


if __name__ == "__main__":
    main()
