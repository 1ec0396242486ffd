"""Unit tests for rows becoming messages (spark_sb.message.rows: S2 row mapping, message validation) and the B6
backlog translation; the SDK oracles and message strategies here are shared with test_outbound.py (the message model,
SDK mapping) and test_wire_size.py (B7 sizes)."""

from __future__ import annotations

import json
import pickle
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceivedMessage
from azure.servicebus._common.utils import transform_outbound_messages
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_sb.message.backlog import (
    BACKLOG_ENQUEUED,
    BACKLOG_PARTITION_KEY,
    BACKLOG_PATH,
    BACKLOG_SCHEDULED,
    BACKLOG_SESSION_ID,
    BACKLOG_TABLE,
    BACKLOG_TIMESTAMP_PROPERTIES,
    BACKLOG_TTL,
    RESERVED_PROPERTIES,
    from_backlog,
    is_backlog_message,
    to_backlog,
)
from spark_sb.message.outbound import (
    MAX_TTL_MS,
    OutboundMessage,
    RejectError,
    message_id_from_content,
)
from spark_sb.message.rows import (
    LOGICAL_COLUMNS,
    reject_row,
    row_to_message,
    validate_message,
)
from spark_sb.message.wire_size import encoded_size

UTC = timezone.utc
COLS: dict[str, str] = {}
LIMIT = 262144
NOW = datetime(2026, 11, 21, 12, 0, 0, 123000, tzinfo=UTC)


# --------------------------------------------------------------------------- helpers (SDK as the oracle)
def sdk_outgoing(msg: OutboundMessage) -> ServiceBusMessage:
    """The message exactly as the SDK prepares it for sending (to_outgoing_amqp_message)."""
    out = transform_outbound_messages(
        msg.to_sdk(), ServiceBusMessage, PyamqpTransport.to_outgoing_amqp_message
    )
    assert isinstance(out, ServiceBusMessage)
    return out


def sdk_encoded_size(msg: OutboundMessage) -> int:
    return PyamqpTransport.get_message_encoded_size(sdk_outgoing(msg)._message)


def over_the_wire(msg: OutboundMessage, entity: str | None = None) -> OutboundMessage:
    """Encode with the SDK, decode as a received message, map back."""
    raw = bytes(PyamqpTransport.encode_message(sdk_outgoing(msg)))
    return OutboundMessage.from_received(ServiceBusReceivedMessage.from_bytes(raw), entity=entity)


# --------------------------------------------------------------------------- strategies
ms_datetimes = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1)).map(
    lambda d: d.replace(microsecond=d.microsecond - d.microsecond % 1000, tzinfo=UTC)
)
short_text = st.text(max_size=40)
ids = st.text(min_size=1, max_size=128)
prop_keys = st.text(min_size=1, max_size=300).filter(lambda k: k not in RESERVED_PROPERTIES)


def scalars(wire_safe: bool = False) -> st.SearchStrategy[Any]:
    base = [
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.floats(allow_nan=False),
        st.text(max_size=300),
        st.uuids(),
        ms_datetimes,
    ]
    if not wire_safe:  # bytes come back as str after a real round trip
        base.append(st.text(max_size=40).map(lambda s: s.encode("utf-8")))
    return st.one_of(*base)


#: The strategies ``messages`` draws from, built once (hypothesis validates a strategy object once: building them in
#: every draw made the strategy most of the cost of the tests that use it).
_SCALARS = {wire_safe: scalars(wire_safe) for wire_safe in (False, True)}
_OPT_IDS = st.none() | ids
_SAME_OR_NONE = st.sampled_from([None, "same"])
_ANY_BODY = st.binary(max_size=700) | st.text(max_size=400)
_BINARY_BODY = st.binary(max_size=700)
_OPT_ENTITY = st.none() | st.text(min_size=1, max_size=50)
_OPT_CORRELATION_ID = st.none() | st.text(max_size=300)
_OPT_CONTENT_TYPE = st.none() | st.text(alphabet=st.characters(max_codepoint=127), max_size=40)
_OPT_SHORT_TEXT = st.none() | short_text
_OPT_REPLY_TO_SESSION_ID = st.none() | st.text(max_size=128)
_OPT_TTL = st.none() | st.integers(1, MAX_TTL_MS).map(lambda ms: timedelta(milliseconds=ms))
_OPT_MS_DATETIME = st.none() | ms_datetimes
_PROPERTIES = {
    wire_safe: st.dictionaries(prop_keys, _SCALARS[wire_safe], max_size=12) for wire_safe in (False, True)
}


