"""HTTPS administration endpoint of the local namespace (SPEC E3).

The unmodified ``azure.servicebus.management.ServiceBusAdministrationClient.from_connection_string(...)`` speaks
HTTPS with Atom XML bodies to the host:port of the connection string, the same port as AMQP. The namespace server
peeks at the first byte of every accepted connection and hands TLS connections (first byte ``0x16``) to
:meth:`AdminEndpoint.serve_connection`, in a thread of their own.

What is served (paths as the SDK builds them; every name is one percent-encoded path segment, so a queue named
``contoso/x-servicebus-transfer/3`` arrives as ``/contoso%2Fx-servicebus-transfer%2F3``):

* ``GET|PUT|DELETE /{queue or topic}`` - get, create (``PUT``), update (``PUT`` with ``If-Match``; the body
  replaces the whole description, absent properties take their defaults, as with the service), delete;
* ``GET /$Resources/queues|topics?$skip=&$top=`` - paged lists;
* ``GET|PUT|DELETE /{topic}/subscriptions/{subscription}`` and ``GET /{topic}/subscriptions``;
* ``GET|PUT|DELETE /{topic}/subscriptions/{subscription}/rules/{rule}`` and ``GET .../rules`` - subscription
  rules (SQL, correlation, true and false filters; SQL actions), see :mod:`servicebus_local.rules`; a filter or
  action that does not parse is refused with 400 naming the position;
* ``GET /$namespaceinfo``.

Entities are read and written only through the broker's :class:`~servicebus_local.model.AdminStore`. Entity
properties map to the settings dataclasses of :mod:`servicebus_local.model` through the tables
:data:`QUEUE_FIELDS`, :data:`TOPIC_FIELDS` and :data:`SUBSCRIPTION_FIELDS`; the value codec of each field is
chosen from the dataclass field's type.

Authorization: with a key configured, every request must carry a ``SharedAccessSignature`` header (as the SDK
writes it for a key, or ``Bearer``-prefixed for a SAS token credential), signed with that key over ``sr`` as sent
or URL-encoded (:func:`servicebus_local.sas.check_sas`, the same rule as the AMQP port), naming the configured key
name and not expired; otherwise the reply is 401. Neither the key nor any signature is ever logged or put in a
reply.

Everything here runs inside the local namespace process, one thread per admin connection.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar, Generic, TypeVar
from urllib.parse import parse_qs, quote, unquote
from xml.etree import ElementTree as ET

from servicebus_local.clock import Clock, SystemClock
from servicebus_local.counters import OperationCounters
from servicebus_local.durations import MAX_DURATION, MAX_DURATION_ISO, format_iso_duration, parse_iso_duration
from servicebus_local.model import (
    AdminFault,
    AdminStore,
    EntityExists,
    EntityNotFound,
    InvalidSettings,
    QueueInfo,
    QueueSettings,
    RuntimeCounts,
    SubscriptionInfo,
    SubscriptionSettings,
    TopicInfo,
    TopicSettings,
)
from servicebus_local.rules import (
    CorrelationFilter,
    FalseFilter,
    Filter,
    Rule,
    SqlAction,
    SqlFilter,
    SqlSyntaxError,
    TrueFilter,
)
from servicebus_local.sas import Refusal, check_sas

__all__ = [
    "AdminEndpoint",
    "AdminReply",
    "FieldSpec",
    "QUEUE_FIELDS",
    "SUBSCRIPTION_FIELDS",
    "TOPIC_FIELDS",
    "BadRequest",
    "format_duration",
    "parse_duration",
    "verify_sas",
]

logger = logging.getLogger(__name__)

ATOM_NS = "http://www.w3.org/2005/Atom"
SB_NS = "http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"
COUNT_NS = "http://schemas.microsoft.com/netservices/2011/06/servicebus"
XSI_NS = "http://www.w3.org/2001/XMLSchema-instance"

#: api-version written into the links of replies when a request carries none.
DEFAULT_API_VERSION = "2021-05"
#: The service answers at most this many entries per page.
MAX_PAGE_SIZE = 100
#: Entity statuses a client may set.
SETTABLE_STATUSES = ("Active", "Disabled", "SendDisabled", "ReceiveDisabled")
#: Durations this close to .NET TimeSpan.MaxValue are that maximum (the SDK nudges it down by float rounding).
_MAX_DURATION_SLACK = timedelta(milliseconds=1)

_ATOM_CONTENT_TYPE = "application/atom+xml;type=entry;charset=utf-8"
_FEED_CONTENT_TYPE = "application/atom+xml;type=feed;charset=utf-8"
_ERROR_CONTENT_TYPE = "application/xml;charset=utf-8"


class BadRequest(ValueError):
    """A request the service would answer with 400 (malformed body or value). The text goes to the client."""


# --------------------------------------------------------------------------------------------------------------
# Value codecs: ISO-8601 durations and times, ints, booleans, strings.
# --------------------------------------------------------------------------------------------------------------


def parse_duration(text: str) -> timedelta:
    """Parse an ISO-8601 duration as the service accepts it (``PT1M``, ``P10675199DT2H48M5.4775807S``).

    Fractions below a microsecond are truncated; values within a millisecond of .NET ``TimeSpan.MaxValue`` are
    that maximum (:data:`~servicebus_local.durations.MAX_DURATION`); years and months are refused (not a fixed span).
    Raises :class:`BadRequest`.
    """
    try:
        result = parse_iso_duration(text)
    except ValueError:
        raise BadRequest(
            f"'{text}' is not an ISO 8601 duration (years and months are not supported)"
        ) from None
    except OverflowError as exc:
        raise BadRequest(f"duration '{text}' exceeds the maximum {MAX_DURATION_ISO}") from exc
    if result < timedelta(0):
        raise BadRequest(f"duration '{text}' must not be negative")
    if abs(result - MAX_DURATION) <= _MAX_DURATION_SLACK:
        return MAX_DURATION
    if result > MAX_DURATION:
        raise BadRequest(f"duration '{text}' exceeds the maximum {MAX_DURATION_ISO}")
    return result


def format_duration(value: timedelta) -> str:
    """ISO-8601 text of a non-negative duration; :data:`MAX_DURATION` is written as the service writes it."""
    if value < timedelta(0):
        raise ValueError("negative durations have no ISO 8601 form here")
    return format_iso_duration(value)


def format_time(value: datetime) -> str:
    """ISO-8601 UTC time with ``Z``, as the service writes ``CreatedAt`` and friends."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise BadRequest(f"'{text}' is not a boolean")


