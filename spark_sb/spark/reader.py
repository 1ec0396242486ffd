"""``spark.readStream.format("servicebus")`` and ``spark.read.format("servicebus")``: the Spark adapter of the source
(SPEC S12; SOURCE.md R10-R31). Thin: the protocol is :mod:`spark_sb.source`.

* The stream reader maps Spark's calls onto one :class:`~spark_sb.source.planner.SourcePlanner` (driver: the
  planner process, one per query run) and each task's ``read`` onto
  :func:`~spark_sb.source.reader.read_partition` through the executor process's cached peeker; rows go to Spark
  as Arrow record batches (:mod:`~spark_sb.spark.arrow_rows`).
* Admission control (pyspark 4.2): ``getDefaultReadLimit`` is ``ReadMaxRows(maxMessagesPerTrigger)``; bytes,
  minimum and delay come from the options. On 4.0/4.1 Spark calls ``latestOffset()`` without arguments: the source's
  own caps apply, and ``Trigger.AvailableNow`` runs one batch (Spark warns).
* The batch read is a browse by peek over sequence ranges: it never settles.
* With ``state_location``: a ``source_batch`` event per batch (deltalake, from the planner process); always one
  INFO line per batch.

Where it runs: readers are built on the driver machine from the options (checked there, :func:`~spark_sb.source.
options.parse_source_options`), pickled to the planner process and to executors (the options only; the planner and
links are built where they are used).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any

from spark_sb.core.clock import SystemClock
from spark_sb.core.errors import ConfigError
from spark_sb.core.lazy import lazy_module_getattr
from spark_sb.source.batch import BatchStats, PlannerLimits
from spark_sb.source.manifest import PartitionSpec, channel_of
from spark_sb.source.options import SourceReadOptions, option_error
from spark_sb.source.planner import SourcePlanner
from spark_sb.source.reader import highest, read_partition
from spark_sb.source.rows import row_of, schema, schema_ddl
from spark_sb.source.sdk import PeekerFactory, SdkEntityLink
from spark_sb.spark.arrow_rows import arrow_schema, record_batches

log = logging.getLogger(__name__)

#: A batch read's partitions: at most this many sequence numbers each.
BROWSE_SPAN = 5_000


def limits_of(opts: SourceReadOptions) -> PlannerLimits:
    """The planner's limits from the checked options (pure)."""
    return PlannerLimits(
        max_messages=opts.max_messages_per_trigger,
        max_bytes=opts.max_bytes_per_trigger,
        min_messages=opts.min_messages_per_trigger or 0,
        max_trigger_delay=opts.max_trigger_delay,
        max_receive_time=opts.max_receive_time,
        receive_wait=opts.receive_wait_time,
        min_partitions=opts.min_partitions,
        max_per_partition=opts.max_messages_per_partition,
        max_offset_ranges=opts.max_offset_ranges,
        fail_on_data_loss=opts.fail_on_data_loss,
        recover_deferred=opts.recover_deferred,
        defer_after=opts.defer_after,
    )


def stream_path(opts: SourceReadOptions) -> str:
    """The one entity a stream reads: several fail naming ``entity`` (one query per entity, SOURCE.md R11)."""
    if len(opts.entities) != 1:
        raise option_error(
            [
                (
                    "entity",
                    f"a stream reads one entity, found {len(opts.entities)} ({', '.join(opts.entities)}): "
                    "start one query per entity",
                )
            ]
        )
    return opts.paths[0]


def source_id(opts: SourceReadOptions) -> str:
    """What the source's events are recorded under: ``sourceId``, else ``source/<entity path>``."""
    return opts.source_id or f"source/{stream_path(opts)}"


