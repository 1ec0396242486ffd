"""The project-level message model (SPEC B7, S5, S6): :class:`OutboundMessage` and its SDK mapping,
:class:`FrozenMap`, :class:`RejectError` / :class:`Reject` and deterministic message ids.

Pure functions and small picklable dataclasses. They run on executors (per message, on the hot path: keep them
cheap), in the syphon (:meth:`OutboundMessage.from_received`) and in tests. No I/O, no clock reads.
Rows become messages, and are checked, in :mod:`spark_sb.message.rows` (the field checks live there, beside their one
caller); wire sizes are in :mod:`spark_sb.message.wire_size`; the backlog translation (B6) is in :mod:`spark_sb.message.backlog`.
This module imports none of them: it is the floor they stand on.

Decisions taken from the azure-servicebus 7.15 SDK (``_common/message.py``, ``_pyamqp/_encode.py``):

* Application property values: ``str``, ``int`` (64-bit; ints outside the 32-bit range are sent as AMQP
  ``long``), ``float``, ``bool``, ``bytes`` (must be UTF-8: the SDK turns them into strings before sending),
  ``datetime`` (AMQP timestamp, millisecond precision), ``uuid.UUID`` and ``None``. Lists, maps, ``Decimal``,
  ``date`` and the like are rejected. Keys are non-empty strings.
* ``time_to_live`` travels as an AMQP ``uint`` of milliseconds in the header: 1 ms .. 2**32-1 ms (~49.7 days).
  The SDK's own setter truncates to whole seconds; :meth:`OutboundMessage.to_sdk` writes exact milliseconds.
* Timestamps on the wire have millisecond precision, so :class:`OutboundMessage` keeps ``time_to_live`` and
  ``scheduled_enqueue_time`` at millisecond precision (normalised on construction) and scheduled times in UTC.
* Message id, session id, partition key and reply-to session id: at most 128 characters; a partition key must
  equal the session id when both are set.
"""

from __future__ import annotations

import base64
import calendar
import hashlib
import json
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from spark_sb.core.sdk_types import sdk_message_type, sdk_properties

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusMessage, ServiceBusReceivedMessage

__all__ = [
    "MAX_ID_LENGTH",
    "MAX_TTL_MS",
    "FrozenMap",
    "OutboundMessage",
    "Reject",
    "RejectError",
    "Scalar",
    "message_id_from_content",
    "sdk_message",
]

Scalar = str | int | float | bool | bytes | datetime | uuid.UUID | None

MAX_ID_LENGTH = 128  # SDK MESSAGE_PROPERTY_MAX_LENGTH
MAX_TTL_MS = 2**32 - 1  # AMQP header ttl is a uint of milliseconds
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_ONE_MS = timedelta(milliseconds=1)


