"""AMQP 1.0 type codec, message sections and frame sniffing for the local Service Bus namespace.

Pure functions and small value classes, no sockets and no proton: the broker (``servicebus_local.broker``)
keeps every message as the bytes the client sent and this module splits them into sections, reads the few
fields the broker needs, and renders a delivery by re-encoding only the header and the message annotations.
The network side (``servicebus_local.server``) uses :class:`FrameSniffer` to learn each transfer's
``message-format`` (proton's engine does not expose it) so that batched sends (format ``0x80013700``, a body
of data sections each holding one encoded message) are told apart from single messages.

Runs inside the local namespace (its server thread, or the caller's thread for direct broker use).

Decoded representation: ``str`` (str8/32), :class:`Symbol` (sym8/32), ``bytes`` (binary), ``int``
(all integer widths), ``float``, ``bool``, ``None``, :class:`Timestamp` (milliseconds since the epoch),
``uuid.UUID``, ``list`` (list and array), ``dict`` (map), :class:`Described`.
"""

from __future__ import annotations

import contextlib
import struct
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeAlias

__all__ = [
    "BATCH_FORMAT",
    "AmqpDecodeError",
    "Array",
    "Described",
    "FrameSniffer",
    "Long",
    "MessageParts",
    "Symbol",
    "Timestamp",
    "UInt",
    "decode_value",
    "encode_message",
    "encode_reply",
    "message_sections",
    "encode_value",
    "parse_message",
    "split_batch",
]

Buf: TypeAlias = "bytes | bytearray | memoryview"

#: Message format of a batched transfer (a body of data sections, each one encoded message).
BATCH_FORMAT = 0x80013700

# Section descriptor codes.
HEADER = 0x70
DELIVERY_ANNOTATIONS = 0x71
MESSAGE_ANNOTATIONS = 0x72
PROPERTIES = 0x73
APPLICATION_PROPERTIES = 0x74
DATA = 0x75
AMQP_SEQUENCE = 0x76
AMQP_VALUE = 0x77
FOOTER = 0x78

_SECTION_NAMES = {
    "amqp:header:list": HEADER,
    "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    "amqp:properties:list": PROPERTIES,
    "amqp:application-properties:map": APPLICATION_PROPERTIES,
    "amqp:data:binary": DATA,
    "amqp:amqp-sequence:list": AMQP_SEQUENCE,
    "amqp:amqp-value:*": AMQP_VALUE,
    "amqp:footer:map": FOOTER,
}


class AmqpDecodeError(ValueError):
    """The bytes are not valid AMQP 1.0 encoding (or use a construct this codec does not read)."""


class Symbol(str):
    """An AMQP symbol (encoded as sym8/sym32, not as a string)."""

    __slots__ = ()


class Timestamp(int):
    """An AMQP timestamp: milliseconds since the Unix epoch (UTC)."""

    __slots__ = ()

    @classmethod
    def from_datetime(cls, value: datetime) -> Timestamp:
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return cls(round(value.timestamp() * 1000))


class Long(int):
    """Force the ``long`` encoding of an integer."""

    __slots__ = ()


class UInt(int):
    """Force the ``uint`` encoding of an integer."""

    __slots__ = ()


class Array(list):  # type: ignore[type-arg]
    """An AMQP array (all elements of one type). ``element`` names the type: long, uuid, string, symbol,
    binary, timestamp, int, uint."""

    def __init__(self, items: Iterable[Any] = (), element: str = "long") -> None:
        super().__init__(items)
        self.element = element


@dataclass(frozen=True)
class Described:
    """A described value (descriptor, value)."""

    descriptor: Any
    value: Any


# ---------------------------------------------------------------------------------------------------------
# decoding

_unpack_from = struct.unpack_from
_FIXED_WIDTH = {
    0x40: 0, 0x41: 0, 0x42: 0, 0x43: 0, 0x44: 0, 0x45: 0,
    0x50: 1, 0x51: 1, 0x52: 1, 0x53: 1, 0x54: 1, 0x55: 1, 0x56: 1,
    0x60: 2, 0x61: 2,
    0x70: 4, 0x71: 4, 0x72: 4, 0x73: 4, 0x74: 4,
    0x80: 8, 0x81: 8, 0x82: 8, 0x83: 8, 0x84: 8,
    0x94: 16, 0x98: 16,
}  # fmt: skip


