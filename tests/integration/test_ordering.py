"""``ordering: session`` in a plain application (README "Without Spark"): a PairedSender and a Syphon in one process,
sharing the process's failover registry, against two local namespaces (real SDK, real TCP). A session-enabled
primary queue, N sessions, an outage of the primary (connections refused and dropped) mid-stream, the Syphon
draining on its own thread while new messages keep coming; then session receivers on the primary: each session's
messages in the order they were sent, none lost, none twice, no return marker. The same run with ``ordering: none``
shows sessions out of order (the control: new messages overtake the backlog after recovery)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusReceiveMode

from harness.outages import backlog_count
from servicebus_local.model import QueueSettings
from spark_sb.config.namespace import NamespaceConfig, RetryConfig
from spark_sb.config.secret import Secret
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.failover.ordering import QueueUnavailableError, pinned_queue
from spark_sb.failover.outcome import SendOutcome, namespace_key
from spark_sb.failover.records import EntityState
from spark_sb.failover.registry import process_registry
from spark_sb.message.backlog import RETURN_MARKER
from spark_sb.message.outbound import OutboundMessage
from spark_sb.sender.paired import PairedSender
from spark_sb.syphon.mover import Syphon

pytestmark = pytest.mark.slow

ENTITY = "orders"
QUEUES = [f"primary/x-servicebus-transfer/{i}" for i in range(3)]
SESSIONS = [f"s{i}" for i in range(8)]


@pytest.fixture
def pair(namespace_pair: Any) -> Any:
    namespace_pair.primary.broker.create_queue(
        ENTITY, QueueSettings(requires_session=True, requires_duplicate_detection=True)
    )
    for q in QUEUES:  # as provisioned: a message is abandoned as often as an outage needs
        namespace_pair.secondary.broker.create_queue(q, QueueSettings(max_delivery_count=2147483647))
    return namespace_pair


def config_for(pair: Any, ordering: str, **overrides: Any) -> ServiceBusConfig:
    base = ServiceBusConfig(
        primary=NamespaceConfig(
            connection_string=Secret(pair.primary.connection_string), namespace_name="primary"
        ),
        secondary=NamespaceConfig(connection_string=Secret(pair.secondary.connection_string)),
        entity=ENTITY,
        backlog_queue_count=len(QUEUES),
        failover_interval=0.0,
        ping_primary_interval=1.0,
        backlog_retry_interval=60.0,
        send_timeout=3.0,
        retry=RetryConfig(total=0, backoff_factor=0.1, backoff_max=0.5),
        ordering=ordering,
        syphon_batch_size=20,
    )
    return replace(base, **overrides)


class Run:
    """A sender on this thread, a syphon draining on its own thread while ``draining`` is set, and what was sent."""

    def __init__(self, pair: Any, ordering: str, **overrides: Any) -> None:
        self.pair = pair
        self.config = config_for(pair, ordering, **overrides)
        self.sender = PairedSender(self.config)  # the process registry, as in the README
        self.syphon = Syphon(
            self.config, entity_backoff=0.5
        )  # the same registry: acknowledgements reach the sender
        self.produced: dict[str, int] = {}
        self.after_recovery: list[SendOutcome] = []  # the rounds sent while the syphon was held back
        self.draining = threading.Event()
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._drain, name="syphon", daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        while not self.stop.is_set():
            if not self.draining.wait(0.05):
                continue
            try:
                self.syphon.drain_all(max_wait=0.2)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                self.errors.append(exc)
                return

    def next_round(self, per_session: int = 3) -> list[OutboundMessage]:
        batch = []
        for s in SESSIONS:
            n = self.produced.get(s, 0)
            batch += [
                OutboundMessage(body=f"{s}:{i}", session_id=s, message_id=f"{s}-{i}")
                for i in range(n, n + per_session)
            ]
            self.produced[s] = n + per_session
        return batch

    def send_round(self, per_session: int = 3) -> SendOutcome:
        return self.sender.send(self.next_round(per_session))

    def until(self, what: str, check: Any, seconds: float = 30.0) -> None:
        deadline = time.monotonic() + seconds
        while not check():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            self.sender.maintain()
            time.sleep(0.1)

    def backlog(self) -> int:
        return backlog_count(self.pair.secondary, QUEUES)

    def close(self) -> None:
        self.stop.set()
        self.draining.set()
        self.thread.join(30)
        self.syphon.close()
        self.sender.close()
        assert not self.errors, self.errors


def scenario(pair: Any, ordering: str) -> Run:
    """Rounds of 3 messages for each of 8 sessions: healthy, the primary refuses (diverted), healthy again with the
    syphon held back for two rounds (the backlog is still full when new messages come), then draining while new
    rounds keep coming; at last everything drained and one more round."""
    run = Run(pair, ordering)
    try:
        for _ in range(2):
            run.send_round()
        pair.primary.faults.refuse_connections()
        pair.primary.faults.drop_connections()
        for _ in range(3):
            run.send_round()
        assert run.sender.entity_state(ENTITY) is EntityState.FAILED_OVER
        pair.primary.faults.accept_connections()
        run.until(
            "the primary to answer a probe", lambda: run.sender.entity_state(ENTITY) is EntityState.HEALTHY
        )
        for _ in range(2):
            run.after_recovery.append(
                run.send_round()
            )  # ordering: none sends these direct, ahead of the backlog
        run.draining.set()
        for _ in range(4):
            run.send_round()
        run.until("the backlog to drain", lambda: run.backlog() == 0, seconds=60)
        run.send_round()
        run.until("the backlog to drain", lambda: run.backlog() == 0, seconds=60)
    finally:
        run.close()
    return run


def read_sessions(ns: Any, expected: dict[str, int]) -> dict[str, list[Any]]:
    """Each session's messages as a session receiver on the primary gets them."""
    got: dict[str, list[Any]] = {}
    with ServiceBusClient.from_connection_string(ns.connection_string) as client:
        for s, n in expected.items():
            out: list[Any] = []
            deadline = time.monotonic() + 15
            with client.get_queue_receiver(
                ENTITY, session_id=s, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
            ) as receiver:
                while len(out) < n and time.monotonic() < deadline:
                    out.extend(receiver.receive_messages(max_message_count=100, max_wait_time=1))
                out.extend(
                    receiver.receive_messages(max_message_count=100, max_wait_time=0.5)
                )  # nothing more
            got[s] = out
    return got


