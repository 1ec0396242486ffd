"""``ordering: session`` with the Spark sink and the syphon job (SPEC O1, O2; issue 31, setting a) on
``local-cluster[2,1,1024]`` (two executor JVMs, one core each) against two local namespaces; prints a JSON report.

Run by ``tests/spark/test_cluster.py`` through ``cluster_runs.py``, in a child process (a process holds one
SparkContext). The sink's stream and the syphon job run as two queries of the cluster's session, coordinating only
through the namespaces and the Delta state tables (``spark_sb/state/sessions.py``); their tasks run in the two
executors' Python workers, so the held sessions travel from the driver to each batch's tasks in the handoff.

* ``ordered`` (:func:`run_ordered`): 20 session ids over two session-enabled primary queues with duplicate
  detection, rows repartitioned by session id (the user's job), 12 micro-batches: the primary refuses connections
  over batches 3-6, a backlog queue refuses sends for 5 s from batch 5's first send to it (SPEC O8: the query
  survives it), the entity ``invoices`` is stalled over batches 8-9; the syphon job starts with the recovery
  (before batch 7), is stopped (its tasks killed) mid-drain after batch 8 and started again from its checkpoint.
  Session receivers on the primary then read every session.
* ``control`` (:func:`run_control`): the same shape with ``ordering: none`` - a batch healthy, one diverted, one
  sent after the recovery while the syphon job has not started yet: the diverted batch reaches the primary after
  the later one (so the ordered run's assertions can fail).

Each report holds what the sessions' receivers got and what was produced, the sink's counts and event kinds, the
sink tasks' Python worker pids and, per query (``sink``, ``syphon``), the executors its tasks ran on (from the
driver's status store: the tasks of the jobs in the query runs' job groups). The assertions are test_cluster.py's.

Usage (from the repository root): ``python -m tests.spark.cluster_ordering <work dir>``
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from harness.outages import backlog_count
from tests.spark.ordering_harness import ENTITIES, SCHEMA, Feed, received, wait_drained

QUEUES = [f"primary/x-servicebus-transfer/{i}" for i in range(3)]
SESSIONS = [f"s{i:02d}" for i in range(20)]
LOCK = 4  # the backlog queues' lock duration (s): the restarted syphon job waits it + 5 s
#: The backlog queue that refuses sends (a retryable timeout) for BLIP seconds from the first send batch 5 makes
#: to it (held sessions are pinned to each queue): longer than one task attempt's try (send_timeout 2 s), so an
#: attempt fails and Spark retries it; far shorter than backlog_retry_interval, and than Spark's 4 attempts.
BLIP_QUEUE, BLIP = QUEUES[0], 5.0


def main(work: Path) -> dict[str, Any]:
    """Both runs in a local cluster of their own."""
    from tests.spark.cluster_harness import cluster_session, spark_work_cleaned

    with spark_work_cleaned():
        spark = cluster_session("spark-sb-cluster-ordering")
        try:
            return {
                "ordered": run_ordered(work / "ordered", spark),
                "control": run_control(work / "control", spark),
            }
        finally:
            spark.stop()


class Stream:
    """Two local namespaces (the primary's queues session-enabled with duplicate detection, three backlog queues),
    the sink's stream (one JSON file a micro-batch, repartitioned by session id, row order kept by ``seq``) and the
    syphon job, both on ``spark``. Use as a context manager: on leaving, both queries stop and the namespaces too."""

    def __init__(self, spark: Any, ordering: str, work: Path) -> None:
        from tests.spark.cluster_harness import two_namespaces

        self.spark, self.ordering, self.work = spark, ordering, work
        self._namespaces = two_namespaces()
        self.pids: list[list[int]] = []  # the sink tasks' Python worker pids, per micro-batch
        self.run_ids: dict[str, list[str]] = {"sink": [], "syphon": []}
        self.query: Any = None
        self.syphon: Any = None

    def __enter__(self) -> Stream:
        from servicebus_local.model import QueueSettings
        from spark_sb.config.service_bus import ServiceBusConfig
        from spark_sb.spark.sink import ServiceBusSink

        self.primary, self.secondary = self._namespaces.__enter__()
        try:
            for entity in ENTITIES:
                self.primary.broker.create_queue(
                    entity, QueueSettings(requires_session=True, requires_duplicate_detection=True)
                )
            for q in QUEUES:
                self.secondary.broker.create_queue(
                    q, QueueSettings(max_delivery_count=2147483647, lock_duration=timedelta(seconds=LOCK))
                )
            self.config = ServiceBusConfig.from_dict(
                {
                    "primary": {
                        "connection_string": self.primary.connection_string,
                        "namespace_name": "primary",
                    },
                    "secondary": {"connection_string": self.secondary.connection_string},
                    "backlog_queue_count": len(QUEUES),
                    "failover_interval": 0,
                    "ping_primary_interval": "1s",
                    "send_timeout": "2s",
                    "retry": {"total": 0, "backoff_factor": 0.05, "backoff_max": 0.2},
                    "ordering": self.ordering,
                    "state_location": str(self.work / "state"),
                    "syphon": {"batch_duration": "2s", "batch_size": 20},
                }
            )
            self.feed = Feed(self.work / "in", SESSIONS)
            self.syphon_checkpoint = str(self.work / "syphon-chk")
            self.syphon_stop = self.work / "syphon-stop"
            self.sink = sink = ServiceBusSink(self.config)
            pids = self.pids

            def by_session(df: Any, batch_id: int) -> None:  # the user's code: partitioned by session id
                sink(df.repartition(2, "session_id").sortWithinPartitions("seq").drop("seq"), batch_id)
                pids.append(sorted({r.pid for r in sink.last_results}))

            self.query = (
                self.spark.readStream.schema(SCHEMA)
                .json(str(self.feed.folder))
                .writeStream.foreachBatch(by_session)
                .option("checkpointLocation", str(self.work / "sink-chk"))
                .start()
            )
            self.run_ids["sink"].append(str(self.query.runId))
        except BaseException:
            self._namespaces.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.stop()
        finally:
            self._namespaces.__exit__(*exc)

    def start_syphon(self) -> None:
        from spark_sb.spark.syphon_job import run_syphon

        self.syphon_stop.unlink(missing_ok=True)
        self.syphon = run_syphon(
            self.spark,
            self.config,
            checkpoint=self.syphon_checkpoint,
            trigger="1 second",
            admin_kwargs={"connection_verify": self.secondary.ca_file},
            stop_file=str(self.syphon_stop),
            query_name=None,
        )
        self.run_ids["syphon"].append(str(self.syphon.runId))

    def batch(self, per_session: int = 2) -> None:
        self.feed.write(per_session)
        self.query.processAllAvailable()

    def backlog(self) -> int:
        return backlog_count(self.secondary, QUEUES)

    def wait_drained(self, seconds: float = 60) -> None:
        wait_drained(self.secondary, QUEUES, self.syphon, seconds)

    def stop(self) -> None:
        """The sink's query, then the syphon job between micro-batches (as ``jobs/syphon.py`` stops on SIGTERM): the
        micro-batch that moved the last messages writes its events (the ``acknowledged`` ones among them) before the
        query stops. A plain ``stop()`` there interrupts that batch's write, and its markers' acknowledgements are
        lost (the lines stay held until a newer marker is acknowledged; the kill after batch 8 is that shape).
        Idempotent."""
        from spark_sb.spark.syphon_job import stop_gracefully

        if self.query is not None:
            self.query.stop()
            assert self.query.exception() is None, self.query.exception()
        if self.syphon is not None and self.syphon.isActive:
            stop_gracefully(self.syphon, str(self.syphon_stop), timeout=60)
        self.sink.flush()

    def executors(self) -> dict[str, list[str]]:
        """Per query, the executors its tasks ran on: the tasks of the jobs in its runs' job groups (a micro-batch's
        jobs, the ``foreachBatch`` function's among them, run in the group of the query's run id), from the
        driver's status store. Test code: the product never touches the SparkContext."""
        sc = self.spark.sparkContext
        jsc = sc._jsc.sc()
        jsc.listenerBus().waitUntilEmpty(10_000)  # the store is fed by the listener bus: its events in
        store, tracker = jsc.statusStore(), sc.statusTracker()
        out: dict[str, list[str]] = {}
        for query, runs in self.run_ids.items():
            ids: set[str] = set()
            for run in runs:
                for job in tracker.getJobIdsForGroup(run):
                    info = tracker.getJobInfo(job)
                    for stage in info.stageIds if info is not None else ():
                        attempts = tracker.getStageInfo(stage)
                        for attempt in range((attempts.currentAttemptId if attempts is not None else 0) + 1):
                            tasks = store.taskList(stage, attempt, 100_000)
                            ids.update(str(tasks.apply(i).executorId()) for i in range(tasks.size()))
            out[query] = sorted(ids)
        return out

    def failed_tasks(self) -> int:
        """The sink query's failed task attempts (Spark retried them), from the driver's status tracker."""
        tracker = self.spark.sparkContext.statusTracker()
        failed = 0
        for run in self.run_ids["sink"]:
            for job in tracker.getJobIdsForGroup(run):
                info = tracker.getJobInfo(job)
                for stage in info.stageIds if info is not None else ():
                    stage_info = tracker.getStageInfo(stage)
                    failed += stage_info.numFailedTasks if stage_info is not None else 0
        return failed

    def report(self) -> dict[str, Any]:
        """What both runs report: the sessions' sequences, the sink's counts, where the tasks ran."""
        return {
            "produced": self.feed.produced,
            "received": received(self.primary.connection_string, SESSIONS, at_once=5),
            "diverted": self.sink.total.total_diverted,
            "sink_pids": self.pids,
            "executors": self.executors(),
        }


