"""Benchmark: threads, sockets and memory of a sender through long outages of every shape (SPEC F8), on demand.

    .venv/bin/python bench/bench_outage_resources.py [--minutes 10] [--smoke] [--shapes refused,stall-before-sasl]
                                                     [--interval 1] [--ping 0.5] [--sample 5] [--inproc]

For each outage shape - refused (connections refused), drop (live connections reset, new ones refused), stall
before SASL (TCP accepted, nothing ever answered: the SDK's blocking SASL read), stall after SASL (SASL answered,
then silence), blackhole (a middlebox's silent drop: every connection open at that moment gets no answer ever
again, no FIN; repeated every 2 s, so each new connection goes silent within 2 s) - a fresh
:class:`~spark_sb.sender.paired.PairedSender` sends 10-message batches every 0.1 s to a healthy primary, the primary
breaks for ``--minutes`` (the sender diverts to the backlog and probes the primary every ``--ping`` s), then the
sender is closed and the primary healed. Every ``--sample`` s the process's ``spark-sb-`` threads, its sockets
(``/proc/self/fd`` links to ``socket:``) and its RSS are sampled.

Printed per shape: start (the sender healthy, just before the fault) / max / end (just before close) of each,
the growth per hour (least-squares slope over the outage's samples after its first tenth, times 3600), and after
``close()`` the time until threads and sockets are back at the count before the sender was built. A healthy phase
of the same length first gives the ratio line: the outage's peak over the healthy peak (threads, sockets) and its
msgs/s over the healthy msgs/s (a failed-over sender's throughput into the backlog). Goal: growth ~0 per hour,
return within 5 s, peaks within a small constant of the healthy ones.

Namespaces run in child processes (``python -m servicebus_local``, faults through its control API;
harness/namespaces.py), so the sockets counted here are the sender's alone; ``--inproc`` runs them in this
process instead (then the counts include the namespaces' own sockets). ``--smoke``: 5 s per shape, samples every 0.5 s (checks that it runs).
Only loopback traffic; bounded in time (shapes x minutes, plus a healthy phase).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness.namespaces import Namespace, namespaces  # noqa: E402
from spark_sb.config.service_bus import ServiceBusConfig  # noqa: E402
from spark_sb.failover.registry import FailoverRegistry  # noqa: E402
from spark_sb.message.outbound import OutboundMessage  # noqa: E402
from spark_sb.sender.paired import PairedSender  # noqa: E402

ENTITY = "orders"
BACKLOG_COUNT = 2
BACKLOG_QUEUES = [f"primary/x-servicebus-transfer/{i}" for i in range(BACKLOG_COUNT)]
BATCH = 10
PAUSE = 0.1  # between send calls: 100 msgs/s, so that hours of outage do not fill the backlog's memory
RETURN_WITHIN = 30.0  # how long the return to steady state after close() is awaited at most

# ------------------------------------------------------------------------------------------------ sampling


def spark_threads() -> int:
    """This library's threads (the in-process namespaces' ``spark-sb-local-`` excluded)."""
    return sum(
        1
        for t in threading.enumerate()
        if t.name.startswith("spark-sb-") and not t.name.startswith("spark-sb-local-")
    )


def sockets() -> int:
    """This process's open sockets (``/proc/self/fd`` links to ``socket:``)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return n


def leftovers() -> str:
    """This library's threads and this process's TCP sockets (local and remote address, state) by name."""
    inodes: set[int] = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/self/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(int(link[8:-1]))
    tcp = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for row in f.readlines()[1:]:
                cols = row.split()
                if int(cols[9]) in inodes:
                    tcp.append(f"{cols[1]}->{cols[2]} st {cols[3]}")
    names = [t.name for t in threading.enumerate() if t.name.startswith("spark-sb-")]
    return f"threads {names}, {len(inodes)} sockets, tcp {tcp}"


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


@dataclass
class Sample:
    at: float  # monotonic
    threads: int
    sockets: int
    rss: float


def sample() -> Sample:
    return Sample(time.monotonic(), spark_threads(), sockets(), rss_mb())


