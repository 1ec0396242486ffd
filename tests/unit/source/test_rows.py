"""The source's row schema and ``row_of`` (SOURCE.md §10, §9): SDK messages built locally (the AMQP encoding of a
message as the service delivers it, decoded by the SDK's own ``ServiceBusReceivedMessage.from_bytes``)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from azure.servicebus import ServiceBusReceivedMessage
from azure.servicebus._pyamqp._encode import encode_payload
from azure.servicebus._pyamqp.message import Header, Message, Properties
from azure.servicebus._pyamqp.types import TYPE, VALUE, AMQPTypes

from spark_sb.source.rows import row_of, schema, schema_ddl

ENQUEUED_MS = 1_764_000_000_000
ENQUEUED = datetime(2025, 11, 24, 16, 0, tzinfo=timezone.utc)


def _long(v: int) -> dict[str, Any]:
    return {TYPE: AMQPTypes.long, VALUE: v}


def _time(ms: int) -> dict[str, Any]:
    return {TYPE: AMQPTypes.timestamp, VALUE: ms}


def _message(
    *, state: int = 0, ttl: int | None = 60_000, annotations: dict[bytes, Any] | None = None, **body: Any
) -> ServiceBusReceivedMessage:
    m = Message(
        header=Header(delivery_count=2, ttl=ttl),
        properties=Properties(
            message_id=b"id-1",
            correlation_id=b"corr",
            subject=b"subj",
            content_type=b"text/plain",
            to=b"dest",
            reply_to=b"back",
            group_id=b"sess-1",
            reply_to_group_id=b"sess-2",
        ),
        application_properties={
            b"n": 1,
            b"s": b"x",
            b"flag": True,
            b"f": 1.5,
            b"none": None,
            b"when": _time(ENQUEUED_MS + 123),
            b"u": uuid.UUID(int=5),
            b"big": _long(2**40),
        },
        message_annotations={
            b"x-opt-sequence-number": _long(7),
            b"x-opt-enqueued-time": _time(ENQUEUED_MS),
            b"x-opt-message-state": _long(state),
            b"x-opt-enqueue-sequence-number": _long(3),
            b"x-opt-partition-key": b"pk",
            b"x-opt-scheduled-enqueue-time": _time(ENQUEUED_MS + 1000),
            **(annotations or {}),
        },
        **(body or {"data": [b"hel", b"lo"]}),
    )
    out = bytearray()
    encode_payload(out, m)
    return ServiceBusReceivedMessage.from_bytes(bytes(out))


def _row(msg: ServiceBusReceivedMessage, body_format: str = "binary", batch: bool = False) -> dict[str, Any]:
    row = row_of(msg, "ns.servicebus.windows.net", "orders", body_format, batch=batch)
    names = [name for name, _ in schema(body_format, batch=batch)]
    assert len(row) == len(names)
    return dict(zip(names, row, strict=True))


def test_the_schema_is_the_designs_with_body_error_for_strings_and_state_for_batch_reads() -> None:
    names = [name for name, _ in schema()]
    assert names[:3] == ["body", "body_type", "message_id"]
    assert names[-5:] == ["namespace", "entity", "via", "backlog_queue", "diverted_time"]
    assert dict(schema())["properties"] == "map<string,string>" and dict(schema())["time_to_live"] == "bigint"
    assert len(names) == 27 and "state" not in names and "body_error" not in names
    text = schema("string", batch=True)
    assert text[:2] == [("body", "string"), ("body_error", "string")] and text[-1] == ("state", "string")
    assert schema_ddl().startswith("`body` binary, `body_type` string,") and "`to` string" in schema_ddl()


def test_a_data_message_becomes_its_row() -> None:
    row = _row(_message())
    assert row["body"] == b"hello" and row["body_type"] == "data"
    assert (row["message_id"], row["correlation_id"], row["subject"], row["content_type"]) == (
        "id-1",
        "corr",
        "subj",
        "text/plain",
    )
    assert (
        row["session_id"],
        row["reply_to_session_id"],
        row["partition_key"],
        row["to"],
        row["reply_to"],
    ) == (
        "sess-1",
        "sess-2",
        "pk",
        "dest",
        "back",
    )
    assert row["time_to_live"] == 60_000
    assert row["scheduled_enqueue_time"] == ENQUEUED + timedelta(seconds=1)
    assert (row["sequence_number"], row["enqueued_sequence_number"], row["delivery_count"]) == (7, 3, 2)
    assert row["enqueued_time"] == ENQUEUED and row["enqueued_time"].tzinfo == timezone.utc
    assert row["expires_at"] == ENQUEUED + timedelta(minutes=1)
    assert (row["namespace"], row["entity"], row["via"], row["backlog_queue"], row["diverted_time"]) == (
        "ns.servicebus.windows.net",
        "orders",
        "primary",
        None,
        None,
    )
    assert row["dead_letter_reason"] is None


def _encoded(m: Message) -> ServiceBusReceivedMessage:
    out = bytearray()
    encode_payload(out, m)
    return ServiceBusReceivedMessage.from_bytes(bytes(out))


#: The row's columns read from the AMQP properties section, and the SDK getter each one's text must equal.
PROPERTY_COLUMNS = {
    "message_id": "message_id",
    "correlation_id": "correlation_id",
    "session_id": "session_id",
    "reply_to_session_id": "reply_to_session_id",
    "subject": "subject",
    "content_type": "content_type",
    "to": "to",
    "reply_to": "reply_to",
}


def test_the_properties_section_gives_the_sdk_getters_text_for_any_value_and_none_without_it() -> None:
    """``row_of`` reads the properties section once, field by field (the SDK's getters list the section's
    attributes at each call): a missing section, UUID and integer ids, invalid UTF-8 and unset fields give the
    getters' values as text, as before."""
    no_section = _encoded(Message(properties=None, data=[b"x"]))
    assert no_section.raw_amqp_message.properties is None
    odd = _encoded(
        Message(
            properties=Properties(
                message_id=uuid.UUID(int=9),
                correlation_id=b"\xff\xfeno",
                group_id=b"s",
                to=None,
            ),
            data=[b"x"],
        )
    )
    numbered = _encoded(Message(properties=Properties(message_id=12345, subject=b"s"), data=[b"x"]))
    for msg in (no_section, odd, numbered, _message()):
        row = _row(msg)
        for column, getter in PROPERTY_COLUMNS.items():
            value = getattr(msg, getter)
            want = (
                None
                if value is None
                else value.decode("utf-8", "replace")
                if isinstance(value, bytes)
                else str(value)
            )
            assert row[column] == want, (column, value)
    assert _row(odd)["message_id"] == "00000000-0000-0000-0000-000000000009"
    assert _row(odd)["correlation_id"] == "\ufffd\ufffdno" and _row(numbered)["message_id"] == "12345"
    assert all(_row(no_section)[c] is None for c in PROPERTY_COLUMNS)


