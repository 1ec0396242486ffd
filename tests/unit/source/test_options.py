"""The source's options (SOURCE.md §10, R22): defaults, case-insensitive keys, durations and sizes, the sink's
connection keys and ``config_path``, and every bad option named before anything is received."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from spark_sb.core.errors import ConfigError
from spark_sb.source.options import SPARK_OPTIONS, SourceReadOptions, parse_source_options

PRIMARY = (
    "Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=k;SharedAccessKey=p-secret;UseDevelopmentEmulator=true"
)
BASE = {"primary.connection_string": PRIMARY, "entity": "orders"}


def _bad(options: dict[str, str], *names: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_source_options(options)
    assert [k for k, _ in info.value.errors] == list(names), info.value.errors
    return info.value


def test_the_defaults_are_those_of_the_design() -> None:
    o = parse_source_options(BASE)
    assert (o.entities, o.path, o.subscription) == (("orders",), "orders", None)
    assert (o.max_messages_per_trigger, o.max_bytes_per_trigger, o.min_messages_per_trigger) == (
        50_000,
        None,
        None,
    )
    assert (o.max_trigger_delay, o.max_receive_time, o.receive_wait_time) == (900.0, 10.0, 1.0)
    assert (
        o.fail_on_data_loss,
        o.recover_deferred,
        o.body_format,
        o.payloads,
        o.read_ahead,
        o.defer_after,
    ) == (
        True,
        False,
        "binary",
        "peek",
        True,
        10.0,
    )
    assert (o.min_partitions, o.max_messages_per_partition, o.max_offset_ranges, o.prefetch_count) == (
        None,
        5_000,
        10_000,
        0,
    )
    assert (o.starting_sequence_number, o.ending_sequence_number, o.source_id) == (None, None, None)
    assert o.config.primary.connection_string is not None


def test_keys_are_case_insensitive_and_values_typed() -> None:
    o = parse_source_options(
        {
            "PRIMARY.CONNECTION_STRING": PRIMARY,
            "Entity": "events",
            "subscription": "audit",
            "maxmessagespertrigger": "1_000",
            "MAXBYTESPERTRIGGER": "64MB",
            "minMessagesPerTrigger": "10",
            "maxTriggerDelay": "15m",
            "maxReceiveTime": "2.5",
            "receiveWaitTime": "250ms",
            "failOnDataLoss": "FALSE",
            "recoverDeferred": "true",
            "readAhead": "False",
            "deferAfter": "0",
            "minPartitions": "4",
            "maxMessagesPerPartition": "100",
            "bodyFormat": "String",
            "sourceId": "orders-to-delta",
            "maxOffsetRanges": "50",
            "prefetchCount": "20",
            "startingSequenceNumber": "5",
            "endingSequenceNumber": "9",
        }
    )
    assert o.paths == ("events/subscriptions/audit",)
    assert (o.max_messages_per_trigger, o.max_bytes_per_trigger, o.min_messages_per_trigger) == (
        1000,
        64 * 1024**2,
        10,
    )
    assert (o.max_trigger_delay, o.max_receive_time, o.receive_wait_time) == (900.0, 2.5, 0.25)
    assert (o.fail_on_data_loss, o.recover_deferred, o.body_format, o.read_ahead) == (
        False,
        True,
        "string",
        False,
    )
    assert (o.min_partitions, o.max_messages_per_partition, o.max_offset_ranges, o.prefetch_count) == (
        4,
        100,
        50,
        20,
    )
    assert (o.starting_sequence_number, o.ending_sequence_number, o.source_id) == (5, 9, "orders-to-delta")


def test_the_options_are_frozen_picklable_and_hashable() -> None:
    o = parse_source_options({**BASE, "maxReceiveTime": "10s"})
    again = pickle.loads(pickle.dumps(o))
    assert again == o and hash(again) == hash(o)
    assert isinstance(again, SourceReadOptions)
    with pytest.raises(AttributeError):
        o.max_receive_time = 1.0  # type: ignore[misc]
    assert "p-secret" not in repr(o)


def test_an_unknown_option_is_named_with_the_nearest_valid_one() -> None:
    error = _bad({**BASE, "maxMessagePerTrigger": "10"}, "maxmessagepertrigger")
    assert "did you mean 'maxMessagesPerTrigger'" in str(error)


@pytest.mark.parametrize(
    ("key", "value"),
    [("path", "orders"), ("Path", "orders"), ("PATH", "orders"), ("paths", '["a","b"]'), ("Paths", '["a"]')],
)
def test_an_option_spark_hands_the_reader_is_accepted_and_ignored_in_any_case(key: str, value: str) -> None:
    # load(path) adds 'path', spark.read...load(p1, p2) adds 'paths' (a JSON list): seen in a pyspark 4.2 run
    assert key.lower() in SPARK_OPTIONS  # as it arrives: Spark's options map is case-insensitive
    assert parse_source_options({**BASE, key: value}) == parse_source_options(BASE)


def test_a_typo_beside_sparks_options_is_still_refused_naming_it() -> None:
    error = _bad({**BASE, "path": "orders", "maxMessagePerTrigger": "10"}, "maxmessagepertrigger")
    assert "did you mean 'maxMessagesPerTrigger'" in str(error)
    _bad({"primary.connection_string": PRIMARY, "path": "orders"}, "entity")  # a path is not the entity


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("maxMessagesPerTrigger", "0", "integer >= 1"),
        ("maxMessagesPerTrigger", "ten", "integer >= 1"),
        ("maxBytesPerTrigger", "64 apples", "size in bytes"),
        ("maxReceiveTime", "0s", "above 0"),
        ("receiveWaitTime", "soon", "duration"),
        ("maxTriggerDelay", "-1", "duration"),
        ("failOnDataLoss", "maybe", "true or false"),
        ("bodyFormat", "json", "binary, string"),
        ("prefetchCount", "-1", "integer >= 0"),
        ("sourceId", "a b", "letters"),
        ("startingSequenceNumber", "1.5", "integer >= 0"),
    ],
)
def test_an_ill_typed_value_is_named(name: str, value: str, says: str) -> None:
    error = _bad({**BASE, name: value}, name)
    assert says in str(error) and f"option {name!r}" in str(error)


def test_every_bad_option_is_named_at_once() -> None:
    _bad(
        {**BASE, "maxReceiveTime": "x", "minPartitions": "0", "nonsense": "1"},
        "maxReceiveTime",
        "minPartitions",
        "nonsense",
    )


def test_options_that_contradict_each_other_are_named() -> None:
    _bad({**BASE, "maxMessagesPerTrigger": "10", "minMessagesPerTrigger": "11"}, "minMessagesPerTrigger")
    _bad({**BASE, "maxReceiveTime": "1s", "receiveWaitTime": "2s"}, "receiveWaitTime")
    _bad({**BASE, "startingSequenceNumber": "9", "endingSequenceNumber": "5"}, "startingSequenceNumber")


def test_a_key_given_twice_in_two_spellings_is_named() -> None:
    _bad({**BASE, "bodyFormat": "binary", "BODYFORMAT": "string"}, "BODYFORMAT")


def test_the_entity_is_required_and_a_comma_list() -> None:
    _bad({"primary.connection_string": PRIMARY}, "entity")
    o = parse_source_options({**BASE, "entity": "a, b ,a"})
    assert o.entities == ("a", "b")
    with pytest.raises(ConfigError, match="option 'entity': expected one entity"):
        _ = o.path
    _bad({**BASE, "entity": "t/subscriptions/s", "subscription": "s"}, "entity")
    assert parse_source_options({**BASE, "entity": "t/subscriptions/s"}).path == "t/subscriptions/s"


def test_a_bad_connection_key_is_named_as_the_sink_names_it() -> None:
    _bad({"entity": "orders"}, "primary")
    _bad({**BASE, "primary.connection_string": "junk"}, "primary.connection_string")
    _bad({**BASE, "failover_interval": "never"}, "failover_interval")


def test_later_parts_options_are_refused_as_not_supported_yet() -> None:
    error = _bad({**BASE, "subQueue": "deadletter", "payloads": "ship"}, "subQueue", "payloads")
    assert "not supported yet" in str(error)


def test_config_path_serves_the_connection_and_the_entity(tmp_path: Path) -> None:
    path = tmp_path / "sb.yaml"
    path.write_text(
        "primary:\n  connection_string: ${env:SB_PRIMARY}\nentity: orders\nfailover_interval: 30s\n"
    )
    o = parse_source_options({"config_path": str(path)}, env={"SB_PRIMARY": PRIMARY})
    assert o.entities == ("orders",) and o.config.failover_interval == 30.0
    assert o.config.primary.connection_string is not None
    assert o.config.primary.connection_string.reveal() == PRIMARY
    o = parse_source_options({"config_path": str(path), "entity": "payments"}, env={"SB_PRIMARY": PRIMARY})
    assert o.entities == ("payments",)
    _bad({"config_path": str(tmp_path / "nowhere.yaml"), "entity": "x"}, "config_path")
