"""Where the failover dashboard reads the state tables (:func:`spark_sb.admin.dashboard.read_tables`): Delta paths
under ``state_location``, or catalog tables named with ``state_table_prefix``. A recording stand-in for the Spark
session: the charts' DataFrame shaping needs a real one and is tested in tests/spark/test_syphon_job_dashboard.py."""

from __future__ import annotations

from typing import Any

from spark_sb.admin.dashboard import STATE_LEVELS, read_tables
from spark_sb.state.delta import StateTables


class Reader:
    def __init__(self, calls: list[tuple[str, str]]) -> None:
        self.calls = calls
        self.fmt = ""

    def format(self, fmt: str) -> Reader:
        self.fmt = fmt
        return self

    def load(self, path: str) -> str:
        self.calls.append((f"load {self.fmt}", path))
        return f"df:{path}"


class Session:
    """The two ways of reading a table that ``read_tables`` may use, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    @property
    def read(self) -> Reader:
        return Reader(self.calls)

    def table(self, name: str) -> str:
        self.calls.append(("table", name))
        return f"df:{name}"


def test_tables_under_a_location_are_read_as_delta_paths() -> None:
    spark: Any = Session()
    frames = read_tables(spark, StateTables(location="abfss://c@a.dfs.core.windows.net/state/"))
    assert frames == {
        "events": "df:abfss://c@a.dfs.core.windows.net/state/events",
        "entities": "df:abfss://c@a.dfs.core.windows.net/state/entities",
        "rejects": "df:abfss://c@a.dfs.core.windows.net/state/rejects",
    }
    assert [kind for kind, _ in spark.calls] == ["load delta"] * 3


def test_tables_with_a_prefix_are_read_from_the_catalog() -> None:
    spark: Any = Session()
    frames = read_tables(spark, StateTables(prefix="main.sb.sink_"))
    assert frames == {
        "events": "df:main.sb.sink_events",
        "entities": "df:main.sb.sink_entities",
        "rejects": "df:main.sb.sink_rejects",
    }
    assert spark.calls == [
        ("table", "main.sb.sink_events"),
        ("table", "main.sb.sink_entities"),
        ("table", "main.sb.sink_rejects"),
    ]


def test_the_timelines_levels_rise_with_the_severity_of_the_state() -> None:
    assert sorted(STATE_LEVELS, key=STATE_LEVELS.__getitem__) == ["healthy", "failing", "failed_over"]
    assert STATE_LEVELS["healthy"] == 0
