"""The source's SDK transport (:mod:`spark_sb.source.sdk`) against a local namespace: the unmodified SDK over real
TCP, every call of the driver's :class:`SdkEntityLink` and the executors' :class:`SdkPeeker` (SOURCE.md §4, R13,
R30). The namespace's clock is a fake one where locks must run out: its locks end when the test says."""

from __future__ import annotations

import contextlib
import pickle
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.amqp import AmqpAnnotatedMessage
from azure.servicebus.exceptions import OperationTimeoutError

from servicebus_local.clock import FakeClock
from servicebus_local.model import QueueSettings
from servicebus_local.server import LocalNamespace
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.message.outbound import OutboundMessage
from spark_sb.source.light import LightMessage
from spark_sb.source.sdk import PeekerFactory, SdkEntityLink, close_peekers, size_of
from spark_sb.source.transport import ACTIVE, DEFERRED, NotFound, Received
from spark_sb.wire.lane import DeadlineExceeded

QUEUE = "orders"
SHORT = "short-locks"  # lock duration 1 s on the namespace's fake clock
T = 5.0  # each call's deadline


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ns(clock: FakeClock) -> Iterator[LocalNamespace]:
    namespace = LocalNamespace("primary", queues=[QUEUE], topics={"events": ["audit"]}, clock=clock).start()
    try:
        namespace.broker.create_queue(SHORT, QueueSettings(lock_duration=timedelta(seconds=1)))
        yield namespace
    finally:
        namespace.stop()


def _config(ns: LocalNamespace) -> ServiceBusConfig:
    return ServiceBusConfig.from_dict({"primary": {"connection_string": ns.connection_string}})


@pytest.fixture
def link(ns: LocalNamespace) -> Iterator[SdkEntityLink]:
    made: list[SdkEntityLink] = []

    def make(path: str = QUEUE) -> SdkEntityLink:
        one = SdkEntityLink(_config(ns), path, admin_kwargs={"connection_verify": ns.ca_file})
        made.append(one)
        return one

    yield make(QUEUE)
    for one in made:
        one.close()


def _put(ns: LocalNamespace, entity: str, n: int, prefix: str = "m") -> None:
    with (
        ServiceBusClient.from_connection_string(ns.connection_string) as client,
        client.get_queue_sender(entity) if "/" not in entity else client.get_topic_sender(entity) as s,
    ):
        s.send_messages(
            [OutboundMessage(body=f"{prefix}{i}", message_id=f"{prefix}{i}").to_sdk() for i in range(n)]
        )


def _receive(link: SdkEntityLink, n: int) -> list[Received]:
    got: list[Received] = []
    while len(got) < n:
        batch = link.receive(n - len(got), 1.0, T)
        assert batch, f"received {len(got)} of {n}"
        got += batch
    return got


def _states(link: SdkEntityLink) -> dict[int, int]:
    return {p.seq: p.state for p in link.peek(1, 100, T)}


def test_received_messages_are_deferred_in_one_range_peeked_as_deferred_and_deleted_by_number(
    ns: LocalNamespace, link: SdkEntityLink
) -> None:
    _put(ns, QUEUE, 5)
    held = _receive(link, 5)
    seqs = [h.seq for h in held]
    assert len(set(seqs)) == 5 and all(h.delivery_count == 0 and h.size > 64 for h in held)
    assert link.lock_duration == 60.0  # the entity's, read once from the admin endpoint
    info = link.info(T)
    assert (info.lock_duration, info.requires_session, info.max_delivery_count) == (60.0, False, 10)
    before = ns.counters()["settlements"]
    amqp_link = held[0].handle.message._receiver._handler._link
    frames: list[tuple[int, int | None]] = []
    send = amqp_link._outgoing_disposition

    def spy(first: int, last: int | None, *args: Any) -> Any:
        frames.append((first, last))
        return send(first, last, *args)

    amqp_link._outgoing_disposition = spy
    assert link.defer(held, T) == set(seqs)
    ids = sorted(h.handle.message._delivery_id for h in held)
    assert frames == [(ids[0], ids[-1])]  # one disposition frame for the range, first..last
    assert ns.counters()["settlements"] - before == 5  # the namespace applied each delivery of the range
    assert _states(link) == dict.fromkeys(seqs, DEFERRED)
    assert [p.message.delivery_count for p in link.peek(1, 100, T)] == [0] * 5  # a defer keeps the count
    counts = link.counts(T)
    # deferred messages count as active, as on the service (ServiceBusExplorer#662): CountDetails cannot tell them
    assert (counts.active, counts.total, counts.dead_letter) == (5, 5, 0) and counts.created_at.endswith("Z")
    assert link.receive(5, 0.2, T) == []  # deferred messages are invisible to receive
    link.delete(seqs, T)
    assert link.peek(1, 100, T) == [] and link.counts(T).total == 0


