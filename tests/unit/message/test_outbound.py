"""The message model (:mod:`spark_sb.message.outbound`): :class:`OutboundMessage` (normalised on construction,
picklable, hashable), its SDK mapping (``to_sdk``, :func:`sdk_message`) and its way back from a received message
(``from_received``), :class:`FrozenMap`, :class:`RejectError` and the deterministic message ids (SPEC S5). The SDK
is the oracle: messages are encoded and decoded by it, offline."""

from __future__ import annotations

import pickle
import uuid
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from spark_sb.message.outbound import (
    MAX_TTL_MS,
    FrozenMap,
    OutboundMessage,
    RejectError,
    message_id_from_content,
    sdk_message,
)
from tests.unit.message.test_rows import NOW, UTC, messages, over_the_wire

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# --------------------------------------------------------------------------- OutboundMessage basics
def test_outbound_message_is_picklable_hashable_and_normalised() -> None:
    m = OutboundMessage(
        bytearray(b"abc"),
        time_to_live=timedelta(milliseconds=1500, microseconds=999),
        scheduled_enqueue_time=datetime(2030, 1, 1, 0, 0, 0, 123456),  # naive -> UTC
        properties={"k": 1},
    )
    assert m.body == b"abc" and isinstance(m.body, bytes)
    assert m.time_to_live == timedelta(milliseconds=1500)
    assert m.scheduled_enqueue_time == datetime(2030, 1, 1, 0, 0, 0, 123000, tzinfo=UTC)
    assert isinstance(m.properties, FrozenMap) and m.properties == {"k": 1}
    assert pickle.loads(pickle.dumps(m)) == m
    assert hash(pickle.loads(pickle.dumps(m))) == hash(m)
    with pytest.raises(TypeError):
        m.properties["x"] = 2  # type: ignore[index]


def test_to_sdk_maps_every_field() -> None:
    sched = datetime(2031, 5, 6, 7, 8, 9, 10000, tzinfo=UTC)
    pid = uuid.uuid4()
    m = OutboundMessage(
        "héllo",
        message_id="mid",
        session_id="sess",
        partition_key="sess",
        correlation_id="corr",
        content_type="text/plain",
        subject="subj",
        to="to-addr",
        reply_to="reply-q",
        reply_to_session_id="reply-s",
        time_to_live=timedelta(milliseconds=1500),
        scheduled_enqueue_time=sched,
        properties={"i": 7, "big": 2**40, "f": 1.25, "b": True, "u": pid, "n": None, "s": "x", "t": sched},
    )
    s = m.to_sdk()
    assert b"".join(s.body) == "héllo".encode()
    assert (s.message_id, s.session_id, s.partition_key) == ("mid", "sess", "sess")
    assert (s.correlation_id, s.content_type, s.subject) == ("corr", "text/plain", "subj")
    assert (s.to, s.reply_to, s.reply_to_session_id) == ("to-addr", "reply-q", "reply-s")
    assert s.raw_amqp_message.header is not None
    assert s.raw_amqp_message.header.time_to_live == 1500  # exact ms, unlike the SDK setter (whole seconds)
    assert s.scheduled_enqueue_time_utc == sched
    props = s.application_properties or {}
    assert props["i"] == 7 and props["f"] == 1.25 and props["b"] is True and props["u"] == pid
    assert props["n"] is None and props["s"] == "x" and props["t"] == sched
    assert props["big"] == {"TYPE": "LONG", "VALUE": 2**40}  # AMQP long: beyond the SDK's int32 encoding


def test_wire_round_trip_restores_every_field() -> None:
    sched = datetime(2031, 5, 6, 7, 8, 9, 10000, tzinfo=UTC)
    m = OutboundMessage(
        b"\x00\xffbinary",
        message_id="mid",
        session_id="sess",
        partition_key="sess",
        correlation_id="corr",
        content_type="application/octet-stream",
        subject="subj",
        to="to-addr",
        reply_to="reply-q",
        reply_to_session_id="reply-s",
        time_to_live=timedelta(milliseconds=86_400_001),
        scheduled_enqueue_time=sched,
        properties={
            "i": -5,
            "big": -(2**62),
            "f": -0.5,
            "b": False,
            "u": uuid.UUID(int=7),
            "n": None,
            "s": "é",
        },
    )
    assert over_the_wire(m, entity="q") == replace(m, entity="q")


