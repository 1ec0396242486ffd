"""Benchmark: failover and recovery lag for every outage shape, and failed-over throughput against the raw SDK.

    .venv/bin/python bench/bench_failover.py [--repeats 3] [--interval 2] [--ping 1] [--shapes refused,dns]
                                             [--count 50000] [--size 200] [--latency 0.002] [--skip-lags]

Part 1 (lags): for each outage shape the local namespace can make (tests/outages.py: refused, dropped, stall
after / before SASL warm and cold, DNS failure, entity disabled / not found / quota exceeded, per-entity
stall), a sender loop sends 50-message batches back to back (SDK defaults: send_timeout 30 s, 3 SDK retries);
the primary breaks; failover lag = first diverted message - fault start - failover_interval (goal <= 0.5 s);
the primary heals; recovery lag = first message accepted by the primary again - heal (goal <= ping interval +
0.5 s). Median of ``--repeats`` runs, plus lost messages (always 0) over all runs. In-process namespaces.

Part 2 (throughput): ``count`` messages of ``size`` bytes (a) with the raw SDK batch sender
(``ServiceBusMessage`` packed into ``ServiceBusMessageBatch`` by size) into one backlog queue, (b) through a
failed-over ``PairedSender`` (its primary refuses connections; one backlog queue), which translates each message
once straight into backlog batches; and (c) a healthy ``PairedSender`` into the primary against the raw SDK
into the same namespace. Median of 5 interleaved runs, without and with injected latency; namespaces in child
processes. Goals: failed over >= 0.9x raw, healthy >= 0.95x raw.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from azure.servicebus import ServiceBusClient, ServiceBusMessage  # noqa: E402
from azure.servicebus.exceptions import MessageSizeExceededError  # noqa: E402
from bench_local_namespace import namespace  # noqa: E402 - sibling script

from spark_sb.backlog import BACKLOG_ENQUEUED, BACKLOG_PATH  # noqa: E402
from spark_sb.config import NamespaceConfig, Secret, ServiceBusConfig  # noqa: E402
from spark_sb.failover import FailoverRegistry  # noqa: E402
from spark_sb.mapping import OutboundMessage  # noqa: E402
from spark_sb.sender import PairedSender  # noqa: E402

# --------------------------------------------------------------------------------------------- part 1: lags


def lags(args: argparse.Namespace) -> None:
    from spark_sb.local.fixtures import NamespacePair
    from spark_sb.local.server import LocalNamespace
    from tests.outages import SHAPES, prepare, run_outage

    names = args.shapes.split(",") if args.shapes else list(SHAPES)
    print(
        f"failover_interval {args.interval:g} s, ping_primary_interval {args.ping:g} s, send_timeout 30 s, "
        f"SDK retries 3; median of {args.repeats}",
        flush=True,
    )
    print(
        f"{'outage shape':<24} {'failover lag':>13} {'recovery lag':>13} {'diverted':>9} {'lost':>5}",
        flush=True,
    )
    for name in names:
        fo: list[float] = []
        rec: list[float] = []
        diverted = lost = 0
        for _ in range(args.repeats):
            with LocalNamespace("primary") as p, LocalNamespace("secondary") as s:
                pair = NamespacePair(p, s)
                prepare(pair)
                t = run_outage(pair, SHAPES[name], interval=args.interval, ping=args.ping)
            fo.append(float("nan") if t.failover_lag is None else t.failover_lag)
            rec.append(float("nan") if t.recovery_lag is None else t.recovery_lag)
            diverted += t.diverted
            lost += t.lost
        print(
            f"{name:<24} {statistics.median(fo):>+12.2f}s {statistics.median(rec):>12.2f}s {diverted:>9} {lost:>5}",
            flush=True,
        )


# --------------------------------------------------------------------------------------- part 2: throughput


def raw_sdk(conn: str, queue: str, count: int, body: bytes, backlog_form: bool = False) -> float:
    """Seconds to send ``count`` messages with the raw SDK batch sender (one client, one sender). With
    ``backlog_form`` each message carries the two properties every backlog message needs (its destination and
    when it entered the backlog), as a hand-written failover writer's would."""
    with ServiceBusClient.from_connection_string(conn) as client, client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage(body))  # open the link (not timed)
        started = time.perf_counter()
        now = datetime.now(timezone.utc)
        batch = sender.create_message_batch()
        for _ in range(count):
            if backlog_form:
                props = {BACKLOG_PATH: "orders", BACKLOG_ENQUEUED: now}
                message = ServiceBusMessage(body, application_properties=props)
            else:
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


