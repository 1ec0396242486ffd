"""The Spark ``foreachBatch`` sink (SPEC S1-S6), driver side: rows to Service Bus, failover state shared through
Delta tables, replayed batches skipped, rejects recorded. DataFrame operations only (``mapInArrow``), so it runs
under Spark Connect (Databricks standard access mode, serverless)::

    sb_sink = ServiceBusSink(load_config("conf/prod.yaml"))
    df.writeStream.foreachBatch(sb_sink).option("checkpointLocation", ckpt).start()

``ServiceBusSink.__call__`` runs on the driver and pickles only the configuration; the tasks run
:func:`~spark_sb.spark.partition.send_partition` in executor Python workers. At least once: a task returns only
after every message was accepted by the primary or a backlog queue, or recorded as a reject. The counts are
:mod:`spark_sb.spark.totals`; the process hooks :mod:`spark_sb.spark.hooks`. Where each step runs, the state
writes (``async`` / ``sync``) and why they do not widen the replay window: docs/design/sink.md.
"""

from __future__ import annotations

import logging
import pickle
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.clock import Clock, SystemClock
from spark_sb.core.errors import ConfigError
from spark_sb.failover.outcome import SendOutcome, namespace_key
from spark_sb.spark.hooks import install_sigterm_handler, is_connect, register_exit_hook
from spark_sb.spark.partition import (
    RESULT_SCHEMA,
    ordering_needs_tables,
    partition_function,
)
from spark_sb.spark.schema import validate_schema
from spark_sb.spark.totals import SinkTotals, reasons, state_table, table_totals, task_failure, warn_rejects
from spark_sb.state.delta import DeltaStateStore, StateTables
from spark_sb.state.planning import plan_batch
from spark_sb.state.records import (
    BATCH_COMMITTED,
    DIVERTED,
    REJECTED,
    REPLAY_SKIPPED,
    SENT,
    SESSION_HELD,
    SESSION_RETURNED,
    BatchWrites,
    EntityRecord,
    Event,
    PartitionResult,
)
from spark_sb.state.sessions import CATCH_UP_WAIT, HeldLine, SessionLedger
from spark_sb.state.store import StateStore
from spark_sb.state.writer import (
    COMMIT_INTERVAL,
    MAX_PENDING_BATCHES,
    MAX_VIEW_AGE,
    EntityView,
    StateWriteError,
    StateWriter,
)
from spark_sb.wire.admin_api import with_namespace_name

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "ServiceBusSink",
    "SinkIdConflictError",
    "batch_counts",
    "default_sink_id",
    "sink",
]

log = logging.getLogger(__name__)


#: What a replay that is not one means, and what to do (the end of :class:`SinkIdConflictError`'s line).
NEW_CHECKPOINT = (
    "another query or a new checkpoint (a declarative pipeline's full refresh starts one) uses this sink_id and "
    "state tables; give each streaming query and each new checkpoint its own sink_id (for a full refresh: a new "
    "sink_id option on the sink, e.g. with a -2 suffix)"
)


class SinkIdConflictError(RuntimeError):
    """A batch id this ``sink_id`` committed before arrives with other content, or below the last committed one:
    another query (or a new checkpoint) uses the same ``sink_id`` and state tables. Set a distinct ``sink_id``."""


def default_sink_id(config: ServiceBusConfig) -> str:
    """``<primary namespace name>/<entity>`` (``*`` without a default entity): the documented default."""
    try:
        name = config.primary.effective_namespace_name()
    except ConfigError:  # an address endpoint whose name was not resolved: its host:port
        name = namespace_key(config.primary)
    return f"{name}/{config.entity or '*'}"


#: Batch ids this sink object planned, kept in memory for the replay check (more than the writer can hold).
_RECENT_BATCHES = 4 * MAX_PENDING_BATCHES


