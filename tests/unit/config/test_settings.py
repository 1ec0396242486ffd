"""The settings table (:mod:`spark_sb.config.settings`, SPEC S8): how each raw value is read (options are strings,
YAML gives scalars), how each value is checked, and that every error names the key it is about."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace
from typing import Any

import pytest

from spark_sb.config.namespace import RetryConfig
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.config.settings import (
    FIELD_SETTINGS,
    KNOWN_KEYS,
    NAMESPACE_READERS,
    READERS,
    RETRY_SETTINGS,
    SDK_RETRIES_IGNORED,
    SETTINGS,
    Setting,
    did_you_mean,
    format_value,
    is_extra_key,
    one_of,
    parse_bool,
    parse_float,
    parse_int,
    parse_secret_text,
    parse_str,
    unknown_column,
)
from spark_sb.core.errors import ConfigError
from spark_sb.message.rows import LOGICAL_COLUMNS

BY_KEY = {s.key: s for s in SETTINGS}
NO_CONFIG = SimpleNamespace(state_location=None)  # what a check's third argument offers
CONN = "Endpoint=sb://contoso.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=a2V5"


def error(fn: Any, *args: Any) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        fn(*args)
    return caught.value


def assert_names(err: ConfigError, key: str, fragment: str = "") -> None:
    assert str(err).startswith(f"{key}: ")
    assert [k for k, _ in err.errors] == [key]
    assert fragment in str(err)


def read(key: str, raw: Any) -> Any:
    return BY_KEY[key].read(raw, key)


def check(key: str, value: Any, owner: Any = NO_CONFIG) -> None:
    BY_KEY[key].check(value, key, owner)


# ------------------------------------------------------------------------------------------------ numbers
@pytest.mark.parametrize(("raw", "value"), [("42", 42), (" 7 ", 7), (3, 3), (3.0, 3), ("-2", -2)])
def test_an_integer_is_read_from_a_number_or_its_spelling(raw: Any, value: int) -> None:
    got = parse_int(raw, "syphon.batch_size")
    assert got == value and type(got) is int


@pytest.mark.parametrize("raw", [3.5, "3.5", "3.0", "ten", "", True, False, None, [3]])
def test_an_integer_setting_refuses_fractions_words_and_booleans(raw: Any) -> None:
    assert_names(error(parse_int, raw, "syphon.batch_size"), "syphon.batch_size", "expected an integer")


@pytest.mark.parametrize(
    ("raw", "value"), [("2.5", 2.5), (" 0.125 ", 0.125), (2, 2.0), (2.5, 2.5), ("1e3", 1000.0)]
)
def test_a_number_is_read_from_a_number_or_its_spelling(raw: Any, value: float) -> None:
    got = parse_float(raw, "retry.backoff_factor")
    assert got == value and type(got) is float


@pytest.mark.parametrize("raw", ["fast", "", True, None, {"a": 1}])
def test_a_number_setting_refuses_words_and_booleans(raw: Any) -> None:
    assert_names(error(parse_float, raw, "retry.backoff_factor"), "retry.backoff_factor", "expected a number")


# ------------------------------------------------------------------------------------------------- booleans
@pytest.mark.parametrize("raw", [True, "true", "TRUE", " yes ", "on", "1", 1])
def test_true_is_spelled_several_ways(raw: Any) -> None:
    assert parse_bool(raw, "client_cache") is True


@pytest.mark.parametrize("raw", [False, "false", "False", "no", " off", "0", 0])
def test_false_is_spelled_several_ways(raw: Any) -> None:
    assert parse_bool(raw, "client_cache") is False


@pytest.mark.parametrize("raw", ["maybe", "", 2, -1, 1.0, None, "y"])
def test_anything_else_is_not_a_boolean(raw: Any) -> None:
    assert_names(error(parse_bool, raw, "client_cache"), "client_cache", "is not one of true, false")


def test_a_boolean_setting_holds_a_boolean_not_a_number() -> None:
    check("client_cache", True)
    assert_names(error(check, "client_cache", 1), "client_cache", "is not one of true, false")


# ---------------------------------------------------------------------------------------------------- text
def test_text_is_stripped_and_blank_text_refused() -> None:
    assert parse_str("  orders ", "entity") == "orders"
    for raw in ("", "   ", None, 5):
        assert_names(error(parse_str, raw, "entity"), "entity", "expected a non-empty string")


def test_a_secrets_text_is_stripped_and_never_shown_in_its_error() -> None:
    assert parse_secret_text(" Endpoint=sb://h/ ", "primary.connection_string") == "Endpoint=sb://h/"
    not_text = b"SharedAccessKey=BytesNotText123"
    err = error(parse_secret_text, not_text, "primary.connection_string")
    assert_names(err, "primary.connection_string", "expected a non-empty string")
    assert "BytesNotText123" not in str(err)
    assert "BytesNotText123" in str(error(parse_str, not_text, "entity"))  # what an ordinary text error shows


def test_optional_text_settings_take_none_or_non_empty_text() -> None:
    check("entity", None)
    check("entity", "orders")
    assert_names(error(check, "entity", ""), "entity", "expected a non-empty string")
    assert_names(error(check, "entity", 5), "entity", "expected a non-empty string")
    assert_names(error(check, "state_location", ""), "state_location", "expected a non-empty path")


def test_a_sink_id_must_not_be_blank_either() -> None:
    check("entity", " ")  # an entity name is the user's business
    check("sink_id", "orders-sink")
    assert_names(error(check, "sink_id", "   "), "sink_id", "expected a non-empty string")


# ----------------------------------------------------------------------------------------------- durations
@pytest.mark.parametrize(
    ("raw", "seconds"), [("5m", 300.0), ("250ms", 0.25), ("PT1M", 60.0), (30, 30.0), ("1.5h", 5400.0)]
)
def test_a_duration_setting_reads_seconds_units_and_iso(raw: Any, seconds: float) -> None:
    assert read("failover_interval", raw) == seconds


@pytest.mark.parametrize("raw", ["soon", "-5s", "-PT1M", "5 years", True])
def test_a_duration_setting_refuses_what_is_not_a_duration(raw: Any) -> None:
    assert_names(error(read, "ping_primary_interval", raw), "ping_primary_interval")


def test_zero_is_a_duration_only_where_it_means_something() -> None:
    for key in (
        "failover_interval",
        "backlog_retry_interval",
        "provision.retry_pause",
        "state_maintain_every",
    ):
        check(key, 0.0)  # fail over at once, no pause, never maintain
        assert_names(error(check, key, -1.0), key, "must be >= 0 seconds")
    for key in (
        "ping_primary_interval",
        "send_timeout",
        "syphon.max_wait",
        "idle_timeout",
        "state_retention",
        "exactly_once_horizon",
    ):
        check(key, 0.001)
        assert_names(error(check, key, 0.0), key, "must be > 0 seconds")


@pytest.mark.parametrize("value", [math.nan, math.inf, "30", True, None])
def test_a_duration_value_must_be_a_number_of_seconds(value: Any) -> None:
    assert_names(error(check, "send_timeout", value), "send_timeout", "expected seconds")


# ------------------------------------------------------------------------------------------------ integers
@pytest.mark.parametrize(
    ("key", "lowest"),
    [
        ("backlog_queue_count", 1),
        ("max_message_size", 1),
        ("syphon.batch_size", 1),
        ("syphon.prefetch", 0),
        ("syphon.max_attempts", 1),
        ("provision.tries", 1),
    ],
)
def test_an_integer_setting_has_a_lowest_value(key: str, lowest: int) -> None:
    check(key, lowest)
    check(key, lowest + 1000)
    assert_names(error(check, key, lowest - 1), key, "must be an integer")
    assert_names(error(check, key, float(lowest)), key, "must be an integer")
    assert_names(error(check, key, True), key, "must be an integer")


def test_the_message_size_bound_says_its_unit() -> None:
    assert "must be an integer > 0 (bytes), found 0" in str(error(check, "max_message_size", 0))


def test_sdk_retries_are_refused_with_what_retries_instead() -> None:
    check("retry.total", 0)
    assert_names(error(check, "retry.total", 3), "retry.total", SDK_RETRIES_IGNORED)
    assert_names(error(check, "retry.total", -1), "retry.total", "must be 0")


# ------------------------------------------------------------------------------------------- the back-off
@pytest.mark.parametrize("key", ["retry.backoff_factor", "retry.backoff_max"])
def test_the_back_off_is_a_number_of_seconds_not_below_zero(key: str) -> None:
    assert read(key, "0.5") == 0.5
    check(key, 0.0)
    check(key, 2)
    assert_names(error(check, key, -0.1), key, ">= 0")


@pytest.mark.parametrize("key", ["retry.backoff_factor", "retry.backoff_max"])
def test_a_back_off_that_is_not_a_number_is_refused(key: str) -> None:
    """``nan`` reads as a float and is never below zero: it used to load, and the sender paused 0.01 s instead."""
    assert_names(error(check, key, math.nan), key, ">= 0")
    assert_names(
        error(check, key, "0.5"), key, ">= 0"
    )  # built directly with a string: a ConfigError, no TypeError
    with pytest.raises(ConfigError, match=r"^retry\.backoff_factor: "):
        RetryConfig(backoff_factor=float("nan")).check()


@pytest.mark.parametrize("key", ["retry.backoff_factor", "retry.backoff_max"])
@pytest.mark.parametrize("raw", ["inf", "Infinity", "-inf", math.inf])
def test_an_endless_back_off_is_refused_like_nan(key: str, raw: Any) -> None:
    """``inf`` reads as a float (``float("inf")``) and is above zero: it loaded, as NaN once did."""
    assert_names(error(check, key, math.inf), key, "finite number >= 0")
    settings = {"primary.connection_string": CONN, "retry.backoff_factor": 0.5, "retry.backoff_max": 60}
    with pytest.raises(ConfigError, match=rf"^{key.replace('.', '[.]')}: must be a finite number >= 0"):
        ServiceBusConfig.from_dict({**settings, key: raw})


# ------------------------------------------------------------------------------------------------- choices
@pytest.mark.parametrize(
    ("key", "valid"),
    [
        ("probe_mode", ("schedule-cancel", "ping")),
        ("backlog_selection", ("random", "session-affine")),
        ("ordering", ("none", "session", "entity")),
        ("on_reject", ("record", "fail")),
        ("retry.mode", ("exponential", "fixed")),
        ("message_id_mode", ("column", "content")),
        ("state_writes", ("async", "sync")),
    ],
)
def test_a_choice_takes_one_of_its_values_and_an_error_lists_them_all(
    key: str, valid: tuple[str, ...]
) -> None:
    for v in valid:
        assert read(key, f" {v} ") == v
        check(key, v)
    for bad in ("bogus", valid[0].upper(), 1):
        err = error(read, key, bad)
        assert_names(err, key, f"{bad!r} is not one of")
        assert all(repr(v) in str(err) for v in valid)
    assert_names(error(check, key, "bogus"), key, "is not one of")


def test_one_of_quotes_the_value_and_each_valid_value() -> None:
    err = one_of("probe_mode", "pong", ("schedule-cancel", "ping"))
    assert str(err) == "probe_mode: 'pong' is not one of 'schedule-cancel', 'ping'"
    assert err.errors == [("probe_mode", "'pong' is not one of 'schedule-cancel', 'ping'")]


def test_a_credential_kind_is_a_choice_too() -> None:
    assert (
        NAMESPACE_READERS["credential.kind"]("managed_identity", "primary.credential.kind")
        == "managed_identity"
    )
    assert_names(
        error(NAMESPACE_READERS["credential.kind"], "password", "primary.credential.kind"),
        "primary.credential.kind",
        "'default', 'client_secret', 'managed_identity'",
    )


# ------------------------------------------------------------------------------------------- table prefix
@pytest.mark.parametrize("prefix", ["main.ops.sb_", "main.ops.", "main.ops", "hive_metastore.default.x1"])
def test_a_table_prefix_names_a_catalog_and_schema(prefix: str) -> None:
    check("state_table_prefix", prefix)


@pytest.mark.parametrize("prefix", ["sb_", "main", "main.ops.sb-", "main ops.sb_", "main..sb_", 42])
def test_a_table_prefix_that_is_not_catalog_schema_prefix_is_refused(prefix: Any) -> None:
    assert_names(
        error(check, "state_table_prefix", prefix), "state_table_prefix", "expected catalog.schema.prefix"
    )


@pytest.mark.parametrize("prefix", ["main.ops.sb_.x", "a.b.c.", "a.b.c.d"])
def test_a_table_prefix_never_makes_a_name_of_four_parts(prefix: str) -> None:
    """The tables are ``<prefix>events`` etc.: ``a.b.c.d`` would name ``a.b.c.devents``, which no catalog has."""
    assert_names(
        error(check, "state_table_prefix", prefix), "state_table_prefix", "expected catalog.schema.prefix"
    )


def test_a_table_prefix_and_a_state_location_are_not_both_given() -> None:
    check("state_table_prefix", None, SimpleNamespace(state_location="/tmp/state"))
    err = error(check, "state_table_prefix", "main.ops.sb_", SimpleNamespace(state_location="/tmp/state"))
    assert_names(err, "state_table_prefix", "not both")


# ----------------------------------------------------------------------------------------- the table itself
def test_every_setting_fills_an_attribute_of_its_owner() -> None:
    config_fields = {f.name for f in dataclasses.fields(ServiceBusConfig)}
    retry_fields = {f.name for f in dataclasses.fields(RetryConfig)}
    assert {s.attr for s in RETRY_SETTINGS} == retry_fields
    assert set(FIELD_SETTINGS) <= config_fields
    assert all(s.owner in ("", "retry") for s in SETTINGS)
    assert len({s.key for s in SETTINGS}) == len(SETTINGS)


def test_every_key_is_known_with_its_reader() -> None:
    assert set(KNOWN_KEYS) == set(READERS)
    for ns in ("primary", "secondary"):
        assert {f"{ns}.{part}" for part in NAMESPACE_READERS} <= set(KNOWN_KEYS)
    assert {f"columns.{c}" for c in LOGICAL_COLUMNS} <= set(KNOWN_KEYS)
    assert {s.key for s in SETTINGS} <= set(KNOWN_KEYS)
    assert READERS["secondary.connection_string"] is parse_secret_text


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.key)
def test_a_raw_value_of_the_wrong_kind_is_an_error_naming_its_key(setting: Setting) -> None:
    assert_names(error(setting.read, [1, 2], setting.key), setting.key)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.key)
def test_a_value_of_the_wrong_type_is_an_error_naming_its_key(setting: Setting) -> None:
    """Direct construction skips the readers: the checks alone must refuse, with a ConfigError."""
    assert_names(error(setting.check, object(), setting.key, NO_CONFIG), setting.key)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.key)
def test_every_default_is_written_as_an_option_that_reads_back_the_same(setting: Setting) -> None:
    owner = RetryConfig if setting.owner == "retry" else ServiceBusConfig
    default = {f.name: f.default for f in dataclasses.fields(owner)}[setting.attr]
    if default is None:
        return  # not written as an option
    text = format_value(default)
    assert isinstance(text, str)
    assert setting.read(text, setting.key) == default


# -------------------------------------------------------------------------------------------- format_value
@pytest.mark.parametrize("value", [0.1 + 0.2, 1e-7, 123456789.123456789, 2.5, 1e21])
def test_a_float_is_written_with_every_digit(value: float) -> None:
    assert parse_float(format_value(value), "retry.backoff_factor") == value
    assert read("send_timeout", format_value(value)) == value


def test_booleans_are_written_as_true_and_false() -> None:
    assert (format_value(True), format_value(False)) == ("true", "false")
    assert parse_bool(format_value(False), "client_cache") is False
    assert format_value(10) == "10" and format_value("main.ops.sb_") == "main.ops.sb_"


# -------------------------------------------------------------------------------------- keys and suggestions
@pytest.mark.parametrize(
    ("key", "extra"), [("x-owner", True), ("x-team.name", True), ("xowner", False), ("retry.x-foo", False)]
)
def test_x_keys_are_the_users_own(key: str, extra: bool) -> None:
    assert is_extra_key(key) is extra


def test_did_you_mean_suggests_the_closest_candidate_or_nothing() -> None:
    assert did_you_mean("entitiy", list(KNOWN_KEYS)) == " (did you mean 'entity'?)"
    assert did_you_mean("retry.backof_max", list(KNOWN_KEYS)) == " (did you mean 'retry.backoff_max'?)"
    assert did_you_mean("zzzzzz", list(KNOWN_KEYS)) == ""
    assert did_you_mean("anything", ()) == ""


def test_an_unknown_column_is_named_with_a_suggestion_and_the_valid_columns() -> None:
    text = unknown_column("bdy")
    assert text.startswith("unknown column 'bdy' (did you mean 'body'?); valid: ")
    assert text.endswith(", ".join(LOGICAL_COLUMNS))
    assert "did you mean" not in unknown_column("qqqqqqq")
    assert unknown_column("qqqqqqq").endswith(", ".join(LOGICAL_COLUMNS))
