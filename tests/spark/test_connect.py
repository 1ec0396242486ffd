"""The streaming sink under Spark Connect (Databricks standard access mode / serverless run Connect clients).

One child process (``connect_stream.py``) starts one local Connect server with Delta for the whole test session
and streams through ``foreachBatch(ServiceBusSink(config))``; the tests assert on its JSON report. Under Connect
``DataFrame.rdd`` does not exist, so this also proves the sink uses DataFrame operations only.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from .child_report import child_report

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("connect_stream.py")


@pytest.fixture(scope="session")
def connect_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if importlib.util.find_spec("grpc") is None:
        pytest.skip("Spark Connect client dependencies missing: pip install -e '.[connect]'")
    work = tmp_path_factory.mktemp("connect")
    return child_report([str(SCRIPT), str(work)], "connect run")


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
