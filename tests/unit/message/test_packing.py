"""spark_sb.message.packing: adding to the SDK's ServiceBusMessageBatch with one encoding gives the SDK's own batch - the
same bytes, size, count and envelope, and the same point where a message no longer fits - for every message shape
the product sends (primary and backlog form)."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any
from unittest import mock

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusMessageBatch
from azure.servicebus.exceptions import MessageSizeExceededError
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_sb.message import packing
from spark_sb.message.backlog import RESERVED_PROPERTIES, backlog_additions, to_backlog_sdk
from spark_sb.message.outbound import OutboundMessage
from spark_sb.message.packing import add_encoded, add_outbound, add_to_batch, encode, fast_path_available
from spark_sb.wire.sdk_batch import SdkBatch
from spark_sb.wire.transport import SECONDARY, Target

UTC = timezone.utc
NOW = datetime(2026, 11, 26, 7, 0, 0, 123000, tzinfo=UTC)
text = st.text(min_size=1, max_size=40)
maybe = st.one_of(st.none(), text)
scalars = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.booleans(),
    st.text(max_size=30),
    st.text(max_size=10).map(str.encode),  # bytes values: the SDK sends them as UTF-8 text
    st.uuids(),
    st.none(),
    st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)).map(
        lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000)
    ),
)
_messages = st.builds(
    OutboundMessage,
    body=st.one_of(st.binary(max_size=3000), st.text(max_size=300)),
    entity=st.just("q"),
    message_id=text,
    session_id=maybe,
    partition_key=maybe,
    correlation_id=maybe,
    content_type=maybe,
    subject=maybe,
    to=maybe,
    reply_to=maybe,
    reply_to_session_id=maybe,
    time_to_live=st.one_of(st.none(), st.integers(1, 10**9).map(lambda ms: timedelta(milliseconds=ms))),
    scheduled_enqueue_time=st.one_of(st.none(), st.just(NOW + timedelta(hours=1))),
    properties=st.dictionaries(
        st.text(min_size=1, max_size=20).filter(lambda k: k not in RESERVED_PROPERTIES), scalars, max_size=5
    ),
)
# The service wants a partition key equal to the session id when both are set (the SDK refuses others).
messages = _messages.map(
    lambda m: m if m.session_id is None or m.partition_key is None else replace(m, partition_key=m.session_id)
)


def _state(batch: ServiceBusMessageBatch) -> tuple[Any, ...]:
    envelope = batch._message
    return (
        [bytes(b) for b in envelope[5]],
        batch._size,
        batch._count,
        len(batch._messages),
        envelope[2],  # message annotations of the envelope (partition key)
        envelope[3],  # properties of the envelope (message / session id)
    )


def _sdk_add(batch: ServiceBusMessageBatch, message: ServiceBusMessage) -> bool:
    try:
        batch.add_message(message)
    except MessageSizeExceededError:
        return False
    return True


@contextmanager
def _one_second() -> Iterator[None]:
    """The SDK stamps a message with a time to live with the current second (``time.mktime``), once when it is
    built and again when it is encoded: both sides of a comparison must see the same second, or one that crosses
    a second boundary between them differs in its creation time (a rare failure of these tests until this)."""
    with mock.patch("time.mktime", lambda _t: 1_790_000_000.0):
        yield


def _fill(
    add: Any, msgs: list[OutboundMessage], limit: int, backlog: bool
) -> tuple[ServiceBusMessageBatch, list[bool]]:
    batch = ServiceBusMessageBatch(max_size_in_bytes=limit)
    fits = []
    with _one_second():
        for m in msgs:
            sdk = to_backlog_sdk(m, "orders", NOW) if backlog else m.to_sdk()
            fits.append(add(batch, sdk))
    return batch, fits


def test_this_sdk_is_one_the_fast_path_follows() -> None:
    assert fast_path_available()  # the pinned SDK: if this fails, packing silently lost its one encoding


@settings(max_examples=50, deadline=None)
@given(msgs=st.lists(messages, min_size=1, max_size=12), limit=st.integers(400, 20000), backlog=st.booleans())
def test_one_encoding_gives_the_sdks_own_batch(
    msgs: list[OutboundMessage], limit: int, backlog: bool
) -> None:
    theirs, their_fits = _fill(_sdk_add, msgs, limit, backlog)
    ours, our_fits = _fill(add_to_batch, msgs, limit, backlog)
    assert our_fits == their_fits
    assert _state(ours) == _state(theirs)


def test_a_batch_fills_to_the_same_message_and_byte() -> None:
    msgs = [OutboundMessage(body=b"x" * (i * 37 % 500), message_id=f"m{i}", entity="q") for i in range(2000)]
    theirs, their_fits = _fill(_sdk_add, msgs, 262144, backlog=False)
    ours, our_fits = _fill(add_to_batch, msgs, 262144, backlog=False)
    assert False in our_fits  # the batch did fill up
    assert our_fits == their_fits and _state(ours) == _state(theirs)


def test_an_sdk_it_does_not_follow_gets_the_public_add_message(monkeypatch: pytest.MonkeyPatch) -> None:
    # _FAST / _DIRECT too, so that the teardown restores what the real SDK gives (not this test's None)
    monkeypatch.setattr(packing, "_FAST", packing._FAST)
    monkeypatch.setattr(packing, "_DIRECT", packing._DIRECT)
    monkeypatch.setattr(packing, "TRIED", ("6.0",))
    monkeypatch.setattr(packing, "_LOOKED", False)
    calls: list[int] = []
    real = ServiceBusMessageBatch.add_message

    def counted(self: ServiceBusMessageBatch, message: Any) -> None:
        calls.append(1)
        real(self, message)

    monkeypatch.setattr(ServiceBusMessageBatch, "add_message", counted)
    batch = ServiceBusMessageBatch(max_size_in_bytes=1000)
    assert not fast_path_available()
    assert add_to_batch(batch, OutboundMessage(body=b"a", message_id="1").to_sdk())
    assert not add_to_batch(batch, OutboundMessage(body=b"b" * 2000, message_id="2").to_sdk())
    assert calls == [1, 1] and len(batch) == 1
    monkeypatch.setattr(packing, "_LOOKED", False)  # the next test looks again


@settings(max_examples=30, deadline=None)
@given(msgs=st.lists(messages, min_size=1, max_size=12), limit=st.integers(400, 20000), backlog=st.booleans())
def test_a_message_encoded_ahead_is_added_as_the_sdk_adds_it(
    msgs: list[OutboundMessage], limit: int, backlog: bool
) -> None:
    assert fast_path_available()
    theirs, their_fits = _fill(_sdk_add, msgs, limit, backlog)
    ours, our_fits = _fill(lambda b, m: add_encoded(b, encode(m)), msgs, limit, backlog)
    assert our_fits == their_fits
    assert _state(ours) == _state(theirs)


# ------------------------------------------------------------------ add_outbound: no SDK message in between
@contextmanager
def _uuids() -> Iterator[None]:
    """uuid4 as a counter, so that the message id the SDK (and add_outbound) give a message without one is the
    same on both sides."""
    count = itertools.count()
    with mock.patch("uuid.uuid4", lambda: uuid.UUID(int=next(count))), _one_second():
        yield


def _fill_each(add: Any, msgs: list[OutboundMessage], limit: int) -> tuple[ServiceBusMessageBatch, list[Any]]:
    """``add(batch, message)`` for each message (ids and TTL stamps made the same on both sides): whether each
    fitted, or the type of the error it raised."""
    batch = ServiceBusMessageBatch(max_size_in_bytes=limit)
    fits: list[Any] = []
    with _uuids():
        for m in msgs:
            try:
                fits.append(add(batch, m))
            except (ValueError, TypeError) as exc:
                fits.append(type(exc))
    return batch, fits


def _fill_outbound(msgs: list[OutboundMessage], limit: int) -> tuple[ServiceBusMessageBatch, list[Any]]:
    return _fill_each(add_outbound, msgs, limit)


def _fill_sdk(msgs: list[OutboundMessage], limit: int) -> tuple[ServiceBusMessageBatch, list[Any]]:
    return _fill_each(lambda batch, m: _sdk_add(batch, m.to_sdk()), msgs, limit)


plain = st.builds(
    lambda m, no_id, str_body: replace(
        m,
        time_to_live=None,
        scheduled_enqueue_time=None,
        message_id=None if no_id else m.message_id,
        body=m.body.decode("latin-1") if str_body and isinstance(m.body, bytes) else m.body,
    ),
    messages,
    st.booleans(),
    st.booleans(),
)


@settings(max_examples=80, deadline=None)
@given(msgs=st.lists(st.one_of(plain, messages), min_size=1, max_size=12), limit=st.integers(400, 20000))
def test_a_message_built_without_the_sdk_message_gives_the_sdks_own_batch(
    msgs: list[OutboundMessage], limit: int
) -> None:
    """Every shape: the plain ones (no TTL, no schedule; ids or none; str or bytes bodies; properties) are built
    straight into pyamqp's message, the others go the SDK's way; the batch is byte for byte the SDK's."""
    assert fast_path_available()
    theirs, their_fits = _fill_sdk(msgs, limit)
    ours, our_fits = _fill_outbound(msgs, limit)
    assert our_fits == their_fits
    assert _state(ours) == _state(theirs)


