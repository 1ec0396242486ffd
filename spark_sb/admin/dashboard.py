"""Data preparation of the failover dashboard (``notebooks/failover_dashboard.py``): DataFrames of the Delta state
tables shaped for charts. Driver side; DataFrame operations only (runs under Spark Connect); pyspark is imported
inside the functions.

* :func:`entity_timeline`: every state change per entity, with a numeric level for a step chart
  (healthy 0, failing 1, failed over 2).
* :func:`sent_vs_diverted`: per sink and micro-batch, messages sent to the primary vs diverted to the backlog.
* :func:`backlog_depth`: the backlog's depth over time as the events tell it (diverted in; moved, expired and
  dead-lettered by the syphon out), per time bucket, cumulative.
* :func:`rejects_by_reason`: rejected rows per reason.
* :func:`sessions_draining` (``ordering``, SPEC O4): per time bucket, the sessions a sink held behind their backlog
  (diverted), those returned to the primary, and how many were draining at the end of the bucket.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_sb.state.delta import StateTables
from spark_sb.state.records import (
    DEAD_LETTERED,
    DIVERTED,
    EXPIRED,
    MOVED,
    SENT,
    SESSION_HELD,
    SESSION_RETURNED,
    STATE_CHANGE,
)

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import Column, DataFrame, SparkSession

#: Chart levels of the entity states.
STATE_LEVELS = {"healthy": 0, "failing": 1, "failed_over": 2}


def read_tables(spark: SparkSession, tables: StateTables) -> dict[str, DataFrame]:
    """The three state tables as DataFrames (``events``, ``entities``, ``rejects``)."""
    out: dict[str, DataFrame] = {}
    for name in ("events", "entities", "rejects"):
        path = tables.path(name)
        out[name] = (
            spark.read.format("delta").load(path) if path is not None else spark.table(tables.sql_name(name))
        )
    return out


def entity_timeline(events: DataFrame) -> DataFrame:
    """(time, namespace, entity, from_state, to_state, level, error_class), oldest first."""
    from pyspark.sql import functions as F

    level = F.create_map(*[x for k, v in STATE_LEVELS.items() for x in (F.lit(k), F.lit(v))])
    return (
        events.where(F.col("event") == STATE_CHANGE)
        .select(
            "time",
            "namespace",
            "entity",
            "from_state",
            "to_state",
            level[F.col("to_state")].alias("level"),
            "error_class",
        )
        .orderBy("time", "entity")
    )


def sent_vs_diverted(events: DataFrame) -> DataFrame:
    """(sink_id, batch_id, time, sent, diverted) per micro-batch of each sink, in batch order; a diverted message
    counted once (:func:`_diverted_once`)."""
    from pyspark.sql import functions as F

    event = F.col("event")
    return (
        events.where(event.isin(SENT, DIVERTED) & F.col("batch_id").isNotNull())
        .groupBy("sink_id", "batch_id")
        .agg(
            F.min("time").alias("time"),
            _count_where(event == SENT).alias(SENT),
            _count_where(_diverted_once()).alias(DIVERTED),
        )
        .orderBy("sink_id", "batch_id")
    )


def _diverted_once() -> Column:
    """The ``diverted`` events that count each diverted message once: those naming its backlog queue. A batch that
    diverts for several entities also writes one event per entity without a queue (``state.planning``)."""
    from pyspark.sql import functions as F

    return (F.col("event") == DIVERTED) & F.col("backlog_queue").isNotNull()


def _count_where(when: Column) -> Column:
    """The sum of ``count`` over the events matching ``when`` (0 if none)."""
    from pyspark.sql import functions as F

    return F.sum(F.when(when, F.col("count")).otherwise(0))


def _flow(
    events: DataFrame, bucket: str, into: Column, out_of: Column, names: tuple[str, str, str]
) -> DataFrame:
    """(time, <in>, <out>, <level>) per time bucket: the ``count`` of the events matching ``into`` and ``out_of``,
    and the running level (in minus out, from the first bucket), oldest first."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    came, went, level = names
    per_bucket = (
        events.where(into | out_of)
        .groupBy(F.window("time", bucket).start.alias("time"))
        .agg(
            _count_where(into).alias(came),
            _count_where(out_of).alias(went),
        )
    )
    running = Window.orderBy("time").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    return per_bucket.withColumn(level, F.sum(F.col(came) - F.col(went)).over(running)).orderBy("time")


def backlog_depth(events: DataFrame, bucket: str = "1 minute") -> DataFrame:
    """(time, diverted, drained, depth): per time bucket, messages into the backlog (diverted; counted once per
    message, from the events that name a backlog queue) and out of it (moved, expired, dead-lettered by the
    syphon), and the cumulative depth. An estimate from the events; ``spark-sb status`` reads the real counts."""
    from pyspark.sql import functions as F

    out_of = F.col("event").isin(MOVED, EXPIRED, DEAD_LETTERED)
    return _flow(events, bucket, _diverted_once(), out_of, ("diverted", "drained", "depth"))


def rejects_by_reason(rejects: DataFrame) -> DataFrame:
    """(reason, rejected) with the most frequent first."""
    from pyspark.sql import functions as F

    return (
        rejects.groupBy("reason")
        .agg(F.count(F.lit(1)).alias("rejected"))
        .orderBy(F.desc("rejected"), "reason")
    )


def sessions_draining(events: DataFrame, bucket: str = "1 minute") -> DataFrame:
    """(time, held, returned, draining) per time bucket with ``ordering`` (SPEC O4): sessions (or entities, with
    ``ordering: entity``) a sink held behind their backlog (``session_held``: the first diversion of a line),
    returned to the primary after the syphon passed their markers (``session_returned``), and the lines still
    draining at the bucket's end, summed over the sinks (``spark-sb status`` lists them one by one). Empty without
    ordering."""
    from pyspark.sql import functions as F

    held, returned = F.col("event") == SESSION_HELD, F.col("event") == SESSION_RETURNED
    return _flow(events, bucket, held, returned, ("held", "returned", "draining"))


def prepare(spark: SparkSession, tables: StateTables, bucket: str = "1 minute") -> dict[str, DataFrame]:
    """Every chart's DataFrame: ``timeline``, ``sent_vs_diverted``, ``backlog_depth``, ``rejects_by_reason``,
    ``sessions``."""
    t = read_tables(spark, tables)
    return {
        "timeline": entity_timeline(t["events"]),
        "sent_vs_diverted": sent_vs_diverted(t["events"]),
        "backlog_depth": backlog_depth(t["events"], bucket),
        "rejects_by_reason": rejects_by_reason(t["rejects"]),
        "sessions": sessions_draining(t["events"], bucket),
    }
