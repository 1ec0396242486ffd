"""Group commit of the state writes (:class:`StateWriter`, a background thread on the driver) and the driver's
view of the entities between commits (:class:`EntityView`). Bounded: at most :data:`MAX_PENDING_BATCHES` batches
wait; writes go through the store, or, when the Spark session is gone (the program stopped it), through delta-rs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from spark_sb.state.records import BatchWrites, EntityRecord
from spark_sb.state.store import StateStore, _newer_or_same

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------- group commit, the driver's view
def coalesce(group: Sequence[tuple[int, BatchWrites]]) -> tuple[int, BatchWrites]:
    """Several batches' writes as one commit per table (pure; driver): the events and rejects of every batch in
    batch order, and the entity records collapsed to one per (namespace, entity): the newest by ``since``, a
    later batch winning a tie (as :func:`_newer_or_same`). Returns the highest batch id (the ``txnVersion`` of
    the commit) and the writes. Each event keeps its own batch id, so every batch's ``batch_committed`` row
    stays findable."""
    if not group:
        raise ValueError("coalesce: no batches")
    ordered = sorted(group, key=lambda item: item[0])
    entities: dict[tuple[str, str], EntityRecord] = {}
    for _, writes in ordered:
        for rec in writes.entities:
            key = (rec.namespace, rec.entity)
            if _newer_or_same(rec, entities.get(key)):
                entities[key] = rec
    return ordered[-1][0], BatchWrites(
        tuple(e for _, w in ordered for e in w.events),
        tuple(entities[k] for k in sorted(entities)),
        tuple(r for _, w in ordered for r in w.rejects),
    )


class EntityView:
    """The driver's latest view of the entities table (driver; thread-safe): the last read of the table
    overlaid with the records this sink planned since (a planned record wins unless the table holds a newer
    one, by ``since``). Planned records are dropped once a read taken after their commit reflects them.

    It is the handoff to the tasks of the next batch and the ``previous`` of :func:`plan_batch`, so with
    asynchronous state writes no batch waits for a read of the table: other writers' changes (other sinks, the
    syphon) arrive with the read the writer makes after each commit."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._table: dict[tuple[str, str], EntityRecord] | None = None
        self._read_at = 0.0
        self._planned: dict[tuple[str, str], tuple[int, EntityRecord]] = {}

    @property
    def loaded(self) -> bool:
        with self._lock:
            return self._table is not None

    def age(self) -> float:
        """Seconds since the table was last read (infinite before the first read)."""
        with self._lock:
            return float("inf") if self._table is None else self._clock() - self._read_at

    def reset(self) -> None:
        """Forget everything: the next batch reads the table synchronously (first batch, after an error)."""
        with self._lock:
            self._table = None
            self._planned.clear()

    def planned(self, seq: int, records: Iterable[EntityRecord]) -> None:
        """Records planned by write number ``seq`` (not necessarily written yet)."""
        with self._lock:
            for rec in records:
                key = (rec.namespace, rec.entity)
                known = self._planned.get(key)
                if known is None or _newer_or_same(rec, known[1]):
                    self._planned[key] = (seq, rec)

    def refreshed(self, records: Iterable[EntityRecord], written_through: int | None = None) -> None:
        """A read of the table, taken after write number ``written_through`` was committed (None: no write of
        this sink is known to be in it)."""
        table = {(r.namespace, r.entity): r for r in records}
        with self._lock:
            self._table = table
            self._up_to_date_locked(written_through)

    def confirmed(self, written_through: int | None = None) -> None:
        """The table has not changed since the last read (its version says so): as good as a new read, without
        reading it. Only valid when the last read saw every commit up to ``written_through`` that wrote
        entities (the table's version would have moved otherwise)."""
        with self._lock:
            if self._table is not None:
                self._up_to_date_locked(written_through)

    def _up_to_date_locked(self, written_through: int | None) -> None:
        """(Holding the lock) the table as held is current now: restart the age, and drop the planned records
        of writes up to ``written_through``, which the table has."""
        self._read_at = self._clock()
        if written_through is not None:
            self._planned = {k: v for k, v in self._planned.items() if v[0] > written_through}

    def records(self) -> list[EntityRecord]:
        """The view: the table's records, each replaced by this sink's planned one unless the table's is newer."""
        with self._lock:
            merged = dict(self._table or {})
            for key, (_, rec) in self._planned.items():
                if _newer_or_same(rec, merged.get(key)):
                    merged[key] = rec
        return [merged[k] for k in sorted(merged)]


