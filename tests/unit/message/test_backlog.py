"""The failed-over hot path (SPEC B6): ``to_backlog_sdk`` builds exactly the SDK message of
``to_backlog(...).to_sdk()``, byte for byte on the wire, for every kind of message."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus._pyamqp._encode import encode_payload
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_sb.message.backlog import (
    BACKLOG_PATH,
    PING_CONTENT_TYPE,
    PROBE_PROPERTY,
    PROBE_SESSION,
    PROBE_SESSION_PREFIX,
    RESERVED_PROPERTIES,
    RETURN_MARKER,
    ReturnMarker,
    from_backlog,
    is_probe,
    to_backlog,
    to_backlog_sdk,
)
from spark_sb.message.outbound import OutboundMessage, RejectError
from spark_sb.message.rows import validate_message

NOW = datetime(2026, 11, 22, 12, 0, 0, 123000, tzinfo=timezone.utc)


def wire(message: ServiceBusMessage) -> bytes:
    out = bytearray()
    encode_payload(out, PyamqpTransport.to_outgoing_amqp_message(message.raw_amqp_message))
    return bytes(out)


texts = st.one_of(st.none(), st.text(min_size=1, max_size=20))
scalars = st.one_of(
    st.text(max_size=10),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.booleans(),
    st.uuids(),
    st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(timezone.utc)
    ),
)
messages = st.builds(
    OutboundMessage,
    body=st.one_of(st.binary(max_size=50), st.text(max_size=50)),
    message_id=st.text(min_size=1, max_size=36).map(str),
    session_id=st.one_of(st.none(), st.text(min_size=1, max_size=10)),
    correlation_id=texts,
    content_type=st.one_of(st.none(), st.sampled_from(["text/plain", "application/json"])),
    subject=texts,
    to=texts,
    reply_to=texts,
    reply_to_session_id=texts,
    time_to_live=st.one_of(st.none(), st.integers(1, 10**9).map(lambda ms: timedelta(milliseconds=ms))),
    properties=st.dictionaries(st.text(min_size=1, max_size=8), scalars, max_size=4),
)


@settings(max_examples=200, deadline=None)
@given(messages)
def test_fast_path_is_the_general_translation_byte_for_byte(msg: OutboundMessage) -> None:
    assert wire(to_backlog_sdk(msg, "orders", NOW)) == wire(to_backlog(msg, "orders", NOW).to_sdk())


def test_the_common_case_takes_the_fast_path_and_carries_the_b6_properties() -> None:
    msg = OutboundMessage(body=b"payload", message_id=str(uuid.uuid4()), properties={"k": "v", "n": 3})
    sdk = to_backlog_sdk(msg, "orders", NOW)
    props = sdk.application_properties or {}
    assert props[BACKLOG_PATH] == "orders" and props["k"] == "v" and props["n"] == 3
    assert props["x-ms-backlog-enqueued-utc"] == NOW
    assert wire(sdk) == wire(to_backlog(msg, "orders", NOW).to_sdk())


def test_a_reserved_property_is_refused_on_the_fast_path_too() -> None:
    msg = OutboundMessage(body=b"x", properties={BACKLOG_PATH: "elsewhere"})
    with pytest.raises(RejectError, match="reserved"):
        to_backlog_sdk(msg, "orders", NOW)


def test_the_return_marker_property_is_reserved_a_user_message_carrying_it_is_a_reject() -> None:
    """The syphon acknowledges and completes a backlog message with ``x-spark-sb-return`` (ordering, R2): a user
    message carrying it would be swallowed. It is refused - by the row checks and by the translation, on both
    paths - as a reject naming the property; only a :class:`ReturnMarker` (the sender's) carries it."""
    assert RETURN_MARKER == "x-spark-sb-return" and RETURN_MARKER in RESERVED_PROPERTIES
    field = f"properties.{RETURN_MARKER}"
    user = OutboundMessage(body=b"x", session_id="s", properties={RETURN_MARKER: "m1"})
    plain = OutboundMessage(body=b"x", properties={RETURN_MARKER: "m1", "k": "v"})
    for translate in (to_backlog, to_backlog_sdk):
        for msg in (user, plain):
            with pytest.raises(RejectError) as err:
                translate(msg, "orders", NOW)
            assert err.value.field == field
    with pytest.raises(RejectError) as err:
        validate_message(plain, 256 * 1024)
    assert err.value.field == field
    marker = ReturnMarker(
        body=b"", message_id="spark-sb-return-m1", session_id="s", properties={RETURN_MARKER: "m1"}
    )
    restored, _ = from_backlog(to_backlog(marker, "orders", NOW))
    assert (
        restored.properties[RETURN_MARKER] == "m1"
        and restored.session_id == "s"
        and restored.entity == "orders"
    )
    assert wire(to_backlog_sdk(marker, "orders", NOW)) == wire(to_backlog(marker, "orders", NOW).to_sdk())


def test_is_probe_reads_an_sdk_messages_amqp_properties_sent_or_received() -> None:
    # sent: the SDK's message; received: its AMQP properties come back as bytes. The probe session and the ping's
    # content type are recognised in both forms (the syphon drops probes), as the probe property is
    def received(
        content_type: bytes | None = None,
        group_id: bytes | None = None,
        props: dict[bytes, Any] | None = None,
    ) -> Any:
        amqp = SimpleNamespace(content_type=content_type, group_id=group_id)
        return SimpleNamespace(
            raw_amqp_message=SimpleNamespace(properties=amqp), application_properties=props
        )

    assert is_probe(ServiceBusMessage(b"", session_id=PROBE_SESSION))
    assert is_probe(ServiceBusMessage(b"", session_id=f"{PROBE_SESSION_PREFIX}orders"))
    assert not is_probe(ServiceBusMessage(b"", session_id="orders-1"))
    assert is_probe(received(content_type=PING_CONTENT_TYPE.encode()))
    assert is_probe(received(group_id=PROBE_SESSION.encode()))
    assert is_probe(received(group_id=f"{PROBE_SESSION_PREFIX}orders".encode()))
    assert is_probe(received(props={PROBE_PROPERTY.encode(): b"schedule-cancel"}))
    assert not is_probe(received(content_type=b"text/plain", group_id=b"orders-1", props={b"k": b"v"}))
    bare = SimpleNamespace(raw_amqp_message=SimpleNamespace(properties=None), application_properties=None)
    assert not is_probe(bare)


# ---------------------------------------------------------------------------------------------------------
# SPEC B14: the time of an ambiguous primary attempt, carried in the backlog form


@settings(max_examples=100, deadline=None)
@given(messages)
def test_an_ambiguous_attempt_is_recorded_alike_on_both_paths_and_stripped_on_the_way_back(
    msg: OutboundMessage,
) -> None:
    from spark_sb.message.backlog import BACKLOG_AMBIGUOUS, ambiguous_attempt

    attempted = NOW - timedelta(minutes=3)
    general = to_backlog(msg, "orders", NOW, attempted)
    assert general.properties[BACKLOG_AMBIGUOUS] == attempted and ambiguous_attempt(general) == attempted
    assert wire(to_backlog_sdk(msg, "orders", NOW, attempted)) == wire(general.to_sdk())
    restored, entered = from_backlog(general)
    assert BACKLOG_AMBIGUOUS not in restored.properties and entered == NOW
    assert restored == from_backlog(to_backlog(msg, "orders", NOW))[0]  # the primary gets what it would have
    assert ambiguous_attempt(to_backlog(msg, "orders", NOW)) is None


def test_the_ambiguous_attempt_is_reserved_and_read_as_it_comes_back_from_a_receive() -> None:
    from spark_sb.message.backlog import BACKLOG_AMBIGUOUS, ambiguous_attempt, backlog_additions

    assert BACKLOG_AMBIGUOUS in RESERVED_PROPERTIES
    with pytest.raises(RejectError) as err:
        to_backlog_sdk(OutboundMessage(body=b"x", properties={BACKLOG_AMBIGUOUS: 1}), "orders", NOW)
    assert err.value.field == f"properties.{BACKLOG_AMBIGUOUS}"
    attempted = datetime(2026, 11, 22, 11, 59, 1, 500000)  # naive: UTC
    added = backlog_additions(OutboundMessage(body=b"x"), "orders", NOW, attempted)
    assert added is not None and added[BACKLOG_AMBIGUOUS] == attempted.replace(tzinfo=timezone.utc)
    received_ms = int(attempted.replace(tzinfo=timezone.utc).timestamp() * 1000)  # the SDK gives int ms back
    back = OutboundMessage(body=b"x", properties={BACKLOG_PATH: "orders", BACKLOG_AMBIGUOUS: received_ms})
    assert ambiguous_attempt(back) == attempted.replace(tzinfo=timezone.utc)
    assert ambiguous_attempt(OutboundMessage(body=b"x", properties={BACKLOG_AMBIGUOUS: "not a time"})) is None
