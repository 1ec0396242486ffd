"""Durations (:mod:`spark_sb.core.durations`): the configuration's durations (:func:`parse_duration`: numbers,
``"30s"``-style units, ISO-8601, ``timedelta``) and the ISO-8601 codec with the service's maximum
(:func:`iso_duration_seconds`, :func:`parse_iso_duration`, :func:`format_iso_duration`)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest

from spark_sb.core.durations import (
    MAX_DURATION,
    MAX_DURATION_ISO,
    format_iso_duration,
    iso_duration_seconds,
    parse_duration,
    parse_iso_duration,
)
from spark_sb.core.errors import ConfigError


# ---------------------------------------------------------------------------------------- ISO-8601 durations
@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("PT1M", Decimal(60)),
        ("PT0S", Decimal(0)),
        ("P1D", Decimal(86400)),
        ("P2W", Decimal(1209600)),
        ("PT1H30M", Decimal(5400)),
        ("P1DT1S", Decimal(86401)),
        ("P3DT4H5M6.000007S", Decimal("273906.000007")),
        ("PT0,5S", Decimal("0.5")),  # a comma is a decimal mark too
        ("PT1.5M", Decimal(90)),
        ("pt1m", Decimal(60)),  # letters in either case
        ("  PT1S ", Decimal(1)),
        ("-PT5S", Decimal(-5)),
        ("-P1DT1H", Decimal(-90000)),
        (MAX_DURATION_ISO, Decimal("922337203685.4775807")),
    ],
)
def test_iso_duration_seconds_is_the_exact_number_of_seconds(text: str, seconds: Decimal) -> None:
    assert iso_duration_seconds(text) == seconds


@pytest.mark.parametrize(
    "text",
    ["", "P", "PT", "-P", "-PT", "P1DT", "pt", "P1Y", "P1M", "P1Y2M", "1M", "PT1M1H", "PT-1S", "P.5D", "abc"],
)
def test_iso_duration_seconds_refuses_what_is_not_a_day_time_duration(text: str) -> None:
    with pytest.raises(ValueError, match="is not an ISO 8601 duration"):
        iso_duration_seconds(text)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("PT1M", timedelta(minutes=1)),
        ("P1DT1.5S", timedelta(days=1, seconds=1.5)),
        ("-PT1.5S", timedelta(seconds=-1.5)),
        ("PT0.0000019S", timedelta(microseconds=1)),  # below a microsecond: truncated
        ("-PT0.0000019S", timedelta(microseconds=-1)),  # towards zero
        (MAX_DURATION_ISO, MAX_DURATION),
    ],
)
def test_parse_iso_duration_gives_a_timedelta_truncated_to_microseconds(text: str, value: timedelta) -> None:
    assert parse_iso_duration(text) == value


def test_parse_iso_duration_of_a_span_beyond_timedelta_is_an_overflow() -> None:
    assert parse_iso_duration("P999999999D") == timedelta(days=999999999)
    with pytest.raises(OverflowError):
        parse_iso_duration("P1000000000D")
    with pytest.raises(ValueError, match="is not an ISO 8601 duration"):
        parse_iso_duration("P1Y")


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(0), "PT0S"),
        (timedelta(minutes=1), "PT1M"),
        (timedelta(hours=1, minutes=2, seconds=3), "PT1H2M3S"),
        (timedelta(days=2), "P2D"),
        (timedelta(weeks=2), "P14D"),
        (timedelta(days=1, seconds=1.5), "P1DT1.5S"),
        (timedelta(microseconds=10), "PT0.00001S"),
        (timedelta(seconds=-5), "-PT5S"),
        (timedelta(days=-1, hours=-1), "-P1DT1H"),
        (MAX_DURATION - timedelta(microseconds=1), "P10675199DT2H48M5.477579S"),
        (MAX_DURATION, MAX_DURATION_ISO),
        (timedelta.max, MAX_DURATION_ISO),  # beyond the service's maximum: written as the maximum
    ],
)
def test_format_iso_duration_writes_what_the_service_writes(value: timedelta, text: str) -> None:
    assert format_iso_duration(value) == text


@pytest.mark.parametrize(
    "value",
    [
        timedelta(0),
        timedelta(microseconds=1),
        timedelta(seconds=59, microseconds=999999),
        timedelta(days=3, hours=4, minutes=5, seconds=6, microseconds=7),
        timedelta(seconds=-90),
        MAX_DURATION,
    ],
)
def test_format_and_parse_iso_duration_round_trip(value: timedelta) -> None:
    assert parse_iso_duration(format_iso_duration(value)) == value


# ------------------------------------------------------------------------------ the configuration's durations
@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        (30, 30.0),
        (30.5, 30.5),
        ("30", 30.0),
        ("30.5", 30.5),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("250ms", 0.25),
        ("2d", 172800.0),
        ("PT1M", 60.0),
        ("PT1H30M", 5400.0),
        ("PT0.5S", 0.5),
        ("P1DT1S", 86401.0),
        (timedelta(minutes=2), 120.0),
    ],
)
def test_parse_duration_reads_numbers_units_iso_and_timedeltas(text: Any, seconds: float) -> None:
    assert parse_duration(text, "k") == seconds


@pytest.mark.parametrize("text", ["", "abc", "5 parsecs", "P", "PT", "-5s", True, None, [1]])
def test_parse_duration_refuses_what_is_not_a_duration_naming_the_key(text: Any) -> None:
    with pytest.raises(ConfigError, match="^k: "):
        parse_duration(text, "k")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30sec", 30.0),
        ("2min", 120.0),
        ("30S", 30.0),
        ("5 M", 300.0),
        ("  30s  ", 30.0),
        (".5s", 0.5),
        ("1.5m", 90.0),
        ("1.", 1.0),
        ("0", 0.0),
    ],
)
def test_parse_duration_reads_unit_spellings_case_and_spaces(text: str, seconds: float) -> None:
    assert parse_duration(text, "k") == seconds


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_parse_duration_refuses_a_duration_that_is_not_finite(value: float) -> None:
    with pytest.raises(ConfigError, match="^k: .* is not a finite duration$"):
        parse_duration(value, "k")


def test_parse_duration_refuses_a_negative_iso_duration() -> None:
    assert parse_duration("PT1M", "k") == 60.0
    with pytest.raises(ConfigError, match=r"^k: '-PT1M' is not a duration \(examples: "):
        parse_duration("-PT1M", "k")


def test_parse_duration_says_what_it_found_and_names_duration_when_given_no_key() -> None:
    with pytest.raises(ConfigError, match="^duration: expected a duration, found list$"):
        parse_duration([1])
    with pytest.raises(ConfigError, match="^duration: expected a duration, found True$"):
        parse_duration(True)


# ------------------------------------------------------------------- the local namespace's copy of the codec
#: Texts and values both ISO codecs meet: the service's own spellings, fractions, signs, the maximum and beyond.
_ISO_TEXTS = [
    "PT1M",
    "P2W",
    "PT0,5S",
    "pt1m",
    "-P1DT1H",
    "P3DT4H5M6.000007S",
    "PT0.0000019S",
    MAX_DURATION_ISO,
]
_ISO_REFUSED = ["", "P", "PT", "P1DT", "P1Y", "PT1M1H", "PT-1S", "abc"]
_VALUES = [
    timedelta(0),
    timedelta(seconds=-90),
    timedelta(days=3, microseconds=7),
    MAX_DURATION,
    timedelta.max,
]


def test_the_local_namespaces_copy_of_the_iso_codec_agrees_with_this_one() -> None:
    """The product and the local namespace (a distribution of its own that imports nothing of the product) each
    keep the ISO-8601 codec, and each needs both directions (the product: configuration in, provisioning drift
    out; the local namespace: the Atom admin API in and out) - two copies of one grammar, held together here: a
    change to one that the other does not make fails this test."""
    local = pytest.importorskip("servicebus_local.durations")
    assert (local.MAX_DURATION, local.MAX_DURATION_ISO) == (MAX_DURATION, MAX_DURATION_ISO)
    for text in _ISO_TEXTS:
        assert local.iso_duration_seconds(text) == iso_duration_seconds(text), text
        assert local.parse_iso_duration(text) == parse_iso_duration(text), text
    for text in _ISO_REFUSED:
        for codec in (local.iso_duration_seconds, iso_duration_seconds):
            with pytest.raises(ValueError, match="is not an ISO 8601 duration"):
                codec(text)
    for value in _VALUES:
        assert local.format_iso_duration(value) == format_iso_duration(value), value
