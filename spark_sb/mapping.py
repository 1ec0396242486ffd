"""Rows -> project messages -> SDK messages (SPEC S2, B7, S5, S6); the backlog translation (B6) is in
:mod:`spark_sb.backlog`.

Pure functions and small picklable dataclasses. They run on executors (per row, on the hot path: keep them
cheap), in the syphon (``from_received``) and in tests. No I/O, no clock reads: the caller
passes ``now``.

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
from dataclasses import dataclass, field, fields, replace
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any

# from_backlog, is_backlog_message, to_backlog: re-exported for spark_sb/syphon.py and the syphon tests, which
# import them from here; their home is spark_sb.backlog. To be removed once those import spark_sb.backlog.
from spark_sb.backlog import BACKLOG_PATH, RESERVED_PROPERTIES
from spark_sb.backlog import from_backlog as from_backlog
from spark_sb.backlog import is_backlog_message as is_backlog_message
from spark_sb.backlog import to_backlog as to_backlog
from spark_sb.redact import redact

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusMessage, ServiceBusReceivedMessage

__all__ = [
    "JSON_CONTENT_TYPE",
    "LOGICAL_COLUMNS",
    "MAX_ID_LENGTH",
    "MAX_TTL_MS",
    "FrozenMap",
    "OutboundMessage",
    "Reject",
    "RejectError",
    "Scalar",
    "SchemaError",
    "batch_cost",
    "batch_overhead",
    "encoded_size",
    "message_id_from_content",
    "row_to_json",
    "row_to_message",
    "validate_schema",
]

Scalar = str | int | float | bool | bytes | datetime | uuid.UUID | None

#: SPEC S2 logical column names (the keys of ``columns``; the defaults map each to itself).
LOGICAL_COLUMNS: tuple[str, ...] = (
    "body",
    "entity",
    "message_id",
    "session_id",
    "partition_key",
    "correlation_id",
    "content_type",
    "subject",
    "to",
    "reply_to",
    "reply_to_session_id",
    "time_to_live",
    "scheduled_enqueue_time",
    "properties",
)

MAX_ID_LENGTH = 128  # SDK MESSAGE_PROPERTY_MAX_LENGTH
MAX_TTL_MS = 2**32 - 1  # AMQP header ttl is a uint of milliseconds
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
#: Bytes a message adds to a ``ServiceBusMessageBatch`` on top of its own encoded size (SDK
#: ``_BATCH_MESSAGE_OVERHEAD_COST``): 5 when the encoded message is < 256 bytes, else 8.
BATCH_OVERHEAD_SMALL, BATCH_OVERHEAD_LARGE = 5, 8
JSON_CONTENT_TYPE = "application/json"
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

    @classmethod
    def from_error(
        cls, row: Any, error: RejectError, entity: str | None = None, row_index: int | None = None
    ) -> Reject:
        """Build the reject record for ``row`` that failed with ``error``."""
        return cls(
            reason=redact(error.reason),
            field=error.field,
            row_json=row_to_json(row),
            entity=entity,
            row_index=row_index,
        )


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


@dataclass(frozen=True)
class OutboundMessage:
    """The project-level message: what the sender sends. Picklable, immutable, hashable.

    Built on executors from rows (:func:`row_to_message`) or in the syphon from received messages
    (:meth:`from_received`). ``entity`` ``None`` means the configured default entity. On construction
    ``bytearray`` bodies become ``bytes``, ``time_to_live`` is floored to whole milliseconds, and
    ``scheduled_enqueue_time`` is made UTC (naive means UTC) with millisecond precision.
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
    properties: Mapping[str, Scalar] = field(default_factory=lambda: _EMPTY)

    def __post_init__(self) -> None:
        if isinstance(self.body, (bytearray, memoryview)):
            object.__setattr__(self, "body", bytes(self.body))
        if not isinstance(self.properties, FrozenMap):
            object.__setattr__(self, "properties", FrozenMap(self.properties) if self.properties else _EMPTY)
        ttl = self.time_to_live
        if isinstance(ttl, timedelta) and ttl.microseconds % 1000:
            object.__setattr__(self, "time_to_live", _floor_ms(ttl))
        st = self.scheduled_enqueue_time
        if isinstance(st, datetime) and (st.tzinfo is not timezone.utc or st.microsecond % 1000):
            object.__setattr__(self, "scheduled_enqueue_time", _utc_ms(st))

    # ------------------------------------------------------------------ SDK mapping
    def to_sdk(self) -> ServiceBusMessage:
        """The SDK message with every field mapped exactly (TTL in exact milliseconds). Runs on executors."""
        from azure.servicebus import ServiceBusMessage

        msg = ServiceBusMessage(
            self.body,
            application_properties=_sdk_properties(self.properties),
            session_id=self.session_id,
            message_id=self.message_id,
            scheduled_enqueue_time_utc=self.scheduled_enqueue_time,
            content_type=self.content_type,
            correlation_id=self.correlation_id,
            subject=self.subject,
            partition_key=self.partition_key,
            to=self.to,
            reply_to=self.reply_to,
            reply_to_session_id=self.reply_to_session_id,
        )
        if self.time_to_live is not None:
            header = msg.raw_amqp_message.header
            assert header is not None  # ServiceBusMessage always builds one
            header.time_to_live = self.time_to_live // _ONE_MS
        return msg

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

    # ------------------------------------------------------------------ validation
    def validate(self, max_message_size: int) -> None:
        """Raise :class:`RejectError` if the message cannot be sent (types, lengths, size > the limit)."""
        _check_fields(self)
        size = encoded_size(self)
        if size > max_message_size:
            raise RejectError(
                f"message too large: {size} bytes encoded, over the limit of {max_message_size} bytes"
            )


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