class BatchRecorder:
    """The planner's ``on_batch``: one INFO line per batch and, with ``state_location``, a ``source_batch`` event
    (deltalake; planner process). A failed write is logged, never raised: metrics never stop the query."""

    def __init__(self, opts: SourceReadOptions) -> None:
        self.opts = opts
        self.path = stream_path(opts)
        self.location = opts.config.state_location
        self._store: Any = None

    def __call__(self, stats: BatchStats) -> None:
        log.info(
            "source %s batch %d: %d received (%d bytes, %d read ahead), %d deferred, %d settled, %d owed, max "
            "delivery count %d, receive %.2f s, defer %.2f s, settle %.2f s",
            self.path,
            stats.b,
            stats.received,
            stats.bytes,
            stats.read_ahead,
            stats.deferred,
            stats.settled,
            stats.owed,
            stats.max_delivery_count,
            stats.receive_seconds,
            stats.defer_seconds,
            stats.settle_seconds,
        )
        if not self.location:
            return
        try:
            from spark_sb.state.records import Event

            if self._store is None:
                from spark_sb.state.deltars import DeltaRsStateStore

                self._store = DeltaRsStateStore(self.location)
                self._store.ensure()
            self._store.append_events(
                [
                    Event(
                        time=datetime.now(timezone.utc),
                        sink_id=source_id(self.opts),
                        batch_id=stats.b,
                        event="source_batch",
                        namespace=namespace_of(self.opts),
                        entity=self.path,
                        count=stats.received,
                        detail=json.dumps(asdict(stats), sort_keys=True),
                    )
                ]
            )
        except Exception:  # noqa: BLE001 - metrics never stop the query
            log.warning(
                "source %s: the source_batch event of batch %d was not recorded",
                self.path,
                stats.b,
                exc_info=True,
            )


def new_planner(opts: SourceReadOptions) -> SourcePlanner:
    """The planner of a stream (planner process): the SDK link on the primary, the system clock, the lock keeper
    thread (it also defers a batch that outlives ``deferAfter``), the read-ahead thread (the next batch received
    while one is read) and the batch recorder."""
    path = stream_path(opts)
    clock = SystemClock()

    def link() -> SdkEntityLink:
        return SdkEntityLink(opts.config, path, prefetch=opts.prefetch_count, monotonic=clock.monotonic)

    return SourcePlanner(
        path,
        link,
        clock,
        limits_of(opts),
        on_batch=BatchRecorder(opts),
        keeper_thread=True,
        defer_thread=True,
        read_ahead=opts.read_ahead,
    )


def namespace_of(opts: SourceReadOptions) -> str:
    """The rows' ``namespace``: the primary's name, else its endpoint host (a local namespace's address)."""
    try:
        return opts.config.primary_namespace_name()
    except ConfigError:
        return opts.config.primary.endpoint_host()


def read_rows(opts: SourceReadOptions, spec: PartitionSpec, namespace: str) -> Iterator[tuple[Any, ...]]:
    """One partition's rows (executors): its messages peeked through the process's cached peeker, as rows (the
    ``state`` column, the batch read's, is null: Spark asks one schema of a source for both reads)."""
    peeker = PeekerFactory(opts.config)()
    for peeked in read_partition(spec, peeker, fail_on_data_loss=opts.fail_on_data_loss):
        yield (*row_of(peeked.message, namespace, spec.entity, opts.body_format), None)  # state: browse only


def browse_specs(opts: SourceReadOptions, highest: int) -> list[PartitionSpec]:
    """The batch read's partitions: ``startingSequenceNumber`` (0) to ``endingSequenceNumber`` (else ``highest``)
    in spans of :data:`BROWSE_SPAN`, per entity (pure)."""
    lo = opts.starting_sequence_number or 0
    hi = highest if opts.ending_sequence_number is None else min(highest, opts.ending_sequence_number)
    specs = []
    for path in opts.paths:
        for first in range(lo, hi + 1, BROWSE_SPAN):
            specs.append(PartitionSpec(channel_of(path), ((first, min(hi, first + BROWSE_SPAN - 1)),)))
    return specs


_LAZY = ("ServiceBusStreamReader", "ServiceBusBatchReader")