@st.composite
def messages(draw: st.DrawFn, wire_safe: bool = False) -> OutboundMessage:
    session = draw(_OPT_IDS)
    partition = draw(_SAME_OR_NONE) if session is not None else draw(_OPT_IDS)
    if partition == "same":
        partition = session
    body = draw(_ANY_BODY) if not wire_safe else draw(_BINARY_BODY)
    return OutboundMessage(
        body=body,
        entity=draw(_OPT_ENTITY) if not wire_safe else None,
        message_id=draw(ids) if wire_safe else draw(_OPT_IDS),
        session_id=session,
        partition_key=partition,
        correlation_id=draw(_OPT_CORRELATION_ID),
        content_type=draw(_OPT_CONTENT_TYPE),
        subject=draw(_OPT_SHORT_TEXT),
        to=draw(_OPT_SHORT_TEXT),
        reply_to=draw(_OPT_SHORT_TEXT),
        reply_to_session_id=draw(_OPT_REPLY_TO_SESSION_ID),
        time_to_live=draw(_OPT_TTL),
        scheduled_enqueue_time=draw(_OPT_MS_DATETIME),
        properties=draw(_PROPERTIES[wire_safe]),
    )


# --------------------------------------------------------------------------- encoded size (B7)
def test_validate_rejects_too_large_with_both_numbers() -> None:
    m = OutboundMessage(b"x" * 1000, message_id="m")
    size = encoded_size(m)
    validate_message(m, size)  # exactly at the limit is fine
    with pytest.raises(RejectError) as e:
        validate_message(m, size - 1)
    assert str(size) in str(e.value) and str(size - 1) in str(e.value)


