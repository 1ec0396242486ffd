"""Spark Connect (Databricks standard access mode and serverless run Connect clients): the foreachBatch sink, the
syphon query and ``format("servicebus")`` with catalog state tables and the relay, each through a primary outage.

A child process per scenario (this process holds the test session's classic SparkContext) starts a local
Connect server with Delta and runs it (``connect_stream.py``, ``connect_syphon.py``, ``connect_datasource.py``);
the tests assert on its JSON report. They are in this one file so that pytest-xdist (``--dist loadfile``, the
Makefile's Spark tiers) gives them to one worker, which runs each child once. Under Connect ``DataFrame.rdd`` does
not exist, so this also proves that the sink, the data source and the syphon use DataFrame operations only.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from .child_report import child_report

#: The first test also waits for the child (three scenarios and a Connect server's start: ~3 min quiet, 5+ at load).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


#: Each Connect scenario's child script: one local Connect server each (run in one server they shared its start,
#: but one run in four hung past its 840 s in CI, with all five tests lost; one child each keeps a hang to its own).
#: The hang was most likely pyspark's Connect removeListener deadlock in relay.stop() (found at stop 49, fixed
#: in spark_sb/spark/relay.py): the datasource scenario is the one that stops a relay.
SCRIPTS = {
    "stream": "connect_stream.py",
    "syphon": "connect_syphon.py",
    "datasource": "connect_datasource.py",
}


class _Reports:
    """Each scenario's report by name, its child run on first use (this file's tests share one pytest-xdist worker:
    ``--dist loadfile``)."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.done: dict[str, dict[str, Any]] = {}

    def __getitem__(self, name: str) -> dict[str, Any]:
        if name not in self.done:
            script = str(Path(__file__).with_name(SCRIPTS[name]))
            self.done[name] = child_report(
                [script, str(self.work / name)], f"connect {name} run", timeout=600
            )
        return self.done[name]


@pytest.fixture(scope="module")
def connect_reports(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Each Connect scenario's report by name (``stream``, ``syphon``, ``datasource``)."""
    if importlib.util.find_spec("grpc") is None:
        pytest.skip("Spark Connect client dependencies missing: pip install -e '.[connect]'")
    return _Reports(tmp_path_factory.mktemp("connect"))


def _scenario(reports: Any, name: str) -> dict[str, Any]:
    """One scenario's report; fails the test with the scenario's traceback if it crashed."""
    report: dict[str, Any] = reports[name]
    assert "crashed" not in report, f"the Connect scenario {name!r} crashed:\n{report['crashed']}"
    return report


@pytest.fixture
def connect_report(connect_reports: Any) -> dict[str, Any]:
    return _scenario(connect_reports, "stream")


def test_stream_under_spark_connect_sends_diverts_and_rejects(connect_report: dict[str, Any]) -> None:
    assert connect_report["session"].startswith("pyspark.sql.connect")
    assert connect_report["error"] is None
    assert connect_report["primary"] == sorted(f"h{i}" for i in range(10))
    assert connect_report["backlog"] == sorted(f"o{i}" for i in range(10))


def test_the_counts_are_read_back_from_the_events_table_under_spark_connect(
    connect_report: dict[str, Any],
) -> None:
    """Issue 32 item 3: under Connect the foreachBatch function runs beside the server, so the client's sink object
    counts nothing; batch_counts and summary(spark) read the events table with DataFrame operations only."""
    counts = connect_report["counts"]
    assert [
        (b["batch_id"], b["rows"], b["sent"], b["diverted"], b["rejected"]) for b in counts["batches"]
    ] == [
        (0, 11, 10, 0, 1),
        (1, 10, 0, 10, 0),
    ]
    assert counts["summary"].startswith(
        "sink connect: 2 batches, 21 rows: 10 sent, 10 diverted, 1 rejected ("
    )
    assert counts["client_summary"] == "sink connect: 0 batches, 0 rows: 0 sent, 0 diverted, 0 rejected"


def test_state_tables_written_under_spark_connect(connect_report: dict[str, Any]) -> None:
    tables = connect_report["tables"]
    events = tables["events"]
    commits = sorted((e["batch_id"], e["count"]) for e in events if e["event"] == "batch_committed")
    assert commits == [(0, 11), (1, 10)]
    assert sum(e["count"] for e in events if e["event"] == "sent") == 10
    assert sum(e["count"] for e in events if e["event"] == "diverted" and e["backlog_queue"]) == 10
    assert [(e["from_state"], e["to_state"]) for e in events if e["event"] == "state_change"] == [
        ("healthy", "failing"),
        ("failing", "failed_over"),
    ]
    assert [(r["entity"], r["state"]) for r in tables["entities"]] == [("orders", "failed_over")]
    assert [(r["column"], r["batch_id"], r["sink_id"]) for r in tables["rejects"]] == [
        ("session_id", 0, "connect")
    ]


def test_the_syphon_runs_under_spark_connect(connect_reports: Any) -> None:
    report = _scenario(connect_reports, "syphon")
    assert report["session"].startswith("pyspark.sql.connect")
    assert report["error"] is None
    assert report["primary"] == sorted(f"q{i}-{j}" for i in range(2) for j in range(7))
    assert report["rows"] == 14  # one row per message moved
    assert sum(e["count"] for e in report["events"] if e["event"] == "moved") == 14


def test_format_servicebus_under_spark_connect_with_catalog_tables_and_the_relay(
    connect_reports: Any,
) -> None:
    """The ``datasource`` scenario (``connect_datasource.py``). Everything it observed is compared at once, so a
    failure shows each field that differs, and its message the scenario's phase timings (one failure in CI printed
    too little to tell which check failed)."""
    report = _scenario(connect_reports, "datasource")
    tables = report["tables"]
    events = tables["events"]
    seen = {
        "session": report["session"].split(".")[:3],
        "error": report["error"],
        "relay": report["relay"],  # settled: the listener woke the relay under Connect
        "backlog": report["backlog"],  # diverted during the outage
        "moved": report["moved"],
        "primary": report["primary"],  # 0 lost
        "commits": sorted((e["batch_id"], e["count"]) for e in events if e["event"] == "batch_committed"),
        "state changes": [(e["from_state"], e["to_state"]) for e in events if e["event"] == "state_change"],
        "entities": [(r["entity"], r["state"]) for r in tables["entities"]],
        "rejects": [(r["column"], r["batch_id"], r["sink_id"]) for r in tables["rejects"]],
    }
    assert seen == {
        "session": ["pyspark", "sql", "connect"],
        "error": None,
        "relay": {"settled": True, "error": None},
        "backlog": sorted(f"o{i}" for i in range(10)),
        "moved": {"orders": 10},
        "primary": sorted([*(f"h{i}" for i in range(10)), *(f"o{i}" for i in range(10))]),
        "commits": [(0, 11), (1, 10)],
        "state changes": [("healthy", "failing"), ("failing", "failed_over")],
        "entities": [("orders", "failed_over")],
        "rejects": [("session_id", 0, "connect-ds")],
    }, f"phase timings (s): {report.get('timings')}; relay drains begun: {report.get('drains')}"
