"""The state relay: catalog state tables (``state_table_prefix``) for ``format("servicebus")`` (SPEC S9). The data
source's ``commit`` runs with no SparkSession, so it records into a spool of Delta path tables (``state_spool``);
:class:`StateRelay` (driver, the user's process; DataFrame operations only) copies the spool into the catalog
tables after micro-batches, at most once per ``interval``, each query of a drain within ``timeout``::

    with spark_sb.relay_state(spark, opts):  # the options given to format("servicebus")
        q = df.writeStream.format("servicebus").options(**opts).option("checkpointLocation", ckpt).start()
        q.awaitTermination()

What a drain does (exactly once per table), when it runs, why its listener stays on a Spark Connect session:
docs/design/relay.md.

Bounded: one thread and one listener per relay, whatever the entities, batches or hours; a drain's work is what was
added since the last one plus the entities table. One relay per spool at a time.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_sb.core.errors import ConfigError
from spark_sb.spark.hooks import is_connect
from spark_sb.state.delta import DeltaStateStore, StateTables
from spark_sb.state.writer import COMMIT_INTERVAL

if TYPE_CHECKING:  # pragma: no cover
    from spark_sb.state.deltars import DeltaRsStateStore
    from spark_sb.state.records import EntityRecord

log = logging.getLogger(__name__)

#: The relay's own streaming queries are named ``spark-sb-relay-<table>-<hex>``; the listener ignores them.
RELAY_QUERY_PREFIX = "spark-sb-relay-"
#: Seconds one query of a drain may take before it is stopped (:class:`RelayError`).
RELAY_TIMEOUT = 300.0
#: Seconds between the starts of two drains of the relay's thread (the first is at once): micro-batches that end
#: closer together share a drain, and the relay's queries leave the driver to the stream. The ``foreachBatch``
#: sink's background state writes keep rows as long (``COMMIT_INTERVAL``).
RELAY_INTERVAL = COMMIT_INTERVAL
#: The appended tables a drain streams (the entities table is merged).
STREAMED_TABLES = ("rejects", "events")  # events last: a batch's ``batch_committed`` row after its rejects
RELAY_FOLDER = "_relay"  # <spool>/_relay/<table>: the checkpoints of the relay's queries


class RelayError(RuntimeError):
    """A drain that did not finish: a query failed or ran out of its deadline."""


@dataclass(frozen=True)
class RelayReport:
    """What one drain copied: rows per streamed table, entity records merged (0: the table had not moved)."""

    rows: Mapping[str, int]
    entities: int
    skipped: bool = False  # the spool has no tables yet: nothing recorded, nothing to copy


def _missing_table(exc: BaseException) -> bool:
    text = str(exc)
    return any(m in text for m in ("DELTA_MISSING_DELTA_TABLE", "is not a Delta table", "PATH_NOT_FOUND"))


class StateRelay:
    """Copies a ``servicebus`` source's spool into its catalog tables (driver, the user's process; holds the
    session: not picklable). Thread-safe: drains never overlap."""

    def __init__(
        self,
        spark: Any,
        spool: str,
        prefix: str,
        *,
        timeout: float = RELAY_TIMEOUT,
        interval: float = RELAY_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spark = spark
        self.spool = spool.rstrip("/") or "/"
        self.prefix = prefix
        self.timeout = timeout
        self.interval = interval
        self._clock = clock
        self._last_start: float | None = None  # when the thread's last drain began (clock)
        self.source = DeltaStateStore(spark, StateTables(location=self.spool))
        self.target = DeltaStateStore(spark, StateTables(prefix=prefix))
        self.last_error: BaseException | None = None
        self._drain_lock = threading.Lock()
        self._entities_seen: int | None = None  # the spool's entities version of the last merge
        # the spool's records at the last merge: one per entity, as the entities table itself
        self._entities_merged: frozenset[Any] = frozenset()
        self._rs: DeltaRsStateStore | None = None  # the deltalake reader of the spool
        self._use_rs = True  # False: Spark reads the spool (no deltalake here, or it failed)
        self._streamed: dict[str, int] = {}  # spool table -> its version at the last copy (2 entries)
        self._state = threading.Condition()
        self._wake = False
        self._stopping = False
        self._started = 0  # drains the thread began
        self._finished = 0  # the number (in _started) of the last drain the thread finished
        self._thread: threading.Thread | None = None
        self._listener: Any = None

    # -- one drain
    def _reader(self) -> DeltaRsStateStore | None:
        """The spool read with deltalake, without a Spark command (milliseconds), where the package is installed
        (the source that writes the spool needs it); None: read it with Spark."""
        if self._rs is None and self._use_rs:
            if importlib.util.find_spec("deltalake") is None:
                self._use_rs = False
            else:
                from spark_sb.state.deltars import DeltaRsStateStore

                self._rs = DeltaRsStateStore(self.spool)
        return self._rs if self._use_rs else None

    def _fall_back(self, what: str, exc: BaseException) -> None:
        """deltalake cannot read the spool from here (credentials, a scheme it lacks): Spark reads it from now on."""
        log.info("state relay %s: %s with deltalake failed (%s); reading with Spark", self.spool, what, exc)
        self._use_rs = False

    def _read_entities(self) -> list[EntityRecord]:
        reader = self._reader()
        if reader is not None:
            try:
                return reader.read_entities()
            except Exception as exc:
                self._fall_back("reading entities", exc)
        return self.source.read_entities()

    def _version(self, table: str) -> int | None:
        """The spool table's Delta version, None when it does not exist yet."""
        reader = self._reader()
        if reader is not None:
            try:
                return reader.version(table)
            except Exception as exc:
                self._fall_back(f"the version of {table}", exc)
        try:
            rows = self.spark.sql(f"DESCRIBE HISTORY {self.source.tables.sql_name(table)} LIMIT 1").collect()
        except Exception as exc:
            if _missing_table(exc):
                return None
            raise
        return int(rows[0]["version"]) if rows else None

    def _stream(self, table: str) -> int:
        """Copy what was added to the spool's ``table`` since the last drain; returns the rows copied."""
        name = f"{RELAY_QUERY_PREFIX}{table}-{uuid.uuid4().hex[:8]}"
        query = (
            self.spark.readStream.format("delta")
            .option("skipChangeCommits", "true")
            .load(self.source.tables.path(table))
            .writeStream.queryName(name)
            .option("checkpointLocation", f"{self.spool}/{RELAY_FOLDER}/{table}")
            .trigger(availableNow=True)
            .foreachBatch(
                functools.partial(
                    append_batch,
                    self.target.tables.sql_name(table),
                    f"{RELAY_QUERY_PREFIX}{table}:{self.spool}",
                )
            )
            .start()
        )
        try:
            finished = query.awaitTermination(self.timeout)
        except Exception as exc:
            raise RelayError(
                f"relay of {table} from {self.spool} to {self.prefix}{table} failed: {exc}"
            ) from exc
        if not finished:
            query.stop()
            raise RelayError(
                f"relay of {table} from {self.spool} to {self.prefix}{table}: not done in {self.timeout:g} s; "
                "stopped (the next drain goes on from its checkpoint)"
            )
        return sum(int(p.get("numInputRows", 0) or 0) for p in (query.recentProgress or []))

    def drain(self) -> RelayReport:
        """Copy what the spool holds and the catalog tables do not yet (driver). Creates the catalog tables.
        Raises :class:`RelayError` for a query that failed or did not finish within ``timeout``."""
        with self._drain_lock:
            if self._version("events") is None:
                return RelayReport({}, 0, skipped=True)
            self.target.ensure()
            rows = {}
            for table in STREAMED_TABLES:
                version = self._version(table)
                if version is not None and version == self._streamed.get(table):
                    rows[table] = 0  # nothing added since this relay's last copy: no query started
                    continue
                rows[table] = self._stream(table)
                if version is not None:
                    self._streamed[table] = version
            merged = 0
            version = self._version("entities")
            if version is not None and version != self._entities_seen:
                records = self._read_entities()
                fresh = [r for r in records if r not in self._entities_merged]
                if fresh:  # records this relay merged before and that did not change are not merged again
                    self.target.merge_entities(fresh)
                merged = len(fresh)
                self._entities_seen = version
                self._entities_merged = frozenset(records)
            return RelayReport(rows, merged)

    # -- the thread and the listener
    def wake(self) -> None:
        """Ask the relay's thread for a drain (any thread; returns at once)."""
        with self._state:
            self._wake = True
            self._state.notify_all()

    @property
    def drains_started(self) -> int:
        """How many drains the relay's thread has begun."""
        with self._state:
            return self._started

    def settle(self, timeout: float, *, wake: bool = True, after: int | None = None) -> bool:
        """Wait until the thread has finished a drain begun after its ``after``-th (default: after this call;
        ``wake``: ask for one). False when none did within ``timeout`` seconds. For tests and for the end of a
        notebook: ``n = relay.drains_started``, run a micro-batch, ``relay.settle(60, wake=False, after=n)``
        waits for the drain the listener asked for."""
        with self._state:
            target = (self._started if after is None else after) + 1
            if wake:
                self._wake = True
                self._state.notify_all()
            return self._state.wait_for(lambda: self._finished >= target, timeout)

    def _run(self) -> None:
        while True:
            with self._state:
                self._state.wait_for(lambda: self._wake or self._stopping)
                if self._last_start is not None:  # at most one drain per interval: later wake-ups share one
                    due = self._last_start + self.interval
                    while not self._stopping and self._clock() < due:
                        self._state.wait(due - self._clock())
                if self._stopping:
                    return
                self._wake = False
                self._started += 1
                number = self._started
                self._last_start = self._clock()
            try:
                self.drain()
                self.last_error = None
            except Exception as exc:  # logged and kept; the next wake-up tries again
                self.last_error = exc
                log.warning("state relay %s -> %s: %s", self.spool, self.prefix, exc)
            with self._state:
                self._finished = number
                self._state.notify_all()

    def start(self) -> StateRelay:
        """Start the thread and add the listener that wakes it after every micro-batch (idempotent)."""
        if self._thread is not None:
            return self
        with self._state:
            self._stopping = False  # started again after a stop
        self._thread = threading.Thread(target=self._run, name=f"spark-sb-relay:{self.prefix}", daemon=True)
        self._thread.start()
        self._listener = _listener(self)
        self.spark.streams.addListener(self._listener)
        return self

    def stop(self, *, drain: bool = True) -> RelayReport | None:
        """Remove the listener, end the thread, and (``drain``) drain once more: what a batch write needs after
        ``save()``. Raises :class:`RelayError` when that drain fails."""
        if self._listener is not None:
            listener, self._listener = self._listener, None
            listener.relay = None  # inert from now on: it wakes nothing, and does not hold this relay
            # under Connect removal can deadlock (module docstring): the listener is left inert
            if not is_connect(self.spark):
                try:
                    self.spark.streams.removeListener(listener)
                except Exception as exc:  # a stopped session: nothing to remove from
                    log.debug("state relay: removing the listener: %s", exc)
        if self._thread is not None:
            with self._state:
                self._stopping = True
                self._state.notify_all()
            self._thread.join(self.timeout * (len(STREAMED_TABLES) + 1))
            self._thread = None
        return self.drain() if drain else None

    def __enter__(self) -> StateRelay:
        return self.start()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.stop()
            return
        try:  # the block's own error is the one to see; a failed last drain is logged
            self.stop()
        except Exception as failed:
            log.warning("state relay %s -> %s: the last drain failed: %s", self.spool, self.prefix, failed)


