"""Benchmark: PairedSender vs the raw SDK batch sender, same local namespace, same run.

    .venv/bin/python bench/bench_paired_sender.py [--count 100000] [--size 200] [--latency 0.002] [--smoke]
                                                  [--large-sizes 1500000,5000000] [--large-count 60]

By default both namespaces run in child processes (``python -m servicebus_local``), so the broker does not share
this process's GIL with the code being measured; ``--inproc`` runs them in this process.

Sends ``count`` messages of ``size`` bytes (a) with the raw SDK (``ServiceBusMessage`` objects packed into
``ServiceBusMessageBatch`` by size, sent with ``send_messages``), (b) through ``PairedSender.send`` from
``OutboundMessage`` objects (streamed, packed by size, failover bookkeeping on). Prints msgs/s of both and the
ratio (target >= 0.9), without and with injected latency. Every run sends to a fresh queue. Runs on the driver
machine only (no Spark). ``--smoke``: 500 messages, one repeat (seconds: CI's smoke mode).

Then the large-message rows (SPEC B13; ``--large-sizes``, empty: none): both namespaces Premium, the queues taking
20 MiB messages, ``large-count`` messages of each size sent (a) by a raw SDK loop one by one (``send_messages`` of
one ``ServiceBusMessage``: a message over a Premium link's 1 MB batch limit cannot go in a batch) and (b) through
``PairedSender.send`` (``max_message_size`` 20 MiB: each goes alone); MB/s of both and the ratio (goal >= 0.9).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace

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


#: The large-message queues take 20 MiB messages (Premium: up to 100 MB).
LARGE_KB = 20_480


def large_topology(repeats: int, sizes: list[int]) -> str:
    """A topology file of the large-message runs' queues (a fresh one per timed run), each taking 20 MiB."""
    names = [f"large-{s}-{lat}-{kind}" for s in sizes for lat in (0, 1) for kind in ("raw", "paired")]
    names = [f"{n}-{i}" for n in names for i in range(repeats)]
    fd, path = tempfile.mkstemp(suffix=".yaml", prefix="bench-large-")
    with os.fdopen(fd, "w") as f:
        f.write("queues:\n")
        for name in names:
            f.write(f"  - name: {name}\n    max_message_size_in_kilobytes: {LARGE_KB}\n")
    return path


def raw_one_by_one(conn: str, queue: str, count: int, body: bytes) -> float:
    """Seconds to send ``count`` messages with a raw SDK loop, one ``send_messages`` each (the link opened first,
    not timed)."""
    from azure.servicebus import ServiceBusClient, ServiceBusMessage

    with ServiceBusClient.from_connection_string(conn) as client, client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage(b"open"))
        started = time.perf_counter()
        for _ in range(count):
            sender.send_messages(ServiceBusMessage(body))
        return time.perf_counter() - started


def run_large(
    conn: str, config: ServiceBusConfig, latency_index: int, count: int, size: int, repeats: int
) -> tuple[float, float]:
    """MB/s of the raw loop and of PairedSender for ``count`` messages of ``size`` bytes, interleaved repeats."""
    body = b"L" * size
    results: dict[str, list[float]] = {"raw": [], "paired": []}
    runners: dict[str, Callable[[str], float]] = {
        "raw": lambda q: raw_one_by_one(conn, q, count, body),
        "paired": lambda q: paired(config, q, count, body, "sent"),
    }
    for i in range(repeats):
        for name, fn in runners.items():
            seconds = fn(f"large-{size}-{latency_index}-{name}-{i}")
            results[name].append(count * size / seconds / 1e6)
    return statistics.median(results["raw"]), statistics.median(results["paired"])


def main_large(args: argparse.Namespace, sizes: list[int]) -> None:
    topology = large_topology(args.repeats, sizes)
    try:
        spec = {"primary": (), "secondary": ()}
        extra = ["--tier", "premium", "--topology", topology]
        with namespaces(spec, inproc=args.inproc, args=() if args.inproc else extra) as ns:
            if args.inproc:
                raise SystemExit("--large-sizes needs the namespaces in child processes (drop --inproc)")
            config = ServiceBusConfig(
                primary=NamespaceConfig(
                    connection_string=Secret(ns["primary"].connection_string), namespace_name="primary"
                ),
                secondary=NamespaceConfig(connection_string=Secret(ns["secondary"].connection_string)),
                entity=QUEUE,
                retry=RetryConfig(),
            )
            config = replace(config, max_message_size=LARGE_KB * 1024)
            for index, latency in enumerate((0.0, args.latency)):
                ns["primary"].set_latency(latency)
                for size in sizes:
                    raw, ours = run_large(
                        ns["primary"].connection_string, config, index, args.large_count, size, args.repeats
                    )
                    print(
                        f"latency {latency * 1000:.0f} ms, {args.large_count} x {size} B (Premium, each alone): "
                        f"raw SDK one by one {raw:.1f} MB/s, PairedSender {ours:.1f} MB/s, ratio {ours / raw:.2f} "
                        "(target >= 0.9)",
                        flush=True,
                    )
    finally:
        os.unlink(topology)


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
    parser.add_argument(
        "--large-sizes", default="1500000,5000000", help="bytes, comma-separated ('' for none)"
    )
    parser.add_argument("--large-count", type=int, default=60)
    args = parser.parse_args()
    if args.smoke:
        args.count, args.repeats = 500, 1
        args.large_sizes, args.large_count = "1500000", 3
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
    sizes = [int(x) for x in args.large_sizes.split(",") if x.strip()]
    if sizes:
        main_large(args, sizes)


if __name__ == "__main__":
    main()
