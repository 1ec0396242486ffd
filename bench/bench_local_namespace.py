"""Benchmark of the local Service Bus namespace driven by the unmodified SDK (SPEC E6).

    python bench/bench_local_namespace.py [--messages 20000] [--size 200] [--latency-messages 2000] [--inproc]
                                          [--smoke]

Phases, each printed as msgs/s: batched send (``send_messages`` of size-packed ``ServiceBusMessageBatch``es),
peek-lock receive + ``complete_message`` per message, batched send again, receive-and-delete; then the same with
2 ms of injected latency on every write (on fewer messages: completing one message is one round trip).

By default the namespace runs in a child process (``python -m servicebus_local``), as it would next to a Spark
job, so the broker and the SDK do not share one GIL (harness/namespaces.py); ``--inproc`` runs it in this process
instead. ``--smoke``: 300 messages and 50 with latency (seconds in all: CI's smoke mode). Only loopback traffic;
bounded in count and time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode  # noqa: E402

from harness.namespaces import namespace  # noqa: E402


def send_batched(client: ServiceBusClient, n: int, size: int) -> float:
    body = b"x" * size
    with client.get_queue_sender("bench") as sender:
        sender.send_messages(ServiceBusMessage(body))  # open the link outside the timing
        t0 = time.perf_counter()
        sent = 0
        batch = sender.create_message_batch()
        while sent < n - 1:
            try:
                batch.add_message(ServiceBusMessage(body))
                sent += 1
            except ValueError:
                sender.send_messages(batch)
                batch = sender.create_message_batch()
        if len(batch):
            sender.send_messages(batch)
        return sent / (time.perf_counter() - t0)


def receive_complete(client: ServiceBusClient, n: int, deadline_s: float) -> tuple[int, float]:
    got = 0
    with client.get_queue_receiver("bench", max_wait_time=2) as receiver:
        t0 = time.perf_counter()
        end = time.monotonic() + deadline_s
        while got < n and time.monotonic() < end:
            msgs = receiver.receive_messages(max_message_count=200, max_wait_time=1)
            if not msgs:
                continue
            for m in msgs:
                receiver.complete_message(m)
            got += len(msgs)
        return got, got / (time.perf_counter() - t0)


def receive_delete(client: ServiceBusClient, n: int, deadline_s: float) -> tuple[int, float]:
    got = 0
    with client.get_queue_receiver(
        "bench", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    ) as receiver:
        t0 = time.perf_counter()
        end = time.monotonic() + deadline_s
        while got < n and time.monotonic() < end:
            got += len(receiver.receive_messages(max_message_count=1000, max_wait_time=1))
        return got, got / (time.perf_counter() - t0)


def run(conn_str: str, n: int, size: int, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    with ServiceBusClient.from_connection_string(conn_str) as client:
        out["send"] = send_batched(client, n, size)
        got, out["receive+complete"] = receive_complete(client, n, deadline_s=600)
        assert got >= n - 1, f"received {got} of {n}"
        out["send (again)"] = send_batched(client, n, size)
        got, out["receive-and-delete"] = receive_delete(client, n, deadline_s=300)
        assert got >= n - 1, f"received {got} of {n}"
    for k, v in out.items():
        print(f"{label:<22} {k:<20} {v:>10,.0f} msgs/s", flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--size", type=int, default=200)
    p.add_argument("--latency-messages", type=int, default=2_000)
    p.add_argument("--latency", type=float, default=0.002)
    p.add_argument("--inproc", action="store_true", help="run the namespace in this process")
    p.add_argument("--smoke", action="store_true", help="300 messages, 50 with latency (CI's smoke mode)")
    args = p.parse_args()
    if args.smoke:
        args.messages, args.latency_messages = 300, 50
    where = "in-process" if args.inproc else "child process"
    print(f"namespace in a {where}; {args.messages} x {args.size}-byte messages", flush=True)
    with namespace("bench", ("bench",), inproc=args.inproc) as ns:
        run(ns.connection_string, args.messages, args.size, "no latency")
        ns.set_latency(args.latency)
        run(ns.connection_string, args.latency_messages, args.size, f"latency {args.latency * 1000:g} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
