"""Benchmark: packing messages into Service Bus batches, CPU only (no namespace: packing does no I/O, so there is
no latency to inject). What one ``send()`` spends before its first attempt, for E entities.

    .venv/bin/python bench/bench_packing.py [--messages 2000] [--entities 1000] [--size 200] [--rounds 15] [--smoke]

Three ways to put ``--messages`` messages, round-robin over ``--entities`` batches, each run in every round,
interleaved (the order alternating between rounds):

- raw: the raw SDK - a ``ServiceBusMessage`` per message and ``ServiceBusMessageBatch.add_message`` (which encodes
  each message twice);
- sdk path: the product's way for messages it does not build itself - ``OutboundMessage.to_sdk`` and
  :func:`spark_sb.message.packing.add_to_batch` (one encoding);
- ours: :func:`spark_sb.message.packing.add_outbound`, what ``SdkBatch.try_add`` calls - plain messages built straight into
  pyamqp's message.

Prints the median msgs/s of each and the median of the per-round ratios against raw. ``--smoke``: 200 messages over
20 entities, 2 rounds (CI's smoke mode).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from azure.servicebus import ServiceBusMessage, ServiceBusMessageBatch
from azure.servicebus.exceptions import MessageSizeExceededError

from spark_sb.message.outbound import OutboundMessage
from spark_sb.message.packing import add_outbound, add_to_batch


def _raw_add(batch: ServiceBusMessageBatch, m: OutboundMessage) -> bool:
    try:
        batch.add_message(ServiceBusMessage(m.body, message_id=m.message_id))
    except MessageSizeExceededError:
        return False
    return True


WAYS: dict[str, Callable[[ServiceBusMessageBatch, OutboundMessage], bool]] = {
    "raw": _raw_add,
    "sdk path": lambda b, m: add_to_batch(b, m.to_sdk()),
    "ours": add_outbound,
}


def _round(
    add: Callable[[ServiceBusMessageBatch, OutboundMessage], bool], msgs: list[OutboundMessage]
) -> float:
    batches: dict[str | None, ServiceBusMessageBatch] = {}
    started = time.perf_counter()
    for m in msgs:
        batch = batches.get(m.entity)
        if batch is None:
            batch = batches[m.entity] = ServiceBusMessageBatch(max_size_in_bytes=262144)
        if not add(batch, m):
            batch = batches[m.entity] = ServiceBusMessageBatch(max_size_in_bytes=262144)
            add(batch, m)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--entities", type=int, default=1000)
    parser.add_argument("--size", type=int, default=200, help="body bytes")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--smoke", action="store_true", help="200 messages, 20 entities, 2 rounds (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.messages, args.entities, args.rounds = 200, 20, 2
    body = b"x" * args.size
    msgs = [
        OutboundMessage(body=body, entity=f"q{i % args.entities}", message_id=f"m-{i}", properties={"n": i})
        for i in range(args.messages)
    ]
    seconds: dict[str, list[float]] = {k: [] for k in WAYS}
    ratios: dict[str, list[float]] = {k: [] for k in WAYS}
    names = list(WAYS)
    for r in range(args.rounds + 1):
        order = names if r % 2 else names[::-1]
        took = {k: _round(WAYS[k], msgs) for k in order}
        if r == 0:
            continue  # warm-up
        for k, t in took.items():
            seconds[k].append(t)
            ratios[k].append(took["raw"] / t)
    print(
        f"{args.messages} messages of {args.size} B over {args.entities} batches, {args.rounds} rounds (CPU only)"
    )
    print(f"{'way':>10} {'msgs/s':>10} {'ms/round':>9} {'vs raw':>7}")
    for k in names:
        med = statistics.median(seconds[k])
        print(
            f"{k:>10} {args.messages / med:>10,.0f} {med * 1000:>9.1f} {statistics.median(ratios[k]):>7.2f}"
        )


if __name__ == "__main__":
    main()
