"""The class-data archive the suite's Spark JVMs start from (``make jvm-archive``; tests/conftest.py passes it).

A JVM that starts Spark and Delta loads, verifies and links some 15,000 classes before its first query: about a
third of the CPU a short-lived child of the suite spends (a session start and a first Delta write: 35 -> 24
CPU-seconds, 28 -> 19 s alone, 2026-12-07). The Spark tier starts dozens of such JVMs - Connect servers,
spark-submit job runs, killed and restarted queries, the local cluster's driver. Java's application class-data
sharing (a dynamic archive, ``-XX:ArchiveClassesAtExit``) keeps those classes parsed and verified in one
memory-mapped file that every JVM of the same class path maps instead.

``python -m tests.jvm_archive <path>`` runs one training child (a session, the state tables' Delta writes,
merges and reads, a short foreachBatch stream into Delta, a Python data source's stream, a Spark Connect client's
queries) with the suite's child options, waits for its JVM to
write the archive at exit, and moves it to ``<path>`` only then: a JVM mapping a half-written archive crashes,
so no other name ever holds one. A JVM whose class path differs (another venv, another pyspark) ignores the
archive, silently (``-Xlog:cds=off``). Test code: the product's sessions never use it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: The suite's child JVMs' options (tests/conftest.py says why): C1 only, the serial collector.
CHILD_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: The engine settings of the suite's Spark sessions (tests/conftest.py says why): no whole-stage or expression code
#: generation, no adaptive execution. The test session sets them as its conf, the children's JVMs (and the training
#: child, so that the archive holds the classes they load) as system properties.
ENGINE_CONF = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.adaptive.enabled": "false",
}
#: ``ENGINE_CONF`` as a JVM's options (a ``SparkConf`` reads every ``spark.*`` system property).
ENGINE_PROPERTIES = " ".join(f"-D{key}={value}" for key, value in ENGINE_CONF.items())
#: Where ``make jvm-archive`` puts the archive: in the venv whose pyspark it was made from.
ARCHIVE = Path(sys.prefix) / "spark-cds.jsa"


def archive_options(path: Path = ARCHIVE) -> str:
    """The options that give a JVM the archive at ``path`` ("" without one), its checks quiet: an archive that
    does not fit the JVM's class path is skipped without a warning on the child's output (which tests read)."""
    if not path.is_file():
        return ""
    return f"-XX:SharedArchiveFile={path} -Xlog:cds=off -Xlog:cds+dynamic=off"


def _train() -> None:
    """The training child: what the suite's children do, once (driver; its JVM writes the archive at exit)."""
    from datetime import datetime, timezone

    from spark_sb.spark.session import build_spark_session
    from spark_sb.state.delta import DeltaStateStore, StateTables
    from spark_sb.state.records import BATCH_COMMITTED, BatchWrites, EntityRecord, Event, RejectRecord

    port = _free_port()
    spark = build_spark_session(
        "spark-servicebus-jvm-archive",
        "local[2]",
        {  # the Connect server's classes too (its children start one)
            "spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
            "spark.connect.grpc.binding.port": str(port),
            "spark.connect.grpc.binding.address": "127.0.0.1",
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    print(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid(), flush=True)  # noqa: SLF001
    with tempfile.TemporaryDirectory(prefix="spark-sb-jvm-archive-") as tmp:
        store = DeltaStateStore(spark, StateTables(location=f"{tmp}/state"), backoff=0.05)
        t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
        for batch in (1, 2):
            store.write_batch(
                "train",
                batch,
                BatchWrites(
                    (Event(t0, "train", batch, BATCH_COMMITTED),),
                    (EntityRecord("p", "orders", "failed_over", t0, updated_at=t0, updated_by="train"),),
                    (RejectRecord(t0, "train", batch, "orders", None, "why", "{}"),),
                ),
            )
        store.read_events("train")
        store.read_rejects("train")
        store.read_entities()
        store.last_committed("train")
        spark.sql(f"DESCRIBE HISTORY delta.`{tmp}/state/events`").collect()

        def each(batch_df: object, batch_id: int) -> None:
            batch_df.write.format("delta").mode("append").save(f"{tmp}/sink")  # type: ignore[attr-defined]

        query = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", 50)
            .load()
            .writeStream.foreachBatch(each)
            .option("checkpointLocation", f"{tmp}/checkpoint")
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        deadline = time.monotonic() + 60
        while (
            query.lastProgress is None or query.lastProgress["batchId"] < 3
        ) and time.monotonic() < deadline:
            time.sleep(0.2)
        query.stop()
        spark.read.format("delta").load(f"{tmp}/sink").count()
        _python_data_source(spark, tmp)
        _connect(port, tmp)
    spark.stop()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _python_data_source(spark: Any, tmp: str) -> None:
    """A Python data source's stream read and written (what ``format("servicebus")`` runs through)."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceStreamReader,
        DataSourceStreamWriter,
        InputPartition,
        WriterCommitMessage,
    )

    class Reader(DataSourceStreamReader):
        def initialOffset(self) -> dict[str, int]:
            return {"n": 0}

        def latestOffset(self) -> dict[str, int]:
            return {"n": 10}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
            return [InputPartition(i) for i in range(start["n"], end["n"])]

        def read(self, partition: InputPartition) -> Any:
            yield (partition.value, str(partition.value))  # type: ignore[attr-defined]

    class Writer(DataSourceStreamWriter):
        def write(self, iterator: Any) -> WriterCommitMessage:
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages: Any, batch_id: int) -> None:
            pass

    class Source(DataSource):
        @classmethod
        def name(cls) -> str:
            return "jvm_archive_training"

        def schema(self) -> str:
            return "id int, text string"

        def streamReader(self, schema: Any) -> Reader:
            return Reader()

        def streamWriter(self, schema: Any, overwrite: bool) -> Writer:
            return Writer()

    spark.dataSource.register(Source)
    query = (
        spark.readStream.format("jvm_archive_training")
        .load()
        .writeStream.format("jvm_archive_training")
        .option("checkpointLocation", f"{tmp}/python-checkpoint")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    query.stop()


def _connect(port: int, tmp: str) -> None:
    """A Spark Connect client's queries on this JVM's Connect server: a Delta write and read, a foreachBatch."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    remote = ConnectSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
    try:
        remote.range(100).write.format("delta").save(f"{tmp}/connect")
        remote.read.format("delta").load(f"{tmp}/connect").count()
        query = (
            remote.readStream.format("rate")
            .load()
            .writeStream.foreachBatch(lambda df, _: df.count())
            .option("checkpointLocation", f"{tmp}/connect-checkpoint")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
    finally:
        remote.stop()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (POSIX: signal 0 only checks)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process took the number
        return True
    return True


def build(path: Path) -> None:
    """Run the training child and move its archive to ``path`` once its JVM has ended."""
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)
    env = dict(
        os.environ,
        SPARK_SUBMIT_OPTS=f"{CHILD_JVM_OPTIONS} {ENGINE_PROPERTIES} -XX:ArchiveClassesAtExit={partial}",
    )
    child = subprocess.run(
        [sys.executable, "-m", "tests.jvm_archive", "--train"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if child.returncode != 0:
        sys.exit(f"the training child failed ({child.returncode}):\n{child.stdout}\n{child.stderr}")
    jvm = int(child.stdout.split()[0])
    deadline = time.monotonic() + 120  # the JVM writes the archive after the Python side has gone
    while _alive(jvm) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(jvm) or not partial.is_file():
        sys.exit(f"the training JVM (pid {jvm}) wrote no archive at {partial}")
    partial.replace(path)
    print(f"JVM class-data archive: {path} ({path.stat().st_size // 2**20} MB)")


if __name__ == "__main__":
    if sys.argv[1:] == ["--train"]:
        _train()
    else:
        build(Path(sys.argv[1]).resolve())
