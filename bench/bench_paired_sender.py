"""Benchmark: PairedSender vs the raw SDK batch sender, same local namespace, same run.

    .venv/bin/python bench/bench_paired_sender.py [--count 100000] [--size 200] [--latency 0.002] [--smoke]

By default both namespaces run in child processes (``python -m servicebus_local``), so the broker does not share
this process's GIL with the code being measured; ``--inproc`` runs them in this process.

Sends ``count`` messages of ``size`` bytes (a) with the raw SDK (``ServiceBusMessage`` objects packed into
``ServiceBusMessageBatch`` by size, sent with ``send_messages``), (b) through ``PairedSender.send`` from
``OutboundMessage`` objects (streamed, packed by size, failover bookkeeping on). Prints msgs/s of both and the
ratio (target >= 0.9), without and with injected latency. Every run sends to a fresh queue. Runs on the driver
machine only (no Spark). ``--smoke``: 500 messages, one repeat (seconds: CI's smoke mode).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_failover import paired, raw_sdk  # noqa: E402 - sibling script (the same raw baseline)

from harness.namespaces import namespaces  # noqa: E402
from spark_sb.config.namespace import NamespaceConfig, RetryConfig  # noqa: E402
from spark_sb.config.secret import Secret  # noqa: E402
from spark_sb.config.service_bus import ServiceBusConfig  # noqa: E402

QUEUE = "bench"


def queue_names(repeats: int) -> list[str]:
    """A fresh queue for every timed run (so no run pays for the messages of another)."""
    return [
        f"{QUEUE}-{lat}-{kind}-{i}" for lat in (0, 1) for kind in ("raw", "paired") for i in range(repeats)
    ]


def run(
    conn: str, config: ServiceBusConfig, latency_index: int, count: int, size: int, repeats: int
) -> tuple[float, float]:
    body = b"x" * size
    results: dict[str, list[float]] = {"raw": [], "paired": []}
    runners: dict[str, Callable[[str], float]] = {
        "raw": lambda q: raw_sdk(conn, q, count, body),
        "paired": lambda q: paired(config, q, count, body, "sent"),
    }
    for i in range(repeats):
        for name, fn in runners.items():  # interleaved, so drift affects both alike
            results[name].append(count / fn(f"{QUEUE}-{latency_index}-{name}-{i}"))
    return statistics.median(results["raw"]), statistics.median(results["paired"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--latency", type=float, default=0.002)
    parser.add_argument("--repeats", type=int, default=5)

    parser.add_argument("--inproc", action="store_true", help="run the namespaces in this process")
    parser.add_argument("--smoke", action="store_true", help="500 messages, one repeat (CI's smoke mode)")
    args = parser.parse_args()
    if args.smoke:
        args.count, args.repeats = 500, 1
    queues = tuple(queue_names(args.repeats))
    with namespaces({"primary": queues, "secondary": ()}, inproc=args.inproc) as ns:
        primary_conn, secondary_conn = ns["primary"].connection_string, ns["secondary"].connection_string
        config = ServiceBusConfig(
            primary=NamespaceConfig(connection_string=Secret(primary_conn), namespace_name="primary"),
            secondary=NamespaceConfig(connection_string=Secret(secondary_conn)),
            entity=QUEUE,
            retry=RetryConfig(),
        )
        for index, latency in enumerate((0.0, args.latency)):
            ns["primary"].set_latency(latency)
            raw, ours = run(primary_conn, config, index, args.count, args.size, args.repeats)
            print(
                f"latency {latency * 1000:.0f} ms, {args.count} x {args.size} B: raw SDK {raw:,.0f} msgs/s, "
                f"PairedSender {ours:,.0f} msgs/s, ratio {ours / raw:.2f} (target >= 0.9)",
                flush=True,
            )


if __name__ == "__main__":
    main()
