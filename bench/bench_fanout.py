"""Benchmark: one sender fanning out over E entities (SPEC F1-F5): cold start, steady throughput against the raw
SDK, outage cost and recovery per outage shape, connections and threads.

    .venv/bin/python bench/bench_fanout.py [--entities 1,10,100,1000] [--latency-ms 0,2] [--quick] [--check]
                                           [--failover-interval 2] [--ping-primary-interval 1] [--cap 120]
                                           [--shapes refused+dropped,stall-after-sasl,stall-before-sasl,dns]
                                           [--slices 10] [--slice 5000] [--size 200] [--verbose] [--smoke]

For each latency and each E, three fresh local namespaces run in child processes (``python -m servicebus_local``
with a control port): "primary" with queues q0..q{E-1} (PairedSender's primary), "raw" with the same queues
(the raw SDK baseline's, so that each side's connections are counted apart) and "secondary" with the backlog
queues. The latency fault (``POST /faults/latency``) is set on all three. Every batch holds messages
round-robin over the E queues (message i goes to q{i mod E}).

- cold s: a fresh ``PairedSender`` (no link open) sends one batch of 2 messages per entity; the time of that
  ``send()``. Goal (F3) <= 1 s + 10 ms per entity. "raw open s" (no goal) is the time the raw baseline takes to
  open its E senders, 16 at a time (one message each; each sender opens its own connection).
- steady msgs/s (F5): that sender, links open, against the raw SDK writer: one ``ServiceBusClient``, one
  ``ServiceBusSender`` per entity kept open, one ``ServiceBusMessageBatch`` per entity packed by size. After a
  warm-up slice each, ``--slices`` rounds of ``--slice`` messages (at least 2 per entity), ours and raw back to
  back, the order alternating between rounds; msgs/s are the medians of the rounds, the ratio is the median of
  the per-round ratios ours / raw (as bench_failover.py does). Goal >= 0.95.
- outage s per shape (F1): with the links open (warm), the primary breaks - refused + dropped (new connections
  refused, live ones cut), stalled after SASL, stalled before SASL - or, for "dns", a new sender is given the
  primary under a host name that does not resolve. From the start of the first ``send()`` after the fault (a
  batch of 2 messages per entity) until a ``send()`` returns with every message diverted to the backlog.
  Goal <= failover_interval + 0.5 s. Every message of those sends must be counted sent or diverted ("lost"
  column, always 0; a send that raises counts its unconfirmed messages as lost).
- recovery s: after the fault is cleared, until ``entity_state()`` is HEALTHY for every entity (polled every
  20 ms, calling ``maintain()`` as an idle caller would). Goal <= ping_primary_interval + 0.5 s. Not measured
  for "dns": a sender whose host never resolves does not recover, and one given the real name starts cold.
- conns ours/raw (F2): the most AMQP connections open at once on the primary / on the raw namespace during the
  run (the namespace's ``GET /status`` gauge ``connections_peak`` when it has one, otherwise ESTABLISHED TCP
  connections of this process to the port, from /proc/net/tcp, sampled). Goal for ours <= 2.
- threads ours/raw/process: threads started while ours / raw was running (the sampler attributes a thread to
  the side that was running when it first saw it), the most alive at once; and the process's most
  (``threading.active_count()``). Sampled every 50 ms outside the timed steady slices and after each slice.

Each ``send()`` (and each recovery wait) runs on a helper thread with a wall-clock cap (``--cap``, 120 s): past
it the value prints as ">120", the sender is abandoned (closed in the background) and the next shape gets a
fresh one. Misses are marked "!"; with ``--check`` the exit status is 1 when any value misses its goal (or a
message was lost). ``--quick``: 3 rounds of 1,000 messages. ``--smoke`` (CI's smoke mode, seconds): E = 2, no
latency, one round of 200 messages, the shapes refused+dropped and stall-after-sasl, failover_interval and
ping_primary_interval 0.5 s, a 30 s cap.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from azure.servicebus import ServiceBusClient, ServiceBusMessage  # noqa: E402
from azure.servicebus.exceptions import MessageSizeExceededError  # noqa: E402

from harness.namespaces import Namespace, namespaces  # noqa: E402
from spark_sb.config.service_bus import ServiceBusConfig  # noqa: E402
from spark_sb.core.errors import SendError  # noqa: E402
from spark_sb.failover.registry import FailoverRegistry  # noqa: E402
from spark_sb.message.outbound import OutboundMessage  # noqa: E402
from spark_sb.sender.paired import PairedSender  # noqa: E402

SHAPES = ("refused+dropped", "stall-after-sasl", "stall-before-sasl", "dns")
BACKLOG_COUNT = 2
HELPER = "bench-"  # the bench's own threads (sampler, capped calls, output drains): not counted
#: The raw baseline opens its senders this many at a time (each opens its own connection).
RAW_OPENERS = 16
UNRESOLVABLE = "primary.nonexistent.invalid"

# ------------------------------------------------------------------------------------- namespaces (children)


def _namespaces(
    entities: list[str], backlog: list[str]
) -> contextlib.AbstractContextManager[dict[str, Namespace]]:
    """The three namespaces of a case (harness/namespaces.py: child processes, started side by side): "primary"
    and "raw" with the entities, "secondary" with the backlog queues."""
    return namespaces({"primary": entities, "raw": entities, "secondary": backlog})


# ------------------------------------------------------------------------------------ census and wall caps


def _tcp_established(port: int) -> int:
    """ESTABLISHED TCP connections of this process whose remote port is ``port`` (/proc/net/tcp, tcp6)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if (
                        fields[3] == "01"
                        and int(fields[2].rsplit(":", 1)[1], 16) == port
                        and fields[9] in inodes
                    ):
                        n += 1
        except OSError:
            continue
    return n