class Sampler:
    """Samples every ``every`` seconds on a thread of its own (not a spark-sb- one) until stopped."""

    def __init__(self, every: float) -> None:
        self.every = every
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10.0)

    def _run(self) -> None:
        while True:
            self.samples.append(sample())
            if self._stop.wait(self.every):
                self.samples.append(sample())
                return


def slope_per_hour(samples: list[Sample], value: Callable[[Sample], float]) -> float:
    """Least-squares slope of ``value`` over time, per hour (0 with fewer than 3 samples)."""
    if len(samples) < 3:
        return 0.0
    xs = [s.at for s in samples]
    ys = [value(s) for s in samples]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return 0.0
    return 3600.0 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var


# -------------------------------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class Shape:
    name: str
    steps: tuple[tuple[str, dict[str, Any]], ...]  # the control calls that break the primary
    every: float | None = None  # repeated every this many seconds during the outage


SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape("refused", (("/faults/refuse", {}),)),
        Shape("drop", (("/faults/refuse", {}), ("/faults/drop", {}))),
        Shape("stall-before-sasl", (("/faults/stall", {"on": True, "answer_sasl": False}),)),
        Shape("stall-after-sasl", (("/faults/stall", {"on": True, "answer_sasl": True}),)),
        Shape("blackhole", (("/faults/blackhole", {"on": True}),), every=2.0),
    )
}


# ------------------------------------------------------------------------------------------------- running


@dataclass
class Phase:
    name: str
    samples: list[Sample] = field(default_factory=list)
    messages: int = 0
    seconds: float = 0.0
    errors: int = 0
    before: Sample | None = None  # before the sender was built
    back_after: float | None = None  # seconds from close() to the counts before the sender
    left: str = ""  # what was still there when it was not back

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0


def config(primary: Namespace, secondary: Namespace, interval: float, ping: float) -> ServiceBusConfig:
    return ServiceBusConfig.from_dict(
        {
            "primary": {"connection_string": primary.connection_string, "namespace_name": "primary"},
            "secondary": {"connection_string": secondary.connection_string},
            "entity": ENTITY,
            "backlog_queue_count": BACKLOG_COUNT,
            "failover_interval": f"{interval}s",
            "ping_primary_interval": f"{ping}s",
        }
    )


def run_phase(
    name: str,
    cfg: ServiceBusConfig,
    seconds: float,
    every: float,
    primary: Namespace,
    shape: Shape | None,
) -> Phase:
    """A fresh sender, healthy at first; ``shape`` breaks the primary (None: it stays healthy) for ``seconds``
    while the sender sends; then close() and the wait for the counts before the sender; then the heal."""
    phase = Phase(name, before=sample())
    sender = PairedSender(cfg, registry=FailoverRegistry())
    n = 0

    def send() -> None:
        nonlocal n
        ids = [f"{name}-{n + i}" for i in range(BATCH)]
        n += BATCH
        try:
            out = sender.send([OutboundMessage(body=b"x" * 100, message_id=i) for i in ids])
            phase.messages += out.total_sent + out.total_diverted
        except Exception:  # counted: a call that failed outright (nothing should)
            phase.errors += 1

    try:
        send()  # healthy: the connection and link are open before the counts start
        if shape is not None:
            for path, body in shape.steps:
                primary.post(path, body)
        t0 = time.monotonic()
        next_fault = t0 + (shape.every if shape is not None and shape.every else float("inf"))
        with Sampler(every) as sampler:
            while time.monotonic() - t0 < seconds:
                send()
                if shape is not None and time.monotonic() >= next_fault:
                    for path, body in shape.steps:
                        primary.post(path, body)
                    next_fault += shape.every or float("inf")
                time.sleep(PAUSE)
        phase.seconds = time.monotonic() - t0
        phase.samples = sampler.samples
    finally:
        closed = time.monotonic()
        sender.close()
        before = phase.before
        while time.monotonic() - closed < RETURN_WITHIN:
            now = sample()
            if now.threads <= before.threads and now.sockets <= before.sockets:
                phase.back_after = time.monotonic() - closed
                break
            time.sleep(0.05)
        else:
            phase.left = leftovers()
        primary.post("/faults/clear", {})
        primary.post("/faults/stall", {"on": False})
    return phase


