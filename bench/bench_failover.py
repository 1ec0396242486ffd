"""Benchmark: failover and recovery lag for every outage shape, and failed-over throughput against the raw SDK.

    .venv/bin/python bench/bench_failover.py [--repeats 3] [--interval 2] [--ping 1] [--shapes refused,dns]
                                             [--count 50000] [--size 200] [--latency 0.002] [--skip-lags]
                                             [--skip-throughput] [--skip-steady] [--slices 20] [--slice 5000]
                                             [--smoke]

Part 1 (lags): for each outage shape the local namespace can make (harness/outages.py: refused, dropped, stall
after / before SASL warm and cold, DNS failure, entity disabled / not found / quota exceeded, per-entity
stall), a sender loop sends 50-message batches back to back (SDK defaults: send_timeout 30 s, 3 SDK retries);
the primary breaks; failover lag = first diverted message - fault start - failover_interval (goal <= 0.5 s);
the primary heals; recovery lag = first message accepted by the primary again - heal (goal <= ping interval +
0.5 s). Median of ``--repeats`` runs, plus lost messages (always 0) over all runs. In-process namespaces.

Part 2 (throughput): ``count`` messages of ``size`` bytes (a) with the raw SDK batch sender
(``ServiceBusMessage`` packed into ``ServiceBusMessageBatch`` by size) into one backlog queue, (b) through a
failed-over ``PairedSender`` (its primary refuses connections; one backlog queue), which translates each message
once straight into backlog batches; and (c) a healthy ``PairedSender`` into the primary against the raw SDK
into the same namespace. ``--repeats-throughput`` pairs (default 9): ours and its raw baseline back to back, the
order alternating between pairs; the ratio is the median of the per-pair ratios. Without and with injected
latency; namespaces in child processes. Goals: failed over >= 0.9x raw, healthy >= 0.95x raw.

Part 3 (steady state, ``--slices`` / ``--slice``): the same four cases with every sender kept open, as a
streaming writer's would be, timed in ``--slices`` rounds of ``--slice`` messages, ours and raw back to back in
each round. Finer interleaving cancels the machine's drift that single 50,000-message runs suffer from.

``--smoke`` (CI's smoke mode, seconds): part 1 for the shapes refused and stall-after-sasl once (failover_interval
and ping 0.5 s), parts 2 and 3 with 300 messages, one pair, one slice of 300.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from functools import partial
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from azure.servicebus import ServiceBusClient, ServiceBusMessage  # noqa: E402
from azure.servicebus.exceptions import MessageSizeExceededError  # noqa: E402

from harness.namespaces import namespaces  # noqa: E402
from spark_sb.config.namespace import NamespaceConfig  # noqa: E402
from spark_sb.config.secret import Secret  # noqa: E402
from spark_sb.config.service_bus import ServiceBusConfig  # noqa: E402
from spark_sb.failover.registry import FailoverRegistry  # noqa: E402
from spark_sb.message.backlog import BACKLOG_ENQUEUED, BACKLOG_PATH  # noqa: E402
from spark_sb.message.outbound import OutboundMessage  # noqa: E402
from spark_sb.sender.paired import PairedSender  # noqa: E402

# --------------------------------------------------------------------------------------------- part 1: lags


def lags(args: argparse.Namespace) -> None:
    from harness.outages import SHAPES, prepare, run_outage
    from servicebus_local.fixtures import NamespacePair
    from servicebus_local.server import LocalNamespace

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


class _RawStream:
    """The raw SDK baseline kept open across slices (one client, one sender), like a long-running writer."""

    def __init__(self, conn: str, queue: str, body: bytes, backlog_form: bool) -> None:
        self._client = ServiceBusClient.from_connection_string(conn)
        self._sender = self._client.get_queue_sender(queue)
        self._sender.send_messages(ServiceBusMessage(body))  # open the link
        self._body = body
        self._backlog_form = backlog_form

    def slice(self, count: int) -> float:
        body, sender = self._body, self._sender
        started = time.perf_counter()
        now = datetime.now(timezone.utc)
        batch = sender.create_message_batch()
        for _ in range(count):
            if self._backlog_form:
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

    def close(self) -> None:
        self._sender.close()
        self._client.close()


class _PairedStream:
    """A ``PairedSender`` kept open across slices (as the Spark sink keeps one per Python worker)."""

    def __init__(self, config: ServiceBusConfig, entity: str, body: bytes, expect: str) -> None:
        self._sender = PairedSender(config, registry=FailoverRegistry())
        self._entity = entity
        self._body = body
        self._expect = expect
        self.slice(1)  # open the links (and fail over)

    def slice(self, count: int) -> float:
        body, entity = self._body, self._entity
        started = time.perf_counter()
        out = self._sender.send(OutboundMessage(body=body, entity=entity) for _ in range(count))
        elapsed = time.perf_counter() - started
        got = out.total_diverted if self._expect == "diverted" else out.total_sent
        assert got == count, out
        return elapsed

    def close(self) -> None:
        self._sender.close()


def raw_sdk(conn: str, queue: str, count: int, body: bytes, backlog_form: bool = False) -> float:
    """Seconds to send ``count`` messages with the raw SDK batch sender (one client, one sender; the link is
    opened first, not timed). With ``backlog_form`` each message carries the two properties every backlog
    message needs (its destination and when it entered the backlog), as a hand-written failover writer's would."""
    stream = _RawStream(conn, queue, body, backlog_form)
    try:
        return stream.slice(count)
    finally:
        stream.close()