def _sdk_properties(props: Mapping[str, Scalar]) -> dict[str | bytes, Any] | None:
    if not props:
        return None
    from azure.servicebus._pyamqp.utils import amqp_long_value

    out: dict[str | bytes, Any] = {}
    for k, v in props.items():
        if isinstance(v, int) and not isinstance(v, bool) and not (_INT32_MIN <= v <= _INT32_MAX):
            out[k] = amqp_long_value(v)
        else:
            out[k] = v
    return out


# ---------------------------------------------------------------------- field checks
_STR_FIELDS = ("correlation_id", "content_type", "subject", "to", "reply_to")
_ID_FIELDS = ("message_id", "session_id", "partition_key", "reply_to_session_id")


def _check_property(name: Any, value: Any, allow_reserved: bool = False) -> None:
    if not isinstance(name, str) or not name:
        raise RejectError(f"property names must be non-empty strings, found {name!r}", "properties")
    if name in RESERVED_PROPERTIES and not allow_reserved:
        raise RejectError(
            f"property name {name!r} is reserved for the backlog translation", f"properties.{name}"
        )
    if value is None or isinstance(value, (str, bool, float, uuid.UUID, datetime)):
        return
    if isinstance(value, int):
        if not (_INT64_MIN <= value <= _INT64_MAX):
            raise RejectError("integer out of the 64-bit range", f"properties.{name}")
        return
    if isinstance(value, bytes):
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            raise RejectError(
                "bytes values must be UTF-8 (the SDK sends them as strings)", f"properties.{name}"
            ) from None
        return
    raise RejectError(
        f"unsupported property value type {_type_name(value)} "
        "(allowed: str, int, float, bool, bytes, datetime, uuid, None)",
        f"properties.{name}",
    )