class _Census:
    """Peak threads per side (ours / raw) and of the process; peak TCP connections per port when asked."""

    def __init__(self, ports: dict[str, int], count_tcp: bool, period: float = 0.05) -> None:
        self._baseline = set(threading.enumerate())
        self._ports = ports
        self._count_tcp = count_tcp
        self._period = period
        self._lock = threading.Lock()
        self._owned: dict[threading.Thread, str] = {}
        self.owner: str | None = None
        self.live = True
        self.threads: Counter[str] = Counter()
        self.process = threading.active_count()
        self.conns: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{HELPER}census", daemon=True)

    def __enter__(self) -> _Census:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            if self.live:
                self.sample()

    def sample(self) -> None:
        with self._lock:
            alive = threading.enumerate()
            self.process = max(self.process, len(alive))
            counts: Counter[str] = Counter()
            for t in alive:
                if t in self._baseline or t.name.startswith(HELPER):
                    continue
                who = self._owned.get(t)
                if who is None:
                    who = self._owned[t] = self.owner or "other"
                counts[who] += 1
            for who, n in counts.items():
                self.threads[who] = max(self.threads[who], n)
            if self._count_tcp:
                for name, port in self._ports.items():
                    self.conns[name] = max(self.conns[name], _tcp_established(port))

    @contextmanager
    def phase(self, owner: str, live: bool = True) -> Iterator[None]:
        """``owner`` runs; with ``live`` False the sampler thread rests (timed slices) and one sample follows."""
        self.sample()
        self.owner, self.live = owner, live
        try:
            yield
        finally:
            self.sample()
            self.owner, self.live = None, True


@dataclass
class _Capped:
    done: bool
    elapsed: float
    value: Any = None
    error: BaseException | None = None


