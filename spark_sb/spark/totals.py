"""A sink's counts (driver): :class:`SinkTotals` over the batches a sink object processed, rejects counted per
reason (:func:`reasons`), and the totals read back from the state tables (:func:`table_totals`, what
``ServiceBusSink.summary(spark)`` prints; :func:`state_table` reads one). The library's own errors found in a failed
Spark job (:func:`task_failure`); a batch's rejects WARNING (:func:`warn_rejects`). Pure but for the reads, which use DataFrame operations only (Spark Connect too).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.counts import SentAndDiverted, merge_counts
from spark_sb.core.errors import ConfigError
from spark_sb.failover.outcome import SendOutcome
from spark_sb.state.delta import StateTables
from spark_sb.state.records import (
    BACKLOG_PULLED,
    BATCH_COMMITTED,
    DIVERTED,
    PROBE,
    REJECTED,
    REPLAY_SKIPPED,
    SENT,
    STATE_CHANGE,
)

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

#: The sink's logger: a batch's rejects WARNING is the sink's (what users configure is ``spark_sb.spark.sink``).
log = logging.getLogger("spark_sb.spark.sink")


@dataclass
class SinkTotals(SentAndDiverted):
    """Counts over every batch this sink object processed (driver; bounded: counts, never records)."""

    batches: int = 0
    skipped_batches: int = 0
    rows: int = 0
    sent: dict[str, int] = field(default_factory=dict)
    diverted: dict[str, int] = field(default_factory=dict)
    diverted_by_entity: dict[str, int] = field(default_factory=dict)
    rejected: int = 0
    #: Rejects per reason (bounded by the reasons the rows checks give: a few dozen at most).
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    transitions: int = 0
    probes: int = 0
    pulls: int = 0
    retries: int = 0

    @property
    def total_rejected(self) -> int:
        return self.rejected

    def add(self, outcome: SendOutcome, rows: int, by_reason: dict[str, int] | None = None) -> None:
        """Count one batch; ``by_reason``: its rejects per reason when the caller has them (:func:`reasons`)."""
        self.batches += 1
        self.rows += rows
        self.sent = merge_counts(self.sent, outcome.sent)
        self.diverted = merge_counts(self.diverted, outcome.diverted)
        self.diverted_by_entity = merge_counts(self.diverted_by_entity, outcome.diverted_by_entity)
        self.rejected += outcome.total_rejected
        self.rejected_by_reason = merge_counts(self.rejected_by_reason, by_reason or reasons(outcome))
        self.transitions += len(outcome.transitions)
        self.probes += len(outcome.probes)
        self.pulls += len(outcome.pulls)
        self.retries += outcome.retries

    def line(self, sink_id: str) -> str:
        """One line for the end of a job: ``sink orders: 3 batches, 1,000 rows: 990 sent, 5 diverted, 5 rejected
        (too large: 3, no entity: 2), 1 replayed batch skipped``."""
        parts = [
            f"{self.total_sent:,} sent",
            f"{self.total_diverted:,} diverted",
            f"{self.rejected:,} rejected",
        ]
        if self.rejected_by_reason:
            parts[-1] += " (" + ", ".join(f"{r}: {n:,}" for r, n in most_first(self.rejected_by_reason)) + ")"
        text = f"sink {sink_id}: {self.batches:,} batches, {self.rows:,} rows: " + ", ".join(parts)
        if self.skipped_batches:
            text += f", {self.skipped_batches:,} replayed batches skipped"
        return text


def reason_key(reason: str) -> str:
    """The name a reject's reason is counted under: its first clause (``message too large: ...`` -> ``message too
    large``), so that the counts stay few whatever the rows held. Pure."""
    return reason.split(":")[0].strip()[:80] or "rejected"


def reasons(outcome: SendOutcome) -> dict[str, int]:
    """Rejects per reason (:func:`reason_key`)."""
    out: dict[str, int] = {}
    for r in outcome.rejects:
        key = reason_key(r.reason)
        out[key] = out.get(key, 0) + 1
    return out


def most_first(counts: dict[str, int]) -> list[tuple[str, int]]:
    """Counts in the order they are told: the largest first, then by name."""
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


#: The row indexes named in a batch's rejects WARNING (the rest are in the rejects table).
SHOWN_REJECTS = 5


def warn_rejects(
    sink_id: str, batch_id: int, outcome: SendOutcome, rows: int, by_reason: dict[str, int] | None = None
) -> None:
    """One WARNING per batch with rejects (issue 32: never silent): the count per reason and the first row indexes;
    the rows themselves are in the rejects table (``on_reject: fail`` fails the batch instead). ``by_reason``: the
    rejects per reason when the caller has them (:func:`reasons`)."""
    if not outcome.rejects:
        return
    counts = ", ".join(f"{r}: {n}" for r, n in most_first(by_reason or reasons(outcome)))
    shown = [str(r.row_index) for r in outcome.rejects[:SHOWN_REJECTS] if r.row_index is not None]
    log.warning(
        "sink %s batch %s: %d of %d rows rejected (%s)%s; the rows are in the rejects table",
        sink_id,
        batch_id,
        outcome.total_rejected,
        rows,
        counts,
        f"; first row indexes in their partitions: {', '.join(shown)}" if shown else "",
    )


class SinkTaskError(RuntimeError):
    """A batch's task failed with one of the library's own errors, which names what to change; raised on the driver
    with that error's line as its message (Spark's trace, where the executor's error sits at the end of a few
    kilobytes of JVM frames, is its ``__cause__``). ``kind`` is the executor error's class name."""

    def __init__(self, kind: str, line: str) -> None:
        super().__init__(f"{kind}: {line}")
        self.kind = kind
        self.line = line