def skip_value(buf: Buf, pos: int) -> int:
    """Position just after the encoded value starting at ``pos``."""
    code = buf[pos]
    pos += 1
    if code == 0x00:
        pos = skip_value(buf, pos)
        return skip_value(buf, pos)
    width = _FIXED_WIDTH.get(code)
    if width is not None:
        return pos + width
    high = code & 0xF0
    if high in (0xA0, 0xC0, 0xE0):
        return pos + 1 + buf[pos]
    if high in (0xB0, 0xD0, 0xF0):
        return pos + 4 + _unpack_from(">I", buf, pos)[0]
    raise AmqpDecodeError(f"unknown AMQP constructor 0x{code:02x}")


def decode_value(buf: Buf, pos: int = 0) -> tuple[Any, int]:
    """Decode one value at ``pos``; returns (value, position after it)."""
    code = buf[pos]
    pos += 1
    if code == 0x40:
        return None, pos
    if code == 0xA1:
        n = buf[pos]
        return bytes(buf[pos + 1 : pos + 1 + n]).decode("utf-8"), pos + 1 + n
    if code == 0xA3:
        n = buf[pos]
        return Symbol(bytes(buf[pos + 1 : pos + 1 + n]).decode("ascii")), pos + 1 + n
    if code == 0xA0:
        n = buf[pos]
        return bytes(buf[pos + 1 : pos + 1 + n]), pos + 1 + n
    if code == 0x41:
        return True, pos
    if code == 0x42:
        return False, pos
    if code == 0x56:
        return buf[pos] != 0, pos + 1
    if code in (0x43, 0x44):
        return 0, pos
    if code in (0x50, 0x52, 0x53):
        return buf[pos], pos + 1
    if code in (0x51, 0x54, 0x55):
        return _unpack_from(">b", buf, pos)[0], pos + 1
    if code == 0x60:
        return _unpack_from(">H", buf, pos)[0], pos + 2
    if code == 0x61:
        return _unpack_from(">h", buf, pos)[0], pos + 2
    if code == 0x70:
        return _unpack_from(">I", buf, pos)[0], pos + 4
    if code == 0x71:
        return _unpack_from(">i", buf, pos)[0], pos + 4
    if code == 0x80:
        return _unpack_from(">Q", buf, pos)[0], pos + 8
    if code == 0x81:
        return _unpack_from(">q", buf, pos)[0], pos + 8
    if code == 0x72:
        return _unpack_from(">f", buf, pos)[0], pos + 4
    if code == 0x82:
        return _unpack_from(">d", buf, pos)[0], pos + 8
    if code == 0x83:
        return Timestamp(_unpack_from(">q", buf, pos)[0]), pos + 8
    if code == 0x98:
        return uuid.UUID(bytes=bytes(buf[pos : pos + 16])), pos + 16
    if code == 0x73:
        return chr(_unpack_from(">I", buf, pos)[0]), pos + 4
    if code in (0x74, 0x84, 0x94):
        width = _FIXED_WIDTH[code]
        return bytes(buf[pos : pos + width]), pos + width
    if code == 0xB1:
        n = _unpack_from(">I", buf, pos)[0]
        return bytes(buf[pos + 4 : pos + 4 + n]).decode("utf-8"), pos + 4 + n
    if code == 0xB3:
        n = _unpack_from(">I", buf, pos)[0]
        return Symbol(bytes(buf[pos + 4 : pos + 4 + n]).decode("ascii")), pos + 4 + n
    if code == 0xB0:
        n = _unpack_from(">I", buf, pos)[0]
        return bytes(buf[pos + 4 : pos + 4 + n]), pos + 4 + n
    if code == 0x45:
        return [], pos
    if code in (0xC0, 0xC1, 0xD0, 0xD1):
        if code in (0xC0, 0xC1):
            size, count = buf[pos], buf[pos + 1]
            start, end = pos + 2, pos + 1 + size
        else:
            size, count = _unpack_from(">II", buf, pos)
            start, end = pos + 8, pos + 4 + size
        items = []
        p = start
        for _ in range(count):
            v, p = decode_value(buf, p)
            items.append(v)
        if p != end:
            raise AmqpDecodeError("compound size does not match its contents")
        if code in (0xC1, 0xD1):
            return dict(zip(items[0::2], items[1::2], strict=True)), end
        return items, end
    if code in (0xE0, 0xF0):
        if code == 0xE0:
            size, count = buf[pos], buf[pos + 1]
            p, end = pos + 2, pos + 1 + size
        else:
            size, count = _unpack_from(">II", buf, pos)
            p, end = pos + 8, pos + 4 + size
        return _decode_array_items(buf, p, count), end
    if code == 0x00:
        descriptor, pos = decode_value(buf, pos)
        value, pos = decode_value(buf, pos)
        return Described(descriptor, value), pos
    raise AmqpDecodeError(f"unknown AMQP constructor 0x{code:02x}")


