"""Benchmark: the state tables after months of a stream, before and after ``spark-sb maintain``.

    .venv/bin/python bench/bench_state_growth.py [--batches 100000] [--commits 2000] [--rounds 7] [--check] [--smoke]

Real Spark (local[2], Delta). Three sets of tables:

* ``fresh``: a young deployment (entity records, one batch per sink): the baseline;
* ``grown``: the same plus ``--batches`` batches' worth of events (two sinks, four entities, one batch every
  30 s, so 100,000 batches span ~35 days), written in bulk with DataFrame operations, and ``--commits`` small
  commits (one batch each, through delta-rs) for the log a sink's background writer leaves;
* ``maintained``: a copy of ``grown`` after :func:`spark_sb.state.maintain` (retention 30 days: the oldest
  ~5 days go).

The measurement is interleaved so that a loaded machine (2 cores shared with others) does not decide it: each
round takes one sample of every set (the order rotated, and reversed every other round), after a warm-up round
that is not kept; figures are medians over ``--rounds`` rounds, and ``maintained / fresh`` is given both as the
ratio of the medians and as the median of the per-round ratios (the samples of one round are seconds apart).
A sample is a restarted sink's first batch start with Spark's Delta log cache cleared first (``ensure``,
``last_committed``, ``read_entities`` of a new store; ``--warm`` keeps the cache), then a later batch's start
(``entities_version``, ``read_entities``), then ``status`` as a function (deltalake, no Spark); each step is
timed on its own, so a slow step shows. Then group commits (rotated too) and ``spark-sb status`` as a command
(a new Python process, as a user runs it). Goals: after maintenance, batch start within 10% of ``fresh`` and
``status`` under 3 s. ``--check`` exits 1 on a miss; ``--json FILE`` keeps every sample. ``--smoke`` (CI's smoke
mode): 1,000 batches in 4 files, 5 small commits, one round and no warm-up round, one ``spark-sb status`` run per
set, the ``maintained`` set seeded as a copy of ``fresh``, and the JVM compiling with C1 only (``maintain`` and the
first Delta operations take most of its minute).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from harness.state_growth import (  # noqa: E402
    STEPS,
    bulk_history,
    commit_once,
    entity_records,
    interleaved,
    medians,
    paired_ratios,
    seed,
    small_commits,
)
from spark_sb.spark.session import LOCAL_DEFAULTS, build_spark_session  # noqa: E402
from spark_sb.state.delta import StateTables  # noqa: E402
from spark_sb.state.maintenance import maintain  # noqa: E402

SETS = ("fresh", "grown", "maintained")
GOAL_RATIO = 1.10
GOAL_STATUS = 3.0
#: ``--smoke``: the driver's JVM compiles with C1 only - a run of seconds spends less CPU compiling code it runs a few
#: times (Spark's start and its first Delta operations about a fifth shorter, measured on the 2-core machine).
SMOKE_SPARK_CONF = {
    "spark.driver.extraJavaOptions": f"{LOCAL_DEFAULTS['spark.driver.extraJavaOptions']} -XX:TieredStopAtLevel=1"
}


def status_command(location: str) -> float:
    """Seconds of ``spark-sb status --no-depths --no-duplicate-detection`` (a new Python process, as a user runs it):
    the state tables' read. The namespace in the configuration is a made-up one: asked for its entities'
    duplicate detection, the admin client's retries against it took 6-11 s of every run."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(
            "primary:\n  connection_string: Endpoint=sb://orders-ns.servicebus.windows.net/;"
            "SharedAccessKeyName=k;SharedAccessKey=x\n"
            f"state_location: {location}\n"
        )
    started = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "spark_sb",
            "status",
            "--config",
            f.name,
            "--no-depths",
            "--no-duplicate-detection",
            "--json",
        ],
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


def files_of(spark: Any, location: str) -> dict[str, int]:
    """Data files of each table (``DESCRIBE DETAIL``)."""
    return {
        t: int(spark.sql(f"DESCRIBE DETAIL delta.`{location}/{t}`").collect()[0]["numFiles"])
        for t in ("events", "entities", "rejects")
    }