def append_batch(table: str, app_id: str, batch_df: Any, batch_id: int) -> None:
    """One micro-batch of a relay query: appended to the catalog ``table`` once (Delta's ``txnAppId`` /
    ``txnVersion``: a batch Spark runs again after a crash is skipped). Driver (under Spark Connect, the server's
    Python process); picklable (a module function given strings). ``foreachBatch`` rather than ``toTable``: a
    classic session resolves ``toTable``'s name only in a thread where it is the active session, and the relay's
    thread is not one."""
    (
        batch_df.write.format("delta")
        .mode("append")
        .option("txnAppId", app_id)
        .option("txnVersion", batch_id)
        .saveAsTable(table)
    )


def _listener(relay: StateRelay) -> Any:
    """A ``StreamingQueryListener`` that wakes ``relay`` after each micro-batch of a query not its own; inert once
    its ``relay`` is None (set by :meth:`StateRelay.stop`)."""
    from pyspark.sql.streaming import StreamingQueryListener

    class RelayListener(StreamingQueryListener):
        def __init__(self) -> None:
            super().__init__()
            self.relay: StateRelay | None = relay

        def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's names
            pass

        def onQueryProgress(self, event: Any) -> None:  # noqa: N802
            target = self.relay
            if target is not None and not (event.progress.name or "").startswith(RELAY_QUERY_PREFIX):
                target.wake()

        def onQueryIdle(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
            pass

    return RelayListener()


def check_table_prefix(spark: Any, prefix: str) -> None:
    """The catalog and schema that ``state_table_prefix`` names exist in this session, checked when the relay starts
    (before any row is read) rather than when its first drain writes, after the messages were sent. A three-part
    prefix (``catalog.schema.prefix``) needs a session with that catalog - Unity Catalog on Databricks; plain Spark
    has only ``spark_catalog``, whose schemas are one part (``schema.prefix``). Raises :class:`ConfigError` naming
    ``state_table_prefix``. Driver; two catalog calls (they work under Spark Connect)."""
    parts = prefix.split(".")
    namespace = parts[:-1]  # the last part is the tables' name prefix (``sb_``)
    shown = f"relay_state: option 'state_table_prefix' {prefix!r}"
    if len(namespace) == 2:
        catalog = namespace[0]
        known = sorted(c.name for c in spark.catalog.listCatalogs())
        if catalog not in known:
            raise ConfigError(
                f"{shown} names catalog {catalog!r}, which this session does not have (catalogs: "
                f"{', '.join(known) or 'none'}); a three-part name needs Unity Catalog (Databricks) - on plain "
                f"Spark give 'schema.prefix', e.g. '{namespace[1]}.{parts[-1]}'",
                [("state_table_prefix", f"no catalog {catalog!r}")],
            )
    schema = ".".join(namespace)
    if namespace and not spark.catalog.databaseExists(schema):
        raise ConfigError(
            f"{shown}: schema {schema!r} does not exist in this session; create it first (CREATE SCHEMA {schema})",
            [("state_table_prefix", f"no schema {schema!r}")],
        )


def relay_state(
    spark: Any,
    options: Mapping[str, Any],
    *,
    timeout: float = RELAY_TIMEOUT,
    interval: float = RELAY_INTERVAL,
) -> StateRelay:
    """The started :class:`StateRelay` for a ``servicebus`` source given ``options`` (the options of
    ``format("servicebus")``; ``checkpointLocation`` among them when the spool is its default). Driver, the
    user's process. Raises :class:`ConfigError` naming ``state_table_prefix`` or ``state_spool``."""
    from spark_sb.spark.datasource_options import parse_options

    parsed = parse_options(options)
    prefix = parsed.config.state_table_prefix
    if not prefix:
        raise ConfigError(
            "relay_state: option 'state_table_prefix': required (the catalog tables to copy into; with "
            "state_location the source writes its tables itself)",
            [("state_table_prefix", "required")],
        )
    if parsed.state_spool is None:
        raise ConfigError(
            "relay_state: option 'state_spool': required (or checkpointLocation among the options): the path "
            "tables format('servicebus') records into",
            [("state_spool", "required")],
        )
    check_table_prefix(spark, prefix)
    return StateRelay(spark, parsed.state_spool, prefix, timeout=timeout, interval=interval).start()


__all__ = [
    "RELAY_QUERY_PREFIX",
    "RelayError",
    "RelayReport",
    "StateRelay",
    "check_table_prefix",
    "relay_state",
]