def paired(config: ServiceBusConfig, entity: str, count: int, body: bytes, expect: str) -> float:
    """Seconds to send ``count`` messages through PairedSender (streamed from a generator; the links are opened
    and, failed over, the failover is taken first, not timed)."""
    stream = _PairedStream(config, entity, body, expect)
    try:
        return stream.slice(count)
    finally:
        stream.close()


def _configs(
    primary_conn: str, secondary_conn: str, down_name: str
) -> tuple[ServiceBusConfig, ServiceBusConfig]:
    """(failed over, healthy): in the first the primary refuses connections, so the first batch fails over
    (interval 0) and nothing probes it during the run; the second sends to the live primary."""
    refused = "Endpoint=sb://127.0.0.1:1/;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true"
    down = ServiceBusConfig(
        primary=NamespaceConfig(connection_string=Secret(refused), namespace_name=down_name),
        secondary=NamespaceConfig(connection_string=Secret(secondary_conn)),
        entity="orders",
        backlog_queue_count=1,
        failover_interval=0.0,
        ping_primary_interval=3600.0,
    )
    up = ServiceBusConfig(
        primary=NamespaceConfig(connection_string=Secret(primary_conn), namespace_name="primary"),
        secondary=NamespaceConfig(connection_string=Secret(secondary_conn)),
        backlog_queue_count=1,
    )
    return down, up


def _ratios(pairs: list[tuple[float, float]]) -> tuple[float, float, float]:
    """(median ours msgs/s, median raw msgs/s, median of the per-pair ratios ours / raw)."""
    return (
        statistics.median(o for o, _ in pairs),
        statistics.median(r for _, r in pairs),
        statistics.median(o / r for o, r in pairs),
    )


def throughput(args: argparse.Namespace) -> None:
    """Paired runs: each repeat measures ours and its raw baseline back to back, the order alternating from one
    repeat to the next (on this 2-core machine whichever runs second in a pair tends to be a few percent faster),
    and the ratio reported is the median of the per-pair ratios, so that slow drift and the order cancel out."""
    body = b"x" * args.size
    runs = range(args.repeats_throughput)
    backlog = [
        f"fo{lat}-{k}-{i}/x-servicebus-transfer/0" for lat in (0, 1) for k in ("raw", "ours") for i in runs
    ]
    primary_queues = [f"h{lat}-{k}-{i}" for lat in (0, 1) for k in ("raw", "ours") for i in runs]
    with namespaces({"primary": primary_queues, "secondary": backlog}) as ns:
        primary_conn, secondary_conn = ns["primary"].connection_string, ns["secondary"].connection_string
        for index, latency in enumerate((0.0, args.latency)):
            for n in ns.values():
                n.set_latency(latency)
            failed_over: list[tuple[float, float]] = []  # (ours, raw) msgs/s per repeat
            healthy: list[tuple[float, float]] = []
            for i in runs:
                down, up = _configs(primary_conn, secondary_conn, f"fo{index}-ours-{i}")
                raw_queue = f"fo{index}-raw-{i}/x-servicebus-transfer/0"
                fo = {  # the raw baseline sends the same messages: with the two properties of a backlog message
                    "raw": partial(raw_sdk, secondary_conn, raw_queue, args.count, body, backlog_form=True),
                    "ours": partial(paired, down, "orders", args.count, body, "diverted"),
                }
                up_runs = {
                    "raw": partial(raw_sdk, primary_conn, f"h{index}-raw-{i}", args.count, body),
                    "ours": partial(paired, up, f"h{index}-ours-{i}", args.count, body, "sent"),
                }
                order = ("raw", "ours") if i % 2 == 0 else ("ours", "raw")
                for runs_of, out in ((fo, failed_over), (up_runs, healthy)):
                    rate = {kind: args.count / runs_of[kind]() for kind in order}
                    out.append((rate["ours"], rate["raw"]))
            head = f"latency {latency * 1000:.0f} ms, {args.count} x {args.size} B, {len(runs)} pairs"
            ours, raw, ratio = _ratios(failed_over)
            print(
                f"{head}, failed over: raw SDK {raw:,.0f} msgs/s (with the two backlog properties), PairedSender "
                f"{ours:,.0f} msgs/s; median ratio {ratio:.2f} (goal >= 0.9); pairs: "
                + " ".join(f"{o / r:.2f}" for o, r in failed_over),
                flush=True,
            )
            ours, raw, ratio = _ratios(healthy)
            print(
                f"{head}, healthy: raw SDK {raw:,.0f} msgs/s, PairedSender {ours:,.0f} msgs/s; median ratio "
                f"{ratio:.2f} (goal >= 0.95); pairs: " + " ".join(f"{o / r:.2f}" for o, r in healthy),
                flush=True,
            )