def _capped(fn: Callable[[], Any], cap: float) -> _Capped:
    """Run ``fn`` on a helper thread; give up waiting after ``cap`` seconds (the thread runs on, a daemon)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # reported to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"{HELPER}capped", daemon=True)
    started = time.perf_counter()
    thread.start()
    thread.join(cap)
    elapsed = time.perf_counter() - started
    if thread.is_alive():
        return _Capped(False, elapsed)
    return _Capped(True, elapsed, box.get("value"), box.get("error"))


# ------------------------------------------------------------------------------------------------ writers


def _names(count: int) -> list[str]:
    return [f"q{k}" for k in range(count)]


class _Raw:
    """The raw SDK baseline: one client, one sender per entity (kept open), one batch per entity."""

    def __init__(self, conn: str, entities: list[str], body: bytes) -> None:
        self._client = ServiceBusClient.from_connection_string(conn)
        self._senders = [self._client.get_queue_sender(q) for q in entities]
        self._body = body
        self._cancel = threading.Event()
        self._opened = threading.Event()

    def open(self) -> None:
        """Open every sender (its own connection, as the SDK does), :data:`RAW_OPENERS` at a time: one after the
        other, 1,000 of them take longer than the cap and the steady state at E = 1,000 was never measured."""

        def one(sender: Any) -> None:
            if not self._cancel.is_set():
                sender.send_messages(ServiceBusMessage(self._body))

        try:
            with ThreadPoolExecutor(RAW_OPENERS, thread_name_prefix=f"{HELPER}raw-open") as pool:
                for done in [pool.submit(one, sender) for sender in self._senders]:
                    done.result()
        finally:
            self._opened.set()

    def cancel_open(self, wait: float) -> None:
        """Stop an ``open`` that hit the cap (before its next sender) and wait for it: otherwise it goes on opening
        senders - and starting the SDK's threads - while ours is measured, and they would be counted as ours."""
        self._cancel.set()
        self._opened.wait(wait)

    def slice(self, count: int) -> float:
        body, senders, e = self._body, self._senders, len(self._senders)
        started = time.perf_counter()
        batches: dict[int, Any] = {}
        for i in range(count):
            k = i % e
            message = ServiceBusMessage(body)
            batch = batches.get(k)
            if batch is None:
                batch = batches[k] = senders[k].create_message_batch()
            try:
                batch.add_message(message)
            except MessageSizeExceededError:
                senders[k].send_messages(batch)
                batch = batches[k] = senders[k].create_message_batch()
                batch.add_message(message)
        for k, batch in batches.items():
            if len(batch):
                senders[k].send_messages(batch)
        return time.perf_counter() - started

    def close(self) -> None:
        for sender in self._senders:
            sender.close()
        self._client.close()


def _batch(entities: list[str], count: int, body: bytes) -> list[OutboundMessage]:
    e = len(entities)
    return [OutboundMessage(body=body, entity=entities[i % e]) for i in range(count)]


def _send_all(sender: PairedSender, entities: list[str], count: int, body: bytes) -> float:
    """Seconds for one ``send()`` of ``count`` messages round-robin; every one must reach the primary."""
    e = len(entities)
    started = time.perf_counter()
    out = sender.send(OutboundMessage(body=body, entity=entities[i % e]) for i in range(count))
    elapsed = time.perf_counter() - started
    assert out.total_sent == count, f"{out.total_sent} of {count} sent to the primary: {out}"
    return elapsed


# --------------------------------------------------------------------------------------------- one case


@dataclass
class _Shape:
    outage: float | None = None  # None: not reached within the cap (or not measured)
    recovery: float | None = None
    capped: bool = False  # the outage send hit the wall-clock cap
    recovery_capped: bool = False
    lost: int | None = None  # None: unknown (a send still running at the cap)
    note: str = ""


@dataclass
class _Row:
    entities: int
    cold: float | None = None
    cold_capped: bool = False
    raw_open: float | None = None
    ours: float | None = None
    raw: float | None = None
    ratio: float | None = None
    shapes: dict[str, _Shape] = field(default_factory=dict)
    conns: dict[str, int | None] = field(default_factory=dict)
    conns_source: str = ""
    threads: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _config(args: argparse.Namespace, primary: str, secondary: str, dns: bool = False) -> ServiceBusConfig:
    if dns:
        primary = primary.replace("sb://127.0.0.1:", f"sb://{UNRESOLVABLE}:")
    return ServiceBusConfig.from_dict(
        {
            "primary": {"connection_string": primary, "namespace_name": "primary"},
            "secondary": {"connection_string": secondary},
            "backlog_queue_count": BACKLOG_COUNT,
            "failover_interval": f"{args.failover_interval}s",
            "ping_primary_interval": f"{args.ping_primary_interval}s",
        }
    )


