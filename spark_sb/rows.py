"""Rows -> project messages (SPEC S2, S6): :func:`row_to_message`, the schema check :func:`validate_schema`
and the JSON written for rejected rows (:func:`row_to_json`).

Pure functions. ``row_to_message`` runs on executors, once per row (keep it cheap); ``validate_schema`` on the
driver at the first batch. No I/O, no clock reads.
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

from spark_sb.message import (
    MAX_TTL_MS,
    OutboundMessage,
    RejectError,
    Scalar,
    _check_property,
    _floor_ms,
    _type_name,
    message_id_from_content,
)
from spark_sb.redact import redact

__all__ = [
    "JSON_CONTENT_TYPE",
    "LOGICAL_COLUMNS",
    "SchemaError",
    "row_to_json",
    "row_to_message",
    "validate_schema",
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
