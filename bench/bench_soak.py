"""Soak: a Structured Streaming query through the sink for ``--minutes`` (default 30) while the namespaces do what
a real network and the real service do to connections that live for weeks (SPEC L1-L6). On demand; CI runs only
its smoke mode (``--smoke``: the same set-up and the same events, each lasting seconds, about 75 s in all alone).

    .venv/bin/python bench/bench_soak.py [--minutes 30] [--rows 40] [--every 1] [--workdir DIR] [--verbose]
    .venv/bin/python bench/bench_soak.py --smoke            # CI's smoke mode: every spell in seconds

Set-up (driver = this process):

- two local namespaces as child processes (``python -m servicebus_local``, driven through the control API;
  harness/namespaces.py):
  "primary" with the queue ``orders`` (duplicate detection on, a 2 h window) and "secondary" with the backlog
  queues; both with shortened timers (``--link-idle-timeout 20s --connection-idle-timeout 30s``);
- the sink and the syphon reach both with a credential whose tokens live 60 s (``bench/soak_credential.py``,
  on ``PYTHONPATH`` so Spark's Python workers import it), which the namespaces enforce;
- local Spark (``build_spark_session``), two queries in one session: a file source (this process writes one
  JSON file of ``--rows`` rows with unique message ids every ``--every`` s) -> ``foreachBatch(ServiceBusSink)``
  with Delta state tables, and the syphon job (``run_syphon``, a 5 s trigger; smoke: 2 s) moving backlogs back.

The schedule (times scale with ``--minutes``; each event logged with its offset): a quiet spell (no input:
the links idle past 20 s, the connections past 30 s, tokens run out unused), a silent drop of the primary
after a short quiet spell (``POST /faults/blackhole``: the idle connections get no answer ever again), a
throttle spell (``POST /throttle`` at half the input rate), three primary flaps (refuse + drop for some
seconds, then accept: these fail over, the sink diverts, the syphon moves back), and a second quiet spell.
Then input stops, every fault is cleared, the sink query drains its input, the syphon empties the backlog and
is stopped, the sink is flushed and Spark stopped, and the primary queue is read out.

Printed: msgs sent (to the primary), diverted, moved back (syphon), lost (written ids not in the primary
queue: must be 0), duplicates (ids received more than once: 0 with duplicate detection), each failover with
its time and whether a fault was on then (one outside a flap is spurious), the namespaces' lifecycle counters,
and a table of resource figures sampled every minute (smoke: 5 s) from /proc: driver (Python) RSS, the JVM's RSS, the
Python workers' RSS (sum), threads and open files of each, and files of the Delta state tables - first, last,
max and growth per hour (least-squares slope over the samples after the first tenth of the run). Exit status
1 when a message was lost (or the run failed).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]
# Spark's Python workers inherit the JVM's environment, which inherits ours: they import soak_credential too.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, ROOT, os.environ.get("PYTHONPATH", "")) if p)

from soak_credential import ShortTokens  # noqa: E402

from harness.namespaces import Namespace  # noqa: E402
from harness.queues import take_ids  # noqa: E402
from spark_sb.config.namespace import NamespaceConfig, RetryConfig  # noqa: E402
from spark_sb.config.service_bus import ServiceBusConfig  # noqa: E402
from spark_sb.message.backlog import backlog_queue_names  # noqa: E402

ENTITY = "orders"
BACKLOG_COUNT = 2


@dataclass(frozen=True)
class Pace:
    """The soak's timers: the namespaces' lifecycle timers, the tokens' life, the sampling period, and how long
    the blackhole spell waits before the drop (input stopped) and after input resumes on the dropped flow."""

    link_idle: str = "20s"
    connection_idle: str = "30s"
    token_lifetime: float = 60.0
    sample_every: float = 60.0
    blackhole_before: float = 4.0
    blackhole_after: float = 20.0
    #: the syphon query's trigger, how often the end of the run polls the backlog, and how long the read-out of the
    #: primary queue waits per receive
    syphon_trigger: str = "5 seconds"
    poll_every: float = 2.0
    receive_wait: float = 2.0


FULL = Pace()
#: ``--smoke``: every spell in seconds (CI's smoke mode). The links idle out within a quiet spell, the tokens are
#: renewed during the run, the blackholed connections are given more than SILENT_AFTER (6 s) to be found out (they
#: sit silent for 7 s before input resumes on them, so the first batch after finds them out; 3 s after it), and
#: (failover_interval and ping_primary_interval 1 s unless given) the 2 s flaps fail over and are moved back; the
#: syphon triggers every 2 s and the end of the run polls every 0.5 s, so that no wait is longer than its spell.
SMOKE = Pace(
    link_idle="3s",
    connection_idle="5s",
    token_lifetime=15.0,
    sample_every=5.0,
    blackhole_before=1.0,
    blackhole_after=3.0,
    syphon_trigger="2 seconds",
    poll_every=0.5,
    receive_wait=1.0,
)
SMOKE_SECONDS = 28.5

log = logging.getLogger("bench_soak")


def say(text: str = "") -> None:
    print(text, flush=True)


# ------------------------------------------------------------------------------------- namespaces (children)


def start_namespace(name: str, args: list[str], tls_dir: str, timers: tuple[str, str]) -> Namespace:
    """A local namespace in a child process (harness/namespaces.py), driven through its control API, with the
    shortened lifecycle timers (link idle, connection idle) and the CA shared by both (``--tls-dir``)."""
    link_idle, connection_idle = timers
    return Namespace.child(
        name,
        args=[
            *("--link-idle-timeout", link_idle, "--connection-idle-timeout", connection_idle),
            *("--tls-dir", tls_dir),
            *args,
        ],
    )


def namespace_config(ns: Namespace, name: str | None, lifetime: float) -> NamespaceConfig:
    return NamespaceConfig(
        fully_qualified_namespace=f"127.0.0.1:{ns.port}",
        credential=ShortTokens(lifetime=lifetime),
        use_development_emulator=True,
        namespace_name=name,
    )


# ------------------------------------------------------------------------------------ resources from /proc


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _descendants(pid: int, kids: dict[int, list[int]]) -> list[int]:
    out: list[int] = []
    todo = list(kids.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _proc(pid: int) -> tuple[int, int, int] | None:
    """(RSS bytes, threads, open fds) of ``pid``, or None when it is gone."""
    try:
        rss = threads = 0
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("Threads:"):
                    threads = int(line.split()[1])
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        return rss, threads, fds
    except OSError:
        return None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _delta_files(location: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(location)) if location.exists() else 0


METRICS = (
    ("driver RSS MB", 1 / 2**20),
    ("JVM RSS MB", 1 / 2**20),
    ("workers RSS MB", 1 / 2**20),
    ("workers", 1.0),
    ("driver threads", 1.0),
    ("JVM threads", 1.0),
    ("worker threads", 1.0),
    ("driver open files", 1.0),
    ("JVM open files", 1.0),
    ("worker open files", 1.0),
    ("Delta files", 1.0),
)


def sample(state_dir: Path, exclude: set[int]) -> dict[str, float]:
    """One sample (driver): this process, the JVM it started, and the JVM's descendants (Python workers and
    their daemon); the namespaces (``exclude``) are not counted."""
    kids = _children()
    me = os.getpid()
    jvms = [p for p in kids.get(me, []) if p not in exclude and "java" in _cmdline(p)]
    workers = [w for j in jvms for w in _descendants(j, kids)]
    out: dict[str, float] = dict.fromkeys((m for m, _ in METRICS), 0.0)
    mine = _proc(me)
    if mine:
        out["driver RSS MB"], out["driver threads"], out["driver open files"] = mine
    for j in jvms:
        got = _proc(j)
        if got:
            out["JVM RSS MB"] += got[0]
            out["JVM threads"] += got[1]
            out["JVM open files"] += got[2]
    for w in workers:
        got = _proc(w)
        if got:
            out["workers"] += 1
            out["workers RSS MB"] += got[0]
            out["worker threads"] += got[1]
            out["worker open files"] += got[2]
    out["Delta files"] = _delta_files(state_dir)
    return out


class Sampler:
    """Samples every ``period`` s on a daemon thread (driver) until stopped; ``samples`` are (t, figures)."""

    def __init__(self, state_dir: Path, exclude: set[int], t0: float, period: float) -> None:
        self.state_dir, self.exclude, self.t0, self.period = state_dir, exclude, t0, period
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)

    def take(self) -> None:
        self.samples.append((time.monotonic() - self.t0, sample(self.state_dir, self.exclude)))

    def _run(self) -> None:
        self.take()
        while not self._stop.wait(self.period):
            self.take()

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.take()


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    den = sum((t - mx) ** 2 for t, _ in points)
    return 0.0 if den == 0 else 3600.0 * sum((t - mx) * (v - my) for t, v in points) / den


def resource_table(samples: list[tuple[float, dict[str, float]]], run_seconds: float) -> list[str]:
    """First, last and max of each figure, its growth per hour (least squares) after the first tenth of the run
    and over the second half alone (a figure still warming up grows in the first, a leak in both), and every
    sample (so a plateau shows)."""
    warm = [s for s in samples if s[0] >= run_seconds / 10] or samples
    late = [s for s in samples if s[0] >= samples[-1][0] / 2] or samples
    lines = [
        f"{'figure':<18} {'first':>9} {'last':>9} {'max':>9} {'growth/h':>10} {'2nd half/h':>11}   "
        f"({len(samples)} samples; growth over {len(warm)} after {run_seconds / 10:.0f} s, and over the "
        f"{len(late)} of the second half)"
    ]
    for name, scale in METRICS:
        values = [v[name] * scale for _, v in samples]
        slope = slope_per_hour([(t, v[name] * scale) for t, v in warm])
        second = slope_per_hour([(t, v[name] * scale) for t, v in late])
        lines.append(
            f"{name:<18} {values[0]:>9.1f} {values[-1]:>9.1f} {max(values):>9.1f} {slope:>+10.1f} {second:>+11.1f}"
        )
    lines.append("samples (minute: " + ", ".join(name for name, _ in METRICS) + "):")
    for t, v in samples:
        lines.append(f"  {t / 60:5.1f}: " + " ".join(f"{v[name] * scale:.0f}" for name, scale in METRICS))
    return lines


# ---------------------------------------------------------------------------------------------- the input


class Feeder:
    """Writes one JSON file of ``rows`` rows every ``every`` s into ``input_dir`` (driver thread) while not
    paused; ``ids`` are every message id written."""

    def __init__(self, input_dir: Path, rows: int, every: float) -> None:
        self.input_dir, self.rows, self.every = input_dir, rows, every
        self.ids: list[str] = []
        self.files = 0
        self.running = threading.Event()
        self.running.set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-feeder", daemon=True)

    def _write(self) -> None:
        n = self.files
        ids = [f"m{n:06d}-{i:04d}" for i in range(self.rows)]
        lines = [
            json.dumps({"body": json.dumps({"file": n, "row": i}), "message_id": m})
            for i, m in enumerate(ids)
        ]
        tmp = self.input_dir / f".f{n:06d}.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(self.input_dir / f"f{n:06d}.json")  # atomic: the file source never sees half a file
        self.ids.extend(ids)
        self.files += 1

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            if self.running.is_set():
                self._write()
            next_at += self.every
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def start(self) -> Feeder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


# --------------------------------------------------------------------------------------------- the schedule


@dataclass
class Timeline:
    t0: float
    events: list[tuple[float, str]] = field(default_factory=list)
    fault_windows: list[tuple[float, float, str]] = field(default_factory=list)  # (start, end, what)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def mark(self, what: str) -> float:
        t = self.now()
        self.events.append((t, what))
        say(f"  [{t:7.1f} s] {what}")
        return t

    def fault_at(self, t: float, slack: float, until: float | None = None) -> str:
        """The event whose window (widened by ``slack`` s after it) meets [t, until]; "" for none."""
        # A flap first: its drop resets connections at once, so its failovers can fall in another event's slack.
        for start, end, what in sorted(self.fault_windows, key=lambda w: w[2] != "flap"):
            if start - 1 <= (t if until is None else until) and t <= end + slack:
                return what
        return ""


def schedule(total: float, smoke: bool = False) -> list[tuple[float, str, float]]:
    """(start offset s, event, duration s) for a run of ``total`` seconds; with ``smoke`` the same events in
    :data:`SMOKE_SECONDS`, a few seconds each, back to back, without the second quiet spell (the first one's code
    path again). The blackhole spell lasts ``duration`` + ``Pace.blackhole_after`` (11 s in smoke)."""
    if smoke:
        return [
            (0.5, "quiet", 4.0),
            (5.0, "blackhole", 8.0),
            (16.5, "throttle", 2.0),
            (19.0, "flap", 2.0),
            (22.5, "flap", 2.0),
            (26.0, "flap", 2.0),
        ]
    quiet = 45.0 if total >= 600 else 25.0
    flap = 12.0 if total >= 600 else 8.0
    throttle = min(60.0, max(15.0, total / 12))
    return [
        (0.08 * total, "quiet", quiet),
        (0.25 * total, "blackhole", 12.0),
        (0.37 * total, "throttle", throttle),
        (0.50 * total, "flap", flap),
        (0.62 * total, "flap", flap),
        (0.74 * total, "flap", flap),
        (0.84 * total, "quiet", quiet),
    ]


def run_schedule(
    total: float, timeline: Timeline, feeder: Feeder, primary: Namespace, rows_per_s: float, pace: Pace
) -> None:
    """Drive the faults (driver thread), offsets counted from the call; returns ``total`` s after it."""
    base = timeline.now()
    for start, what, duration in schedule(total, smoke=pace is SMOKE):
        time.sleep(max(0.0, base + start - timeline.now()))
        begin = timeline.now()
        if what == "quiet":
            feeder.running.clear()
            timeline.mark(f"quiet spell: no input for {duration:g} s")
            time.sleep(duration)
            feeder.running.set()
            timeline.mark("input resumes")
        elif what == "blackhole":
            # A middlebox drops an idle flow: input stops (the batch in flight ends), the primary's connections
            # are blackholed, then input resumes on them.
            feeder.running.clear()
            timeline.mark("quiet before the silent drop")
            time.sleep(pace.blackhole_before)
            open_now = primary.status().get("connections")
            primary.post("/faults/blackhole", {"on": True})
            timeline.mark(f"primary blackholed: its {open_now} open connection(s) get no answer ever again")
            time.sleep(duration - pace.blackhole_before)
            feeder.running.set()
            timeline.mark("input resumes on the blackholed connections")
            time.sleep(pace.blackhole_after)
            primary.post("/faults/blackhole", {"on": False})
            timeline.mark("blackhole fault off")
        elif what == "throttle":
            credits = max(1, int(rows_per_s / 2))
            primary.post("/throttle", {"credits_per_second": credits})
            timeline.mark(f"primary throttled to {credits} credits/s (input {rows_per_s:g} rows/s)")
            time.sleep(duration)
            primary.post("/throttle", {"credits_per_second": 0})
            timeline.mark("throttle off")
        elif what == "flap":
            primary.post("/faults/refuse")
            primary.post("/faults/drop")
            timeline.mark(f"primary flap: refused + dropped for {duration:g} s")
            time.sleep(duration)
            primary.post("/faults/accept")
            timeline.mark("primary accepts again")
        timeline.fault_windows.append((begin, timeline.now(), what))
    time.sleep(max(0.0, base + total - timeline.now()))


# ---------------------------------------------------------------------------------------------- the checks


def drain_ids(conn: str, entity: str, deadline: float, wait: float = 2.0) -> list[str]:
    """Every message id in ``entity`` (receive-and-delete, driver), until a receive (``wait`` s at most) comes back
    empty twice."""
    return take_ids(
        conn, entity, wait=wait, batch=1000, empty=2, deadline=max(0.0, deadline - time.monotonic())
    )


def backlog_counts(secondary: Namespace, queues: list[str]) -> dict[str, tuple[int, int]]:
    from azure.servicebus.management import ServiceBusAdministrationClient

    with ServiceBusAdministrationClient.from_connection_string(
        secondary.connection_string, connection_verify=secondary.ca_file
    ) as admin:
        out = {}
        for q in queues:
            props = admin.get_queue_runtime_properties(q)
            out[q] = (int(props.active_message_count), int(props.dead_letter_message_count))
        return out


def throttled_events(state_dir: Path, sink_id: str) -> list[tuple[int | None, int]]:
    """(batch id, milliseconds) of each ``throttled`` row of the sink's events table (read with deltalake)."""
    from spark_sb.state.deltars import DeltaRsStateStore
    from spark_sb.state.records import THROTTLED

    return [
        (e.batch_id, e.count)
        for e in DeltaRsStateStore(str(state_dir)).read_events(sink_id)
        if e.event == THROTTLED
    ]