def _parse_int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError as exc:
        raise BadRequest(f"'{text}' is not an integer") from exc


def _parse_status(text: str) -> str:
    for status in SETTABLE_STATUSES:
        if status.lower() == text.strip().lower():
            return status
    raise BadRequest(f"status '{text}' is not one of {', '.join(SETTABLE_STATUSES)}")


T = TypeVar("T")


@dataclass(frozen=True)
class _Codec(Generic[T]):
    """How one kind of value is read from and written to element text."""

    parse: Callable[[str], T]
    format: Callable[[T], str]


_DURATION = _Codec(parse_duration, format_duration)
_INT = _Codec(_parse_int, str)
_BOOL = _Codec(_parse_bool, lambda value: "true" if value else "false")
_STR = _Codec(lambda text: text, lambda value: value)
_STATUS = _Codec(_parse_status, lambda value: value)

#: Codec by the (string) type annotation of a settings dataclass field.
_CODEC_BY_TYPE: dict[str, _Codec[Any]] = {
    "timedelta": _DURATION,
    "int": _INT,
    "int | None": _INT,
    "bool": _BOOL,
    "str": _STR,
    "str | None": _STR,
}


# --------------------------------------------------------------------------------------------------------------
# The mapping tables: Atom element name <-> settings dataclass field.
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldSpec:
    """One settable entity property: its element name in the description and its settings field."""

    xml_name: str
    attr: str
    codec: _Codec[Any] = dataclasses.field(repr=False, compare=False)
    optional: bool = False


def _table(settings_type: type, pairs: Sequence[tuple[str, str]]) -> tuple[FieldSpec, ...]:
    """Build a table from (element name, field name) pairs; the codec follows the field's annotation."""
    types = {f.name: str(f.type) for f in dataclasses.fields(settings_type)}
    specs = []
    for xml_name, attr in pairs:
        annotation = types[attr]
        codec = _STATUS if attr == "status" else _CODEC_BY_TYPE[annotation]
        specs.append(FieldSpec(xml_name, attr, codec, optional=annotation.endswith("| None")))
    return tuple(specs)


#: QueueDescription elements <-> :class:`QueueSettings` fields (in the service's element order).
QUEUE_FIELDS = _table(
    QueueSettings,
    [
        ("LockDuration", "lock_duration"),
        ("MaxSizeInMegabytes", "max_size_in_megabytes"),
        ("RequiresDuplicateDetection", "requires_duplicate_detection"),
        ("RequiresSession", "requires_session"),
        ("DefaultMessageTimeToLive", "default_message_time_to_live"),
        ("DeadLetteringOnMessageExpiration", "dead_lettering_on_message_expiration"),
        ("DuplicateDetectionHistoryTimeWindow", "duplicate_detection_history_time_window"),
        ("MaxDeliveryCount", "max_delivery_count"),
        ("EnableBatchedOperations", "enable_batched_operations"),
        ("Status", "status"),
        ("ForwardTo", "forward_to"),
        ("UserMetadata", "user_metadata"),
        ("AutoDeleteOnIdle", "auto_delete_on_idle"),
        ("EnablePartitioning", "enable_partitioning"),
        ("ForwardDeadLetteredMessagesTo", "forward_dead_lettered_messages_to"),
        ("EnableExpress", "enable_express"),
        ("MaxMessageSizeInKilobytes", "max_message_size_in_kilobytes"),
    ],
)

#: TopicDescription elements <-> :class:`TopicSettings` fields.
TOPIC_FIELDS = _table(
    TopicSettings,
    [
        ("DefaultMessageTimeToLive", "default_message_time_to_live"),
        ("MaxSizeInMegabytes", "max_size_in_megabytes"),
        ("RequiresDuplicateDetection", "requires_duplicate_detection"),
        ("DuplicateDetectionHistoryTimeWindow", "duplicate_detection_history_time_window"),
        ("EnableBatchedOperations", "enable_batched_operations"),
        ("Status", "status"),
        ("SupportOrdering", "support_ordering"),
        ("AutoDeleteOnIdle", "auto_delete_on_idle"),
        ("EnablePartitioning", "enable_partitioning"),
        ("EnableExpress", "enable_express"),
        ("UserMetadata", "user_metadata"),
        ("MaxMessageSizeInKilobytes", "max_message_size_in_kilobytes"),
    ],
)

#: SubscriptionDescription elements <-> :class:`SubscriptionSettings` fields.
SUBSCRIPTION_FIELDS = _table(
    SubscriptionSettings,
    [
        ("LockDuration", "lock_duration"),
        ("RequiresSession", "requires_session"),
        ("DefaultMessageTimeToLive", "default_message_time_to_live"),
        ("DeadLetteringOnMessageExpiration", "dead_lettering_on_message_expiration"),
        ("DeadLetteringOnFilterEvaluationExceptions", "dead_lettering_on_filter_evaluation_exceptions"),
        ("MaxDeliveryCount", "max_delivery_count"),
        ("EnableBatchedOperations", "enable_batched_operations"),
        ("Status", "status"),
        ("ForwardTo", "forward_to"),
        ("UserMetadata", "user_metadata"),
        ("ForwardDeadLetteredMessagesTo", "forward_dead_lettered_messages_to"),
        ("AutoDeleteOnIdle", "auto_delete_on_idle"),
    ],
)

S = TypeVar("S", QueueSettings, TopicSettings, SubscriptionSettings)


