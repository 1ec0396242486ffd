"""What the ``local-cluster[2,1,1024]`` scenarios (``cluster_handoff.py``, ``cluster_fanout.py``,
``cluster_ordering.py``, run in one session by ``cluster_runs.py``) share: two local namespaces, a session with two
executor JVMs that import this checkout, the clean-up of Spark's per-run work folders (copies of the jars, hundreds
of MB), a stream through a sink."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def two_namespaces() -> Iterator[tuple[Any, Any]]:
    """A started primary and secondary :class:`~servicebus_local.server.LocalNamespace`, stopped afterwards."""
    from servicebus_local.server import LocalNamespace

    primary = LocalNamespace("primary").start()
    secondary = LocalNamespace("secondary").start()
    try:
        yield primary, secondary
    finally:
        secondary.stop()
        primary.stop()


@contextmanager
def spark_work_cleaned() -> Iterator[None]:
    """Removes, on leaving, the per-run work folders (copies of the jars, hundreds of MB) that the local cluster's
    executors made in pyspark's ``work`` folder meanwhile: around the whole life of a ``cluster_session``."""
    import pyspark

    spark_work = Path(pyspark.__file__).parent / "work"
    before = set(spark_work.iterdir()) if spark_work.exists() else set()
    try:
        yield
    finally:
        if spark_work.exists():
            for run in set(spark_work.iterdir()) - before:
                shutil.rmtree(run, ignore_errors=True)


def cluster_session(app_name: str) -> Any:
    """A SparkSession on ``local-cluster[2,1,1024]`` whose executors import this checkout (loopback only)."""
    from spark_sb.spark.session import build_spark_session

    root = str(Path(__file__).resolve().parents[2])
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    conf = {
        "spark.executorEnv.PYTHONPATH": root,
        "spark.executorEnv.SPARK_LOCAL_IP": "127.0.0.1",
    }
    if os.environ.get("SPARK_SUBMIT_OPTS"):  # the executors' JVMs as the driver's (tests/conftest.py)
        # without its Spark settings (-Dspark.*): Spark refuses them in an executor's options
        options = [
            option for option in os.environ["SPARK_SUBMIT_OPTS"].split() if not option.startswith("-Dspark.")
        ]
        conf["spark.executor.extraJavaOptions"] = " ".join(options)
    spark = build_spark_session(app_name, "local-cluster[2,1,1024]", conf)
    # Both executors registered before the first batch (on a busy machine the second may come late, and tasks
    # would all land on the first). Test code: the product itself never touches the SparkContext.
    status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()
    deadline = time.monotonic() + 120
    while status.size() < 3 and time.monotonic() < deadline:  # the driver counts as one
        time.sleep(0.2)
        status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()
    return spark


def run_batches(
    spark: Any,
    sink: Any,
    schema: str,
    work: Path,
    files: list[list[dict[str, Any]]],
    groups: tuple[tuple[int, ...], ...],
    before: Any = None,
) -> tuple[list[list[dict[str, Any]]], str | None]:
    """Stream JSON files through ``sink`` (a ``ServiceBusSink``), one micro-batch per group of file indexes
    (``before(group)`` runs first, e.g. to break the primary); returns each batch's task results (pid, elapsed,
    sent, diverted, rejected, failing transitions) and the query's error. The session stays up (the caller's)."""
    from tests.spark.streams import write_rows

    seen: list[list[dict[str, Any]]] = []
    # Every micro-batch's task results: a group's files written one after the other may be picked up by two
    # micro-batches (a trigger between the writes, on a loaded machine); the group's results are all of them.
    collected: list[Any] = []

    def each(batch_df: Any, batch_id: int) -> None:
        sink(batch_df, batch_id)
        collected.extend(sink.last_results)

    folder = work / "in"
    folder.mkdir(parents=True)
    query = (
        spark.readStream.schema(schema)
        .json(str(folder))
        .writeStream.foreachBatch(each)
        .option("checkpointLocation", str(work / "ckpt"))
        .start()
    )
    try:
        for group in groups:
            collected.clear()
            if before is not None:
                before(group)
            for f in group:
                write_rows(folder, f"{f}.json", files[f])
            query.processAllAvailable()
            sink.flush()  # the batch's state writes (a Spark job) done: the next batch finds the executors free
            seen.append([_result(r) for r in collected])
    finally:
        query.stop()
    error = query.exception()
    sink.flush()  # before the session stops: the state writes need it
    return seen, None if error is None else str(error)[:2000]


def _result(r: Any) -> dict[str, Any]:
    return {
        "pid": r.pid,
        "elapsed": r.outcome.elapsed,
        "diverted": r.outcome.total_diverted,
        "sent": r.outcome.total_sent,
        "rejected": r.outcome.total_rejected,
        "failing": sum(1 for t in r.outcome.transitions if t.to_state.value == "failing"),
    }
