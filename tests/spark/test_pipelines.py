"""A Spark Declarative Pipeline that writes to ``format("servicebus")`` (issue 50 item 3, SPEC S11), run as a user
runs one: ``spark-pipelines run`` in a pipeline project (a JSON file source, ``create_sink`` + ``append_flow``),
against two local namespaces, with the state tables on. Runs that complete exit 0 (the Connect client tolerates the
data source's profiler updates: :mod:`spark_sb.spark.connect_client`); a ``--full-refresh-all`` run, whose flow starts a new checkpoint under the same sink id, is refused before anything is
sent twice, in one line saying what to do. Needs ``pyspark.pipelines`` (pyspark 4.1+): skipped on older pairs."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from servicebus_local.model import QueueSettings
from spark_sb.spark.sink import NEW_CHECKPOINT
from spark_sb.state.deltars import DeltaRsStateStore

from .connect_stream import CONNECT_PORT_LOCK
from .streams import drain_ids, write_rows

pytest.importorskip("pyspark.pipelines", reason="spark-pipelines needs pyspark 4.1+ (pyspark.pipelines)")
pytestmark = pytest.mark.slow

SINK_ID = "orders-pipeline"

SPEC = """name: orders
storage: file://{storage}
libraries:
  - glob:
      include: transformations/**
"""

DEFINITIONS = """from pyspark import pipelines as dp
from pyspark.sql import SparkSession

import spark_sb

spark = SparkSession.active()
spark_sb.register(spark)
dp.create_sink("orders_out", format="servicebus", options={options})


@dp.append_flow(target="orders_out")
def to_service_bus():
    return spark.readStream.format("json").schema("body string, message_id string").load({source!r})
"""


def _project(tmp_path: Path, pair: Any) -> tuple[Path, Path, Path]:
    """A pipeline project (its spec and one definitions file), its input folder and its state tables."""
    project, source, state = tmp_path / "orders", tmp_path / "in", tmp_path / "state"
    (project / "transformations").mkdir(parents=True)
    source.mkdir()
    (project / "spark-pipeline.yml").write_text(SPEC.format(storage=tmp_path / "storage"))
    options = {
        "primary.connection_string": pair.primary.connection_string,
        "primary.namespace_name": "primary",
        "secondary.connection_string": pair.secondary.connection_string,
        "entity": "orders",
        "backlog_queue_count": "2",
        "sink_id": SINK_ID,
        "state_location": str(state),
    }
    (project / "transformations" / "orders.py").write_text(
        DEFINITIONS.format(options=json.dumps(options, indent=4), source=str(source))
    )
    return project, source, state


def _run(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``spark-pipelines run`` in ``project``, as a user runs it (the venv's scripts on PATH). Its Connect server
    binds port 15002, as the Connect tests' children do: the run holds their lock (CONNECT_PORT_LOCK) meanwhile."""
    bin_dir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    fd = os.open(CONNECT_PORT_LOCK, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the other holders are children bounded by their own time limits
        return subprocess.run(
            [str(Path(bin_dir) / "spark-pipelines"), "run", *args],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        os.close(fd)  # the lock goes with it


def _committed(state: Path) -> list[tuple[int | None, int]]:
    events = DeltaRsStateStore(str(state)).read_events(SINK_ID)
    return sorted((e.batch_id, e.count) for e in events if e.event == "batch_committed")


def test_a_pipeline_sends_through_the_servicebus_sink_and_a_full_refresh_is_refused_in_one_line(
    namespace_pair: Any, tmp_path: Path
) -> None:
    namespace_pair.primary.broker.create_queue("orders", QueueSettings(requires_duplicate_detection=True))
    project, source, state = _project(tmp_path, namespace_pair)
    write_rows(source, "a.json", [{"body": f"a{i}", "message_id": f"a{i}"} for i in range(10)])

    first = _run(project)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "Run is COMPLETED" in first.stdout + first.stderr
    conn = namespace_pair.primary.connection_string
    assert sorted(drain_ids(conn, "orders")) == sorted(f"a{i}" for i in range(10))
    assert _committed(state) == [(0, 10)]

    write_rows(source, "b.json", [{"body": f"b{i}", "message_id": f"b{i}"} for i in range(3)])
    refresh = _run(project, "--full-refresh-all")
    out = refresh.stdout + refresh.stderr
    assert refresh.returncode != 0, out[-3000:]
    lines = [line for line in out.splitlines() if NEW_CHECKPOINT in line]
    assert lines and "with 10 rows, and now arrives with 13" in lines[0], out[-3000:]
    assert drain_ids(conn, "orders") == []  # nothing sent twice (b.json waits for the new sink_id)
    assert _committed(state) == [(0, 10)]
