"""The ``servicebus`` Python data source (SPEC S9): ``format("servicebus")`` for streaming and batch writes, with
the behaviour of the ``foreachBatch`` sink and its code (:mod:`spark_sb.spark.sink`)::

    spark_sb.register(spark)  # once per session; also under Spark Connect
    df.writeStream.format("servicebus").options(**opts).option("checkpointLocation", ckpt).start()

Options are the flat configuration keys (:mod:`~spark_sb.spark.datasource_options` checks them before anything is
sent). Spark calls every driver-side method in a Python process of its own, with no SparkSession:

* ``ServiceBusDataSource.__init__`` (driver machine): parses and checks the options.
* ``streamWriter`` / ``writer`` (driver machine): checks the schema and the mode, reads the :class:`WritePlan`
  (:func:`read_plan`: the entity records, the last batch committed, with ``ordering`` the held lines; picklable).
* ``write`` (executors, a task per partition): :func:`write_partition`, the ``foreachBatch`` sink's task code; a
  replayed batch is counted, not sent.
* ``commit`` (driver machine, after every task succeeded): :func:`commit_write` records the batch in Delta path
  tables with deltalake before Spark commits it (``state_location``, or the spool that
  :mod:`spark_sb.spark.relay` copies into catalog tables).

Order through failover in two steps (plan, commit), batch writes' job ids, delivery, and why the counts are in the
state tables rather than the query progress: docs/design/datasource.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.clock import Clock, SystemClock
from spark_sb.core.lazy import lazy_module_getattr
from spark_sb.failover.outcome import namespace_key
from spark_sb.spark.datasource_options import (
    BATCH_ORDERING,
    SourceOptions,
    check_write,
    new_job_id,
    option_error,
    parse_options,
)
from spark_sb.spark.hooks import is_connect
from spark_sb.spark.partition import (
    arrow_rows,
    first_task,
    send_partition,
)
from spark_sb.spark.sink import ServiceBusSink, default_sink_id
from spark_sb.state.records import EntityRecord, PartitionResult
from spark_sb.state.sessions import CATCH_UP_WAIT, HeldLine, SessionLedger
from spark_sb.wire.admin_api import with_namespace_name

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from spark_sb.failover.outcome import SendOutcome
    from spark_sb.state.deltars import DeltaRsStateStore
    from spark_sb.state.store import StateStore

log = logging.getLogger(__name__)

SOURCE_NAME = "servicebus"
BATCH_ID_PROPERTY = "streaming.sql.batchId"  # the task-local property Spark sets in every micro-batch job


# ------------------------------------------------------------------------------------------ the plan
def state_store(location: str | None) -> DeltaRsStateStore | None:
    """The deltalake store of the path tables at ``location`` (``state_location`` or the spool; None: no
    tables). Driver machine."""
    if not location:
        return None
    from spark_sb.state.deltars import DeltaRsStateStore

    return DeltaRsStateStore(location)


@dataclass(frozen=True)
class WritePlan:
    """What the driver hands every task of one write (picklable): the configuration, the sink id the rows are
    recorded under, the entity records read at the start, the last batch this sink id committed, and the path
    tables the commit writes (``location``: ``state_location`` or the spool; None: none).

    With ``ordering`` on (:func:`plan_lines`): ``held``, the sink's held lines left after releasing those whose
    pending markers the syphon job had acknowledged when the plan was read (the tasks hold exactly these), and
    ``remark``, those of them whose newest marker is :data:`~spark_sb.state.sessions.REMARK_AFTER` old (the first
    task sends each a fresh one). Both are bounded by the sink's held lines (the sessions diverted during an outage
    and not drained yet): empty while nothing is held."""

    config: ServiceBusConfig
    sink_id: str
    location: str | None = None
    handoff: tuple[EntityRecord, ...] = ()
    last_committed: int | None = None
    held: tuple[HeldLine, ...] = ()
    remark: tuple[tuple[str, str], ...] = ()

    def replayed(self, batch_id: int | None) -> bool:
        """True when ``batch_id`` was committed before this write started: its tasks send nothing."""
        return batch_id is not None and self.last_committed is not None and batch_id <= self.last_committed


def plan_lines(
    store: StateStore, config: ServiceBusConfig, sink_id: str, now: datetime, clock: Clock | None = None
) -> tuple[tuple[HeldLine, ...], tuple[tuple[str, str], ...]]:
    """Ordering, before the tasks (driver machine; reads only): the held lines of ``sink_id`` (the ``sessions``
    table; nothing beyond a look for its log while it does not exist), less those whose pending markers are all
    acknowledged now (the acknowledgements are read only while a line is held) and those the syphon job is right
    behind whose newest markers it acknowledges within :data:`~spark_sb.state.sessions.CATCH_UP_WAIT` of ``clock``
    (R5: :meth:`~spark_sb.state.sessions.SessionLedger.catch_up`), and the stale ones among them
    (:meth:`~spark_sb.state.sessions.SessionLedger.stale`). Nothing is written here: the commit releases again
    with what it reads then, and writes (:func:`commit_write`; the argument is :mod:`spark_sb.state.sessions`)."""
    ledger = SessionLedger()
    namespace = namespace_key(config.primary)
    ledger.release(store, namespace, sink_id, now)
    ledger.catch_up(store, namespace, CATCH_UP_WAIT, clock or SystemClock(), now)
    return ledger.handoff(), ledger.stale(now)


def read_plan(
    config: ServiceBusConfig,
    sink_id: str,
    location: str | None,
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
) -> WritePlan:
    """The plan of one write: reads the path tables at ``location`` when there are any (driver machine):
    :func:`plan_from` their store."""
    store = state_store(location)
    if store is None:
        return WritePlan(config, sink_id)
    return plan_from(store, config, sink_id, location, now())


def plan_from(
    store: StateStore,
    config: ServiceBusConfig,
    sink_id: str,
    location: str | None,
    now: datetime,
    clock: Clock | None = None,
) -> WritePlan:
    """The plan of one write from ``store`` (driver machine): the entity records, the last committed batch and, with
    ``ordering`` on, the held lines (:func:`plan_lines`, whose catch-up waits on ``clock``)."""
    store.ensure()
    last = store.last_committed(sink_id)
    held: tuple[HeldLine, ...] = ()
    remark: tuple[tuple[str, str], ...] = ()
    if config.ordering != "none":
        held, remark = plan_lines(store, config, sink_id, now, clock)
    return WritePlan(config, sink_id, location, tuple(store.read_entities()), last, held, remark)


@dataclass(frozen=True)
class TaskReport:
    """What one task tells the driver: the rows it read and what it did with them (the ``foreachBatch`` sink's
    :class:`~spark_sb.state.records.PartitionResult`); ``result`` is None for a replay. Its commit message is a
    ``PartitionMessage`` (this plus pyspark's ``WriterCommitMessage``)."""

    batch_id: int
    rows: int
    result: PartitionResult | None


def _report(batch_id: int, rows: int, result: PartitionResult | None) -> TaskReport:
    message: type[TaskReport] = __getattr__("PartitionMessage")
    return message(batch_id, rows, result)


def task_batch_id() -> int | None:
    """The micro-batch id of the running task (executor), None outside a streaming query."""
    from pyspark import TaskContext

    context = TaskContext.get()
    value = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
    return None if value is None else int(value)


def write_partition(plan: WritePlan, batches: Iterator[pa.RecordBatch], batch_id: int) -> TaskReport:
    """One partition task (executor): counts a replay's rows, sends anything else with the ``foreachBatch``
    sink's :func:`~spark_sb.spark.sink.send_partition` - with ``ordering`` on, holding the plan's held lines and,
    in the first partition's task, sending fresh markers behind its stale ones."""
    if plan.replayed(batch_id):
        return _report(batch_id, sum(b.num_rows for b in batches), None)
    remark = plan.remark if plan.remark and first_task() else ()
    result = send_partition(plan.config, arrow_rows(batches), plan.handoff, plan.held, remark)
    return _report(batch_id, result.rows, result)


def _row_batches(rows: Iterator[Any]) -> Iterator[Any]:
    """Rows (Spark 4.0's stream writer) as one-row "batches" that :func:`write_partition` reads alike."""

    class _One:
        num_rows = 1

        def __init__(self, row: Any) -> None:
            self.row = row

        def to_pylist(self) -> list[dict[str, Any]]:
            return [self.row.asDict(recursive=True)]

    for row in rows:
        yield _One(row)


def commit_write(plan: WritePlan, batch_id: int, messages: Sequence[Any]) -> SendOutcome | None:
    """After every task succeeded (driver machine): record the write in the state tables at the plan's location
    (:func:`commit_to`)."""
    return commit_to(state_store(plan.location), plan, batch_id, messages)


def commit_to(
    store: StateStore | None,
    plan: WritePlan,
    batch_id: int,
    messages: Sequence[Any],
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
) -> SendOutcome | None:
    """Record a write in ``store`` with the ``foreachBatch`` sink's code (driver machine), at ``now`` (UTC).
    Returns the merged outcome, None for a replay (recorded as skipped)."""
    sink = ServiceBusSink(plan.config.with_overrides(sink_id=plan.sink_id), store=store, sync_writes=True)
    done = [m for m in messages if isinstance(m, TaskReport)]
    results = [m.result for m in done if m.result is not None]
    if done and not results:  # every task found the batch committed before: a replay
        rows = sum(m.rows for m in done)
        if store is not None and sink.skip_replayed(store, batch_id, lambda: rows, now()):
            return None
        raise RuntimeError(
            f"sink {plan.sink_id!r} batch {batch_id}: its tasks found it committed, the state tables no longer "
            "do; nothing was sent: run the query again"
        )
    if store is not None and plan.config.ordering != "none":
        # Ordering: the held lines as the sessions table has them, less those whose pending markers are all
        # acknowledged now (read again here: a superset of what the plan saw, its catch-up's included; no wait
        # here), then record_batch merges the tasks' marks and writes the sessions table before the events
        # (spark_sb.state.sessions: why this keeps order)
        sink.release_acknowledged(store, now())
    return sink.record_batch(batch_id, results, plan.handoff, store, now)


# ------------------------------------------------------------------------------------------ the writers
class _PlannedWriter:
    """The plan, read when first needed: on the driver before the writer is pickled to the tasks (``streamWriter``
    / ``writer``), or in the commit process, which builds its own writer."""

    def __init__(self, config: ServiceBusConfig, sink_id: str, location: str | None) -> None:
        self._config = config
        self._sink_id = sink_id
        self._location = location
        self._plan: WritePlan | None = None

    @property
    def plan(self) -> WritePlan:
        if self._plan is None:
            self._plan = read_plan(self._config, self._sink_id, self._location)
        return self._plan

    def __getstate__(self) -> dict[str, Any]:
        return {
            "_config": self._config,
            "_sink_id": self._sink_id,
            "_location": self._location,
            "_plan": self.plan,
        }


#: Built on first use (:func:`__getattr__`), so that ``import spark_sb.spark.datasource`` needs no pyspark; importable by
#: name (``spark_sb.spark.datasource.ServiceBusDataSource``) for pickling.
_LAZY = (
    "ServiceBusDataSource",
    "ServiceBusStreamWriter",
    "ServiceBusBatchWriter",
    "PartitionMessage",
    "STREAM_ARROW",
)


def _build() -> dict[str, Any]:
    """The classes that subclass pyspark's data source API (imports pyspark; any process)."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceStreamWriter,
        WriterCommitMessage,
    )

    stream_base: type
    try:  # Spark 4.1+: the stream writer that takes Arrow record batches, as the foreachBatch sink's tasks do
        from pyspark.sql.datasource import DataSourceStreamArrowWriter

        stream_base, arrow = DataSourceStreamArrowWriter, True
    except ImportError:  # pragma: no cover - Spark 4.0: rows, turned into the same dicts
        stream_base, arrow = DataSourceStreamWriter, False

    class PartitionMessage(TaskReport, WriterCommitMessage):
        """A task's commit message (executor -> driver; picklable)."""

    class ServiceBusStreamWriter(_PlannedWriter, stream_base):  # type: ignore[misc, valid-type]
        """The micro-batch writer. Built on the driver machine each micro-batch; ``write`` on executors,
        ``commit`` / ``abort`` on the driver machine. Picklable (the plan)."""

        def write(self, iterator: Iterator[Any]) -> Any:  # a PartitionMessage
            batch_id = task_batch_id()
            if batch_id is None:
                raise RuntimeError(
                    f"no {BATCH_ID_PROPERTY} in the task: not a micro-batch of a streaming query"
                )
            batches = iterator if arrow else _row_batches(iterator)
            return write_partition(self.plan, batches, batch_id)

        def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's name
            commit_write(self.plan, batchId, messages)

        def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's name
            done = [m for m in messages if isinstance(m, TaskReport)]
            log.warning(
                "sink %s batch %s aborted: %d of %d tasks finished (%d rows); nothing recorded, Spark runs it again",
                self._sink_id,
                batchId,
                len(done),
                len(messages),
                sum(m.rows for m in done),
            )

    class ServiceBusBatchWriter(_PlannedWriter, DataSourceArrowWriter):
        """The batch write (``df.write``): one job, recorded as batch 0 of sink id ``<sink_id>/<job_id>``. Built on
        the driver machine; ``write`` on executors, ``commit`` / ``abort`` on the driver machine (this object)."""

        def write(self, iterator: Iterator[pa.RecordBatch]) -> Any:  # a PartitionMessage
            return write_partition(self.plan, iterator, 0)

        def commit(self, messages: list[Any]) -> None:
            commit_write(self.plan, 0, messages)

        def abort(self, messages: list[Any]) -> None:
            done = [m for m in messages if isinstance(m, TaskReport)]
            log.warning(
                "write %s aborted: %d of %d tasks finished (%d rows); nothing recorded",
                self._sink_id,
                len(done),
                len(messages),
                sum(m.rows for m in done),
            )

    class ServiceBusDataSource(DataSource):
        """``format("servicebus")``: the sink (writers) and the source (readers, :mod:`spark_sb.spark.reader`).
        Built by Spark from the options on the driver machine; a writer checks them as the sink's, a reader as the
        source's (each names a bad option before anything is sent or received). Picklable (the options and what
        was checked)."""

        def __init__(self, options: dict[str, str]) -> None:
            super().__init__(options)
            self._settings: SourceOptions | None = None
            self._read: Any = None

        @property
        def settings(self) -> SourceOptions:
            """The options checked as the sink's (driver machine; once)."""
            if self._settings is None:
                parsed = parse_options(self.options)
                self._settings = replace(parsed, config=with_namespace_name(parsed.config))
            return self._settings

        def _read_options(self) -> Any:
            """The options checked as the source's (driver machine; once): a SourceReadOptions."""
            if self._read is None:
                from spark_sb.source.options import parse_source_options

                parsed = parse_source_options(self.options)
                self._read = replace(parsed, config=with_namespace_name(parsed.config))
            return self._read

        @classmethod
        def name(cls) -> str:
            return SOURCE_NAME

        def schema(self) -> str:
            from spark_sb.spark.reader import reader_schema

            return reader_schema(self._read_options())

        def streamReader(self, schema: StructType) -> Any:  # noqa: N802 - Spark's name
            from spark_sb.spark import reader

            opts = self._read_options()
            reader.stream_path(opts)  # one entity per query: refused now, naming the option
            return reader.__getattr__("ServiceBusStreamReader")(opts)

        def reader(self, schema: StructType) -> Any:
            from spark_sb.spark import reader

            return reader.__getattr__("ServiceBusBatchReader")(self._read_options())

        def _sink_id(self) -> str:
            config = self.settings.config
            return config.sink_id or default_sink_id(config)

        def streamWriter(self, schema: StructType, overwrite: bool) -> ServiceBusStreamWriter:  # noqa: N802
            if self.settings.job_id is not None:
                raise option_error(
                    [("job_id", "applies to batch writes (df.write) only; streams use sink_id")]
                )
            check_write(self.settings.config, schema, overwrite, streaming=True)
            self.settings.require_store(streaming=True)
            return ServiceBusStreamWriter(self.settings.config, self._sink_id(), self.settings.store_location)

        def writer(self, schema: StructType, overwrite: bool) -> ServiceBusBatchWriter:
            if self.settings.config.ordering != "none":
                raise option_error([("ordering", BATCH_ORDERING)])
            check_write(self.settings.config, schema, overwrite, streaming=False)
            self.settings.require_store(streaming=False)
            job_id = self.settings.job_id or new_job_id()
            writer = ServiceBusBatchWriter(
                self.settings.config, f"{self._sink_id()}/{job_id}", self.settings.store_location
            )
            _ = writer.plan  # read now, on the driver: the commit gets this very object back
            return writer

    built: dict[str, Any] = {
        "ServiceBusDataSource": ServiceBusDataSource,
        "ServiceBusStreamWriter": ServiceBusStreamWriter,
        "ServiceBusBatchWriter": ServiceBusBatchWriter,
        "PartitionMessage": PartitionMessage,
        "STREAM_ARROW": arrow,
    }
    for name, obj in built.items():
        if isinstance(obj, type):
            obj.__module__ = __name__
            obj.__qualname__ = name
    return built


__getattr__ = lazy_module_getattr(globals(), _LAZY, _build)


def register(spark: Any) -> None:
    """Register the ``servicebus`` data source with ``spark`` (a classic or Spark Connect session; driver).
    Idempotent: registering again replaces it with itself. For a Spark Connect session, the client is made to
    tolerate the data source's empty profiler updates where it has SPARK-59135
    (:mod:`spark_sb.spark.connect_client`)."""
    spark.dataSource.register(__getattr__("ServiceBusDataSource"))
    if is_connect(spark):
        from spark_sb.spark.connect_client import tolerate_accumulator_updates

        tolerate_accumulator_updates()


__all__ = [
    "SOURCE_NAME",
    "TaskReport",
    "WritePlan",
    "register",
]
