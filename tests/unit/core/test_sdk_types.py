"""The azure-servicebus pieces of the hot paths (:mod:`spark_sb.core.sdk_types`): the SDK's message type, looked up
once, and application properties in the SDK's encoding (ints beyond 32 bits as AMQP ``long``), checked against
what the SDK itself encodes and decodes, offline."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceivedMessage
from azure.servicebus._common.utils import transform_outbound_messages
from azure.servicebus._pyamqp.utils import amqp_long_value
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport

from spark_sb.core.sdk_types import INT32_MAX, INT32_MIN, sdk_message_type, sdk_properties


def _sent_and_received(properties: dict[str | bytes, Any] | None) -> dict[bytes, Any]:
    """The application properties of a message the SDK encodes for sending and decodes as received."""
    outgoing = transform_outbound_messages(
        ServiceBusMessage(b"x", application_properties=properties),
        ServiceBusMessage,
        PyamqpTransport.to_outgoing_amqp_message,
    )
    assert isinstance(outgoing, ServiceBusMessage)
    received = ServiceBusReceivedMessage.from_bytes(bytes(PyamqpTransport.encode_message(outgoing)))
    return dict(received.application_properties or {})


def test_sdk_message_type_is_the_sdks_service_bus_message_looked_up_once() -> None:
    assert sdk_message_type() is ServiceBusMessage
    assert sdk_message_type() is sdk_message_type()


def test_the_int32_range_is_the_amqp_int_range() -> None:
    assert (INT32_MIN, INT32_MAX) == (-2147483648, 2147483647)


def test_no_properties_are_none() -> None:
    assert sdk_properties({}) is None
    assert sdk_properties(None) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "value",
    [INT32_MAX + 1, INT32_MIN - 1, 2**40, -(2**62), 2**63 - 1, -(2**63)],
    ids=str,
)
def test_an_int_beyond_32_bits_is_wrapped_as_an_amqp_long(value: int) -> None:
    assert sdk_properties({"n": value}) == {"n": amqp_long_value(value)}
    assert amqp_long_value(value) == {"TYPE": "LONG", "VALUE": value}


@pytest.mark.parametrize(
    "value",
    [
        0,
        INT32_MAX,
        INT32_MIN,
        True,
        False,
        1.5,
        float(2**40),
        "text",
        b"bytes",
        None,
        uuid.UUID(int=7),
        datetime(2030, 1, 1, tzinfo=timezone.utc),
    ],
    ids=repr,
)
def test_every_other_value_is_passed_as_it_is(value: Any) -> None:
    out = sdk_properties({"v": value})
    assert out is not None and out["v"] is value


def test_keys_and_order_are_kept_and_the_input_is_left_alone() -> None:
    props = {"a": 1, "big": 2**40, "z": "x"}
    out = sdk_properties(props)
    assert out is not None and list(out) == ["a", "big", "z"]
    assert props == {"a": 1, "big": 2**40, "z": "x"}
    assert out is not props


def test_the_sdk_refuses_a_64_bit_int_that_is_not_wrapped() -> None:
    """Why the wrapping exists: the SDK encodes a plain Python int as an AMQP int (32 bits)."""
    with pytest.raises(ValueError, match="int"):
        _sent_and_received({"big": 2**40})


def test_the_sdk_sends_and_decodes_the_wrapped_properties_exactly() -> None:
    props = {"big": 2**40, "neg": INT32_MIN - 1, "max": INT32_MAX, "min": INT32_MIN, "f": 0.5, "b": True}
    assert _sent_and_received(sdk_properties(props)) == {k.encode(): v for k, v in props.items()}
