"""The backlog rules in one place (SPEC B1, B6, B8): backlog queue names, the probe message, and the reversible
translation of a message into its backlog form.

Pure functions and constants, no I/O; they run on executors (the failed-over hot path: :func:`to_backlog_sdk`), in
the syphon (:func:`from_backlog`, :func:`is_probe`), in provisioning and in tests. The primary's namespace name,
which may need a question to the namespace, is found in :mod:`spark_sb.admin.provisioning`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from spark_sb.message.outbound import (
    OutboundMessage,
    RejectError,
    Scalar,
    _ms_to_datetime,
    _utc_ms,
)

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusMessage


__all__ = [
    "BACKLOG_AMBIGUOUS",
    "BACKLOG_ENQUEUED",
    "BACKLOG_INFIX",
    "BACKLOG_PARTITION_KEY",
    "BACKLOG_PATH",
    "BACKLOG_SCHEDULED",
    "BACKLOG_SESSION_ID",
    "BACKLOG_TABLE",
    "BACKLOG_TIMESTAMP_PROPERTIES",
    "BACKLOG_TTL",
    "PING_CONTENT_TYPE",
    "PROBE_MODES",
    "PROBE_PROPERTY",
    "PROBE_SCHEDULE_AHEAD",
    "PROBE_SESSION",
    "PROBE_SESSION_PREFIX",
    "PROBE_TTL",
    "RESERVED_PROPERTIES",
    "RETURN_MARKER",
    "ReturnMarker",
    "ambiguous_attempt",
    "backlog_additions",
    "backlog_queue_name",
    "backlog_queue_names",
    "from_backlog",
    "is_backlog_message",
    "is_probe",
    "parse_backlog_queue_name",
    "probe_message",
    "to_backlog",
    "to_backlog_sdk",
]

# ---------------------------------------------------------------------- backlog queue names (B1)
#: The infix of every backlog queue name: ``<primary-namespace>/x-servicebus-transfer/<i>``.
BACKLOG_INFIX = "x-servicebus-transfer"


def backlog_queue_name(primary_namespace_name: str, index: int) -> str:
    """``<primary-namespace>/x-servicebus-transfer/<index>``."""
    return f"{primary_namespace_name}/{BACKLOG_INFIX}/{index}"


def backlog_queue_names(primary_namespace_name: str, count: int) -> list[str]:
    """The names of backlog queues ``0 .. count-1``."""
    return [backlog_queue_name(primary_namespace_name, i) for i in range(count)]


def parse_backlog_queue_name(name: str, primary_namespace_name: str) -> str | None:
    """The part after ``<primary-namespace>/x-servicebus-transfer/`` (case-insensitive), or ``None``.

    Returns the suffix as written (normally a decimal index; anything else is an extra queue too).
    """
    prefix = f"{primary_namespace_name}/{BACKLOG_INFIX}/".casefold()
    if name.casefold().startswith(prefix) and len(name) > len(prefix):
        return name[len(prefix) :]
    return None


# ---------------------------------------------------------------------- probe messages (B8)
PING_CONTENT_TYPE = "application/vnd.ms-servicebus-ping"
PROBE_PROPERTY = "x-spark-sb-probe"
PROBE_TTL = timedelta(seconds=1)
PROBE_SCHEDULE_AHEAD = timedelta(days=30)
PROBE_MODES = ("schedule-cancel", "ping")


#: The session of every ``ping`` probe (issue 29, F6): a session-enabled entity refuses a message without a session
#: id ("The SessionId was not set on a message", the service's ``invalid_request``), and a topic's session-enabled
#: subscriptions dead-letter it. So every probe carries a session id: a ``ping`` probe goes to this one session (a
#: session receiver that accepts it meets only probes there, and :func:`is_probe` recognises its messages);
#: a ``schedule-cancel`` probe carries a session id of its own (:data:`PROBE_SESSION_PREFIX` + a UUID), so the
#: scheduled-then-cancelled message never touches a session anybody uses. A session id on a message to an entity
#: without sessions is ignored by the service.
PROBE_SESSION = "x-spark-sb-probe"
PROBE_SESSION_PREFIX = "x-spark-sb-probe-"


def probe_message(entity: str, mode: str = "schedule-cancel") -> OutboundMessage:
    """The probe message of ``mode`` for ``entity``: empty, ping content type, probe property, TTL 1 s, a session
    id (:data:`PROBE_SESSION` for ``ping``; a fresh one for ``schedule-cancel``), so that it is accepted by
    session-enabled entities too.

    In ``schedule-cancel`` mode it is scheduled far ahead and cancelled at once; the marks make
    :func:`is_probe` catch it should a cancel ever fail and it be delivered.
    """

    if mode not in PROBE_MODES:
        raise ValueError(f"probe_mode must be one of {', '.join(PROBE_MODES)}, not {mode!r}")
    probe_id = uuid.uuid4()
    return OutboundMessage(
        body=b"",
        entity=entity,
        message_id=f"spark-sb-probe-{probe_id}",
        session_id=PROBE_SESSION if mode == "ping" else f"{PROBE_SESSION_PREFIX}{probe_id}",
        content_type=PING_CONTENT_TYPE,
        time_to_live=PROBE_TTL,
        properties={PROBE_PROPERTY: mode},
    )


def is_probe(message: Any) -> bool:
    """True for a probe message (either mode, or the seed's ping): receivers drop these.

    Works on ``ServiceBusReceivedMessage`` / ``ServiceBusMessage`` and :class:`OutboundMessage`. A message of a
    probe session (:data:`PROBE_SESSION`, :data:`PROBE_SESSION_PREFIX`) is a probe too.
    """

    raw = None if isinstance(message, OutboundMessage) else getattr(message, "raw_amqp_message", None)
    if raw is not None:
        # An SDK message: its AMQP properties read once, not through the SDK's getters - each of those tests the
        # property map's truth, which lists its keys (the syphon reads this for every message it moves: about 4%
        # of its time, measured with cProfile).
        amqp = raw.properties
        content_type = None if amqp is None else amqp.content_type
        session = None if amqp is None else amqp.group_id
    else:
        content_type = getattr(message, "content_type", None)
        session = getattr(message, "session_id", None)
    if isinstance(content_type, bytes):
        content_type = content_type.decode("utf-8", "replace")
    if content_type == PING_CONTENT_TYPE:
        return True
    if isinstance(session, bytes):
        session = session.decode("utf-8", "replace")
    if isinstance(session, str) and session.startswith(PROBE_SESSION):
        return True
    props = message.properties if isinstance(message, OutboundMessage) else None
    if props is None:
        props = getattr(message, "application_properties", None)
    if not props:
        return False
    return PROBE_PROPERTY in props or PROBE_PROPERTY.encode() in props


# ---------------------------------------------------------------------- backlog translation (B6)
BACKLOG_PATH = "x-ms-path"
BACKLOG_SESSION_ID = "x-ms-sessionid"
BACKLOG_TTL = "x-ms-timetolive"
BACKLOG_SCHEDULED = "x-ms-scheduledenqueuetimeutc"
BACKLOG_PARTITION_KEY = "x-ms-partitionkey"
BACKLOG_ENQUEUED = "x-ms-backlog-enqueued-utc"
#: Names of the application properties whose values were ``datetime`` (JSON list). The SDK decodes AMQP
#: timestamps in application properties as plain ``int`` milliseconds; this lets ``from_backlog`` restore the
#: type after a real round trip through a backlog queue. Only present when such properties exist.
BACKLOG_TIMESTAMP_PROPERTIES = "x-ms-backlog-timestamp-properties"

#: The application property of a return marker (``ordering``, :mod:`spark_sb.failover.ordering` R2; its value: the
#: marker id). The syphon acknowledges and completes a backlog message that carries it, never forwards it: a user
#: message carrying it would be swallowed, so it is reserved (a reject) and only a :class:`ReturnMarker` carries it.
RETURN_MARKER = "x-spark-sb-return"

#: SPEC B14: when the primary send of a diverted message that may have landed was attempted (UTC) - a send that
#: failed with no verdict once its transfer was written (:func:`spark_sb.core.errors.is_ambiguous`). Only such
#: messages carry it; the syphon strips it, and counts the message as a possible duplicate when it moves it after
#: the entity's duplicate detection window has passed since that time.
BACKLOG_AMBIGUOUS = "x-spark-sb-ambiguous-attempt-utc"

#: Application property names that the backlog translation owns: user messages must not carry them.
RESERVED_PROPERTIES = frozenset(
    {
        BACKLOG_AMBIGUOUS,
        BACKLOG_PATH,
        BACKLOG_SESSION_ID,
        BACKLOG_TTL,
        BACKLOG_SCHEDULED,
        BACKLOG_PARTITION_KEY,
        BACKLOG_ENQUEUED,
        BACKLOG_TIMESTAMP_PROPERTIES,
        RETURN_MARKER,
    }
)


@dataclass(frozen=True, slots=True)
class ReturnMarker(OutboundMessage):
    """A return marker as the sender makes it (:func:`spark_sb.failover.ordering.return_marker`): the one kind of
    message :func:`to_backlog` lets carry :data:`RETURN_MARKER`. Picklable like any :class:`OutboundMessage`."""


_ONE_MS = timedelta(milliseconds=1)


def _ttl_encode(td: timedelta) -> int:
    return td // _ONE_MS


def _ttl_decode(v: Any) -> timedelta:
    return timedelta(milliseconds=int(v))


def _time_decode(v: Any) -> datetime:

    if isinstance(v, datetime):
        return v if v.tzinfo is timezone.utc else _utc_ms(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return _ms_to_datetime(int(v))
    if isinstance(v, str):
        return _utc_ms(datetime.fromisoformat(v))
    raise ValueError(f"not a timestamp: {type(v).__name__}")


def _utc(now: datetime) -> datetime:
    """``now`` as recorded in ``x-ms-backlog-enqueued-utc``: naive means UTC, an aware time stays as it is."""
    return now.replace(tzinfo=timezone.utc) if now.tzinfo is None else now


def _str_decode(v: Any) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def _same(v: Any) -> Any:
    return v


#: SPEC B6, one row per translated attribute: (OutboundMessage attribute, backlog property, encode, decode).
#: The attribute is cleared in the backlog message and restored from the property by :func:`from_backlog`.
BACKLOG_TABLE: tuple[tuple[str, str, Callable[[Any], Scalar], Callable[[Any], Any]], ...] = (
    ("entity", BACKLOG_PATH, _same, _str_decode),
    ("session_id", BACKLOG_SESSION_ID, _same, _str_decode),
    ("time_to_live", BACKLOG_TTL, _ttl_encode, _ttl_decode),
    ("scheduled_enqueue_time", BACKLOG_SCHEDULED, _same, _time_decode),
    ("partition_key", BACKLOG_PARTITION_KEY, _same, _str_decode),
)


def to_backlog(
    msg: OutboundMessage, entity: str, now: datetime, ambiguous: datetime | None = None
) -> OutboundMessage:
    """Translate ``msg`` (destined for ``entity``) into its backlog form (SPEC B6).

    Session id, TTL, scheduled time and partition key are cleared and recorded as application properties,
    with the destination (``x-ms-path``) and ``now`` (``x-ms-backlog-enqueued-utc``, UTC); ``ambiguous``, when its
    primary send may have landed, the time that send was attempted (:data:`BACKLOG_AMBIGUOUS`). Everything else
    passes unchanged. The result has ``entity=None`` (the caller picks the backlog queue). Raises
    :class:`RejectError` if ``msg`` already carries a reserved backlog property (not reversible), or carries
    :data:`RETURN_MARKER` without being a :class:`ReturnMarker` (the syphon would swallow it).
    """

    props: dict[str, Scalar] = dict(msg.properties)
    reserved = RESERVED_PROPERTIES - {RETURN_MARKER} if isinstance(msg, ReturnMarker) else RESERVED_PROPERTIES
    for name in sorted(reserved.intersection(props)):
        raise RejectError(
            f"property name {name!r} is reserved for the backlog translation", f"properties.{name}"
        )
    timestamps = sorted(k for k, v in props.items() if isinstance(v, datetime))
    source = replace(msg, entity=entity)
    cleared: dict[str, Any] = {}
    for attr, prop, encode, _ in BACKLOG_TABLE:
        value = getattr(source, attr)
        cleared[attr] = None
        if value is not None:
            props[prop] = encode(value)
    props[BACKLOG_ENQUEUED] = _utc(now)
    if ambiguous is not None:
        props[BACKLOG_AMBIGUOUS] = _utc(ambiguous)
    if timestamps:
        props[BACKLOG_TIMESTAMP_PROPERTIES] = json.dumps(timestamps, separators=(",", ":"))
    return replace(msg, properties=props, **cleared)


def to_backlog_sdk(
    msg: OutboundMessage, entity: str, now: datetime, ambiguous: datetime | None = None
) -> ServiceBusMessage:
    """``to_backlog(msg, entity, now, ambiguous).to_sdk()`` in one step: the failed-over hot path (SPEC B6).

    A message without a session id, partition key, TTL, scheduled time or timestamp properties - the common
    case - goes straight to the SDK message, with no intermediate :class:`OutboundMessage`; any other takes the
    general path. Both give the same message. Raises :class:`RejectError` like :func:`to_backlog`.
    """
    added = backlog_additions(msg, entity, now, ambiguous)
    if added is None:
        return to_backlog(msg, entity, now, ambiguous).to_sdk()
    return msg.to_sdk(added)  # session id, partition key, TTL and scheduled time are None here


def backlog_additions(
    msg: OutboundMessage, entity: str, now: datetime, ambiguous: datetime | None = None
) -> dict[str | bytes, Any] | None:
    """The common case of :func:`to_backlog` (no session id, partition key, TTL, scheduled time, reserved or
    timestamp properties: nothing to clear or record but the destination and the time): the two application
    properties the backlog form adds to ``msg``'s own (three with ``ambiguous``), which it otherwise keeps as they
    are; None for any other message (:func:`to_backlog` then). Pure; the failed-over hot path (one small dict per
    message)."""
    props = msg.properties
    if (
        msg.session_id is not None
        or msg.partition_key is not None
        or msg.time_to_live is not None
        or msg.scheduled_enqueue_time is not None
        or (props and (not RESERVED_PROPERTIES.isdisjoint(props) or _has_timestamp(props)))
    ):
        return None
    if ambiguous is not None:
        return {BACKLOG_PATH: entity, BACKLOG_ENQUEUED: _utc(now), BACKLOG_AMBIGUOUS: _utc(ambiguous)}
    return {BACKLOG_PATH: entity, BACKLOG_ENQUEUED: _utc(now)}


def _has_timestamp(props: Mapping[str, Scalar]) -> bool:
    return any(isinstance(v, datetime) for v in props.values())


def from_backlog(msg: OutboundMessage) -> tuple[OutboundMessage, datetime]:
    """Restore a backlog message (exact inverse of :func:`to_backlog`) and return when it entered the backlog.

    Accepts the values as they come back from a real receive too (timestamps and TTL as ``int`` ms, strings
    as ``bytes``). Raises :class:`RejectError` if ``msg`` is not a backlog message.
    """

    props: dict[str, Any] = dict(msg.properties)
    if BACKLOG_PATH not in props:
        raise RejectError("not a backlog message (no x-ms-path property)", BACKLOG_PATH)
    restored: dict[str, Any] = {}
    for attr, prop, _, decode in BACKLOG_TABLE:
        raw = props.pop(prop, None)
        try:
            restored[attr] = None if raw is None else decode(raw)
        except (ValueError, TypeError, OverflowError) as exc:
            raise RejectError(f"invalid backlog value: {exc}", prop) from None
    raw_enq = props.pop(BACKLOG_ENQUEUED, None)
    if raw_enq is None:
        raise RejectError("backlog message without an enqueue time", BACKLOG_ENQUEUED)
    try:
        enqueued = raw_enq if isinstance(raw_enq, datetime) else _time_decode(raw_enq)
    except (ValueError, TypeError, OverflowError) as exc:
        raise RejectError(f"invalid backlog value: {exc}", BACKLOG_ENQUEUED) from None
    props.pop(BACKLOG_AMBIGUOUS, None)  # the syphon's to read (ambiguous_attempt), never the primary's
    raw_ts = props.pop(BACKLOG_TIMESTAMP_PROPERTIES, None)
    if raw_ts is not None:
        try:
            names = json.loads(_str_decode(raw_ts))
        except ValueError:
            names = []
        for name in names:
            v = props.get(name)
            if isinstance(v, int) and not isinstance(v, bool):
                props[name] = _ms_to_datetime(v)
    return replace(msg, properties=props, **restored), enqueued


def ambiguous_attempt(msg: OutboundMessage) -> datetime | None:
    """When the primary send of backlog message ``msg`` was attempted, if that send may have landed
    (:data:`BACKLOG_AMBIGUOUS`); None for the others, and for a value that is not a time (pure)."""
    raw = msg.properties.get(BACKLOG_AMBIGUOUS) if msg.properties else None
    if raw is None:
        return None
    try:
        return _time_decode(raw)
    except (ValueError, TypeError, OverflowError):
        return None


def is_backlog_message(msg: Any) -> bool:
    """True for a backlog-form message: an :class:`OutboundMessage` or an SDK message with ``x-ms-path``."""

    props = (
        msg.properties if isinstance(msg, OutboundMessage) else getattr(msg, "application_properties", None)
    )
    if not props:
        return False
    return BACKLOG_PATH in props or BACKLOG_PATH.encode() in props