def paired(config: ServiceBusConfig, entity: str, count: int, body: bytes, expect: str) -> float:
    """Seconds to send ``count`` messages through PairedSender (streamed from a generator)."""

    def rows() -> Iterator[OutboundMessage]:
        for _ in range(count):
            yield OutboundMessage(body=body, entity=entity)

    with PairedSender(config, registry=FailoverRegistry()) as sender:
        warm = sender.send(
            [OutboundMessage(body=body, entity=entity)]
        )  # open the links, fail over (not timed)
        assert (warm.total_diverted if expect == "diverted" else warm.total_sent) == 1, warm
        started = time.perf_counter()
        out = sender.send(rows())
        elapsed = time.perf_counter() - started
    got = out.total_diverted if expect == "diverted" else out.total_sent
    assert got == count, out
    return elapsed


def throughput(args: argparse.Namespace) -> None:
    body = b"x" * args.size
    runs = range(args.repeats_throughput)
    kinds = ("raw", "rawb6", "ours")
    backlog = [f"fo{lat}-{k}-{i}/x-servicebus-transfer/0" for lat in (0, 1) for k in kinds for i in runs]
    primary_queues = [f"h{lat}-{k}-{i}" for lat in (0, 1) for k in ("raw", "ours") for i in runs]
    refused = "Endpoint=sb://127.0.0.1:1/;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true"
    with (
        namespace(False, "primary", tuple(primary_queues)) as (primary_conn, set_primary_latency),
        namespace(False, "secondary", tuple(backlog)) as (secondary_conn, set_latency),
    ):
        for index, latency in enumerate((0.0, args.latency)):
            set_latency(latency)
            set_primary_latency(latency)
            fo: dict[str, list[float]] = {k: [] for k in kinds}
            healthy: dict[str, list[float]] = {"raw": [], "ours": []}
            for i in runs:  # interleaved, so drift affects all alike
                down = ServiceBusConfig(  # the primary refuses connections: failed over on the first batch
                    primary=NamespaceConfig(
                        connection_string=Secret(refused), namespace_name=f"fo{index}-ours-{i}"
                    ),
                    secondary=NamespaceConfig(connection_string=Secret(secondary_conn)),
                    entity="orders",
                    backlog_queue_count=1,
                    failover_interval=0.0,
                    ping_primary_interval=3600.0,
                )
                for kind in ("raw", "rawb6"):
                    queue = f"fo{index}-{kind}-{i}/x-servicebus-transfer/0"
                    seconds = raw_sdk(secondary_conn, queue, args.count, body, backlog_form=kind == "rawb6")
                    fo[kind].append(args.count / seconds)
                fo["ours"].append(args.count / paired(down, "orders", args.count, body, "diverted"))
                up = ServiceBusConfig(
                    primary=NamespaceConfig(connection_string=Secret(primary_conn), namespace_name="primary"),
                    secondary=NamespaceConfig(connection_string=Secret(secondary_conn)),
                    backlog_queue_count=1,
                )
                healthy["raw"].append(
                    args.count / raw_sdk(primary_conn, f"h{index}-raw-{i}", args.count, body)
                )
                healthy["ours"].append(
                    args.count / paired(up, f"h{index}-ours-{i}", args.count, body, "sent")
                )
            head = f"latency {latency * 1000:.0f} ms, {args.count} x {args.size} B"
            raw, rawb6, ours = (statistics.median(fo[k]) for k in kinds)
            print(
                f"{head}, failed over: raw SDK {raw:,.0f} msgs/s (plain messages), {rawb6:,.0f} msgs/s (with the "
                f"two backlog properties); PairedSender {ours:,.0f} msgs/s; ratio {ours / rawb6:.2f} against the "
                f"same messages (goal >= 0.9), {ours / raw:.2f} against plain ones",
                flush=True,
            )
            raw, ours = statistics.median(healthy["raw"]), statistics.median(healthy["ours"])
            print(
                f"{head}, healthy: raw SDK {raw:,.0f} msgs/s, PairedSender {ours:,.0f} msgs/s, "
                f"ratio {ours / raw:.2f} (goal >= 0.95)",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per outage shape (median)")
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--ping", type=float, default=1.0)
    parser.add_argument("--shapes", default="", help="comma-separated subset of the outage shapes")
    parser.add_argument("--count", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--latency", type=float, default=0.002)
    parser.add_argument("--repeats-throughput", type=int, default=5)
    parser.add_argument("--skip-lags", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    args = parser.parse_args()
    if not args.skip_lags:
        lags(args)
    if not args.skip_throughput:
        throughput(args)


if __name__ == "__main__":
    main()