#: The library's errors that a task may end with; each names what to change in its one-line message.
TASK_ERRORS = (
    "ServiceBusConfigError",
    "NoBacklogAvailableError",
    "ServerBusyError",
    "MessageRejectedError",
    "SendError",
    "RejectedRowsError",
    "ConfigError",
)
_TASK_ERROR_LINE = re.compile(r"(?:spark_sb(?:\.\w+)*\.)?(" + "|".join(TASK_ERRORS) + r"): (.+)")


def task_failure(exc: BaseException) -> SinkTaskError | None:
    """The library's own error inside a failed Spark job's error (a ``PythonException`` carrying an executor's
    traceback, under classic Spark or Spark Connect), or None when the failure is not one of ours. The last such
    line wins (the task's final error). Driver; pure."""
    found: SinkTaskError | None = None
    for raw in str(exc).splitlines():
        m = _TASK_ERROR_LINE.search(raw.strip())
        if m:
            found = SinkTaskError(m.group(1), m.group(2).strip())
    return found


# ------------------------------------------------------------------------------------------ read back
# Where a sink's counts are seen (issue 32): the WARNING of a batch with rejects, ServiceBusSink.summary(), and the
# events table, read back below. Not in Structured Streaming's query progress, on any pyspark this package admits
# (4.0.5 - 4.2.0): Spark fills a progress's ``sink.metrics`` only from a sink that implements Java's
# ``ReportsSinkMetrics`` (``ProgressContext.extractSinkProgress``), which neither ``ForeachBatchSink`` nor the
# Python data source's ``PythonTable`` does, and the Python data source API has no metrics hook (its writers'
# commit messages reach ``commit`` only; ``PythonWrite.supportedCustomMetrics`` is the fixed set of Python-runner
# metrics, shown in the SQL tab). ``observedMetrics`` come from the micro-batch's own plan only: an ``observe``
# inside the ``foreachBatch`` function (after the sends) is never reported, and an ``observe`` on the input counts
# rows before anything is sent - which the progress already has as ``numInputRows``.
# tests/spark/test_sink_counts.py shows both and fails if a Spark version starts carrying them.


def state_table(spark: SparkSession, config: ServiceBusConfig, table: str) -> DataFrame:
    """The state table ``table`` of ``config`` as a DataFrame (driver); :class:`ConfigError` without tables."""
    tables = StateTables.from_config(config)
    if tables is None:
        raise ConfigError(
            "state_location: the sink's counts are read from its events table: give state_location or "
            "state_table_prefix"
        )
    path = tables.path(table)
    return (
        spark.read.format("delta").load(path)
        if path is not None
        else spark.read.table(tables.sql_name(table))
    )


def table_totals(spark: SparkSession, config: ServiceBusConfig, sink_id: str) -> SinkTotals:
    """The totals of every batch ``sink_id`` recorded in the state tables of ``config`` (all runs), as the sink's
    :class:`SinkTotals` counts them: :meth:`ServiceBusSink.summary` with a session. Driver; two small aggregating
    queries (events, rejects), DataFrame operations only."""
    from pyspark.sql import functions as F

    events = state_table(spark, config, "events").where(F.col("sink_id") == sink_id)
    grouped = (
        events.groupBy("event", "entity", "backlog_queue")
        .agg(F.coalesce(F.sum("count"), F.lit(0)).alias("n"), F.count(F.lit(1)).alias("events"))
        .collect()
    )
    totals = SinkTotals()
    for r in grouped:
        kind, entity, queue, n, seen = (
            r["event"],
            r["entity"],
            r["backlog_queue"],
            int(r["n"]),
            int(r["events"]),
        )
        if kind == BATCH_COMMITTED:
            totals.batches += seen
            totals.rows += n
        elif kind == SENT and entity is not None:
            totals.sent = merge_counts(totals.sent, {entity: n})
        elif kind == DIVERTED:
            if queue is not None:
                totals.diverted = merge_counts(totals.diverted, {queue: n})
            if entity is not None:
                totals.diverted_by_entity = merge_counts(totals.diverted_by_entity, {entity: n})
        elif kind == REJECTED:
            totals.rejected += n
        elif kind == REPLAY_SKIPPED:
            totals.skipped_batches += seen
        elif kind == STATE_CHANGE:
            totals.transitions += seen
        elif kind == PROBE:
            totals.probes += seen
        elif kind == BACKLOG_PULLED:
            totals.pulls += seen
    if totals.rejected:
        by_reason = (
            state_table(spark, config, "rejects")
            .where(F.col("sink_id") == sink_id)
            .groupBy("reason")
            .count()
            .collect()
        )
        for r in by_reason:
            totals.rejected_by_reason = merge_counts(
                totals.rejected_by_reason, {reason_key(r["reason"]): r["count"]}
            )
    return totals
