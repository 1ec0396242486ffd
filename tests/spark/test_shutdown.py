"""Nothing lost at shutdown: the state rows of every batch whose ``foreachBatch`` returned are in the events table
whatever the program does after the query, without ``sink.flush()`` (``state_writes: async``, whose background
writer holds up to 30 s of batches).

Each case is a child program (``shutdown_child.py``: its own Spark session and local namespace) that records the
batch ids whose ``foreachBatch`` returned; the test reads the events table afterwards with ``deltalake``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .child_report import ROOT, child_report

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("shutdown_child.py")


def _returned(work: Path) -> list[int]:
    path = work / "returned"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _committed(work: Path, sink_id: str = "shutdown") -> list[int]:
    from deltalake import DeltaTable

    rows = DeltaTable(str(work / "state" / "events")).to_pyarrow_table().to_pylist()
    return sorted(r["batch_id"] for r in rows if r["event"] == "batch_committed" and r["sink_id"] == sink_id)


@pytest.mark.parametrize("how", ["stop-after-query", "stop-while-running"])
def test_spark_stop_without_flush_loses_no_state_rows(tmp_path: Path, how: str) -> None:
    child_report([str(SCRIPT), str(tmp_path), how], f"child program ({how})", timeout=600)
    returned = _returned(tmp_path)
    assert len(returned) >= 6, returned  # one batch per input file (an empty last batch may follow)
    assert set(returned) <= set(_committed(tmp_path)), (returned, _committed(tmp_path))
    assert len(_committed(tmp_path)) == len(set(_committed(tmp_path)))  # each batch's rows once


def test_sigterm_loses_no_state_rows(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    child = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(tmp_path), "sigterm"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while len(_returned(tmp_path)) < 3:  # polling a file another process writes: nothing to await
            assert child.poll() is None, child.communicate()[1][-4000:]
            assert time.monotonic() < deadline, "the child program returned no 3 batches in 300 s"
            time.sleep(0.2)
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 128 + signal.SIGTERM, err[-4000:]
    returned = _returned(tmp_path)
    assert returned and set(returned) <= set(_committed(tmp_path)), (
        returned,
        _committed(tmp_path),
        err[-4000:],
    )


def test_a_stopped_query_has_its_rows_written_without_flush(
    spark: Any, local_namespace: Any, tmp_path: Path
) -> None:
    """The program goes on after ``query.stop()`` (a notebook): the query listener writes the rows at once, not
    at the writer's next commit (30 s later) or at exit."""
    from spark_sb.config.service_bus import ServiceBusConfig
    from spark_sb.spark.sink import ServiceBusSink
    from spark_sb.state.writer import COMMIT_INTERVAL

    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(3):
        (folder / f"{i}.json").write_text(f'{{"body": "b{i}", "message_id": "m{i}"}}\n')
    config = ServiceBusConfig.from_dict(
        {
            "primary": {"connection_string": local_namespace.connection_string, "namespace_name": "local"},
            "entity": "q1",
            "send_timeout": "5s",
            "state_location": str(tmp_path / "state"),
            "sink_id": "stopped",
        }
    )
    sink = ServiceBusSink(config)
    query = (
        spark.readStream.schema("body STRING, message_id STRING")
        .option("maxFilesPerTrigger", 1)
        .json(str(folder))
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .start()
    )
    query.processAllAvailable()
    query.stop()
    stopped = time.monotonic()
    deadline = stopped + COMMIT_INTERVAL / 2
    while True:  # polling the table the listener's thread writes: nothing to await
        committed = _committed(tmp_path, "stopped") if (tmp_path / "state" / "events").exists() else []
        if committed == [0, 1, 2] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert committed == [0, 1, 2], f"after {time.monotonic() - stopped:.1f} s"