def run_ordered(work: Path, spark: Any) -> dict[str, Any]:
    """``ordering: session`` through an outage, a stalled entity and a syphon job killed mid-drain."""
    with Stream(spark, "session", work) as run:
        held = None
        for b in range(12):
            if b == 3:
                run.primary.faults.refuse_connections()
                run.primary.faults.drop_connections()
            if b == 5:  # a backlog queue's blip (O8): far shorter than backlog_retry_interval (300 s)
                run.secondary.faults.fail_sends(BLIP_QUEUE, "com.microsoft:timeout", "a blip", seconds=BLIP)
            if b == 7:
                run.primary.faults.accept_connections()
                run.start_syphon()  # started with the recovery: it does not take a slot while it cannot move
            if b == 8:
                run.primary.faults.stall_entity("invoices")
            if b == 10:
                run.primary.faults.stall_entity("invoices", False)
            run.batch()
            if b == 8:  # mid-drain: the job's tasks are killed, what they held comes back after its lock
                held = run.backlog()
                run.syphon.stop()
                run.start_syphon()
        run.wait_drained()
        run.stop()
        events = spark.read.format("delta").load(str(work / "state" / "events"))
        kinds = {
            r["event"]: r["n"]
            for r in events.groupBy("event").count().withColumnRenamed("count", "n").collect()
        }
        return {
            **run.report(),
            "held_at_kill": held,
            "events": kinds,
            "sink_failed_tasks": run.failed_tasks(),
        }


def run_control(work: Path, spark: Any) -> dict[str, Any]:
    """``ordering: none``: a batch healthy, one diverted, one sent after the recovery while the syphon job has not
    started yet; then the syphon job drains the backlog."""
    with Stream(spark, "none", work) as run:
        run.batch(1)
        run.primary.faults.refuse_connections()
        run.primary.faults.drop_connections()
        run.batch(1)
        run.primary.faults.accept_connections()
        time.sleep(1.1)  # ping_primary_interval: the senders probe the primary again
        run.batch(1)
        run.start_syphon()
        run.wait_drained()
        run.stop()
        return run.report()


if __name__ == "__main__":
    report = main(Path(sys.argv[1]))
    print(json.dumps(report, default=str))