def test_fits_before_translation_but_not_after() -> None:
    limit = 4096
    base = OutboundMessage(b"", message_id="m", session_id="s", time_to_live=timedelta(minutes=5))
    body = b"y" * (limit - encoded_size(base) - 3)  # vbin32: +3 bytes over the empty body
    m = replace(base, body=body)
    assert encoded_size(m) <= limit
    validate_message(m, limit)
    translated = to_backlog(m, "orders", NOW)
    assert encoded_size(translated) > limit
    assert encoded_size(translated) == sdk_encoded_size(translated)
    with pytest.raises(RejectError, match=str(limit)):
        validate_message(translated, limit)


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"message_id": "m" * 129}, "message_id"),
        ({"message_id": ""}, "message_id"),
        ({"session_id": "s" * 129}, "session_id"),
        ({"partition_key": "p" * 129}, "partition_key"),
        ({"reply_to_session_id": "r" * 129}, "reply_to_session_id"),
        ({"session_id": "a", "partition_key": "b"}, "partition_key"),
        ({"time_to_live": timedelta(0)}, "time_to_live"),
        ({"time_to_live": timedelta(milliseconds=-5)}, "time_to_live"),
        ({"time_to_live": timedelta(milliseconds=MAX_TTL_MS + 1)}, "time_to_live"),
        ({"time_to_live": 5000}, "time_to_live"),
        ({"scheduled_enqueue_time": "2030-01-01"}, "scheduled_enqueue_time"),
        ({"content_type": "tëxt"}, "content_type"),
        ({"subject": 5}, "subject"),
        ({"properties": {"l": [1, 2]}}, "properties.l"),
        ({"properties": {"d": Decimal("1.5")}}, "properties.d"),
        ({"properties": {"big": 2**63}}, "properties.big"),
        ({"properties": {"raw": b"\xff\xfe"}}, "properties.raw"),
        ({"properties": {BACKLOG_TTL: 5}}, f"properties.{BACKLOG_TTL}"),
        ({"properties": {"": 1}}, "properties"),
    ],
)
def test_validate_rejects(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(RejectError) as e:
        validate_message(OutboundMessage(b"x", **kwargs), LIMIT)
    assert e.value.field == field
    assert str(e.value).startswith(f"{field}: ")


def test_validate_accepts_limits() -> None:
    validate_message(
        OutboundMessage(
            b"x",
            message_id="m" * 128,
            session_id="s" * 128,
            partition_key="s" * 128,
            time_to_live=timedelta(milliseconds=MAX_TTL_MS),
            properties={"a": None, "b": 2**63 - 1, "c": b"utf8 \xc3\xa9"},
        ),
        LIMIT,
    )


# --------------------------------------------------------------------------- rows (S2)
def test_row_to_message_all_columns() -> None:
    row = {
        "body": "hello",
        "entity": "orders",
        "message_id": "m1",
        "session_id": "s1",
        "partition_key": "s1",
        "correlation_id": "c1",
        "content_type": "text/plain",
        "subject": "subj",
        "to": "t",
        "reply_to": "r",
        "reply_to_session_id": "rs",
        "time_to_live": 1500,
        "scheduled_enqueue_time": datetime(2030, 1, 1, 12, 0),
        "properties": {"a": 1, "b": bytearray(b"x"), "c": datetime(2030, 1, 1)},
        "unrelated": object(),
    }
    m = row_to_message(row, COLS, None, LIMIT)
    assert m == OutboundMessage(
        "hello",
        entity="orders",
        message_id="m1",
        session_id="s1",
        partition_key="s1",
        correlation_id="c1",
        content_type="text/plain",
        subject="subj",
        to="t",
        reply_to="r",
        reply_to_session_id="rs",
        time_to_live=timedelta(milliseconds=1500),
        scheduled_enqueue_time=datetime(2030, 1, 1, 12, 0, tzinfo=UTC),
        properties={"a": 1, "b": b"x", "c": datetime(2030, 1, 1, tzinfo=UTC)},
    )


def test_row_to_message_defaults_and_column_mapping() -> None:
    row = {"payload": b"\x01\x02", "dest": "q2", "ttl": timedelta(seconds=2)}
    cols = {"body": "payload", "entity": "dest", "time_to_live": "ttl"}
    m = row_to_message(row, cols, "default-q", LIMIT)
    assert (m.body, m.entity, m.time_to_live) == (b"\x01\x02", "q2", timedelta(seconds=2))
    m2 = row_to_message({"payload": "x"}, cols, "default-q", LIMIT)
    assert m2.entity == "default-q" and m2.properties == {}


def test_row_struct_body_becomes_json() -> None:
    m = row_to_message({"body": {"id": 1, "at": datetime(2030, 1, 1), "raw": b"\x00"}}, COLS, "q", LIMIT)
    assert m.content_type == "application/json"
    assert json.loads(m.body) == {"id": 1, "at": "2030-01-01T00:00:00", "raw": "AA=="}
    m2 = row_to_message({"body": [1, 2], "content_type": "application/x+json"}, COLS, "q", LIMIT)
    assert (m2.body, m2.content_type) == ("[1,2]", "application/x+json")


def test_row_from_pyspark_row() -> None:
    from pyspark.sql import Row

    row = Row(body=Row(a=1, b=Row(c="x")), entity="q", properties={"k": "v"}, message_id=None)
    m = row_to_message(row, COLS, None, LIMIT)
    assert json.loads(m.body) == {"a": 1, "b": {"c": "x"}}
    assert m.entity == "q" and m.properties == {"k": "v"} and m.message_id is None
    with pytest.raises(RejectError, match="missing body column 'payload'"):
        row_to_message(row, {"body": "payload"}, None, LIMIT)


@pytest.mark.parametrize(
    ("row", "cols", "field", "fragment"),
    [
        ({"nobody": "x"}, {}, "body", "missing body column"),
        ({"b": "x"}, {"body": "b", "entity": "e", "session_id": "sid"}, "b", None),  # fine, see below
        ({"body": None}, {}, "body", "null"),
        ({"body": 5}, {}, "body", "found int"),
        ({"body": "x", "entity": 3}, {}, "entity", "found int"),
        ({"body": "x", "message_id": 12}, {}, "message_id", "found int"),
        ({"body": "x", "sid": "s" * 129}, {"session_id": "sid"}, "sid", "128"),
        ({"body": "x", "session_id": "a", "partition_key": "b"}, {}, "partition_key", "session_id"),
        ({"body": "x", "time_to_live": 0}, {}, "time_to_live", "> 0"),
        ({"body": "x", "time_to_live": -3.5}, {}, "time_to_live", "> 0"),
        ({"body": "x", "time_to_live": True}, {}, "time_to_live", "found bool"),
        ({"body": "x", "time_to_live": "5s"}, {}, "time_to_live", "found str"),
        ({"body": "x", "time_to_live": float("nan")}, {}, "time_to_live", "finite"),
        ({"body": "x", "scheduled_enqueue_time": 17}, {}, "scheduled_enqueue_time", "found int"),
        ({"body": "x", "properties": "a=b"}, {}, "properties", "found str"),
        ({"body": "x", "properties": {"k": {"nested": 1}}}, {}, "properties.k", "dict"),
        ({"body": "x", "properties": {"k": Decimal(1)}}, {}, "properties.k", "Decimal"),
        ({"body": "x", "properties": {1: "v"}}, {}, "properties", "names"),
    ],
)
def test_row_rejects(row: dict[str, Any], cols: dict[str, str], field: str, fragment: str | None) -> None:
    if fragment is None:
        assert row_to_message(row, cols, "q", LIMIT).body == "x"
        return
    with pytest.raises(RejectError) as e:
        row_to_message(row, cols, "q", LIMIT)
    assert e.value.field == field
    assert fragment in str(e.value)


def test_row_without_entity_and_without_default_is_rejected() -> None:
    with pytest.raises(RejectError) as e:
        row_to_message({"body": "x"}, COLS, None, LIMIT)
    assert e.value.field == "entity"


def test_row_too_large_names_both_numbers() -> None:
    with pytest.raises(RejectError) as e:
        row_to_message({"body": b"z" * 5000}, COLS, "q", 1000)
    assert e.value.field is None and "1000" in e.value.reason and "bytes" in e.value.reason


def test_reject_keeps_original_row_as_json_without_secrets() -> None:
    row = {
        "body": b"\x00\x01",
        "when": datetime(2030, 1, 1),
        "note": "Endpoint=sb://x/;SharedAccessKeyName=k;SharedAccessKey=TopSecretValue=",
        "session_id": "s" * 200,
    }
    with pytest.raises(RejectError) as e:
        row_to_message(row, COLS, "q", LIMIT)
    rej = reject_row(row, e.value, entity="q", row_index=3)
    assert (rej.field, rej.entity, rej.row_index) == ("session_id", "q", 3)
    data = json.loads(rej.row_json)
    assert (
        data["body"] == "AAE=" and data["when"] == "2030-01-01T00:00:00" and data["session_id"] == "s" * 200
    )
    assert "TopSecretValue" not in rej.row_json
    assert pickle.loads(pickle.dumps(rej)) == rej
    err = pickle.loads(pickle.dumps(e.value))
    assert (err.field, err.reason) == (e.value.field, e.value.reason)


def test_logical_columns_match_outbound_fields() -> None:
    from dataclasses import fields

    assert set(LOGICAL_COLUMNS) == {f.name for f in fields(OutboundMessage)}


# --------------------------------------------------------------------------- backlog translation (B6)
def test_backlog_table_is_the_spec() -> None:
    assert {(a, p) for a, p, _, _ in BACKLOG_TABLE} == {
        ("entity", BACKLOG_PATH),
        ("session_id", BACKLOG_SESSION_ID),
        ("time_to_live", BACKLOG_TTL),
        ("scheduled_enqueue_time", BACKLOG_SCHEDULED),
        ("partition_key", BACKLOG_PARTITION_KEY),
    }
    assert (BACKLOG_PATH, BACKLOG_SESSION_ID, BACKLOG_TTL) == (
        "x-ms-path",
        "x-ms-sessionid",
        "x-ms-timetolive",
    )
    assert (BACKLOG_SCHEDULED, BACKLOG_PARTITION_KEY, BACKLOG_ENQUEUED) == (
        "x-ms-scheduledenqueuetimeutc",
        "x-ms-partitionkey",
        "x-ms-backlog-enqueued-utc",
    )


def test_to_backlog_example() -> None:
    sched = datetime(2030, 1, 1, tzinfo=UTC)
    m = OutboundMessage(
        b"b",
        message_id="m",
        session_id="s",
        partition_key="s",
        time_to_live=timedelta(seconds=90),
        scheduled_enqueue_time=sched,
        subject="keep",
        properties={"user": 1},
    )
    b = to_backlog(m, "orders", NOW)
    assert b.entity is None and b.session_id is None and b.partition_key is None
    assert b.time_to_live is None and b.scheduled_enqueue_time is None
    assert (b.body, b.message_id, b.subject) == (b"b", "m", "keep")
    assert b.properties == {
        "user": 1,
        BACKLOG_PATH: "orders",
        BACKLOG_SESSION_ID: "s",
        BACKLOG_PARTITION_KEY: "s",
        BACKLOG_TTL: 90_000,
        BACKLOG_SCHEDULED: sched,
        BACKLOG_ENQUEUED: NOW,
    }
    assert is_backlog_message(b) and not is_backlog_message(m)
    assert from_backlog(b) == (replace(m, entity="orders"), NOW)


@settings(max_examples=200, deadline=None)
@given(messages(), st.text(min_size=1, max_size=60), ms_datetimes)
def test_backlog_round_trip_is_exact(m: OutboundMessage, entity: str, now: datetime) -> None:
    b = to_backlog(m, entity, now)
    assert b.entity is None
    assert b.session_id is None and b.time_to_live is None
    assert b.scheduled_enqueue_time is None and b.partition_key is None
    for name in ("body", "message_id", "correlation_id", "content_type", "subject", "to", "reply_to"):
        assert getattr(b, name) == getattr(m, name)
    assert b.reply_to_session_id == m.reply_to_session_id
    assert {k: v for k, v in b.properties.items() if k not in RESERVED_PROPERTIES} == m.properties
    assert from_backlog(b) == (replace(m, entity=entity), now)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages(wire_safe=True), st.text(min_size=1, max_size=60), ms_datetimes)
