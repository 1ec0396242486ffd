"""Benchmark: ``ordering: session`` against ``ordering: none`` (issue 31, SPEC O3), same local namespaces, same run.

    .venv/bin/python bench/bench_ordering.py [--count 20000] [--sessions 20] [--latency 0.002] [--repeats 3] [--smoke]

Both namespaces run in child processes (``python -m servicebus_local``). At no injected latency and at ``--latency``
(on both namespaces) it prints:

* ``healthy``: ``count`` messages over ``sessions`` session ids sent with the raw SDK batch sender (the baseline,
  same run), through a :class:`~spark_sb.sender.paired.PairedSender` with ``ordering: none`` and with ``ordering:
  session``, interleaved, fresh queue per run; msgs/s of each and the ratio session/none (target >= 0.95: nothing
  is held, the healthy path costs one look at the session book per message).
* ``recovery``: the primary refuses (two rounds of one message per session diverted), recovers; a
  :class:`~spark_sb.syphon.mover.Syphon` drains on a thread of this process (setting b: the process registry carries
  the acknowledgements) while the sender sends a round every 250 ms; per session, the seconds from the recovery to
  its return to the primary (its record gone from the book), median and max, beside the drain's time and the
  ``ping_primary_interval`` (target: within drain time + ping interval + 1 s).
* ``drain``: a backlog of ``count`` messages over the sessions moved by a Syphon with ``ordering: none`` and with
  ``ordering: session`` (one queue, receive batch after receive batch), interleaved; msgs/s and the ratio (target
  >= 0.7); the ordered drain's peek calls and messages peeked per message moved (its proof's cost).
* ``held`` (SPEC O7, no latency only): a backlog queue as the service creates it (``MaxDeliveryCount`` 10, lock
  60 s); eight sessions flow into it while another worker holds the first session's head locked for ``--hold``
  seconds (a minute; renewed, then abandoned) and a Syphon (``ordering: session``) drains it pass after pass. Printed:
  messages moved, receive calls (receives and receives by sequence number) per message moved (target <= 1), the
  highest delivery count of a held message (target <= 3) and what was dead-lettered (0).

Runs on the driver machine only (no Spark). ``--smoke``: 300 messages, 10 sessions, one repeat, a 5 s hold (CI's
smoke mode).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_failover import raw_sdk  # noqa: E402 - sibling script (the same raw baseline)

from harness.namespaces import Namespace, namespaces  # noqa: E402
from harness.queues import put  # noqa: E402
from spark_sb.config.namespace import NamespaceConfig, RetryConfig  # noqa: E402
from spark_sb.config.secret import Secret  # noqa: E402
from spark_sb.config.service_bus import ServiceBusConfig  # noqa: E402
from spark_sb.failover.outcome import namespace_key  # noqa: E402
from spark_sb.failover.registry import process_registry  # noqa: E402
from spark_sb.message.outbound import OutboundMessage  # noqa: E402
from spark_sb.sender.paired import PairedSender  # noqa: E402
from spark_sb.syphon.mover import Syphon  # noqa: E402

BACKLOG = [f"primary/x-servicebus-transfer/{i}" for i in range(2)]
PING = 1.0  # ping_primary_interval in the recovery part (s)
BATCH = 100
ROUND = 0.25  # the recovery part: the sender sends a round of one message per session this often (s)


def config_for(primary: str, secondary: str, ordering: str, entity: str) -> ServiceBusConfig:
    return ServiceBusConfig(
        primary=NamespaceConfig(connection_string=Secret(primary), namespace_name="primary"),
        secondary=NamespaceConfig(connection_string=Secret(secondary)),
        entity=entity,
        backlog_queue_count=len(BACKLOG),
        failover_interval=0.0,
        ping_primary_interval=PING,
        send_timeout=10.0,
        retry=RetryConfig(total=0, backoff_factor=0.05, backoff_max=0.2),
        ordering=ordering,
        syphon_batch_size=BATCH,
    )


def messages(count: int, sessions: int, body: bytes, prefix: str = "m") -> Iterator[OutboundMessage]:
    for i in range(count):
        yield OutboundMessage(body=body, message_id=f"{prefix}{i}", session_id=f"s{i % sessions}")


# ---------------------------------------------------------------------------------------------- healthy
def paired_seconds(config: ServiceBusConfig, count: int, sessions: int, body: bytes) -> float:
    """Seconds to send ``count`` messages through a PairedSender (its link opened first, not timed)."""
    sender = PairedSender(config)
    try:
        sender.send(messages(1, sessions, body, "warm-"))
        start = time.perf_counter()
        sender.send(messages(count, sessions, body))
        return time.perf_counter() - start
    finally:
        sender.close()


def healthy(
    ns: dict[str, Namespace], index: int, count: int, sessions: int, repeats: int
) -> tuple[float, float, float]:
    primary, secondary = ns["primary"].connection_string, ns["secondary"].connection_string
    body = b"x" * 200
    rates: dict[str, list[float]] = {"raw": [], "none": [], "session": []}
    for i in range(repeats):  # interleaved, so drift affects all alike
        rates["raw"].append(count / raw_sdk(primary, f"h-{index}-raw-{i}", count, body))
        for ordering in ("none", "session"):
            config = config_for(primary, secondary, ordering, f"h-{index}-{ordering}-{i}")
            rates[ordering].append(count / paired_seconds(config, count, sessions, body))
    return tuple(statistics.median(rates[k]) for k in ("raw", "none", "session"))  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------- recovery
def recovery(ns: dict[str, Namespace], index: int, sessions: int) -> tuple[float, float, float]:
    """(drain seconds, median and max seconds from recovery to a session's return to the primary)."""
    primary, secondary = ns["primary"], ns["secondary"]
    config = config_for(primary.connection_string, secondary.connection_string, "session", f"r-{index}")
    registry = process_registry()
    registry.clear()  # the healthy part's entities: not this part's business
    book = registry.sessions(namespace_key(config.primary))
    sender = PairedSender(config)
    syphon = Syphon(config, entity_backoff=0.2)
    body = b"x" * 200
    seq = [0]

    def round_() -> None:
        sender.send(messages(sessions, sessions, body, f"r{seq[0]}-"))
        seq[0] += 1

    stop = threading.Event()
    drained: list[float] = []
    try:
        round_()
        primary.post("/faults/refuse")
        primary.post("/faults/drop")
        for _ in range(2):
            round_()
        primary.post("/faults/accept")
        recovered = time.monotonic()

        def drain() -> None:
            while not stop.is_set():
                if syphon.drain_all(max_wait=0.2).forwarded_total == 0 and len(book) == 0:
                    drained.append(time.monotonic() - recovered)
                    return

        thread = threading.Thread(target=drain, name="syphon", daemon=True)
        thread.start()
        back: dict[str, float] = {}
        deadline = recovered + 60
        while len(back) < sessions and time.monotonic() < deadline:
            round_()
            now = time.monotonic() - recovered
            for s in range(sessions):
                if f"s{s}" not in back and book.held(f"r-{index}", f"s{s}") is None:
                    back[f"s{s}"] = now
            stop.wait(ROUND)  # the sender's pace
        # the drain ends by itself once a pass moves nothing and no line is held: awaited, not cut short (stopped
        # as the last session came back, it could end before that pass and print "drained in nan s")
        thread.join(30)
        stop.set()
    finally:
        stop.set()
        syphon.close()
        sender.close()
        registry.clear()
    if len(back) < sessions:
        held = {k: v for k, v in book.records().items()} if len(book) else {}
        raise RuntimeError(
            f"{sessions - len(back)} sessions not back on the primary within 60 s (drained: {drained}; held: {held})"
        )
    times = sorted(back.values())
    return (drained[0] if drained else float("nan")), statistics.median(times), times[-1]


# ---------------------------------------------------------------------------------------------- drain
def fill(conn: str, queue: str, dest: str, count: int, sessions: int) -> None:
    """``count`` backlog messages for ``dest`` over the sessions into ``queue`` (not timed)."""
    from spark_sb.message.backlog import to_backlog_sdk

    now = datetime.now(timezone.utc)
    put(
        conn,
        queue,
        (to_backlog_sdk(m, dest, now) for m in messages(count, sessions, b"x" * 200, uuid.uuid4().hex[:8])),
    )


def drain_seconds(config: ServiceBusConfig, queue: str, count: int) -> tuple[float, int, int]:
    """(seconds for a Syphon to move ``count`` messages out of ``queue``, receive batch after receive batch; its peek
    calls; the messages they listed)."""
    assert config.entity is not None
    syphon = Syphon(
        config, backlog_queues=[queue], healthy_hints={config.entity: "healthy"}, entity_backoff=0.2
    )
    try:
        start = time.perf_counter()
        moved = peeks = peeked = 0
        while moved < count:
            out = syphon.drain_queue(queue, max_wait=1, max_batches=1)
            moved += out.forwarded_total
            peeks += out.peek_calls
            peeked += out.peeked
        return time.perf_counter() - start, peeks, peeked
    finally:
        syphon.close()
        process_registry().clear()


def drain(
    ns: dict[str, Namespace], index: int, count: int, sessions: int, repeats: int
) -> tuple[float, float, float, float]:
    """(median msgs/s unordered, ordered; the ordered drain's peek calls and peeked messages per message moved)."""
    primary, secondary = ns["primary"].connection_string, ns["secondary"].connection_string
    rates: dict[str, list[float]] = {"none": [], "session": []}
    peeks = peeked = 0
    for i in range(repeats):
        for ordering in ("none", "session"):
            queue, dest = f"d-{index}-{ordering}-{i}", f"dd-{index}-{ordering}-{i}"
            fill(secondary, queue, dest, count, sessions)
            config = config_for(primary, secondary, ordering, dest)
            seconds, calls, listed = drain_seconds(config, queue, count)
            rates[ordering].append(count / seconds)
            if ordering == "session":
                peeks, peeked = peeks + calls, peeked + listed
    moved = count * repeats
    return (
        statistics.median(rates["none"]),
        statistics.median(rates["session"]),
        peeks / moved,
        peeked / moved,
    )


# ---------------------------------------------------------------------------------------------- held line
HELD_SESSIONS = 8


def held(ns: dict[str, Namespace], hold: float) -> tuple[int, int, float, int, int]:
    """(moved, receive calls, deliveries per message moved, highest delivery count of a held message, dead-lettered)
    for a line held ``hold`` seconds behind a head another worker keeps locked."""
    from azure.servicebus import ServiceBusClient

    from spark_sb.message.backlog import to_backlog_sdk

    primary, secondary = ns["primary"].connection_string, ns["secondary"].connection_string
    queue, dest = "held-backlog", "held-dest"
    config = config_for(primary, secondary, "session", dest)
    fill(secondary, queue, dest, HELD_SESSIONS * 5, HELD_SESSIONS)  # s0's head first
    stop = threading.Event()
    seq = [0]

    def produce() -> None:  # a round of one message per session every 0.25 s (what the senders divert)
        with (
            ServiceBusClient.from_connection_string(secondary) as client,
            client.get_queue_sender(queue) as sender,
        ):
            while not stop.wait(ROUND):
                now = datetime.now(timezone.utc)
                batch = [
                    to_backlog_sdk(
                        OutboundMessage(body=b"x" * 200, message_id=f"p{seq[0]}-{s}", session_id=f"s{s}"),
                        dest,
                        now,
                    )
                    for s in range(HELD_SESSIONS)
                ]
                seq[0] += 1
                sender.send_messages(batch, timeout=10)

    syphon = Syphon(config, backlog_queues=[queue], healthy_hints={dest: "healthy"}, entity_backoff=0.2)
    moved = calls = deliveries = 0
    worst = 0
    with (
        ServiceBusClient.from_connection_string(secondary) as client,
        client.get_queue_receiver(queue) as other,
    ):
        (head,) = other.receive_messages(max_message_count=1, max_wait_time=10)  # another worker's lock
        producer = threading.Thread(target=produce, name="producer", daemon=True)
        producer.start()
        keeping = threading.Event()

        def keep() -> None:  # the other worker keeps its lock on its own clock, however slow a drain pass is
            while not keeping.wait(10):
                other.renew_message_lock(head, timeout=10)

        keeper = threading.Thread(target=keep, name="lock-keeper", daemon=True)
        keeper.start()
        try:
            released = time.monotonic() + hold
            while time.monotonic() < released:
                out = syphon.drain_queue(queue, max_wait=0.2, until=released)  # fed: a pass never runs dry
                moved += out.forwarded_total + out.markers
                calls += out.receive_calls + out.fetch_calls
                deliveries += out.received + out.fetched
            keeping.set()
            keeper.join()
            waiting = [
                m
                for m in other.peek_messages(max_message_count=5000, sequence_number=1, timeout=10)
                if m.session_id is None and (m.application_properties or {}).get(b"x-ms-sessionid") == b"s0"
            ]
            worst = max((m.delivery_count or 0 for m in waiting), default=0)
            other.abandon_message(head)
            stop.set()
            producer.join(15)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # the held line moves, then the queue is empty
                out = syphon.drain_queue(queue, max_wait=0.5, until=deadline)
                moved += out.forwarded_total + out.markers
                calls += out.receive_calls + out.fetch_calls
                deliveries += out.received + out.fetched
                if out.forwarded_total == 0 and not other.peek_messages(sequence_number=1, timeout=10):
                    break
        finally:
            stop.set()
            keeping.set()
            syphon.close()
            process_registry().clear()
        dead = len(
            client.get_queue_receiver(queue, sub_queue="deadletter").peek_messages(
                max_message_count=5000, sequence_number=1, timeout=10
            )
        )
    return moved, calls, deliveries / max(moved, 1), worst, dead


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--latency", type=float, default=0.002)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hold", type=float, default=60.0, help="seconds a held line's head stays locked")
    parser.add_argument(
        "--smoke", action="store_true", help="300 messages, 10 sessions, one repeat (CI's smoke mode)"
    )
    args = parser.parse_args()
    if args.smoke:
        args.count, args.sessions, args.repeats, args.hold = 300, 10, 1, 5.0
    reps = range(args.repeats)
    primary_queues = [f"h-{x}-{k}-{i}" for x in (0, 1) for k in ("raw", "none", "session") for i in reps]
    primary_queues += [f"r-{x}" for x in (0, 1)]
    primary_queues += [f"dd-{x}-{k}-{i}" for x in (0, 1) for k in ("none", "session") for i in reps]
    primary_queues += ["held-dest"]
    secondary_queues = [
        *BACKLOG,
        "held-backlog",
        *(f"d-{x}-{k}-{i}" for x in (0, 1) for k in ("none", "session") for i in reps),
    ]
    with namespaces({"primary": primary_queues, "secondary": secondary_queues}) as ns:
        for index, latency in enumerate((0.0, args.latency)):
            for n in ns.values():
                n.set_latency(latency)
            label = f"latency {latency * 1000:.0f} ms"
            raw, none, session = healthy(ns, index, args.count, args.sessions, args.repeats)
            print(
                f"{label} healthy, {args.count} msgs over {args.sessions} sessions: raw SDK {raw:,.0f} msgs/s, "
                f"ordering none {none:,.0f} msgs/s, ordering session {session:,.0f} msgs/s, "
                f"ratio {session / none:.2f} (target >= 0.95)",
                flush=True,
            )
            drained, median, worst = recovery(ns, index, args.sessions)
            print(
                f"{label} recovery, {args.sessions} sessions: drained in {drained:.2f} s, back on the primary "
                f"median {median:.2f} s, max {worst:.2f} s after recovery (target <= drain + ping {PING:.0f} s + 1 s)",
                flush=True,
            )
            unordered, ordered, peeks, peeked = drain(ns, index, args.count, args.sessions, args.repeats)
            print(
                f"{label} drain, {args.count} msgs: ordering none {unordered:,.0f} msgs/s, ordering session "
                f"{ordered:,.0f} msgs/s, ratio {ordered / unordered:.2f} (target >= 0.7); ordered: {peeks:.3f} peek "
                f"calls, {peeked:.3f} messages peeked per message moved",
                flush=True,
            )
            if index == 0:
                moved, calls, per, worst, dead = held(ns, args.hold)
                print(
                    f"{label} held line, {HELD_SESSIONS} sessions, head locked {args.hold:.0f} s: {moved} moved, "
                    f"{calls} receive calls, {calls / max(moved, 1):.2f} per message moved (target <= 1), "
                    f"{per:.2f} deliveries per message moved, max delivery count of a held message {worst} "
                    f"(target <= 3), dead-lettered {dead}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
