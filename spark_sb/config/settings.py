"""The settings table of the configuration: every key, how its raw value is read and how it is checked (SPEC S8).

Pure: no I/O, nothing live, nothing here is pickled. Used wherever a :class:`~spark_sb.config.service_bus.ServiceBusConfig`
is loaded, built or written back as options (on the driver; on an executor only when one rebuilds a config from
options). :data:`SETTINGS` holds one row per scalar setting - the key (YAML, dicts, Spark options), the attribute
it fills, how a raw value is read (strings from options, YAML scalars) and how a value is checked on
construction; reading, checking and :meth:`~spark_sb.config.service_bus.ServiceBusConfig.to_options` are all derived from it.
:data:`NAMESPACE_READERS` reads the parts of ``primary.*`` / ``secondary.*``, and :data:`KNOWN_KEYS` lists every
key. Errors are :class:`~spark_sb.core.errors.ConfigError` naming the key.
"""

from __future__ import annotations

import contextlib
import difflib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from spark_sb.core.durations import parse_duration
from spark_sb.core.errors import ConfigError
from spark_sb.message.backlog import PROBE_MODES
from spark_sb.message.rows import LOGICAL_COLUMNS

__all__ = [
    "BACKLOG_SELECTIONS",
    "CREDENTIAL_KINDS",
    "FIELD_SETTINGS",
    "KNOWN_KEYS",
    "MESSAGE_ID_MODES",
    "NAMESPACE_READERS",
    "ON_REJECT",
    "ORDERINGS",
    "READERS",
    "RETRY_MODES",
    "RETRY_SETTINGS",
    "SDK_RETRIES_IGNORED",
    "SETTINGS",
    "STATE_WRITES",
    "Setting",
    "did_you_mean",
    "format_value",
    "is_extra_key",
    "one_of",
    "parse_bool",
    "parse_float",
    "parse_int",
    "parse_secret_text",
    "parse_str",
    "unknown_column",
]

BACKLOG_SELECTIONS = ("random", "session-affine")
#: ``ordering``: ``none`` (no order kept through failover), ``session`` (per entity and session id), ``entity`` (per
#: entity, every message). The rule is :mod:`spark_sb.failover.ordering`.
ORDERINGS = ("none", "session", "entity")
ON_REJECT = ("record", "fail")
MESSAGE_ID_MODES = ("column", "content")
STATE_WRITES = ("async", "sync")
RETRY_MODES = ("exponential", "fixed")
CREDENTIAL_KINDS = ("default", "client_secret", "managed_identity")

_err = ConfigError.at

#: What a non-zero ``retry.total`` is told. It once promised SDK retries to the syphon's receivers and the admin
#: client, but no client retries inside a call: each layer retries within its own deadlines.
SDK_RETRIES_IGNORED = (
    "is not honoured: no client retries inside a call (sends are retried by the sender "
    "until failover_interval runs out - retry.backoff_factor, retry.backoff_max, retry.mode -, receives and admin "
    "calls by the syphon's and provisioning's own tries); remove the key"
)


def one_of(key: str, value: Any, valid: tuple[str, ...]) -> ConfigError:
    """The error for ``value`` at ``key`` that is not one of ``valid`` (which it lists)."""
    return _err(key, f"{value!r} is not one of {', '.join(repr(v) for v in valid)}")


def _parse_number(value: Any, key: str, kind: type[int] | type[float], noun: str) -> Any:
    """``value`` (a number, or a string that spells one) as ``kind``; an integer setting takes a float only when
    it is whole. Booleans are refused (YAML's ``yes`` is not 1)."""
    if not isinstance(value, bool):
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return kind(value.strip())
        elif isinstance(value, int) or (isinstance(value, float) and (kind is float or value.is_integer())):
            return kind(value)
    raise _err(key, f"expected {noun}, found {value!r}")


def parse_int(value: Any, key: str) -> int:
    return int(_parse_number(value, key, int, "an integer"))


def parse_float(value: Any, key: str) -> float:
    return float(_parse_number(value, key, float, "a number"))


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def parse_bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise _err(key, f"{value!r} is not one of true, false")


def parse_str(value: Any, key: str) -> str:
    if isinstance(value, str) and value.strip():
        return value.strip()
    raise _err(key, f"expected a non-empty string, found {value!r}")


def parse_secret_text(value: Any, key: str) -> str:
    """A secret's text (its value is never put in the message)."""
    if not isinstance(value, str) or not value.strip():
        raise _err(key, "expected a non-empty string")
    return value.strip()


