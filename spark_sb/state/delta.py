"""The Delta Lake state store (:class:`DeltaStateStore`): path tables under ``state_location`` or Unity Catalog
tables, DataFrame and SQL operations only (Spark Connect); idempotent per (sink id, batch id); conflicts with
other writers retried. Runs on the driver (``batch_df.sparkSession``).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from spark_sb.state.records import (
    _EPOCH,
    ACKNOWLEDGED,
    BATCH_COMMITTED,
    COLUMNS,
    ENTITIES_DDL,
    EVENT_COLUMNS,
    EVENTS_DDL,
    REJECT_COLUMNS,
    REJECTS_DDL,
    SESSIONS_DDL,
    TABLE_PROPERTIES,
    EntityRecord,
    Event,
    RejectRecord,
    _from_micros,
    entity_from_row,
    event_from_row,
    reject_from_row,
)
from spark_sb.state.sessions import HeldLine, lines_from_rows, namespace_spellings, session_rows
from spark_sb.state.store import DeltaTableStore

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession


log = logging.getLogger(__name__)


def _at(us: int | None) -> datetime:
    """A timestamp column read as ``unix_micros``: a UTC datetime (the epoch for none)."""
    return _from_micros(us) or _EPOCH


def _local(path: str | None) -> str | None:
    """The file-system path of a local table path (plain or ``file:``); None for a catalog table (no path) or a
    remote one."""
    if path is None or ("://" in path and not path.startswith("file:")):
        return None
    return "/" + path[len("file:") :].lstrip("/") if path.startswith("file:") else path


def _local_table_exists(path: str | None) -> bool:
    """A Delta table at a local ``path`` (its ``_delta_log`` holds a commit): no I/O beyond the file system."""
    local = _local(path)
    if local is None:
        return False
    log_dir = os.path.join(local, "_delta_log")
    try:
        return any(name.endswith(".json") for name in os.listdir(log_dir))
    except OSError:
        return False


def transaction_version(path: str | None, app_id: str) -> int | None:
    """The Delta transaction version ``app_id`` last committed to the table at ``path``, read from its log with
    ``deltalake`` (delta-rs) on the driver: one read of the last checkpoint and the commits after it. None when
    it cannot tell - no path (a catalog table), a remote path (delta-rs takes object-store credentials from the
    environment only), no ``deltalake`` installed, a log it cannot read, or no transaction for ``app_id`` - and the
    caller reads the table instead."""
    local = _local(path)
    if local is None:
        return None
    try:
        from deltalake import DeltaTable
    except ImportError:
        return None
    try:
        version = DeltaTable(local).transaction_version(app_id)
    except Exception as exc:  # noqa: BLE001 - the scan answers instead
        log.debug("reading the transaction version of %s failed: %s", path, type(exc).__name__)
        return None
    return None if version is None else int(version)


# ------------------------------------------------------------------------------------------ Delta store
@dataclass(frozen=True)
class StateTables:
    """Where the three tables live: Delta paths under ``location``, or catalog tables ``<prefix>events`` ..."""

    location: str | None = None
    prefix: str | None = None

    def __post_init__(self) -> None:
        if (self.location is None) == (self.prefix is None):
            raise ValueError("give exactly one of location (state_location) or prefix (state_table_prefix)")

    @classmethod
    def from_config(cls, config: Any) -> StateTables | None:
        """The tables named by ``state_location`` / ``state_table_prefix``, or None when neither is set."""
        if getattr(config, "state_table_prefix", None):
            return cls(prefix=config.state_table_prefix)
        if config.state_location:
            return cls(location=config.state_location)
        return None

    def path(self, table: str) -> str | None:
        return None if self.location is None else f"{self.location.rstrip('/')}/{table}"

    def sql_name(self, table: str) -> str:
        """The table's name in SQL: ``delta.`<path>``` or ``<prefix><table>``."""
        path = self.path(table)
        if path is not None:
            return "delta.`" + path.replace("`", "``") + "`"
        return f"{self.prefix}{table}"