def peek_ids(ns: Any, queues: list[str]) -> set[str]:
    with ServiceBusClient.from_connection_string(ns.connection_string) as client:
        out: set[str] = set()
        for q in queues:
            with client.get_queue_receiver(q) as receiver:
                out |= {str(m.message_id) for m in receiver.peek_messages(max_message_count=1000, timeout=5)}
        return out


@pytest.fixture
def registry_cleared() -> Iterator[None]:
    yield
    process_registry().clear()


@pytest.mark.usefixtures("registry_cleared")
def test_with_ordering_session_every_session_reaches_the_primary_in_order(pair: Any) -> None:
    run = scenario(pair, "session")
    assert [o.total_diverted for o in run.after_recovery] == [
        24,
        24,
    ]  # held: behind their backlog, healthy or not
    total = sum(run.produced.values())
    assert pair.primary.broker.counts(ENTITY).active_message_count == total  # no marker, nothing twice
    got = read_sessions(pair.primary, run.produced)
    for s, n in run.produced.items():
        ids = [str(m.message_id) for m in got[s]]
        assert ids == [f"{s}-{i}" for i in range(n)], f"session {s} out of order or incomplete: {ids}"
        assert not any(RETURN_MARKER.encode() in (m.application_properties or {}) for m in got[s])
    book = process_registry().sessions(namespace_key(run.config.primary))
    assert len(book) == 0  # every session back on the primary (the last round went direct)


@pytest.mark.usefixtures("registry_cleared")
def test_with_ordering_none_new_messages_overtake_the_backlog(pair: Any) -> None:
    run = scenario(pair, "none")
    assert [sum(o.sent.values()) for o in run.after_recovery] == [24, 24]
    got = read_sessions(pair.primary, run.produced)
    out_of_order = []
    for s, n in run.produced.items():
        numbers = [int(str(m.message_id).rsplit("-", 1)[1]) for m in got[s]]
        assert sorted(numbers) == list(range(n))  # nothing lost either way
        if numbers != sorted(numbers):
            out_of_order.append(s)
    assert out_of_order == SESSIONS  # every diverted session was overtaken by the rounds sent after recovery


