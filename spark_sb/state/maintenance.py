"""Keeping the state tables small (SPEC L5): table properties, retention of events and rejects
(``state_retention``), OPTIMIZE and VACUUM - :func:`maintain`, :func:`maintain_if_due` (``spark-sb maintain``,
the syphon job's schedule). Runs on the driver; DataFrame and SQL operations only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from spark_sb.state.delta import DeltaStateStore, StateTables
from spark_sb.state.records import (
    _EPOCH,
    BATCH_COMMITTED,
    MAINTAINED,
    TABLE_PROPERTIES,
    Event,
    _from_micros,
    _utc,
)

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession


log = logging.getLogger(__name__)

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------- table settings, maintenance
#: ``state_retention``'s default (seconds): events and rejects older than 30 days are deleted by :func:`maintain`.
DEFAULT_RETENTION = 30 * 86400.0
#: Per sink id, the ``batch_committed`` rows of its newest this-many batch ids are kept whatever their age:
#: replay skipping (``ServiceBusSink.skip_replayed``) reads the newest batch id a sink committed and the
#: ``batch_committed`` row of a batch id at or below it, and Spark replays only the batches after its last
#: checkpoint commit, so the newest few are all a sink ever asks for.
KEEP_COMMITTED_BATCHES = 100
#: The ``sink_id`` of the ``maintained`` event :func:`maintain` records (``count`` = rows deleted).
MAINTAIN_SINK_ID = "spark-sb/maintain"


@dataclass(frozen=True)
class TableMaintenance:
    """What :func:`maintain` did to one table: rows deleted by the retention, files and bytes before and after."""

    table: str
    deleted_rows: int
    files_before: int
    files_after: int
    bytes_before: int
    bytes_after: int
    seconds: float


@dataclass(frozen=True)
class MaintenanceReport:
    """What :func:`maintain` did: one :class:`TableMaintenance` per table, the retention cutoff (UTC)."""

    cutoff: datetime
    tables: tuple[TableMaintenance, ...]

    @property
    def deleted_rows(self) -> int:
        return sum(t.deleted_rows for t in self.tables)

    def to_json(self) -> dict[str, Any]:
        return {
            "cutoff": self.cutoff.isoformat(),
            "deleted_rows": self.deleted_rows,
            "tables": [t.__dict__ for t in self.tables],
        }


def sql_string(value: str) -> str:
    """``value`` as a Spark SQL string literal (pure): quotes and backslashes escaped."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _micros(dt: datetime) -> int:
    return (_utc(dt) - _EPOCH) // timedelta(microseconds=1)


def retention_predicate(
    newest: Sequence[tuple[str, int]], cutoff: datetime, keep: int = KEEP_COMMITTED_BATCHES
) -> str:
    """The events table's retention ``DELETE`` condition (pure): rows older than ``cutoff``, except the
    ``batch_committed`` rows of each sink's newest ``keep`` batch ids (``newest``: (sink id, its highest
    committed batch id)). Literals are rendered here: Delta's DELETE takes no SQL parameters."""
    condition = f"time < timestamp_micros({_micros(cutoff)})"
    kept = [
        f"(sink_id = {sql_string(sink_id)} AND batch_id > {int(batch_id) - keep})"
        for sink_id, batch_id in sorted(newest)
    ]
    if kept:
        condition += f" AND NOT (event = '{BATCH_COMMITTED}' AND ({' OR '.join(kept)}))"
    return condition


def _detail(spark: SparkSession, name: str) -> tuple[int, int]:
    row = spark.sql(f"DESCRIBE DETAIL {name}").collect()[0]
    return int(row["numFiles"] or 0), int(row["sizeInBytes"] or 0)


def _affected(rows: Sequence[Any]) -> int:
    """``num_affected_rows`` of a Delta DELETE's result (0 when the version does not report it)."""
    if rows and "num_affected_rows" in rows[0].asDict():
        return int(rows[0]["num_affected_rows"] or 0)
    return 0


def maintain(
    spark: SparkSession,
    tables: StateTables,
    *,
    retention: float = DEFAULT_RETENTION,
    optimize: bool = True,
    vacuum: bool = True,
    now: datetime | None = None,
    store: DeltaStateStore | None = None,
) -> MaintenanceReport:
    """Keep the state tables small (driver; SQL only, so it runs under Spark Connect; safe beside running sinks
    and the syphon: conflicts with their commits are retried).

    1. :data:`TABLE_PROPERTIES` on tables created before they existed (only where a value differs).
    2. Retention: events and rejects older than ``retention`` seconds are deleted, except the
       ``batch_committed`` rows replay skipping reads (:data:`KEEP_COMMITTED_BATCHES` per sink). The entities
       table (the failover state) and the ``sessions`` table (the held lines of ``ordering``; it exists once a
       sink with ordering on wrote it, and each write of a sink's lines replaces them: a commit and a small file
       each time its lines change) are never deleted from: they are compacted and vacuumed only.
    3. ``OPTIMIZE`` each table (small files into large ones).
    4. ``VACUUM`` each table (files removed more than ``delta.deletedFileRetentionDuration`` ago).
    5. A ``maintained`` event (count = rows deleted).

    ``now`` (UTC) is injected for tests. Returns what was done per table.
    """
    if retention <= 0:
        raise ValueError(f"state_retention must be > 0 seconds, found {retention!r}")
    store = store or DeltaStateStore(spark, tables)
    store.ensure()
    now = _utc(now or datetime.now(timezone.utc))
    cutoff = now - timedelta(seconds=retention)
    tables_here = ("events", "entities", "rejects", *(("sessions",) if store.sessions_exist() else ()))
    done = tuple(
        _maintain_table(store, table, cutoff, optimize=optimize, vacuum=vacuum) for table in tables_here
    )
    report = MaintenanceReport(cutoff, done)
    store.append_events(
        [
            Event(
                now,
                MAINTAIN_SINK_ID,
                None,
                MAINTAINED,
                count=report.deleted_rows,
                detail="; ".join(
                    f"{t.table}: {t.deleted_rows} rows deleted, files {t.files_before} -> {t.files_after}"
                    for t in done
                )
                + f"; retention {retention:g} s",
            )
        ]
    )
    log.info("state tables maintained: %s", report.to_json())
    return report