#: Each table's columns as ``CREATE TABLE`` and ``createDataFrame`` take them.
_DDL = {"events": EVENTS_DDL, "entities": ENTITIES_DDL, "rejects": REJECTS_DDL}

CONFLICT_MARKERS = (
    "Concurrent",
    "DELTA_CONCURRENT",
    "ProtocolChanged",
    "MetadataChanged",
    "DELTA_METADATA_CHANGED",
    "DELTA_PROTOCOL_CHANGED",
    "TABLE_OR_VIEW_ALREADY_EXISTS",
    "already exists",
)

# Seen only while another writer is creating the same table (its folder exists, its first commit does not yet):
# a conflict for CREATE TABLE IF NOT EXISTS, an error anywhere else.
CREATE_RACE_MARKERS = ("DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION",)


def is_conflict(exc: BaseException, *, creating: bool = False) -> bool:
    """True for a Delta write conflict with another writer (retry it). ``creating``: the statement creates the
    table, where another writer's half-made table is a conflict too. Pure."""
    text = f"{type(exc).__name__} {exc}"
    markers = CONFLICT_MARKERS + CREATE_RACE_MARKERS if creating else CONFLICT_MARKERS
    return any(m in text for m in markers)


class DeltaStateStore(DeltaTableStore):
    """The :class:`StateStore` on Delta tables (driver; DataFrame and SQL operations only, so it runs under
    Spark Connect). ``spark`` is the session of the batch (``batch_df.sparkSession``)."""

    def __init__(
        self,
        spark: SparkSession,
        tables: StateTables,
        *,
        attempts: int = 8,
        backoff: float = 0.2,
        sleep: Any = time.sleep,
    ) -> None:
        self.spark = spark
        self.tables = tables
        self.attempts = attempts
        self.backoff = backoff
        self._sleep = sleep
        self._ensured = False
        self._sessions_ensured = False

    # -- plumbing
    def _is_conflict(self, exc: BaseException, creating: bool) -> bool:
        return is_conflict(exc, creating=creating)

    def _read(self, table: str) -> DataFrame:
        path = self.tables.path(table)
        if path is not None:
            return self.spark.read.format("delta").load(path)
        return self.spark.table(self.tables.sql_name(table))

    def _append(self, table: str, df: DataFrame, app_id: str | None, version: int | None) -> None:
        # one file per commit (a small local DataFrame is split over the default parallelism otherwise)
        writer = df.coalesce(1).write.format("delta").mode("append")
        if app_id is not None and version is not None:
            writer = writer.option("txnAppId", app_id).option("txnVersion", version)
        path = self.tables.path(table)
        if path is not None:
            self._retry(table, lambda: writer.save(path))
        else:
            self._retry(table, lambda: writer.saveAsTable(self.tables.sql_name(table)))

    def ensure(self) -> None:
        """Create the tables where they do not exist, with :data:`TABLE_PROPERTIES` (older tables get them at
        the next :func:`maintain`)."""
        if self._ensured:
            return
        props = ", ".join(f"'{k}' = '{v}'" for k, v in TABLE_PROPERTIES.items())
        for table, ddl in _DDL.items():
            if _local_table_exists(self.tables.path(table)):
                continue  # what IF NOT EXISTS would find, without Spark resolving a long log (a restart's cost)
            sql = (
                f"CREATE TABLE IF NOT EXISTS {self.tables.sql_name(table)} ({ddl}) USING DELTA "
                f"TBLPROPERTIES ({props})"
            )

            def create(sql: str = sql) -> Any:
                return self.spark.sql(sql).collect()

            self._retry(table, create, creating=True)
        self._ensured = True

    # -- reads
    def read_entities(self) -> list[EntityRecord]:
        self.ensure()
        rows = (
            self._read("entities")
            .selectExpr(
                "namespace",
                "entity",
                "state",
                "unix_micros(since) AS since",
                "last_error_class",
                "backlog_namespace",
                "transform(pulled_backlog_queues, p -> named_struct('queue', p.queue, "
                "'until', unix_micros(p.until), 'error_class', p.error_class)) AS pulled_backlog_queues",
                "unix_micros(updated_at) AS updated_at",
                "updated_by",
            )
            .collect()
        )
        return [entity_from_row(r, _at) for r in rows]

    def entities_version(self) -> int | None:
        self.ensure()
        rows = self.spark.sql(f"DESCRIBE HISTORY {self.tables.sql_name('entities')} LIMIT 1").collect()
        return int(rows[0]["version"]) if rows else None

    def _events_df(self, sink_id: str | None) -> DataFrame:
        from pyspark.sql import functions as F

        df = self._read("events")
        return df if sink_id is None else df.where(F.col("sink_id") == sink_id)

    def last_committed(self, sink_id: str) -> int | None:
        """The highest batch id ``sink_id`` committed: for a path table, the events table's Delta transaction
        version for the sink id, read from its log (every append sets ``txnAppId`` = sink id and ``txnVersion`` =
        its highest batch id; one read of the log, whatever the table holds); else - a catalog table, no
        ``deltalake``, a log it cannot read - a scan of the sink's ``batch_committed`` rows."""
        from pyspark.sql import functions as F

        self.ensure()
        version = transaction_version(self.tables.path("events"), sink_id)
        if version is not None:
            return version
        row = (
            self._events_df(sink_id)
            .where(F.col("event") == BATCH_COMMITTED)
            .agg(F.max("batch_id").alias("m"))
            .collect()
        )
        return None if not row or row[0]["m"] is None else int(row[0]["m"])

    def committed(self, sink_id: str, batch_id: int) -> Event | None:
        from pyspark.sql import functions as F

        self.ensure()
        found = [
            e
            for e in self._collect_events(
                self._events_df(sink_id).where(
                    (F.col("event") == BATCH_COMMITTED) & (F.col("batch_id") == batch_id)
                )
            )
        ]
        return found[0] if found else None

    def _collect_events(self, df: DataFrame) -> list[Event]:
        cols = [c for c in EVENT_COLUMNS if c != "time"]
        rows = df.selectExpr("unix_micros(time) AS time", *cols).orderBy("time").collect()
        return [event_from_row(r, _at) for r in rows]

    def read_events(self, sink_id: str | None = None) -> list[Event]:
        self.ensure()
        return self._collect_events(self._events_df(sink_id))

    def read_rejects(self, sink_id: str | None = None) -> list[RejectRecord]:
        from pyspark.sql import functions as F

        self.ensure()
        df = self._read("rejects")
        if sink_id is not None:
            df = df.where(F.col("sink_id") == sink_id)
        rows = df.selectExpr(
            "unix_micros(time) AS time", *(c for c in REJECT_COLUMNS if c != "time")
        ).collect()
        return [reject_from_row(r, _at) for r in rows]

    # -- ordering: held sessions and acknowledgements (spark_sb.state.sessions)
    def _ensure_sessions(self) -> None:
        """Create the ``sessions`` table where it does not exist: only a sink with ``ordering`` on uses it."""
        if self._sessions_ensured:
            return
        if not _local_table_exists(self.tables.path("sessions")):
            props = ", ".join(f"'{k}' = '{v}'" for k, v in TABLE_PROPERTIES.items())
            sql = (
                f"CREATE TABLE IF NOT EXISTS {self.tables.sql_name('sessions')} ({SESSIONS_DDL}) USING DELTA "
                f"TBLPROPERTIES ({props})"
            )
            self._retry("sessions", lambda: self.spark.sql(sql).collect(), creating=True)
        self._sessions_ensured = True

    def sessions_exist(self) -> bool:
        """Whether the ``sessions`` table exists (driver): a local path's ``_delta_log``, else the catalog or
        ``DESCRIBE DETAIL`` (a remote path). Never creates it."""
        if self._sessions_ensured or _local_table_exists(self.tables.path("sessions")):
            return True
        path = self.tables.path("sessions")
        if path is None:
            return bool(self.spark.catalog.tableExists(self.tables.sql_name("sessions")))
        if _local(path) is not None:
            return False  # a local path without a commit
        try:
            self.spark.sql(f"DESCRIBE DETAIL {self.tables.sql_name('sessions')}").collect()
        except Exception:  # noqa: BLE001 - "not a Delta table" / path not found: the table is not there
            return False
        return True

    def read_sessions(self, sink_id: str) -> list[HeldLine]:
        from pyspark.sql import functions as F

        self._ensure_sessions()
        rows = (
            self._read("sessions")
            .where(F.col("sink_id") == sink_id)
            .selectExpr(
                "entity",
                "session",
                "backlog_queue",
                "unix_micros(since) AS since",
                "marker",
                "unix_micros(issued) AS issued",
            )
            .collect()
        )
        return lines_from_rows(rows, _at)

    def write_sessions(self, sink_id: str, lines: Sequence[HeldLine]) -> None:
        self._ensure_sessions()
        rows = session_rows(sink_id, lines)
        df = self.spark.createDataFrame(rows, SESSIONS_DDL).coalesce(1)
        condition = "sink_id = '" + sink_id.replace("\\", "\\\\").replace("'", "\\'") + "'"
        writer = df.write.format("delta").mode("overwrite").option("replaceWhere", condition)
        path = self.tables.path("sessions")
        if path is not None:
            self._retry("sessions", lambda: writer.save(path))
        else:
            self._retry("sessions", lambda: writer.saveAsTable(self.tables.sql_name("sessions")))

    def read_acknowledgements(self, namespace: str, markers: Collection[str], since: datetime) -> set[str]:
        from pyspark.sql import functions as F

        if not markers:
            return set()
        self.ensure()
        rows = (
            self._read("events")
            .where(
                (F.col("time") >= F.lit(since))
                & (F.col("event") == ACKNOWLEDGED)
                & F.lower(F.col("namespace")).isin(list(namespace_spellings(namespace)))
                & F.col("detail").isin(sorted(markers))
            )
            .select("detail")
            .distinct()
            .collect()
        )
        return {str(r["detail"]) for r in rows}

    # -- writes
    def _append_records(
        self, table: str, records: Sequence[Any], app_id: str | None, version: int | None
    ) -> None:
        columns = COLUMNS[table]
        rows = [tuple(getattr(r, c) for c in columns) for r in records]
        self._append(table, self.spark.createDataFrame(rows, _DDL[table]), app_id, version)

    def merge_entities(self, records: Sequence[EntityRecord]) -> None:
        """Merge entity records: a newer or equal ``since`` wins (the state relay's copy)."""
        self.ensure()
        self._merge_entities(records)

    def _merge_entities(self, records: Sequence[EntityRecord]) -> None:
        rows = [
            (
                r.namespace,
                r.entity,
                r.state,
                r.since,
                r.last_error_class,
                r.backlog_namespace,
                [(p.queue, p.until, p.error_class) for p in r.pulled_backlog_queues],
                r.updated_at,
                r.updated_by,
            )
            for r in records
        ]
        view = f"spark_sb_entities_{uuid.uuid4().hex}"
        self.spark.createDataFrame(rows, ENTITIES_DDL).createOrReplaceTempView(view)
        sql = (
            f"MERGE INTO {self.tables.sql_name('entities')} t USING {view} s "
            "ON t.namespace = s.namespace AND t.entity = s.entity "
            "WHEN MATCHED AND s.since >= t.since THEN UPDATE SET * "
            "WHEN NOT MATCHED THEN INSERT *"
        )
        try:
            self._retry("entities", lambda: self.spark.sql(sql).collect())
        finally:
            self.spark.catalog.dropTempView(view)
