"""Two executor JVMs (``local-cluster[2,1,1024]``): after tasks on one executor fail over, the next batch's
task on the other executor starts failed over through the entity table; 0 lost. Runs in a child process
(``cluster_handoff.py``) because this process already holds the test session's SparkContext."""

from __future__ import annotations

from pathlib import Path

import pytest

from .child_report import child_report

pytestmark = pytest.mark.slow


def test_next_batch_on_the_other_executor_starts_failed_over(tmp_path: Path) -> None:
    report = child_report(["-m", "tests.spark.cluster_handoff", str(tmp_path)], "cluster run")
    assert report["error"] is None
    first, second = report["batches"]
    interval = report["interval"]
    assert len(first) == 1 and first[0]["elapsed"] >= interval and first[0]["failing"] == 1
    assert len(second) == 2 and {r["pid"] for r in second} - {first[0]["pid"]}, (
        "batch 1 ran only where batch 0 did"
    )
    for r in second:
        assert r["elapsed"] < interval / 2 and r["failing"] == 0 and r["sent"] == 0 and r["diverted"] == 10
    assert report["backlog"] == report["expected"]  # 0 lost, 0 duplicated


def test_a_stream_to_200_entities_through_a_primary_outage(tmp_path: Path) -> None:
    """Rows name 200 entities; the primary namespace goes down between batches: each task of the outage batch
    costs about failover_interval (not 200 times it), every row reaches the backlog, 0 lost, and the healthy
    batch used one connection per executor process."""
    report = child_report(["-m", "tests.spark.cluster_fanout", str(tmp_path)], "cluster fan-out run")
    assert report["error"] is None
    healthy, outage = report["batches"]
    interval = report["interval"]
    assert sum(r["sent"] for r in healthy) == report["expected_primary"]
    assert report["connections_peak_before_outage"] <= 2 * 2  # two executor processes, at most two each
    assert len(outage) == 2
    for r in outage:
        assert r["sent"] == 0 and r["rejected"] == 0 and r["diverted"] == 400
        assert r["elapsed"] <= interval + 4.0, f"an outage task took {r['elapsed']:.1f} s for 200 entities"
    assert report["on_primary"] == report["expected_primary"]
    assert report["backlog"] == report["expected_backlog"]  # 0 lost, 0 duplicated
