"""Auto-forwarding (SPEC E9), with the unmodified SDK over real TCP: ``forward_to`` from a queue or a subscription
to a queue or a topic, the 4-hop limit, ``forward_dead_lettered_messages_to``, what the service refuses at create
and update, and the receivers it refuses. The README's forwarding table cites the service for each behaviour."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.exceptions import ServiceBusError

from servicebus_local.forwarding import HOP_DESCRIPTION, HOP_REASON, RECEIVER_REFUSED
from servicebus_local.model import InvalidSettings, QueueSettings, SubscriptionSettings
from servicebus_local.server import LocalNamespace
from servicebus_local.topology import TopologyError

from .conftest import run_cli

DLQ = ServiceBusSubQueue.DEAD_LETTER


@pytest.fixture
def fns() -> Iterator[LocalNamespace]:
    with LocalNamespace("forwarding") as ns:
        yield ns


@pytest.fixture
def client(fns: LocalNamespace) -> Iterator[ServiceBusClient]:
    with ServiceBusClient.from_connection_string(fns.connection_string, retry_total=0) as c:
        yield c


def _queue(ns: LocalNamespace, name: str, **settings: Any) -> None:
    ns.broker.create_queue(name, QueueSettings(**settings))


def _send(client: ServiceBusClient, queue: str, *messages: ServiceBusMessage) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(list(messages))


def _take(receiver: Any, n: int, timeout: float = 5.0) -> list[Any]:
    """Receive (peek-lock) up to ``n`` messages within ``timeout``, completing each."""
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        got = receiver.receive_messages(max_message_count=n - len(out), max_wait_time=0.5)
        for m in got:
            receiver.complete_message(m)
        out += got
    return out


def _take_queue(client: ServiceBusClient, queue: str, n: int, timeout: float = 5.0, **kw: Any) -> list[Any]:
    with client.get_queue_receiver(queue, **kw) as receiver:
        return _take(receiver, n, timeout)


def _active(ns: LocalNamespace, address: str) -> int:
    return ns.broker.counts(address).active_message_count


# ------------------------------------------------------------------------------------------------ what goes on


def test_a_queue_forwards_to_a_queue_keeping_the_message_id_and_every_property(
    fns: LocalNamespace, client: ServiceBusClient
) -> None:
    _queue(fns, "dst")
    _queue(fns, "src", forward_to="dst")
    _send(client, "dst", ServiceBusMessage("direct"))  # dst's sequence number 1
    sent = ServiceBusMessage(
        b'{"n": 1}',
        message_id="order-7",
        subject="order",
        correlation_id="batch-3",
        content_type="application/json",
        to="billing",
        reply_to="replies",
        time_to_live=timedelta(minutes=5),
        application_properties={"region": "eu", "amount": 42},
    )
    _send(client, "src", ServiceBusMessage("first"), sent)  # src's sequence numbers 1 and 2

    got = _take_queue(client, "dst", 3)
    assert [str(m) for m in got] == ["direct", "first", '{"n": 1}']
    m = got[2]
    assert m.message_id == "order-7"
    assert (m.subject, m.correlation_id, m.content_type) == ("order", "batch-3", "application/json")
    assert (m.to, m.reply_to) == ("billing", "replies")
    assert m.time_to_live == timedelta(minutes=5)
    assert m.application_properties == {b"region": b"eu", b"amount": 42}
    assert m.sequence_number == 3  # a message of the destination
    assert m.enqueued_sequence_number == 2  # the number it had where it was sent
    assert m.delivery_count == 0
    assert _active(fns, "src") == 0 and _active(fns, "dst") == 0


def test_a_forwarded_message_keeps_its_session_id_for_a_session_queue(
    fns: LocalNamespace, client: ServiceBusClient
) -> None:
    _queue(fns, "sessions", requires_session=True)
    _queue(fns, "src", forward_to="sessions")
    _send(client, "src", ServiceBusMessage("s1", session_id="S1", message_id="m-s1"))
    with client.get_queue_receiver("sessions", session_id="S1") as receiver:
        (m,) = _take(receiver, 1)
    assert (m.session_id, m.message_id, str(m)) == ("S1", "m-s1", "s1")


def test_a_queue_forwards_to_a_topic_and_each_subscription_gets_a_copy(
    fns: LocalNamespace, client: ServiceBusClient
) -> None:
    fns.broker.ensure_topic("events", ["audit", "billing"])
    _queue(fns, "inbox", forward_to="events")
    _send(client, "inbox", ServiceBusMessage("e1", message_id="e-1"))
    for sub in ("audit", "billing"):
        with client.get_subscription_receiver("events", sub) as receiver:
            (m,) = _take(receiver, 1)
        assert (m.message_id, str(m)) == ("e-1", "e1")
    assert _active(fns, "inbox") == 0


def test_a_subscription_forwards_to_a_queue(fns: LocalNamespace, client: ServiceBusClient) -> None:
    _queue(fns, "alice")
    fns.broker.create_topic("orders")
    fns.broker.create_subscription("orders", "to-alice", SubscriptionSettings(forward_to="alice"))
    fns.broker.create_subscription("orders", "kept")
    with client.get_topic_sender("orders") as sender:
        sender.send_messages(ServiceBusMessage("o1", message_id="o-1", application_properties={"k": "v"}))
    (m,) = _take_queue(client, "alice", 1)
    assert (m.message_id, m.application_properties) == ("o-1", {b"k": b"v"})
    assert _active(fns, "orders/Subscriptions/to-alice") == 0
    assert _active(fns, "orders/Subscriptions/kept") == 1


def test_a_chain_of_four_hops_delivers_and_a_fifth_hop_dead_letters(
    fns: LocalNamespace, client: ServiceBusClient
) -> None:
    # h0 -> h1 -> h2 -> h3 -> h4: four forwards, the message arrives in h4.
    _queue(fns, "h4")
    for i in (3, 2, 1, 0):
        _queue(fns, f"h{i}", forward_to=f"h{i + 1}")
    _send(client, "h0", ServiceBusMessage("four", message_id="m4"))
    (m,) = _take_queue(client, "h4", 1)
    assert (m.message_id, m.enqueued_sequence_number) == ("m4", 1)

    # k0 -> ... -> k4 -> k5: k4 would make the fifth forward; it dead-letters the message instead.
    _queue(fns, "k5")
    for i in (4, 3, 2, 1, 0):
        _queue(fns, f"k{i}", forward_to=f"k{i + 1}")
    _send(client, "k0", ServiceBusMessage("five", message_id="m5"))
    assert [fns.broker.counts(f"k{i}").dead_letter_message_count for i in range(6)] == [0, 0, 0, 0, 1, 0]
    assert _active(fns, "k5") == 0
    (dead,) = _take_queue(client, "k4", 1, sub_queue=DLQ)
    assert (dead.message_id, str(dead)) == ("m5", "five")
    assert dead.dead_letter_reason == HOP_REASON == "MaxTransferHopCountExceeded"
    assert dead.dead_letter_error_description == HOP_DESCRIPTION


def test_a_queue_updated_to_forward_to_itself_dead_letters_after_four_hops(
    fns: LocalNamespace, client: ServiceBusClient
) -> None:
    # The service accepts the update (azure-sdk-for-python's test_mgmt_queue_update_success does it live); a
    # create cannot name itself: the destination must exist first.
    with pytest.raises(InvalidSettings, match="SubCode=40400"):
        _queue(fns, "loop", forward_to="loop")
    _queue(fns, "loop")
    fns.broker.update_queue("loop", QueueSettings(forward_to="loop"))
    _send(client, "loop", ServiceBusMessage("round", message_id="r"))
    (dead,) = _take_queue(client, "loop", 1, sub_queue=DLQ)
    assert (dead.message_id, dead.dead_letter_reason) == ("r", HOP_REASON)
    assert dead.enqueued_sequence_number == 1


def test_a_deleted_destination_dead_letters_in_the_source(
    fns: LocalNamespace, client: ServiceBusClient
) -> None:
    _queue(fns, "gone")
    _queue(fns, "src", forward_to="gone")
    fns.broker.delete_queue("gone")
    _send(client, "src", ServiceBusMessage("lost?", message_id="x"))
    (dead,) = _take_queue(client, "src", 1, sub_queue=DLQ)
    assert dead.message_id == "x"
    assert "does not exist" in (dead.dead_letter_error_description or "")


def test_a_full_destination_dead_letters_in_the_source_and_a_disabled_one_still_gets_the_message(
    fns: LocalNamespace, client: ServiceBusClient
) -> None:
    _queue(fns, "full", max_size_in_megabytes=0)
    _queue(fns, "off", status="Disabled")
    _queue(fns, "to-full", forward_to="full")
    _queue(fns, "to-off", forward_to="off")
    _send(client, "to-full", ServiceBusMessage("no room", message_id="f"))
    (dead,) = _take_queue(client, "to-full", 1, sub_queue=DLQ)
    assert (dead.message_id, dead.dead_letter_reason) == ("f", "amqp:resource-limit-exceeded")
    assert "maximum entity size" in (dead.dead_letter_error_description or "")
    _send(client, "to-off", ServiceBusMessage("on", message_id="d"))
    assert _active(fns, "off") == 1 and _active(fns, "to-off") == 0


# ------------------------------------------------------------------------------------- dead-lettered messages


def test_dead_lettered_messages_go_to_forward_dead_lettered_messages_to(
    fns: LocalNamespace, client: ServiceBusClient
) -> None:
    _queue(fns, "central")
    _queue(fns, "work", forward_dead_lettered_messages_to="central")
    _send(client, "work", ServiceBusMessage("poison", message_id="p", application_properties={"a": 1}))
    with client.get_queue_receiver("work") as receiver:
        (m,) = receiver.receive_messages(max_wait_time=5)
        receiver.dead_letter_message(m, reason="Unparseable", error_description="not JSON")
    (m,) = _take_queue(client, "central", 1)
    assert (m.message_id, str(m), m.application_properties[b"a"]) == ("p", "poison", 1)
    assert (m.dead_letter_reason, m.dead_letter_error_description) == ("Unparseable", "not JSON")
    assert m.dead_letter_source == "work"
    assert fns.broker.counts("work").dead_letter_message_count == 0
    with pytest.raises(ServiceBusError, match=RECEIVER_REFUSED):
        _take_queue(client, "work", 1, sub_queue=DLQ)


def test_a_message_over_the_hop_limit_stays_in_a_forwarding_dead_letter_queue(
    fns: LocalNamespace, client: ServiceBusClient
) -> None:
    _queue(fns, "central")
    _queue(fns, "loop", forward_dead_lettered_messages_to="central")
    fns.broker.update_queue(
        "loop", QueueSettings(forward_to="loop", forward_dead_lettered_messages_to="central")
    )
    _send(client, "loop", ServiceBusMessage("round"))
    assert fns.broker.counts("loop").dead_letter_message_count == 1
    assert _active(fns, "central") == 0


# ------------------------------------------------------------------------------------------------ refused


def test_the_service_refuses_a_destination_that_is_not_an_existing_queue_or_topic(
    fns: LocalNamespace,
) -> None:
    fns.broker.ensure_topic("t", ["s"])
    _queue(fns, "plain")
    with fns.admin_client() as admin:
        for kw in ({"forward_to": "missing"}, {"forward_dead_lettered_messages_to": "missing"}):
            with pytest.raises(HttpResponseError) as refused:
                admin.create_queue("src", **kw)
            assert refused.value.status_code == 400
            assert "SubCode=40400. The auto forwarding destination entity does not exist: 'missing'" in str(
                refused.value
            )
        with pytest.raises(HttpResponseError, match="SubCode=40400") as refused:
            admin.create_subscription("t", "to-sub", forward_to="t/Subscriptions/s")
        assert refused.value.status_code == 400
        queue = admin.get_queue("plain")
        queue.forward_to = "missing"
        with pytest.raises(HttpResponseError, match="SubCode=40400"):
            admin.update_queue(queue)
        assert admin.get_queue("plain").forward_to is None
    with pytest.raises(InvalidSettings) as caught:
        fns.broker.create_subscription("t", "x", SubscriptionSettings(forward_to="nowhere"))
    assert len(str(caught.value).splitlines()) == 1


def test_a_session_enabled_source_cannot_forward(fns: LocalNamespace) -> None:
    _queue(fns, "dst")
    with pytest.raises(InvalidSettings, match="session-enabled"):
        _queue(fns, "src", requires_session=True, forward_to="dst")
    fns.broker.create_topic("t")
    with pytest.raises(InvalidSettings, match="session-enabled"):
        fns.broker.create_subscription(
            "t", "s", SubscriptionSettings(requires_session=True, forward_to="dst")
        )


def test_no_receiver_on_a_forwarding_queue_or_subscription(
    fns: LocalNamespace, client: ServiceBusClient
) -> None:
    _queue(fns, "dst")
    _queue(fns, "src", forward_to="dst")
    fns.broker.create_topic("t")
    fns.broker.create_subscription("t", "s", SubscriptionSettings(forward_to="dst"))
    with pytest.raises(ServiceBusError, match=RECEIVER_REFUSED):
        _take_queue(client, "src", 1)
    with (
        pytest.raises(ServiceBusError, match=RECEIVER_REFUSED),
        client.get_subscription_receiver("t", "s") as r,
    ):
        _take(r, 1)
    assert _take_queue(client, "src", 1, 1.0, sub_queue=DLQ) == []  # its dead-letter queue does not forward


# ------------------------------------------------------------------------------ administration and topology


def test_the_admin_client_round_trips_forward_to_and_an_update_moves_what_the_source_holds(
    fns: LocalNamespace, client: ServiceBusClient
) -> None:
    with fns.admin_client() as admin:
        admin.create_queue("dst")
        admin.create_topic("t")
        created = admin.create_queue("src", forward_to="dst", forward_dead_lettered_messages_to="t")
        address = f"sb://127.0.0.1:{fns.port}/"
        assert (created.forward_to, created.forward_dead_lettered_messages_to) == (
            address + "dst",
            address + "t",
        )
        queue = admin.get_queue("src")
        assert (queue.forward_to, queue.forward_dead_lettered_messages_to) == (address + "dst", address + "t")
        sub = admin.create_subscription("t", "s", forward_to="dst")
        assert admin.get_subscription("t", "s").forward_to == sub.forward_to == address + "dst"

        _send(client, "src", ServiceBusMessage("a"))
        queue.forward_to = None
        admin.update_queue(queue)
        assert admin.get_queue("src").forward_to is None
        _send(client, "src", ServiceBusMessage("b"))
        assert _active(fns, "src") == 1  # held now: no forwarding
        admin.update_queue(queue, forward_to="dst")  # what src holds goes on
    assert sorted(str(m) for m in _take_queue(client, "dst", 2)) == ["a", "b"]
    assert _active(fns, "src") == 0


def test_a_topology_file_declares_forwarding_in_any_order(tmp_path: Path) -> None:
    topology = tmp_path / "topology.yaml"
    topology.write_text(
        "queues:\n"
        "  - {name: first, forward_to: events}\n"
        "  - {name: sink, forward_dead_lettered_messages_to: graveyard}\n"
        "  - graveyard\n"
        "topics:\n"
        "  - name: events\n"
        "    subscriptions:\n"
        "      - {name: fan, forward_to: sink}\n"
    )
    with LocalNamespace("topo", topology=topology) as ns:
        with ServiceBusClient.from_connection_string(ns.connection_string, retry_total=0) as c:
            _send(c, "first", ServiceBusMessage("via topic", message_id="t-1"))
            (m,) = _take_queue(c, "sink", 1)
        assert m.message_id == "t-1"
        assert dataclasses.asdict(ns.broker.get_queue("first").settings)["forward_to"] == "events"

    topology.write_text("queues:\n  - {name: first, forward_to: nowhere}\n")
    with pytest.raises(TopologyError, match="'nowhere'"):
        LocalNamespace("topo", topology=topology)


def test_the_cli_reports_a_missing_forwarding_destination_in_one_line(tmp_path: Path) -> None:
    topology = tmp_path / "topology.yaml"
    topology.write_text("queues:\n  - {name: first, forward_to: nowhere}\n")
    result = run_cli("--topology", str(topology))
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "queue 'first': SubCode=40400" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
