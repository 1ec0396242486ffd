"""Benchmark: does ``overlap_sends`` (pack the next batch while one is on the wire) earn its keep?

    .venv/bin/python bench/bench_overlap.py [--latency-ms 0,2] [--slices 10] [--slice 5000] [--entities 1]

For each latency, three local namespaces in child processes (as ``bench_fanout.py`` starts them): a
``PairedSender`` with ``overlap_sends=False``, one with ``overlap_sends=True`` and the raw SDK writer (one client,
one sender per entity), each kept open, send ``--slices`` rounds of ``--slice`` messages round-robin over
``--entities`` queues, interleaved (the order rotating between rounds). Prints msgs/s (median of the rounds) and
each sender's ratio against raw (median of the per-round ratios). Sends on an open link run on the sending thread
(``Lane.direct``) and are over when ``start_send`` returns, so the overlap has nothing to overlap once links are
open: this measures it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_fanout import BACKLOG_COUNT, _names, _namespaces, _Raw, _send_all  # noqa: E402

from spark_sb.config import ServiceBusConfig  # noqa: E402
from spark_sb.failover import FailoverRegistry  # noqa: E402
from spark_sb.sender import PairedSender  # noqa: E402


def run(latency: float, args: argparse.Namespace) -> None:
    entities = _names(args.entities)
    backlog = [f"primary/x-servicebus-transfer/{i}" for i in range(BACKLOG_COUNT)]
    body = b"x" * 200
    with _namespaces(entities, backlog) as ns:
        for n in ns.values():
            n.post("/faults/latency", {"seconds": latency})
        config = ServiceBusConfig.from_dict(
            {
                "primary": {"connection_string": ns["primary"].conn, "namespace_name": "primary"},
                "secondary": {"connection_string": ns["secondary"].conn},
                "backlog_queue_count": BACKLOG_COUNT,
            }
        )
        plain = PairedSender(config, registry=FailoverRegistry())
        overlap = PairedSender(config, registry=FailoverRegistry(), overlap_sends=True)
        raw = _Raw(ns["raw"].conn, entities, body)
        raw.open()
        runs = {
            "sync": lambda: _send_all(plain, entities, args.slice, body),
            "overlap": lambda: _send_all(overlap, entities, args.slice, body),
            "raw": lambda: raw.slice(args.slice),
        }
        for fn in runs.values():  # warm-up
            fn()
        rates: dict[str, list[float]] = {k: [] for k in runs}
        kinds = list(runs)
        for r in range(args.slices):
            for kind in kinds[r % 3 :] + kinds[: r % 3]:
                rates[kind].append(args.slice / runs[kind]())
        plain.close()
        overlap.close()
        raw.close()
    med = {k: statistics.median(v) for k, v in rates.items()}
    ratio = {k: statistics.median(a / b for a, b in zip(rates[k], rates["raw"], strict=True)) for k in runs}
    print(
        f"latency {latency * 1000:g} ms, E={args.entities}: "
        + ", ".join(f"{k} {med[k]:,.0f} msg/s ({ratio[k]:.2f}x raw)" for k in runs),
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", default="0,2")
    parser.add_argument("--slices", type=int, default=10)
    parser.add_argument("--slice", type=int, default=5000)
    parser.add_argument("--entities", type=int, default=1)
    args = parser.parse_args()
    for latency in (float(x) / 1000.0 for x in args.latency_ms.split(",")):
        run(latency, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