@dataclass(frozen=True)
class Setting:
    """One setting, the single place that names it: the dotted ``key`` (YAML, dicts, Spark options), the
    attribute it fills (``attr`` of :class:`~spark_sb.config.service_bus.ServiceBusConfig`, or of its ``retry`` when ``owner``
    is ``"retry"``), how a raw value is read (``read(raw, key)``: strings from options, YAML scalars) and how a
    value is checked on construction (``check(value, key, owner_object)``).
    """

    key: str
    attr: str
    read: Callable[[Any, str], Any]
    check: Callable[[Any, str, Any], None]
    owner: str = ""


def _duration(key: str, attr: str, *, positive: bool) -> Setting:
    def check(v: Any, key: str, _: Any) -> None:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise _err(key, f"expected seconds, found {v!r}")  # inf too, as the reader refuses it
        if (v <= 0) if positive else (v < 0):
            raise _err(key, f"must be {'>' if positive else '>='} 0 seconds, found {v!r}")

    return Setting(key, attr, parse_duration, check)


def _integer(key: str, attr: str, bound: str, *, unit: str = "", owner: str = "") -> Setting:
    """An integer setting; ``bound`` is ``"> n"`` or ``">= n"``."""
    op, n = bound.split()
    low = int(n) + (1 if op == ">" else 0)

    def check(v: Any, key: str, _: Any) -> None:
        if not _is_int(v) or v < low:
            raise _err(key, f"must be an integer {bound}{unit}, found {v!r}")

    return Setting(key, attr, parse_int, check, owner)


def _non_negative(key: str, attr: str, *, owner: str = "") -> Setting:
    def check(v: Any, key: str, _: Any) -> None:
        # NaN is never below zero: refused by name (it used to load, and the sender paused its 0.01 s floor); inf is
        # a float above zero, and no number of seconds either
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise _err(key, f"must be a finite number >= 0, found {v!r}")

    return Setting(key, attr, parse_float, check, owner)


def _choice(key: str, attr: str, valid: tuple[str, ...], *, owner: str = "") -> Setting:
    def read(raw: Any, key: str) -> str:
        if not isinstance(raw, str) or raw.strip() not in valid:
            raise one_of(key, raw, valid)
        return raw.strip()

    def check(v: Any, key: str, _: Any) -> None:
        if v not in valid:
            raise one_of(key, v, valid)

    return Setting(key, attr, read, check, owner)


def _text(key: str, attr: str, *, noun: str = "string", strip: bool = False) -> Setting:
    """An optional text setting: ``None`` or a non-empty string (``strip``: not blank either)."""

    def check(v: Any, key: str, _: Any) -> None:
        if v is not None and (not isinstance(v, str) or not (v.strip() if strip else v)):
            raise _err(key, f"expected a non-empty {noun}, found {v!r}")

    return Setting(key, attr, parse_str, check)


def _check_table_prefix(v: Any, key: str, config: Any) -> None:
    if v is None:
        return
    # <prefix><table> names at most three parts: schema.prefix, catalog.schema.prefix or catalog.schema.
    if not isinstance(v, str) or not re.fullmatch(r"[A-Za-z0-9_]+\.[A-Za-z0-9_]+(\.[A-Za-z0-9_]*)?", v):
        raise _err(key, f"expected catalog.schema.prefix (e.g. 'main.ops.sb_'), found {v!r}")
    if config.state_location is not None:
        raise _err(key, "give state_location (paths) or state_table_prefix, not both")


def _check_no_sdk_retries(v: Any, key: str, _: Any) -> None:
    """``retry.total``: the SDK's own retries inside one call, which are off for every client. 0 states that; any
    other count (an old configuration's) is refused with :data:`SDK_RETRIES_IGNORED`, not silently ignored."""
    if not _is_int(v) or v < 0:
        raise _err(key, f"must be 0 (no SDK retries inside a call), found {v!r}")
    if v:
        raise _err(key, f"{v} {SDK_RETRIES_IGNORED}")


def _check_bool(v: Any, key: str, _: Any) -> None:
    if not isinstance(v, bool):
        raise _err(key, f"{v!r} is not one of true, false")


