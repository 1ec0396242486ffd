"""The syphon query under Spark Connect (Databricks standard access mode, serverless): a Python data source and
``foreachBatch`` only, no ``.rdd`` and no SparkContext. Runs ``connect_syphon.py`` in a child process."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from .child_report import child_report

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("connect_syphon.py")


def test_the_syphon_runs_under_spark_connect(tmp_path: Path) -> None:
    if importlib.util.find_spec("grpc") is None:
        pytest.skip("Spark Connect client dependencies missing: pip install -e '.[connect]'")
    report = child_report([str(SCRIPT), str(tmp_path)], "connect run")
    assert report["session"].startswith("pyspark.sql.connect")
    assert report["error"] is None
    assert report["primary"] == sorted(f"q{i}-{j}" for i in range(2) for j in range(7))
    assert report["rows"] == 14  # one row per message moved
    assert sum(e["count"] for e in report["events"] if e["event"] == "moved") == 14
