"""Sessions (SPEC E1/E2) and the admin hand-off on the shared port (E3), through the unmodified SDK."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import OperationTimeoutError, ServiceBusError, SessionCannotBeLockedError

from servicebus_local.model import QueueSettings, SubscriptionSettings
from servicebus_local.server import LocalNamespace


@pytest.fixture
def sns() -> Any:
    with LocalNamespace("sessions") as ns:
        ns.broker.create_queue("sq", QueueSettings(requires_session=True, lock_duration=timedelta(seconds=5)))
        ns.broker.create_topic("st")
        ns.broker.create_subscription("st", "sub", SubscriptionSettings(requires_session=True))
        yield ns


def _receive(receiver: Any, n: int, timeout: float = 5.0) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out += receiver.receive_messages(max_message_count=n - len(out), max_wait_time=1)
    return out


def test_send_without_session_id_to_a_session_queue_fails(sns: LocalNamespace) -> None:
    with ServiceBusClient.from_connection_string(sns.connection_string, retry_total=0) as c:
        with c.get_queue_sender("sq") as s, pytest.raises(ServiceBusError):
            s.send_messages(ServiceBusMessage("no session"))
        assert sns.broker.get_queue("sq").runtime.active_message_count == 0


def test_next_available_session_in_order_with_state_and_renew(sns: LocalNamespace) -> None:
    with ServiceBusClient.from_connection_string(sns.connection_string) as c:
        with c.get_queue_sender("sq") as s:
            s.send_messages([ServiceBusMessage(f"a{i}", session_id="A") for i in range(3)])
            s.send_messages([ServiceBusMessage("b0", session_id="B")])
        with c.get_queue_receiver("sq", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=3) as r:
            session = r.session
            assert session.session_id == "A"
            assert session.locked_until_utc is not None
            msgs = _receive(r, 3)
            assert [str(m) for m in msgs] == ["a0", "a1", "a2"]
            assert all(m.session_id == "A" for m in msgs)
            session.set_state("checkpoint-2")
            assert session.get_state() == b"checkpoint-2"
            before = session.locked_until_utc
            time.sleep(0.1)
            after = session.renew_lock()
            assert after >= before
            for m in msgs:
                r.complete_message(m)
            # another receiver cannot take session A while it is held
            with (
                ServiceBusClient.from_connection_string(sns.connection_string, retry_total=0) as c2,
                pytest.raises(SessionCannotBeLockedError),
                c2.get_queue_receiver("sq", session_id="A") as other,
            ):
                other.receive_messages(max_message_count=1, max_wait_time=1)
        with c.get_queue_receiver("sq", session_id="B") as rb:
            (b0,) = _receive(rb, 1)
            assert str(b0) == "b0"
            rb.complete_message(b0)
    assert sns.broker.get_queue("sq").runtime.active_message_count == 0


def test_next_available_session_times_out_when_none(sns: LocalNamespace) -> None:
    with ServiceBusClient.from_connection_string(sns.connection_string, retry_total=0) as c:
        started = time.monotonic()
        with (
            pytest.raises((OperationTimeoutError, ServiceBusError)),
            c.get_queue_receiver("sq", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1) as r,
        ):
            r.receive_messages(max_message_count=1, max_wait_time=1)
        assert time.monotonic() - started < 15


def test_session_subscription(sns: LocalNamespace) -> None:
    with ServiceBusClient.from_connection_string(sns.connection_string) as c:
        with c.get_topic_sender("st") as s:
            s.send_messages(
                [ServiceBusMessage("x", session_id="S1"), ServiceBusMessage("y", session_id="S1")]
            )
        with c.get_subscription_receiver("st", "sub", session_id="S1") as r:
            got = _receive(r, 2)
            assert [str(m) for m in got] == ["x", "y"]
            for m in got:
                r.complete_message(m)


def test_admin_client_on_the_amqp_port(sns: LocalNamespace) -> None:
    admin = sns.admin_client()
    assert admin.get_queue("sq").requires_session is True
    admin.create_queue(
        "contoso/x-servicebus-transfer/0", max_delivery_count=7, lock_duration=timedelta(minutes=1)
    )
    assert sns.broker.get_queue("contoso/x-servicebus-transfer/0").settings.max_delivery_count == 7
    with (
        ServiceBusClient.from_connection_string(sns.connection_string) as c,
        c.get_queue_sender("contoso/x-servicebus-transfer/0") as s,
    ):
        s.send_messages([ServiceBusMessage("1"), ServiceBusMessage("2")])
    assert admin.get_queue_runtime_properties("contoso/x-servicebus-transfer/0").active_message_count == 2
    sns.faults.fail_admin(
        "GET", "contoso/x-servicebus-transfer/0", 400, count=1, code="Bad", detail="injected"
    )
    with pytest.raises(HttpResponseError):
        admin.get_queue("contoso/x-servicebus-transfer/0")
    assert admin.get_queue("contoso/x-servicebus-transfer/0").name == "contoso/x-servicebus-transfer/0"