def test_typed_property_values_are_rendered_as_text() -> None:
    assert _row(_message())["properties"] == {
        "n": "1",
        "s": "x",
        "flag": "true",
        "f": "1.5",
        "none": None,
        "when": str(ENQUEUED_MS + 123),  # the SDK hands timestamps back as milliseconds
        "u": "00000000-0000-0000-0000-000000000005",
        "big": str(2**40),
    }


def test_a_string_body_decodes_and_invalid_utf8_gives_a_null_body_and_an_error() -> None:
    row = _row(_message(data=["héllo".encode()]), "string")
    assert (row["body"], row["body_error"]) == ("héllo", None)
    row = _row(_message(data=[b"ok\xff"]), "string")
    assert row["body"] is None and "invalid UTF-8 at byte 2" in row["body_error"]
    assert row["sequence_number"] == 7  # the rest of the row is there: no failure on content


def test_value_and_sequence_bodies_become_json_text() -> None:
    row = _row(_message(value={b"k": [1, b"v"]}))
    assert (row["body_type"], row["body"]) == ("value", b'{"k":[1,"v"]}')
    row = _row(_message(sequence=[[1, 2], [3]]))
    assert (row["body_type"], row["body"]) == ("sequence", b"[[1,2],[3]]")
    assert _row(_message(value="text"), "string")["body"] == "text"


def test_dead_letter_fields_and_the_batch_reads_state() -> None:
    msg = _message(
        state=1,
        annotations={b"x-opt-deadletter-source": b"orders"},
    )
    assert _row(msg, batch=True)["state"] == "deferred"
    assert _row(_message(state=2), batch=True)["state"] == "scheduled"
    assert _row(_message(), batch=True)["state"] == "active"
    assert _row(msg)["dead_letter_source"] == "orders"


def test_no_ttl_means_no_expiry_and_an_endless_ttl_does_not_overflow() -> None:
    row = _row(_message(ttl=None))
    assert (row["time_to_live"], row["expires_at"]) == (None, None)
    row = _row(_message(ttl=2**32 - 1))  # the largest the header holds
    assert row["time_to_live"] == 2**32 - 1 and row["expires_at"] == ENQUEUED + timedelta(
        milliseconds=2**32 - 1
    )


def test_the_planners_size_and_delivery_count_of_a_received_message() -> None:
    """``size_of`` (the driver's ``maxBytesPerTrigger`` count): the data body's bytes over its sections, each
    application property's key and text (8 for other values) and 64; a value body counts its properties only.
    ``delivery_count_of``: the header's count, 0 without a header."""
    from spark_sb.source.sdk import delivery_count_of, size_of

    props = {b"k": b"vv", b"n": 1}
    data = _encoded(
        Message(header=Header(delivery_count=3), application_properties=props, data=[b"ab", b"cde"])
    )
    assert size_of(data) == 5 + (1 + 2) + (1 + 8) + 64
    assert delivery_count_of(data) == 3 == data.delivery_count
    value = _encoded(Message(application_properties=props, value={b"a": 1}))
    assert size_of(value) == (1 + 2) + (1 + 8) + 64
    bare = _encoded(Message(data=[b"x" * 1000]))
    assert size_of(bare) == 1064
    assert bare.raw_amqp_message.header is None and delivery_count_of(bare) == 0