def test_messages_the_sdk_refuses_are_refused_the_same_way() -> None:
    long = "x" * 129
    refused = [
        OutboundMessage(body=b"a", message_id=long),
        OutboundMessage(body=b"a", message_id="1", session_id=long),
        OutboundMessage(body=b"a", message_id="1", partition_key=long),
        OutboundMessage(body=b"a", message_id="1", session_id="s", partition_key="p"),
    ]
    theirs, their_fits = _fill_sdk(refused, 10000)
    ours, our_fits = _fill_outbound(refused, 10000)
    assert their_fits == [ValueError] * 4
    not_utf8 = [OutboundMessage(body=b"a", message_id="1", properties={"k": b"\x80"})]
    assert _fill_outbound(not_utf8, 10000)[1] == _fill_sdk(not_utf8, 10000)[1] == [UnicodeDecodeError]
    assert our_fits == their_fits and _state(ours) == _state(theirs)


def test_a_plain_message_skips_the_sdk_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of add_outbound: a plain message never becomes a ServiceBusMessage (half its CPU)."""
    monkeypatch.setattr(OutboundMessage, "to_sdk", lambda self: pytest.fail("built a ServiceBusMessage"))
    batch = ServiceBusMessageBatch(max_size_in_bytes=10000)
    assert add_outbound(batch, OutboundMessage(body=b"a", message_id="1", properties={"k": 1}))
    assert len(batch) == 1


def _fill_backlog(
    add: Any, msgs: list[OutboundMessage], limit: int
) -> tuple[ServiceBusMessageBatch, list[Any]]:
    return _fill_each(lambda batch, m: add(batch, m), msgs, limit)


@settings(max_examples=80, deadline=None)
@given(msgs=st.lists(st.one_of(plain, messages), min_size=1, max_size=12), limit=st.integers(400, 20000))
def test_the_backlog_form_built_without_the_sdk_message_gives_the_sdks_own_batch(
    msgs: list[OutboundMessage], limit: int
) -> None:
    """The failed-over hot path: a message with nothing to clear (:func:`backlog_additions` not None) is packed
    as its own fields plus the two backlog properties, byte for byte the SDK's batch of ``to_backlog_sdk``; the
    others keep the SDK's way."""
    assert fast_path_available()
    theirs, their_fits = _fill_backlog(
        lambda b, m: _sdk_add(b, to_backlog_sdk(m, "orders", NOW)), msgs, limit
    )

    def ours_add(batch: ServiceBusMessageBatch, m: OutboundMessage) -> bool:
        added = backlog_additions(m, "orders", NOW)
        if added is None:
            return add_to_batch(batch, to_backlog_sdk(m, "orders", NOW))
        return add_outbound(batch, m, added)

    ours, our_fits = _fill_backlog(ours_add, msgs, limit)
    assert our_fits == their_fits
    assert _state(ours) == _state(theirs)


