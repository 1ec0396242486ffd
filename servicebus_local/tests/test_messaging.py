"""The unmodified azure-servicebus SDK against the local namespace over real TCP: messaging (SPEC E1, E2)."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from azure.servicebus import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusMessageBatch,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import (
    MessageLockLostError,
    MessageSizeExceededError,
    ServiceBusAuthenticationError,
    ServiceBusError,
    ServiceBusQuotaExceededError,
)

from servicebus_local.model import QueueSettings
from servicebus_local.server import LocalNamespace

from .conftest import wait_for


def receive_all(receiver: Any, expected: int, timeout: float = 5.0) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(out) < expected and time.monotonic() < deadline:
        out += receiver.receive_messages(max_message_count=expected - len(out), max_wait_time=1)
    return out


def test_queue_send_receive_complete(ns: LocalNamespace, client: ServiceBusClient) -> None:
    with client.get_queue_sender("q") as sender:
        sender.send_messages(ServiceBusMessage("hello"))
    with client.get_queue_receiver("q", max_wait_time=2) as receiver:
        (msg,) = receive_all(receiver, 1)
        assert str(msg) == "hello"
        assert isinstance(msg.lock_token, uuid.UUID)
        assert msg.locked_until_utc is not None and msg.locked_until_utc > datetime.now(timezone.utc)
        assert msg.sequence_number == 1
        assert msg.delivery_count == 0
        receiver.complete_message(msg)
    assert ns.broker.get_queue("q").runtime.active_message_count == 0


def test_cbs_with_key_accepts_right_key_and_rejects_wrong_key() -> None:
    with LocalNamespace("secure", queues=["q"], key="s3cret-key").start() as ns:
        with ServiceBusClient.from_connection_string(ns.connection_string) as c, c.get_queue_sender("q") as s:
            s.send_messages(ServiceBusMessage("ok"))
        assert ns.broker.get_queue("q").runtime.active_message_count == 1
        wrong = ns.connection_string.replace("s3cret-key", "wrong-key")
        assert "wrong-key" in wrong
        with (
            ServiceBusClient.from_connection_string(wrong, retry_total=0) as c,
            pytest.raises(ServiceBusAuthenticationError),
            c.get_queue_sender("q") as s,
        ):
            s.send_messages(ServiceBusMessage("no"))
        assert ns.broker.get_queue("q").runtime.active_message_count == 1


def test_topic_fans_out_to_each_subscription(client: ServiceBusClient) -> None:
    with client.get_topic_sender("t") as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(3)])
    for sub in ("a", "b"):
        with client.get_subscription_receiver("t", sub) as receiver:
            msgs = receive_all(receiver, 3)
            assert sorted(str(m) for m in msgs) == ["m0", "m1", "m2"]
            for m in msgs:
                receiver.complete_message(m)


def test_batched_sends_list_and_batch_object(ns: LocalNamespace, client: ServiceBusClient) -> None:
    with client.get_queue_sender("q") as sender:
        sender.send_messages([ServiceBusMessage(f"list-{i}") for i in range(500)])
        batch: ServiceBusMessageBatch = sender.create_message_batch()
        assert batch.max_size_in_bytes == 256 * 1024
        i = 0
        while True:
            try:
                batch.add_message(ServiceBusMessage(b"x" * 200, message_id=f"b-{i}"))
            except ValueError:
                break
            i += 1
        assert i > 500
        sender.send_messages(batch)
    assert ns.broker.get_queue("q").runtime.active_message_count == 500 + i
    with client.get_queue_receiver("q", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
        got = receive_all(receiver, 500 + i, timeout=20)
    assert [str(m) for m in got[:500]] == [f"list-{k}" for k in range(500)]
    assert [m.message_id for m in got[500:]] == [f"b-{k}" for k in range(i)]
    assert [m.sequence_number for m in got] == list(range(1, 501 + i))


def test_receive_and_delete(ns: LocalNamespace, client: ServiceBusClient) -> None:
    with client.get_queue_sender("q") as sender:
        sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
    with client.get_queue_receiver("q", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
        msgs = receive_all(receiver, 2)
        assert [str(m) for m in msgs] == ["a", "b"]
        assert msgs[0].lock_token is None
    assert ns.broker.get_queue("q").runtime.active_message_count == 0


def test_a_large_credit_is_streamed_a_chunk_at_a_time(
    ns: LocalNamespace, client: ServiceBusClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service streams a receive's deliveries, so the client decodes the first while the rest are still on
    their way. The namespace takes them from the entity and writes them to the socket 50 at a time: a 500-message
    receive was taken, locked and written whole, then decoded while the namespace waited (20,000 messages in
    receives of 500: 2.3-2.5 s, streamed 1.7 s)."""
    from servicebus_local import server

    steps: list[int] = []  # deliveries handed to proton (>0), and a write to the socket (0)
    send, flush = server._AmqpConnection.send_deliveries, server._AmqpConnection.flush

    def sending(self: Any, st: Any, items: list[Any]) -> None:
        steps.append(len(items))
        send(self, st, items)

    def flushing(self: Any) -> Any:
        if steps and steps[-1] != 0:
            steps.append(0)
        return flush(self)

    with client.get_queue_sender("q") as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(300)])
    monkeypatch.setattr(server._AmqpConnection, "send_deliveries", sending)
    monkeypatch.setattr(server._AmqpConnection, "flush", flushing)
    with client.get_queue_receiver("q", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
        msgs = receive_all(receiver, 300)
    assert [str(m) for m in msgs] == [f"m{i}" for i in range(300)]
    chunks = [n for n in steps if n]
    assert sum(chunks) == 300 and max(chunks) <= server._DELIVERY_CHUNK
    # each chunk is written before the next is taken: a write between any two
    assert all(a == 0 or b == 0 for a, b in zip(steps, steps[1:], strict=False)), steps


def test_lock_expiry_redelivers_with_delivery_count_plus_one(
    ns: LocalNamespace, client: ServiceBusClient
) -> None:
    ns.broker.create_queue("short", QueueSettings(lock_duration=timedelta(seconds=1)))
    with client.get_queue_sender("short") as sender:
        sender.send_messages(ServiceBusMessage("x"))
    with client.get_queue_receiver("short") as receiver:
        (first,) = receive_all(receiver, 1)
        assert first.delivery_count == 0
        lock_span = (first.locked_until_utc - datetime.now(timezone.utc)).total_seconds()
        assert 0 < lock_span <= 1.1
        time.sleep(1.2)
        (second,) = receive_all(receiver, 1)
        assert second.sequence_number == first.sequence_number
        assert second.delivery_count == 1
        assert second.lock_token != first.lock_token
        with pytest.raises(MessageLockLostError):
            receiver.complete_message(first)
        receiver.complete_message(second)


def test_abandon_and_max_delivery_count_dead_letters(ns: LocalNamespace, client: ServiceBusClient) -> None:
    ns.broker.create_queue("md", QueueSettings(max_delivery_count=2))
    with client.get_queue_sender("md") as sender:
        sender.send_messages(ServiceBusMessage("poison"))
    with client.get_queue_receiver("md") as receiver:
        for expected in (0, 1):
            (m,) = receive_all(receiver, 1)
            assert m.delivery_count == expected
            receiver.abandon_message(m)
        assert receiver.receive_messages(max_message_count=1, max_wait_time=0.5) == []
    with client.get_queue_receiver("md", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        (d,) = receive_all(dlq, 1)
        assert str(d) == "poison"
        assert d.dead_letter_reason == "MaxDeliveryCountExceeded"
        assert d.dead_letter_error_description is not None
        dlq.complete_message(d)


def test_dead_letter_with_reason_and_description(client: ServiceBusClient) -> None:
    with client.get_queue_sender("q") as sender:
        sender.send_messages(ServiceBusMessage("bad", application_properties={"k": "v"}))
    with client.get_queue_receiver("q") as receiver:
        (m,) = receive_all(receiver, 1)
        receiver.dead_letter_message(m, reason="Invalid", error_description="cannot parse")
    with client.get_queue_receiver("q", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        (d,) = receive_all(dlq, 1)
        assert (d.dead_letter_reason, d.dead_letter_error_description) == ("Invalid", "cannot parse")
        assert d.application_properties[b"k"] == b"v"
        dlq.complete_message(d)


def test_abandoned_message_comes_back(client: ServiceBusClient) -> None:
    with client.get_queue_sender("q") as sender:
        sender.send_messages(ServiceBusMessage("again"))
    with client.get_queue_receiver("q") as receiver:
        (m,) = receive_all(receiver, 1)
        receiver.abandon_message(m)
        (m2,) = receive_all(receiver, 1)
        assert (str(m2), m2.delivery_count) == ("again", 1)
        receiver.complete_message(m2)


def test_message_ttl_and_entity_default_ttl_dead_letter_on_expiration(
    ns: LocalNamespace, client: ServiceBusClient
) -> None:
    ns.broker.create_queue(
        "ttl",
        QueueSettings(
            dead_lettering_on_message_expiration=True, default_message_time_to_live=timedelta(seconds=2)
        ),
    )
    with client.get_queue_sender("ttl") as sender:
        sender.send_messages(
            [
                ServiceBusMessage("own-ttl", time_to_live=timedelta(seconds=1)),
                ServiceBusMessage("entity-default"),
                ServiceBusMessage("longer-than-default", time_to_live=timedelta(hours=1)),
            ]
        )
    wait_for(lambda: ns.broker.get_queue("ttl").runtime.dead_letter_message_count == 3, timeout=6)
    with client.get_queue_receiver("ttl", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        got = receive_all(dlq, 3)
    assert sorted(str(m) for m in got) == ["entity-default", "longer-than-default", "own-ttl"]
    assert {m.dead_letter_reason for m in got} == {"TTLExpiredException"}


def test_scheduled_message_invisible_until_due_and_cancel(
    ns: LocalNamespace, client: ServiceBusClient
) -> None:
    now = datetime.now(timezone.utc)
    with client.get_queue_sender("q") as sender:
        (seq,) = sender.schedule_messages(ServiceBusMessage("later"), now + timedelta(seconds=4))
        (cancelled,) = sender.schedule_messages(ServiceBusMessage("never"), now + timedelta(seconds=1))
        assert ns.broker.get_queue("q").runtime.scheduled_message_count == 2
        sender.cancel_scheduled_messages(cancelled)
    assert ns.broker.get_queue("q").runtime.scheduled_message_count == 1
    with client.get_queue_receiver("q") as receiver:
        assert receiver.receive_messages(max_message_count=1, max_wait_time=0.5) == []
        (m,) = receive_all(receiver, 1, timeout=5)
        assert (str(m), m.sequence_number) == ("later", seq)
        assert m.scheduled_enqueue_time_utc is not None
        receiver.complete_message(m)
        assert receiver.receive_messages(max_message_count=1, max_wait_time=1) == []


def test_renew_lock(ns: LocalNamespace, client: ServiceBusClient) -> None:
    ns.broker.create_queue("renew", QueueSettings(lock_duration=timedelta(seconds=2)))
    with client.get_queue_sender("renew") as sender:
        sender.send_messages(ServiceBusMessage("x"))
    with client.get_queue_receiver("renew") as receiver:
        (m,) = receive_all(receiver, 1)
        before = m.locked_until_utc
        time.sleep(1.2)
        after = receiver.renew_message_lock(m)
        assert after > before
        time.sleep(1.2)  # beyond the first lock, within the renewed one
        receiver.complete_message(m)
    assert ns.broker.get_queue("renew").runtime.active_message_count == 0


def test_peek_does_not_lock(client: ServiceBusClient) -> None:
    with client.get_queue_sender("q") as sender:
        sender.send_messages([ServiceBusMessage(f"p{i}") for i in range(4)])
    with client.get_queue_receiver("q") as receiver:
        peeked = receiver.peek_messages(max_message_count=10)
        assert [str(m) for m in peeked] == ["p0", "p1", "p2", "p3"]
        assert [m.sequence_number for m in peeked] == [1, 2, 3, 4]
        assert receiver.peek_messages(max_message_count=2, sequence_number=3)[0].sequence_number == 3
        assert len(receive_all(receiver, 4)) == 4


def test_defer_and_receive_deferred_by_sequence_number(client: ServiceBusClient) -> None:
    with client.get_queue_sender("q") as sender:
        sender.send_messages([ServiceBusMessage("deferred"), ServiceBusMessage("normal")])
    with client.get_queue_receiver("q") as receiver:
        first, second = receive_all(receiver, 2)
        receiver.defer_message(first)
        receiver.complete_message(second)
        assert receiver.receive_messages(max_message_count=1, max_wait_time=0.5) == []
        (d,) = receiver.receive_deferred_messages([first.sequence_number])
        assert str(d) == "deferred"
        assert d.lock_token is not None
        receiver.complete_message(d)
        with pytest.raises(ServiceBusError):
            receiver.receive_deferred_messages([first.sequence_number])


def test_duplicate_detection(ns: LocalNamespace, client: ServiceBusClient) -> None:
    ns.broker.create_queue("dedupe", QueueSettings(requires_duplicate_detection=True))
    with client.get_queue_sender("dedupe") as sender:
        sender.send_messages([ServiceBusMessage("1", message_id="a"), ServiceBusMessage("2", message_id="b")])
        sender.send_messages(ServiceBusMessage("1 again", message_id="a"))
        sender.send_messages(
            [ServiceBusMessage("3", message_id="c"), ServiceBusMessage("2 again", message_id="b")]
        )
    with client.get_queue_receiver("dedupe", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as r:
        got = receive_all(r, 4, timeout=2)
    assert [str(m) for m in got] == ["1", "2", "3"]


def test_quota_exceeded_raises_the_sdk_quota_error(ns: LocalNamespace, client: ServiceBusClient) -> None:
    ns.broker.create_queue("small", QueueSettings(max_size_in_megabytes=1))
    with client.get_queue_sender("small") as sender:
        for _ in range(4):
            sender.send_messages(ServiceBusMessage(b"x" * 250_000))
        with pytest.raises(ServiceBusQuotaExceededError):
            sender.send_messages(ServiceBusMessage(b"x" * 250_000))


def test_message_size_exceeded(ns: LocalNamespace, client: ServiceBusClient) -> None:
    with client.get_queue_sender("q") as sender, pytest.raises(MessageSizeExceededError):
        sender.send_messages(ServiceBusMessage(b"x" * 300_000))
    # the broker enforces the entity limit too (a premium-style link limit larger than the entity's)
    ns.faults.fail_sends("q", "amqp:link:message-size-exceeded", "too big", count=1)
    with client.get_queue_sender("q") as sender, pytest.raises(MessageSizeExceededError):
        sender.send_messages(ServiceBusMessage(b"x"))


def test_scheduled_enqueue_time_round_trips_on_send(client: ServiceBusClient) -> None:
    when = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(seconds=3)
    with client.get_queue_sender("q") as sender:
        sender.send_messages(ServiceBusMessage("s", scheduled_enqueue_time_utc=when))
    with client.get_queue_receiver("q") as receiver:
        assert receiver.receive_messages(max_message_count=1, max_wait_time=0.3) == []
        (m,) = receive_all(receiver, 1, timeout=6)
        assert m.scheduled_enqueue_time_utc == when
        receiver.complete_message(m)


def test_two_namespaces_at_once() -> None:
    with LocalNamespace("one", queues=["q"]) as one, LocalNamespace("two", queues=["q"]) as two:
        assert one.port != two.port
        for ns, text in ((one, "to-one"), (two, "to-two")):
            with (
                ServiceBusClient.from_connection_string(ns.connection_string) as c,
                c.get_queue_sender("q") as s,
            ):
                s.send_messages(ServiceBusMessage(text))
        for ns, text in ((one, "to-one"), (two, "to-two")):
            with (
                ServiceBusClient.from_connection_string(ns.connection_string) as c,
                c.get_queue_receiver("q", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as r,
            ):
                assert [str(m) for m in receive_all(r, 1)] == [text]


def test_entity_not_found(client: ServiceBusClient) -> None:
    from azure.servicebus.exceptions import MessagingEntityNotFoundError

    with pytest.raises(MessagingEntityNotFoundError), client.get_queue_sender("missing") as s:
        s.send_messages(ServiceBusMessage("x"))


def test_backlog_queue_names_with_slashes(ns: LocalNamespace, client: ServiceBusClient) -> None:
    ns.broker.create_queue("contoso/x-servicebus-transfer/3")
    with client.get_queue_sender("contoso/x-servicebus-transfer/3") as s:
        s.send_messages(ServiceBusMessage("backlog"))
    with client.get_queue_receiver("Contoso/X-ServiceBus-Transfer/3") as r:
        (m,) = receive_all(r, 1)
        assert str(m) == "backlog"
        r.complete_message(m)
    assert ns.broker.get_queue("contoso/x-servicebus-transfer/3").runtime.active_message_count == 0
