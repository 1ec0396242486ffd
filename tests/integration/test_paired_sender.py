"""PairedSender against the local namespace pair: real SDK, real TCP, no SDK mocks (SPEC B2-B5, B8, B10, R1).

SDK retries are kept small (retry.total 0-1, backoff 0.1 s) so the tests are fast; the real-time ones use
failover / ping intervals of about a second.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

pytest.importorskip("servicebus_local.fixtures", reason="the local namespace server has not landed yet")

from azure.servicebus import ServiceBusClient  # noqa: E402

from harness.queues import take  # noqa: E402
from servicebus_local.model import QueueSettings  # noqa: E402
from spark_sb.config.namespace import NamespaceConfig, RetryConfig
from spark_sb.config.secret import Secret
from spark_sb.config.service_bus import ServiceBusConfig  # noqa: E402
from spark_sb.core.errors import NoBacklogAvailableError, ServiceBusConfigError, classify  # noqa: E402
from spark_sb.failover.records import EntityState
from spark_sb.failover.registry import FailoverRegistry  # noqa: E402
from spark_sb.message.backlog import (  # noqa: E402
    BACKLOG_ENQUEUED,
    BACKLOG_PATH,
    BACKLOG_SESSION_ID,
    BACKLOG_TTL,
    from_backlog,
    is_probe,
)
from spark_sb.message.outbound import OutboundMessage  # noqa: E402
from spark_sb.sender.paired import PairedSender  # noqa: E402
from spark_sb.wire.sdk_transport import SdkTransport  # noqa: E402
from spark_sb.wire.timing import (
    NAMESPACE_SILENCE,  # noqa: E402
    SDK_SLICE,
)
from spark_sb.wire.transport import PRIMARY, SECONDARY, Target  # noqa: E402

ENTITY = "orders"
COUNT = 3
QUEUES = [f"primary/x-servicebus-transfer/{i}" for i in range(COUNT)]


@pytest.fixture
def pair(namespace_pair: Any) -> Any:
    namespace_pair.primary.broker.create_queue(ENTITY)
    for q in QUEUES:
        namespace_pair.secondary.broker.create_queue(q)
    return namespace_pair


def config_for(pair: Any, **overrides: Any) -> ServiceBusConfig:
    base = ServiceBusConfig(
        primary=NamespaceConfig(
            connection_string=Secret(pair.primary.connection_string), namespace_name="primary"
        ),
        secondary=NamespaceConfig(connection_string=Secret(pair.secondary.connection_string)),
        entity=ENTITY,
        backlog_queue_count=COUNT,
        failover_interval=0.0,
        ping_primary_interval=1.0,
        backlog_retry_interval=60.0,
        send_timeout=3.0,
        retry=RetryConfig(total=0, backoff_factor=0.1, backoff_max=0.5),
    )
    return replace(base, **overrides)


@pytest.fixture
def make_sender(pair: Any) -> Iterator[Callable[..., PairedSender]]:
    senders: list[PairedSender] = []

    def make(**overrides: Any) -> PairedSender:
        registry = overrides.pop("registry", None) or FailoverRegistry()
        sender = PairedSender(config_for(pair, **overrides), registry=registry)
        senders.append(sender)
        return sender

    yield make
    for s in senders:
        s.close()


def receive_all(ns: Any, entity: str, expected: int | None = None) -> list[Any]:
    """Receive-and-delete the messages of ``entity`` in namespace ``ns`` (``expected`` of them, default: as many
    as the broker counts as active now)."""
    if expected is None:
        expected = ns.broker.counts(entity).active_message_count
    return take(ns.connection_string, entity, expected=expected, wait=1, deadline=15)


def ids(received: list[Any]) -> list[str]:
    return [str(m.message_id) for m in received]


def batch_of(n: int, prefix: str = "m", size: int = 200, **kw: Any) -> list[OutboundMessage]:
    return [OutboundMessage(body=b"x" * size, message_id=f"{prefix}-{i}", **kw) for i in range(n)]


def backlog_contents(pair: Any) -> dict[str, list[Any]]:
    return {q: receive_all(pair.secondary, q) for q in QUEUES}


# ---------------------------------------------------------------------------------------------------------
# B2: healthy


def test_healthy_path_every_property_kind_arrives_unchanged(
    pair: Any, make_sender: Callable[..., PairedSender]
) -> None:
    sender = make_sender(failover_interval=60.0)
    when = datetime(2031, 5, 6, 7, 8, 9, 123000, tzinfo=timezone.utc)
    originals = [
        OutboundMessage(
            body=f"body-{i}" if i % 2 else f"bytes-{i}".encode(),
            message_id=f"id-{i}",
            correlation_id=f"corr-{i}",
            content_type="text/plain",
            subject="subj",
            to="someone",
            reply_to="back",
            time_to_live=timedelta(minutes=5),
            properties={"s": "v", "i": i, "f": 1.5, "b": True, "raw": b"\x00\x01", "t": when},
        )
        for i in range(50)
    ]
    out = sender.send(originals)
    assert out.sent == {ENTITY: 50} and out.total_diverted == 0 and out.transitions == ()
    received = receive_all(pair.primary, ENTITY, expected=50)
    assert ids(received) == [m.message_id for m in originals]
    for original, got in zip(originals, received, strict=True):
        back = OutboundMessage.from_received(got, entity=ENTITY)
        props = dict(back.properties)
        assert props.pop("t") in (when, int(when.timestamp() * 1000))
        # the SDK hands string and binary values back alike (bytes): check the binary one on the wire form
        assert got.application_properties[b"raw"] == b"\x00\x01"
        props.pop("raw")
        expected_props = {k: v for k, v in original.properties.items() if k not in ("t", "raw")}
        assert props == expected_props
        body = original.body.encode() if isinstance(original.body, str) else original.body
        assert (back.body.encode() if isinstance(back.body, str) else back.body) == body
        assert replace(back, body=b"", properties={}) == replace(
            original, entity=ENTITY, body=b"", properties={}
        )
    assert all(not any(backlog_contents(pair).values()) for _ in [0])


def test_large_stream_is_packed_in_several_batches(
    pair: Any, make_sender: Callable[..., PairedSender]
) -> None:
    sender = make_sender(failover_interval=60.0)
    out = sender.send(batch_of(3000, size=200))  # ~800 KB: more than one 256 KB batch
    assert out.sent == {ENTITY: 3000}
    assert sorted(ids(receive_all(pair.primary, ENTITY, expected=3000))) == sorted(
        f"m-{i}" for i in range(3000)
    )


# ---------------------------------------------------------------------------------------------------------
# B3: each fault


def _assert_diverted(pair: Any, out: Any, n: int) -> list[Any]:
    assert out.sent == {} and out.diverted_by_entity == {ENTITY: n}
    contents = backlog_contents(pair)
    got = [m for msgs in contents.values() for m in msgs]
    assert sorted(ids(got)) == sorted(f"m-{i}" for i in range(n))
    return got


def test_connection_refused_fails_over(pair: Any, make_sender: Callable[..., PairedSender]) -> None:
    sender = make_sender()
    pair.primary.faults.refuse_connections()
    out = sender.send(batch_of(20))
    _assert_diverted(pair, out, 20)
    assert [t.error_class for t in out.transitions] == ["connection", "connection"]
    assert sender.entity_state(ENTITY) is EntityState.FAILED_OVER


def test_stall_times_out_and_fails_over(pair: Any, make_sender: Callable[..., PairedSender]) -> None:
    sender = make_sender(send_timeout=1.0)
    sender.send(batch_of(1, "warm"))  # open the link first: the stall hits an established connection
    receive_all(pair.primary, ENTITY, expected=1)
    pair.primary.faults.stall(True)
    started = time.monotonic()
    out = sender.send(batch_of(10))
    assert time.monotonic() - started < 15
    _assert_diverted(pair, out, 10)
    assert out.transitions[0].error_class in ("timeout", "connection")


@pytest.mark.parametrize(
    ("condition", "error_class"),
    [
        ("amqp:resource-limit-exceeded", "quota_exceeded"),
        ("com.microsoft:entity-disabled", "entity_disabled"),
    ],
)
def test_entity_faults_fail_over(
    pair: Any, make_sender: Callable[..., PairedSender], condition: str, error_class: str
) -> None:
    sender = make_sender()
    pair.primary.faults.fail_sends(ENTITY, condition)
    out = sender.send(batch_of(10))
    _assert_diverted(pair, out, 10)
    assert out.transitions[0].error_class == error_class


def test_disabled_entity_fails_over(pair: Any, make_sender: Callable[..., PairedSender]) -> None:
    sender = make_sender()
    pair.primary.broker.update_queue(ENTITY, QueueSettings(status="Disabled"))
    out = sender.send(batch_of(5))
    _assert_diverted(pair, out, 5)
    assert out.transitions[0].error_class == "entity_disabled"


def test_entity_not_found_fails_over(pair: Any, make_sender: Callable[..., PairedSender]) -> None:
    """An entity that accepted messages and then answers not-found (deleted during an incident) fails over; one that
    never existed for this sink is a wrong destination (SPEC F9, tests/integration/test_isolation.py)."""
    pair.primary.broker.create_queue("no-such-queue")
    sender = make_sender(entity="no-such-queue")
    assert sender.send(batch_of(1, "before")).total_sent == 1
    pair.primary.broker.delete_queue("no-such-queue")
    out = sender.send(batch_of(5))
    assert out.diverted_by_entity == {"no-such-queue": 5}
    assert out.transitions[0].error_class == "entity_not_found"
    got = [m for msgs in backlog_contents(pair).values() for m in msgs]
    assert {OutboundMessage.from_received(m).properties[BACKLOG_PATH] for m in got} == {"no-such-queue"}


def test_server_busy_never_fails_over(pair: Any, make_sender: Callable[..., PairedSender]) -> None:
    sender = make_sender()  # failover_interval 0: any outage-class error would fail over at once
    pair.primary.faults.fail_sends(ENTITY, "com.microsoft:server-busy", count=2)
    out = sender.send(batch_of(10))
    assert out.sent == {ENTITY: 10} and out.total_diverted == 0 and out.transitions == ()
    assert out.retries == 2
    assert sorted(ids(receive_all(pair.primary, ENTITY, expected=10))) == sorted(f"m-{i}" for i in range(10))
    assert sender.entity_state(ENTITY) is EntityState.HEALTHY


def test_unauthorized_raises_clear_error_and_does_not_fail_over(
    pair: Any, make_sender: Callable[..., PairedSender]
) -> None:
    sender = make_sender()
    pair.primary.faults.fail_sends(ENTITY, "amqp:unauthorized-access")
    with pytest.raises(ServiceBusConfigError) as info:
        sender.send(batch_of(5))
    text = str(info.value)
    assert "unauthorized" in text and "'Send'" in text and ENTITY in text
    assert "SharedAccessKey=" not in text
    assert sender.entity_state(ENTITY) is EntityState.HEALTHY
    assert not any(backlog_contents(pair).values())


# ---------------------------------------------------------------------------------------------------------
# Real time: blip, failover, probe, return


def test_blip_shorter_than_failover_interval_never_reaches_the_backlog(
    pair: Any, make_sender: Callable[..., PairedSender]
) -> None:
    sender = make_sender(failover_interval=5.0)
    pair.primary.faults.refuse_connections()
    healer = threading.Timer(1.0, pair.primary.faults.accept_connections)
    healer.start()
    try:
        out = sender.send(batch_of(20))
    finally:
        healer.cancel()
    assert out.sent == {ENTITY: 20} and out.total_diverted == 0
    assert [(t.from_state, t.to_state) for t in out.transitions] == [
        (EntityState.HEALTHY, EntityState.FAILING),
        (EntityState.FAILING, EntityState.HEALTHY),
    ]
    assert not any(backlog_contents(pair).values())


def test_failover_backlog_probe_and_return(pair: Any, make_sender: Callable[..., PairedSender]) -> None:
    sender = make_sender(failover_interval=1.0, ping_primary_interval=1.0)
    pair.primary.faults.refuse_connections()
    scheduled = datetime.now(timezone.utc) + timedelta(hours=2)
    out = sender.send(
        batch_of(5, session_id="sess-1", time_to_live=timedelta(seconds=90), scheduled_enqueue_time=scheduled)
    )
    assert out.diverted_by_entity == {ENTITY: 5}
    assert out.transitions[-1].to_state is EntityState.FAILED_OVER
    failed_over_at = time.monotonic()

    # the backlog holds the translated messages
    got = [m for msgs in backlog_contents(pair).values() for m in msgs]
    assert sorted(ids(got)) == sorted(f"m-{i}" for i in range(5))
    for m in got:
        assert m.session_id is None and m.scheduled_enqueue_time_utc is None
        back = OutboundMessage.from_received(m)
        assert back.properties[BACKLOG_PATH] == ENTITY
        assert back.properties[BACKLOG_SESSION_ID] == "sess-1"
        assert back.properties[BACKLOG_TTL] == 90_000
        assert BACKLOG_ENQUEUED in back.properties
        restored, _ = from_backlog(back)
        assert restored.entity == ENTITY and restored.session_id == "sess-1"
        assert restored.time_to_live == timedelta(
            seconds=90
        ) and restored.scheduled_enqueue_time == scheduled.replace(
            microsecond=scheduled.microsecond - scheduled.microsecond % 1000
        )

    # primary back: a probe within the ping interval returns the entity to healthy
    pair.primary.faults.accept_connections()
    healed_at = time.monotonic()
    probes = []
    deadline = time.monotonic() + 10
    sent_after = None
    i = 0
    while time.monotonic() < deadline:
        o = sender.send([OutboundMessage(body=b"after", message_id=f"after-{i}")])
        i += 1
        probes.extend(o.probes)
        if o.sent:
            sent_after = time.monotonic()
            break
        time.sleep(0.1)
    assert sent_after is not None, "the entity never returned to the primary"
    assert sent_after - healed_at < 1.0 + 3.0  # ping interval + slack for reconnecting
    assert sent_after - failed_over_at >= 1.0  # not before the first probe was due
    assert probes and probes[-1].ok and probes[-1].cancel_ok
    assert sender.entity_state(ENTITY) is EntityState.HEALTHY
    new = sender.send(batch_of(3, "new"))
    assert new.sent == {ENTITY: 3}

    # schedule-cancel probes leave nothing deliverable on the primary
    primary_msgs = receive_all(pair.primary, ENTITY)
    assert not [m for m in primary_msgs if is_probe(m)]
    assert set(ids(primary_msgs)) == {f"after-{i - 1}", "new-0", "new-1", "new-2"}
    with (
        ServiceBusClient.from_connection_string(pair.primary.connection_string) as client,
        client.get_queue_receiver(ENTITY) as receiver,
    ):
        assert receiver.peek_messages(max_message_count=10) == []
    assert pair.primary.broker.counts(ENTITY).scheduled_message_count == 0


def test_ping_probe_mode(pair: Any, make_sender: Callable[..., PairedSender]) -> None:
    sender = make_sender(probe_mode="ping", ping_primary_interval=0.5)
    pair.primary.faults.refuse_connections()
    sender.send(batch_of(1))
    pair.primary.faults.accept_connections()
    probes, sent, i = [], {}, 0
    deadline = time.monotonic() + 10
    while not sent and time.monotonic() < deadline:  # the probe runs beside the sends: keep sending
        out = sender.send(batch_of(1, f"z{i}"))
        probes.extend(out.probes)
        sent = out.sent
        i += 1
        time.sleep(0.05)
    assert [(p.mode, p.ok) for p in probes] == [("ping", True)]
    assert sent == {ENTITY: 1}
    got = receive_all(pair.primary, ENTITY)
    assert any(is_probe(m) for m in got) or len(got) == 1  # a 1 s TTL ping may already have expired
    assert [m.message_id for m in got if not is_probe(m)] == [f"z{i - 1}-0"]


# ---------------------------------------------------------------------------------------------------------
# B5: rotation


def test_one_backlog_queue_failing_rotates(pair: Any, make_sender: Callable[..., PairedSender]) -> None:
    registry = FailoverRegistry()
    sender = make_sender(registry=registry)
    pair.primary.faults.refuse_connections()
    for q in QUEUES[:2]:
        pair.secondary.faults.fail_sends(q, "com.microsoft:entity-disabled")
    out = sender.send(batch_of(10))
    assert out.total_diverted == 10 and set(out.diverted) == {QUEUES[2]}
    assert {p.queue for p in out.pulls} <= set(QUEUES[:2])
    contents = backlog_contents(pair)
    assert sorted(ids(contents[QUEUES[2]])) == sorted(f"m-{i}" for i in range(10))
    # another sender of the same process avoids the pulled queues at once
    other = make_sender(registry=registry)
    out2 = other.send(batch_of(4, "o"))
    assert set(out2.diverted) == {QUEUES[2]}


def test_all_backlog_queues_failing_raises(pair: Any, make_sender: Callable[..., PairedSender]) -> None:
    sender = make_sender()
    pair.primary.faults.refuse_connections()
    pair.secondary.faults.fail_sends("*", "com.microsoft:entity-disabled")
    with pytest.raises(NoBacklogAvailableError, match="every backlog queue is pulled") as info:
        sender.send(batch_of(5))
    assert info.value.outcome.total_sent == 0 and info.value.outcome.total_diverted == 0
    assert len(info.value.outcome.pulls) == COUNT


# ---------------------------------------------------------------------------------------------------------
# B10: the client pair


def test_closing_or_faulting_one_client_closes_the_pair(pair: Any) -> None:
    config = config_for(pair)
    transport = SdkTransport(config)
    try:
        for target in (Target(PRIMARY, ENTITY), Target(SECONDARY, QUEUES[0])):
            b = transport.new_batch(target)
            assert b.try_add(OutboundMessage(body=b"x", message_id=str(uuid.uuid4())))
            transport.send(b, 5.0)
        assert transport.is_open(PRIMARY) and transport.is_open(SECONDARY)
        transport.close_namespace(PRIMARY)
        assert not transport.is_open(PRIMARY) and not transport.is_open(SECONDARY)
        # rebuilt on next use
        b = transport.new_batch(Target(SECONDARY, QUEUES[0]))
        b.try_add(OutboundMessage(body=b"y"))
        transport.send(b, 5.0)
        assert transport.is_open(SECONDARY) and transport.generation[SECONDARY] == 2
        b = transport.new_batch(Target(PRIMARY, ENTITY))
        b.try_add(OutboundMessage(body=b"z"))
        transport.send(b, 5.0)
        # a connection-class fault on the primary closes the primary's client, not the backlog's: a primary
        # outage is exactly when the backlog is needed (rebuilding it then would delay every failover)
        pair.primary.faults.drop_connections()
        pair.primary.faults.refuse_connections()
        b = transport.new_batch(Target(PRIMARY, ENTITY))
        b.try_add(OutboundMessage(body=b"w"))
        with pytest.raises(Exception):  # noqa: B017 - whatever the SDK raises for a dropped connection
            transport.send(b, 5.0)
        assert not transport.is_open(PRIMARY) and transport.is_open(SECONDARY)
        secondary_generation = transport.generation[SECONDARY]
        b = transport.new_batch(Target(SECONDARY, QUEUES[0]))
        b.try_add(OutboundMessage(body=b"v"))
        transport.send(b, 5.0)
        assert transport.generation[SECONDARY] == secondary_generation  # the same client went on
    finally:
        transport.close()


def test_transport_serves_several_threads_each_namespace_on_its_own_lane(pair: Any) -> None:
    """The sender's thread and its probe thread share one transport: every SDK client is used only by its
    lane's thread, so concurrent calls (same target or not) all go through."""
    transport = SdkTransport(config_for(pair))
    errors: list[BaseException] = []
    sdk_threads: set[str] = set()

    def use(target: Target, n: int) -> None:
        for i in range(n):
            b = transport.new_batch(target)
            b.try_add(
                OutboundMessage(body=b"x", message_id=f"{target.namespace}-{threading.get_ident()}-{i}")
            )
            try:
                transport.send(b, 5.0)
            except BaseException as exc:
                errors.append(exc)
        sdk_threads.update(t.name for t in threading.enumerate() if t.name.startswith("spark-sb-"))

    threads = [
        threading.Thread(target=use, args=(Target(PRIMARY, ENTITY), 5)),
        threading.Thread(target=use, args=(Target(PRIMARY, ENTITY), 5)),
        threading.Thread(target=use, args=(Target(SECONDARY, QUEUES[0]), 5)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    transport.close()
    assert errors == []
    assert len(receive_all(pair.primary, ENTITY, expected=10)) == 10
    assert len(receive_all(pair.secondary, QUEUES[0], expected=5)) == 5
    # one lane (thread and connection) per namespace, whatever the entities (SPEC F2)
    assert {"spark-sb-primary-1", "spark-sb-secondary-1"} <= sdk_threads


def test_an_idle_sender_probes_on_its_own_and_the_next_send_goes_to_the_primary(
    pair: Any, make_sender: Callable[..., PairedSender]
) -> None:
    """Probes run on a helper thread every ping interval, sends or no sends (a Spark sink sends one
    micro-batch now and then): after the primary heals, the next batch goes to the primary."""
    sender = make_sender(failover_interval=0.0, ping_primary_interval=1.0)
    pair.primary.faults.refuse_connections()
    assert sender.send(batch_of(3)).diverted_by_entity == {ENTITY: 3}
    pair.primary.faults.accept_connections()
    deadline = time.monotonic() + 10
    while sender.entity_state(ENTITY) is not EntityState.HEALTHY and time.monotonic() < deadline:
        time.sleep(0.05)  # nothing is sent meanwhile: only the sender's own probe can heal the entity
    assert sender.entity_state(ENTITY) is EntityState.HEALTHY
    out = sender.send(batch_of(2, "next"))
    assert out.sent == {ENTITY: 2} and out.total_diverted == 0
    assert [(p.ok, p.cancel_ok) for p in out.probes] == [(True, True)]  # reported with the next send
    assert [(t.from_state, t.to_state) for t in out.transitions] == [
        (EntityState.FAILED_OVER, EntityState.HEALTHY)
    ]


def test_a_stalled_backlog_queue_is_pulled_within_send_timeout(
    pair: Any, make_sender: Callable[..., PairedSender]
) -> None:
    """B5 within a bound: a backlog queue that never answers is pulled after send_timeout (3 s here) and the same
    messages go to another queue; nothing waits for it any longer."""
    registry = FailoverRegistry()
    pair.primary.faults.refuse_connections()
    first = make_sender(registry=registry)
    (chosen,) = first.send(batch_of(1, "learn")).diverted  # failed over; the queue this sender sticks to
    pair.secondary.faults.stall_entity(chosen, True)
    started = time.monotonic()
    out = first.send(batch_of(10))
    took = time.monotonic() - started
    # The last attempt's SDK timeout ends up to three read slices before its deadline (sdk_timeout: the stall
    # costs the link, not the shared connection): the queue is pulled at send_timeout less that, at the earliest.
    assert 3.0 - 3 * SDK_SLICE <= took < 3.0 + 3.0
    assert [p.queue for p in out.pulls] == [chosen]
    assert out.total_diverted == 10 and chosen not in out.diverted
    pair.secondary.faults.stall_entity(chosen, False)


def test_a_link_counts_as_connected_once_it_answered_and_until_its_client_is_replaced(pair: Any) -> None:
    """What lets a stall on a live link fail over after interval + grace (no allowance for a new connection)."""
    transport = SdkTransport(config_for(pair))
    target = Target(PRIMARY, ENTITY)
    try:
        assert not transport.connected(target)  # no client yet
        batch = transport.new_batch(target)
        assert batch.try_add(OutboundMessage(body=b"x", message_id="connected-1"))
        transport.send(batch, 5.0)
        assert transport.connected(target) and not transport.connected(Target(SECONDARY, QUEUES[0]))
        transport.fault(target)  # a fault reported on a connection still open: the link stays
        assert transport.connected(target)
        transport.close_namespace(PRIMARY)  # the connection is replaced: the next send connects anew
        assert not transport.connected(target)
    finally:
        transport.close()
    assert len(receive_all(pair.primary, ENTITY, expected=1)) == 1


def test_sends_on_an_open_link_run_on_the_callers_thread_and_a_stall_there_keeps_the_deadline(
    pair: Any,
) -> None:
    """The hot path: once a link answered, batches are sent on the caller's thread (Lane.direct); a namespace
    that then stops answering still costs the send no more than its deadline, and the stuck client is replaced."""
    transport = SdkTransport(config_for(pair))
    target = Target(PRIMARY, ENTITY)

    def send(message_id: str, timeout: float) -> None:
        batch = transport.new_batch(target)
        assert batch.try_add(OutboundMessage(body=b"x", message_id=message_id))
        transport.send(batch, timeout)

    try:
        send("direct-1", 5.0)  # connects: on the lane's thread
        assert transport.direct_sends == 0
        send("direct-2", 5.0)
        send("direct-3", 5.0)
        assert transport.direct_sends == 2
        built = transport.generation[PRIMARY]
        pair.primary.faults.stall(True)
        started = time.monotonic()
        with pytest.raises(Exception) as info:
            # longer than NAMESPACE_SILENCE: a connection silent that long is the namespace's (a shorter silence
            # could be one entity's stall on a live connection, which keeps its connection: SPEC F7)
            send("stalled", NAMESPACE_SILENCE + 1.0)
        assert time.monotonic() - started < NAMESPACE_SILENCE + 2.0, "the direct send outlived its deadline"
        assert transport.direct_sends == 3
        assert classify(info.value).fail_over
        assert not transport.connected(target)  # the stuck client is dropped: the next send connects anew
        pair.primary.faults.stall(False)
        send("direct-4", 10.0)
        # two connections: the fresh one the stalled send tried when its own was found dead (a ping not answered,
        # SPEC L1; the stalled namespace did not open it either), and the one after the stall
        assert transport.generation[PRIMARY] == built + 2
    finally:
        pair.primary.faults.stall(False)
        transport.close()
    got = set(ids(receive_all(pair.primary, ENTITY)))  # "stalled" too, if the service kept it
    assert {"direct-1", "direct-2", "direct-3", "direct-4"} <= got


def test_failed_over_batches_are_sent_on_the_callers_thread_once_the_backlog_link_answered(
    pair: Any, make_sender: Callable[..., PairedSender]
) -> None:
    """The failed-over hot path: after the backlog link's first answer its batches do not change threads."""
    sender = make_sender(backlog_queue_count=1, max_message_size=4096)
    pair.primary.faults.refuse_connections()
    out = sender.send(batch_of(60, size=200))  # several backlog batches of 4 KB
    assert out.total_diverted == 60
    transport = sender.transport
    assert isinstance(transport, SdkTransport)
    assert out.diverted == {QUEUES[0]: 60}
    assert transport.direct_sends >= 3, "backlog batches after the first went through the lane's thread"
    _assert_diverted(pair, out, 60)