@pytest.mark.usefixtures("registry_cleared")
def test_a_held_sessions_queue_failing_stops_that_session_only_and_the_retry_keeps_its_order(
    pair: Any,
) -> None:
    """During the outage the backlog queue of some sessions refuses sends: the call fails for those sessions only
    (nothing of them goes to another queue), the other sessions are diverted; the queue comes back, the call is
    sent again as Spark would retry it (the same message ids: the primary's duplicate detection drops what went
    twice), and every session still reaches the primary in order."""
    run = Run(pair, "session", backlog_retry_interval=2.0)
    try:
        run.send_round()
        pair.primary.faults.refuse_connections()
        pair.primary.faults.drop_connections()
        run.send_round()
        broken = pinned_queue(SESSIONS[0], QUEUES, lambda _: True)
        assert broken is not None
        stopped = [s for s in SESSIONS if pinned_queue(s, QUEUES, lambda _: True) == broken]
        pair.secondary.faults.fail_sends(broken, "com.microsoft:entity-disabled")
        batch = run.next_round()
        with pytest.raises(QueueUnavailableError, match="ordering: session") as caught:
            run.sender.send(batch)
        assert caught.value.outcome.diverted_by_entity == {ENTITY: 3 * (len(SESSIONS) - len(stopped))}
        peeked = peek_ids(pair.secondary, QUEUES)
        assert {str(m.message_id) for m in batch if m.session_id not in stopped} <= peeked  # the others went
        assert not {str(m.message_id) for m in batch if m.session_id in stopped} & peeked  # nothing of these
        pair.secondary.faults.clear()
        secondary = namespace_key(run.config.secondary)
        run.until(
            "the queue to return to the rotation",
            lambda: process_registry().rotation.is_available(secondary, broken),
            seconds=10,
        )
        run.sender.send(batch)  # the retry
        pair.primary.faults.accept_connections()
        run.until(
            "the primary to answer a probe", lambda: run.sender.entity_state(ENTITY) is EntityState.HEALTHY
        )
        run.draining.set()
        for _ in range(3):
            run.send_round()
        run.until("the backlog to drain", lambda: run.backlog() == 0, seconds=60)
        run.send_round()
        run.until("the backlog to drain", lambda: run.backlog() == 0, seconds=60)
    finally:
        run.close()
    got = read_sessions(pair.primary, run.produced)
    for s, n in run.produced.items():
        assert [str(m.message_id) for m in got[s]] == [f"{s}-{i}" for i in range(n)], s


@pytest.mark.usefixtures("registry_cleared")
def test_two_threads_sending_the_same_sessions_keep_each_threads_order(pair: Any) -> None:
    """Two paired senders on two threads of one process send the same sessions (each its own numbering) through an
    outage and the recovery while the syphon drains: per session, each thread's messages arrive in its order."""
    config = config_for(pair, "session")
    syphon = Syphon(config, entity_backoff=0.5)
    outage = threading.Event()
    recovered = threading.Event()
    healthy_rounds = {t: threading.Event() for t in ("a", "b")}  # each thread sent 4 rounds before the outage
    outage_rounds = {t: threading.Event() for t in ("a", "b")}  # and 4 during it
    stop = threading.Event()
    produced: dict[str, int] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []
    diverted: list[int] = []

    def sender_thread(tag: str) -> None:
        with PairedSender(config) as sender:
            for r in range(14):
                if r == 4:
                    healthy_rounds[tag].set()
                    outage.wait(30)
                if r == 8:
                    outage_rounds[tag].set()
                    recovered.wait(30)
                batch = [
                    OutboundMessage(body="x", session_id=s, message_id=f"{s}-{tag}-{r * 2 + i}")
                    for s in SESSIONS
                    for i in range(2)
                ]
                try:
                    diverted.append(sender.send(batch).total_diverted)
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)
                    return
                with lock:
                    for s in SESSIONS:
                        produced[f"{s}/{tag}"] = produced.get(f"{s}/{tag}", 0) + 2

    def drain() -> None:
        while not stop.is_set():
            syphon.drain_all(max_wait=0.2)
            stop.wait(0.05)

    threads = [threading.Thread(target=sender_thread, args=(t,)) for t in ("a", "b")]
    drainer = threading.Thread(target=drain, daemon=True)
    try:
        for t in threads:
            t.start()
        drainer.start()
        assert all(e.wait(30) for e in healthy_rounds.values())
        pair.primary.faults.refuse_connections()
        pair.primary.faults.drop_connections()
        outage.set()
        assert all(e.wait(60) for e in outage_rounds.values())
        pair.primary.faults.accept_connections()
        recovered.set()
        for t in threads:
            t.join(120)
        deadline = time.monotonic() + 60
        while backlog_count(pair.secondary, QUEUES):
            assert time.monotonic() < deadline, "the backlog did not drain"
            stop.wait(0.2)  # polling the broker's counts: nothing to await
    finally:
        stop.set()
        drainer.join(30)
        syphon.close()
    assert not errors, errors
    assert sum(diverted) >= 2 * 4 * 2 * len(SESSIONS)  # at least the rounds of the outage went to the backlog
    per_session = {s: sum(n for k, n in produced.items() if k.startswith(f"{s}/")) for s in SESSIONS}
    got = read_sessions(pair.primary, per_session)
    for s in SESSIONS:
        ids = [str(m.message_id) for m in got[s]]
        for tag in ("a", "b"):
            mine = [int(i.rsplit("-", 1)[1]) for i in ids if i.startswith(f"{s}-{tag}-")]
            assert mine == list(range(produced[f"{s}/{tag}"])), (s, tag, mine)