def _decode_array_items(buf: Buf, p: int, count: int) -> list[Any]:
    ctor = buf[p]
    if ctor == 0x00:
        descriptor, p2 = decode_value(buf, p + 1)
        return [Described(descriptor, v) for v in _decode_array_items(buf, p2, count)]
    p += 1
    out: list[Any] = []
    prefix = bytes((ctor,))
    width = _FIXED_WIDTH.get(ctor)
    for _ in range(count):
        # Each element is encoded without its constructor: decode it behind a copy of the constructor.
        if width is not None:
            n = width
        elif ctor & 0xF0 in (0xA0, 0xC0, 0xE0):
            n = 1 + buf[p]
        else:
            n = 4 + _unpack_from(">I", buf, p)[0]
        value, _ = decode_value(prefix + bytes(buf[p : p + n]), 0)
        out.append(value)
        p += n
    return out


# ---------------------------------------------------------------------------------------------------------
# encoding

_pack = struct.pack


def _enc_str(code8: int, code32: int, data: bytes) -> bytes:
    n = len(data)
    if n < 256:
        return bytes((code8, n)) + data
    return _pack(">BI", code32, n) + data


def encode_value(value: Any) -> bytes:
    """Encode a Python value with the natural AMQP type (see the module docstring for the mapping)."""
    if value is None:
        return b"\x40"
    t = type(value)
    if t is str:
        return _enc_str(0xA1, 0xB1, value.encode("utf-8"))
    if t is Symbol:
        return _enc_str(0xA3, 0xB3, value.encode("ascii"))
    if t is bool:
        return b"\x41" if value else b"\x42"
    if t is Timestamp:
        return _pack(">Bq", 0x83, value)
    if t is UInt:
        return _pack(">BI", 0x70, value)
    if t is Long or t is int:
        if -128 <= value <= 127:
            return _pack(">Bb", 0x55, value)
        if -(2**63) <= value < 2**63:
            return _pack(">Bq", 0x81, value)
        return _pack(">BQ", 0x80, value)
    if t is float:
        return _pack(">Bd", 0x82, value)
    if t is bytes or t is bytearray or t is memoryview:
        return _enc_str(0xA0, 0xB0, bytes(value))
    if t is uuid.UUID:
        return b"\x98" + value.bytes
    if isinstance(value, datetime):
        return _pack(">Bq", 0x83, Timestamp.from_datetime(value))
    if t is Array:
        return _encode_array(value)
    if isinstance(value, Mapping):
        return _encode_compound(0xD1, [x for kv in value.items() for x in kv])
    if isinstance(value, list | tuple):
        return _encode_compound(0xD0, list(value))
    if t is Described:
        return b"\x00" + encode_value(value.descriptor) + encode_value(value.value)
    if isinstance(value, Symbol):
        return _enc_str(0xA3, 0xB3, value.encode("ascii"))
    if isinstance(value, str):
        return _enc_str(0xA1, 0xB1, value.encode("utf-8"))
    if isinstance(value, int):
        return _pack(">Bq", 0x81, value)
    raise TypeError(f"cannot encode {t.__name__} as AMQP")


def _encode_compound(code32: int, items: list[Any]) -> bytes:
    body = b"".join(encode_value(v) for v in items)
    return _pack(">BII", code32, len(body) + 4, len(items)) + body