#: More batches than this waiting for the state writer make the sink wait (backpressure); half of it queued
#: makes the writer commit before ``COMMIT_INTERVAL``. Large, so that a stream of small, fast batches pays for
#: one commit per interval, not one per few batches (each pending batch is a few event rows in memory).
MAX_PENDING_BATCHES = 512
#: A view older than this (seconds; a stream with long pauses between batches) is read again at batch start.
MAX_VIEW_AGE = 60.0
#: A batch's rows wait at most this long (seconds) for the background writer's next commit, which takes every
#: batch queued by then; sooner when half of ``MAX_PENDING_BATCHES`` batches are queued or a flush asks. Each
#: commit costs the driver a few Spark jobs (~1-2 s; the ``txnAppId`` check rebuilds the events table's state),
#: which compete with the batches' own tasks for the cores: fewer, larger commits cost the stream less.
COMMIT_INTERVAL = 30.0


class StateWriteError(RuntimeError):
    """The state writes of some batches failed after their retries (raised on the driver from the next batch,
    ``flush()`` or ``close()``; the cause is chained)."""


class StateWriter:
    """Writes batches' state in the background: one daemon thread on the driver per sink (group commit).

    :meth:`submit` queues one batch's :class:`BatchWrites` and returns at once (it waits only while more than
    ``max_pending`` batches are queued). The thread takes everything queued (when the oldest queued batch has
    waited ``commit_interval`` seconds; at once when a queued batch changed an entity's state or rejected rows -
    news that other sinks, the syphon and ``status`` should see now -, when half of ``max_pending`` is queued or
    when :meth:`flush` waits) and
    writes it as one commit per
    table (:func:`coalesce`: one rejects append, one entity MERGE when a record changed, one events append, the
    appends with ``txnAppId = sink_id`` and ``txnVersion`` = the highest batch id of the group, so a retried
    group is skipped by Delta); Delta conflicts are retried by the store. After each commit, as soon as the next
    batch is queued, it brings ``view`` up to date: it reads the entities table again when the table's version
    moved (other writers' changes, its own entity writes), and otherwise only confirms the view.

    A write that fails after the store's retries is never dropped silently: it is kept and raised (as
    :class:`StateWriteError`) by the next :meth:`raise_error`, :meth:`submit` or :meth:`flush`; the writes of
    that group are then lost from the tables (the batches were sent, and Spark's checkpoint already committed
    them).
    """

    def __init__(
        self,
        store: StateStore,
        sink_id: str,
        view: EntityView,
        *,
        max_pending: int = MAX_PENDING_BATCHES,
        refresh: bool = True,
        commit_interval: float = COMMIT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.sink_id = sink_id
        self.view = view
        _ready_for_exit(store)
        self.max_pending = max_pending
        self.refresh = refresh
        self.commit_interval = commit_interval
        self._clock = clock  # the commit interval's time (injected for tests); flush's timeout is real time
        self._oldest = 0.0  # the clock when the oldest queued batch was queued
        self._flushing = 0  # callers waiting in flush(): commit now
        self._refresh_due = False  # a commit since the last read of the entities table
        self._written_through: int | None = None  # the write number (seq) of the last committed group
        self._entities_version: int | None = None  # the entities table's version at this writer's last read
        self.commits = 0  # how many group commits were written
        self._cond = threading.Condition()
        self._queue: list[tuple[int, int, BatchWrites]] = []  # (seq, batch id, writes)
        self._busy = False
        self._error: BaseException | None = None
        self._failed: list[int] = []
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def pending(self) -> int:
        """Batches queued or being written."""
        with self._cond:
            return len(self._queue) + (1 if self._busy else 0)

    def submit(self, seq: int, batch_id: int, writes: BatchWrites) -> None:
        """Queue one batch's writes (driver). Waits while more than ``max_pending`` batches are queued; raises a
        failed earlier write."""
        with self._cond:
            while self._error is None and len(self._queue) >= self.max_pending:
                self._cond.wait()
            self._raise_locked()
            if not self._queue:
                self._oldest = self._clock()
            self._queue.append((seq, batch_id, writes))
            self._closed = False
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name=f"spark-sb-state-writer[{self.sink_id}]", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def raise_error(self) -> None:
        """Raise (once) the error of a write that failed."""
        with self._cond:
            self._raise_locked()

    def _raise_locked(self) -> None:
        if self._error is not None:
            error, failed = self._error, self._failed
            self._error, self._failed = None, []
            raise StateWriteError(
                f"state tables: the writes of sink {self.sink_id!r} batches {failed} failed: "
                f"{type(error).__name__}: {error}"
            ) from error

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued write is committed (and the view refreshed); raise a failed write's error.
        ``TimeoutError`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._flushing += 1
            self._cond.notify_all()
            try:
                while self._error is None and (self._queue or self._busy):
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError(
                            f"state tables: {len(self._queue) + int(self._busy)} write(s) of sink "
                            f"{self.sink_id!r} still pending after {timeout} s"
                        )
                    self._cond.wait(left)
            finally:
                self._flushing -= 1
            self._raise_locked()

    def close(self, timeout: float | None = None) -> None:
        """Flush, then stop the thread (a later :meth:`submit` starts a new one)."""
        try:
            self.flush(timeout)
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
                thread = self._thread
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                group = self._next_group()
            if group is None:
                return
            if not group:
                self._refresh()
                continue
            try:
                self._write(group)
            except BaseException as exc:  # kept and raised on the driver's next call: never silent
                log.error(
                    "state tables: the writes of sink %s batches %s failed: %s: %s",
                    self.sink_id,
                    [b for _, b, _ in group],
                    type(exc).__name__,
                    exc,
                )
                with self._cond:
                    if self._error is None:
                        self._error = exc
                    self._failed.extend(b for _, b, _ in group)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _next_group(self) -> list[tuple[int, int, BatchWrites]] | None:
        """(Holding the lock) wait for work: the next group to commit, ``[]`` for a due re-read of the entities
        table, None when closed with nothing queued."""
        while True:
            if not self._queue:
                if self._closed:
                    return None
                self._cond.wait()
                continue
            if self._refresh_due and not (self._flushing or self._closed):  # a flush waits for writes only
                self._refresh_due = False
                return []
            wait = self._oldest + self.commit_interval - self._clock()
            if (
                wait <= 0
                or self._flushing
                or self._closed
                or len(self._queue) * 2 >= self.max_pending
                or any(w.entities or w.rejects for _, _, w in self._queue)  # news: a state change, a reject
            ):
                break
            self._cond.wait(wait)
        group, self._queue = self._queue, []
        self._busy = True
        self._cond.notify_all()  # room in the queue again
        return group

    def _write(self, group: Sequence[tuple[int, int, BatchWrites]]) -> None:
        batch_id, writes = coalesce([(b, w) for _, b, w in group])
        try:
            self.store.write_batch(self.sink_id, batch_id, writes)
        except Exception as exc:
            fallback = _fallback_for(self.store, exc)
            if fallback is None:
                raise
            # The program stopped its Spark session with writes still queued (spark.stop() before flush(), a
            # query listener's flush racing the stop): the same rows go through deltalake. Idempotent: a table
            # the Spark write reached already holds this txnVersion, and its append is skipped.
            log.warning(
                "state tables: the Spark session of sink %s is gone (%s); batches %s written with deltalake",
                self.sink_id,
                type(exc).__name__,
                [b for _, b, _ in group],
            )
            self.store = fallback
            fallback.write_batch(self.sink_id, batch_id, writes)
        self.commits += 1
        with self._cond:
            self._written_through = max(seq for seq, _, _ in group)
            self._refresh_due = self.refresh

    def _refresh(self) -> None:
        """Bring the view up to date after a commit, once the next batch is queued (nobody needs the view before
        that, and a flush need not wait for it). The entities table is read again only when its version moved
        since the last read (an entity write by this sink or another writer); otherwise the view is confirmed
        as it is, which costs no Spark job."""
        try:
            version = self.store.entities_version()
            if version is not None and version == self._entities_version and self.view.loaded:
                self.view.confirmed(self._written_through)
                return
            # read after the version: a write in between moves the version, so it is read next time
            records = self.store.read_entities()
            self._entities_version = version
        except Exception as exc:  # the writes are committed; the view keeps what this sink planned
            log.warning(
                "state tables: re-reading the entities of sink %s failed (%s: %s); the next batches hand "
                "off the previous read plus this sink's own records",
                self.sink_id,
                type(exc).__name__,
                exc,
            )
            return
        self.view.refreshed(records, self._written_through)


#: What a Spark call raises once the program stopped its session (classic PySpark): the Python SparkContext's
#: JVM handle is gone, the JVM context is stopped, or the JVM itself is gone.
SESSION_GONE_MARKERS = (
    "'NoneType' object has no attribute 'sc'",
    "'NoneType' object has no attribute '_jvm'",
    "Cannot call methods on a stopped SparkContext",
    "SparkContext was shut down",
    "SparkContext has been shutdown",
    "Py4JNetworkError",
    "Answer from Java side is empty",
    "Error while sending or receiving",
)


def session_gone(exc: BaseException) -> bool:
    """True when ``exc`` says the Spark session (or its JVM) is gone, not that a write failed. Pure."""
    text = f"{type(exc).__name__} {exc}"
    return any(m in text for m in SESSION_GONE_MARKERS)


def _ready_for_exit(store: StateStore) -> None:
    """Import now what :func:`_fallback_for` may need while the interpreter exits (a program that stopped Spark and
    returned): modules that register exit handlers when imported - ``concurrent.futures`` (deltalake's writers
    use a thread pool), ``deltalake`` itself - cannot be imported then ("can't register atexit after
    shutdown"). Only for path tables (catalog tables have no fallback) and only when ``deltalake`` is there."""
    if getattr(getattr(store, "tables", None), "location", None) is None:
        return
    import concurrent.futures.thread  # noqa: F401 - registers its exit handler now, not at exit

    try:
        import deltalake  # noqa: F401

        import spark_sb.state.deltars  # noqa: F401
    except ImportError:
        pass


def _fallback_for(store: StateStore, exc: BaseException) -> StateStore | None:
    """The store to finish a write with when ``store``'s Spark session is gone: the same path tables through
    ``deltalake`` (:class:`~spark_sb.state.deltars.DeltaRsStateStore`). None when the session is not gone, the
    tables are catalog tables (they need Spark) or ``deltalake`` is not installed (logged)."""
    if not session_gone(exc):
        return None
    location = getattr(getattr(store, "tables", None), "location", None)
    if location is None:
        log.error("state tables: the Spark session is gone and catalog tables need one: the writes are lost")
        return None
    try:
        import deltalake  # noqa: F401 - only whether it is there

        from spark_sb.state.deltars import DeltaRsStateStore
    except ImportError:
        log.error(
            "state tables: the Spark session is gone and deltalake is not installed: the writes are lost"
        )
        return None
    return DeltaRsStateStore(location)