def wait_for(what: str, check: Any, timeout: float, every: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(every)
    say(f"  ! {what}: not within {timeout:g} s")
    return False


# ------------------------------------------------------------------------------------------------ the run


@dataclass
class BatchRecord:
    t: float
    batch_id: int
    rows: int
    sent: int
    diverted: int
    seconds: float
    transitions: list[tuple[float, str]]  # (offset s, text)
    throttled: float = 0.0  # seconds the batch's tasks backed off on "server busy" (SendOutcome.throttled)


def run(args: argparse.Namespace, workdir: Path) -> int:
    from spark_sb.spark.session import LOCAL_DEFAULTS, build_spark_session
    from spark_sb.spark.sink import ServiceBusSink
    from spark_sb.spark.syphon_job import run_syphon, stop_gracefully
    from spark_sb.spark.syphon_ledger import SyphonBatchWriter

    pace = SMOKE if args.smoke else FULL
    total = SMOKE_SECONDS if args.smoke else args.minutes * 60.0
    tls_dir = workdir / "tls"
    topology = workdir / "primary.yaml"
    topology.write_text(
        f"queues:\n  - name: {ENTITY}\n    requires_duplicate_detection: true\n"
        "    duplicate_detection_history_time_window: 2h\n"
    )
    backlog = backlog_queue_names("primary", BACKLOG_COUNT)
    timers = (pace.link_idle, pace.connection_idle)
    primary = start_namespace("primary", ["--topology", str(topology)], str(tls_dir), timers)
    secondary = start_namespace(
        "secondary", [a for q in backlog for a in ("--queue", q)], str(tls_dir), timers
    )
    namespaces = [primary, secondary]
    try:
        for ns in namespaces:
            ns.ready()
        os.environ["REQUESTS_CA_BUNDLE"] = (
            secondary.ca_file
        )  # one CA for both (--tls-dir); workers inherit it
        state_dir = workdir / "state"
        config = ServiceBusConfig(
            primary=namespace_config(primary, "primary", pace.token_lifetime),
            secondary=namespace_config(secondary, None, pace.token_lifetime),
            entity=ENTITY,
            backlog_queue_count=BACKLOG_COUNT,
            failover_interval=args.failover_interval,
            ping_primary_interval=args.ping_primary_interval,
            send_timeout=10.0,
            retry=RetryConfig(backoff_factor=0.2, backoff_max=1.0),
            state_location=str(state_dir),
            syphon_max_wait=5.0,
            syphon_batch_duration=20.0,
        )
        say(
            f"soak: {total / 60:g} min{' (smoke)' if args.smoke else ''}; input {args.rows} rows every {args.every:g} s "
            f"({args.rows / args.every:g} rows/s); failover_interval {args.failover_interval:g} s, "
            f"ping_primary_interval {args.ping_primary_interval:g} s; namespaces: link idle {pace.link_idle}, "
            f"connection idle {pace.connection_idle}, tokens {pace.token_lifetime:g} s (enforced); "
            f"workdir {workdir}"
        )
        # smoke: the driver's JVM compiles with C1 only - a run of a minute spends less CPU compiling code it runs a
        # few times (Spark's start and its first Delta operations about a fifth shorter, measured)
        java = f"{LOCAL_DEFAULTS['spark.driver.extraJavaOptions']} -XX:TieredStopAtLevel=1"
        spark = build_spark_session(
            "spark-servicebus-soak", conf={"spark.driver.extraJavaOptions": java} if args.smoke else None
        )
        spark.sparkContext.setLogLevel("ERROR")
        input_dir = workdir / "input"
        input_dir.mkdir()
        sink = ServiceBusSink(config)
        t0 = time.monotonic()
        wall0 = time.time()
        timeline = Timeline(t0)
        records: list[BatchRecord] = []

        def each_batch(batch_df: Any, batch_id: int) -> None:
            """foreachBatch (driver): the sink, timed, its outcome recorded."""
            started = time.monotonic()
            sink(batch_df, batch_id)
            out = sink.last_outcome
            records.append(
                BatchRecord(
                    t=started - t0,
                    batch_id=batch_id,
                    rows=sum(r.rows for r in sink.last_results) if sink.last_results else 0,
                    sent=out.total_sent if out else 0,
                    diverted=out.total_diverted if out else 0,
                    throttled=sum(out.throttled.values()) if out else 0.0,
                    seconds=time.monotonic() - started,
                    transitions=[
                        (
                            t.at.timestamp() - wall0,
                            f"{t.entity}: {t.from_state.value} -> {t.to_state.value} ({t.error_class or ''} "
                            f"{t.detail})".replace("\n", " ")[:240],
                        )
                        for t in (out.transitions if out else [])
                    ],
                )
            )

        stream = spark.readStream.schema("body STRING, message_id STRING").json(str(input_dir))
        query = (
            stream.writeStream.foreachBatch(each_batch)
            .option("checkpointLocation", str(workdir / "checkpoint"))
            .queryName("soak-sink")
            .start()
        )
        syphon_writer = SyphonBatchWriter(config)
        stop_file = str(workdir / "syphon.stop")
        syphon = run_syphon(
            spark,
            config,
            checkpoint=str(workdir / "syphon-checkpoint"),
            trigger=pace.syphon_trigger,
            admin_kwargs={"connection_verify": secondary.ca_file},
            stop_file=stop_file,
            writer=syphon_writer,
        )
        sampler = Sampler(
            state_dir, {ns.pid for ns in namespaces if ns.pid is not None}, t0, pace.sample_every
        ).start()
        feeder = Feeder(input_dir, args.rows, args.every).start()
        timeline.mark("input and both queries started")
        wait_for("the first sink batch", lambda: bool(records), timeout=600, every=0.5)
        timeline.mark("first sink batch done (Spark warmed up): the fault schedule starts")
        failed = ""
        try:
            run_schedule(total, timeline, feeder, primary, args.rows / args.every, pace)
        except Exception:  # noqa: BLE001 - reported, and the run still closes down and counts
            failed = traceback.format_exc()
            say(f"  ! the schedule failed:\n{failed}")
        feeder.stop()
        timeline.mark(f"input stopped ({feeder.files} files, {len(feeder.ids)} rows)")
        primary.post("/faults/clear")
        primary.post("/throttle", {"credits_per_second": 0})
        for q, name in ((query, "sink"), (syphon, "syphon")):
            if not q.isActive:
                failed = failed or f"the {name} query stopped: {q.exception()}"
                say(f"  ! the {name} query is not active: {q.exception()}")
        if query.isActive:
            query.processAllAvailable()
        timeline.mark("sink query caught up")
        # Anything diverted at the end is moved back by the syphon once the probe finds the primary healthy.
        wait_for(
            "the backlog emptied",
            lambda: (
                all(a == 0 for a, _ in backlog_counts(secondary, backlog).values())
                and syphon_writer.total.moved >= sink.total.total_diverted
            ),
            timeout=180,
            every=pace.poll_every,
        )
        timeline.mark("backlog empty")
        stop_gracefully(syphon, stop_file, timeout=60)
        query.stop()
        sink.flush()
        sampler.stop()
        timeline.mark("queries stopped, sink flushed")
        sink_batches = sink.total.batches
        throttled_rows = throttled_events(state_dir, sink.sink_id)
        spark.stop()
        left = backlog_counts(secondary, backlog)
        received = drain_ids(primary.connection_string, ENTITY, time.monotonic() + 300, pace.receive_wait)
        statuses = {ns.name: ns.status() for ns in namespaces}
    finally:
        for ns in namespaces:
            ns.stop()

    produced = set(feeder.ids)
    got = set(received)
    lost = len(produced - got)
    duplicates = len(received) - len(got)
    strangers = len(got - produced)
    say("\n== messages")
    say(
        f"  written {len(produced)}, sent to the primary {sink.total.total_sent}, diverted "
        f"{sink.total.total_diverted}, moved back {syphon_writer.total.moved} (syphon kinds "
        f"{dict(sorted(syphon_writer.total.by_kind.items()))}), rejected {sink.total.total_rejected}"
    )
    say(
        f"  in the primary queue {len(received)}: lost {lost}, duplicates {duplicates}, unknown ids {strangers}; "
        f"left in the backlog (active, dead-lettered) {left}"
    )
    say(f"  sink batches {sink_batches}, sink retries {sink.total.retries}, probes {sink.total.probes}")

    say("\n== throttling (SPEC L4: backed off, never a failover; the events table has it, issue 21 item 4)")
    backed_off = [r for r in records if r.throttled > 0]
    in_table = sum(ms for _, ms in throttled_rows) / 1000
    say(
        f"  the sink's outcomes: {sum(r.throttled for r in backed_off):.1f} s backed off in {len(backed_off)} "
        f"batch(es) ({', '.join(f'{r.batch_id}: {r.throttled:.1f} s' for r in backed_off[:10])}); the events "
        f"table: {len(throttled_rows)} 'throttled' row(s), {in_table:.1f} s"
    )
    if abs(in_table - sum(r.throttled for r in backed_off)) > 0.01 * len(throttled_rows) + 0.001:
        say("  ! the events table's throttled time differs from the sink's outcomes")

    say("\n== failovers (state transitions, with the fault on at the time)")
    slow = sorted(records, key=lambda r: -r.seconds)[:5]
    spurious = failovers = 0
    for r in records:
        for at, text in r.transitions:
            fault = timeline.fault_at(at, slack=args.failover_interval + 5)
            if "-> failed_over" in text:
                failovers += 1
                spurious += fault != "flap"  # only a flap is an outage
            say(f"  [{at:7.1f} s] batch {r.batch_id}: {text}  [{fault or 'NO FAULT ON'}]")
    say(
        f"  failovers (one per Python worker that saw it) {failovers}, of which not during a flap (spurious): {spurious}"
    )
    diverted_outside = [
        r
        for r in records
        if r.diverted
        and timeline.fault_at(r.t, slack=2 * args.ping_primary_interval + 10, until=r.t + r.seconds) != "flap"
    ]
    for r in diverted_outside:
        say(f"  ! [{r.t:7.1f} s] batch {r.batch_id} diverted {r.diverted} outside a flap")
    say("  slowest batches: " + ", ".join(f"{r.batch_id} at {r.t:.0f} s: {r.seconds:.1f} s" for r in slow))

    say("\n== namespaces (lifecycle counters)")
    keys = (
        "links_detached_idle",
        "connections_closed_idle",
        "links_detached_token_expired",
        "links_detached_fault",
        "connections_blackholed",
        "messages_throttled",
        "connections_peak",
    )
    for name, doc in statuses.items():
        counters = doc.get("counters", {})
        say(f"  {name}: " + ", ".join(f"{k} {counters.get(k, '-')}" for k in keys))

    say(f"\n== resources (sampled every {pace.sample_every:g} s from /proc)")
    for line in resource_table(sampler.samples, total):
        say("  " + line)
    say("\n== timeline")
    for t, what in timeline.events:
        say(f"  {t:7.1f} s  {what}")

    ok = lost == 0 and not failed
    say(
        f"\nSOAK {'OK' if ok else 'FAILED'}: lost {lost}, duplicates {duplicates}"
        + (f"; {failed}" if failed else "")
    )
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--minutes", type=float, default=30.0, help="length of the fault schedule (default 30)"
    )
    parser.add_argument("--rows", type=int, default=40, help="rows per input file (default 40)")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between input files (default 1)")
    parser.add_argument("--failover-interval", type=float, default=None, help="seconds (default 5; smoke 1)")
    parser.add_argument(
        "--ping-primary-interval", type=float, default=None, help="seconds (default 5; smoke 1)"
    )
    parser.add_argument("--workdir", type=Path, default=None, help="kept after the run when given")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"every spell in seconds ({SMOKE_SECONDS:g} s of schedule; namespaces' link idle {SMOKE.link_idle}, "
        f"connection idle {SMOKE.connection_idle}, tokens {SMOKE.token_lifetime:g} s): CI's smoke mode",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="INFO log lines of spark_sb (WARNING otherwise)"
    )
    args = parser.parse_args()
    # a smoke run's flaps (3 s) outlast failover_interval: they fail over, divert, and the syphon moves back
    for key in ("failover_interval", "ping_primary_interval"):
        if getattr(args, key) is None:
            setattr(args, key, 1.0 if args.smoke else 5.0)
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("spark_sb").setLevel(logging.INFO if args.verbose else logging.WARNING)
    logging.getLogger("azure").setLevel(logging.ERROR)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="spark-sb-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        return run(args, workdir)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