def test_from_received_string_body_and_received_type_changes() -> None:
    m = OutboundMessage("text body", message_id="1", properties={"raw": b"abc", "when": NOW})
    back = over_the_wire(m)
    assert back.body == b"text body"  # data sections are bytes
    assert back.properties["raw"] == "abc"  # the SDK sends bytes values as strings
    assert back.properties["when"] == 1795262400123  # the SDK decodes timestamps as int ms


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages(wire_safe=True))
def test_wire_round_trip_property(m: OutboundMessage) -> None:
    expected_props = {
        k: ((v - EPOCH) // timedelta(milliseconds=1) if isinstance(v, datetime) else v)
        for k, v in m.properties.items()
    }
    back = over_the_wire(m)
    assert back == replace(m, properties=expected_props)


# --------------------------------------------------------------------------- deterministic ids (S5)
def test_message_id_from_content() -> None:
    m = OutboundMessage(b"body", entity="q", properties={"a": 1, "b": "x"})
    mid = message_id_from_content(m)
    assert len(mid) == 36 and uuid.UUID(mid)
    assert message_id_from_content(OutboundMessage(b"body", entity="q", properties={"b": "x", "a": 1})) == mid
    assert message_id_from_content(replace(m, message_id="ignored")) == mid
    for other in (
        replace(m, body=b"body2"),
        replace(m, body="body"),  # str vs bytes differ
        replace(m, entity="q2"),
        replace(m, properties={"a": 2, "b": "x"}),
        replace(m, properties={"a": "1", "b": "x"}),
        replace(m, session_id="s"),
    ):
        assert message_id_from_content(other) != mid
    # stable across processes and releases: a golden value
    assert mid == message_id_from_content(pickle.loads(pickle.dumps(m)))
    assert mid == "a166e37a-eae1-58d7-8d77-4a1542da3b08"


def test_the_content_id_tells_apart_values_that_differ_only_in_type() -> None:
    base = OutboundMessage(b"body", entity="q")
    variants = [
        replace(base, properties={"a": value})
        for value in (
            1,
            1.0,
            True,
            "1",
            b"1",
            None,
            uuid.UUID(int=1),
            datetime(1970, 1, 1, 0, 0, 0, 1000, tzinfo=UTC),
        )
    ]
    variants += [
        replace(base, time_to_live=timedelta(milliseconds=1)),
        replace(base, scheduled_enqueue_time=datetime(1970, 1, 1, 0, 0, 0, 1000, tzinfo=UTC)),
        base,
    ]
    assert len({message_id_from_content(m) for m in variants}) == len(variants)


def test_the_content_id_covers_every_field_but_the_message_id() -> None:
    base = OutboundMessage(b"body")
    ids = {message_id_from_content(base)}
    for name in (
        "entity",
        "session_id",
        "partition_key",
        "correlation_id",
        "content_type",
        "subject",
        "to",
        "reply_to",
        "reply_to_session_id",
    ):
        ids.add(message_id_from_content(replace(base, **{name: "v"})))
    assert len(ids) == 10
    assert message_id_from_content(replace(base, message_id="v")) == message_id_from_content(base)


# --------------------------------------------------------------------------- FrozenMap
def test_frozen_map_equals_any_mapping_with_the_same_items() -> None:
    frozen = FrozenMap({"a": 1, "b": "x"})
    assert frozen == {"b": "x", "a": 1} and frozen == FrozenMap({"b": "x", "a": 1})
    assert frozen != {"a": 1} and frozen != {"a": 1, "b": "y"} and frozen != FrozenMap({"a": 1})
    assert frozen != [("a", 1), ("b", "x")]  # not a mapping
    assert FrozenMap() == FrozenMap(None) == FrozenMap({}) == {}
    assert len(frozen) == 2 and list(frozen) == ["a", "b"] and "a" in frozen and "z" not in frozen
    assert frozen["b"] == "x"


def test_frozen_map_hashes_by_its_items_whatever_their_order() -> None:
    assert hash(FrozenMap({"a": 1, "b": 2})) == hash(FrozenMap({"b": 2, "a": 1}))
    assert len({FrozenMap({"a": 1, "b": 2}), FrozenMap({"b": 2, "a": 1}), FrozenMap({"a": 2})}) == 2


def test_frozen_map_keeps_a_copy_and_cannot_be_changed() -> None:
    source = {"a": 1}
    frozen = FrozenMap(source)
    source["a"] = 2
    assert frozen == {"a": 1}
    with pytest.raises(TypeError):
        frozen["a"] = 3  # type: ignore[index]
    with pytest.raises(AttributeError):
        frozen.x = 1  # type: ignore[attr-defined]  # slots: no attributes either


def test_frozen_map_pickles_to_an_equal_map() -> None:
    frozen = FrozenMap({"a": 1, "t": datetime(2030, 1, 1, tzinfo=UTC), "u": uuid.UUID(int=3)})
    back = pickle.loads(pickle.dumps(frozen))
    assert type(back) is FrozenMap and back == frozen and hash(back) == hash(frozen)
    assert repr(frozen).startswith("FrozenMap({'a': 1, ")


# --------------------------------------------------------------------------- RejectError
@pytest.mark.parametrize(
    ("field", "text"),
    [("session_id", "session_id: longer than 128"), (None, "longer than 128")],
)
def test_a_reject_error_says_its_field_and_reason_and_pickles(field: str | None, text: str) -> None:
    err = RejectError("longer than 128", field)
    assert isinstance(err, ValueError)
    assert (str(err), err.field, err.reason) == (text, field, "longer than 128")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is RejectError and (str(back), back.field, back.reason) == (text, field, err.reason)


# --------------------------------------------------------------------------- construction
def test_an_aware_scheduled_time_is_made_utc_at_millisecond_precision() -> None:
    plus_two = timezone(timedelta(hours=2))
    m = OutboundMessage(b"x", scheduled_enqueue_time=datetime(2030, 1, 1, 14, 0, 0, 999999, tzinfo=plus_two))
    assert m.scheduled_enqueue_time == datetime(2030, 1, 1, 12, 0, 0, 999000, tzinfo=UTC)
    assert m.scheduled_enqueue_time.tzinfo is timezone.utc


def test_values_already_normal_are_kept_as_given() -> None:
    ttl, when = timedelta(milliseconds=1500), datetime(2030, 1, 1, 12, 0, 0, 123000, tzinfo=UTC)
    props = FrozenMap({"k": 1})
    m = OutboundMessage(b"x", time_to_live=ttl, scheduled_enqueue_time=when, properties=props)
    assert m.time_to_live == ttl and m.scheduled_enqueue_time == when
    assert m.properties is props


@pytest.mark.parametrize("body", [bytearray(b"abc"), memoryview(b"abc")], ids=lambda b: type(b).__name__)
def test_a_buffer_body_becomes_bytes(body: Any) -> None:
    m = OutboundMessage(body)
    assert type(m.body) is bytes and m.body == b"abc"


def test_no_properties_are_one_empty_map() -> None:
    a, b, c = (
        OutboundMessage(b"x"),
        OutboundMessage(b"x", properties={}),
        OutboundMessage(b"x", properties=None),
    )  # type: ignore[arg-type]
    assert a.properties == b.properties == c.properties == {}
    assert a.properties is b.properties is c.properties
    assert isinstance(a.properties, FrozenMap)


# --------------------------------------------------------------------------- SDK mapping
def test_to_sdk_sets_added_properties_on_top_of_the_messages_own() -> None:
    m = OutboundMessage(b"x", properties={"own": 1, "big": 2**40, "both": "mine"})
    added: dict[str | bytes, Any] = {"x-ms-path": "orders", "both": "added"}
    props = m.to_sdk(added).application_properties or {}
    assert props == {
        "own": 1,
        "big": {"TYPE": "LONG", "VALUE": 2**40},
        "both": "added",
        "x-ms-path": "orders",
    }
    assert (OutboundMessage(b"x").to_sdk(added).application_properties or {}) == added
    assert OutboundMessage(b"x").to_sdk().application_properties is None


def test_to_sdk_without_a_time_to_live_leaves_the_header_without_one() -> None:
    header = OutboundMessage(b"x").to_sdk().raw_amqp_message.header
    assert header is None or header.time_to_live is None


@pytest.mark.parametrize("ms", [1, 999, 1001, 59_999, MAX_TTL_MS], ids=str)
def test_the_time_to_live_goes_to_the_header_in_exact_milliseconds(ms: int) -> None:
    m = OutboundMessage(b"x", time_to_live=timedelta(milliseconds=ms))
    out = sdk_message(m, None)
    assert out.raw_amqp_message.header is not None
    assert out.raw_amqp_message.header.time_to_live == ms
    assert over_the_wire(m).time_to_live == timedelta(milliseconds=ms)


def test_sdk_message_takes_the_properties_as_given() -> None:
    m = OutboundMessage(b"x", properties={"mine": 1})
    assert sdk_message(m, None).application_properties is None
    given_props: dict[str | bytes, Any] = {"other": 2}
    assert sdk_message(m, given_props).application_properties == {"other": 2}


# --------------------------------------------------------------------------- from_received
def _received(body: Any = (b"x",), body_type: str = "data", **fields: Any) -> Any:
    """A received message as ``from_received`` reads it: the fields of the SDK's that it reads, nothing else."""
    raw = SimpleNamespace(
        body_type=SimpleNamespace(value=body_type),
        body=body,
        header=fields.pop("header", None),
        annotations=fields.pop("annotations", None),
    )
    names = ("message_id", "session_id", "partition_key", "correlation_id", "content_type", "subject", "to")
    attrs = {n: None for n in (*names, "reply_to", "reply_to_session_id")}
    attrs.update(fields)
    return SimpleNamespace(raw_amqp_message=raw, application_properties=attrs.pop("props", None), **attrs)


@pytest.mark.parametrize(
    ("body_type", "body", "expected"),
    [
        ("data", [b"ab", b"cd"], b"abcd"),
        ("data", b"whole", b"whole"),
        ("value", b"value bytes", b"value bytes"),
        ("value", "value text", "value text"),
        ("value", None, b""),
    ],
)
def test_from_received_takes_data_and_value_bodies(body_type: str, body: Any, expected: bytes | str) -> None:
    assert OutboundMessage.from_received(_received(body, body_type)).body == expected


@pytest.mark.parametrize(("body_type", "body"), [("value", 42), ("sequence", [[1, 2]])])
def test_from_received_refuses_a_body_it_cannot_resend(body_type: str, body: Any) -> None:
    with pytest.raises(RejectError) as caught:
        OutboundMessage.from_received(_received(body, body_type))
    assert caught.value.field == "body" and body_type in caught.value.reason


@pytest.mark.parametrize(
    ("ttl", "expected"),
    [
        (None, None),
        (0, None),
        (1, timedelta(milliseconds=1)),
        (MAX_TTL_MS, timedelta(milliseconds=MAX_TTL_MS)),
        (MAX_TTL_MS + 1, None),  # beyond an AMQP uint: not a time to live to copy
    ],
)
def test_from_received_copies_a_time_to_live_in_range(ttl: int | None, expected: timedelta | None) -> None:
    received = _received(header=SimpleNamespace(time_to_live=ttl))
    assert OutboundMessage.from_received(received).time_to_live == expected


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        (None, None),
        (
            {b"x-opt-scheduled-enqueue-time": 1_700_000_000_123},
            datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC),
        ),
        (
            {"x-opt-scheduled-enqueue-time": 1_700_000_000_123},
            datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC),
        ),
        (
            {b"x-opt-scheduled-enqueue-time": datetime(2030, 1, 1, tzinfo=UTC)},
            datetime(2030, 1, 1, tzinfo=UTC),
        ),
        ({b"x-opt-scheduled-enqueue-time": 0}, None),
        ({b"x-opt-other": 5}, None),
    ],
)
def test_from_received_reads_the_scheduled_time_annotation(
    annotations: dict[Any, Any] | None, expected: datetime | None
) -> None:
    received = _received(annotations=annotations)
    assert OutboundMessage.from_received(received).scheduled_enqueue_time == expected


def test_from_received_decodes_ids_and_property_values() -> None:
    received = _received(
        message_id=b"\xff\x00",
        session_id=b"sess",
        correlation_id=uuid.UUID(int=5),
        subject=7,
        props={
            b"text": b"caf\xc3\xa9",
            b"raw": b"\xff\xfe",
            "n": None,
            "i": 3,
            "u": uuid.UUID(int=1),
            "l": [1, 2],
        },
    )
    m = OutboundMessage.from_received(received, entity="q")
    assert (m.entity, m.message_id, m.session_id) == ("q", "ff00", "sess")  # undecodable bytes: hex
    assert (m.correlation_id, m.subject, m.to) == (str(uuid.UUID(int=5)), "7", None)
    assert m.properties == {
        "text": "café",
        "raw": b"\xff\xfe",  # not UTF-8: kept as bytes
        "n": None,
        "i": 3,
        "u": uuid.UUID(int=1),
        "l": "[1, 2]",  # not a scalar: its text
    }
