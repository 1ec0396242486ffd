"""Benchmark: the foreachBatch sink with its Delta state tables on vs off, at 1,000-row and 50,000-row batches.

    .venv/bin/python bench/bench_sink_state.py [--batches 5] [--rounds 2] [--sizes 1000,50000] [--latency 0.002]
                                               [--state-writes async|sync] [--seconds 75] [--smoke]

Real Spark (local[2], Delta) and two local namespaces in child processes. The sink is called as Spark calls it
(``sink(batch_df, batch_id)``) on a cached DataFrame of ``size`` rows of 200-byte bodies. Each configuration
first runs one unmeasured batch (clients, links, table creation; flushed). Then ``--rounds`` rounds, each one
sequence of ``--batches`` batches with state on and one with state off, the order alternating between rounds so
that drift affects both alike. A sequence with state on ends with ``sink.flush()``, inside its timing: with
``state_writes: async`` the writes of the sequence are in the tables when its clock stops. Throughput is total
rows / total time over the sequences (all rounds). Prints msgs/s of each, the ratio on / off (goal >= 0.95) and
the state's cost per batch; and, as the baseline of the run, the raw SDK batch sender sending the same number of
messages from one process.

With ``--seconds S`` it measures a stream in steady state instead: after ``--warmup`` unmeasured seconds of each
(the JVM compiles Spark's and Delta's paths meanwhile), ``--segments`` segments of S seconds per configuration
in the order on, off, off, on, ... Within a segment the group commits that fall due are inside the timing; the
flush that ends a segment (what a stopping stream pays once) is timed apart and printed, and done before the
next segment starts, so that no write of one configuration runs during the other's timing.

``--smoke`` (CI's smoke mode): 200-row batches, one round of one batch each, the JVM compiling with C1 only (Spark's
start, the first batches and the tables' creation dominate: about half a minute).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_failover import raw_sdk  # noqa: E402 - sibling script

from harness.namespaces import namespaces  # noqa: E402
from spark_sb.config.service_bus import ServiceBusConfig  # noqa: E402
from spark_sb.spark.session import LOCAL_DEFAULTS, build_spark_session  # noqa: E402
from spark_sb.spark.sink import ServiceBusSink  # noqa: E402

#: ``--smoke``: the driver's JVM compiles with C1 only - a run of seconds spends less CPU compiling code it runs a few
#: times (Spark's start and its first Delta operations about a fifth shorter, measured on the 2-core machine).
SMOKE_SPARK_CONF = {
    "spark.driver.extraJavaOptions": f"{LOCAL_DEFAULTS['spark.driver.extraJavaOptions']} -XX:TieredStopAtLevel=1"
}


def steady(
    sink: ServiceBusSink, df: Any, first_batch_id: int, seconds: float, size: int
) -> tuple[int, float, float, int]:
    """A stream that runs for a while: batches back to back for ``seconds`` (the group commits that fall due
    meanwhile included), then the final ``flush()`` a stopping stream pays once, timed apart. Returns (batches,
    seconds of the batches, seconds of the flush, group commits written)."""
    started = time.perf_counter()
    batch_id = first_batch_id
    while time.perf_counter() - started < seconds:
        sink(df, batch_id)
        outcome = sink.last_outcome
        assert outcome is not None and outcome.total_sent == size, outcome
        batch_id += 1
    ran = time.perf_counter() - started
    flushed = time.perf_counter()
    sink.flush()
    writer = getattr(sink, "_writer", None)
    return batch_id - first_batch_id, ran, time.perf_counter() - flushed, getattr(writer, "commits", 0)


def run_sequence(sink: ServiceBusSink, df: Any, first_batch_id: int, batches: int, size: int) -> float:
    """Seconds for ``batches`` batches through ``sink``, the final ``flush()`` included."""
    started = time.perf_counter()
    for batch_id in range(first_batch_id, first_batch_id + batches):
        sink(df, batch_id)
        outcome = sink.last_outcome
        assert outcome is not None and outcome.total_sent == size, outcome
    sink.flush()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=5, help="batches per measured sequence (default 5)")
    parser.add_argument("--rounds", type=int, default=2, help="on/off sequence pairs per size (default 2)")
    parser.add_argument("--sizes", default="1000,50000", help="rows per batch, comma-separated")
    parser.add_argument(
        "--latency", type=float, default=0.002, help="injected latency, seconds (default 0.002)"
    )
    parser.add_argument("--state-writes", choices=("async", "sync"), default="async")
    parser.add_argument(
        "--seconds",
        type=float,
        default=0.0,
        help="steady state instead: each configuration streams for this long (>= 2 x the 30 s group-commit "
        "interval, e.g. 75), commits during the run included, the final flush timed apart",
    )
    parser.add_argument(
        "--segments",
        type=int,
        default=2,
        help="with --seconds: measured segments per configuration, in the order on, off, off, on, ... (default 2)",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=20.0,
        help="with --seconds: unmeasured seconds per configuration first",
    )
    parser.add_argument("--smoke", action="store_true", help="200-row batches, one round of 1 (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.rounds, args.batches, args.seconds = "200", 1, 1, 0.0
    sizes = [int(s) for s in args.sizes.split(",")]
    spark = build_spark_session("bench-sink-state", "local[2]", SMOKE_SPARK_CONF if args.smoke else None)
    spark.sparkContext.setLogLevel("ERROR")
    queues = tuple(f"orders-{n}-{kind}" for n in sizes for kind in ("on", "off", "raw"))
    with namespaces({"primary": queues, "secondary": ()}) as ns:
        primary, secondary = ns["primary"].connection_string, ns["secondary"].connection_string
        ns["primary"].set_latency(args.latency)
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
                    "state_writes": args.state_writes,
                }
                if kind == "on":
                    options["state_location"] = state_dir
                sinks[kind] = ServiceBusSink(ServiceBusConfig.from_dict(options))
                sinks[kind](df, 0)  # unmeasured: clients, links, table creation
                sinks[kind].flush()
            if args.seconds > 0:
                batch_ids = {"on": 1, "off": 1}
                for kind in ("on", "off"):  # unmeasured warm-up: JIT-compiled Spark and Delta paths for both
                    n, _, _, _ = steady(sinks[kind], df, batch_ids[kind], args.warmup, size)
                    batch_ids[kind] += n
                totals = {
                    k: [0, 0.0, 0.0, 0] for k in ("on", "off")
                }  # batches, seconds, flush seconds, commits
                for segment in range(args.segments):  # on, off, off, on, ...: drift affects both alike
                    for kind in ("on", "off") if segment % 2 == 0 else ("off", "on"):
                        n, ran, flushed, commits = steady(
                            sinks[kind], df, batch_ids[kind], args.seconds, size
                        )
                        batch_ids[kind] += n
                        done = totals[kind]
                        done[0] += n
                        done[1] += ran
                        done[2] += flushed
                        done[3] = commits
                (n_on, t_on, f_on, commits), (n_off, t_off, _, _) = totals["on"], totals["off"]
                on, off = n_on * size / t_on, n_off * size / t_off
                raw = size / raw_sdk(primary, f"orders-{size}-raw", size, b"x" * 200)
                print(
                    f"latency {args.latency * 1000:.0f} ms, {size}-row batches, state_writes {args.state_writes}, "
                    f"steady state ({args.segments} x {args.seconds:.0f} s each, after {args.warmup:.0f} s of "
                    f"warm-up): state on {n_on} batches, {on:,.0f} msgs/s ({commits} group commits in all); off "
                    f"{n_off} batches, {off:,.0f} msgs/s; ratio {on / off:.2f} (goal >= 0.95); the flush that ends "
                    f"a segment took {f_on / args.segments:.2f} s (not in the timing; counted in, the ratio is "
                    f"{n_on * size / (t_on + f_on) / off:.2f}); raw SDK batch sender from one process "
                    f"{raw:,.0f} msgs/s",
                    flush=True,
                )
                df.unpersist()
                continue
            seconds: dict[str, float] = {"on": 0.0, "off": 0.0}
            per_round: list[str] = []
            for r in range(args.rounds):
                order = ("on", "off") if r % 2 == 0 else ("off", "on")
                took = {}
                for kind in order:
                    took[kind] = run_sequence(sinks[kind], df, 1 + r * args.batches, args.batches, size)
                    seconds[kind] += took[kind]
                per_round.append(f"{took['on']:.2f}/{took['off']:.2f} s")
            rows = size * args.batches * args.rounds
            raw = size / raw_sdk(primary, f"orders-{size}-raw", size, b"x" * 200)
            on, off = rows / seconds["on"], rows / seconds["off"]
            cost = (seconds["on"] - seconds["off"]) / (args.batches * args.rounds)
            print(
                f"latency {args.latency * 1000:.0f} ms, {size}-row batches, state_writes {args.state_writes}, "
                f"{args.rounds} x {args.batches} batches: state on {on:,.0f} msgs/s, off {off:,.0f} msgs/s, "
                f"ratio {on / off:.2f} (goal >= 0.95); the state costs {cost:.2f} s per batch "
                f"(sequences on/off: {', '.join(per_round)}); raw SDK batch sender from one process "
                f"{raw:,.0f} msgs/s",
                flush=True,
            )
            df.unpersist()
    spark.stop()


if __name__ == "__main__":
    main()