def steady(args: argparse.Namespace) -> None:
    """Steady state: one raw sender and one ``PairedSender`` per case, kept open, and ``--slices`` rounds of
    ``--slice`` messages each, ours and raw back to back in each round (order alternating). Slow drift of the
    machine's speed hits both alike, and neither pays for connecting or for the other's background close. The
    ratio is total time raw / total time ours (the median of the per-round ratios is printed too)."""
    body = b"x" * args.size
    backlog = tuple(f"st{lat}-{k}/x-servicebus-transfer/0" for lat in (0, 1) for k in ("raw", "ours"))
    primary_queues = tuple(f"st{lat}-{k}" for lat in (0, 1) for k in ("raw", "ours"))
    with namespaces({"primary": primary_queues, "secondary": backlog}) as ns:
        primary_conn, secondary_conn = ns["primary"].connection_string, ns["secondary"].connection_string
        for index, latency in enumerate((0.0, args.latency)):
            for n in ns.values():
                n.set_latency(latency)
            down, up = _configs(primary_conn, secondary_conn, f"st{index}-ours")
            cases: dict[str, dict[str, Any]] = {
                "failed over": {
                    "raw": _RawStream(secondary_conn, f"st{index}-raw/x-servicebus-transfer/0", body, True),
                    "ours": _PairedStream(down, "orders", body, "diverted"),
                },
                "healthy": {
                    "raw": _RawStream(primary_conn, f"st{index}-raw", body, False),
                    "ours": _PairedStream(up, f"st{index}-ours", body, "sent"),
                },
            }
            times: dict[str, dict[str, list[float]]] = {c: {"raw": [], "ours": []} for c in cases}
            for case in cases.values():  # warm-up slice each, not timed
                for stream in case.values():
                    stream.slice(args.slice)
            for r in range(args.slices):
                order = ("raw", "ours") if r % 2 == 0 else ("ours", "raw")
                for name, case in cases.items():
                    for kind in order:
                        times[name][kind].append(case[kind].slice(args.slice))
            for case in cases.values():
                for stream in case.values():
                    stream.close()
            for name, goal in (("failed over", 0.9), ("healthy", 0.95)):
                raw_t, ours_t = times[name]["raw"], times[name]["ours"]
                total = args.slice * args.slices
                print(
                    f"steady, latency {latency * 1000:.0f} ms, {args.slices} x {args.slice} x {args.size} B, {name}: "
                    f"raw SDK {total / sum(raw_t):,.0f} msgs/s, PairedSender {total / sum(ours_t):,.0f} msgs/s; "
                    f"ratio {sum(raw_t) / sum(ours_t):.2f} (goal >= {goal}); median of the per-round ratios "
                    f"{statistics.median(r / o for r, o in zip(raw_t, ours_t, strict=True)):.2f}",
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
    parser.add_argument("--repeats-throughput", type=int, default=9, help="pairs per latency (median ratio)")
    parser.add_argument("--slices", type=int, default=20, help="steady state: rounds per latency")
    parser.add_argument("--slice", type=int, default=5_000, help="steady state: messages per slice")
    parser.add_argument("--skip-lags", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-steady", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="seconds: two shapes once, 300 messages (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.shapes, args.repeats, args.interval, args.ping = "refused,stall-after-sasl", 1, 0.5, 0.5
        args.count, args.repeats_throughput, args.slices, args.slice = 300, 1, 1, 300
    if not args.skip_lags:
        lags(args)
    if not args.skip_throughput:
        throughput(args)
    if not args.skip_steady:
        steady(args)


if __name__ == "__main__":
    main()
