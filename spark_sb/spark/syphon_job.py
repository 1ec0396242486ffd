"""The syphon as a restartable Structured Streaming query (SPEC S7, B9, B11, B12, O5).

``run_syphon(spark, config, checkpoint=...)`` starts a query that reads the Python streaming data source
``servicebus-syphon`` (:func:`syphon_source`) and writes what it did to the Delta events table with
``foreachBatch``. This module wires the query and starts and stops it; each step is a module of its own:

* planning - which backlog queues a micro-batch drains, from admin counts: :mod:`spark_sb.spark.syphon_planner`
  (driver machine, the data source's planner process);
* draining - one queue per input partition, rows per message moved: :mod:`spark_sb.spark.syphon_drain` (executors);
* recording - the rows aggregated into the events table, idempotently per micro-batch of the run:
  :mod:`spark_sb.spark.syphon_ledger` (driver, ``foreachBatch``);
* one ordered job a backlog - a run's lease: :mod:`spark_sb.spark.syphon_lease` (driver).

Restartable: the checkpoint holds only offsets (a replayed micro-batch drains again; moving is idempotent).
Stopping: :func:`request_stop` lets the running micro-batch finish and keeps the next one from starting
(:func:`stop_gracefully`); ``query.stop()`` kills the tasks (the locks they held run out, nothing is lost).

DataFrame operations only (a Python data source and ``foreachBatch``): runs under Spark Connect. The data source
classes are built by :func:`syphon_source` (pyspark is imported only then); they carry the picklable config.
How each trigger goes and why: docs/design/syphon-job.md.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.errors import ConfigError
from spark_sb.failover.outcome import namespace_key
from spark_sb.spark.partition import ordering_needs_tables
from spark_sb.spark.syphon_drain import ROW_SCHEMA, drain_partition
from spark_sb.spark.syphon_lease import SyphonLease, SyphonRun
from spark_sb.spark.syphon_ledger import SyphonBatchWriter
from spark_sb.spark.syphon_planner import BacklogWatcher, read_entity_hints
from spark_sb.state.maintenance import store_for
from spark_sb.wire.admin_api import with_namespace_name

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

SOURCE_NAME = "servicebus-syphon"


# ------------------------------------------------------------------------------------------- the source
def check_ordered_job(config: ServiceBusConfig) -> None:
    """Driver: with ``ordering`` on the job needs the state tables (its acknowledgements go to the events table) and
    ``syphon.prefetch`` 0 - a pooled syphon's prefetched messages stay locked in its worker after the task, while
    the next micro-batch may drain the queue from another worker and move their sessions' later messages first.
    One-line :class:`~spark_sb.core.errors.ConfigError` naming the key."""
    ordering_needs_tables(config, "the syphon job")
    if config.ordering != "none" and config.syphon_prefetch:
        raise ConfigError.at(
            "syphon.prefetch",
            f"must be 0 with ordering: {config.ordering} (found {config.syphon_prefetch}): prefetched messages "
            "stay locked in a worker while another drains their queue",
        )


def syphon_source(
    config: ServiceBusConfig,
    *,
    queues: Sequence[str] | None = None,
    admin_kwargs: Mapping[str, Any] | None = None,
    stop_file: str | None = None,
) -> type:
    """The ``servicebus-syphon`` Python data source class for ``config`` (driver; register it with
    ``spark.dataSource.register``). The class carries the picklable config (pickled by value with cloudpickle, to
    the planner process and the executors). ``admin_kwargs``: extra arguments of the admin client (e.g.
    ``connection_verify`` for a local namespace). ``stop_file``: while this file exists no micro-batch starts.
    Raises :class:`~spark_sb.core.errors.ConfigError` for ``ordering`` without state tables or with prefetch
    (:func:`check_ordered_job`)."""
    check_ordered_job(config)
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    try:  # pyspark 4.1+: a Python source may say it supports Trigger.AvailableNow (no single-batch fallback)
        from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

        bases: tuple[type, ...] = (DataSourceStreamReader, SupportsTriggerAvailableNow)
    except (
        ImportError
    ):  # pragma: no cover - the oldest pair: Spark falls back to one micro-batch, and says so
        bases = (DataSourceStreamReader,)

    names = list(queues) if queues is not None else config.backlog_queue_names()
    extra = dict(admin_kwargs or {})

    class SyphonReader(*bases):  # type: ignore[misc]
        """Offsets are {"id", "work", "hints"}; a new one only when there is work (see the module docstring)."""

        def __init__(self) -> None:
            self._watcher: BacklogWatcher | None = None
            self._last: dict[str, Any] = {"id": "start", "work": [], "hints": {}}

        def __getstate__(self) -> dict[str, Any]:
            return {"_watcher": None, "_last": self._last}

        def initialOffset(self) -> dict[str, Any]:  # noqa: N802 - the DataSource API's name
            return {"id": "start", "work": [], "hints": {}}

        def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
            """The query runs with ``Trigger.AvailableNow``: drain what the backlog holds now, in as many
            micro-batches as it takes (:meth:`BacklogWatcher.prepare_available_now`), then stop."""
            if self._watcher is None:
                self._watcher = BacklogWatcher(config, names, admin_kwargs=extra)
            self._watcher.prepare_available_now()

        def latestOffset(  # noqa: N802
            self, start: dict[str, Any] | None = None, limit: Any = None
        ) -> dict[str, Any]:
            """A new offset only when there is work; else ``start`` (the last committed offset; no micro-batch).
            ``limit`` (admission control) is not used: a micro-batch is bounded by ``syphon.batch_duration``."""
            if start is not None:
                self._last = start
            if stop_file is not None and os.path.exists(stop_file):
                return self._last
            if self._watcher is None:
                self._watcher = BacklogWatcher(config, names, admin_kwargs=extra)
            work = self._watcher.work()
            if work:
                self._last = {
                    "id": uuid.uuid4().hex,
                    "work": [[q, d] for q, d in work],
                    "hints": read_entity_hints(config),
                }
                if config.ordering != "none":  # the ordered drain measures its locks with the queues' own
                    self._last["locks"] = self._watcher.lock_durations()
            return self._last

        def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
            hints, locks = end.get("hints") or {}, end.get("locks") or {}
            return [
                InputPartition(json.dumps([q, bool(d), hints, locks.get(q)])) for q, d in end.get("work", [])
            ]

        def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
            queue, dead_letter, hints, *lock = json.loads(partition.value)
            lock_duration = lock[0] if lock and lock[0] else None
            yield from drain_partition(config, queue, dead_letter, hints or None, names, lock_duration)

        def commit(self, end: dict[str, Any]) -> None:
            return None

    class SyphonSource(DataSource):
        """Backlog queues drained into the primary; one row per message moved."""

        @classmethod
        def name(cls) -> str:
            return SOURCE_NAME

        def schema(self) -> str:
            return ROW_SCHEMA

        def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: N802
            return SyphonReader()

    return SyphonSource


#: The leases of the ordered syphon queries this process started, by query id (bounded by its running queries).
_LEASES: dict[str, SyphonLease] = {}


def _keep_lease(query: StreamingQuery, lease: SyphonLease) -> None:
    """The lease's thread (driver): a heartbeat while the query runs, the release when it ends."""
    try:
        while True:
            try:
                if query.awaitTermination(max(1, int(lease.heartbeat))):
                    break
            except Exception:  # noqa: BLE001 - the query failed: it ended
                break
            try:
                lease.beat()
            except Exception as exc:  # noqa: BLE001 - the next beat tries again; the lease runs out if none lands
                log.warning("syphon: lease heartbeat failed (%s)", type(exc).__name__)
    finally:
        lease.release()
        _LEASES.pop(str(query.id), None)


