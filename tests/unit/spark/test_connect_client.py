"""The Spark Connect client workaround for SPARK-59135 (spark_sb.spark.connect_client): applied only where the
client's command stream refuses whatever is not a dictionary, and then only the Python accumulator's observed
metrics are dropped from the response stream."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from spark_sb.spark import connect_client


class Buggy:
    def execute_command_as_iterator(self, command: Any) -> Iterator[dict[str, Any]]:
        for response in self._execute_and_fetch_as_iterator(command):
            if isinstance(response, dict):
                yield response
            else:
                raise ValueError("UNKNOWN_RESPONSE")

    def _execute_and_fetch_as_iterator(self, command: Any) -> Iterator[Any]:
        yield from command


class Fixed(Buggy):
    def execute_command_as_iterator(self, command: Any) -> Iterator[Any]:
        yield from self._execute_and_fetch_as_iterator(command)


def test_only_a_client_whose_command_stream_refuses_non_dictionaries_has_the_bug() -> None:
    assert connect_client.has_the_bug(Buggy)
    assert not connect_client.has_the_bug(Fixed)
    assert not connect_client.has_the_bug(object)


def test_the_installed_client_tolerates_the_accumulator_updates_once_patched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    core = pytest.importorskip("pyspark.sql.connect.client.core")
    client_class = core.SparkConnectClient
    monkeypatch.setattr(client_class, "_execute_and_fetch_as_iterator", Buggy._execute_and_fetch_as_iterator)
    monkeypatch.setattr(client_class, "execute_command_as_iterator", Buggy.execute_command_as_iterator)
    updates = core.PlanObservedMetrics(connect_client.ACCUMULATOR_METRICS, [], [])
    mine = core.PlanObservedMetrics("mine", [], [])
    stream = [{"pipeline_event_result": 1}, updates, {"pipeline_event_result": 2}]
    client = object.__new__(client_class)
    with pytest.raises(ValueError, match="UNKNOWN_RESPONSE"):  # the bug, as pyspark 4.2.0 has it
        list(client.execute_command_as_iterator(stream))
    assert connect_client.tolerate_accumulator_updates()
    assert connect_client.tolerate_accumulator_updates()  # idempotent: wrapped once
    assert not hasattr(client_class._execute_and_fetch_as_iterator.__wrapped__, "__wrapped__")
    assert list(client.execute_command_as_iterator(stream)) == [
        {"pipeline_event_result": 1},
        {"pipeline_event_result": 2},
    ]
    assert list(client._execute_and_fetch_as_iterator([mine, updates])) == [mine]  # anyone else's kept


def test_a_fixed_client_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    core = pytest.importorskip("pyspark.sql.connect.client.core")
    client_class = core.SparkConnectClient
    monkeypatch.setattr(client_class, "_execute_and_fetch_as_iterator", Fixed._execute_and_fetch_as_iterator)
    monkeypatch.setattr(client_class, "execute_command_as_iterator", Fixed.execute_command_as_iterator)
    assert not connect_client.tolerate_accumulator_updates()
    assert client_class._execute_and_fetch_as_iterator is Fixed._execute_and_fetch_as_iterator
