"""Spark Connect (Databricks standard access mode and serverless run Connect clients): the foreachBatch sink, the
syphon query and ``format("servicebus")`` with catalog state tables and the relay, each through a primary outage.

One child process (``connect_runs.py``: this process holds the test session's classic SparkContext) starts one
local Connect server with Delta and runs the three scenarios in it (``connect_stream.py``, ``connect_syphon.py``,
``connect_datasource.py``), each within a deadline of its own; the tests assert on its JSON report, a section per
scenario. They are in this one file so that pytest-xdist (``--dist loadfile``, the Makefile's Spark tiers) gives
them to one worker, which runs the child once: a Connect server's start costs about as much as a scenario. Under
Connect ``DataFrame.rdd`` does not exist, so this also proves that the sink, the data source and the syphon use
DataFrame operations only.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from .child_report import child_report
from .connect_runs import DEADLINE, SCENARIOS, STOP_DEADLINE

#: The child's bound: the Connect server's start (30-60 s at load; 180 s allowed), then each scenario within its
#: own deadline (``connect_runs.DEADLINE``: a hung one is reported with its stacks and the next ones still run),
#: then the session's stop.
CHILD_TIMEOUT = 180 + len(SCENARIOS) * DEADLINE + STOP_DEADLINE

#: The first test also waits for the child (the server's start and the three scenarios: ~3 min at a load of 4),
#: and for its stacks if it still runs at CHILD_TIMEOUT (child_report: 30 s more).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(CHILD_TIMEOUT + 60)]


@pytest.fixture(scope="module")
def connect_reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each Connect scenario's report by name (``stream``, ``syphon``, ``datasource``; see ``connect_runs.py``)."""
    if importlib.util.find_spec("grpc") is None:
        pytest.skip("Spark Connect client dependencies missing: pip install -e '.[connect]'")
    work = tmp_path_factory.mktemp("connect")
    reports = child_report(
        ["-m", "tests.spark.connect_runs", str(work)], "connect runs", timeout=CHILD_TIMEOUT
    )
    # the session's stop failed or hung (a child of its own per scenario failed its run on that, too)
    assert "stop" not in reports, f"the Connect session's stop: {reports['stop'].get('crashed')}"
    return reports


def _scenario(reports: dict[str, Any], name: str) -> dict[str, Any]:
    """One scenario's report; fails the test with the scenario's traceback if it crashed."""
    report: dict[str, Any] = reports[name]
    assert "crashed" not in report, f"the Connect scenario {name!r} crashed:\n{report['crashed']}"
    return report


@pytest.fixture
def connect_report(connect_reports: dict[str, Any]) -> dict[str, Any]:
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


def test_the_syphon_runs_under_spark_connect(connect_reports: dict[str, Any]) -> None:
    report = _scenario(connect_reports, "syphon")
    assert report["session"].startswith("pyspark.sql.connect")
    assert report["error"] is None
    assert report["primary"] == sorted(f"q{i}-{j}" for i in range(2) for j in range(7))
    assert report["rows"] == 14  # one row per message moved
    assert sum(e["count"] for e in report["events"] if e["event"] == "moved") == 14


def test_format_servicebus_under_spark_connect_with_catalog_tables_and_the_relay(
    connect_reports: dict[str, Any],
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