# ------------------------------------------------------------------------------------------- the query
def run_syphon(
    spark: SparkSession,
    config: ServiceBusConfig,
    *,
    checkpoint: str,
    trigger: str = "10 seconds",
    once: bool = False,
    available_now: bool = False,
    queues: Sequence[str] | None = None,
    admin_kwargs: Mapping[str, Any] | None = None,
    stop_file: str | None = None,
    query_name: str | None = "servicebus-syphon",
    writer: SyphonBatchWriter | None = None,
) -> StreamingQuery:
    """Start the syphon query (driver). Returns the query; stop it with :func:`request_stop` +
    :func:`stop_gracefully` (or ``query.stop()``).

    The trigger: ``processingTime=trigger`` by default; ``once``: a single micro-batch (``Trigger.Once``), then the
    query stops; ``available_now``: ``Trigger.AvailableNow`` (the trigger serverless compute accepts), which drains
    what the backlog queues hold when the query starts, in as many micro-batches as that takes (each draining a
    queue for at most ``syphon.batch_duration``; :meth:`BacklogWatcher.prepare_available_now`), and stops. On
    pyspark 4.0 (no ``SupportsTriggerAvailableNow``) Spark runs one micro-batch instead, and warns. ``once`` and ``available_now`` exclude each other."""
    if once and available_now:
        raise ValueError("run_syphon: give once=True or available_now=True, not both")
    check_ordered_job(config)  # before the query starts: no queue is drained

    config = with_namespace_name(config)  # resolved once on the driver; executors never ask
    names = list(queues) if queues is not None else config.backlog_queue_names()
    spark.dataSource.register(
        syphon_source(config, queues=names, admin_kwargs=admin_kwargs, stop_file=stop_file)
    )
    writer = writer or SyphonBatchWriter(config)
    run_id = writer.start_run()  # this run's Delta transaction id (SPEC O5), before the function is pickled
    lease = None
    if (
        config.ordering != "none"
    ):  # a second ordered job on these queues is refused before it drains (SPEC O5)
        store = store_for(spark, config)
        assert store is not None  # check_ordered_job: ordering has the state tables
        all_queues = set(names) == set(config.backlog_queue_names())
        run = SyphonRun(
            run_id,
            socket.gethostname(),
            checkpoint,
            datetime.now(timezone.utc),
            None if all_queues else tuple(sorted(names)),
        )
        lease = SyphonLease(store, writer.sink_id, namespace_key(config.primary), run)
        lease.acquire()
    stream = spark.readStream.format(SOURCE_NAME).load()
    out = stream.writeStream.foreachBatch(writer).option("checkpointLocation", checkpoint)
    if query_name:
        out = out.queryName(query_name)
    if available_now:
        out = out.trigger(availableNow=True)
    elif once:
        out = out.trigger(once=True)
    else:
        out = out.trigger(processingTime=trigger)
    try:
        query = out.start()
    except BaseException:
        if lease is not None:
            lease.release()
        raise
    if lease is not None:
        _LEASES[str(query.id)] = lease
        threading.Thread(target=_keep_lease, args=(query, lease), name="syphon-lease", daemon=True).start()
    return query


def request_stop(stop_file: str) -> None:
    """Keep the next micro-batch from starting (driver; any thread, e.g. a SIGTERM handler)."""
    with open(stop_file, "w") as f:
        f.write("stop\n")


def stop_gracefully(query: StreamingQuery, stop_file: str, timeout: float) -> bool:
    """Stop ``query`` between micro-batches: :func:`request_stop`, wait (at most ``timeout`` s) until no trigger
    runs, then stop it. True when it stopped between batches (False: the running batch was cut short)."""
    request_stop(stop_file)
    deadline = time.monotonic() + timeout
    idle = False
    while time.monotonic() < deadline and query.isActive:
        if not query.status.get("isTriggerActive", False):
            idle = True
            break
        time.sleep(0.1)  # polling the query's status: there is nothing to await
    query.stop()
    lease = _LEASES.pop(str(query.id), None)
    if lease is not None:  # before the caller stops the session (the lease's thread would write too late)
        lease.release()
    return idle or not query.isActive