def test_a_delete_naming_one_number_not_deferred_raises_not_found_and_deletes_nothing(
    ns: LocalNamespace, link: SdkEntityLink
) -> None:
    _put(ns, QUEUE, 3)
    held = _receive(link, 3)
    deferred = link.defer(held[:2], T)
    assert deferred == {held[0].seq, held[1].seq}
    with pytest.raises(NotFound):
        link.delete([held[0].seq, held[1].seq, held[2].seq], T)  # the third is locked, not deferred
    with pytest.raises(NotFound):
        link.delete([held[0].seq, 10_000], T)  # no such number
    assert _states(link) == {held[0].seq: DEFERRED, held[1].seq: DEFERRED, held[2].seq: ACTIVE}
    link.delete(sorted(deferred), T)  # one request, no retry: both gone
    assert list(_states(link)) == [held[2].seq]


def test_a_range_defer_with_one_lost_lock_defers_the_others_and_leaves_it_out(
    ns: LocalNamespace, clock: FakeClock, link: SdkEntityLink
) -> None:
    short = SdkEntityLink(_config(ns), SHORT, lock_duration=1.0)
    try:
        _put(ns, SHORT, 1, "early")
        first = _receive(short, 1)
        clock.advance(0.6)
        _put(ns, SHORT, 4, "late")
        rest = _receive(short, 4)
        clock.advance(0.6)  # the first lock ran out (1.2 s), the others hold (0.6 s)
        held = first + rest
        assert short.defer(held, T) == {r.seq for r in rest}
        states = {p.seq: p.state for p in short.peek(1, 10, T)}
        assert states == {first[0].seq: ACTIVE, **dict.fromkeys((r.seq for r in rest), DEFERRED)}
    finally:
        short.close()


def test_renew_keeps_locks_past_their_first_expiry_and_isolates_a_lost_one(
    ns: LocalNamespace, clock: FakeClock
) -> None:
    short = SdkEntityLink(_config(ns), SHORT, lock_duration=1.0)
    try:
        _put(ns, SHORT, 1, "early")
        lost = _receive(short, 1)
        clock.advance(0.6)
        _put(ns, SHORT, 3, "late")
        held = _receive(short, 3)
        clock.advance(0.6)  # the first lock ran out (1.2 s); the others end at 1.6 s
        renewed = short.renew(lost + held, T)
        assert set(renewed) == {h.seq for h in held}  # the lost one is isolated (bisected), the rest renewed
        assert all(renewed[h.seq] > h.locked_until for h in held)
        clock.advance(0.8)  # 2.0 s: past the first locks' end, within the renewed ones (2.2 s)
        assert short.defer(held, T) == {h.seq for h in held}
        assert ns.counters()["management:renew-lock"] >= 3  # one request, then its halves
    finally:
        short.close()


def test_complete_on_the_link_removes_the_messages(ns: LocalNamespace, link: SdkEntityLink) -> None:
    _put(ns, QUEUE, 4)
    held = _receive(link, 4)
    assert link.complete(held, T) == {h.seq for h in held}
    assert link.peek(1, 10, T) == []


