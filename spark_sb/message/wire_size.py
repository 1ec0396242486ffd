"""Wire size of a message (SPEC B7): what the SDK's encoder and ``ServiceBusMessageBatch`` count, computed
arithmetically (no SDK message is built). Runs per message on executors; pure.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any

from spark_sb.core.sdk_types import INT32_MAX as _INT32_MAX
from spark_sb.core.sdk_types import INT32_MIN as _INT32_MIN
from spark_sb.message.outbound import _ONE_MS, RejectError, _type_name

if TYPE_CHECKING:
    from spark_sb.message.outbound import OutboundMessage

__all__ = [
    "BATCH_OVERHEAD_LARGE",
    "BATCH_OVERHEAD_SMALL",
    "batch_cost",
    "batch_overhead",
    "body_size",
    "encoded_size",
]

#: Bytes a message adds to a ``ServiceBusMessageBatch`` on top of its own encoded size (SDK
#: ``_BATCH_MESSAGE_OVERHEAD_COST``): 5 when the encoded message is < 256 bytes, else 8.
BATCH_OVERHEAD_SMALL, BATCH_OVERHEAD_LARGE = 5, 8


def body_size(msg: OutboundMessage) -> int:
    """Bytes of ``msg``'s body on the wire (a string as UTF-8)."""
    body = msg.body
    return len(body.encode() if isinstance(body, str) else body)


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

    A fast arithmetic mirror of the SDK's pyamqp encoder (proven equal in tests/unit/message/test_wire_size.py).
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
