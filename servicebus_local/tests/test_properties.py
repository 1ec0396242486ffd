"""Every property the SDK sets round-trips exactly through the local namespace (real SDK, real TCP).

One namespace and one send/receive round for the whole module; each property kind is its own test case.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from servicebus_local.server import LocalNamespace

APP_VALUES: dict[str, Any] = {
    "str": "text ü",
    "empty-str": "",
    "int": 42,
    "negative": -7,
    "int-max": 2**31 - 1,  # the SDK encodes int application properties as AMQP int
    "float": 1.25,
    "true": True,
    "false": False,
    "bytes": b"raw bytes",  # the SDK sends bytes values as UTF-8 strings (uamqp parity)
    "datetime": datetime(2026, 3, 4, 5, 6, 7, 123000, tzinfo=timezone.utc),
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "none": None,
}

BODIES: dict[str, str | bytes] = {"str": "text body ü", "bytes": b"\x00binary\xff", "empty": b""}


def _full_message(body: str | bytes, message_id: str) -> ServiceBusMessage:
    return ServiceBusMessage(
        body,
        message_id=message_id,
        correlation_id="corr-1",
        partition_key="pk-1",
        content_type="application/json",
        subject="subj",
        to="to-addr",
        reply_to="reply-q",
        reply_to_session_id="rsid",
        time_to_live=timedelta(minutes=5),
        application_properties={"a": 1},
    )


@pytest.fixture(scope="module")
def received() -> Iterator[dict[str, Any]]:
    """message id -> received message, for one message per application property kind and per body kind."""
    with LocalNamespace("props", queues=["q"]) as ns:
        sent_at = datetime.now(timezone.utc)
        with ServiceBusClient.from_connection_string(ns.connection_string) as client:
            with client.get_queue_sender("q") as sender:
                sender.send_messages(
                    [
                        ServiceBusMessage("b", message_id=f"app-{k}", application_properties={k: v})
                        for k, v in APP_VALUES.items()
                    ]
                )
                for kind, body in BODIES.items():
                    sender.send_messages(_full_message(body, f"body-{kind}"))
            expected = len(APP_VALUES) + len(BODIES)
            out: dict[str, Any] = {}
            with client.get_queue_receiver("q") as receiver:
                deadline = time.monotonic() + 10
                while len(out) < expected and time.monotonic() < deadline:
                    for m in receiver.receive_messages(max_message_count=expected, max_wait_time=1):
                        out[m.message_id] = m
                        out[f"locked-until-{m.message_id}"] = m.locked_until_utc  # None once settled
                        out[f"lock-token-{m.message_id}"] = m.lock_token
                        receiver.complete_message(m)
        out["__sent_at__"] = sent_at
        yield out


@pytest.mark.parametrize("kind", list(APP_VALUES))
def test_application_property_types_round_trip(received: dict[str, Any], kind: str) -> None:
    value = APP_VALUES[kind]
    got = received[f"app-{kind}"].application_properties[kind.encode()]
    # the SDK reads AMQP strings as bytes and timestamps as epoch milliseconds
    if kind in ("str", "empty-str", "bytes"):
        expected = value if isinstance(value, bytes) else value.encode("utf-8")
        assert got == expected
    elif kind == "datetime":
        assert got == int(value.timestamp() * 1000)
    else:
        assert got == value
        assert type(got) is type(value)


@pytest.mark.parametrize("kind", list(BODIES))
def test_every_message_property_round_trips(received: dict[str, Any], kind: str) -> None:
    m = received[f"body-{kind}"]
    body = BODIES[kind]
    expected_body = body.encode() if isinstance(body, str) else body
    assert b"".join(m.body) == expected_body
    assert m.message_id == f"body-{kind}"
    assert m.correlation_id == "corr-1"
    assert m.partition_key == "pk-1"
    assert m.content_type == "application/json"
    assert m.subject == "subj"
    assert m.to == "to-addr"
    assert m.reply_to == "reply-q"
    assert m.reply_to_session_id == "rsid"
    assert m.time_to_live == timedelta(minutes=5)
    assert m.application_properties == {b"a": 1}


@pytest.mark.parametrize("kind", list(BODIES))
def test_broker_annotations_present(received: dict[str, Any], kind: str) -> None:
    m = received[f"body-{kind}"]
    sent_at: datetime = received["__sent_at__"]
    assert isinstance(m.sequence_number, int) and m.sequence_number >= 1
    assert m.enqueued_time_utc is not None
    assert abs((m.enqueued_time_utc - sent_at).total_seconds()) < 10
    locked_until = received[f"locked-until-body-{kind}"]
    assert locked_until is not None and locked_until > m.enqueued_time_utc
    assert isinstance(received[f"lock-token-body-{kind}"], uuid.UUID)
    assert m.expires_at_utc == m.enqueued_time_utc + timedelta(minutes=5)
    assert m.delivery_count == 0


def test_sequence_numbers_follow_send_order(received: dict[str, Any]) -> None:
    ids = [f"app-{k}" for k in APP_VALUES] + [f"body-{k}" for k in BODIES]
    assert [received[i].sequence_number for i in ids] == list(range(1, len(ids) + 1))
