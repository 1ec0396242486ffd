"""Durations: the configuration's (``30``, ``"30s"``, ``"5m"``, ``"250ms"``, ISO ``"PT1M"``: :func:`parse_duration`)
and ISO-8601 with the service's maximum duration, the one codec for config and provisioning (the local namespace,
a distribution of its own, keeps its own copy, held to this one by
``tests/unit/core/test_durations.py``).

The grammar is the day-time subset the service speaks (``PT1M``, ``P3DT4H5M6.000007S``, ``P2W``,
``P10675199DT2H48M5.4775807S``): optional sign, weeks, days, hours, minutes, seconds, each with an optional
fraction (``.`` or ``,``), letters in either case. Years and months are refused (not a fixed span). Callers add
their own rules (a sign, the maximum) and their own error types. Pure; runs anywhere.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from decimal import Decimal
from typing import Any

from spark_sb.core.errors import ConfigError

__all__ = [
    "MAX_DURATION",
    "MAX_DURATION_ISO",
    "format_iso_duration",
    "iso_duration_seconds",
    "parse_duration",
    "parse_iso_duration",
]

#: .NET ``TimeSpan.MaxValue``: what the service reports for "unlimited" TTL / auto-delete-on-idle and the largest
#: duration it accepts, less the sub-microsecond rest that Python's ``timedelta`` would round *up* (the SDK trims
#: values read back the same way, ``_model_workaround.avoid_timedelta_overflow``).
MAX_DURATION = timedelta(days=10675199, hours=2, minutes=48, seconds=5, microseconds=477580)
#: :data:`MAX_DURATION` as the service writes it (and accepts it) in an Atom body.
MAX_DURATION_ISO = "P10675199DT2H48M5.4775807S"

_NUMBER = r"\d+(?:[.,]\d+)?"
_ISO_DURATION = re.compile(
    rf"^(?P<sign>-)?P(?:(?P<weeks>{_NUMBER})W)?(?:(?P<days>{_NUMBER})D)?"
    rf"(?:T(?:(?P<hours>{_NUMBER})H)?(?:(?P<minutes>{_NUMBER})M)?(?:(?P<seconds>{_NUMBER})S)?)?$",
    re.IGNORECASE,
)
_UNIT_SECONDS = {"weeks": 604800, "days": 86400, "hours": 3600, "minutes": 60, "seconds": 1}


def iso_duration_seconds(text: str) -> Decimal:
    """The exact number of seconds (negative with a ``-`` sign) of an ISO-8601 duration.

    Raises ``ValueError`` if ``text`` is not one (empty, ``P``, ``PT``, a trailing ``T``, years or months).
    """
    value = text.strip()
    match = _ISO_DURATION.match(value)
    if not match or value.upper() in ("P", "-P", "PT", "-PT") or value.upper().endswith("T"):
        raise ValueError(f"{text!r} is not an ISO 8601 duration")
    parts = match.groupdict()
    total = sum(
        (
            Decimal(parts[unit].replace(",", ".")) * factor
            for unit, factor in _UNIT_SECONDS.items()
            if parts[unit]
        ),
        Decimal(0),
    )
    return -total if parts["sign"] else total


def parse_iso_duration(text: str) -> timedelta:
    """An ISO-8601 duration as a ``timedelta``; fractions below a microsecond are truncated.

    Raises ``ValueError`` if ``text`` is not a duration and ``OverflowError`` if it is beyond ``timedelta``.
    """
    seconds = iso_duration_seconds(text)
    whole = int(seconds)
    return timedelta(seconds=whole, microseconds=int((seconds - whole) * 1_000_000))


def format_iso_duration(value: timedelta) -> str:
    """The ISO-8601 text of ``value`` (``PT1M``, ``P1DT1.5S``, ``-PT5S``, ``PT0S``); :data:`MAX_DURATION` and
    above are written as the service writes the maximum (:data:`MAX_DURATION_ISO`)."""
    if value >= MAX_DURATION:
        return MAX_DURATION_ISO
    sign = "-" if value < timedelta(0) else ""
    value = abs(value)
    hours, rest = divmod(value.seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    text = f"{sign}P" + (f"{value.days}D" if value.days else "")
    time_part = (f"{hours}H" if hours else "") + (f"{minutes}M" if minutes else "")
    if seconds or value.microseconds:
        fraction = f".{value.microseconds:06d}".rstrip("0") if value.microseconds else ""
        time_part += f"{seconds}{fraction}S"
    if time_part:
        text += "T" + time_part
    return "PT0S" if text in ("P", "-P") else text


# ------------------------------------------------------------------------------ the configuration's durations
_err = ConfigError.at
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(ms|s|sec|m|min|h|d)?\s*$", re.IGNORECASE)
_UNIT = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: Any, key: str = "duration") -> float:
    """Seconds from ``30``, ``30.5``, ``"30s"``, ``"5m"``, ``"1h"``, ``"250ms"``, ``"2d"``, ISO-8601 ``"PT1M"``
    or a ``timedelta``. Raises :class:`~spark_sb.core.errors.ConfigError` naming ``key``."""
    if isinstance(value, bool):
        raise _err(key, f"expected a duration, found {value!r}")
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        m = _DURATION.match(text)
        if m:
            seconds = float(m.group(1)) * _UNIT[(m.group(2) or "s").lower()]
        else:
            try:
                iso: Decimal | None = iso_duration_seconds(text)
            except ValueError:
                iso = None
            if iso is None or iso < 0:  # a negative ISO duration is not one here
                raise _err(
                    key,
                    f"{value!r} is not a duration (examples: 30, 30.5, '30s', '5m', '1h', '250ms', 'PT1M')",
                )
            seconds = float(iso)
    else:
        raise _err(key, f"expected a duration, found {type(value).__name__}")
    if math.isnan(seconds) or math.isinf(seconds):
        raise _err(key, f"{value!r} is not a finite duration")
    return seconds
