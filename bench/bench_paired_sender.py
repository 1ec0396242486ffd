"""Benchmark: PairedSender vs the raw SDK batch sender, same local namespace, same run.

    .venv/bin/python bench/bench_paired_sender.py [--count 100000] [--size 200] [--latency 0.002]

Sends ``count`` messages of ``size`` bytes (a) with the raw SDK (``ServiceBusMessage`` objects packed into
``ServiceBusMessageBatch`` by size, sent with ``send_messages``), (b) through ``PairedSender.send`` from
``OutboundMessage`` objects (streamed, packed by size, failover bookkeeping on). Prints msgs/s of both and the
ratio (target >= 0.9), without and with injected latency. The queue is emptied between runs. Runs on the
driver machine only (no Spark).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import MessageSizeExceededError

from spark_sb.config import NamespaceConfig, RetryConfig, Secret, ServiceBusConfig
from spark_sb.failover import FailoverRegistry
from spark_sb.local.server import LocalNamespace
from spark_sb.mapping import OutboundMessage
from spark_sb.sender import PairedSender

QUEUE = "bench"


def raw_sdk(conn: str, count: int, body: bytes) -> float:
    """Seconds to send ``count`` messages with the raw SDK batch sender (one client, one sender)."""
    with ServiceBusClient.from_connection_string(conn) as client, client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(ServiceBusMessage(body))  # open the link (not timed)
        started = time.perf_counter()
        batch = sender.create_message_batch()
        for _ in range(count):
            message = ServiceBusMessage(body)
            try:
                batch.add_message(message)
            except MessageSizeExceededError:
                sender.send_messages(batch)
                batch = sender.create_message_batch()
                batch.add_message(message)
        if len(batch):
            sender.send_messages(batch)
        return time.perf_counter() - started


def paired(config: ServiceBusConfig, count: int, body: bytes) -> float:
    """Seconds to send ``count`` messages through PairedSender (streamed from a generator)."""

    def rows() -> Iterator[OutboundMessage]:
        for _ in range(count):
            yield OutboundMessage(body=body)

    with PairedSender(config, registry=FailoverRegistry()) as sender:
        sender.send([OutboundMessage(body=body)])  # open the link (not timed)
        started = time.perf_counter()
        out = sender.send(rows())
        elapsed = time.perf_counter() - started
    assert out.sent == {QUEUE: count}, out
    return elapsed


def reset(primary: Any) -> None:
    primary.broker.delete_queue(QUEUE)
    primary.broker.create_queue(QUEUE)


def run(primary: Any, config: ServiceBusConfig, count: int, size: int, repeats: int) -> tuple[float, float]:
    body = b"x" * size
    results: dict[str, list[float]] = {"raw": [], "paired": []}
    runners: dict[str, Callable[[], float]] = {
        "raw": lambda: raw_sdk(primary.connection_string, count, body),
        "paired": lambda: paired(config, count, body),
    }
    for _ in range(repeats):
        for name, fn in runners.items():  # interleaved, so drift affects both alike
            reset(primary)
            results[name].append(count / fn())
    return statistics.median(results["raw"]), statistics.median(results["paired"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--latency", type=float, default=0.002)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    with (
        LocalNamespace(name="primary", queues=[QUEUE]) as primary,
        LocalNamespace(name="secondary") as secondary,
    ):
        config = ServiceBusConfig(
            primary=NamespaceConfig(
                connection_string=Secret(primary.connection_string), namespace_name="primary"
            ),
            secondary=NamespaceConfig(connection_string=Secret(secondary.connection_string)),
            entity=QUEUE,
            retry=RetryConfig(),
        )
        for latency in (0.0, args.latency):
            primary.faults.set_latency(latency)
            raw, ours = run(primary, config, args.count, args.size, args.repeats)
            print(
                f"latency {latency * 1000:.0f} ms, {args.count} x {args.size} B: raw SDK {raw:,.0f} msgs/s, "
                f"PairedSender {ours:,.0f} msgs/s, ratio {ours / raw:.2f} (target >= 0.9)"
            )


if __name__ == "__main__":
    main()
