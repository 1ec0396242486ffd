"""The source's options (SOURCE.md §10, R22): checked before anything is received, naming a bad one.

:func:`parse_source_options` takes the options as Spark gives them (``dict[str, str]``, keys in any case) and
returns a frozen, picklable :class:`SourceReadOptions`. Where to read reuses the sink's flat keys
(``primary.connection_string``, the AAD credential keys, ``secondary.*``, ``state_location``, ...) and
``config_path`` (a YAML file loaded as the sink loads it: one file serves sink, syphon and source); how to read is
camelCase, as Kafka's source. Durations are ``"10s"``, ``"15m"``, ``"250ms"`` or seconds; byte sizes are a number
or ``"64MB"``.

Runs on the driver (the planner process and the session that starts the query); the result is picklable (it rides
in the reader into executors). Pure apart from reading ``config_path`` and resolving secret references.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.config.settings import KNOWN_KEYS
from spark_sb.core.durations import parse_duration
from spark_sb.core.errors import ConfigError

__all__ = [
    "BODY_FORMATS",
    "SPARK_OPTIONS",
    "SourceReadOptions",
    "option_error",
    "parse_source_options",
    "subscription_path",
]

#: ``binary``: ``body`` is the bytes; ``string``: UTF-8 text, invalid UTF-8 gives a null body and ``body_error``.
BODY_FORMATS = ("binary", "string")

#: §10 options that belong to later parts (sessions, the DLQ stream, failover read-through, shipped payloads):
#: named as not supported yet rather than unknown.
NOT_YET = {
    "subqueue": "subQueue",
    "readbacklog": "readBacklog",
    "maxconcurrentsessions": "maxConcurrentSessions",
    "sessionidletimeout": "sessionIdleTimeout",
    "transporttype": "transportType",
    "states": "states",
}


@dataclass(frozen=True)
class SourceReadOptions:
    """The source's options, checked (SOURCE.md §10). Frozen and picklable (driver -> executors); hashable."""

    config: ServiceBusConfig
    #: The entities as given (queues, or topics with :attr:`subscription`), in order, without duplicates.
    entities: tuple[str, ...]
    subscription: str | None = None
    max_messages_per_trigger: int = 50_000
    #: None: no byte cap (the payloads stay on the entity; executors peek them).
    max_bytes_per_trigger: int | None = None
    min_messages_per_trigger: int | None = None
    max_trigger_delay: float = 900.0
    max_receive_time: float = 10.0
    receive_wait_time: float = 1.0
    fail_on_data_loss: bool = True
    recover_deferred: bool = False
    #: The defer thread receives the next batch while the executors read this one (the planner's read-ahead).
    read_ahead: bool = True
    #: Seconds a planned batch's messages stay locked (renewed) before they are deferred; committed sooner, they
    #: are completed with their locks. 0: deferred at once.
    defer_after: float = 10.0
    min_partitions: int | None = None
    max_messages_per_partition: int = 5_000
    body_format: str = "binary"
    #: Names the source's events and claims (the reader never sees the checkpoint or query id, §11).
    source_id: str | None = None
    max_offset_ranges: int = 10_000
    prefetch_count: int = 0
    payloads: str = "peek"
    #: Batch read only: the browse's first and last sequence numbers (inclusive; None: from the start / to the end).
    starting_sequence_number: int | None = None
    ending_sequence_number: int | None = None

    @property
    def paths(self) -> tuple[str, ...]:
        """The entity paths the receivers and peeks use: ``queue`` or ``topic/subscriptions/name``."""
        return tuple(subscription_path(e, self.subscription) for e in self.entities)

    @property
    def path(self) -> str:
        """The one entity path of a single-entity read; :class:`ConfigError` (naming ``entity``) for a list."""
        if len(self.entities) != 1:
            raise option_error([("entity", f"expected one entity here, found {len(self.entities)}")])
        return self.paths[0]


def subscription_path(entity: str, subscription: str | None) -> str:
    """``topic/subscriptions/name`` for a topic and subscription; the entity itself otherwise."""
    return f"{entity}/subscriptions/{subscription}" if subscription else entity


def option_error(errors: list[tuple[str, str]]) -> ConfigError:
    """One error naming every bad option (``errors``: (option, message) pairs)."""
    return ConfigError(
        "format('servicebus') read: " + "; ".join(f"option {k!r}: {m}" for k, m in errors), list(errors)
    )