_ARRAY_ELEMENTS = {
    "long": (0x81, lambda v: _pack(">q", v)),
    "int": (0x71, lambda v: _pack(">i", v)),
    "uint": (0x70, lambda v: _pack(">I", v)),
    "timestamp": (0x83, lambda v: _pack(">q", v)),
    "uuid": (0x98, lambda v: v.bytes),
    "string": (0xB1, lambda v: _pack(">I", len(v.encode("utf-8"))) + v.encode("utf-8")),
    "symbol": (0xB3, lambda v: _pack(">I", len(v)) + v.encode("ascii")),
    "binary": (0xB0, lambda v: _pack(">I", len(v)) + bytes(v)),
}


def _encode_array(value: Array) -> bytes:
    ctor, enc = _ARRAY_ELEMENTS[value.element]
    body = bytes((ctor,)) + b"".join(enc(v) for v in value)
    return _pack(">BII", 0xF0, len(body) + 4, len(value)) + body


def encode_map_entries(entries: Mapping[Any, Any]) -> tuple[bytes, int]:
    """Encoded key/value pairs of a map (without the map constructor) and their item count."""
    return b"".join(encode_value(k) + encode_value(v) for k, v in entries.items()), 2 * len(entries)


def _map_from_entries(raw_entries: bytes, count: int) -> bytes:
    return _pack(">BII", 0xD1, len(raw_entries) + 4, count) + raw_entries


def _section(code: int, value_bytes: bytes) -> bytes:
    return bytes((0x00, 0x53, code)) + value_bytes


# ---------------------------------------------------------------------------------------------------------
# messages


def _read_descriptor(buf: Buf, pos: int) -> tuple[int, int]:
    if buf[pos] != 0x00:
        raise AmqpDecodeError("a message section must be a described value")
    code = buf[pos + 1]
    if code == 0x53:
        return buf[pos + 2], pos + 3
    if code == 0x80:
        return _unpack_from(">Q", buf, pos + 2)[0], pos + 10
    if code in (0xA3, 0xB3):
        name, p = decode_value(buf, pos + 1)
        if name not in _SECTION_NAMES:
            raise AmqpDecodeError(f"unknown message section {name!r}")
        return _SECTION_NAMES[name], p
    if code in (0x44, 0x43):
        raise AmqpDecodeError("unknown message section descriptor 0")
    raise AmqpDecodeError(f"unsupported section descriptor constructor 0x{code:02x}")


def iter_sections(buf: Buf) -> list[tuple[int, int, int, int]]:
    """Sections of an encoded message: (descriptor code, section start, value start, end)."""
    out = []
    pos = 0
    n = len(buf)
    last = 0
    seen_da = False
    while pos < n:
        code, vpos = _read_descriptor(buf, pos)
        if code < HEADER or code > FOOTER:
            raise AmqpDecodeError(f"unknown message section 0x{code:x}")
        if code == DELIVERY_ANNOTATIONS and not seen_da:
            # The SDK writes delivery annotations last (after the body and footer); the service takes them
            # anywhere, once.
            seen_da = True
        elif code < last or (code == last and code not in (DATA, AMQP_SEQUENCE)):
            raise AmqpDecodeError("message sections out of order")
        else:
            last = code
        end = skip_value(buf, vpos)
        if end > n:
            raise AmqpDecodeError("truncated message section")
        out.append((code, pos, vpos, end))
        pos = end
    return out


def _map_entries(buf: Buf, vpos: int) -> tuple[memoryview, int]:
    """Raw entries and item count of the map encoded at ``vpos``."""
    code = buf[vpos]
    mv = memoryview(buf)
    if code == 0xC1:
        size, count = buf[vpos + 1], buf[vpos + 2]
        return mv[vpos + 3 : vpos + 2 + size], count
    if code == 0xD1:
        size, count = _unpack_from(">II", buf, vpos + 1)
        return mv[vpos + 9 : vpos + 5 + size], count
    if code == 0x40:
        return mv[0:0], 0
    raise AmqpDecodeError("annotations must be a map")