@settings(max_examples=80, deadline=None)
@given(
    msgs=st.lists(
        st.tuples(
            st.one_of(plain.map(lambda m: replace(m, properties={})), plain, messages), st.sampled_from("abc")
        ),
        min_size=1,
        max_size=16,
    ),
    limit=st.integers(400, 20000),
)
def test_a_backlog_batch_of_several_entities_encodes_their_properties_once_and_gives_the_sdks_own_batch(
    msgs: list[tuple[OutboundMessage, str]], limit: int
) -> None:
    """The transport's backlog batch encodes the two backlog properties once per entity (for the messages with
    no properties of their own) and splices them in: byte for byte the SDK's batch of ``to_backlog_sdk``, with
    the messages of several entities interleaved, some with properties of their own, some not."""
    assert fast_path_available()
    originals = [m for m, _ in msgs]
    entity_of = {id(m): e for m, e in msgs}
    theirs, their_fits = _fill_backlog(
        lambda b, m: _sdk_add(b, to_backlog_sdk(m, f"orders-{entity_of[id(m)]}", NOW)), originals, limit
    )
    wrapped: dict[int, SdkBatch] = {}

    def ours_add(batch: ServiceBusMessageBatch, m: OutboundMessage) -> bool:
        sdk = wrapped.setdefault(
            id(batch), SdkBatch(Target(SECONDARY, "primary/x-servicebus-transfer/0"), batch)
        )
        return sdk.try_add_backlog(m, f"orders-{entity_of[id(m)]}", NOW)

    ours, our_fits = _fill_backlog(ours_add, originals, limit)
    assert our_fits == their_fits
    assert _state(ours) == _state(theirs)


def test_a_backlog_batch_encodes_an_entitys_two_properties_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of the section: 50 property-less messages of two entities, two encodings of the properties."""
    made: list[Any] = []
    real = packing.application_section
    monkeypatch.setattr(
        "spark_sb.wire.sdk_batch.application_section", lambda added: made.append(added) or real(added)
    )
    batch = SdkBatch(Target(SECONDARY, "q"), ServiceBusMessageBatch(max_size_in_bytes=262144))
    for k in range(50):
        assert batch.try_add_backlog(OutboundMessage(body=b"x" * 200), f"e{k % 2}", NOW)
    assert [a["x-ms-path"] for a in made] == ["e0", "e1"]
    assert len(batch) == 50


def test_the_common_backlog_form_skips_the_sdk_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain message diverted to the backlog never becomes a ServiceBusMessage (a third of its CPU)."""
    import spark_sb.message.outbound as outbound

    monkeypatch.setattr(outbound, "sdk_message", lambda *a: pytest.fail("built a ServiceBusMessage"))
    batch = ServiceBusMessageBatch(max_size_in_bytes=10000)
    m = OutboundMessage(body=b"a", message_id="1", properties={"k": 1})
    added = backlog_additions(m, "orders", NOW)
    assert added is not None and set(added) == {"x-ms-path", "x-ms-backlog-enqueued-utc"}
    assert add_outbound(batch, m, added)
    assert backlog_additions(replace(m, session_id="s"), "orders", NOW) is None  # a session id to record