def report(phase: Phase, healthy: Phase | None) -> None:
    s = phase.samples
    if not s:
        print(f"{phase.name}: no samples")
        return
    tail = s[len(s) // 10 :]  # the outage's first tenth is its transient (failover, first probes)
    before = phase.before
    assert before is not None
    back = (
        f"{phase.back_after:.2f} s" if phase.back_after is not None else f"> {RETURN_WITHIN:g} s (NOT back)"
    )
    print(
        f"{phase.name:<18} {phase.seconds:6.0f} s  "
        f"threads {s[0].threads}/{max(x.threads for x in s)}/{s[-1].threads} "
        f"({slope_per_hour(tail, lambda x: x.threads):+.1f}/h)  "
        f"sockets {s[0].sockets}/{max(x.sockets for x in s)}/{s[-1].sockets} "
        f"({slope_per_hour(tail, lambda x: x.sockets):+.1f}/h)  "
        f"rss {s[0].rss:.0f}/{max(x.rss for x in s):.0f}/{s[-1].rss:.0f} MB "
        f"({slope_per_hour(tail, lambda x: x.rss):+.1f} MB/h)  "
        f"{phase.rate:.0f} msgs/s, {phase.errors} failed calls; "
        f"after close(): back to {before.threads} threads / {before.sockets} sockets in {back}"
    )
    if phase.left:
        print(f"{'':<18} still there {RETURN_WITHIN:g} s after close(): {phase.left}")
    if healthy is not None and healthy.samples:
        h = healthy.samples
        print(
            f"{'':<18} ratio vs healthy: threads peak "
            f"{max(x.threads for x in s) / max(1, max(x.threads for x in h)):.2f}x, sockets peak "
            f"{max(x.sockets for x in s) / max(1, max(x.sockets for x in h)):.2f}x, msgs/s "
            f"{phase.rate / healthy.rate if healthy.rate else 0.0:.2f}x"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0, help="outage length per shape (default 10)")
    p.add_argument("--smoke", action="store_true", help="5 s per shape, samples every 0.5 s")
    p.add_argument("--shapes", default="", help=f"comma-separated, of {','.join(SHAPES)} (default: all)")
    p.add_argument("--interval", type=float, default=1.0, help="failover_interval, s (default 1)")
    p.add_argument("--ping", type=float, default=0.5, help="ping_primary_interval, s (default 0.5)")
    p.add_argument("--sample", type=float, default=5.0, help="seconds between samples (default 5)")
    p.add_argument("--inproc", action="store_true", help="namespaces in this process")
    args = p.parse_args()
    seconds = 5.0 if args.smoke else 60.0 * args.minutes
    every = 0.5 if args.smoke else args.sample
    names = [n for n in args.shapes.split(",") if n] or list(SHAPES)
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        p.error(f"unknown shapes {unknown}; known: {list(SHAPES)}")
    print(
        f"{seconds:g} s per shape, failover_interval {args.interval:g} s, ping {args.ping:g} s, "
        f"{BATCH} msgs per call every {PAUSE:g} s, samples every {every:g} s, "
        f"namespaces {'in process' if args.inproc else 'in child processes'}; "
        "columns: start/max/end (growth per hour)",
        flush=True,
    )
    with namespaces({"primary": [ENTITY], "secondary": BACKLOG_QUEUES}, inproc=args.inproc) as ns:
        primary, secondary = ns["primary"], ns["secondary"]
        cfg = config(primary, secondary, args.interval, args.ping)
        # the process's watchdog (one for the process, never stopped) is started before anything is counted
        from spark_sb.wire.watchdog import WATCHDOG

        WATCHDOG.watch(time.monotonic(), lambda: None)
        healthy = run_phase("healthy", cfg, seconds, every, primary, None)
        report(healthy, None)
        sys.stdout.flush()
        for name in names:
            report(run_phase(name, cfg, seconds, every, primary, SHAPES[name]), healthy)
            sys.stdout.flush()


if __name__ == "__main__":
    main()