def _drop_keys(entries: Buf, count: int, drop: frozenset[str]) -> tuple[bytes, int]:
    """Map entries without the given keys (compared as strings/symbols), other bytes untouched."""
    if not drop or count == 0:
        return bytes(entries), count
    out = bytearray()
    kept = 0
    pos = 0
    for _ in range(count // 2):
        kstart = pos
        key, pos = decode_value(entries, pos)
        pos = skip_value(entries, pos)
        if isinstance(key, str) and key in drop:
            continue
        out += entries[kstart:pos]
        kept += 2
    return bytes(out), kept


_HEADER_DEFAULTS = (False, 4, None, False, 0)


class MessageParts:
    """An encoded message split for the broker: the fields it needs and the raw bytes it re-uses.

    ``tail`` holds the properties, application-properties, body and footer sections exactly as sent;
    ``ma_entries`` the message annotations' encoded entries (without the map constructor).
    """

    __slots__ = (
        "durable",
        "priority",
        "ttl_ms",
        "first_acquirer",
        "da",
        "ma_entries",
        "ma_count",
        "tail",
        "message_id",
        "message_id_raw",
        "session_id",
        "partition_key",
        "scheduled_ms",
        "size",
        "app_props_span",
    )

    def __init__(self) -> None:
        self.durable: Any = None
        self.priority: Any = None
        self.ttl_ms: int | None = None
        self.first_acquirer: Any = None
        self.da = b""
        self.ma_entries = b""
        self.ma_count = 0
        self.tail = b""
        self.message_id: Any = None
        self.message_id_raw = b"\x40"
        self.session_id: str | None = None
        self.partition_key: str | None = None
        self.scheduled_ms: int | None = None
        self.size = 0
        #: (start, end) of the application-properties section inside ``tail``, or None.
        self.app_props_span: tuple[int, int] | None = None

    @property
    def message_id_str(self) -> str | None:
        mid = self.message_id
        if mid is None:
            return None
        if isinstance(mid, bytes):
            return mid.hex()
        return str(mid)

    def copy(self) -> MessageParts:
        other = MessageParts()
        for name in MessageParts.__slots__:
            setattr(other, name, getattr(self, name))
        return other

    def with_application_properties(self, extra: Mapping[str, Any]) -> MessageParts:
        """A copy whose application properties carry ``extra`` (replacing keys of the same name)."""
        other = self.copy()
        entries_new, count_new = encode_map_entries(extra)
        tail = self.tail
        if self.app_props_span is None:
            # Insert a new application-properties section right after the properties section (if any).
            insert_at = 0
            if tail[:3] == b"\x00\x53\x73":
                insert_at = skip_value(tail, 3)
            section = _section(APPLICATION_PROPERTIES, _map_from_entries(entries_new, count_new))
            other.tail = tail[:insert_at] + section + tail[insert_at:]
            other.app_props_span = (insert_at, insert_at + len(section))
        else:
            start, end = self.app_props_span
            entries, count = _map_entries(tail, start + 3)
            kept, kept_count = _drop_keys(entries, count, frozenset(str(k) for k in extra))
            section = _section(
                APPLICATION_PROPERTIES, _map_from_entries(kept + entries_new, kept_count + count_new)
            )
            other.tail = tail[:start] + section + tail[end:]
            other.app_props_span = (start, start + len(section))
        other.size = self.size + len(other.tail) - len(self.tail)
        return other

    def properties_fields(self) -> list[Any]:
        """The 13 fields of the properties section (all ``None`` when the message has none)."""
        fields: list[Any] = []
        if self.tail[:2] == b"\x00\x53" and self.tail[2] == PROPERTIES:
            value, _ = decode_value(self.tail, 3)
            if isinstance(value, list):
                fields = list(value)
        return (fields + [None] * 13)[:13]

    def application_properties(self) -> dict[str, Any]:
        """The application properties, decoded (``{}`` when there are none)."""
        if self.app_props_span is None:
            return {}
        value, _ = decode_value(self.tail, self.app_props_span[0] + 3)
        return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {}

    def with_sections(
        self, *, properties: list[Any] | None = None, application_properties: Mapping[str, Any] | None = None
    ) -> MessageParts:
        """A copy with the properties section and/or the application properties replaced (re-encoded); the body
        and footer stay as sent."""
        other = self.copy()
        tail = self.tail
        rest = tail
        props_section = b""
        if tail[:3] == b"\x00\x53\x73":
            end = skip_value(tail, 3)
            props_section, rest = tail[:end], tail[end:]
        app_section = b""
        if self.app_props_span is not None:
            start, end = self.app_props_span
            offset = len(tail) - len(rest)
            app_section = tail[start:end]
            rest = rest[: start - offset] + rest[end - offset :]
        if properties is not None:
            trimmed = list(properties)
            while trimmed and trimmed[-1] is None:
                trimmed.pop()
            props_section = _section(PROPERTIES, encode_value(trimmed)) if trimmed else b""
            fields = (list(properties) + [None] * 13)[:13]
            other.message_id = fields[0]
            other.message_id_raw = encode_value(fields[0])
            other.session_id = fields[10] if isinstance(fields[10], str) else None
        if application_properties is not None:
            app_section = (
                _section(APPLICATION_PROPERTIES, encode_value(dict(application_properties)))
                if application_properties
                else b""
            )
        other.tail = props_section + app_section + rest
        other.app_props_span = (
            (len(props_section), len(props_section) + len(app_section)) if app_section else None
        )
        other.size = self.size + len(other.tail) - len(tail)
        return other

    def render(
        self,
        *,
        delivery_count: int,
        annotations: Mapping[str, Any],
        ttl_ms: int | None = None,
    ) -> bytes:
        """The message as delivered: a fresh header (delivery count, ``ttl_ms`` or the sent TTL), the
        message annotations with ``annotations`` replacing keys of the same name, everything else as sent."""
        ttl = self.ttl_ms if ttl_ms is None else ttl_ms
        if ttl is not None and not (0 <= ttl < 2**32):
            ttl = None
        header = bytearray(b"\x00\x53\x70\xd0")
        fields = bytearray()
        fields += encode_value(self.durable) if self.durable is not None else b"\x40"
        fields += _pack(">BB", 0x50, self.priority) if isinstance(self.priority, int) else b"\x40"
        fields += _pack(">BI", 0x70, ttl) if ttl is not None else b"\x40"
        fields += encode_value(self.first_acquirer) if self.first_acquirer is not None else b"\x40"
        fields += _pack(">BI", 0x70, delivery_count)
        header += _pack(">II", len(fields) + 4, 5) + fields
        if annotations:
            kept, kept_count = _drop_keys(self.ma_entries, self.ma_count, frozenset(annotations))
            new_entries, new_count = encode_map_entries(annotations)
            ma = _section(MESSAGE_ANNOTATIONS, _map_from_entries(kept + new_entries, kept_count + new_count))
        elif self.ma_count:
            ma = _section(MESSAGE_ANNOTATIONS, _map_from_entries(self.ma_entries, self.ma_count))
        else:
            ma = b""
        return b"".join((header, self.da, ma, self.tail))


def parse_message(raw: Buf) -> MessageParts:
    """Split an encoded (non-batched) message into :class:`MessageParts`."""
    buf = bytes(raw)
    parts = MessageParts()
    parts.size = len(buf)
    tail_start = None
    da_span: tuple[int, int] | None = None
    for code, start, vpos, end in iter_sections(buf):
        if code == HEADER:
            fields, _ = decode_value(buf, vpos)
            if not isinstance(fields, list):
                raise AmqpDecodeError("header must be a list")
            fields = list(fields) + [None] * (5 - len(fields))
            parts.durable, parts.priority, ttl, parts.first_acquirer = (
                fields[0],
                fields[1],
                fields[2],
                fields[3],
            )
            parts.ttl_ms = ttl if isinstance(ttl, int) and ttl > 0 else None
        elif code == DELIVERY_ANNOTATIONS:
            parts.da = buf[start:end]
            if tail_start is not None:
                da_span = (start, end)  # after the body: kept out of the tail
        elif code == MESSAGE_ANNOTATIONS:
            entries, count = _map_entries(buf, vpos)
            parts.ma_entries = bytes(entries)
            parts.ma_count = count
            if count:
                ann, _ = decode_value(buf, vpos)
                if isinstance(ann, dict):
                    pk = ann.get("x-opt-partition-key")
                    parts.partition_key = pk if isinstance(pk, str) else None
                    sched = ann.get("x-opt-scheduled-enqueue-time")
                    if isinstance(sched, int) and not isinstance(sched, bool):
                        parts.scheduled_ms = int(sched)
                    elif isinstance(sched, datetime):
                        parts.scheduled_ms = Timestamp.from_datetime(sched)
        else:
            if tail_start is None:
                tail_start = start
            if code == PROPERTIES:
                if buf[vpos] in (0xC0, 0xD0):
                    # Only message-id (0) and group-id (10) are needed: walk the list.
                    if buf[vpos] == 0xC0:
                        count, p = buf[vpos + 2], vpos + 3
                    else:
                        count, p = _unpack_from(">I", buf, vpos + 5)[0], vpos + 9
                    for i in range(min(count, 11)):
                        if i == 0:
                            q = skip_value(buf, p)
                            parts.message_id_raw = buf[p:q]
                            parts.message_id, p = decode_value(buf, p)
                        elif i == 10:
                            gid, p = decode_value(buf, p)
                            parts.session_id = gid if isinstance(gid, str) else None
                        else:
                            p = skip_value(buf, p)
            elif code == APPLICATION_PROPERTIES:
                parts.app_props_span = (start - tail_start, end - tail_start)
    if tail_start is not None:
        if da_span is None:
            parts.tail = buf[tail_start:]
        else:
            parts.tail = buf[tail_start : da_span[0]] + buf[da_span[1] :]
            if parts.app_props_span is not None and parts.app_props_span[0] >= da_span[0] - tail_start:
                shift = da_span[1] - da_span[0]  # pragma: no cover - app properties never follow the body
                parts.app_props_span = (parts.app_props_span[0] - shift, parts.app_props_span[1] - shift)
    return parts


def split_batch(raw: Buf) -> list[bytes]:
    """The encoded messages inside a batched transfer (format 0x80013700): one per data section."""
    out = []
    for code, _start, vpos, end in iter_sections(raw):
        if code != DATA:
            continue
        c = raw[vpos]
        if c == 0xA0:
            out.append(bytes(raw[vpos + 2 : end]))
        elif c == 0xB0:
            out.append(bytes(raw[vpos + 5 : end]))
        else:
            raise AmqpDecodeError("a data section must hold binary")
    return out


def encode_message(
    *,
    body: bytes | str | None = b"",
    message_id: Any = None,
    correlation_id: Any = None,
    session_id: str | None = None,
    reply_to: str | None = None,
    to: str | None = None,
    subject: str | None = None,
    content_type: str | None = None,
    reply_to_session_id: str | None = None,
    ttl_ms: int | None = None,
    application_properties: Mapping[str, Any] | None = None,
    annotations: Mapping[str, Any] | None = None,
    value: Any = None,
    use_value: bool = False,
) -> bytes:
    """Encode a message (used for management replies, tests and tools; the SDK encodes its own)."""
    out = bytearray()
    if ttl_ms is not None:
        out += _section(HEADER, encode_value([None, None, UInt(ttl_ms)]))
    if annotations:
        out += _section(MESSAGE_ANNOTATIONS, encode_value({Symbol(k): v for k, v in annotations.items()}))
    props: list[Any] = [None] * 13
    props[0], props[2], props[3], props[4], props[5] = message_id, to, subject, reply_to, correlation_id
    props[6] = Symbol(content_type) if content_type is not None else None
    props[10], props[12] = session_id, reply_to_session_id
    out += _section(PROPERTIES, encode_value(props))
    if application_properties:
        out += _section(APPLICATION_PROPERTIES, encode_value(dict(application_properties)))
    if use_value:
        out += _section(AMQP_VALUE, encode_value(value))
    else:
        data = body.encode("utf-8") if isinstance(body, str) else (body or b"")
        out += _section(DATA, encode_value(bytes(data)))
    return bytes(out)


def message_sections(raw: Buf) -> dict[int, Any]:
    """Decoded sections of a small message (management requests): {code: value}; data sections joined."""
    out: dict[int, Any] = {}
    for code, _start, vpos, _end in iter_sections(raw):
        value, _ = decode_value(raw, vpos)
        if code == DATA:
            out[DATA] = out.get(DATA, b"") + value
        else:
            out[code] = value
    return out


def encode_reply(
    *,
    correlation_id_raw: bytes,
    application_properties: Mapping[str, Any],
    value: Any,
    to: str | None = None,
) -> bytes:
    """A management/CBS reply: properties (to, correlation-id copied byte for byte from the request's
    message-id), application properties, and an amqp-value body."""
    fields = b"\x40\x40" + encode_value(to) + b"\x40\x40" + correlation_id_raw
    props = _section(PROPERTIES, _pack(">BII", 0xD0, len(fields) + 4, 6) + fields)
    app = _section(APPLICATION_PROPERTIES, encode_value(dict(application_properties)))
    return props + app + _section(AMQP_VALUE, encode_value(value))


# ---------------------------------------------------------------------------------------------------------
# frame sniffing


class FrameSniffer:
    """Follows the client->server byte stream of one connection and records, per link name, the
    message-format of each new incoming delivery, in order.

    Proton's engine drops the transfer's ``message-format``; batched sends need it. The sniffer sees every
    byte before proton does (protocol headers, SASL frames, AMQP frames), maps attach handles to link names
    and queues one format per delivery (a multi-frame delivery counts once: ``more`` is followed).
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._handles: dict[tuple[int, int], str] = {}
        self._more: set[tuple[int, int]] = set()
        self.formats: dict[str, list[int]] = {}
        #: The client has sent the AMQP (not SASL) protocol header: the connection is past SASL.
        self.amqp_started = False

    def feed(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos = 0
        n = len(buf)
        while True:
            if n - pos >= 8 and buf[pos : pos + 4] == b"AMQP":
                if buf[pos + 4] == 0:
                    self.amqp_started = True
                pos += 8
                continue
            if n - pos < 8:
                break
            size, doff, ftype, channel = _unpack_from(">IBBH", buf, pos)
            if size < 8:
                # Garbage: stop sniffing this connection (proton will fail it).
                pos = n
                break
            if n - pos < size:
                break
            if ftype == 0 and size > doff * 4:
                body = pos + doff * 4
                with contextlib.suppress(AmqpDecodeError, IndexError, struct.error, ValueError):
                    self._frame(buf, body, channel)
            pos += size
        if pos:
            del buf[:pos]

    def _frame(self, buf: bytearray, p: int, channel: int) -> None:
        if buf[p] != 0x00:
            return
        if buf[p + 1] == 0x53:
            code = buf[p + 2]
            p += 3
        elif buf[p + 1] == 0x80:
            code = _unpack_from(">Q", buf, p + 2)[0]
            p += 10
        else:
            return
        if code == 0x14:  # transfer
            handle, delivery_id, fmt, more = self._transfer_fields(buf, p)
            key = (channel, handle)
            if key not in self._more:
                name = self._handles.get(key)
                if name is not None:
                    self.formats.setdefault(name, []).append(fmt)
            if more:
                self._more.add(key)
            else:
                self._more.discard(key)
        elif code == 0x12:  # attach
            fields, _ = decode_value(buf, p)
            if isinstance(fields, list) and len(fields) >= 3:
                name, handle, role = fields[0], fields[1], fields[2]
                # Only links on which the client sends (role sender = False).
                if role is False and isinstance(name, str) and isinstance(handle, int):
                    self._handles[(channel, handle)] = name
        elif code == 0x16:  # detach
            fields, _ = decode_value(buf, p)
            if isinstance(fields, list) and fields:
                self._handles.pop((channel, fields[0]), None)
                self._more.discard((channel, fields[0]))
        elif code == 0x17:  # end: the channel's handles are gone
            for key in [k for k in self._handles if k[0] == channel]:
                del self._handles[key]

    @staticmethod
    def _transfer_fields(buf: bytearray, p: int) -> tuple[int, int | None, int, bool]:
        code = buf[p]
        if code == 0xC0:
            count, q = buf[p + 2], p + 3
        elif code == 0xD0:
            count, q = _unpack_from(">I", buf, p + 5)[0], p + 9
        else:
            raise AmqpDecodeError("transfer must be a list")
        values: list[Any] = []
        for _ in range(min(count, 6)):
            v, q = decode_value(buf, q)
            values.append(v)
        values += [None] * (6 - len(values))
        handle, delivery_id, _tag, fmt, _settled, more = values
        return int(handle or 0), delivery_id, int(fmt or 0), bool(more)

    def pop_format(self, link_name: str) -> int:
        """The message-format of the next delivery on that link (0 if unknown)."""
        q = self.formats.get(link_name)
        if q:
            return q.pop(0)
        return 0
