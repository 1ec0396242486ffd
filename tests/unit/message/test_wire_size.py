"""Wire sizes (:mod:`spark_sb.message.wire_size`, SPEC B7): :func:`encoded_size` is the size of the AMQP message the
SDK encodes from ``msg.to_sdk()`` and :func:`batch_cost` what adding it to a ``ServiceBusMessageBatch`` costs, both
computed without the SDK and compared here with what the SDK itself counts, offline."""

from __future__ import annotations

import uuid
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessageBatch
from hypothesis import HealthCheck, given, settings

from spark_sb.message.outbound import OutboundMessage, RejectError
from spark_sb.message.wire_size import (
    BATCH_OVERHEAD_LARGE,
    BATCH_OVERHEAD_SMALL,
    batch_cost,
    batch_overhead,
    encoded_size,
)
from tests.unit.message.test_rows import NOW, messages, sdk_encoded_size


def sdk_batch_cost(msg: OutboundMessage) -> int:
    batch = ServiceBusMessageBatch(max_size_in_bytes=4 * 1024 * 1024)
    before = batch.size_in_bytes
    batch.add_message(msg.to_sdk())
    return batch.size_in_bytes - before


# --------------------------------------------------------------------------- encoded size (B7)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages())
def test_encoded_size_equals_sdk(m: OutboundMessage) -> None:
    assert encoded_size(m) == sdk_encoded_size(m)
    assert batch_cost(m) == sdk_batch_cost(m)


@pytest.mark.parametrize(
    "m",
    [
        OutboundMessage(b""),
        OutboundMessage(""),
        OutboundMessage(b"x" * 255, message_id="a" * 128),
        OutboundMessage(b"x" * 256, time_to_live=timedelta(milliseconds=255)),
        OutboundMessage(b"x" * 70000, time_to_live=timedelta(milliseconds=256), subject="s" * 300),
        OutboundMessage(b"x", properties={f"k{i}": i for i in range(200)}),
        OutboundMessage(b"x", properties={"k": "v" * 250}),
        OutboundMessage(b"x", partition_key="p" * 128, scheduled_enqueue_time=NOW),
        OutboundMessage(b"x", properties={"small": 127, "neg": -128, "i32": 2**31 - 1, "i64": 2**31}),
    ],
    ids=lambda m: f"body{len(m.body)}-props{len(m.properties)}",
)
def test_encoded_size_boundaries(m: OutboundMessage) -> None:
    assert encoded_size(m) == sdk_encoded_size(m)
    assert batch_cost(m) == sdk_batch_cost(m)


def test_encoded_size_is_fast() -> None:
    import time

    m = OutboundMessage(b"x" * 200, message_id="id", properties={"a": 1, "b": "two"})
    t0 = time.perf_counter()
    for _ in range(2000):
        encoded_size(m)
    ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(200):
        sdk_encoded_size(m)
    sdk = (time.perf_counter() - t0) * 10
    assert ours < sdk / 3, (ours, sdk)


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        "",
        "é",
        "v" * 253,
        "v" * 254,
        "v" * 255,
        "v" * 256,
        b"",
        b"\x00" * 256,
        0,
        127,
        128,
        -128,
        -129,
        2**31 - 1,
        2**31,
        -(2**31),
        -(2**31) - 1,
        2**63 - 1,
        -(2**63),
        0.0,
        -1.5e300,
        NOW,
        uuid.UUID(int=9),
    ],
    ids=lambda v: f"{type(v).__name__}-{len(v) if isinstance(v, (str, bytes)) else v!r}"[:40],
)
def test_each_property_value_is_counted_as_the_sdk_encodes_it(value: Any) -> None:
    m = OutboundMessage(b"x", message_id="m", properties={"k": value})
    assert encoded_size(m) == sdk_encoded_size(m)


@pytest.mark.parametrize("n", range(245, 262))
def test_lengths_around_the_one_byte_length_limits_are_counted_as_the_sdk_counts(n: int) -> None:
    """Strings and binaries of up to 255 bytes have a one-byte length, lists and maps of a payload up to 254
    bytes too; past them, four bytes. ``n`` walks a body, a string field and a property map across them."""
    for m in (
        OutboundMessage(b"b" * n, message_id="m"),
        OutboundMessage(b"x", message_id="m", subject="s" * n),
        OutboundMessage(b"x", message_id="m", properties={"k": "v" * (n - 5)}),
        OutboundMessage(b"x", message_id="m", partition_key="p" * (n - 150)),
    ):
        assert encoded_size(m) == sdk_encoded_size(m)


def test_text_is_counted_in_utf8_bytes_not_characters() -> None:
    text = OutboundMessage("é" * 200, message_id="m", subject="ü" * 100, properties={"ключ": "значение"})
    same_bytes = OutboundMessage(
        b"x" * 400, message_id="m", subject="u" * 200, properties={"k" * 8: "v" * 16}
    )
    assert encoded_size(text) == encoded_size(same_bytes) == sdk_encoded_size(text)


def test_a_message_without_an_id_is_counted_with_the_36_character_id_the_sdk_assigns() -> None:
    m = OutboundMessage(b"x", session_id="s")
    assert encoded_size(m) == encoded_size(OutboundMessage(b"x", session_id="s", message_id="i" * 36))
    assert encoded_size(m) == sdk_encoded_size(m)


@pytest.mark.parametrize(
    ("size", "overhead"),
    [(0, 5), (1, 5), (255, 5), (256, 8), (257, 8), (262144, 8)],
)
def test_a_batch_adds_5_bytes_to_a_message_under_256_bytes_and_8_from_256(size: int, overhead: int) -> None:
    assert (BATCH_OVERHEAD_SMALL, BATCH_OVERHEAD_LARGE) == (5, 8)
    assert batch_overhead(size) == overhead


@pytest.mark.parametrize("target", [254, 255, 256, 257])
def test_batch_cost_is_the_encoded_size_and_its_overhead_as_the_sdks_batch_counts(target: int) -> None:
    empty = encoded_size(OutboundMessage(b"", message_id="m"))
    m = OutboundMessage(b"b" * (target - empty), message_id="m")
    assert encoded_size(m) == target
    assert batch_cost(m) == target + (5 if target < 256 else 8) == sdk_batch_cost(m)


@pytest.mark.parametrize(
    "value",
    [[1, 2], {"a": 1}, Decimal("1.5"), date(2030, 1, 1), timedelta(seconds=1), (1,)],
    ids=lambda v: type(v).__name__,
)
def test_a_property_value_of_a_type_the_sdk_cannot_send_is_a_reject(value: Any) -> None:
    with pytest.raises(RejectError) as caught:
        encoded_size(OutboundMessage(b"x", properties={"k": value}))
    assert caught.value.field == "properties"
    assert caught.value.reason == f"unsupported property value type {type(value).__name__}"