def _check_fields(m: OutboundMessage) -> None:
    if not isinstance(m.body, (str, bytes)):
        raise RejectError(f"expected str or bytes, found {_type_name(m.body)}", "body")
    if m.entity is not None and (not isinstance(m.entity, str) or not m.entity):
        raise RejectError(f"expected a non-empty str, found {m.entity!r}", "entity")
    for name in _ID_FIELDS:
        v = getattr(m, name)
        if v is None:
            continue
        if not isinstance(v, str):
            raise RejectError(f"expected str, found {_type_name(v)}", name)
        if len(v) > MAX_ID_LENGTH:
            raise RejectError(f"longer than {MAX_ID_LENGTH} characters ({len(v)})", name)
    if m.message_id == "":
        raise RejectError("must not be empty", "message_id")
    for name in _STR_FIELDS:
        v = getattr(m, name)
        if v is not None and not isinstance(v, str):
            raise RejectError(f"expected str, found {_type_name(v)}", name)
    if m.content_type is not None and not m.content_type.isascii():
        raise RejectError("must be ASCII (it is an AMQP symbol)", "content_type")
    if m.partition_key and m.session_id is not None and m.partition_key != m.session_id:
        raise RejectError("must equal session_id when both are set", "partition_key")
    ttl = m.time_to_live
    if ttl is not None:
        if not isinstance(ttl, timedelta):
            raise RejectError(f"expected timedelta, found {_type_name(ttl)}", "time_to_live")
        ms = ttl // _ONE_MS
        if ms <= 0:
            raise RejectError("must be at least 1 millisecond", "time_to_live")
        if ms > MAX_TTL_MS:
            raise RejectError(f"at most {MAX_TTL_MS} ms (~49.7 days), found {ms} ms", "time_to_live")
    st = m.scheduled_enqueue_time
    if st is not None and not isinstance(st, datetime):
        raise RejectError(f"expected datetime, found {_type_name(st)}", "scheduled_enqueue_time")
    if not isinstance(m.properties, Mapping):
        raise RejectError(f"expected a map, found {_type_name(m.properties)}", "properties")
    backlog_form = BACKLOG_PATH in m.properties  # reserved names are fine in a translated message
    for k, v in m.properties.items():
        _check_property(k, v, backlog_form)


# ---------------------------------------------------------------------- encoded size
def _vsize(n: int) -> int:
    """Encoded size of a string/binary/symbol of ``n`` bytes (constructor + length + data)."""
    return n + 2 if n <= 255 else n + 5


def _compound(payload: int, count: int) -> int:
    """Encoded size of a list/map with ``count`` elements and ``payload`` bytes of elements."""
    return payload + 3 if (count <= 255 and payload < 255) else payload + 9


def _value_size(v: Any) -> int:
    if v is None:
        return 1
    if isinstance(v, bool):
        return 2
    if isinstance(v, str):
        return _vsize(len(v.encode("utf-8")))
    if isinstance(v, bytes):
        return _vsize(len(v))
    if isinstance(v, int):
        if -128 <= v <= 127:
            return 2
        return 5 if _INT32_MIN <= v <= _INT32_MAX else 9
    if isinstance(v, (float, datetime)):
        return 9
    if isinstance(v, uuid.UUID):
        return 17
    raise RejectError(f"unsupported property value type {_type_name(v)}", "properties")


def _opt_str(v: str | None) -> int:
    return 1 if v is None else _vsize(len(v.encode("utf-8")))


_SCHEDULED_ANNOTATION_SIZE = _vsize(len("x-opt-scheduled-enqueue-time")) + 9
_PARTITION_KEY_SYMBOL_SIZE = _vsize(len("x-opt-partition-key"))
_SECTION = 3  # described-type constructor 0x00 + smallulong descriptor


