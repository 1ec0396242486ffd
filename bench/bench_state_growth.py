"""Benchmark: the state tables after months of a stream, before and after ``spark-sb maintain``.

    .venv/bin/python bench/bench_state_growth.py [--batches 100000] [--commits 2000] [--repeat 5] [--check]

Real Spark (local[2], Delta). Three sets of tables:

* ``fresh``: a young deployment (entity records, one batch per sink): the baseline;
* ``grown``: the same plus ``--batches`` batches' worth of events (two sinks, four entities, one batch every
  30 s, so 100,000 batches span ~35 days), written in bulk with DataFrame operations, and ``--commits`` small
  commits (one batch each, through delta-rs) for the log a sink's background writer leaves;
* ``maintained``: ``grown`` after :func:`spark_sb.state.maintain` (retention 30 days: the oldest ~5 days go).

For each: a restarted sink's first batch start (``last_committed`` + the entities table), a later batch's start
(the entities table's version and rows), one group commit, ``status`` (deltalake, no Spark) as a function and as
the ``spark-sb status`` command; files per table. Goals: after maintenance, batch start within 10% of ``fresh``
and ``status`` under 3 s. ``--check`` exits 1 on a miss.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from spark_sb.session import build_spark_session  # noqa: E402
from spark_sb.state import StateTables, maintain  # noqa: E402
from tests.spark.state_growth import (  # noqa: E402
    bulk_history,
    entity_records,
    measure,
    seed,
    small_commits,
)


def status_command(location: str) -> float:
    """Seconds of ``spark-sb status --no-depths`` (a new Python process, as a user runs it)."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(
            "primary:\n  connection_string: Endpoint=sb://orders-ns.servicebus.windows.net/;"
            "SharedAccessKeyName=k;SharedAccessKey=x\n"
            f"state_location: {location}\n"
        )
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "spark_sb", "status", "--config", f.name, "--no-depths", "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    took = time.perf_counter() - started
    os.unlink(f.name)
    if done.returncode != 0:
        raise SystemExit(f"spark-sb status failed: {done.stderr[-2000:]}")
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=100_000)
    ap.add_argument("--commits", type=int, default=2_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()

    spark = build_spark_session("bench-state-growth", "local[2]", {"spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    root = tempfile.mkdtemp(prefix="bench-state-growth-")
    now = datetime.now(timezone.utc)
    records = entity_records(now)
    fresh, grown = f"{root}/fresh", f"{root}/grown"
    seed(spark, fresh, now, records)
    seed(spark, grown, now, records)

    started = time.perf_counter()
    rows = bulk_history(spark, grown, args.batches, end=now)
    bulk_s = time.perf_counter() - started
    started = time.perf_counter()
    small_commits(grown, args.commits, end=now, first_batch=args.batches // 2 + 1)
    commits_s = time.perf_counter() - started
    print(
        f"grown: {rows:,} event rows in bulk ({bulk_s:.1f} s), {args.commits} small commits ({commits_s:.1f} s)"
    )

    results: dict[str, object] = {"batches": args.batches, "commits": args.commits, "bulk_rows": rows}
    costs = {"fresh": measure(spark, fresh, repeat=args.repeat, batch_id=10_000_000)}
    print("fresh     ", costs["fresh"].to_json(), flush=True)
    costs["grown"] = measure(spark, grown, repeat=args.repeat, batch_id=20_000_000)
    print("grown     ", costs["grown"].to_json(), flush=True)
    started = time.perf_counter()
    report = maintain(spark, StateTables(location=grown), retention=30 * 86400)
    maintain_s = time.perf_counter() - started
    print(f"maintain: {maintain_s:.1f} s", json.dumps(report.to_json(), default=str), flush=True)
    costs["maintained"] = measure(spark, grown, repeat=args.repeat, batch_id=30_000_000)
    print("maintained", costs["maintained"].to_json(), flush=True)
    cli = {name: status_command(loc) for name, loc in (("fresh", fresh), ("maintained", grown))}
    print("spark-sb status (s):", {k: round(v, 2) for k, v in cli.items()})

    base, after = costs["fresh"], costs["maintained"]
    ratios = {
        "first_batch": after.first_batch / base.first_batch,
        "per_batch": after.per_batch / base.per_batch,
        "commit": after.commit / base.commit,
    }
    print("maintained / fresh:", {k: round(v, 3) for k, v in ratios.items()})
    misses = [k for k in ("first_batch", "per_batch") if ratios[k] > 1.10]
    if after.status >= 3.0 or cli["maintained"] >= 3.0:
        misses.append("status")
    results.update(
        {
            "maintain_seconds": round(maintain_s, 2),
            "costs": {k: v.to_json() for k, v in costs.items()},
            "ratios": ratios,
            "status_command": cli,
            "misses": misses,
        }
    )
    print(json.dumps(results, default=str))
    spark.stop()
    return 1 if args.check and misses else 0


if __name__ == "__main__":
    sys.exit(main())