def _fault(primary: Namespace, shape: str, on: bool) -> None:
    if shape == "refused+dropped":
        if on:
            primary.post("/faults/refuse")
            primary.post("/faults/drop")
        else:
            primary.post("/faults/accept")
    elif shape == "stall-after-sasl":
        primary.post("/faults/stall", {"on": on})
    elif shape == "stall-before-sasl":
        primary.post("/faults/stall", {"on": on, "answer_sasl": False})


@dataclass
class _Tally:
    produced: int = 0
    confirmed: int = 0
    sends: int = 0
    errors: list[str] = field(default_factory=list)


def _until_diverted(
    sender: PairedSender, entities: list[str], body: bytes, tally: _Tally, deadline: float
) -> float | None:
    """Send batches of 2 messages per entity from now until one returns with every message diverted: the
    seconds from the first send's start to that return (None if the deadline passes first)."""
    started = time.perf_counter()
    while time.perf_counter() < deadline:
        batch = _batch(entities, 2 * len(entities), body)
        tally.produced += len(batch)
        tally.sends += 1
        try:
            out = sender.send(batch)
        except SendError as err:
            tally.errors.append(f"{type(err).__name__}: {err}"[:200])
            if err.outcome is not None:
                tally.confirmed += err.outcome.total_sent + err.outcome.total_diverted
            time.sleep(0.05)
            continue
        except Exception as exc:  # recorded; its messages count as lost
            tally.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            time.sleep(0.05)
            continue
        tally.confirmed += out.total_sent + out.total_diverted
        if out.total_diverted == len(batch):
            return time.perf_counter() - started
    return None


def _until_healthy(sender: PairedSender, entities: list[str], deadline: float) -> float | None:
    started = time.perf_counter()
    while time.perf_counter() < deadline:
        sender.maintain()
        if all(str(sender.entity_state(e)) == "healthy" for e in entities):
            return time.perf_counter() - started
        time.sleep(0.02)
    return None


def _abandon(sender: PairedSender) -> None:
    threading.Thread(target=sender.close, name=f"{HELPER}close", daemon=True).start()


def _outage(
    args: argparse.Namespace,
    shape: str,
    ns: dict[str, Namespace],
    sender: PairedSender | None,
    entities: list[str],
    body: bytes,
) -> tuple[_Shape, PairedSender | None]:
    """One outage shape; returns its result and the sender to use next (None: make a fresh one)."""
    result = _Shape()
    cap = args.cap
    primary, secondary = ns["primary"], ns["secondary"]
    if shape == "dns":
        measured = PairedSender(
            _config(args, primary.connection_string, secondary.connection_string, dns=True),
            registry=FailoverRegistry(),
        )
    else:
        # Every link open first (not timed); a sender that can not send everything to the primary (still
        # failed over after an earlier shape, say) is replaced by a fresh one, once.
        for attempt in ("reused", "fresh") if sender is not None else ("fresh",):
            if attempt == "fresh":
                sender = PairedSender(
                    _config(args, primary.connection_string, secondary.connection_string),
                    registry=FailoverRegistry(),
                )
            assert sender is not None
            warm = _capped(partial(_send_all, sender, entities, 2 * len(entities), body), cap)
            if warm.done and warm.error is None:
                break
            result.note = f"warm-up ({attempt} sender) " + (
                "capped" if not warm.done else f"failed: {warm.error}"[:160]
            )
            _abandon(sender)
            sender = None
        if sender is None:
            return result, None
        measured = sender
        _fault(primary, shape, True)
    tally = _Tally()
    run = _capped(
        lambda: _until_diverted(measured, entities, body, tally, time.perf_counter() + cap), cap + 5
    )
    result.capped = not run.done or run.value is None or run.value > cap
    result.outage = None if result.capped else run.value
    result.lost = tally.produced - tally.confirmed if run.done else None
    if run.error is not None:
        result.note = f"{type(run.error).__name__}: {run.error}"[:160]
    elif tally.errors:
        result.note = f"{len(tally.errors)} send(s) raised, first: {tally.errors[0]}"
    if shape == "dns":
        if run.done:
            measured.close()
        else:
            _abandon(measured)
        return result, sender
    _fault(primary, shape, False)
    if not run.done:  # the send is still running: leave it, the next shape gets a fresh sender
        _abandon(measured)
        return result, None
    if result.outage is None:  # never failed over (within the cap): no recovery to time
        return result, measured
    back = _capped(lambda: _until_healthy(measured, entities, time.perf_counter() + cap), cap + 5)
    result.recovery_capped = back.value is None or back.value > cap
    result.recovery = None if result.recovery_capped else back.value
    if back.error is not None:
        result.note = (result.note + "; " if result.note else "") + f"recovery: {back.error}"[:160]
    if not back.done or back.value is None:
        _abandon(measured)
        return result, None
    return result, measured


