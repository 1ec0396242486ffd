"""Unit tests of the in-memory broker (no sockets): locks, TTL, scheduling, dedupe, limits, sessions.

Time is a FakeClock, so every expiry is exact and instant.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from servicebus_local import amqp
from servicebus_local.amqp import Timestamp, decode_value, encode_message, iter_sections
from servicebus_local.broker import (
    ENTITY_DISABLED,
    MESSAGE_LOCK_LOST,
    MESSAGE_NOT_FOUND,
    MESSAGE_SIZE_EXCEEDED,
    NOT_ALLOWED,
    NOT_FOUND,
    QUOTA_EXCEEDED,
    SESSION_CANNOT_BE_LOCKED,
    Broker,
    BrokerError,
    Outcome,
)
from servicebus_local.clock import FakeClock
from servicebus_local.model import EntityExists, EntityNotFound, QueueSettings, SubscriptionSettings


def sections(payload: bytes) -> dict[int, Any]:
    return amqp.message_sections(payload)


def ann(payload: bytes) -> dict[str, Any]:
    return sections(payload).get(amqp.MESSAGE_ANNOTATIONS, {})


def app(payload: bytes) -> dict[str, Any]:
    return sections(payload).get(amqp.APPLICATION_PROPERTIES, {})


def header(payload: bytes) -> list[Any]:
    return sections(payload)[amqp.HEADER]


def msg(body: str = "x", **kw: Any) -> bytes:
    return encode_message(body=body, **kw)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def broker(clock: FakeClock) -> Broker:
    b = Broker("ns", clock=clock)
    b.create_queue("q", QueueSettings(lock_duration=timedelta(seconds=30), max_delivery_count=3))
    return b


def test_send_receive_sequence_numbers_and_annotations(broker: Broker, clock: FakeClock) -> None:
    assert broker.send("q", [msg("a", message_id="1"), msg("b", message_id="2")]) == [1, 2]
    got = broker.receive("amqps://127.0.0.1:5671/q", 10)
    assert [d.message.seq for d in got] == [1, 2]
    a = ann(got[0].payload)
    assert a["x-opt-sequence-number"] == 1
    assert a["x-opt-enqueued-time"] == Timestamp.from_datetime(clock.now())
    assert a["x-opt-locked-until"] == Timestamp.from_datetime(clock.now()) + 30_000
    assert header(got[0].payload)[4] == 0
    assert sections(got[0].payload)[amqp.DATA] == b"a"
    assert broker.receive("q", 10) == []  # locked


def test_paths_are_case_insensitive_and_may_contain_slashes(broker: Broker) -> None:
    broker.create_queue("contoso/x-servicebus-transfer/3")
    broker.send("amqps://h:1/Contoso/X-ServiceBus-Transfer/3", [msg()])
    assert broker.resolve("CONTOSO/x-servicebus-transfer/3/$management").management
    assert len(broker.receive("contoso/x-servicebus-transfer/3", 5)) == 1
    with pytest.raises(BrokerError) as err:
        broker.send("nope", [msg()])
    assert err.value.condition == NOT_FOUND


def test_complete_removes(broker: Broker) -> None:
    broker.send("q", [msg()])
    d = broker.receive("q", 1)[0]
    assert d.lock_token is not None
    broker.settle("q", d.lock_token, Outcome.COMPLETE)
    assert broker.get_queue("q").runtime.active_message_count == 0
    with pytest.raises(BrokerError) as err:
        broker.settle("q", d.lock_token, Outcome.COMPLETE)
    assert err.value.condition == MESSAGE_LOCK_LOST


def test_abandon_redelivers_with_count_and_max_delivery_dead_letters(broker: Broker) -> None:
    broker.send("q", [msg()])
    for expected_count in range(3):
        d = broker.receive("q", 1)[0]
        assert header(d.payload)[4] == expected_count
        assert d.lock_token is not None
        broker.settle("q", d.lock_token, Outcome.ABANDON)
    assert broker.receive("q", 1) == []
    dl = broker.receive("q/$deadletterqueue", 1)
    assert len(dl) == 1
    props = app(dl[0].payload)
    assert props["DeadLetterReason"] == "MaxDeliveryCountExceeded"
    assert "3 delivery attempts" in props["DeadLetterErrorDescription"]


def test_release_does_not_count(broker: Broker) -> None:
    broker.send("q", [msg()])
    for _ in range(5):
        d = broker.receive("q", 1)[0]
        assert d.lock_token is not None
        broker.settle("q", d.lock_token, Outcome.RELEASE)
    assert header(broker.receive("q", 1)[0].payload)[4] == 0


def test_lock_expiry_redelivers_and_renew_extends(broker: Broker, clock: FakeClock) -> None:
    broker.send("q", [msg()])
    d = broker.receive("q", 1)[0]
    assert d.lock_token is not None
    clock.advance(20)
    (until,) = broker.renew_lock("q", [d.lock_token])
    assert until == broker.now_ms() + 30_000
    clock.advance(20)  # 40 s after receive, 20 s after renew: still locked
    assert broker.receive("q", 1) == []
    clock.advance(10.001)
    again = broker.receive("q", 1)
    assert len(again) == 1 and header(again[0].payload)[4] == 1
    with pytest.raises(BrokerError) as err:
        broker.settle("q", d.lock_token, Outcome.COMPLETE)
    assert err.value.condition == MESSAGE_LOCK_LOST
    with pytest.raises(BrokerError):
        broker.renew_lock("q", [d.lock_token])


def test_dead_letter_with_reason(broker: Broker) -> None:
    broker.send("q", [msg(application_properties={"k": 1})])
    d = broker.receive("q", 1)[0]
    assert d.lock_token is not None
    broker.settle("q", d.lock_token, Outcome.DEAD_LETTER, reason="bad", description="really bad")
    dl = broker.receive("Q/$DeadLetterQueue", 1, peek_lock=False)[0]
    assert app(dl.payload) == {"k": 1, "DeadLetterReason": "bad", "DeadLetterErrorDescription": "really bad"}
    assert ann(dl.payload)["x-opt-sequence-number"] == 1
    counts = broker.get_queue("q").runtime
    assert (counts.active_message_count, counts.dead_letter_message_count) == (0, 0)


def test_ttl_expiry_dead_letters_or_drops(clock: FakeClock) -> None:
    b = Broker("ns", clock=clock)
    b.create_queue("dl", QueueSettings(dead_lettering_on_message_expiration=True))
    b.create_queue("drop", QueueSettings(default_message_time_to_live=timedelta(seconds=5)))
    b.send("dl", [msg("own", ttl_ms=2000), msg("keep")])
    b.send("drop", [msg("default"), msg("own-longer", ttl_ms=60_000)])
    clock.advance(2.5)
    assert b.get_queue("dl").runtime.dead_letter_message_count == 1
    dl = b.receive("dl/$deadletterqueue", 5, peek_lock=False)
    assert [sections(d.payload)[amqp.DATA] for d in dl] == [b"own"]
    assert app(dl[0].payload)["DeadLetterReason"] == "TTLExpiredException"
    clock.advance(3)
    # entity default (5 s) is smaller than the message's own 60 s: both expire and are dropped
    assert b.receive("drop", 5) == []
    assert b.get_queue("drop").runtime.dead_letter_message_count == 0
    got = b.receive("dl", 5)
    assert [sections(d.payload)[amqp.DATA] for d in got] == [b"keep"]


def test_effective_ttl_is_on_the_wire(clock: FakeClock) -> None:
    b = Broker("ns", clock=clock)
    b.create_queue("q", QueueSettings(default_message_time_to_live=timedelta(seconds=10)))
    b.send("q", [msg("a", ttl_ms=60_000), msg("b", ttl_ms=3_000), msg("c")])
    assert [header(d.payload)[2] for d in b.receive("q", 3)] == [10_000, 3_000, 10_000]


def test_locked_message_expires_when_its_lock_ends(clock: FakeClock) -> None:
    b = Broker("ns", clock=clock)
    b.create_queue("q", QueueSettings(dead_lettering_on_message_expiration=True))
    b.send("q", [msg(ttl_ms=1000)])
    d = b.receive("q", 1)[0]
    clock.advance(5)
    assert d.lock_token is not None
    b.settle("q", d.lock_token, Outcome.ABANDON)
    assert b.get_queue("q").runtime.dead_letter_message_count == 1


def test_scheduled_message_invisible_until_due_and_cancel(broker: Broker, clock: FakeClock) -> None:
    due = Timestamp.from_datetime(clock.now()) + 10_000
    seqs = broker.schedule("q", [msg("later", annotations={"x-opt-scheduled-enqueue-time": Timestamp(due)})])
    seqs2 = broker.schedule(
        "q", [msg("cancelled", annotations={"x-opt-scheduled-enqueue-time": Timestamp(due)})]
    )
    assert seqs == [1] and seqs2 == [2]
    assert broker.get_queue("q").runtime.scheduled_message_count == 2
    peeked = broker.peek("q", 1, 10)
    assert [ann(p)["x-opt-message-state"] for p in peeked] == [2, 2]
    broker.cancel_scheduled("q", seqs2)
    with pytest.raises(BrokerError) as err:
        broker.cancel_scheduled("q", seqs2)
    assert err.value.condition == MESSAGE_NOT_FOUND
    assert broker.receive("q", 5) == []
    clock.advance(9.9)
    assert broker.receive("q", 5) == []
    clock.advance(0.2)
    got = broker.receive("q", 5)
    assert [sections(d.payload)[amqp.DATA] for d in got] == [b"later"]
    assert ann(got[0].payload)["x-opt-enqueued-time"] == due


def test_send_with_scheduled_time_in_the_future_is_scheduled(broker: Broker, clock: FakeClock) -> None:
    due = Timestamp.from_datetime(clock.now()) + 5_000
    broker.send("q", [msg(annotations={"x-opt-scheduled-enqueue-time": Timestamp(due)})])
    assert broker.receive("q", 1) == []
    clock.advance(5)
    assert len(broker.receive("q", 1)) == 1


def test_duplicate_detection_window(clock: FakeClock) -> None:
    b = Broker("ns", clock=clock)
    b.create_queue(
        "q",
        QueueSettings(
            requires_duplicate_detection=True, duplicate_detection_history_time_window=timedelta(minutes=1)
        ),
    )
    assert b.send("q", [msg(message_id="a"), msg(message_id="b")]) == [1, 2]
    assert b.send("q", [msg(message_id="a")]) == []
    clock.advance(30)
    assert b.send("q", [msg(message_id="b"), msg(message_id="c")]) == [3]
    clock.advance(31)
    assert b.send("q", [msg(message_id="a")]) == [4]  # "a" left the window
    assert b.get_queue("q").runtime.active_message_count == 4


def test_quota_exceeded_and_message_size(clock: FakeClock) -> None:
    b = Broker("ns", clock=clock)
    b.create_queue("q", QueueSettings(max_size_in_megabytes=1, max_message_size_in_kilobytes=256))
    big = msg("x" * 200_000)
    for _ in range(5):
        b.send("q", [big])
    with pytest.raises(BrokerError) as err:
        b.send("q", [big])
    assert err.value.condition == QUOTA_EXCEEDED
    with pytest.raises(BrokerError) as err:
        b.send("q", [msg("y" * 300_000)])
    assert err.value.condition == MESSAGE_SIZE_EXCEEDED
    assert b.get_queue("q").runtime.active_message_count == 5


def test_batch_is_atomic(clock: FakeClock) -> None:
    b = Broker("ns", clock=clock)
    b.create_queue("q")  # Standard: 256 KB messages
    with pytest.raises(BrokerError):
        b.send("q", [msg("ok"), msg("z" * 300_000)])
    assert b.get_queue("q").runtime.active_message_count == 0


def test_disabled_entity(broker: Broker) -> None:
    s = broker.get_queue("q").settings
    s.status = "SendDisabled"
    broker.update_queue("q", s)
    with pytest.raises(BrokerError) as err:
        broker.send("q", [msg()])
    assert err.value.condition == ENTITY_DISABLED
    broker.receive("q", 1)  # receiving still allowed
    s.status = "Disabled"
    broker.update_queue("q", s)
    with pytest.raises(BrokerError) as err:
        broker.receive("q", 1)
    assert err.value.condition == ENTITY_DISABLED


def test_topic_fan_out_each_subscription_own_copy(clock: FakeClock) -> None:
    b = Broker("ns", clock=clock)
    b.ensure_topic("t", ["s1", "s2"])
    assert b.send("t", [msg("hello")]) == [1]
    d1 = b.receive("t/Subscriptions/s1", 5)
    d2 = b.receive("amqps://h/T/subscriptions/S2", 5)
    assert len(d1) == len(d2) == 1
    assert d1[0].lock_token is not None
    b.settle("t/Subscriptions/s1", d1[0].lock_token, Outcome.COMPLETE)
    assert b.get_subscription("t", "s1").runtime.active_message_count == 0
    assert b.get_subscription("t", "s2").runtime.active_message_count == 1
    with pytest.raises(BrokerError):
        b.receive("t", 1)


def test_locked_count_is_the_messages_held_under_a_lock_until_it_lapses(
    broker: Broker, clock: FakeClock
) -> None:
    broker.send("q", [msg(str(i)) for i in range(4)])
    got = broker.receive("q", 3)
    assert broker.locked_count("q") == 3
    assert got[0].lock_token is not None and got[1].lock_token is not None
    broker.settle("q", got[0].lock_token, Outcome.DEFER)
    broker.settle("q", got[1].lock_token, Outcome.COMPLETE)
    assert broker.locked_count("q") == 1
    clock.advance(31)  # the lock (30 s) lapses: the message is active again
    assert broker.locked_count("q") == 0


def test_defer_and_receive_by_sequence_number(broker: Broker) -> None:
    broker.send("q", [msg("a"), msg("b")])
    d = broker.receive("q", 1)[0]
    assert d.lock_token is not None
    broker.settle("q", d.lock_token, Outcome.DEFER)
    assert [x.message.seq for x in broker.receive("q", 5)] == [2]
    assert ann(broker.peek("q", 1, 1)[0])["x-opt-message-state"] == 1
    got = broker.receive_deferred("q", [1])
    assert len(got) == 1 and got[0].lock_token is not None
    broker.settle("q", got[0].lock_token, Outcome.ABANDON)  # stays deferred
    got = broker.receive_deferred("q", [1])
    assert got[0].lock_token is not None
    broker.settle("q", got[0].lock_token, Outcome.COMPLETE)
    with pytest.raises(BrokerError) as err:
        broker.receive_deferred("q", [1])
    assert err.value.condition == MESSAGE_NOT_FOUND


def test_peek_does_not_lock(broker: Broker) -> None:
    broker.send("q", [msg(str(i)) for i in range(5)])
    assert [ann(p)["x-opt-sequence-number"] for p in broker.peek("q", 2, 2)] == [2, 3]
    assert len(broker.receive("q", 10)) == 5


def test_peek_walks_in_sequence_order_from_its_number(broker: Broker, clock: FakeClock) -> None:
    """Peek is indexed by sequence number: a scheduled message that comes due later takes its place among the
    older ones, removed messages are skipped, and a page starts at its number."""
    broker.send("q", [msg(str(i)) for i in range(5)])  # 1..5
    due = Timestamp.from_datetime(clock.now()) + 10_000
    assert broker.schedule(
        "q", [msg("later", annotations={"x-opt-scheduled-enqueue-time": Timestamp(due)})]
    ) == [6]
    broker.send("q", [msg(str(i)) for i in range(3)])  # 7..9
    taken = broker.receive("q", 3, peek_lock=False)  # 1..3 gone
    assert [d.message.seq for d in taken] == [1, 2, 3]

    def seqs(frm: int, n: int) -> list[tuple[int, int]]:
        return [
            (ann(p)["x-opt-sequence-number"], ann(p)["x-opt-message-state"]) for p in broker.peek("q", frm, n)
        ]

    assert seqs(1, 10) == [(4, 0), (5, 0), (6, 2), (7, 0), (8, 0), (9, 0)]
    clock.advance(11)  # 6 comes due: now an active message, after 7..9 were stored
    assert seqs(5, 3) == [(5, 0), (6, 0), (7, 0)]
    assert seqs(6, 10) == [(6, 0), (7, 0), (8, 0), (9, 0)]
    assert seqs(10, 10) == []


def test_peek_index_stays_bounded_by_the_messages_held(broker: Broker) -> None:
    broker.send("q", [msg(str(i)) for i in range(3_000)])
    for _ in range(29):
        broker.receive("q", 100, peek_lock=False)
    store = broker._queues["q"].store  # noqa: SLF001 - the index's size is what is asserted
    assert len(store.msgs) == 100
    assert len(store.order) <= max(1024, 2 * len(store.msgs)) + len(store.msgs)
    assert [ann(p)["x-opt-sequence-number"] for p in broker.peek("q", 1, 3)] == [2901, 2902, 2903]


def test_sessions(clock: FakeClock) -> None:
    b = Broker("ns", clock=clock)
    b.create_queue("sq", QueueSettings(requires_session=True, lock_duration=timedelta(seconds=10)))
    with pytest.raises(BrokerError) as err:
        b.send("sq", [msg()])
    assert err.value.condition == NOT_ALLOWED
    with pytest.raises(BrokerError):
        b.check_receiver("sq", session=False)
    b.send("sq", [msg("a1", session_id="a"), msg("b1", session_id="b"), msg("a2", session_id="a")])
    owner1, owner2 = object(), object()
    assert b.accept_session("sq", None, owner1) == ("a", b.now_ms() + 10_000)
    assert b.accept_session("sq", None, owner2) is not None  # "b"
    assert b.accept_session("sq", None, object()) is None
    with pytest.raises(BrokerError) as err:
        b.accept_session("sq", "a", owner2)
    assert err.value.condition == SESSION_CANNOT_BE_LOCKED
    got = b.receive("sq", 5, session_id="a", owner=owner1)
    assert [sections(d.payload)[amqp.DATA] for d in got] == [b"a1", b"a2"]
    b.set_session_state("sq", "a", b"state")
    assert b.session_state("sq", "a") == b"state"
    clock.advance(5)
    b.renew_session_lock("sq", "a")
    clock.advance(8)  # past the first lock, within the renewed one
    token = got[0].lock_token
    assert token is not None
    b.settle("sq", token, Outcome.COMPLETE)
    clock.advance(3)  # session lock expired: a2 goes back with delivery count 1
    assert b.accept_session("sq", "a", owner2) is not None
    again = b.receive("sq", 5, session_id="a", owner=owner2)
    assert [sections(d.payload)[amqp.DATA] for d in again] == [b"a2"]
    assert header(again[0].payload)[4] == 1
    assert b.list_sessions("sq") == ["a", "b"]


def test_admin_store(broker: Broker) -> None:
    with pytest.raises(EntityExists):
        broker.create_queue("Q")
    broker.create_topic("t")
    broker.create_subscription("t", "s", SubscriptionSettings(max_delivery_count=2))
    assert [q.name for q in broker.list_queues()] == ["q"]
    assert broker.get_subscription("T", "S").settings.max_delivery_count == 2
    assert broker.get_topic("t").runtime.subscription_count == 1
    broker.delete_subscription("t", "s")
    with pytest.raises(EntityNotFound):
        broker.get_subscription("t", "s")
    broker.delete_queue("q")
    with pytest.raises(EntityNotFound):
        broker.get_queue("q")


def test_every_property_is_kept_byte_for_byte(broker: Broker) -> None:
    raw = encode_message(
        body="body",
        message_id="mid",
        correlation_id="cid",
        to="to",
        subject="subj",
        reply_to="rt",
        reply_to_session_id="rts",
        content_type="application/json",
        ttl_ms=123456,
        application_properties={"s": "v", "i": 5, "f": 1.5, "b": True, "n": None, "bin": b"\x00\x01"},
        annotations={"x-opt-partition-key": "pk"},
    )
    broker.send("q", [raw])
    out = broker.receive("q", 1)[0].payload
    original = {code: raw[s:e] for code, s, _v, e in iter_sections(raw) if code not in (amqp.HEADER, 0x72)}
    delivered = {code: out[s:e] for code, s, _v, e in iter_sections(out) if code not in (amqp.HEADER, 0x72)}
    assert original == delivered
    assert ann(out)["x-opt-partition-key"] == "pk"
    assert header(out)[2] == 123456


def test_frame_sniffer_tracks_formats() -> None:
    sniffer = amqp.FrameSniffer()
    attach = b"\x00\x53\x12" + amqp.encode_value(["link-a", amqp.UInt(0), False])
    transfer_batch = b"\x00\x53\x14" + amqp.encode_value(
        [amqp.UInt(0), amqp.UInt(0), b"tag", amqp.UInt(amqp.BATCH_FORMAT), False, True]
    )
    transfer_more = b"\x00\x53\x14" + amqp.encode_value(
        [amqp.UInt(0), amqp.UInt(0), b"tag", amqp.UInt(amqp.BATCH_FORMAT), False, False]
    )
    transfer_single = b"\x00\x53\x14" + amqp.encode_value([amqp.UInt(0), amqp.UInt(1), b"t2", amqp.UInt(0)])

    def frame(body: bytes, payload: bytes = b"") -> bytes:
        size = 8 + len(body) + len(payload)
        return size.to_bytes(4, "big") + b"\x02\x00\x00\x00" + body + payload

    stream = (
        b"AMQP\x00\x01\x00\x00" + frame(attach) + frame(transfer_batch, b"p1") + frame(transfer_more, b"p2")
    )
    stream += frame(transfer_single, b"p3")
    # fed in awkward pieces
    for i in range(0, len(stream), 7):
        sniffer.feed(stream[i : i + 7])
    assert sniffer.pop_format("link-a") == amqp.BATCH_FORMAT
    assert sniffer.pop_format("link-a") == 0
    assert sniffer.pop_format("link-a") == 0  # empty


def test_decode_roundtrip_of_arrays_and_described() -> None:
    import uuid

    values = amqp.Array([uuid.uuid4(), uuid.uuid4()], element="uuid")
    decoded, _ = decode_value(amqp.encode_value({"lock-tokens": values}))
    assert decoded["lock-tokens"] == list(values)
    longs, _ = decode_value(amqp.encode_value(amqp.Array([1, 2**40], element="long")))
    assert longs == [1, 2**40]


def _ready_entries(b: Broker, name: str) -> tuple[int, int]:
    """(entries in the queue's ready heaps, session keys): what a queue that nobody drains keeps in memory."""
    store = b._queues.find(name).store
    return sum(len(h) for h in store.ready.values()), len(store.ready)


@pytest.mark.parametrize("sessions", [False, True])
def test_a_queue_nobody_drains_keeps_no_trace_of_its_expired_messages(
    clock: FakeClock, sessions: bool
) -> None:
    # A producer-only queue whose messages expire (the benches' primary, a backlog nobody syphons): before the
    # bound, every message sent left its sequence number in the ready heap for ever (memory and the collector's
    # pauses grew with hours of running). Now what is kept is bounded by the messages held, not the messages sent.
    b = Broker("ns", clock=clock)
    b.create_queue(
        "q", QueueSettings(default_message_time_to_live=timedelta(seconds=1), requires_session=sessions)
    )
    rounds, per_round = 40, 500
    for r in range(rounds):
        b.send(
            "q",
            [msg(f"{r}-{i}", session_id=f"s{r}-{i % 50}" if sessions else None) for i in range(per_round)],
        )
        clock.advance(2)
        b.tick()
    entries, keys = _ready_entries(b, "q")
    assert b.get_queue("q").runtime.active_message_count == 0
    assert entries <= 1024 + per_round, (
        f"{entries} ready entries kept after {rounds * per_round} messages expired"
    )
    assert keys <= entries
    # the queue still works: what is sent now is received, oldest first (per session: that session's)
    b.send(
        "q",
        [
            msg("late-1", session_id="z" if sessions else None),
            msg("late-2", session_id="z" if sessions else None),
        ],
    )
    if sessions:
        owner = object()
        accepted = b.accept_session("q", None, owner)
        assert accepted is not None and accepted[0] == "z"
        got = b.receive("q", 5, session_id="z", owner=owner)
    else:
        got = b.receive("q", 5)
    assert [sections(d.payload)[amqp.DATA] for d in got] == [b"late-1", b"late-2"]