#: Every scalar setting of :class:`~spark_sb.config.service_bus.ServiceBusConfig` and of its ``retry``, in the order they are
#: checked.
SETTINGS: tuple[Setting, ...] = (
    _text("entity", "entity"),
    _integer("backlog_queue_count", "backlog_queue_count", "> 0"),
    _duration("failover_interval", "failover_interval", positive=False),
    _duration("ping_primary_interval", "ping_primary_interval", positive=True),
    _duration("backlog_retry_interval", "backlog_retry_interval", positive=False),
    _duration("send_timeout", "send_timeout", positive=True),
    _duration("syphon.max_wait", "syphon_max_wait", positive=True),
    _duration("syphon.batch_duration", "syphon_batch_duration", positive=True),
    _duration("idle_timeout", "idle_timeout", positive=True),
    _duration("provision.retry_pause", "provision_retry_pause", positive=False),
    _duration("state_retention", "state_retention", positive=True),
    _duration("state_maintain_every", "state_maintain_every", positive=False),
    _duration("exactly_once_horizon", "exactly_once_horizon", positive=True),
    _choice("probe_mode", "probe_mode", PROBE_MODES),
    _choice("backlog_selection", "backlog_selection", BACKLOG_SELECTIONS),
    _choice("ordering", "ordering", ORDERINGS),
    _choice("on_reject", "on_reject", ON_REJECT),
    Setting("retry.total", "total", parse_int, _check_no_sdk_retries, owner="retry"),
    _non_negative("retry.backoff_factor", "backoff_factor", owner="retry"),
    _non_negative("retry.backoff_max", "backoff_max", owner="retry"),
    _choice("retry.mode", "mode", RETRY_MODES, owner="retry"),
    _integer("max_message_size", "max_message_size", "> 0", unit=" (bytes)"),
    _integer("syphon.batch_size", "syphon_batch_size", "> 0"),
    _integer("syphon.prefetch", "syphon_prefetch", ">= 0"),
    _integer("syphon.max_attempts", "syphon_max_attempts", ">= 1"),
    _integer("provision.tries", "provision_tries", ">= 1"),
    Setting("client_cache", "client_cache", parse_bool, _check_bool),
    _text("state_location", "state_location", noun="path"),
    Setting("state_table_prefix", "state_table_prefix", parse_str, _check_table_prefix),
    _text("sink_id", "sink_id", strip=True),
    _choice("message_id_mode", "message_id_mode", MESSAGE_ID_MODES),
    _choice("state_writes", "state_writes", STATE_WRITES),
)
#: The rows of ``retry.*``, and the other rows by the attribute they fill.
RETRY_SETTINGS = tuple(s for s in SETTINGS if s.owner == "retry")
FIELD_SETTINGS = {s.attr: s for s in SETTINGS if not s.owner}

#: How each part of a namespace (``primary.<part>``, ``secondary.<part>``) is read;
#: :meth:`~spark_sb.config.service_bus.NamespaceConfig.check` checks them together.
NAMESPACE_READERS: dict[str, Callable[[Any, str], Any]] = {
    "connection_string": parse_secret_text,
    "fully_qualified_namespace": parse_str,
    "namespace_name": parse_str,
    "use_development_emulator": parse_bool,
    "credential.kind": _choice("credential.kind", "kind", CREDENTIAL_KINDS).read,
    "credential.tenant_id": parse_str,
    "credential.client_id": parse_str,
    "credential.client_secret": parse_secret_text,
}

#: Every key and how its raw value is read.
READERS: dict[str, Callable[[Any, str], Any]] = {
    **{f"{ns}.{part}": read for ns in ("primary", "secondary") for part, read in NAMESPACE_READERS.items()},
    **{s.key: s.read for s in SETTINGS},
    **{f"columns.{c}": parse_str for c in LOGICAL_COLUMNS},
}
KNOWN_KEYS: tuple[str, ...] = tuple(READERS)


def format_value(v: Any) -> str:
    """A setting's value as a Spark option string, read back to the same value by its row's reader."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        # every digit of repr, never an exponent (1e-05, 1e+16): the duration reader takes none
        return repr(v) if not math.isfinite(v) else format(Decimal(repr(v)), "f")
    return str(v)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_extra_key(key: str) -> bool:
    """``x-*`` keys are the user's own, kept in ``ServiceBusConfig.extra`` unread."""
    return key.split(".", 1)[0].startswith("x-")


def did_you_mean(key: str, candidates: tuple[str, ...] | list[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``candidates``, or nothing."""
    match = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def unknown_column(logical: str) -> str:
    """The message for ``columns.<logical>`` that names no logical column."""
    return f"unknown column {logical!r}{did_you_mean(logical, LOGICAL_COLUMNS)}; valid: {', '.join(LOGICAL_COLUMNS)}"