def run_case(args: argparse.Namespace, e: int, latency: float) -> _Row:
    row = _Row(e)
    entities = _names(e)
    body = b"x" * args.size
    backlog = [f"primary/x-servicebus-transfer/{i}" for i in range(BACKLOG_COUNT)]
    cap = args.cap
    with _namespaces(entities, backlog) as ns:
        for n in ns.values():
            n.post("/faults/latency", {"seconds": latency})
        gauges = ns["primary"].peak_connections() is not None
        row.conns_source = "namespace gauge" if gauges else "/proc/net/tcp"
        ports = {"ours": ns["primary"].port, "raw": ns["raw"].port}
        with _Census(ports, count_tcp=not gauges) as census:
            sender: PairedSender | None = PairedSender(
                _config(args, ns["primary"].connection_string, ns["secondary"].connection_string),
                registry=FailoverRegistry(),
            )
            assert sender is not None
            ours = sender
            with census.phase("ours"):
                cold = _capped(lambda: _send_all(ours, entities, 2 * e, body), cap)
            row.cold_capped = not cold.done
            if cold.done and cold.error is None:
                row.cold = cold.value
            else:
                row.notes.append(
                    "cold send " + ("capped" if not cold.done else f"failed: {cold.error}"[:200])
                )
                _abandon(sender)
                sender = None
            raw: _Raw | None = None
            with census.phase("raw"):
                raw = _Raw(ns["raw"].connection_string, entities, body)
                opened = _capped(raw.open, cap)
            if opened.done and opened.error is None:
                row.raw_open = opened.elapsed
            else:
                row.notes.append("raw open " + ("capped" if not opened.done else f"failed: {opened.error}"))
                with census.phase("raw"):
                    raw.cancel_open(wait=60.0)
                    raw.close()
                raw = None
            if sender is not None and raw is not None:
                _steady(args, row, census, sender, raw, entities, body)
            if raw is not None:
                with census.phase("raw"):
                    raw.close()
            for shape in args.shapes:
                with census.phase("ours"):
                    row.shapes[shape], sender = _outage(args, shape, ns, sender, entities, body)
                print(f"  E={e} {shape}: {_shape_text(args, row.shapes[shape])}", file=sys.stderr, flush=True)
            if gauges:
                row.conns = {"ours": ns["primary"].peak_connections(), "raw": ns["raw"].peak_connections()}
            if sender is not None:
                sender.close()
        if not gauges:
            row.conns = {k: census.conns[k] for k in ports}
        row.threads = {
            "ours": census.threads["ours"],
            "raw": census.threads["raw"],
            "process": census.process,
        }
    return row