def test_backlog_round_trip_over_the_wire(m: OutboundMessage, entity: str, now: datetime) -> None:
    """What the syphon does: send the backlog form, receive it, restore it."""
    received = over_the_wire(to_backlog(m, entity, now))
    assert is_backlog_message(received)
    restored, enqueued = from_backlog(received)
    assert (restored, enqueued) == (replace(m, entity=entity), now)


def test_is_backlog_message_on_sdk_messages() -> None:
    b = to_backlog(OutboundMessage(b"x", message_id="1"), "q", NOW)
    assert is_backlog_message(b.to_sdk())
    raw = bytes(PyamqpTransport.encode_message(sdk_outgoing(b)))
    assert is_backlog_message(ServiceBusReceivedMessage.from_bytes(raw))
    assert not is_backlog_message(ServiceBusMessage(b"x"))


def test_to_backlog_rejects_reserved_properties_and_validate_accepts_backlog_form() -> None:
    with pytest.raises(RejectError) as e:
        to_backlog(OutboundMessage(b"x", properties={BACKLOG_TTL: 5}), "q", NOW)
    assert e.value.field == f"properties.{BACKLOG_TTL}"
    validate_message(
        to_backlog(OutboundMessage(b"x", session_id="s", time_to_live=timedelta(seconds=1)), "q", NOW), LIMIT
    )