def _local_name(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def settings_from_xml(description: ET.Element, table: Sequence[FieldSpec], base: S) -> S:
    """``base`` (the defaults) with every property present in ``description`` replaced (children matched by
    local name).

    Elements not in the table (read-only runtime values the SDK echoes on update) are ignored.
    Raises :class:`BadRequest` on a value that does not parse.
    """
    by_name = {spec.xml_name: spec for spec in table}
    changes: dict[str, Any] = {}
    for child in description:
        spec = by_name.get(_local_name(child.tag))
        if spec is None:
            continue
        nil = child.get(f"{{{XSI_NS}}}nil", "").lower() == "true"
        if nil and spec.optional:
            changes[spec.attr] = None
            continue
        text = child.text or ""
        if spec.codec is _STR:
            changes[spec.attr] = text
            continue
        try:
            changes[spec.attr] = spec.codec.parse(text)
        except BadRequest as exc:
            raise BadRequest(f"{spec.xml_name}: {exc}") from None
    return dataclasses.replace(base, **changes)


def settings_to_xml(settings: object, table: Sequence[FieldSpec], parent: ET.Element) -> None:
    """Append one element per set property of ``settings`` to ``parent`` (``None`` values are left out)."""
    for spec in table:
        value = getattr(settings, spec.attr)
        if value is None:
            continue
        ET.SubElement(parent, f"{{{SB_NS}}}{spec.xml_name}").text = spec.codec.format(value)


def _runtime_to_xml(runtime: RuntimeCounts, parent: ET.Element, kind: str) -> None:
    """Runtime values of a queue / topic / subscription description (``CountDetails`` is what the SDK needs)."""

    def add(name: str, text: str) -> None:
        ET.SubElement(parent, f"{{{SB_NS}}}{name}").text = text

    if kind in ("queue", "topic"):
        add("SizeInBytes", str(runtime.size_in_bytes))
    if kind in ("queue", "subscription"):
        add("MessageCount", str(runtime.total_message_count))
    add("CreatedAt", format_time(runtime.created_at))
    add("UpdatedAt", format_time(runtime.updated_at))
    add("AccessedAt", format_time(runtime.accessed_at))
    details = ET.SubElement(parent, f"{{{SB_NS}}}CountDetails")
    for name, value in (
        ("ActiveMessageCount", runtime.active_message_count),
        ("DeadLetterMessageCount", runtime.dead_letter_message_count),
        ("ScheduledMessageCount", runtime.scheduled_message_count),
        ("TransferMessageCount", runtime.transfer_message_count),
        ("TransferDeadLetterMessageCount", runtime.transfer_dead_letter_message_count),
    ):
        ET.SubElement(details, f"{{{COUNT_NS}}}{name}").text = str(value)
    if kind == "topic":
        add("SubscriptionCount", str(runtime.subscription_count))
    add("EntityAvailabilityStatus", "Available")


def _description(kind: str, info: QueueInfo | TopicInfo | SubscriptionInfo) -> ET.Element:
    element_name, table = _KINDS[kind]
    description = ET.Element(f"{{{SB_NS}}}{element_name}")
    settings_to_xml(info.settings, table, description)
    _runtime_to_xml(info.runtime, description, kind)
    return description


#: kind -> (description element name, field table)
_KINDS: dict[str, tuple[str, tuple[FieldSpec, ...]]] = {
    "queue": ("QueueDescription", QUEUE_FIELDS),
    "topic": ("TopicDescription", TOPIC_FIELDS),
    "subscription": ("SubscriptionDescription", SUBSCRIPTION_FIELDS),
}


#: Properties the SDK exposes that the entity model does not hold: the endpoint keeps the elements as sent and
#: echoes them (per entity, forgotten when the entity is deleted or re-created elsewhere). Topics' read-only
#: ``FilteringMessagesBeforePublishing`` is always ``false`` (the SDK never sends it).
EXTRA_ELEMENTS: dict[str, tuple[str, ...]] = {
    "queue": ("AuthorizationRules",),
    "topic": ("AuthorizationRules",),
    "subscription": (),
}


def _extra_elements(kind: str, description: ET.Element) -> list[ET.Element]:
    """Copies of the ``EXTRA_ELEMENTS`` of ``kind`` present in a request's description."""
    wanted = EXTRA_ELEMENTS[kind]
    return [
        copy.deepcopy(child)
        for child in description
        if _local_name(child.tag) in wanted and child.tag.startswith(f"{{{SB_NS}}}")
    ]


XSD_NS = "http://www.w3.org/2001/XMLSchema"

#: xsi:type of a key-value Value -> reader; and Python type -> (xsi:type, writer).
_KV_READERS: dict[str, Callable[[str], Any]] = {
    "string": lambda text: text,
    "int": int,
    "long": int,
    "short": int,
    "byte": int,
    "unsignedInt": int,
    "unsignedLong": int,
    "boolean": _parse_bool,
    "double": float,
    "float": float,
    "decimal": float,
    "dateTime": lambda text: datetime.fromisoformat(text.replace("Z", "+00:00")),
    "duration": parse_duration,
    "guid": lambda text: text,
}


def _kv_type(value: Any) -> tuple[str, str]:
    if isinstance(value, bool):
        return "boolean", "true" if value else "false"
    if isinstance(value, int):
        return ("int" if -(2**31) <= value < 2**31 else "long"), str(value)
    if isinstance(value, float):
        return "double", repr(value)
    if isinstance(value, datetime):
        return "dateTime", format_time(value)
    if isinstance(value, timedelta):
        return "duration", format_duration(value)
    return "string", str(value)


def _key_values_from_xml(parent: ET.Element | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if parent is None:
        return out
    for kv in parent:
        if _local_name(kv.tag) != "KeyValueOfstringanyType":
            continue
        key = value = None
        type_name = "string"
        for child in kv:
            if _local_name(child.tag) == "Key":
                key = child.text or ""
            elif _local_name(child.tag) == "Value":
                type_name = child.get(f"{{{XSI_NS}}}type", "string").rsplit(":", 1)[-1]
                nil = child.get(f"{{{XSI_NS}}}nil", "").lower() == "true"
                reader = _KV_READERS.get(type_name)
                if reader is None:
                    raise BadRequest(f"unsupported value type '{type_name}' for key '{key}'")
                try:
                    value = None if nil else reader(child.text or "")
                except (ValueError, BadRequest) as exc:
                    raise BadRequest(f"value of '{key}' is not a {type_name}: {exc}") from None
        if key is None:
            raise BadRequest("a KeyValueOfstringanyType without Key")
        out[key] = value
    return out


def _key_values_to_xml(parent: ET.Element, tag: str, values: Any) -> None:
    holder = ET.SubElement(parent, f"{{{SB_NS}}}{tag}")
    for key, value in dict(values).items():
        kv = ET.SubElement(holder, f"{{{SB_NS}}}KeyValueOfstringanyType")
        ET.SubElement(kv, f"{{{SB_NS}}}Key").text = key
        type_name, text = _kv_type(value)
        ET.SubElement(
            kv, f"{{{SB_NS}}}Value", {f"{{{XSI_NS}}}type": f"d6p1:{type_name}", "xmlns:d6p1": XSD_NS}
        ).text = text


def _child(parent: ET.Element | None, name: str) -> ET.Element | None:
    if parent is None:
        return None
    for child in parent:
        if _local_name(child.tag) == name:
            return child
    return None


def _child_text(parent: ET.Element | None, name: str) -> str | None:
    child = _child(parent, name)
    if child is None or child.get(f"{{{XSI_NS}}}nil", "").lower() == "true":
        return None
    return child.text or ""


#: CorrelationFilter elements <-> :class:`~servicebus_local.rules.CorrelationFilter` fields.
_CORRELATION_ELEMENTS = (
    ("CorrelationId", "correlation_id"),
    ("MessageId", "message_id"),
    ("To", "to"),
    ("ReplyTo", "reply_to"),
    ("Label", "label"),
    ("SessionId", "session_id"),
    ("ReplyToSessionId", "reply_to_session_id"),
    ("ContentType", "content_type"),
)


def rule_from_xml(name: str, description: ET.Element) -> Rule:
    """A rule from a ``RuleDescription``; a filter or action that does not parse -> :class:`BadRequest`
    naming the position."""
    element = _child(description, "Filter")
    rule_filter: Filter
    kind = (element.get(f"{{{XSI_NS}}}type", "SqlFilter") if element is not None else "TrueFilter").rsplit(
        ":", 1
    )[-1]
    try:
        if kind == "TrueFilter":
            rule_filter = TrueFilter()
        elif kind == "FalseFilter":
            rule_filter = FalseFilter()
        elif kind == "SqlFilter":
            expression = _child_text(element, "SqlExpression")
            if not expression:
                raise BadRequest("a SqlFilter needs a SqlExpression")
            rule_filter = SqlFilter(expression, _key_values_from_xml(_child(element, "Parameters")))
        elif kind == "CorrelationFilter":
            fields = {attr: _child_text(element, xml) for xml, attr in _CORRELATION_ELEMENTS}
            properties = _key_values_from_xml(_child(element, "Properties"))
            rule_filter = CorrelationFilter(**fields, properties=properties)  # type: ignore[arg-type]
        else:
            raise BadRequest(f"unknown filter type '{kind}'")
    except SqlSyntaxError as exc:
        raise BadRequest(f"The filter expression is not valid: {exc}") from None
    action_element = _child(description, "Action")
    action: SqlAction | None = None
    if action_element is not None:
        action_kind = action_element.get(f"{{{XSI_NS}}}type", "EmptyRuleAction").rsplit(":", 1)[-1]
        if action_kind == "SqlRuleAction":
            expression = _child_text(action_element, "SqlExpression")
            if not expression:
                raise BadRequest("a SqlRuleAction needs a SqlExpression")
            try:
                action = SqlAction(expression, _key_values_from_xml(_child(action_element, "Parameters")))
            except SqlSyntaxError as exc:
                raise BadRequest(f"The action expression is not valid: {exc}") from None
        elif action_kind != "EmptyRuleAction":
            raise BadRequest(f"unknown action type '{action_kind}'")
    return Rule(name, rule_filter, action)


def rule_to_xml(rule: Rule) -> ET.Element:
    """The ``RuleDescription`` of a rule, in the shape the SDK writes and reads."""
    description = ET.Element(f"{{{SB_NS}}}RuleDescription")
    f = rule.filter
    if isinstance(f, CorrelationFilter):
        element = ET.SubElement(description, f"{{{SB_NS}}}Filter", {f"{{{XSI_NS}}}type": "CorrelationFilter"})
        for xml, attr in _CORRELATION_ELEMENTS:
            value = getattr(f, attr)
            if value is not None:
                ET.SubElement(element, f"{{{SB_NS}}}{xml}").text = value
        _key_values_to_xml(element, "Properties", f.properties)
    else:
        kind = (
            "TrueFilter"
            if isinstance(f, TrueFilter)
            else "FalseFilter"
            if isinstance(f, FalseFilter)
            else "SqlFilter"
        )
        element = ET.SubElement(description, f"{{{SB_NS}}}Filter", {f"{{{XSI_NS}}}type": kind})
        ET.SubElement(element, f"{{{SB_NS}}}SqlExpression").text = f.expression
        ET.SubElement(element, f"{{{SB_NS}}}CompatibilityLevel").text = "20"
        if f.parameters:
            _key_values_to_xml(element, "Parameters", f.parameters)
    if rule.action is None:
        ET.SubElement(description, f"{{{SB_NS}}}Action", {f"{{{XSI_NS}}}type": "EmptyRuleAction"})
    else:
        action = ET.SubElement(description, f"{{{SB_NS}}}Action", {f"{{{XSI_NS}}}type": "SqlRuleAction"})
        ET.SubElement(action, f"{{{SB_NS}}}SqlExpression").text = rule.action.expression
        ET.SubElement(action, f"{{{SB_NS}}}CompatibilityLevel").text = "20"
        if rule.action.parameters:
            _key_values_to_xml(action, "Parameters", rule.action.parameters)
    ET.SubElement(description, f"{{{SB_NS}}}CreatedAt").text = format_time(rule.created_at)
    ET.SubElement(description, f"{{{SB_NS}}}Name").text = rule.name
    return description


# --------------------------------------------------------------------------------------------------------------
# Authorization
# --------------------------------------------------------------------------------------------------------------


#: Admin wording of each refusal (the AMQP port words them as :class:`~servicebus_local.sas.Refusal` does).
_SAS_REFUSALS = {
    Refusal.NOT_SAS: "missing SharedAccessSignature authorization",
    Refusal.MALFORMED: "malformed SharedAccessSignature (sr, sig, se and skn are required)",
    Refusal.KEY_NAME: "unknown shared access key name",
    Refusal.EXPIRY: "malformed SharedAccessSignature expiry",
    Refusal.EXPIRED: "expired SharedAccessSignature",
    Refusal.SIGNATURE_FORMAT: "malformed SharedAccessSignature signature",
    Refusal.SIGNATURE: "invalid SharedAccessSignature signature",
}


def verify_sas(header: str | None, key_name: str, key: str, now: float) -> str | None:
    """Check a ``SharedAccessSignature`` Authorization header; the reason it is refused, or ``None`` if valid
    (see :func:`servicebus_local.sas.check_sas`: ``sr`` signed as sent or URL-encoded).

    The reason never contains the key or the signature.
    """
    refusal = check_sas(header, key_name, key, now)
    return None if refusal is None else _SAS_REFUSALS[refusal]


# --------------------------------------------------------------------------------------------------------------
# Routing
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Route:
    """What a request path addresses. ``names`` are decoded path segments (entity, subscription, rule)."""

    target: str  # namespace | list | entity | subscriptions | subscription | rules | rule
    names: tuple[str, ...] = ()


def route(raw_path: str) -> _Route:
    """Decide what a (still percent-encoded) request path addresses.

    The SDK encodes each name as one path segment (``/`` becomes ``%2F``), so literal slashes separate
    ``{topic}/subscriptions/{sub}[/rules[/{rule}]]``. A path of several segments that matches none of those
    shapes is taken as one entity name with slashes (for clients that do not encode them).
    """
    segments = raw_path.strip("/").split("/")
    names = tuple(unquote(segment) for segment in segments)
    lowered = tuple(segment.lower() for segment in segments)
    if lowered == ("$namespaceinfo",):
        return _Route("namespace")
    if len(segments) == 2 and lowered[0] == "$resources" and lowered[1] in ("queues", "topics"):
        return _Route("list", (lowered[1],))
    if len(segments) >= 2 and lowered[1] == "subscriptions" and all(names):
        if len(segments) == 2:
            return _Route("subscriptions", names[:1])
        if len(segments) == 3:
            return _Route("subscription", (names[0], names[2]))
        if len(segments) == 4 and lowered[3] == "rules":
            return _Route("rules", (names[0], names[2]))
        if len(segments) == 5 and lowered[3] == "rules":
            return _Route("rule", (names[0], names[2], names[4]))
    return _Route("entity", ("/".join(names),))


# --------------------------------------------------------------------------------------------------------------
# The endpoint
# --------------------------------------------------------------------------------------------------------------


@dataclass
class AdminReply:
    """One HTTP answer: status, body and its content type."""

    status: int
    body: bytes = b""
    content_type: str = _ATOM_CONTENT_TYPE


class _HttpError(Exception):
    """Answer the request with this status and an ``<Error>`` body."""

    def __init__(self, status: int, detail: str, code: str = "") -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.code = code


def _error_body(status: int, detail: str, code: str = "") -> bytes:
    """``<Error><Code/><Detail/></Error>``; the SDK reads ``Code`` as an int, so a textual code goes into the
    detail."""
    error = ET.Element("Error")
    ET.SubElement(error, "Code").text = code if code.isdigit() else str(status)
    ET.SubElement(error, "Detail").text = detail if code.isdigit() or not code else f"{code}: {detail}"
    return _xml_bytes(error)


def _xml_bytes(element: ET.Element) -> bytes:
    return b'<?xml version="1.0" encoding="utf-8"?>' + ET.tostring(element, encoding="unicode").encode()


class AdminEndpoint:
    """Serves the SDK's administration client over TLS on connections handed over by the namespace server.

    ``store`` is the broker (thread-safe); ``ssl_context`` a server-side context (see
    :class:`servicebus_local.tls.LocalTls`); with ``key`` set, requests must be signed with it under
    ``key_name``; with ``key=None`` any request is accepted. One instance serves any number of connections
    concurrently, each in the calling thread of :meth:`serve_connection`.
    """

    def __init__(
        self,
        store: AdminStore,
        ssl_context: ssl.SSLContext,
        key_name: str,
        key: str | None,
        *,
        clock: Clock | None = None,
        handshake_timeout: float = 10.0,
        idle_timeout: float | None = 120.0,
        counters: OperationCounters | None = None,
    ) -> None:
        self._store = store
        self._counters = counters
        self._ssl_context = ssl_context
        self._key_name = key_name
        self._key = key
        self._clock: Clock = clock or SystemClock()
        self._handshake_timeout = handshake_timeout
        self._idle_timeout = idle_timeout
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._closed = False
        # (kind, *names) -> (created_at of the entity they belong to, extra elements); see EXTRA_ELEMENTS
        self._extras: dict[tuple[str, ...], tuple[datetime, list[ET.Element]]] = {}

    def __repr__(self) -> str:  # never shows the key
        return (
            f"AdminEndpoint(namespace={self._store.namespace_name!r}, key_name={self._key_name!r}, "
            f"auth={'on' if self._key is not None else 'off'})"
        )

    # -- connections -------------------------------------------------------------------------------------------

    def serve_connection(self, sock: socket.socket) -> None:
        """Do the server-side TLS handshake on ``sock``, then serve HTTP/1.1 requests until the client closes.

        Blocking; runs in a thread owned by the namespace server. Never raises: errors are logged and the
        connection is closed.
        """
        peer = _peer_name(sock)
        try:
            sock.settimeout(self._handshake_timeout)
            tls = self._ssl_context.wrap_socket(sock, server_side=True)
        except (OSError, ssl.SSLError) as exc:
            logger.debug("admin TLS handshake with %s failed: %s", peer, exc)
            _close_quietly(sock)
            return
        with self._lock:
            if self._closed:
                _close_quietly(tls)
                return
            self._connections.add(tls)
        try:
            tls.settimeout(self._idle_timeout)
            _AdminHandler(tls, peer, self)  # type: ignore[arg-type]  # any object serves as "server"
        except Exception as exc:  # one connection's failure must never escape into the server
            logger.debug("admin connection from %s ended: %s: %s", peer, type(exc).__name__, exc)
        finally:
            with self._lock:
                self._connections.discard(tls)
            _close_quietly(tls)

    def close(self) -> None:
        """Shut down every connection being served (their threads return) and refuse new ones."""
        with self._lock:
            self._closed = True
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    @property
    def open_connections(self) -> int:
        """How many connections are being served right now."""
        with self._lock:
            return len(self._connections)

    # -- requests ----------------------------------------------------------------------------------------------

    def handle(self, method: str, raw_target: str, headers: Any, body: bytes) -> AdminReply:
        """Answer one request (``raw_target`` as on the request line: encoded path and query). Never raises.

        Order: authorization (401), then ``store.admin_fault(method, path)`` with the *decoded* path (e.g.
        ``/contoso/x-servicebus-transfer/3``, ``/t/subscriptions/s``), then the operation.
        """
        raw_path, _, query_text = raw_target.partition("?")
        if self._counters is not None:
            self._counters.add("admin_requests")
        try:
            if self._key is not None:
                refusal = verify_sas(
                    headers.get("Authorization"), self._key_name, self._key, self._clock.now().timestamp()
                )
                if refusal is not None:
                    raise _HttpError(401, f"Unauthorized: {refusal}")
            fault = self._store.admin_fault(method, unquote(raw_path))
            if fault is not None:
                return self._fault_reply(fault)
            query = {k: v[-1] for k, v in parse_qs(query_text, keep_blank_values=True).items()}
            request = _Request(
                method=method,
                route=route(raw_path),
                raw_path=raw_path,
                query=query,
                host=headers.get("Host") or "127.0.0.1",
                if_match=headers.get("If-Match"),
                body=body,
            )
            return self._dispatch(request)
        except _HttpError as exc:
            return AdminReply(exc.status, _error_body(exc.status, exc.detail, exc.code), _ERROR_CONTENT_TYPE)
        except (BadRequest, InvalidSettings) as exc:
            return AdminReply(400, _error_body(400, str(exc)), _ERROR_CONTENT_TYPE)
        except EntityNotFound as exc:
            return AdminReply(404, _error_body(404, f"Entity not found: {_text(exc)}"), _ERROR_CONTENT_TYPE)
        except EntityExists as exc:
            return AdminReply(
                409, _error_body(409, f"Entity already exists: {_text(exc)}"), _ERROR_CONTENT_TYPE
            )
        except Exception:
            logger.exception("admin request %s %s failed", method, raw_path)
            return AdminReply(
                500, _error_body(500, "internal error of the local namespace"), _ERROR_CONTENT_TYPE
            )

    @staticmethod
    def _fault_reply(fault: AdminFault) -> AdminReply:
        return AdminReply(
            fault.status, _error_body(fault.status, fault.detail, fault.code), _ERROR_CONTENT_TYPE
        )

    def _dispatch(self, request: _Request) -> AdminReply:
        target = request.route.target
        handler = _HANDLERS.get((request.method, target))
        if handler is None:
            raise _HttpError(405, f"{request.method} is not supported on this resource")
        return handler(self, request)

    # GET /$namespaceinfo
    def _get_namespace(self, request: _Request) -> AdminReply:
        name = self._store.namespace_name
        created = self._store.created_at
        info = ET.Element(f"{{{SB_NS}}}NamespaceInfo")
        for element_name, text in (
            ("CreatedTime", format_time(created)),
            ("MessagingSKU", self._store.messaging_sku),
            ("ModifiedTime", format_time(created)),
            ("Name", name),
            ("NamespaceType", "Messaging"),
        ):
            ET.SubElement(info, f"{{{SB_NS}}}{element_name}").text = text
        entry = self._entry(request, name, "$namespaceinfo", created, created, info)
        return AdminReply(200, _xml_bytes(entry))

    # GET /$Resources/queues|topics
    def _list_entities(self, request: _Request) -> AdminReply:
        which = request.route.names[0]
        infos: Sequence[QueueInfo | TopicInfo] = (
            self._store.list_queues() if which == "queues" else self._store.list_topics()
        )
        kind = "queue" if which == "queues" else "topic"
        entries = [
            self._entry(request, info.name, quote(info.name, safe=""), info.runtime.created_at,
                        info.runtime.updated_at, self._describe(kind, info))
            for info in sorted(infos, key=lambda item: item.name)
        ]  # fmt: skip
        return self._feed(request, which.capitalize(), entries)

    # GET /{topic}/subscriptions
    def _list_subscriptions(self, request: _Request) -> AdminReply:
        topic = request.route.names[0]
        self._store.get_topic(topic)  # 404 for a missing topic
        subscriptions = sorted(self._store.list_subscriptions(topic), key=lambda item: item.name)
        entries = [
            self._entry(request, info.name, _subscription_path(topic, info.name), info.runtime.created_at,
                        info.runtime.updated_at, self._describe("subscription", info))
            for info in subscriptions
        ]  # fmt: skip
        return self._feed(request, "Subscriptions", entries)

    # GET /{name}
    def _get_entity(self, request: _Request) -> AdminReply:
        name = _entity_name(request)
        info: QueueInfo | TopicInfo
        try:
            info = self._store.get_queue(name)
            kind = "queue"
        except EntityNotFound:
            info = self._store.get_topic(name)
            kind = "topic"
        return self._entity_reply(request, 200, kind, info)

    # PUT /{name}
    def _put_entity(self, request: _Request) -> AdminReply:
        name = _entity_name(request)
        kind, description = _parse_body(request.body, ("queue", "topic"))
        update = request.if_match is not None
        info: QueueInfo | TopicInfo
        # An update replaces the whole description, as the service does: what the body leaves out is reset to
        # its default (the SDK always sends every property it read, so a get -> update keeps them).
        if kind == "queue":
            queue_settings = settings_from_xml(description, QUEUE_FIELDS, QueueSettings())
            if update:
                info = self._store.update_queue(name, queue_settings)
            else:
                self._refuse_existing_entity(name)
                info = self._store.create_queue(name, queue_settings)
        else:
            topic_settings = settings_from_xml(description, TOPIC_FIELDS, TopicSettings())
            if update:
                info = self._store.update_topic(name, topic_settings)
            else:
                self._refuse_existing_entity(name)
                info = self._store.create_topic(name, topic_settings)
        self._remember_extras(kind, info, description)
        return self._entity_reply(request, 200 if update else 201, kind, info)

    def _refuse_existing_entity(self, name: str) -> None:
        """Queues and topics share one name space: creating either over the other is a conflict."""
        for getter in (self._store.get_queue, self._store.get_topic):
            try:
                getter(name)
            except EntityNotFound:
                continue
            raise EntityExists(name)

    # DELETE /{name}
    def _delete_entity(self, request: _Request) -> AdminReply:
        name = _entity_name(request)
        try:
            self._store.delete_queue(name)
            self._forget_extras(("queue", name))
        except EntityNotFound:
            self._store.delete_topic(name)
            self._forget_extras(("topic", name))
        return AdminReply(200, b"")

    # GET /{topic}/subscriptions/{sub}
    def _get_subscription(self, request: _Request) -> AdminReply:
        topic, name = request.route.names
        info = self._store.get_subscription(topic, name)
        return self._entity_reply(request, 200, "subscription", info)

    # PUT /{topic}/subscriptions/{sub}
    def _put_subscription(self, request: _Request) -> AdminReply:
        topic, name = request.route.names
        _, description = _parse_body(request.body, ("subscription",))
        settings = settings_from_xml(description, SUBSCRIPTION_FIELDS, SubscriptionSettings())
        if request.if_match is not None:
            info = self._store.update_subscription(topic, name, settings)
            self._remember_extras("subscription", info, description)
            return self._entity_reply(request, 200, "subscription", info)
        info = self._store.create_subscription(topic, name, settings)
        self._remember_extras("subscription", info, description)
        return self._entity_reply(request, 201, "subscription", info)

    # DELETE /{topic}/subscriptions/{sub}
    def _delete_subscription(self, request: _Request) -> AdminReply:
        topic, name = request.route.names
        self._store.delete_subscription(topic, name)
        self._forget_extras(("subscription", topic, name))
        return AdminReply(200, b"")

    # GET /{topic}/subscriptions/{sub}/rules
    def _list_rules(self, request: _Request) -> AdminReply:
        topic, subscription = request.route.names
        rules = self._store.list_rules(topic, subscription)
        entries = [
            self._entry(request, rule.name, _rule_path(topic, subscription, rule.name), rule.created_at,
                        rule.created_at, rule_to_xml(rule))
            for rule in rules
        ]  # fmt: skip
        return self._feed(request, "Rules", entries)

    # GET /{topic}/subscriptions/{sub}/rules/{rule}
    def _get_rule(self, request: _Request) -> AdminReply:
        topic, subscription, name = request.route.names
        return self._rule_reply(
            request, 200, topic, subscription, self._store.get_rule(topic, subscription, name)
        )

    # PUT /{topic}/subscriptions/{sub}/rules/{rule}
    def _put_rule(self, request: _Request) -> AdminReply:
        topic, subscription, name = request.route.names
        _, description = _parse_body(request.body, ("rule",))
        rule = rule_from_xml(name, description)
        if request.if_match is not None:
            stored = self._store.update_rule(topic, subscription, rule)
            return self._rule_reply(request, 200, topic, subscription, stored)
        stored = self._store.create_rule(topic, subscription, rule)
        return self._rule_reply(request, 201, topic, subscription, stored)

    # DELETE /{topic}/subscriptions/{sub}/rules/{rule}
    def _delete_rule(self, request: _Request) -> AdminReply:
        topic, subscription, name = request.route.names
        self._store.delete_rule(topic, subscription, name)
        return AdminReply(200, b"")

    def _rule_reply(
        self, request: _Request, status: int, topic: str, subscription: str, rule: Rule
    ) -> AdminReply:
        entry = self._entry(
            request, rule.name, _rule_path(topic, subscription, rule.name), rule.created_at, rule.created_at,
            rule_to_xml(rule),
        )  # fmt: skip
        return AdminReply(status, _xml_bytes(entry))

    # -- properties outside the entity model -------------------------------------------------------------------

    @staticmethod
    def _extras_key(kind: str, info: QueueInfo | TopicInfo | SubscriptionInfo) -> tuple[str, ...]:
        if isinstance(info, SubscriptionInfo):
            return (kind, info.topic_name, info.name)
        return (kind, info.name)

    def _remember_extras(
        self, kind: str, info: QueueInfo | TopicInfo | SubscriptionInfo, description: ET.Element
    ) -> None:
        key = self._extras_key(kind, info)
        elements = _extra_elements(kind, description)
        with self._lock:
            if elements:
                self._extras[key] = (info.runtime.created_at, elements)
            else:
                self._extras.pop(key, None)

    def _forget_extras(self, key: tuple[str, ...]) -> None:
        with self._lock:
            self._extras.pop(key, None)
            if key[0] == "topic":  # its subscriptions went with it
                for other in [k for k in self._extras if k[0] == "subscription" and k[1] == key[1]]:
                    del self._extras[other]

    def _describe(self, kind: str, info: QueueInfo | TopicInfo | SubscriptionInfo) -> ET.Element:
        """The description element of an entity, with the extra elements it was last put with."""
        description = _description(kind, info)
        with self._lock:
            remembered = self._extras.get(self._extras_key(kind, info))
        elements = remembered[1] if remembered and remembered[0] == info.runtime.created_at else []
        description.extend(copy.deepcopy(element) for element in elements)
        if kind == "topic":
            ET.SubElement(description, f"{{{SB_NS}}}FilteringMessagesBeforePublishing").text = "false"
        return description

    # -- building replies --------------------------------------------------------------------------------------

    def _entity_reply(
        self, request: _Request, status: int, kind: str, info: QueueInfo | TopicInfo | SubscriptionInfo
    ) -> AdminReply:
        if isinstance(info, SubscriptionInfo):
            path = _subscription_path(info.topic_name, info.name)
        else:
            path = quote(info.name, safe="")
        entry = self._entry(
            request,
            info.name,
            path,
            info.runtime.created_at,
            info.runtime.updated_at,
            self._describe(kind, info),
        )
        return AdminReply(status, _xml_bytes(entry))

    def _entry(
        self,
        request: _Request,
        title: str,
        encoded_path: str,
        published: datetime,
        updated: datetime,
        content: ET.Element,
    ) -> ET.Element:
        href = f"https://{request.host}/{encoded_path}?api-version={request.api_version}"
        entry = ET.Element(f"{{{ATOM_NS}}}entry")
        ET.SubElement(entry, f"{{{ATOM_NS}}}id").text = href
        ET.SubElement(entry, f"{{{ATOM_NS}}}title", {"type": "text"}).text = title
        ET.SubElement(entry, f"{{{ATOM_NS}}}published").text = format_time(published)
        ET.SubElement(entry, f"{{{ATOM_NS}}}updated").text = format_time(updated)
        author = ET.SubElement(entry, f"{{{ATOM_NS}}}author")
        ET.SubElement(author, f"{{{ATOM_NS}}}name").text = self._store.namespace_name
        ET.SubElement(entry, f"{{{ATOM_NS}}}link", {"rel": "self", "href": href})
        holder = ET.SubElement(entry, f"{{{ATOM_NS}}}content", {"type": "application/xml"})
        holder.append(content)
        return entry

    def _feed(self, request: _Request, title: str, entries: list[ET.Element]) -> AdminReply:
        """A page of ``entries`` per ``$skip``/``$top``; a second (``next``) link when more pages follow."""
        skip = _query_int(request.query, "$skip", 0)
        top = min(max(_query_int(request.query, "$top", MAX_PAGE_SIZE), 1), MAX_PAGE_SIZE)
        page = entries[skip : skip + top]
        base = f"https://{request.host}{request.raw_path}"
        self_href = f"{base}?$skip={skip}&$top={top}&api-version={request.api_version}"
        feed = ET.Element(f"{{{ATOM_NS}}}feed")
        ET.SubElement(feed, f"{{{ATOM_NS}}}title", {"type": "text"}).text = title
        ET.SubElement(feed, f"{{{ATOM_NS}}}id").text = self_href
        ET.SubElement(feed, f"{{{ATOM_NS}}}updated").text = format_time(self._clock.now())
        ET.SubElement(feed, f"{{{ATOM_NS}}}link", {"rel": "self", "href": self_href})
        if skip + top < len(entries):
            next_href = f"{base}?$skip={skip + top}&$top={top}&api-version={request.api_version}"
            ET.SubElement(feed, f"{{{ATOM_NS}}}link", {"rel": "next", "href": next_href})
        feed.extend(page)
        return AdminReply(200, _xml_bytes(feed), _FEED_CONTENT_TYPE)


@dataclass(frozen=True)
class _Request:
    method: str
    route: _Route
    raw_path: str
    query: dict[str, str]
    host: str
    if_match: str | None
    body: bytes

    @property
    def api_version(self) -> str:
        return self.query.get("api-version") or DEFAULT_API_VERSION


_HandlerFn = Callable[[AdminEndpoint, _Request], AdminReply]
_HANDLERS: dict[tuple[str, str], _HandlerFn] = {
    ("GET", "namespace"): AdminEndpoint._get_namespace,
    ("GET", "list"): AdminEndpoint._list_entities,
    ("GET", "entity"): AdminEndpoint._get_entity,
    ("PUT", "entity"): AdminEndpoint._put_entity,
    ("DELETE", "entity"): AdminEndpoint._delete_entity,
    ("GET", "subscriptions"): AdminEndpoint._list_subscriptions,
    ("GET", "subscription"): AdminEndpoint._get_subscription,
    ("PUT", "subscription"): AdminEndpoint._put_subscription,
    ("DELETE", "subscription"): AdminEndpoint._delete_subscription,
    ("GET", "rules"): AdminEndpoint._list_rules,
    ("GET", "rule"): AdminEndpoint._get_rule,
    ("PUT", "rule"): AdminEndpoint._put_rule,
    ("DELETE", "rule"): AdminEndpoint._delete_rule,
}


def _entity_name(request: _Request) -> str:
    name = request.route.names[0]
    if not name:
        raise BadRequest("an entity name is required")
    return name


def _subscription_path(topic: str, subscription: str) -> str:
    return f"{quote(topic, safe='')}/subscriptions/{quote(subscription, safe='')}"


def _rule_path(topic: str, subscription: str, rule: str) -> str:
    return f"{_subscription_path(topic, subscription)}/rules/{quote(rule, safe='')}"


def _query_int(query: dict[str, str], name: str, default: int) -> int:
    text = query.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(f"query parameter {name} must be an integer") from None
    if value < 0:
        raise BadRequest(f"query parameter {name} must not be negative")
    return value


_DESCRIPTION_KINDS = {
    "QueueDescription": "queue",
    "TopicDescription": "topic",
    "SubscriptionDescription": "subscription",
    "RuleDescription": "rule",
}


def _parse_body(body: bytes, allowed: tuple[str, ...]) -> tuple[str, ET.Element]:
    """The kind and description element of an Atom entry body (matched by namespace, then local name)."""
    if not body:
        raise BadRequest("the request has no body")
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        raise BadRequest(f"the request body is not XML: {exc}") from None
    content = root.find(f"{{{ATOM_NS}}}content") if root.tag == f"{{{ATOM_NS}}}entry" else None
    if content is None:
        raise BadRequest("the request body is not an Atom entry with content")
    for child in content:
        kind = _DESCRIPTION_KINDS.get(_local_name(child.tag))
        if kind is None:
            continue
        if not child.tag.startswith(f"{{{SB_NS}}}"):
            raise BadRequest(f"{_local_name(child.tag)} is not in namespace {SB_NS}")
        if kind not in allowed:
            raise BadRequest(f"a {_local_name(child.tag)} cannot be put at this address")
        return kind, child
    raise BadRequest("the entry content holds no entity description")


def _text(exc: BaseException) -> str:
    """Message of a store exception (``KeyError`` quotes its argument)."""
    return str(exc.args[0]) if exc.args else type(exc).__name__


def _peer_name(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except (OSError, ValueError):
        return "?"


def _close_quietly(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()


class _AdminHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive framing over one TLS socket; every request goes to :meth:`AdminEndpoint.handle`."""

    protocol_version = "HTTP/1.1"
    server_version = "spark-sb-local-admin"
    sys_version = ""
    disable_nagle_algorithm = True
    server: AdminEndpoint  # type: ignore[assignment]
    max_body: ClassVar[int] = 16 * 1024 * 1024

    def _serve(self) -> None:
        body = self._read_body()
        if body is None:
            return
        reply = self.server.handle(self.command, self.path, self.headers, body)
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        if reply.body:
            self.wfile.write(reply.body)

    def _read_body(self) -> bytes | None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._read_chunked()
        length_text = self.headers.get("Content-Length")
        if not length_text:
            return b""
        try:
            length = int(length_text)
        except ValueError:
            self.send_error(400, "bad Content-Length")
            return None
        if length < 0 or length > self.max_body:
            self.send_error(413, "request body too large")
            return None
        return self.rfile.read(length)

    def _read_chunked(self) -> bytes | None:
        chunks: list[bytes] = []
        total = 0
        while True:
            size_line = self.rfile.readline(1024)
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                self.send_error(400, "bad chunk size")
                return None
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            total += size
            if total > self.max_body:
                self.send_error(413, "request body too large")
                return None
            chunks.append(self.rfile.read(size))
            self.rfile.readline(1024)

    do_GET = _serve
    do_PUT = _serve
    do_DELETE = _serve
    do_POST = _serve

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature of the base class
        # The request line holds entity names only; headers (the signature) are never logged.
        logger.debug("admin %s: " + format, self.client_address, *args)
