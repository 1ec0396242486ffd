"""The source's fixed row schema (SOURCE.md §10, R21) and a received or peeked message as a row.

:func:`schema` gives the columns as ``(name, Spark SQL type)`` pairs, :func:`schema_ddl` the same as a DDL string
(no pyspark import here: the adapter builds its ``StructType`` from it). :func:`row_of` turns an SDK
``ServiceBusReceivedMessage`` into a tuple in that column order. It never fails on content (§9): a body that is not
UTF-8 under ``bodyFormat=string`` gives a null ``body`` and a ``body_error``; property values of any AMQP type are
rendered as text.

Pure functions, no I/O. :func:`row_of` runs on executors, once per message (keep it cheap).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

__all__ = [
    "STATES",
    "schema",
    "schema_ddl",
    "row_of",
]

#: The message columns (§10).
MESSAGE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("body", "binary"),
    ("body_type", "string"),
    ("message_id", "string"),
    ("correlation_id", "string"),
    ("session_id", "string"),
    ("reply_to_session_id", "string"),
    ("partition_key", "string"),
    ("subject", "string"),
    ("content_type", "string"),
    ("to", "string"),
    ("reply_to", "string"),
    ("time_to_live", "bigint"),
    ("scheduled_enqueue_time", "timestamp"),
    ("properties", "map<string,string>"),
)
#: The system columns (§10).
SYSTEM_COLUMNS: tuple[tuple[str, str], ...] = (
    ("sequence_number", "bigint"),
    ("enqueued_sequence_number", "bigint"),
    ("enqueued_time", "timestamp"),
    ("expires_at", "timestamp"),
    ("delivery_count", "int"),
    ("dead_letter_reason", "string"),
    ("dead_letter_error_description", "string"),
    ("dead_letter_source", "string"),
)
#: The provenance columns (§10): where the row came from (``via``: primary or backlog, P3).
PROVENANCE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("namespace", "string"),
    ("entity", "string"),
    ("via", "string"),
    ("backlog_queue", "string"),
    ("diverted_time", "timestamp"),
)

#: A message without an AMQP properties section: every field the rows read from it is unset.
_NO_PROPERTIES = SimpleNamespace(
    message_id=None,
    correlation_id=None,
    group_id=None,
    reply_to_group_id=None,
    subject=None,
    content_type=None,
    to=None,
    reply_to=None,
)

#: ``x-opt-message-state`` as the batch read's ``state`` column.
STATES = {0: "active", 1: "deferred", 2: "scheduled"}


def schema(body_format: str = "binary", *, batch: bool = False) -> list[tuple[str, str]]:
    """The columns, in row order: ``body`` is ``string`` with ``bodyFormat=string``, followed by ``body_error``;
    the batch read (``batch``) adds ``state`` last."""
    columns = list(MESSAGE_COLUMNS)
    if body_format == "string":
        columns[0] = ("body", "string")
        columns.insert(1, ("body_error", "string"))
    columns += SYSTEM_COLUMNS + PROVENANCE_COLUMNS
    if batch:
        columns.append(("state", "string"))
    return columns


def schema_ddl(body_format: str = "binary", *, batch: bool = False) -> str:
    """:func:`schema` as a Spark DDL string (``body binary, body_type string, ...``); names are quoted."""
    return ", ".join(f"`{name}` {kind}" for name, kind in schema(body_format, batch=batch))


def row_of(
    message: Any, namespace: str, entity: str, body_format: str = "binary", *, batch: bool = False
) -> tuple[Any, ...]:
    """``message`` (an SDK ``ServiceBusReceivedMessage``, received or peeked) as a row of :func:`schema`
    (``body_format``, ``batch``): times as UTC datetimes, ``time_to_live`` in milliseconds, properties rendered as
    text. ``entity`` is the entity path read (``queue`` or ``topic/subscriptions/name``). Executors."""
    raw = message.raw_amqp_message
    body_type = _body_type(raw)
    data = _body_bytes(raw, body_type)
    header = raw.header
    ttl_ms = int(header.time_to_live) if header is not None and header.time_to_live else None
    enqueued = _utc(message.enqueued_time_utc)
    body: list[Any]
    if body_format == "string":
        try:
            body = [data.decode("utf-8"), None]
        except UnicodeDecodeError as exc:
            body = [None, f"invalid UTF-8 at byte {exc.start}: {exc.reason}"]
    else:
        body = [data]
    # The AMQP properties section read once, field by field: the SDK's getters (``message.message_id``...) test
    # the section's truth first, which lists its attributes each time (9 getters: ~50 us of a row's ~120 us).
    # ``_text`` of a field is ``_text`` of its getter: bytes decoded as UTF-8, anything else as its text.
    props = raw.properties
    if props is None:
        props = _NO_PROPERTIES
    row: list[Any] = [
        *body,
        body_type,
        _text(props.message_id),
        _text(props.correlation_id),
        _text(props.group_id),
        _text(props.reply_to_group_id),
        _text(message.partition_key),
        _text(props.subject),
        _text(props.content_type),
        _text(props.to),
        _text(props.reply_to),
        ttl_ms,
        _utc(message.scheduled_enqueue_time_utc),
        _properties(message.application_properties),
        message.sequence_number,
        message.enqueued_sequence_number,
        enqueued,
        _expires(enqueued, ttl_ms),
        header.delivery_count if header is not None else None,  # the SDK getter's value, without its test
        _text(message.dead_letter_reason),
        _text(message.dead_letter_error_description),
        _text(message.dead_letter_source),
        namespace,
        entity,
        "primary",
        None,
        None,
    ]
    if batch:
        row.append(STATES.get(_state(message), "active"))
    return tuple(row)


def _body_type(raw: Any) -> str:
    kind = getattr(raw.body_type, "value", raw.body_type)
    return str(kind) if kind in ("data", "value", "sequence") else "data"


def _body_bytes(raw: Any, body_type: str) -> bytes:
    """A data body joined; a value or sequence body as JSON text (bytes decoded as UTF-8, replacing)."""
    body = raw.body
    if body is None:
        return b""
    if body_type == "data":
        return body if isinstance(body, bytes) else b"".join(body)
    if body_type == "sequence":
        body = list(body)
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    return json.dumps(_plain(body), separators=(",", ":"), default=str).encode("utf-8")


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, Mapping):
        return {str(_plain(k)): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        return _utc(value).isoformat()  # type: ignore[union-attr]
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _render(value: Any) -> str | None:
    """A property value as text: booleans ``true``/``false``, numbers as Python writes them, timestamps ISO-8601
    UTC, UUIDs canonical, bytes as UTF-8 (replacing), lists and maps as JSON."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, datetime):
        return _utc(value).isoformat()  # type: ignore[union-attr]
    if isinstance(value, timedelta):
        return str(int(value.total_seconds() * 1000))
    if isinstance(value, (Mapping, list, tuple)):
        return json.dumps(_plain(value), separators=(",", ":"), default=str)
    return str(value)


def _properties(props: Mapping[Any, Any] | None) -> dict[str, str | None]:
    if not props:
        return {}
    return {_text(k) or "": _render(v) for k, v in props.items()}


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _expires(enqueued: datetime | None, ttl_ms: int | None) -> datetime | None:
    """Enqueued time plus the TTL; None without either, or past the calendar (the service's 'never')."""
    if enqueued is None or ttl_ms is None:
        return None
    try:
        return enqueued + timedelta(milliseconds=ttl_ms)
    except OverflowError:
        return None


def _state(message: Any) -> int:
    state = getattr(message, "state", 0)
    return int(getattr(state, "value", state) or 0)