class ServiceBusSink:
    """A ``foreachBatch`` function that sends every row of each micro-batch to Service Bus (driver).

    Delivery: at least once into the primary or a backlog queue; with message ids (a column, or
    ``message_id_mode: content``) and duplicate detection on the primary, exactly once into the primary across
    task retries, replays (a batch id already committed by this ``sink_id`` is skipped) and the syphon.

    Picklable: holds only the configuration. ``last_outcome`` is the merged outcome of the last batch (records
    included), ``last_results`` its per-partition results; ``total`` keeps counts only (:class:`SinkTotals`).
    ``store`` overrides the state store (tests; the ``servicebus`` data source passes its deltalake store); by
    default it is the Delta store named by ``state_location`` / ``state_table_prefix``, or none.
    ``max_pending_writes``: how many batches may wait for the state writer before a batch waits for it
    (backpressure). ``sync_writes``: write the state tables before a batch returns whatever ``state_writes``
    says (the data source's ``commit`` runs in a short-lived process, where no background writer may wait).

    State writes (``state_writes``):

    * ``async`` (default): a batch hands its planned rows to a background thread on the driver
      (:class:`~spark_sb.state.writer.StateWriter`) and returns; the thread writes everything pending as one commit per
      table (group commit; a batch's rows wait at most ``COMMIT_INTERVAL``, 30 s, for it). The tasks of the
      next batch get the driver's view of the entity state (the last read of the table plus this sink's own
      planned records), so no batch waits for a Delta read or write except the first (and one after a pause
      longer than ``MAX_VIEW_AGE``). A failed write is raised by the next batch (the query fails) or by :meth:`flush`.
      **Call** :meth:`flush` (or use the sink as a context manager) **before** ``spark.stop()``, so the last
      batches' rows reach the tables; an ``atexit`` hook flushes too, but only logs what fails.
      Under Spark Connect the ``foreachBatch`` function runs in a process beside the server, which the server
      ends when the query stops and which the client's :meth:`flush` cannot reach: there the writes are
      synchronous whatever ``state_writes`` says.
    * ``sync``: every batch reads the entities table before its tasks and writes its rows before it returns
      (durable before Spark's checkpoint; ~1-3 s per batch).
    """

    def __init__(
        self,
        config: ServiceBusConfig,
        *,
        store: StateStore | None = None,
        max_pending_writes: int = MAX_PENDING_BATCHES,
        sync_writes: bool = False,
        clock: Clock | None = None,
    ) -> None:
        if (
            isinstance(max_pending_writes, bool)
            or not isinstance(max_pending_writes, int)
            or max_pending_writes < 1
        ):
            # 0 made the first asynchronous batch wait for a writer thread that its own submit starts: forever
            raise ConfigError.at(
                "max_pending_writes", f"must be an integer >= 1 (batches), found {max_pending_writes!r}"
            )
        ordering_needs_tables(config, "the Spark sink", store_given=store is not None)
        # The primary's namespace name is resolved here, on the driver, and shipped in the config: executors
        # never ask the primary's admin endpoint (a worker started during an outage could not).
        self.config = with_namespace_name(config)
        self.sink_id = self.config.sink_id or default_sink_id(self.config)
        self.last_outcome: SendOutcome | None = None
        self.last_results: list[PartitionResult] = []  # per partition, the last batch only
        self.total = SinkTotals()
        self._store = store
        self._tables = StateTables.from_config(self.config)
        self._schema_checked = False
        self._last_committed: int | None = None
        self._committed_loaded = False
        self._recent: OrderedDict[int, tuple[int, datetime]] = OrderedDict()  # batch id -> (rows, time)
        self._view = EntityView()
        self._writer: StateWriter | None = None
        self._seq = 0
        self._force_sync = sync_writes  # Spark Connect, the data source's commit
        self._max_pending = max_pending_writes  # batches queued for the writer before a batch waits
        # ordering (spark_sb.state.sessions): the held lines, this batch's handoff of them, those of them whose
        # newest marker is stale (marked afresh), the lines released since the last write
        self._ledger = SessionLedger() if self.config.ordering != "none" else None
        self._held: tuple[HeldLine, ...] = ()
        self._remark: tuple[tuple[str, str], ...] = ()
        self._returned: list[HeldLine] = []
        self._clock = clock or SystemClock()  # the batch start's catch-up waits on it (R5, tests: a fake one)
        if self.config.state_writes == "async" and self._tables is not None:
            install_sigterm_handler()  # the driver's main thread: SIGTERM then flushes the state rows

    @property
    def held_lines(self) -> tuple[HeldLine, ...]:
        """Ordering: the held lines handed to the current batch's tasks (:mod:`spark_sb.state.sessions`)."""
        return self._held

    @property
    def stale_lines(self) -> tuple[tuple[str, str], ...]:
        """Ordering: the held lines the current batch's first task gives a fresh return marker (their newest one is
        :data:`~spark_sb.state.sessions.REMARK_AFTER` old: its acknowledgement may be lost)."""
        return self._remark

    @property
    def asynchronous(self) -> bool:
        """True when this sink writes its state tables in the background (``state_writes: async``, classic
        Spark)."""
        return self.config.state_writes == "async" and not self._force_sync

    # -- the foreachBatch entry point
    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        if not self._schema_checked:
            validate_schema(batch_df.schema, self.config.columns)  # SchemaError names the column
            self._schema_checked = True
        config = self.config

        def run_tasks(handoff: Sequence[EntityRecord]) -> list[PartitionResult]:
            try:
                function = partition_function(config, handoff, self.held_lines, self.stale_lines)
                rows = batch_df.mapInArrow(function, RESULT_SCHEMA).collect()
            except Exception as exc:
                told = task_failure(exc)
                if told is None:
                    raise
                log.error("sink %s batch %s failed: %s", self.sink_id, batch_id, told)
                raise told from exc  # the line first; Spark's trace (with the executor's) is its cause
            return [pickle.loads(bytes(r["result"])) for r in rows]

        if not self._force_sync and self.config.state_writes == "async" and is_connect(batch_df.sparkSession):
            self._force_sync = True
            log.info("sink %s: Spark Connect: state tables written synchronously", self.sink_id)
        self.process_batch(batch_id, run_tasks, batch_df.count, self._store_for(batch_df))

    def _store_for(self, batch_df: DataFrame) -> StateStore | None:
        if isinstance(self._store, DeltaStateStore):
            self._store.spark = batch_df.sparkSession  # the session of this query run
        if self._store is not None:
            return self._store
        if self._tables is None:
            return None
        spark = batch_df.sparkSession
        store = DeltaStateStore(spark, self._tables)
        self._store = store
        return store

    def process_batch(
        self,
        batch_id: int,
        run_tasks: Callable[[Sequence[EntityRecord]], list[PartitionResult]],
        count_rows: Callable[[], int],
        store: StateStore | None,
        now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    ) -> SendOutcome | None:
        """One batch, given how to run its tasks (driver; Spark-free, so unit-testable with fakes):
        :meth:`begin_batch`, the tasks, :meth:`record_batch`.

        Returns the merged outcome, or None when the batch was skipped as a replay. With asynchronous state
        writes it raises first the error of an earlier batch's failed write (:class:`StateWriteError`), before
        anything of this batch is sent, so Spark does not commit this batch and runs it again on restart.
        """
        handoff = self.begin_batch(batch_id, count_rows, store, now)
        if handoff is None:
            return None
        return self.record_batch(batch_id, run_tasks(handoff), handoff, store, now)

    def begin_batch(
        self,
        batch_id: int,
        count_rows: Callable[[], int],
        store: StateStore | None,
        now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    ) -> list[EntityRecord] | None:
        """Before a batch's tasks (driver): None when ``batch_id`` is a replay (recorded, skip it), else the
        entity records to hand the tasks (empty without a store)."""
        if store is None:
            return []
        self._raise_write_error()
        store.ensure()
        if self.skip_replayed(store, batch_id, count_rows, now()):
            return None
        if self._ledger is not None:
            at = now()
            self._held = self._release(store, at)
            self._remark = self._ledger.stale(at)
        if not self.asynchronous:
            return store.read_entities()
        if self._view.age() > MAX_VIEW_AGE:  # the first batch, the first after an error or a pause
            self._view.refreshed(store.read_entities())
        return self._view.records()

    def release_acknowledged(self, store: StateStore, now: datetime | None = None) -> tuple[HeldLine, ...]:
        """Ordering (driver machine): :meth:`_release` for a caller that is not this sink's ``foreachBatch``
        function - the data source's commit, which runs in a process of Spark's with a sink of its own per
        micro-batch (:mod:`spark_sb.spark.datasource`), at ``now`` (UTC; default the wall clock's): it never waits
        (the plan caught up before the tasks). The held lines left."""
        return self._release(store, now or datetime.now(timezone.utc), catch_up=False)

    def _release(self, store: StateStore, now: datetime, catch_up: bool = True) -> tuple[HeldLine, ...]:
        """Ordering, at batch start (driver): load the held lines (a driver's first batch), read the
        acknowledgements of their pending markers - only while a line is held -, release the lines whose markers
        are all acknowledged, then wait (R5, up to :data:`CATCH_UP_WAIT`) for the newest markers of the lines the
        syphon job is right behind; the held lines left, for the tasks (:mod:`spark_sb.state.sessions`)."""
        ledger = self._ledger
        assert ledger is not None
        namespace = namespace_key(self.config.primary)
        self._returned.extend(ledger.release(store, namespace, self.sink_id, now))
        if catch_up:
            self._returned.extend(ledger.catch_up(store, namespace, CATCH_UP_WAIT, self._clock, now))
        return ledger.handoff()

    def _hold(
        self, batch_id: int, results: Sequence[PartitionResult], store: StateStore, at: datetime
    ) -> list[Event]:
        """Ordering, after the batch's tasks (driver): merge the lines they marked and, when the held lines changed,
        write them to the ``sessions`` table now - before the ``foreachBatch`` function returns, whatever
        ``state_writes`` says. The events of the lines first held and of those released."""
        ledger = self._ledger
        assert ledger is not None
        marks = [m for r in results for m in r.marks]
        new = ledger.marked(marks, at)
        returned, self._returned = self._returned, []
        if marks or returned:
            store.write_sessions(self.sink_id, ledger.handoff())
        primary = namespace_key(self.config.primary)
        return [
            Event(
                at,
                self.sink_id,
                batch_id,
                kind,
                namespace=primary,
                entity=line.entity,
                backlog_queue=line.queue,
                detail=line.session,
            )
            for kind, lines in ((SESSION_HELD, new), (SESSION_RETURNED, returned))
            for line in lines
        ]

    def record_batch(
        self,
        batch_id: int,
        results: Sequence[PartitionResult],
        handoff: Sequence[EntityRecord],
        store: StateStore | None,
        now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    ) -> SendOutcome:
        """After a batch's tasks (driver): merge the per-partition results, plan the state tables' rows
        (:func:`~spark_sb.state.planning.plan_batch`, ``handoff`` being the records the tasks started from) and write them
        (in the background with ``state_writes: async``), count the totals. Returns the merged outcome. Shared by
        the ``foreachBatch`` sink and the ``servicebus`` data source's ``commit``."""
        primary = namespace_key(self.config.primary)
        asynchronous = store is not None and self.asynchronous
        outcome = SendOutcome()
        rows = 0
        for r in results:
            outcome = outcome.merge(r.outcome)
            rows += r.rows
        if store is not None:
            writes = plan_batch(
                sink_id=self.sink_id,
                batch_id=batch_id,
                namespace=primary,
                backlog_namespace=(
                    namespace_key(self.config.secondary) if self.config.secondary is not None else None
                ),
                results=results,
                previous=handoff,
                now=now(),
                updated_by=self.sink_id,
            )
            if self._ledger is not None:
                lines = self._hold(batch_id, results, store, now())
                if lines:
                    writes = replace(writes, events=(*lines, *writes.events))
            if asynchronous:
                self._seq += 1
                self._view.planned(self._seq, writes.entities)
                self._remember(batch_id, writes)
                try:
                    self._writer_for(store).submit(self._seq, batch_id, writes)
                except StateWriteError:
                    self._forget_after_error()
                    raise
            else:
                store.write_batch(self.sink_id, batch_id, writes)
                self._remember(batch_id, writes)
        self.last_outcome = outcome
        self.last_results = list(results)
        by_reason = reasons(outcome)  # counted once, for the totals and the warning
        self.total.add(outcome, rows, by_reason)
        warn_rejects(self.sink_id, batch_id, outcome, rows, by_reason)
        log.info(
            "sink %s batch %s: %d rows, %d sent, %d diverted, %d rejected, %d state changes",
            self.sink_id,
            batch_id,
            rows,
            outcome.total_sent,
            outcome.total_diverted,
            outcome.total_rejected,
            len(outcome.transitions),
        )
        return outcome

    def summary(self, spark: SparkSession | None = None) -> str:
        """The totals in one line, for a job to print at its end (driver).

        Without ``spark``: the running totals of this sink object (:attr:`total`), which sees its batches only
        where ``foreachBatch`` runs in this process (classic Spark). With ``spark`` (a classic or Spark Connect
        session): the totals of every batch this ``sink_id`` recorded in the state tables, over all runs
        (:func:`table_totals`; pending asynchronous writes are flushed first) - the one that works under Spark
        Connect, where the function runs beside the server and this object sees nothing."""
        if spark is None:
            return self.total.line(self.sink_id)
        self.flush()
        return table_totals(spark, self.config, self.sink_id).line(self.sink_id)

    # -- state writes
    def _writer_for(self, store: StateStore) -> StateWriter:
        if self._writer is not None and self._writer.store is not store:
            self._writer.close()  # another store (tests): what the old one holds is written first
            self._writer = None
        if self._writer is None:
            self._writer = StateWriter(
                store,
                self.sink_id,
                self._view,
                max_pending=self._max_pending,
                commit_interval=COMMIT_INTERVAL,
            )
            register_exit_hook(self)
        return self._writer

    def _remember(self, batch_id: int, writes: BatchWrites) -> None:
        """Record ``batch_id`` as committed by this sink (planned or written), for the replay check."""
        commit = next((e for e in reversed(writes.events) if e.event == BATCH_COMMITTED), None)
        if commit is not None:
            self._recent[batch_id] = (commit.count, commit.time)
            self._recent.move_to_end(batch_id)
            while len(self._recent) > _RECENT_BATCHES:
                self._recent.popitem(last=False)
        if self._last_committed is None or batch_id > self._last_committed:
            self._last_committed = batch_id

    def _forget_after_error(self) -> None:
        """After a failed write the tables lack some planned rows: forget the in-memory view and batch ids, so
        the next batch starts from a synchronous read, as the first one does."""
        self._view.reset()
        self._recent.clear()
        self._last_committed = None
        self._committed_loaded = False

    def _raise_write_error(self) -> None:
        if self._writer is None:
            return
        try:
            self._writer.raise_error()
        except StateWriteError:
            self._forget_after_error()
            raise

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every state write this sink holds is committed to the tables; raise
        :class:`~spark_sb.state.writer.StateWriteError` if one failed, ``TimeoutError`` after ``timeout`` seconds
        (driver). Call it before ``spark.stop()``: the writes need the session. Nothing to do with
        ``state_writes: sync`` or without state tables."""
        if self._writer is None:
            return
        try:
            self._writer.flush(timeout)
        except StateWriteError:
            self._forget_after_error()
            raise

    def close(self, timeout: float | None = None) -> None:
        """:meth:`flush`, then stop the writer thread (driver). The sink stays usable: a later batch starts a
        new thread."""
        writer = self._writer
        if writer is None:
            return
        try:
            writer.close(timeout)
        except StateWriteError:
            self._forget_after_error()
            raise

    def __enter__(self) -> ServiceBusSink:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except Exception as write_error:  # the exception already on its way out stays the one raised
            log.error("sink %s: state writes failed: %s", self.sink_id, write_error)

    def skip_replayed(
        self, store: StateStore, batch_id: int, count_rows: Callable[[], int], now: datetime
    ) -> bool:
        """True (and recorded) when ``batch_id`` was already committed by this sink: skip it (SPEC S5).

        "Committed" means written to the events table (by this or an earlier driver) or, with asynchronous
        writes, planned by this sink object and handed to its writer: both count. Why asynchronous writes do not widen the replay window:
        docs/design/sink.md.
        """
        if not self._committed_loaded:
            table_last = store.last_committed(self.sink_id)
            if table_last is not None and (self._last_committed is None or table_last > self._last_committed):
                self._last_committed = table_last
            self._committed_loaded = True
        last = self._last_committed
        if last is None or batch_id > last:
            return False
        known = self._recent.get(batch_id)
        if known is None:
            commit = store.committed(self.sink_id, batch_id)
            known = None if commit is None else (commit.count, commit.time)
        if known is None:
            raise SinkIdConflictError(
                f"batch {batch_id} is below the last batch committed by sink_id {self.sink_id!r} ({last}) but was "
                f"never committed by it: {NEW_CHECKPOINT}"
            )
        count, committed_at = known
        rows = count_rows()
        if rows != count:
            raise SinkIdConflictError(
                f"batch {batch_id} was committed by sink_id {self.sink_id!r} with {count} rows, and now "
                f"arrives with {rows}: {NEW_CHECKPOINT}"
            )
        store.append_events(
            [
                Event(
                    now,
                    self.sink_id,
                    batch_id,
                    REPLAY_SKIPPED,
                    namespace=namespace_key(self.config.primary),
                    count=rows,
                    detail=f"already committed at {committed_at.isoformat()}",
                )
            ]
        )
        self.total.skipped_batches += 1
        log.warning(
            "sink %s batch %s: already committed at %s; skipped (replay)",
            self.sink_id,
            batch_id,
            committed_at.isoformat(),
        )
        return True

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config}

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        self.__init__(state["config"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"ServiceBusSink(sink_id={self.sink_id!r}, entity={self.config.entity!r})"


# ------------------------------------------------------------------------------------------ the counts, read back
# Why they are read back from the events table and not in the query progress: spark_sb.spark.totals.
def batch_counts(spark: SparkSession, config: ServiceBusConfig, sink_id: str | None = None) -> DataFrame:
    """Per micro-batch of each sink (or of ``sink_id``) in the events table of ``config``: ``sink_id``,
    ``batch_id``, ``time`` (when it committed), ``rows`` (read), ``sent`` (to the primary), ``diverted`` (to backlog
    queues), ``rejected``, in batch order. The counts the query progress cannot carry, for the
    ``foreachBatch`` sink and ``format("servicebus")`` alike (a batch write is batch 0 of ``<sink_id>/<job_id>``).
    Driver; DataFrame operations only, so Spark Connect too. With ``state_table_prefix`` and the data source, the
    catalog tables lag the spool by the relay's interval."""
    from pyspark.sql import functions as F

    events = state_table(spark, config, "events").where(F.col("batch_id").isNotNull())
    if sink_id is not None:
        events = events.where(F.col("sink_id") == sink_id)
    event = F.col("event")

    def total(when: Column) -> Column:
        return F.coalesce(F.sum(F.when(when, F.col("count"))), F.lit(0)).cast("long")

    return (
        events.groupBy("sink_id", "batch_id")
        .agg(
            F.max(F.when(event == BATCH_COMMITTED, F.col("time"))).alias("time"),
            total(event == BATCH_COMMITTED).alias("rows"),
            total(event == SENT).alias("sent"),
            # a diverted message has one event naming its backlog queue (and, in a batch for several entities, one
            # more per entity without a queue): counted once
            total((event == DIVERTED) & F.col("backlog_queue").isNotNull()).alias("diverted"),
            total(event == REJECTED).alias("rejected"),
        )
        .where(F.col("time").isNotNull())  # only batches that committed (a failed one records nothing)
        .orderBy("sink_id", "batch_id")
    )


def sink(config: ServiceBusConfig) -> ServiceBusSink:
    """Factory: ``df.writeStream.foreachBatch(spark_sb.spark.sink(config))``."""
    return ServiceBusSink(config)