def test_the_planner_reads_each_message_as_the_sdks_message_says_without_building_it(
    ns: LocalNamespace, clock: FakeClock
) -> None:
    """:mod:`spark_sb.source.light`: sequence number, size, delivery count, lock token and lock end of a received
    message equal what the SDK's own message says (built here on demand), for each body kind and a redelivery."""
    short = SdkEntityLink(_config(ns), SHORT, lock_duration=1.0)
    try:
        with (
            ServiceBusClient.from_connection_string(ns.connection_string) as client,
            client.get_queue_sender(SHORT) as sender,
        ):
            sender.send_messages(
                [
                    ServiceBusMessage(b"x" * 300, application_properties={"k": "vv", "n": 7, b"b": b"zz"}),
                    AmqpAnnotatedMessage(value_body="a value body"),
                    AmqpAnnotatedMessage(sequence_body=[[1, 2, 3]]),
                    AmqpAnnotatedMessage(data_body=[b"one", b"three"]),
                ]
            )
        first = _receive(short, 4)
        clock.advance(1.2)  # the locks ran out: delivered again, counted
        again = _receive(short, 4)
        sizes = []
        for h in first + again:
            m = h.handle.message
            assert isinstance(m, LightMessage)
            sdk = m.sdk()
            assert (h.seq, h.size, h.delivery_count) == (
                sdk.sequence_number,
                size_of(sdk),
                sdk.delivery_count,
            )
            assert (m.lock_token, m.locked_until_utc) == (sdk.lock_token, sdk.locked_until_utc)
            sizes.append(h.size)
        assert [h.delivery_count for h in first + again] == [0] * 4 + [1] * 4
        assert sizes[:4] == [300 + (1 + 2) + (1 + 8) + (1 + 2) + 64, 12 + 64, 64, 8 + 64]
        assert short.complete(again, T) == {h.seq for h in again}
        assert short.peek(1, 10, T) == []
    finally:
        short.close()


def test_the_sdks_message_built_on_demand_settles_one_by_one() -> None:
    """The settle fallback for an SDK whose link lacks range dispositions: the SDK's own ``complete_message`` (on
    the system clock: the SDK checks the lock's end against it)."""
    with LocalNamespace("wall", queues=[QUEUE]) as wall:
        one = SdkEntityLink(_config(wall), QUEUE)
        try:
            _put(wall, QUEUE, 2)
            held = _receive(one, 2)
            m = held[0].handle.message
            m._receiver.complete_message(m.sdk())
            assert [p.seq for p in one.peek(1, 10, T)] == [held[1].seq]
        finally:
            one.close()


def test_a_subscription_is_read_by_its_path(ns: LocalNamespace, link: SdkEntityLink) -> None:
    sub = SdkEntityLink(
        _config(ns), "events/subscriptions/audit", admin_kwargs={"connection_verify": ns.ca_file}
    )
    try:
        _put(ns, "events/", 2)
        held = _receive(sub, 2)
        assert sub.defer(held, T) == {h.seq for h in held}
        assert {p.state for p in sub.peek(1, 10, T)} == {DEFERRED}
        assert sub.counts(T).total == 2
        sub.delete([h.seq for h in held], T)
        assert sub.peek(1, 10, T) == []
    finally:
        sub.close()


def test_a_stalled_namespace_ends_each_call_within_its_deadline_and_the_next_connection_serves(
    ns: LocalNamespace, link: SdkEntityLink
) -> None:
    _put(ns, QUEUE, 2)
    held = _receive(link, 2)
    ns.faults.stall()
    started = time.monotonic()
    with pytest.raises((DeadlineExceeded, OperationTimeoutError)):  # the SDK's own timeout, or the lane's
        link.peek(1, 10, 1.0)
    assert time.monotonic() - started < 1.5
    started = time.monotonic()
    with contextlib.suppress(
        DeadlineExceeded, OperationTimeoutError
    ):  # a timeout, or nothing this trigger (R30)
        assert link.receive(10, 0.5, 1.0) == []
    assert time.monotonic() - started < 1.5
    assert link.defer(held, 1.0) == set()  # an abandoned connection's messages: nothing deferred, no raise
    ns.faults.stall(False)
    assert {p.seq for p in link.peek(1, 10, T)} == {h.seq for h in held}