def _build() -> dict[str, Any]:
    """The classes that subclass pyspark's reader API (imports pyspark; any process)."""
    from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

    bases: tuple[type, ...] = (DataSourceStreamReader,)
    read_all: Any = None  # pyspark 4.2's ReadAllAvailable and ReadMaxRows (None before)
    read_max: Any = None
    try:  # pyspark 4.2: Trigger.AvailableNow and admission control
        from pyspark.sql.streaming import datasource as streaming_api

        read_all, read_max = streaming_api.ReadAllAvailable, streaming_api.ReadMaxRows
        bases = (DataSourceStreamReader, streaming_api.SupportsTriggerAvailableNow)
    except (
        ImportError,
        AttributeError,
    ):  # pragma: no cover - 4.0/4.1: the source's own caps; AvailableNow: one batch
        pass

    class ServiceBusStreamReader(*bases):  # type: ignore[misc]
        """The micro-batch reader (planner process; ``read`` on executors). Picklable: the options only."""

        def __init__(self, opts: SourceReadOptions) -> None:
            self.opts = opts
            self.namespace = namespace_of(opts)
            self._planner: SourcePlanner | None = None

        def __getstate__(self) -> dict[str, Any]:
            return {"opts": self.opts, "namespace": self.namespace, "_planner": None}

        @property
        def planner(self) -> SourcePlanner:
            if self._planner is None:
                self._planner = new_planner(self.opts)
            return self._planner

        def initialOffset(self) -> dict[str, Any]:  # noqa: N802 - the DataSource API's names
            return self.planner.initial_offset()

        def getDefaultReadLimit(self) -> Any:  # noqa: N802
            return read_max(self.opts.max_messages_per_trigger)

        def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:  # noqa: N802
            max_rows = getattr(limit, "max_rows", None)
            if read_all is not None and isinstance(limit, read_all):
                max_rows = None  # the trigger asks for all: bounded by maxReceiveTime
            elif max_rows is None:
                max_rows = self.opts.max_messages_per_trigger
            return self.planner.latest_offset(start, max_rows)

        def reportLatestOffset(self) -> dict[str, Any] | None:  # noqa: N802
            return self.planner.report_latest()

        def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
            self.planner.prepare_available_now()

        def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[Any]:
            return [InputPartition(s) for s in self.planner.partitions(start, end)]

        def read(self, partition: Any) -> Iterator[Any]:
            yield from record_batches(
                read_rows(self.opts, partition.value, self.namespace), _arrow(self.opts)
            )

        def commit(self, end: dict[str, Any]) -> None:
            self.planner.commit(end)

        def stop(self) -> None:
            if self._planner is not None:
                self._planner.stop()

    class ServiceBusBatchReader(DataSourceReader):  # type: ignore[misc]
        """The batch read: a browse by peek (``partitions`` on the driver machine, ``read`` on executors). It never
        settles. Picklable: the options only."""

        def __init__(self, opts: SourceReadOptions) -> None:
            self.opts = opts
            self.namespace = namespace_of(opts)

        def partitions(self) -> Sequence[Any]:
            if self.opts.ending_sequence_number is not None:
                highest = self.opts.ending_sequence_number
            else:
                highest = max((_highest(self.opts, p) for p in self.opts.paths), default=-1)
            return [InputPartition(s) for s in browse_specs(self.opts, highest)]

        def read(self, partition: Any) -> Iterator[Any]:
            yield from record_batches(self._rows(partition), _arrow(self.opts))

        def _rows(self, partition: Any) -> Iterator[tuple[Any, ...]]:
            namespace = self.namespace
            peeker = PeekerFactory(self.opts.config)()
            spec = partition.value
            if not isinstance(spec, PartitionSpec):  # no partitions: Spark reads one empty one
                return
            for lo, hi in spec.ranges:
                cur = lo
                while cur <= hi:
                    got = [
                        p for p in peeker.peek(spec.entity, cur, min(250, hi - cur + 1), 10.0) if p.seq >= cur
                    ]
                    for p in got:
                        if p.seq > hi:
                            break
                        yield row_of(p.message, namespace, spec.entity, self.opts.body_format, batch=True)
                    if not got or got[-1].seq >= hi:
                        break
                    cur = got[-1].seq + 1

    built = {
        "ServiceBusStreamReader": ServiceBusStreamReader,
        "ServiceBusBatchReader": ServiceBusBatchReader,
    }
    for name, obj in built.items():
        obj.__module__ = __name__
        obj.__qualname__ = name
    return built


def _arrow(opts: SourceReadOptions) -> Any:
    """The rows' Arrow schema (executors; one per process and body format)."""
    return arrow_schema(tuple(schema(opts.body_format, batch=True)))


def _highest(opts: SourceReadOptions, path: str) -> int:
    """The highest sequence number present on ``path`` (driver machine; -1: empty): a galloping peek."""
    peeker = PeekerFactory(opts.config)()
    return highest(lambda seq, n: peeker.peek(path, seq, n, 10.0), opts.starting_sequence_number or 0)


__getattr__ = lazy_module_getattr(globals(), _LAZY, _build)


def reader_schema(opts: SourceReadOptions) -> str:
    """The fixed row schema as DDL (driver machine). One for both reads (Spark asks a source's schema before
    it knows which): it holds the batch read's ``state``, null in a stream."""
    return schema_ddl(opts.body_format, batch=True)