def encoded_size(msg: OutboundMessage) -> int:
    """Bytes of the AMQP message the SDK builds from ``msg.to_sdk()`` (``get_message_encoded_size``).

    A fast arithmetic mirror of the SDK's pyamqp encoder (proven equal in tests/unit/test_mapping.py).
    ``ServiceBusMessageBatch.add_message`` counts this plus :func:`batch_overhead`. A message without a
    message id is counted with the 36-character UUID id the SDK assigns. Runs per message on executors.
    """
    body = msg.body
    n = len(body) if isinstance(body, bytes) else len(body.encode("utf-8"))
    size = _SECTION + _vsize(n)
    ttl = msg.time_to_live
    if ttl is not None:
        ms = ttl // _ONE_MS
        # header: list of 5 fields, 4 null, ttl uint (0 / smalluint / uint)
        size += _SECTION + 3 + 4 + (1 if ms == 0 else 2 if ms <= 255 else 5)
    # message annotations
    ann_payload = 0
    ann_count = 0
    if msg.scheduled_enqueue_time is not None:
        ann_payload += _SCHEDULED_ANNOTATION_SIZE
        ann_count += 2
    if msg.partition_key is not None:
        ann_payload += _PARTITION_KEY_SYMBOL_SIZE + _opt_str(msg.partition_key)
        ann_count += 2
    if ann_count:
        size += _SECTION + _compound(ann_payload, ann_count)
    # properties (always present: the SDK always sets a message id)
    mid = msg.message_id
    p = (
        (38 if mid is None else _opt_str(mid))
        + 1  # user_id
        + _opt_str(msg.to)
        + _opt_str(msg.subject)
        + _opt_str(msg.reply_to)
        + _opt_str(msg.correlation_id)
        + _opt_str(msg.content_type)
        + 1  # content_encoding
        + (18 if ttl is not None else 2)  # absolute_expiry_time, creation_time
        + _opt_str(msg.session_id)
        + 1  # group_sequence
        + _opt_str(msg.reply_to_session_id)
    )
    size += _SECTION + _compound(p, 13)
    props = msg.properties
    if props:
        ap = 0
        for k, v in props.items():
            ap += _vsize(len(k.encode("utf-8"))) + _value_size(v)
        size += _SECTION + _compound(ap, 2 * len(props))
    return size


def batch_overhead(size: int) -> int:
    """What ``ServiceBusMessageBatch`` adds on top of a message of encoded ``size`` (5 or 8 bytes)."""
    return BATCH_OVERHEAD_SMALL if size < 256 else BATCH_OVERHEAD_LARGE


def batch_cost(msg: OutboundMessage) -> int:
    """Bytes that adding ``msg`` to a ``ServiceBusMessageBatch`` adds to ``batch.size_in_bytes``."""
    size = encoded_size(msg)
    return size + batch_overhead(size)


# ---------------------------------------------------------------------- rows (S2)
def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, (Decimal, uuid.UUID)):
        return str(value)
    if hasattr(value, "asDict"):
        return value.asDict(recursive=True)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return repr(value)


def _as_plain(value: Any) -> Any:
    """pyspark Rows (tuples with ``asDict``) -> dicts, recursively; other values unchanged."""
    if hasattr(value, "asDict"):
        return value.asDict(recursive=True)
    return value