# ---------------------------------------------------------------------------------------------- value parsers
_INT = re.compile(r"^\s*[+]?[0-9][0-9_]*\s*$")
_BYTES = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*(b|k|kb|kib|m|mb|mib|g|gb|gib)?\s*$", re.IGNORECASE)
_BYTE_UNIT = {"b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024**2, "mb": 1024**2, "mib": 1024**2}
_BYTE_UNIT.update({"g": 1024**3, "gb": 1024**3, "gib": 1024**3})
_SOURCE_ID = re.compile(r"^[A-Za-z0-9._:/-]{1,200}$")


def _int(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not _INT.match(text):
            raise ValueError(f"expected an integer >= {minimum}, found {text!r}")
        value = int(text.replace("_", ""))
        if value < minimum:
            raise ValueError(f"expected an integer >= {minimum}, found {value}")
        return value

    return parse


def _sequence(text: str) -> int:
    return _int(0)(text)


def _bytes(text: str) -> int:
    m = _BYTES.match(text)
    if not m:
        raise ValueError(f"expected a size in bytes (a number, or e.g. '64MB'), found {text!r}")
    value = int(float(m.group(1)) * _BYTE_UNIT[(m.group(2) or "b").lower()])
    if value < 1:
        raise ValueError(f"expected a size of at least 1 byte, found {text!r}")
    return value


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError(f"expected true or false, found {text!r}")


def _duration(*, positive: bool) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            seconds = parse_duration(text, "duration")
        except ConfigError as exc:
            raise ValueError(
                f"expected a duration ('10s', '15m', '250ms' or seconds), found {text!r}"
            ) from exc
        if positive and seconds <= 0:
            raise ValueError(f"expected a duration above 0, found {text!r}")
        return seconds

    return parse


def _choice(valid: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in valid:
            raise ValueError(f"expected one of {', '.join(valid)}, found {text!r}")
        return value

    return parse


def _name(text: str) -> str:
    value = text.strip()
    if not value:
        raise ValueError("expected a name, found ''")
    return value


def _source_id(text: str) -> str:
    value = text.strip()
    if not _SOURCE_ID.match(value):
        raise ValueError(f"expected letters, digits, '.', '_', ':', '/' or '-' (at most 200), found {text!r}")
    return value


#: option (as documented) -> (field, parser). Keys are matched case-insensitively.
_OPTIONS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "subscription": ("subscription", _name),
    "maxMessagesPerTrigger": ("max_messages_per_trigger", _int(1)),
    "maxBytesPerTrigger": ("max_bytes_per_trigger", _bytes),
    "minMessagesPerTrigger": ("min_messages_per_trigger", _int(1)),
    "maxTriggerDelay": ("max_trigger_delay", _duration(positive=False)),
    "maxReceiveTime": ("max_receive_time", _duration(positive=True)),
    "receiveWaitTime": ("receive_wait_time", _duration(positive=True)),
    "failOnDataLoss": ("fail_on_data_loss", _bool),
    "recoverDeferred": ("recover_deferred", _bool),
    "readAhead": ("read_ahead", _bool),
    "deferAfter": ("defer_after", _duration(positive=False)),
    "minPartitions": ("min_partitions", _int(1)),
    "maxMessagesPerPartition": ("max_messages_per_partition", _int(1)),
    "bodyFormat": ("body_format", _choice(BODY_FORMATS)),
    "sourceId": ("source_id", _source_id),
    "maxOffsetRanges": ("max_offset_ranges", _int(1)),
    "prefetchCount": ("prefetch_count", _int(0)),
    "payloads": ("payloads", _choice(("peek", "ship"))),
    "startingSequenceNumber": ("starting_sequence_number", _sequence),
    "endingSequenceNumber": ("ending_sequence_number", _sequence),
}
_BY_LOWER = {k.lower(): k for k in _OPTIONS}
#: The source's own keys besides the camelCase ones: the entity, and the YAML file of the connection keys.
_OWN = ("entity", "config_path")
#: The sink's flat keys the source reads where to read from (``entity`` is the source's own here).
_WHERE = frozenset(KNOWN_KEYS) - {"entity"}
#: Options Spark hands a reader beside the user's, as they arrive (Spark's options map is case-insensitive:
#: lower-cased keys). Accepted and ignored: the entity is the ``entity`` option, never a path.
SPARK_OPTIONS = frozenset(
    {
        # DataStreamReader.load(path) and DataFrameReader.load(path)
        "path",
        # DataFrameReader.load(path1, path2, ...): the paths as a JSON list
        "paths",
    }
)


def _valid_names() -> list[str]:
    return sorted([*_OPTIONS, *_OWN, *(k for k in _WHERE)])


def parse_source_options(
    options: Mapping[str, str], *, env: Mapping[str, str] | None = None, dbutils: Any = None
) -> SourceReadOptions:
    """Check the source's options and build :class:`SourceReadOptions` (driver). Keys are case-insensitive;
    Spark's own (:data:`SPARK_OPTIONS`: ``path``, ``paths``) are accepted and ignored. Every bad option is named in
    one :class:`~spark_sb.core.errors.ConfigError`: an unknown key (with the nearest valid one), an ill-typed or
    out-of-range value, a key given twice in two spellings, a missing ``entity``, options that contradict each
    other (``minMessagesPerTrigger`` above ``maxMessagesPerTrigger``, ...), and the §10 options of later parts
    (sessions, ``subQueue``, ``readBacklog``, ``payloads=ship``)."""
    lowered: dict[str, str] = {}
    errors: list[tuple[str, str]] = []
    for k, v in options.items():
        key = str(k).strip().lower()
        if key in lowered:
            errors.append((str(k), "given twice (option keys are case-insensitive)"))
            continue
        lowered[key] = v if isinstance(v, str) else str(v)
    values: dict[str, Any] = {}
    where: dict[str, str] = {}
    entity_text: str | None = None
    config_path: str | None = None
    for key, text in lowered.items():
        if key in _BY_LOWER:
            name = _BY_LOWER[key]
            attr, parse = _OPTIONS[name]
            try:
                values[attr] = parse(text)
            except ValueError as exc:
                errors.append((name, str(exc)))
        elif key == "entity":
            entity_text = text
        elif key == "config_path":
            config_path = text
        elif key in NOT_YET:
            errors.append(
                (NOT_YET[key], "not supported yet (issue 48 reads non-session entities, primary only)")
            )
        elif key in _WHERE or key.split(".", 1)[0].startswith("x-"):
            where[key] = text
        elif key in SPARK_OPTIONS:
            continue
        else:
            match = difflib.get_close_matches(key, [n.lower() for n in _valid_names()], n=1, cutoff=0.6)
            hint = ""
            if match:
                hint = f" (did you mean {next(n for n in _valid_names() if n.lower() == match[0])!r}?)"
            errors.append((key, f"unknown option{hint}"))
    if values.get("payloads") == "ship":
        errors.append(("payloads", "'ship' is not supported yet (issue 48: 'peek')"))
    config = _config(config_path, where, errors, env, dbutils)
    if entity_text is None and config is not None and config.entity:
        entity_text = config.entity  # the YAML's entity, when the options name none
    entities = _entities(entity_text, values.get("subscription"), errors)
    _together(values, errors)
    if errors:
        raise option_error(errors)
    assert config is not None
    return SourceReadOptions(config=config, entities=entities, **values)


def _config(
    config_path: str | None,
    where: dict[str, str],
    errors: list[tuple[str, str]],
    env: Mapping[str, str] | None,
    dbutils: Any,
) -> ServiceBusConfig | None:
    flat: dict[str, str] = {}
    if config_path is not None:
        if not config_path.strip():
            errors.append(("config_path", "expected the path of a YAML configuration file, found ''"))
            return None
        try:
            base = ServiceBusConfig.from_yaml(config_path.strip(), env=env, dbutils=dbutils)
        except (ConfigError, OSError) as exc:
            errors.append(("config_path", f"{config_path.strip()!r}: {exc}"))
            return None
        flat = base.to_options(include_secrets=True)  # references stay references (resolved again below)
    flat.update(where)
    try:
        return ServiceBusConfig.from_options(flat, env=env, dbutils=dbutils)
    except ConfigError as exc:
        errors.extend(exc.errors or [("options", str(exc))])
        return None


def _entities(text: str | None, subscription: str | None, errors: list[tuple[str, str]]) -> tuple[str, ...]:
    if text is None or not text.strip():
        errors.append(("entity", "required: a queue, or a topic with the subscription option (comma list)"))
        return ()
    names: list[str] = []
    for part in text.split(","):
        name = part.strip().strip("/")
        if not name:
            errors.append(("entity", f"an empty name in {text!r}"))
            continue
        if "/subscriptions/" in name.lower() and subscription:
            errors.append(("entity", f"{name!r} names a subscription already; drop the subscription option"))
            continue
        if name.lower().endswith("/$deadletterqueue"):
            errors.append(("entity", f"{name!r}: dead-letter queues are not supported yet"))
            continue
        if name not in names:
            names.append(name)
    return tuple(names)


def _together(values: dict[str, Any], errors: list[tuple[str, str]]) -> None:
    top = values.get("max_messages_per_trigger", SourceReadOptions.max_messages_per_trigger)
    low = values.get("min_messages_per_trigger")
    if low is not None and low > top:
        errors.append(("minMessagesPerTrigger", f"{low} is above maxMessagesPerTrigger ({top})"))
    wait = values.get("receive_wait_time", SourceReadOptions.receive_wait_time)
    budget = values.get("max_receive_time", SourceReadOptions.max_receive_time)
    if wait > budget:
        errors.append(("receiveWaitTime", f"{wait:g} s is longer than maxReceiveTime ({budget:g} s)"))
    start, end = values.get("starting_sequence_number"), values.get("ending_sequence_number")
    if start is not None and end is not None and start > end:
        errors.append(("startingSequenceNumber", f"{start} is above endingSequenceNumber ({end})"))