def log_files(location: str) -> dict[str, int]:
    """Files in each table's ``_delta_log`` (JSON commits, checkpoints, CRCs)."""
    return {
        t: len(os.listdir(f"{location}/{t}/_delta_log"))
        for t in ("events", "entities", "rejects")
        if os.path.isdir(f"{location}/{t}/_delta_log")
    }


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def rotated(r: int) -> tuple[str, ...]:
    """The sets in round ``r``'s order."""
    return SETS[r % len(SETS) :] + SETS[: r % len(SETS)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=100_000)
    ap.add_argument("--commits", type=int, default=2_000)
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds kept (default 7)")
    ap.add_argument("--cli-rounds", type=int, default=3, help="spark-sb status runs per set (default 3)")
    ap.add_argument("--warm", action="store_true", help="keep Spark's Delta log cache between samples")
    ap.add_argument("--json", default=None, help="write every sample to this file")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="1,000 batches, 5 commits, one round (CI)")
    args = ap.parse_args()
    if args.smoke:
        args.batches, args.commits, args.rounds, args.cli_rounds = 1_000, 5, 1, 1

    conf = {"spark.ui.enabled": "false", **(SMOKE_SPARK_CONF if args.smoke else {})}
    spark = build_spark_session("bench-state-growth", "local[2]", conf)
    spark.sparkContext.setLogLevel("ERROR")
    root = tempfile.mkdtemp(prefix="bench-state-growth-")
    now = datetime.now(timezone.utc)
    records = entity_records(now)
    loc = {name: f"{root}/{name}" for name in SETS}
    seed(spark, loc["fresh"], now, records)
    if args.smoke:  # the same tables, copied: one seed (table creation and two commits through Spark) fewer
        shutil.copytree(loc["fresh"], loc["maintained"])
    else:
        seed(spark, loc["maintained"], now, records)

    started = time.perf_counter()
    rows = bulk_history(spark, loc["maintained"], args.batches, end=now, files=4 if args.smoke else 40)
    bulk_s = time.perf_counter() - started
    started = time.perf_counter()
    small_commits(loc["maintained"], args.commits, end=now, first_batch=args.batches // 2 + 1)
    commits_s = time.perf_counter() - started
    print(
        f"grown: {rows:,} event rows in bulk ({bulk_s:.1f} s), {args.commits} small commits ({commits_s:.1f} s)",
        flush=True,
    )
    shutil.copytree(loc["maintained"], loc["grown"])  # a path table's log names its files relative to it
    started = time.perf_counter()
    report = maintain(spark, StateTables(location=loc["maintained"]), retention=30 * 86400)
    maintain_s = time.perf_counter() - started
    print(f"maintain: {maintain_s:.1f} s", json.dumps(report.to_json(), default=str), flush=True)

    files = {name: files_of(spark, where) for name, where in loc.items()}
    logs = {name: log_files(where) for name, where in loc.items()}
    started = time.perf_counter()
    samples = interleaved(spark, loc, args.rounds, cold=not args.warm, warm_up=0 if args.smoke else 1)
    print(
        f"{args.rounds} interleaved rounds (+1 warm-up) in {time.perf_counter() - started:.1f} s", flush=True
    )
    commits: dict[str, list[float]] = {name: [] for name in SETS}
    for r in range(args.rounds):
        for i, name in enumerate(rotated(r)):
            commits[name].append(commit_once(spark, loc[name], 40_000_000 + 10 * r + i))
    spark.stop()
    cli: dict[str, list[float]] = {name: [] for name in SETS}
    for r in range(args.cli_rounds):
        for name in rotated(r):
            cli[name].append(status_command(loc[name]))

    med = {name: medians(samples[name]) for name in SETS}
    pairs: dict[str, list[float]] = {
        f: paired_ratios(samples["fresh"], samples["maintained"], f) for f in samples["fresh"][0]
    }
    for name in SETS:
        med[name]["commit"] = statistics.median(commits[name])
        med[name]["status_command"] = statistics.median(cli[name])
    for f, extra in (("commit", commits), ("status_command", cli)):
        pairs[f] = [b / a for a, b in zip(extra["fresh"], extra["maintained"], strict=True) if a > 0]

    figures = ("first_batch", *STEPS[:3], "per_batch", *STEPS[3:5], "status", "status_command", "commit")
    cache = "kept" if args.warm else "cleared before each first batch"
    print(f"\nmedians over {args.rounds} interleaved rounds, seconds (Delta log cache {cache}):\n")
    header = ["figure (s)", *SETS, "maintained / fresh (ratio of medians)", "median of per-round ratios"]
    body = []
    for f in figures:
        ratio = med["maintained"][f] / med["fresh"][f] if med["fresh"][f] > 0 else float("nan")
        paired = f"{statistics.median(pairs[f]):.2f}" if pairs[f] else "-"
        body.append([f, *(f"{med[n][f]:.3f}" for n in SETS), f"{ratio:.2f}", paired])
    print(markdown(header, body))
    print("\nfiles (data files per table; files in _delta_log):\n")
    print(
        markdown(
            ["set", "events", "entities", "rejects", "events _delta_log", "entities _delta_log"],
            [
                [n, *(str(files[n][t]) for t in ("events", "entities", "rejects"))]
                + [str(logs[n].get("events", 0)), str(logs[n].get("entities", 0))]
                for n in SETS
            ],
        )
    )
    ratios = {
        f: med["maintained"][f] / med["fresh"][f]
        for f in ("first_batch", "per_batch", "commit")
        if med["fresh"][f] > 0
    }
    misses = [k for k in ("first_batch", "per_batch") if ratios.get(k, 0.0) > GOAL_RATIO]
    if med["maintained"]["status"] >= GOAL_STATUS or med["maintained"]["status_command"] >= GOAL_STATUS:
        misses.append("status")
    print(
        f"\nmaintained / fresh: { {k: round(v, 3) for k, v in ratios.items()} }; misses: {misses or 'none'}"
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(
                {
                    "batches": args.batches,
                    "commits": args.commits,
                    "bulk_rows": rows,
                    "rounds": args.rounds,
                    "cold": not args.warm,
                    "maintain_seconds": round(maintain_s, 2),
                    "maintain": report.to_json(),
                    "medians": med,
                    "ratios": ratios,
                    "paired_ratios": pairs,
                    "files": files,
                    "log_files": logs,
                    "misses": misses,
                    "samples": samples,
                    "commit_samples": commits,
                    "status_command_samples": cli,
                },
                out,
                indent=1,
                default=str,
            )
    shutil.rmtree(root, ignore_errors=True)
    return 1 if args.check and misses else 0


if __name__ == "__main__":
    sys.exit(main())