def row_to_json(row: Any) -> str:
    """The row as JSON for the rejects table: bytes base64, timestamps ISO-8601, secrets redacted."""
    try:
        text = json.dumps(_as_plain(row), default=_json_default, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        text = json.dumps({"repr": repr(row)})
    return redact(text)


def _row_get(row: Any, name: str) -> tuple[bool, Any]:
    if isinstance(row, Mapping):
        if name in row:
            return True, row[name]
        return False, None
    fields_ = getattr(row, "__fields__", None)
    if fields_ is not None:
        if name in fields_:
            return True, row[name]
        return False, None
    raise RejectError(f"rows must be mappings or pyspark Rows, found {_type_name(row)}", None)


def _opt_col(row: Any, columns: Mapping[str, str], logical: str) -> Any:
    present, value = _row_get(row, columns.get(logical, logical))
    return value if present else None


def _col_str(row: Any, columns: Mapping[str, str], logical: str) -> str | None:
    value = _opt_col(row, columns, logical)
    if value is None or isinstance(value, str):
        return value
    raise RejectError(f"expected string, found {_type_name(value)}", columns.get(logical, logical))


def _to_ttl(value: Any, col: str) -> timedelta | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise RejectError(f"expected milliseconds or an interval, found {_type_name(value)}", col)
    if isinstance(value, timedelta):
        td = _floor_ms(value)
    elif isinstance(value, (int, float, Decimal)):
        if value != value or value in (float("inf"), float("-inf")):  # NaN / inf
            raise RejectError(f"not a finite number of milliseconds: {value}", col)
        if value > MAX_TTL_MS:
            raise RejectError(f"at most {MAX_TTL_MS} ms (~49.7 days), found {value} ms", col)
        td = timedelta(milliseconds=int(value))
    else:
        raise RejectError(f"expected milliseconds or an interval, found {_type_name(value)}", col)
    if td <= timedelta(0):
        raise RejectError(f"must be > 0, found {value}", col)
    return td


def _to_properties(value: Any, col: str) -> dict[str, Scalar]:
    if value is None:
        return {}
    if hasattr(value, "asDict"):
        value = value.asDict(recursive=False)
    if isinstance(value, Mapping):
        items = value.items()
    elif isinstance(value, list) and all(isinstance(i, tuple) and len(i) == 2 for i in value):
        items = value  # type: ignore[assignment]
    else:
        raise RejectError(f"expected a map of scalar values, found {_type_name(value)}", col)
    out: dict[str, Scalar] = {}
    for k, v in items:
        if isinstance(v, bytearray):
            v = bytes(v)
        elif isinstance(v, datetime):
            v = v.replace(tzinfo=timezone.utc) if v.tzinfo is None else v.astimezone(timezone.utc)
        _check_property(k, v)
        out[k] = v
    return out


def row_to_message(
    row: Any,
    columns: Mapping[str, str],
    default_entity: str | None,
    max_message_size: int,
    message_id_mode: str = "column",
) -> OutboundMessage:
    """Map one row (a mapping or a pyspark ``Row``) to a validated :class:`OutboundMessage` (SPEC S2).

    ``columns`` maps S2 logical names to the row's column names (missing keys: the logical name). Raises
    :class:`RejectError` naming the column and the type found. With ``message_id_mode="content"`` a row without
    a message id gets :func:`message_id_from_content` (stable across task retries and replays, S5). Runs on
    executors, once per row.
    """
    body_col = columns.get("body", "body")
    present, raw_body = _row_get(row, body_col)
    if not present:
        raise RejectError(f"missing body column {body_col!r}", body_col)
    content_type = _col_str(row, columns, "content_type")
    body: str | bytes
    if isinstance(raw_body, str):
        body = raw_body
    elif isinstance(raw_body, (bytes, bytearray, memoryview)):
        body = bytes(raw_body)
    elif isinstance(raw_body, (Mapping, list)) or hasattr(raw_body, "asDict"):
        try:
            body = json.dumps(
                _as_plain(raw_body), default=_json_default, separators=(",", ":"), ensure_ascii=False
            )
        except (TypeError, ValueError) as exc:
            raise RejectError(f"cannot serialize as JSON: {exc}", body_col) from None
        if content_type is None:
            content_type = JSON_CONTENT_TYPE
    elif raw_body is None:
        raise RejectError("body is null", body_col)
    else:
        raise RejectError(f"expected string, binary, struct or map, found {_type_name(raw_body)}", body_col)
    entity = _col_str(row, columns, "entity") or default_entity
    if not entity:
        raise RejectError("no entity: the row has none and no default entity is configured", "entity")
    sched_col = columns.get("scheduled_enqueue_time", "scheduled_enqueue_time")
    scheduled = _opt_col(row, columns, "scheduled_enqueue_time")
    if scheduled is not None and not isinstance(scheduled, datetime):
        raise RejectError(f"expected timestamp, found {_type_name(scheduled)}", sched_col)
    ttl_col = columns.get("time_to_live", "time_to_live")
    msg = OutboundMessage(
        body=body,
        entity=entity,
        message_id=_col_str(row, columns, "message_id"),
        session_id=_col_str(row, columns, "session_id"),
        partition_key=_col_str(row, columns, "partition_key"),
        correlation_id=_col_str(row, columns, "correlation_id"),
        content_type=content_type,
        subject=_col_str(row, columns, "subject"),
        to=_col_str(row, columns, "to"),
        reply_to=_col_str(row, columns, "reply_to"),
        reply_to_session_id=_col_str(row, columns, "reply_to_session_id"),
        time_to_live=_to_ttl(_opt_col(row, columns, "time_to_live"), ttl_col),
        scheduled_enqueue_time=scheduled,
        properties=_to_properties(
            _opt_col(row, columns, "properties"), columns.get("properties", "properties")
        ),
    )
    if msg.message_id is None and message_id_mode == "content":
        msg = replace(msg, message_id=message_id_from_content(msg))
    try:
        msg.validate(max_message_size)
    except RejectError as err:
        if err.field in LOGICAL_COLUMNS and err.field != columns.get(err.field, err.field):
            raise RejectError(err.reason, columns[err.field]) from None
        raise
    return msg


class SchemaError(ValueError):
    """A DataFrame schema that cannot be mapped to messages (SPEC S2); ``column`` names the column."""

    def __init__(self, column: str, reason: str) -> None:
        self.column = column
        self.reason = reason
        super().__init__(f"column {column!r}: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (SchemaError, (self.column, self.reason))


_NON_STRING_COLUMNS = frozenset({"body", "time_to_live", "scheduled_enqueue_time", "properties"})
_STRING_COLUMNS = tuple(c for c in LOGICAL_COLUMNS if c not in _NON_STRING_COLUMNS)


def validate_schema(schema: Any, columns: Mapping[str, str]) -> None:
    """Check a pyspark ``StructType`` against SPEC S2 before any row is read; raises :class:`SchemaError`
    naming the column and the type found. Runs on the driver (at the first batch).

    ``body``: string, binary, struct, map or array (the last three as JSON); the id/address columns:
    string; ``time_to_live``: integral/fractional milliseconds or a day-time interval;
    ``scheduled_enqueue_time``: timestamp; ``properties``: map<string, scalar>. Absent optional columns are
    fine; extra columns are ignored.
    """
    from pyspark.sql import types as T

    by_name = {f.name: f.dataType for f in schema.fields}

    def col(logical: str) -> str:
        return columns.get(logical, logical)

    def found(dt: Any) -> str:
        return str(dt.simpleString())

    body = col("body")
    if body not in by_name:
        raise SchemaError(body, f"the body column is missing (columns: {', '.join(by_name) or 'none'})")
    if not isinstance(by_name[body], (T.StringType, T.BinaryType, T.StructType, T.MapType, T.ArrayType)):
        raise SchemaError(
            body, f"expected string, binary, struct, map or array, found {found(by_name[body])}"
        )
    for logical in _STRING_COLUMNS:
        dt = by_name.get(col(logical))
        if dt is not None and not isinstance(dt, T.StringType):
            raise SchemaError(col(logical), f"expected string, found {found(dt)}")
    dt = by_name.get(col("time_to_live"))
    if dt is not None and not isinstance(dt, (T.IntegralType, T.FractionalType, T.DayTimeIntervalType)):
        raise SchemaError(
            col("time_to_live"), f"expected milliseconds or a day-time interval, found {found(dt)}"
        )
    dt = by_name.get(col("scheduled_enqueue_time"))
    if dt is not None and not isinstance(dt, (T.TimestampType, T.TimestampNTZType)):
        raise SchemaError(col("scheduled_enqueue_time"), f"expected timestamp, found {found(dt)}")
    dt = by_name.get(col("properties"))
    if dt is not None:
        scalar = (
            T.StringType,
            T.IntegralType,
            T.FloatType,
            T.DoubleType,
            T.BooleanType,
            T.BinaryType,
            T.TimestampType,
            T.TimestampNTZType,
        )
        if (
            not isinstance(dt, T.MapType)
            or not isinstance(dt.keyType, T.StringType)
            or not isinstance(dt.valueType, scalar)
        ):
            raise SchemaError(
                col("properties"),
                "expected map<string, string|integral|float|double|boolean|binary|timestamp>, "
                f"found {found(dt)}",
            )


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