def _steady(
    args: argparse.Namespace,
    row: _Row,
    census: _Census,
    sender: PairedSender,
    raw: _Raw,
    entities: list[str],
    body: bytes,
) -> None:
    count = max(args.slice, 2 * len(entities))
    slices = {
        "ours": lambda: _send_all(sender, entities, count, body),
        "raw": lambda: raw.slice(count),
    }
    for kind, fn in slices.items():  # warm-up, not timed
        with census.phase(kind):
            fn()
    pairs: list[tuple[float, float]] = []  # (ours, raw) msgs/s per round
    for r in range(args.slices):
        order = ("raw", "ours") if r % 2 == 0 else ("ours", "raw")
        rate: dict[str, float] = {}
        for kind in order:
            with census.phase(kind, live=False):
                rate[kind] = count / slices[kind]()
        pairs.append((rate["ours"], rate["raw"]))
    row.ours = statistics.median(o for o, _ in pairs)
    row.raw = statistics.median(r for _, r in pairs)
    row.ratio = statistics.median(o / r for o, r in pairs)


# ----------------------------------------------------------------------------------------------- printing


def _mark(text: str, miss: bool, misses: list[str], what: str) -> str:
    if miss:
        misses.append(what)
        return text + "!"
    return text


def _secs(value: float | None, capped: bool, cap: float) -> str:
    if value is None:
        return f">{cap:g}" if capped else "-"
    return f"{value:.2f}"


def _shape_text(args: argparse.Namespace, s: _Shape, misses: list[str] | None = None) -> str:
    misses = [] if misses is None else misses
    out_goal = args.failover_interval + 0.5
    rec_goal = args.ping_primary_interval + 0.5
    out = _mark(
        _secs(s.outage, s.capped, args.cap), s.outage is None or s.outage > out_goal, misses, "outage"
    )
    if s.recovery is None and not s.recovery_capped:
        rec = "-"
    else:
        rec = _mark(
            _secs(s.recovery, s.recovery_capped, args.cap),
            s.recovery is None or s.recovery > rec_goal,
            misses,
            "recovery",
        )
    return f"{out}/{rec}"


COLUMNS = (
    ("E", 5),
    ("cold s", 8),
    ("raw open s", 10),
    ("ours msg/s", 10),
    ("raw msg/s", 10),
    ("ratio", 6),
)


def _header(args: argparse.Namespace) -> str:
    cols = [f"{name:>{width}}" for name, width in COLUMNS]
    cols += [f"{s + ' out/rec s':>22}" for s in args.shapes]
    cols += [f"{'lost':>5}", f"{'conns ours/raw':>14}", f"{'threads ours/raw/proc':>21}"]
    return " ".join(cols)


def _line(args: argparse.Namespace, row: _Row, misses: list[str]) -> str:
    e = row.entities
    cold = _mark(
        _secs(row.cold, row.cold_capped, args.cap),
        row.cold is None or row.cold > 1 + 0.01 * e,
        misses,
        "cold",
    )
    ratio = "-" if row.ratio is None else _mark(f"{row.ratio:.2f}", row.ratio < 0.95, misses, "ratio")
    cells = [
        f"{e:>5}",
        f"{cold:>8}",
        f"{_secs(row.raw_open, False, args.cap):>10}",
        f"{'-' if row.ours is None else f'{row.ours:,.0f}':>10}",
        f"{'-' if row.raw is None else f'{row.raw:,.0f}':>10}",
        f"{ratio:>6}",
    ]
    for s in args.shapes:
        shape = row.shapes.get(s)
        cells.append(f"{'-' if shape is None else _shape_text(args, shape, misses):>22}")
    losses = [s.lost for s in row.shapes.values()]
    lost = "?" if any(x is None for x in losses) else str(sum(x for x in losses if x is not None))
    lost = _mark(lost, any(x for x in losses if x), misses, "lost")
    ours_c, raw_c = row.conns.get("ours"), row.conns.get("raw")
    ours_text = "?" if ours_c is None else _mark(str(ours_c), ours_c > 2, misses, "connections")
    threads = f"{row.threads.get('ours', 0)}/{row.threads.get('raw', 0)}/{row.threads.get('process', 0)}"
    cells += [
        f"{lost:>5}",
        f"{ours_text + '/' + ('?' if raw_c is None else str(raw_c)):>14}",
        f"{threads:>21}",
    ]
    return " ".join(cells)


