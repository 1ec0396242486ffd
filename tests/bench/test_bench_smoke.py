"""No bench rots (issue 30): every ``bench/bench_*.py`` runs in its smoke mode (``--smoke``: the same code path at
tiny sizes, seconds to a minute or two each) in a child process, exits 0, and prints the figures it exists for -
msgs/s, ratios, lags, resource counts - as numbers this test parses.

Not a measurement: the sizes are tiny and the machine is shared, so no performance goal is checked here (the
benches' own ``--check`` is for real runs). What is checked besides "it runs and says what it measured" is what
no load excuses: no message lost, a sender's threads and sockets back after ``close()``. The runs go three at a time
(``SMOKE_JOBS``), longest first: they mostly wait on sockets and Spark, and none is timing-sensitive.

Tier ``bench`` (from the directory, tests/conftest.py): ``make bench-smoke`` runs it, CI runs it as a tier of its
own, ``make test`` runs it with everything else, ``make test-fast`` leaves it out.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"

RATE = r"([\d,]+) msgs/s"  # 12,345 msgs/s
NUM = r"([\d.]+)"


@dataclass(frozen=True)
class Expect:
    """A line the bench prints ``count`` times (at least), every captured group a number."""

    pattern: str
    count: int = 1


#: script -> what its smoke run prints. Spark's start (the JVM, Delta) takes most of the Spark benches' time.
SMOKE: dict[str, list[Expect]] = {
    "bench_packing.py": [Expect(rf"^\s*(?:raw|sdk path|ours)\s+([\d,]+)\s+{NUM}\s+{NUM}$", 3)],
    "bench_local_namespace.py": [
        Expect(
            rf"^(?:no latency|latency 2 ms)\s+(?:send|receive\+complete|send \(again\)|receive-and-delete)\s+{RATE}$",
            8,
        )
    ],
    "bench_paired_sender.py": [
        Expect(rf"raw SDK {RATE}, PairedSender {RATE}, ratio {NUM} ", 2),
        # the large-message rows (Premium, each message alone), MB/s
        Expect(
            rf"x 1500000 B \(Premium, each alone\): raw SDK one by one {NUM} MB/s, PairedSender {NUM} MB/s", 2
        ),
    ],
    "bench_failover.py": [
        # shape, failover lag, recovery lag, diverted, lost (0)
        Expect(r"^(?:refused|stall-after-sasl)\s+[+-]([\d.]+)s\s+([\d.]+)s\s+(\d+)\s+0$", 2),
        Expect(rf"(?:failed over|healthy): raw SDK {RATE}.*PairedSender {RATE}; median ratio {NUM} ", 4),
        Expect(rf"^steady, .*(?:failed over|healthy): raw SDK {RATE}, PairedSender {RATE}; ratio {NUM} ", 4),
    ],
    "bench_fanout.py": [
        # E, cold s, raw open s, ours and raw msgs/s, ratio, outage/recovery s per shape, lost (0), conns
        Expect(
            r"^\s+2\s+([\d.]+)!?\s+([\d.]+)\s+([\d,]+)\s+([\d,]+)\s+([\d.]+)!?"
            r"\s+([\d.]+)!?/([\d.]+)!?\s+([\d.]+)!?/([\d.]+)!?\s+0\s+(\d+)!?/(\d+)\s"
        )
    ],
    "bench_isolation.py": [
        Expect(
            rf"E=6\s+sick=1\s+(?:stall|disabled)\s+1/2/5\s+to failover\s+{NUM} s .*\s{NUM} msgs/s\s+"
            rf"vs clean {NUM} \(vs healthy only {NUM}\)\s+clean vs raw {NUM} \({NUM} msgs/s\)"
            r".*\sconns (\d+) \(opened (\d+)\)",
            2,
        )
    ],
    "bench_outage_resources.py": [
        # the sender's threads and sockets are back within RETURN_WITHIN of close() ("NOT back" fails)
        Expect(
            r"^(?:healthy|refused|drop|stall-before-sasl|stall-after-sasl|blackhole)\s+(\d+) s\s+threads "
            r"(\d+)/(\d+)/(\d+) .* (\d+) msgs/s, (\d+) failed calls; after close\(\): back to (\d+) threads / "
            rf"(\d+) sockets in {NUM} s$",
            6,
        ),
        Expect(rf"ratio vs healthy: threads peak {NUM}x, sockets peak {NUM}x, msgs/s {NUM}x", 5),
    ],
    "bench_syphon.py": [
        Expect(
            rf"raw mover {RATE}, syphon 1 queue {RATE} \(ratio {NUM}, .*syphon 4 queues {RATE} \({NUM}x one queue",
            2,
        )
    ],
    "bench_sink_state.py": [
        Expect(
            rf"state on {RATE}, off {RATE}, ratio {NUM} .*the state costs (-?[\d.]+) s per batch .*"
            rf"raw SDK batch sender from one process {RATE}$"
        )
    ],
    "bench_datasource.py": [
        Expect(rf"^\s*(?:datasource|foreachBatch) +run 1: +{NUM} msgs/s \({NUM} s\)$", 2),
        Expect(rf"^ratio datasource / foreachBatch: {NUM} ", 1),
    ],
    "bench_state_growth.py": [
        Expect(rf"^\| first_batch \| {NUM} \| {NUM} \| {NUM} \| {NUM} \|"),
        Expect(rf"^\| status_command \| {NUM} \| {NUM} \| {NUM} \| {NUM} \|"),
        Expect(
            r"^maintained / fresh: \{'first_batch': ([\d.]+), 'per_batch': ([\d.]+), 'commit': ([\d.]+)\}"
        ),
    ],
    "bench_ordering.py": [
        # healthy: raw, none, session, ratio; recovery: drain, median, max (s); drain: none, session, ratio
        Expect(
            rf"^latency \d+ ms healthy, .*: raw SDK {RATE}, ordering none {RATE}, ordering session {RATE}, "
            rf"ratio {NUM} ",
            2,
        ),
        Expect(
            rf"^latency \d+ ms recovery, .*: drained in {NUM} s, back on the primary median {NUM} s, max {NUM} s ",
            2,
        ),
        Expect(
            rf"^latency \d+ ms drain, .*: ordering none {RATE}, ordering session {RATE}, ratio {NUM} .*; "
            rf"ordered: {NUM} peek calls, {NUM} messages peeked per message moved$",
            2,
        ),
        # held line (O7, no latency only): moved, receive calls, per message moved, deliveries per message moved,
        # the highest delivery count of a held message; nothing dead-lettered (no load excuses one)
        Expect(
            r"^latency \d+ ms held line, \d+ sessions, head locked \d+ s: (\d+) moved, (\d+) receive calls, "
            rf"{NUM} per message moved \(target <= 1\), {NUM} deliveries per message moved, max delivery count of a "
            r"held message (\d+) \(target <= 3\), dead-lettered 0$"
        ),
    ],
    "bench_source.py": [
        Expect(rf"^\| (?:raw-PL|raw-RD|source->noop) +\| +{RATE} \| +{RATE} \|$", 3),
        Expect(rf"^\| source->(?:noop|Delta) big +\| +{RATE} \| +- \|$", 2),
        Expect(
            rf"^ratio source->(?:noop / raw-(?:PL|RD)|Delta / source->noop) at [\d,]+(?: ms)?: {NUM} \(goal ",
            4,
        ),
        # A10's short form: nothing planned, committed or delivered while idle; the receives it polled
        Expect(
            r"^idle (\d+) s: 0 batches, 0 Delta commits, (\d+) receives \(([\d.]+) per receiveWaitTime 1 s\), 0 "
        ),
    ],
    "bench_soak.py": [
        Expect(r"^  written (\d+), sent to the primary (\d+), diverted (\d+), moved back (\d+) "),
        Expect(r"^SOAK OK: lost 0, duplicates (\d+)$"),
    ],
}

#: Seconds a smoke run may take on a loaded 2-core machine (what they took there, about twice over).
TIMEOUT = {
    "bench_sink_state.py": 480,
    "bench_datasource.py": 480,
    "bench_source.py": 480,
    "bench_state_growth.py": 480,
    "bench_soak.py": 600,
}
#: Smoke runs at once (SMOKE_JOBS): they are not timing-sensitive and mostly wait on sockets (alone, two at a time
#: kept the 2-core machine 55% busy), so three share its two cores well. Started longest first (their times alone,
#: 2026-12-07, in seconds), so that no long one starts last.
JOBS = int(os.environ.get("SMOKE_JOBS", "3"))
ORDER = [
    "bench_state_growth.py",  # 68
    "bench_soak.py",  # 56
    "bench_source.py",  # 44
    "bench_outage_resources.py",  # 32
    "bench_datasource.py",  # 29
    "bench_isolation.py",  # 26
    "bench_failover.py",  # 26
    "bench_syphon.py",  # 22
    "bench_ordering.py",  # 22
    "bench_sink_state.py",  # 16
    "bench_local_namespace.py",  # 11
    "bench_paired_sender.py",  # 5
    "bench_fanout.py",  # 5
    "bench_packing.py",  # 0.3
]


@dataclass(frozen=True)
class Run:
    returncode: int | None  # None: killed at its time limit
    stdout: str
    stderr: str
    seconds: float


def _run(script: str) -> Run:
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, str(BENCH / script), "--smoke"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=TIMEOUT.get(script, 300),
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return Run(None, out, "", time.monotonic() - started)
    return Run(done.returncode, done.stdout, done.stderr, time.monotonic() - started)


@pytest.fixture(scope="module")
def smoke_runs(request: pytest.FixtureRequest) -> Iterator[dict[str, Future[Run]]]:
    """The smoke runs of the benches this session selected, started when the first test asks, ``JOBS`` at a
    time."""
    selected = {
        item.callspec.params["script"]
        for item in request.session.items
        if item.module is request.module
        and "script" in getattr(getattr(item, "callspec", None), "params", {})
    }
    with ThreadPoolExecutor(JOBS, thread_name_prefix="smoke") as pool:
        yield {script: pool.submit(_run, script) for script in ORDER if script in selected}


def test_every_bench_has_a_smoke_run() -> None:
    scripts = {p.name for p in BENCH.glob("bench_*.py")}
    assert scripts == set(SMOKE), (
        f"without a smoke run: {sorted(scripts - set(SMOKE))}; gone: {sorted(set(SMOKE) - scripts)}"
    )
    assert sorted(ORDER) == sorted(SMOKE)


def _numbers(match: re.Match[str]) -> list[float]:
    return [float(g.replace(",", "")) for g in match.groups()]


@pytest.mark.timeout(1800)  # waits for its run, which may wait for a free job first
@pytest.mark.parametrize("script", sorted(SMOKE))
def test_the_bench_runs_in_its_smoke_mode(script: str, smoke_runs: dict[str, Future[Run]]) -> None:
    run = smoke_runs[script].result()
    out = run.stdout
    assert run.returncode is not None, (
        f"{script} --smoke ran past {TIMEOUT.get(script, 300)} s; its output so far:\n{out}"
    )
    assert run.returncode == 0, (
        f"{script} --smoke exited {run.returncode}:\n{out[-4000:]}\n{run.stderr[-4000:]}"
    )
    for expect in SMOKE[script]:
        found = list(re.finditer(expect.pattern, out, re.M))
        assert len(found) >= expect.count, (
            f"{script}: {len(found)} line(s) matching {expect.pattern!r}, expected {expect.count}:\n{out}"
        )
        for match in found:
            numbers = _numbers(match)
            assert all(math.isfinite(n) for n in numbers), (script, match.group(0))
    print(f"{script} --smoke: {run.seconds:.1f} s")
