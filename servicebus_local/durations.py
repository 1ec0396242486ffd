"""ISO-8601 durations and the service's maximum duration for the local namespace's admin endpoint and topology
files (its own copy of ``spark_sb.core.durations``: the emulator depends on nothing of the product).

The grammar is the day-time subset the service speaks (``PT1M``, ``P3DT4H5M6.000007S``, ``P2W``,
``P10675199DT2H48M5.4775807S``): optional sign, weeks, days, hours, minutes, seconds, each with an optional
fraction (``.`` or ``,``), letters in either case. Years and months are refused (not a fixed span). Callers add
their own rules (a sign, the maximum) and their own error types. Pure; runs anywhere.
"""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

__all__ = [
    "MAX_DURATION",
    "MAX_DURATION_ISO",
    "format_iso_duration",
    "iso_duration_seconds",
    "parse_iso_duration",
    "parse_seconds",
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


_SHORT_DURATION = re.compile(r"^(?P<number>\d+(?:\.\d+)?|\.\d+)\s*(?P<unit>ms|s|m|h|d)?$", re.IGNORECASE)
_SHORT_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_seconds(text: str) -> float:
    """A command-line duration in seconds: ``20s``, ``10m``, ``1h``, ``1d``, ``500ms`` or plain seconds
    (``90``, ``0.5``); an ISO-8601 duration (``PT10M``) is accepted too. Raises ``ValueError`` naming the
    text otherwise (negative values included)."""
    value = text.strip()
    match = _SHORT_DURATION.match(value)
    if match:
        return float(match["number"]) * _SHORT_UNITS[(match["unit"] or "s").lower()]
    if value[:1] in ("P", "p"):
        seconds = iso_duration_seconds(value)
        if seconds >= 0:
            return float(seconds)
    raise ValueError(f"{text!r} is not a duration (expected e.g. 20s, 10m, 1h or a number of seconds)")


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