# ------------------------------------------------------------------------------------------------- main


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--entities", type=_ints, default=[1, 10, 100, 1000], help="E values, comma-separated"
    )
    parser.add_argument("--latency-ms", type=_floats, default=[0.0, 2.0], help="injected latencies in ms")
    parser.add_argument("--failover-interval", type=float, default=2.0, help="seconds")
    parser.add_argument("--ping-primary-interval", type=float, default=1.0, help="seconds")
    parser.add_argument(
        "--shapes", default=",".join(SHAPES), help="comma-separated subset of: " + ", ".join(SHAPES)
    )
    parser.add_argument(
        "--slices", type=int, default=None, help="steady rounds per case (default 10, quick 3)"
    )
    parser.add_argument(
        "--slice", type=int, default=None, help="messages per round (default 5000, quick 1000)"
    )
    parser.add_argument("--size", type=int, default=200, help="message body bytes")
    parser.add_argument("--cap", type=float, default=120.0, help="wall-clock cap of one send / wait, seconds")
    parser.add_argument("--quick", action="store_true", help="a short run: 3 rounds of 1,000 messages")
    parser.add_argument("--check", action="store_true", help="exit 1 when a value misses its goal")
    parser.add_argument("--verbose", action="store_true", help="keep the sender's and the SDK's log lines")
    parser.add_argument("--smoke", action="store_true", help="seconds: E=2, one round, two shapes (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.entities, args.latency_ms, args.shapes = [2], [0.0], "refused+dropped,stall-after-sasl"
        args.slices, args.slice, args.cap = 1, 200, 30.0
        args.failover_interval = args.ping_primary_interval = 0.5
    args.shapes = [s for s in args.shapes.split(",") if s]
    unknown = set(args.shapes) - set(SHAPES)
    if unknown:
        parser.error(f"unknown shape(s): {', '.join(sorted(unknown))}")
    if args.slices is None:
        args.slices = 3 if args.quick else 10
    if args.slice is None:
        args.slice = 1_000 if args.quick else 5_000
    if not args.verbose:
        for name in ("spark_sb", "azure"):
            logging.getLogger(name).setLevel(logging.CRITICAL)

    print(
        f"failover_interval {args.failover_interval:g} s, ping_primary_interval {args.ping_primary_interval:g} s, "
        f"send_timeout 30 s; steady {args.slices} rounds of max({args.slice}, 2 E) x {args.size} B; cap "
        f"{args.cap:g} s per send. Goals: cold <= 1 + 0.01 E s, ratio >= 0.95, outage <= "
        f"{args.failover_interval + 0.5:g} s, recovery <= {args.ping_primary_interval + 0.5:g} s, connections "
        "(ours) <= 2, lost 0; '!' marks a miss",
        flush=True,
    )
    misses: list[str] = []
    for latency_ms in args.latency_ms:
        print(f"\nlatency {latency_ms:g} ms", flush=True)
        print(_header(args), flush=True)
        notes: list[str] = []
        source = ""
        for e in args.entities:
            row = run_case(args, e, latency_ms / 1000.0)
            print(_line(args, row, misses), flush=True)
            notes += [f"E={e}: {n}" for n in row.notes]
            notes += [f"E={e} {name}: {s.note}" for name, s in row.shapes.items() if s.note]
            if row.conns_source:
                source = row.conns_source
        print(f"(connections: {source})", flush=True)
        for note in notes:
            print(f"  note {note}", flush=True)
    if misses:
        print(f"\n{len(misses)} miss(es): {', '.join(sorted(set(misses)))}", flush=True)
    return 1 if args.check and misses else 0


if __name__ == "__main__":
    sys.exit(main())