def test_executors_peek_every_entity_on_one_cached_connection_per_namespace(
    ns: LocalNamespace, link: SdkEntityLink
) -> None:
    _put(ns, QUEUE, 3)
    _put(ns, SHORT, 2)
    link.defer(_receive(link, 3), T)
    factory = pickle.loads(pickle.dumps(PeekerFactory(_config(ns))))
    try:
        before = ns.counters()["connections_opened"]
        peeker = factory()
        assert factory() is peeker  # the process's cache
        got = peeker.peek(QUEUE, 1, 10, T)
        assert [p.state for p in got] == [DEFERRED] * 3
        assert [p.seq for p in peeker.peek(QUEUE, got[1].seq, 10, T)] == [got[1].seq, got[2].seq]
        assert [p.state for p in peeker.peek(SHORT, 1, 10, T)] == [ACTIVE] * 2
        assert ns.counters()["connections_opened"] - before == 1
        assert link.receive(10, 0.2, T) == []  # peeks lock nothing (the peeker's links never receive)
        assert len(_receive(SdkEntityLink(_config(ns), SHORT, lock_duration=1.0), 2)) == 2
    finally:
        close_peekers()


def test_credit_left_by_a_receive_is_taken_back_so_nothing_is_delivered_between_receives(
    ns: LocalNamespace, link: SdkEntityLink
) -> None:
    assert link.receive(10, 0.2, T) == []  # asked for 10, got none
    _put(ns, QUEUE, 3)
    assert ns.counters()["messages_delivered"] == 0  # no credit out: nothing locked, nothing released
    assert len(link.receive(2, 1.0, T)) == 2
    assert ns.counters()["messages_delivered"] == 2
    assert [p.state for p in link.peek(1, 10, T)] == [ACTIVE] * 3  # the third waits, unlocked
    assert ns.counters()["messages_delivered"] == 2 and ns.counters()["settlements"] == 0


def test_the_lock_keeper_renews_from_its_thread_while_the_planner_receives(ns: LocalNamespace) -> None:
    short = SdkEntityLink(_config(ns), SHORT, lock_duration=1.0)
    try:
        _put(ns, SHORT, 2)
        held = _receive(short, 2)
        renewed: list[dict[int, float]] = []
        waiting = threading.Thread(target=lambda: renewed.append(short.renew(held, T)))
        empty = threading.Thread(target=lambda: short.receive(10, 0.5, T))  # waits on the same lane
        empty.start()
        waiting.start()
        empty.join(T)
        waiting.join(T)
        assert renewed and set(renewed[0]) == {h.seq for h in held}
        assert short.defer(held, T) == {h.seq for h in held}
    finally:
        short.close()


def test_an_executors_peek_on_a_stalled_namespace_ends_within_its_deadline_and_then_recovers(
    ns: LocalNamespace,
) -> None:
    _put(ns, QUEUE, 2)
    peeker = PeekerFactory(_config(ns))()
    try:
        assert len(peeker.peek(QUEUE, 1, 10, T)) == 2
        ns.faults.stall()
        started = time.monotonic()
        with pytest.raises((DeadlineExceeded, OperationTimeoutError)):
            peeker.peek(QUEUE, 1, 10, 1.0)
        assert time.monotonic() - started < 1.5
        ns.faults.stall(False)
        assert len(peeker.peek(QUEUE, 1, 10, T)) == 2
    finally:
        close_peekers()


def test_a_link_opened_on_a_stalled_namespace_gives_up_at_its_deadline(ns: LocalNamespace) -> None:
    link = SdkEntityLink(_config(ns), QUEUE, lock_duration=60.0)
    try:
        ns.faults.stall()  # SASL is answered, the AMQP open never is
        started = time.monotonic()
        with pytest.raises(TimeoutError):  # the opening's own deadline, or the lane's (DeadlineExceeded)
            link.receive(10, 0.5, 1.0)
        assert time.monotonic() - started < 1.5
        ns.faults.stall(False)
        assert link.receive(10, 0.2, T) == []  # a new connection serves
    finally:
        link.close()
