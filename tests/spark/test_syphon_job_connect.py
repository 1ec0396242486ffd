"""The syphon query under Spark Connect (Databricks standard access mode, serverless): a Python data source and
``foreachBatch`` only, no ``.rdd`` and no SparkContext. Runs ``connect_syphon.py`` in a child process."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.local, pytest.mark.slow]

SCRIPT = Path(__file__).with_name("connect_syphon.py")


def test_the_syphon_runs_under_spark_connect(tmp_path: Path) -> None:
    if importlib.util.find_spec("grpc") is None:
        pytest.skip("Spark Connect client dependencies missing: pip install -e '.[connect]'")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SCRIPT.parents[2]), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, f"connect run failed ({done.returncode}):\n{done.stderr[-4000:]}"
    report = json.loads(lines[-1])
    assert report["session"].startswith("pyspark.sql.connect")
    assert report["error"] is None
    assert report["primary"] == sorted(f"q{i}-{j}" for i in range(2) for j in range(7))
    assert report["rows"] == 14  # one row per message moved
    assert sum(e["count"] for e in report["events"] if e["event"] == "moved") == 14
