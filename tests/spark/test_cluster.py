"""Two executor JVMs (``local-cluster[2,1,1024]``): after tasks on one executor fail over, the next batch's
task on the other executor starts failed over through the entity table; 0 lost. Runs in a child process
(``cluster_handoff.py``) because this process already holds the test session's SparkContext."""

from __future__ import annotations

from pathlib import Path

import pytest

from .child_report import child_report

pytestmark = [pytest.mark.spark, pytest.mark.local, pytest.mark.slow]


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
