"""Benchmark: the syphon against a hand-written raw-SDK mover, on the same messages, same namespaces, same run.

    .venv/bin/python bench/bench_syphon.py [--count 20000] [--size 200] [--latency 0.002] [--repeats 3] [--smoke]

Both namespaces run in child processes (``python -m servicebus_local``), so the brokers do not share a GIL with the
movers. Every mover runs in its own child process (as a Spark partition runs in its own Python worker): the
backlog queue(s) are filled with ``count`` backlog-translated messages of ``size`` bytes; each mover opens its
links, then the timer starts when all movers start and stops when the last one has moved its share.

* ``raw``: the raw SDK mover: one client per namespace, a peek-lock receiver (prefetch 0) receiving up to 100
  messages, ``send_messages`` of the restored list to the entity of ``x-ms-path``, ``complete_message`` each.
* ``syphon 1q``: :meth:`spark_sb.syphon.mover.Syphon.drain_queue` on one queue (what one partition of the syphon job
  does: receivers and senders in lanes with deadlines, B6 restore, lock and TTL checks, health gate).
* ``syphon 4q``: four queues of ``count / 4`` messages, four movers at once (the job spreads queues over
  partitions; here on however many cores the machine has).

Prints msgs/s and the ratios (targets: syphon 1q / raw >= 0.9; syphon 4q / syphon 1q >= 1.7 on 2 cores), with no
latency and with ``--latency`` injected in both namespaces. Runs on the driver machine only (no Spark).
``--smoke``: 400 messages, one repeat (CI's smoke mode).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness.namespaces import namespaces  # noqa: E402
from harness.queues import put  # noqa: E402

DEST = "orders"
BATCH = 100


def fill(conn: str, queue: str, count: int, size: int) -> None:
    """Put ``count`` backlog messages (for ``DEST``) into ``queue`` (not timed)."""
    from spark_sb.message.backlog import to_backlog_sdk
    from spark_sb.message.outbound import OutboundMessage

    now = datetime.now(timezone.utc)
    body = b"x" * size
    put(
        conn,
        queue,
        (
            to_backlog_sdk(OutboundMessage(body=body, message_id=uuid.uuid4().hex), DEST, now)
            for _ in range(count)
        ),
    )


def raw_mover(primary: str, secondary: str, queue: str) -> Callable[[int], int]:
    """The hand-written mover (peek-lock receive, send to the primary, complete each), links opened (not timed).
    Returns the timed part: move ``count`` messages, return how many were moved."""
    from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode

    sec = ServiceBusClient.from_connection_string(secondary)
    pri = ServiceBusClient.from_connection_string(primary)
    receiver = sec.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.PEEK_LOCK, prefetch_count=0)
    sender = pri.get_queue_sender(DEST)
    receiver.__enter__()
    sender.__enter__()

    def run(count: int) -> int:
        moved = 0
        while moved < count:
            messages = receiver.receive_messages(max_message_count=BATCH, max_wait_time=1)
            out = []
            for m in messages:
                props = {
                    k: v
                    for k, v in (m.application_properties or {}).items()
                    if not bytes(k).startswith(b"x-ms-")
                }
                out.append(
                    ServiceBusMessage(b"".join(m.body), message_id=m.message_id, application_properties=props)
                )
            if out:
                sender.send_messages(out)
            for m in messages:
                receiver.complete_message(m)
            moved += len(messages)
        return moved

    return run


def syphon_mover(primary: str, secondary: str, queue: str) -> Callable[[int], int]:
    """:meth:`Syphon.drain_queue`, one receive batch at a time (no empty receive's wait at the end, like the raw
    mover), its links opened (not timed)."""
    from spark_sb.config.service_bus import ServiceBusConfig
    from spark_sb.syphon.mover import Syphon
    from spark_sb.wire.transport import PRIMARY, Target

    config = ServiceBusConfig.from_dict(
        {
            "primary": {"connection_string": primary, "namespace_name": "primary"},
            "secondary": {"connection_string": secondary},
            "send_timeout": "30s",
            "syphon": {"batch_size": BATCH},
        }
    )
    syphon = Syphon(config, backlog_queues=[queue], healthy_hints={DEST: "healthy"})
    syphon._lane(queue, False).call(lambda ctx: None, 30)  # the receiver's link (bench only: a private hook)
    syphon._primary.warm(Target(PRIMARY, DEST))  # the sender's link

    def run(count: int) -> int:
        moved = 0
        while moved < count:
            moved += syphon.drain_queue(queue, max_wait=1, max_batches=1).forwarded_total
        syphon.close()
        return moved

    return run


def _worker(kind: str, primary: str, secondary: str, queue: str, count: int, start: Any, done: Any) -> None:
    run = (raw_mover if kind == "raw" else syphon_mover)(primary, secondary, queue)
    time.sleep(0.5)  # let the background link opening (warm) finish before the start line
    start.wait()
    done.put(run(count))


def timed(kind: str, primary: str, secondary: str, queues: list[str], count: int) -> float:
    """msgs/s of ``len(queues)`` movers of ``kind`` in child processes, ``count`` messages in all."""
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(len(queues) + 1)
    done: Any = ctx.Queue()
    share = count // len(queues)
    procs = [
        ctx.Process(target=_worker, args=(kind, primary, secondary, q, share, start, done), daemon=True)
        for q in queues
    ]
    for p in procs:
        p.start()
    start.wait()
    began = time.perf_counter()
    moved = sum(done.get(timeout=600) for _ in procs)
    elapsed = time.perf_counter() - began
    for p in procs:
        p.join(30)
    assert moved >= share * len(queues), moved
    return moved / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--latency", type=float, default=0.002)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="400 messages, one repeat (CI's smoke mode)")
    args = parser.parse_args()
    if args.smoke:
        args.count, args.repeats = 400, 1
    runs = [(lat, kind, i) for lat in (0, 1) for kind in ("raw", "1q", "4q") for i in range(args.repeats)]
    names = {
        run: [
            f"primary/x-servicebus-transfer/{run[0]}-{run[1]}-{run[2]}-{j}"
            for j in range(4 if run[1] == "4q" else 1)
        ]
        for run in runs
    }
    all_queues = tuple(q for qs in names.values() for q in qs)
    with namespaces({"primary": (DEST,), "secondary": all_queues}) as ns:
        primary, secondary = ns["primary"].connection_string, ns["secondary"].connection_string
        for index, latency in enumerate((0.0, args.latency)):
            for n in ns.values():
                n.set_latency(latency)
            rates: dict[str, list[float]] = {"raw": [], "1q": [], "4q": []}
            for i in range(args.repeats):
                for kind in ("raw", "1q", "4q"):  # interleaved, so drift affects all alike
                    queues = names[(index, kind, i)]
                    for q in queues:
                        fill(secondary, q, args.count // len(queues), args.size)
                    rates[kind].append(
                        timed("raw" if kind == "raw" else "syphon", primary, secondary, queues, args.count)
                    )
            raw, one, four = (statistics.median(rates[k]) for k in ("raw", "1q", "4q"))
            print(
                f"latency {latency * 1000:.0f} ms, {args.count} x {args.size} B: raw mover {raw:,.0f} msgs/s, "
                f"syphon 1 queue {one:,.0f} msgs/s (ratio {one / raw:.2f}, target >= 0.9), "
                f"syphon 4 queues {four:,.0f} msgs/s ({four / one:.2f}x one queue, target >= 1.7)",
                flush=True,
            )


if __name__ == "__main__":
    main()