class FrozenMap(Mapping[str, Any]):
    """An immutable, hashable, picklable mapping (``MappingProxyType`` does not pickle).

    Equal to any mapping with the same items. Runs anywhere.
    """

    __slots__ = ("_d", "_h")

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        self._d: dict[str, Any] = dict(data) if data else {}
        self._h: int | None = None

    def __getitem__(self, key: str) -> Any:
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def __hash__(self) -> int:
        if self._h is None:
            self._h = hash(frozenset(self._d.items()))
        return self._h

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenMap):
            return self._d == other._d
        if isinstance(other, Mapping):
            return self._d == dict(other.items())
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenMap({self._d!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenMap, (self._d,))


_EMPTY = FrozenMap()


class RejectError(ValueError):
    """A row or message that cannot be sent (SPEC S6, B7).

    ``field`` names the offending field or column (``None`` when the message as a whole is at fault, e.g. too
    large); ``reason`` says why. ``str()`` gives ``"<field>: <reason>"``.
    """

    def __init__(self, reason: str, field: str | None = None) -> None:
        self.reason = reason
        self.field = field
        super().__init__(f"{field}: {reason}" if field else reason)

    def __reduce__(self) -> tuple[Any, ...]:
        return (RejectError, (self.reason, self.field))


@dataclass(frozen=True)
class Reject:
    """A row that could not become a message: small and picklable (written to the Delta rejects table).

    ``row_json`` is the original row as JSON (bytes base64, timestamps ISO-8601) with secrets redacted.
    """

    reason: str
    field: str | None
    row_json: str
    entity: str | None
    row_index: int | None = None


def _type_name(value: Any) -> str:
    return type(value).__name__


def _floor_ms(td: timedelta) -> timedelta:
    return timedelta(milliseconds=td // _ONE_MS)


def _utc_ms(dt: datetime) -> datetime:
    """Naive -> UTC; aware -> converted to UTC; microseconds floored to milliseconds."""
    dt = dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)
    us = dt.microsecond
    if us % 1000:
        dt = dt.replace(microsecond=us - us % 1000)
    return dt


def _ms_to_datetime(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


def _datetime_to_ms(dt: datetime) -> int:
    # exactly what the SDK's encode_timestamp computes
    return int((calendar.timegm(dt.utctimetuple()) * 1000) + (dt.microsecond / 1000))


@dataclass(frozen=True, slots=True)
class OutboundMessage:
    """The project-level message: what the sender sends. Picklable, immutable, hashable.

    Built on executors from rows (:func:`row_to_message`) or in the syphon from received messages
    (:meth:`from_received`). ``entity`` ``None`` means the configured default entity. On construction
    ``bytearray`` bodies become ``bytes``, ``properties`` become a :class:`FrozenMap`, ``time_to_live`` is
    floored to whole milliseconds, and ``scheduled_enqueue_time`` is made UTC (naive means UTC) with millisecond
    precision.
    """

    body: bytes | str
    entity: str | None = None
    message_id: str | None = None
    session_id: str | None = None
    partition_key: str | None = None
    correlation_id: str | None = None
    content_type: str | None = None
    subject: str | None = None
    to: str | None = None
    reply_to: str | None = None
    reply_to_session_id: str | None = None
    time_to_live: timedelta | None = None
    scheduled_enqueue_time: datetime | None = None
    properties: Mapping[str, Scalar] = _EMPTY

    def __post_init__(self) -> None:
        if isinstance(self.body, (bytearray, memoryview)):
            object.__setattr__(self, "body", bytes(self.body))
        props = self.properties
        if props is not _EMPTY and (type(props) is not FrozenMap or not props):
            object.__setattr__(self, "properties", FrozenMap(props) if props else _EMPTY)
        ttl = self.time_to_live
        if isinstance(ttl, timedelta) and ttl.microseconds % 1000:
            object.__setattr__(self, "time_to_live", _floor_ms(ttl))
        st = self.scheduled_enqueue_time
        if isinstance(st, datetime) and (st.tzinfo is not timezone.utc or st.microsecond % 1000):
            object.__setattr__(self, "scheduled_enqueue_time", _utc_ms(st))

    # ------------------------------------------------------------------ SDK mapping
    def to_sdk(self, added: Mapping[str | bytes, Any] | None = None) -> ServiceBusMessage:
        """The SDK message with every field mapped exactly (TTL in exact milliseconds); ``added``: application
        properties set on top of the message's own, already in the SDK's encoding (the backlog form's destination
        and time, :func:`~spark_sb.message.backlog.backlog_additions`). Runs on executors."""
        props = self.properties
        if added:
            return sdk_message(self, {**((sdk_properties(props) or {}) if props else {}), **added})
        return sdk_message(self, None if props is _EMPTY else sdk_properties(props))

    @classmethod
    def from_received(cls, msg: ServiceBusReceivedMessage, entity: str | None = None) -> OutboundMessage:
        """The message as it should be re-sent (the syphon), from a received SDK message.

        Data bodies are joined into ``bytes``; string property values (which the SDK hands back as
        ``bytes``) become ``str``; AMQP timestamps in application properties stay ``int`` milliseconds
        (the SDK does not keep the type; :func:`from_backlog` restores backlog-recorded ones). Broker-set
        fields (sequence number, lock token, enqueued time, delivery count) are not copied.
        """
        raw = msg.raw_amqp_message
        body: bytes | str
        body_type = getattr(raw.body_type, "value", raw.body_type)
        if body_type == "data":
            parts = raw.body
            body = parts if isinstance(parts, bytes) else b"".join(parts)
        elif raw.body is None:
            body = b""
        elif isinstance(raw.body, (bytes, str)):
            body = raw.body
        else:
            raise RejectError(f"unsupported AMQP body type {body_type}", "body")
        ttl: timedelta | None = None
        if raw.header is not None and raw.header.time_to_live:
            ms = int(raw.header.time_to_live)
            if 0 < ms <= MAX_TTL_MS:
                ttl = timedelta(milliseconds=ms)
        scheduled: datetime | None = None
        annotations = raw.annotations or {}
        raw_sched = annotations.get(
            b"x-opt-scheduled-enqueue-time", annotations.get("x-opt-scheduled-enqueue-time")
        )
        if isinstance(raw_sched, int) and raw_sched > 0:
            scheduled = _ms_to_datetime(raw_sched)
        elif isinstance(raw_sched, datetime):
            scheduled = raw_sched
        props: dict[str, Scalar] = {}
        for k, v in (msg.application_properties or {}).items():
            key = k.decode("utf-8") if isinstance(k, bytes) else str(k)
            props[key] = _decode_received_value(v)
        return cls(
            body=body,
            entity=entity,
            message_id=_str_or_none(msg.message_id),
            session_id=_str_or_none(msg.session_id),
            partition_key=_str_or_none(msg.partition_key),
            correlation_id=_str_or_none(msg.correlation_id),
            content_type=_str_or_none(msg.content_type),
            subject=_str_or_none(msg.subject),
            to=_str_or_none(msg.to),
            reply_to=_str_or_none(msg.reply_to),
            reply_to_session_id=_str_or_none(msg.reply_to_session_id),
            time_to_live=ttl,
            scheduled_enqueue_time=scheduled,
            properties=props,
        )


def sdk_message(
    msg: OutboundMessage, application_properties: dict[str | bytes, Any] | None
) -> ServiceBusMessage:
    """The SDK message of ``msg``'s fields, with ``application_properties`` as given (already in the SDK's
    encoding, :func:`~spark_sb.core.sdk_types.sdk_properties`): the one place an :class:`OutboundMessage` is mapped
    onto a ``ServiceBusMessage`` field by field. :meth:`OutboundMessage.to_sdk` gives it the message's own
    properties, :func:`~spark_sb.message.backlog.to_backlog_sdk` the backlog form's. The TTL goes into the header in
    exact milliseconds (the SDK's own setter truncates to whole seconds). Runs on executors, per message."""
    out = sdk_message_type()(
        msg.body,
        application_properties=application_properties,
        session_id=msg.session_id,
        message_id=msg.message_id,
        scheduled_enqueue_time_utc=msg.scheduled_enqueue_time,
        content_type=msg.content_type,
        correlation_id=msg.correlation_id,
        subject=msg.subject,
        partition_key=msg.partition_key,
        to=msg.to,
        reply_to=msg.reply_to,
        reply_to_session_id=msg.reply_to_session_id,
    )
    if msg.time_to_live is not None:
        header = out.raw_amqp_message.header
        assert header is not None  # ServiceBusMessage always builds one
        header.time_to_live = msg.time_to_live // _ONE_MS
    return out


def _str_or_none(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value.hex()
    return str(value)


def _decode_received_value(value: Any) -> Scalar:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    if value is None or isinstance(value, (str, int, float, bool, datetime, uuid.UUID)):
        return value
    return str(value)


# ---------------------------------------------------------------------- field checks
# ---------------------------------------------------------------------- deterministic ids (S5)
def _canon(value: Any) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, bytes):
        return ["b", base64.b64encode(value).decode("ascii")]
    if isinstance(value, int):
        return ["i", str(value)]
    if isinstance(value, float):
        return ["f", value.hex()]
    if isinstance(value, datetime):
        return ["t", _datetime_to_ms(value)]
    if isinstance(value, timedelta):
        return ["d", value // _ONE_MS]
    if isinstance(value, uuid.UUID):
        return ["u", str(value)]
    return ["r", repr(value)]


def message_id_from_content(msg: OutboundMessage) -> str:
    """A deterministic message id (UUID text, 36 chars) from the message content (SPEC S5).

    Covers the body, the entity and every other field except ``message_id`` itself, including all
    application properties; stable across processes and Python versions. Two rows with identical content
    get the same id, so duplicate detection drops the second: give such rows an explicit id column.
    """
    doc = [
        [f.name, _canon(getattr(msg, f.name))]
        for f in fields(msg)
        if f.name not in ("message_id", "properties")
    ]
    doc.append(["properties", sorted([k, _canon(v)] for k, v in msg.properties.items())])
    digest = hashlib.sha256(
        json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    ).digest()
    return str(uuid.UUID(bytes=digest[:16], version=5))