def test_from_backlog_rejects_non_backlog_and_bad_values() -> None:
    with pytest.raises(RejectError) as e:
        from_backlog(OutboundMessage(b"x"))
    assert e.value.field == BACKLOG_PATH
    good = to_backlog(OutboundMessage(b"x"), "q", NOW)
    with pytest.raises(RejectError) as e:
        from_backlog(replace(good, properties={**good.properties, BACKLOG_TTL: "soon"}))
    assert e.value.field == BACKLOG_TTL
    no_enq = {k: v for k, v in good.properties.items() if k != BACKLOG_ENQUEUED}
    with pytest.raises(RejectError) as e:
        from_backlog(replace(good, properties=no_enq))
    assert e.value.field == BACKLOG_ENQUEUED


def test_timestamp_properties_hint_only_when_needed() -> None:
    assert BACKLOG_TIMESTAMP_PROPERTIES not in to_backlog(OutboundMessage(b"x"), "q", NOW).properties
    b = to_backlog(OutboundMessage(b"x", properties={"t": NOW, "z": NOW}), "q", NOW)
    assert json.loads(str(b.properties[BACKLOG_TIMESTAMP_PROPERTIES])) == ["t", "z"]


# --------------------------------------------------------------------------- deterministic ids (S5)
def test_message_id_survives_backlog_round_trip() -> None:
    m = OutboundMessage(b"b", entity="q", session_id="s", time_to_live=timedelta(seconds=3))
    restored, _ = from_backlog(to_backlog(m, "q", NOW))
    assert message_id_from_content(restored) == message_id_from_content(m)
