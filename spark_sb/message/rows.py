"""Rows -> project messages (SPEC S2, S6): :func:`row_to_message`, the message checks
(:func:`validate_message`) and the record of a rejected row (:func:`reject_row`, its JSON :func:`row_to_json`);
the schema check of a DataFrame is Spark's side (:mod:`spark_sb.spark.schema`).

Pure functions. ``row_to_message`` runs on executors, once per row (keep it cheap). No I/O, no clock reads.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Mapping
from dataclasses import replace
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

from spark_sb.core.redact import redact
from spark_sb.message.backlog import BACKLOG_PATH, RESERVED_PROPERTIES
from spark_sb.message.outbound import (
    _ONE_MS,
    MAX_ID_LENGTH,
    MAX_TTL_MS,
    OutboundMessage,
    Reject,
    RejectError,
    Scalar,
    _floor_ms,
    _type_name,
    message_id_from_content,
)
from spark_sb.message.wire_size import encoded_size

__all__ = [
    "JSON_CONTENT_TYPE",
    "LOGICAL_COLUMNS",
    "reject_row",
    "row_to_json",
    "row_to_message",
    "validate_message",
]

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

JSON_CONTENT_TYPE = "application/json"


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
        validate_message(msg, max_message_size)
    except RejectError as err:
        if err.field in LOGICAL_COLUMNS and err.field != columns.get(err.field, err.field):
            raise RejectError(err.reason, columns[err.field]) from None
        raise
    return msg


# ---------------------------------------------------------------------------------------- message checks (B7, S6)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def validate_message(msg: OutboundMessage, max_message_size: int) -> None:
    """Raise :class:`~spark_sb.message.outbound.RejectError` if ``msg`` cannot be sent (types, lengths, reserved property
    names, its encoded size over ``max_message_size``). Runs on executors, once per message."""
    _check_fields(msg)
    size = encoded_size(msg)
    if size > max_message_size:
        raise RejectError(
            f"message too large: {size} bytes encoded, over the limit of {max_message_size} bytes"
        )


def reject_row(
    row: Any, error: RejectError, entity: str | None = None, row_index: int | None = None
) -> Reject:
    """The reject record for ``row`` that failed with ``error`` (reason and row redacted)."""
    return Reject(
        reason=redact(error.reason),
        field=error.field,
        row_json=row_to_json(row),
        entity=entity,
        row_index=row_index,
    )


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