def _run_sql(store: DeltaStateStore, table: str, sql: str) -> list[Any]:
    """One statement on ``table``, retried on a conflict with another writer (a sink's commit)."""
    rows: list[Any] = store._retry(table, lambda: store.spark.sql(sql).collect())
    return rows


def _maintain_table(
    store: DeltaStateStore, table: str, cutoff: datetime, *, optimize: bool, vacuum: bool
) -> TableMaintenance:
    started = time.monotonic()
    spark = store.spark
    name = store.tables.sql_name(table)
    files_before, bytes_before = _detail(spark, name)
    _set_properties(store, table)
    deleted = 0
    if table == "events":
        newest = [
            (r["sink_id"], int(r["b"]))
            for r in spark.sql(
                f"SELECT sink_id, max(batch_id) AS b FROM {name} "
                f"WHERE event = '{BATCH_COMMITTED}' AND batch_id IS NOT NULL GROUP BY sink_id"
            ).collect()
            if r["sink_id"] is not None
        ]
        condition = retention_predicate(newest, cutoff)
        deleted = _affected(_run_sql(store, table, f"DELETE FROM {name} WHERE {condition}"))
    elif table == "rejects":
        condition = f"time < timestamp_micros({_micros(cutoff)})"
        deleted = _affected(_run_sql(store, table, f"DELETE FROM {name} WHERE {condition}"))
    # entities and sessions: never deleted from (the failover state, the held lines)
    if optimize:
        _run_sql(store, table, f"OPTIMIZE {name}")
    if vacuum:
        _run_sql(store, table, f"VACUUM {name}")
    files_after, bytes_after = _detail(spark, name)
    return TableMaintenance(
        table,
        deleted,
        files_before,
        files_after,
        bytes_before,
        bytes_after,
        round(time.monotonic() - started, 3),
    )


def _set_properties(store: DeltaStateStore, table: str) -> None:
    """Set :data:`TABLE_PROPERTIES` on ``table`` where a value differs (a metadata commit only then)."""
    name = store.tables.sql_name(table)
    current = {r["key"]: r["value"] for r in store.spark.sql(f"SHOW TBLPROPERTIES {name}").collect()}
    missing = {k: v for k, v in TABLE_PROPERTIES.items() if current.get(k) != v}
    if missing:
        props = ", ".join(f"'{k}' = '{v}'" for k, v in missing.items())
        _run_sql(store, table, f"ALTER TABLE {name} SET TBLPROPERTIES ({props})")


def last_maintained(spark: SparkSession, tables: StateTables) -> datetime | None:
    """When :func:`maintain` last ran on these tables (its newest ``maintained`` event), else None. Driver."""
    store = DeltaStateStore(spark, tables)
    store.ensure()
    row = spark.sql(
        f"SELECT unix_micros(max(time)) AS t FROM {tables.sql_name('events')} "
        f"WHERE event = '{MAINTAINED}' AND sink_id = {sql_string(MAINTAIN_SINK_ID)}"
    ).collect()
    return _from_micros(row[0]["t"]) if row else None


def _created_at(spark: SparkSession, tables: StateTables) -> datetime | None:
    detail = spark.sql(f"DESCRIBE DETAIL {tables.sql_name('events')}")
    return _from_micros(detail.selectExpr("unix_micros(createdAt) AS t").collect()[0]["t"])


#: When each set of tables (by :meth:`StateTables.sql_name` of events) was last maintained, as far as this
#: process knows (the first look reads the events table).
_maintained_at: dict[str, datetime] = {}
_maintain_lock = threading.Lock()


def maintain_if_due(
    spark: SparkSession, config: Any, *, now: datetime | None = None
) -> MaintenanceReport | None:
    """Run :func:`maintain` when ``state_maintain_every`` has passed since the last maintenance of the tables
    (driver; the syphon job calls it after each micro-batch). The first call in a process reads when that was
    (the newest ``maintained`` event, else the table's creation). A failed maintenance is logged and tried
    again after ``state_maintain_every``: it must not stop the job it runs in. None when nothing ran."""
    every = float(getattr(config, "state_maintain_every", 0) or 0)
    tables = StateTables.from_config(config)
    if every <= 0 or tables is None:
        return None
    now = _utc(now or datetime.now(timezone.utc))
    key = tables.sql_name("events")
    with _maintain_lock:
        last = _maintained_at.get(key)
        if last is None:
            last = last_maintained(spark, tables) or _created_at(spark, tables) or now
            _maintained_at[key] = last
        if (now - last).total_seconds() < every:
            return None
        _maintained_at[key] = now
        try:
            return maintain(spark, tables, retention=config.state_retention, now=now)
        except Exception as exc:  # the job goes on; the next try is one interval later
            log.error(
                "state tables: maintenance failed (%s: %s); next try in %g s", type(exc).__name__, exc, every
            )
            return None


def store_for(spark: SparkSession, config: Any) -> DeltaStateStore | None:
    """The Delta store named by the config (None when neither state key is set). Driver."""
    tables = StateTables.from_config(config)
    return None if tables is None else DeltaStateStore(spark, tables)
