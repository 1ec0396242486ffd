"""Failover state, event log and rejects: records, the planning of one batch's writes, and the stores (SPEC S4-S6).

Three tables (schemas in the README, "Delta state tables"):

* ``events``: append-only; one row per thing that happened (sent, diverted, rejected, state change, probe,
  backlog queue pulled / returned, replay skipped, batch committed).
* ``entities``: the current failover state per (primary namespace, entity), with the backlog queues pulled from
  the rotation; rows are replaced only by a record whose ``since`` is not older (several writers).
* ``rejects``: rows that could not become messages, with the reason and the row as JSON (secrets redacted).

Storage sits behind :class:`StateStore`: :class:`MemoryStateStore` (tests, no Spark) and :class:`DeltaStateStore`
(Delta path tables under ``state_location``, or Unity Catalog tables named ``<state_table_prefix>events`` ...).
Writes of one batch are idempotent per (sink id, batch id): appends carry ``txnAppId``/``txnVersion`` and the
entity MERGE only moves state forward in time; Delta conflicts with other writers are retried.

Where it runs: on the driver (the ``foreachBatch`` function's process; under Spark Connect the process beside the
server). :func:`plan_batch` and :func:`apply_handoff` are pure apart from the registry they are given; the
records are small frozen dataclasses, picklable (:class:`EntityRecord` travels to executors).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Protocol

from spark_sb.redact import redact

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

    from spark_sb.failover import BacklogPull, EntityStatus, FailoverRegistry, StateTransition
    from spark_sb.message import Reject
    from spark_sb.sender import SendOutcome

log = logging.getLogger(__name__)

# event names (the ``event`` column)
SENT = "sent"
DIVERTED = "diverted"
REJECTED = "rejected"
STATE_CHANGE = "state_change"
PROBE = "probe"
BACKLOG_PULLED = "backlog_pulled"
BACKLOG_RETURNED = "backlog_returned"
REPLAY_SKIPPED = "replay_skipped"
BATCH_COMMITTED = "batch_committed"
MAINTAINED = "maintained"  # spark-sb maintain (state.maintain)
# the syphon's event names (spark_sb.syphon_job): per entity and backlog queue, per micro-batch
MOVED = "moved"
EXPIRED = "expired"
ABANDONED = "abandoned"
DEAD_LETTERED = "dead_lettered"
SETTLE_FAILED = "settle_failed"
SYPHON_ERROR = "syphon_error"
PARKED = "parked"
SYPHON_EVENTS = (MOVED, EXPIRED, ABANDONED, DEAD_LETTERED, SETTLE_FAILED, SYPHON_ERROR, PARKED)
EVENTS = (
    SENT,
    DIVERTED,
    REJECTED,
    STATE_CHANGE,
    PROBE,
    BACKLOG_PULLED,
    BACKLOG_RETURNED,
    REPLAY_SKIPPED,
    BATCH_COMMITTED,
    MAINTAINED,
    *SYPHON_EVENTS,
)

EVENTS_DDL = (
    "time TIMESTAMP, sink_id STRING, batch_id BIGINT, namespace STRING, entity STRING, event STRING, "
    "from_state STRING, to_state STRING, backlog_queue STRING, error_class STRING, count BIGINT, "
    "executor_host STRING, detail STRING"
)
ENTITIES_DDL = (
    "namespace STRING, entity STRING, state STRING, since TIMESTAMP, last_error_class STRING, "
    "backlog_namespace STRING, "
    "pulled_backlog_queues ARRAY<STRUCT<queue: STRING, until: TIMESTAMP, error_class: STRING>>, "
    "updated_at TIMESTAMP, updated_by STRING"
)
REJECTS_DDL = (
    "time TIMESTAMP, sink_id STRING, batch_id BIGINT, entity STRING, column STRING, reason STRING, "
    "row_json STRING"
)

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _utc(dt: datetime) -> datetime:
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


def _from_micros(us: int | None) -> datetime | None:
    return None if us is None else _EPOCH + timedelta(microseconds=int(us))


# ------------------------------------------------------------------------------------------------ records
@dataclass(frozen=True)
class Event:
    """One row of the events table. ``detail`` is redacted on construction."""

    time: datetime
    sink_id: str
    batch_id: int | None
    event: str
    namespace: str | None = None
    entity: str | None = None
    from_state: str | None = None
    to_state: str | None = None
    backlog_queue: str | None = None
    error_class: str | None = None
    count: int = 1
    executor_host: str | None = None
    detail: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "time", _utc(self.time))
        if self.detail:
            object.__setattr__(self, "detail", redact(self.detail)[:1000])


@dataclass(frozen=True)
class PulledQueue:
    """A backlog queue out of the rotation until ``until`` (UTC)."""

    queue: str
    until: datetime
    error_class: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "until", _utc(self.until))


@dataclass(frozen=True)
class EntityRecord:
    """One row of the entities table: the state of one primary entity as last recorded. Picklable."""

    namespace: str
    entity: str
    state: str
    since: datetime
    last_error_class: str | None = None
    backlog_namespace: str | None = None
    pulled_backlog_queues: tuple[PulledQueue, ...] = ()
    updated_at: datetime = _EPOCH
    updated_by: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "since", _utc(self.since))
        object.__setattr__(self, "updated_at", _utc(self.updated_at))
        object.__setattr__(self, "pulled_backlog_queues", tuple(self.pulled_backlog_queues))


@dataclass(frozen=True)
class RejectRecord:
    """One row of the rejects table (``row_json`` already redacted by :func:`spark_sb.rows.row_to_json`)."""

    time: datetime
    sink_id: str
    batch_id: int | None
    entity: str | None
    column: str | None
    reason: str
    row_json: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "time", _utc(self.time))
        object.__setattr__(self, "reason", redact(self.reason))
        object.__setattr__(self, "row_json", redact(self.row_json))


@dataclass(frozen=True)
class PartitionResult:
    """What one partition task returns to the driver (pickled into the ``mapInArrow`` output). Executor-built.

    ``statuses``: the worker's view of the primary entities at the end of the task; ``pulled``: backlog queues
    pulled in that worker's rotation.
    """

    host: str
    rows: int
    outcome: SendOutcome
    statuses: tuple[EntityStatus, ...] = ()
    pulled: tuple[BacklogPull, ...] = ()
    pid: int = 0  # the Python worker process (not written to the tables)


@dataclass(frozen=True)
class BatchWrites:
    """What the driver writes after one batch (the output of :func:`plan_batch`)."""

    events: tuple[Event, ...]
    entities: tuple[EntityRecord, ...]
    rejects: tuple[RejectRecord, ...]


# ------------------------------------------------------------------------------------------ pure planning
def reject_records(
    rejects: Iterable[Reject], sink_id: str, batch_id: int | None, now: datetime
) -> list[RejectRecord]:
    """Rejects (from the send outcomes) as rows of the rejects table."""
    return [RejectRecord(now, sink_id, batch_id, r.entity, r.field, r.reason, r.row_json) for r in rejects]


def _state_value(state: Any) -> str:
    return str(getattr(state, "value", state))


def plan_batch(
    *,
    sink_id: str,
    batch_id: int,
    namespace: str,
    backlog_namespace: str | None,
    results: Sequence[PartitionResult],
    previous: Sequence[EntityRecord],
    now: datetime,
    updated_by: str = "",
) -> BatchWrites:
    """The events, entity records and rejects one batch produces (pure; driver).

    ``namespace`` is the primary's secret-free key, ``previous`` the entity records read at batch start.
    Entity records are written only where something changed: a state newer than the recorded one, or a different
    set of pulled backlog queues. The last event is ``batch_committed`` (count = rows read): its presence marks
    the batch as done for replay skipping.
    """
    now = _utc(now)
    events: list[Event] = []
    rejects: list[RejectRecord] = []
    rows = 0

    def ev(kind: str, host: str | None, **kw: Any) -> None:
        events.append(Event(kw.pop("time", now), sink_id, batch_id, kind, executor_host=host, **kw))

    for r in results:
        o = r.outcome
        rows += r.rows
        for entity, n in sorted(o.sent.items()):
            ev(SENT, r.host, namespace=namespace, entity=entity, count=n)
        only = next(iter(o.diverted_by_entity)) if len(o.diverted_by_entity) == 1 else None
        for queue, n in sorted(o.diverted.items()):
            ev(DIVERTED, r.host, namespace=namespace, entity=only, backlog_queue=queue, count=n)
        if only is None:
            for entity, n in sorted(o.diverted_by_entity.items()):
                ev(DIVERTED, r.host, namespace=namespace, entity=entity, count=n)
        by_entity: dict[str | None, int] = {}
        for rej in o.rejects:
            by_entity[rej.entity] = by_entity.get(rej.entity, 0) + 1
        for rej_entity, n in sorted(by_entity.items(), key=lambda kv: kv[0] or ""):
            ev(REJECTED, r.host, namespace=namespace, entity=rej_entity, count=n)
        rejects.extend(reject_records(o.rejects, sink_id, batch_id, now))
        for t in o.transitions:
            ev(
                STATE_CHANGE,
                r.host,
                time=t.at,
                namespace=t.namespace or namespace,
                entity=t.entity,
                from_state=_state_value(t.from_state),
                to_state=_state_value(t.to_state),
                error_class=t.error_class,
                detail=t.detail,
            )
        for p in o.probes:
            ev(
                PROBE,
                r.host,
                time=p.at,
                namespace=namespace,
                entity=p.entity,
                error_class=p.error_class,
                detail=f"{p.mode} {'ok' if p.ok else 'failed'}{': ' + p.detail if p.detail else ''}",
            )
        for pull in o.pulls:
            ev(
                BACKLOG_PULLED,
                r.host,
                time=pull.at,
                namespace=namespace,
                backlog_queue=pull.queue,
                error_class=pull.error_class,
                detail=f"until {pull.until.isoformat()}: {pull.detail}",
            )

    # -- entity state: the newest transition of each entity across the tasks, against what the table says.
    # Only real transitions count (not a worker's restore from the table, which would date old news as new).
    latest: dict[str, StateTransition] = {}
    for r in results:
        for tr in r.outcome.transitions:
            if (tr.namespace or namespace) != namespace:
                continue
            known = latest.get(tr.entity)
            if known is None or _utc(tr.at) >= _utc(known.at):
                latest[tr.entity] = tr
    recorded = {p.entity: p for p in previous if p.namespace == namespace}
    before = active_pulls(previous, namespace, now)
    pulls: dict[str, PulledQueue] = dict(before)
    for r in results:
        for pull in (*r.pulled, *r.outcome.pulls):
            if backlog_namespace is not None and pull.namespace != backlog_namespace:
                continue
            until = _utc(pull.until)
            if until <= now:
                continue
            known_pull = pulls.get(pull.queue)
            if known_pull is None or until > known_pull.until:
                pulls[pull.queue] = PulledQueue(pull.queue, until, pull.error_class)
    for queue in sorted(set(_recorded_pull_names(previous, namespace)) - set(pulls)):
        ev(BACKLOG_RETURNED, None, namespace=namespace, backlog_queue=queue, detail="pull expired")
    pulls_changed = set(pulls) != set(_recorded_pull_names(previous, namespace)) or any(
        pulls[q].until != before[q].until for q in pulls if q in before
    )
    pulled = tuple(sorted(pulls.values(), key=lambda p: p.queue))
    entities: list[EntityRecord] = []
    for entity in sorted(set(latest) | (set(recorded) if pulls_changed else set())):
        rec = recorded.get(entity)
        last = latest.get(entity)
        if last is not None and (
            rec is None or (_state_value(last.to_state) != rec.state and _utc(last.at) > rec.since)
        ):
            error_class = last.error_class or (rec.last_error_class if rec is not None else None)
            state, since = _state_value(last.to_state), last.at
        elif rec is not None and pulls_changed:
            entities.append(
                replace(rec, pulled_backlog_queues=pulled, updated_at=now, updated_by=updated_by or None)
            )
            continue
        else:
            continue
        entities.append(
            EntityRecord(
                namespace,
                entity,
                state,
                since,
                error_class,
                backlog_namespace,
                pulled,
                now,
                updated_by or None,
            )
        )
    ev(BATCH_COMMITTED, None, namespace=namespace, count=rows)
    return BatchWrites(tuple(events), tuple(entities), tuple(rejects))


def _recorded_pull_names(records: Sequence[EntityRecord], namespace: str) -> list[str]:
    return sorted({p.queue for r in records if r.namespace == namespace for p in r.pulled_backlog_queues})


def active_pulls(records: Sequence[EntityRecord], namespace: str, now: datetime) -> dict[str, PulledQueue]:
    """The backlog queues recorded as pulled (for the primary ``namespace``) still in force at ``now``."""
    out: dict[str, PulledQueue] = {}
    for r in records:
        if r.namespace != namespace:
            continue
        for p in r.pulled_backlog_queues:
            if p.until > now and (p.queue not in out or p.until > out[p.queue].until):
                out[p.queue] = p
    return out


def apply_handoff(
    registry: FailoverRegistry,
    records: Sequence[EntityRecord],
    *,
    namespace: str,
    backlog_namespace: str | None,
    failover_interval: float,
    ping_interval: float,
) -> list[StateTransition]:
    """Teach an executor process's registry what the state table says (executor, at task start; SPEC S4).

    An entity the worker has never seen, or whose recorded state is newer than the worker's, starts FAILED_OVER
    (no second ``failover_interval`` wait) or HEALTHY as recorded; FAILING is not copied (the timer is the
    worker's own). Backlog queues recorded as pulled are pulled in the worker's rotation until their ``until``.
    Returns the transitions made.
    """
    from spark_sb.failover import EntityState

    clock = registry.clock
    now = clock.now()
    known = {(s.namespace, s.entity) for s in registry.statuses()}
    out: list[StateTransition] = []
    for rec in records:
        if rec.namespace != namespace or rec.state not in (EntityState.FAILED_OVER.value, "healthy"):
            continue
        state = EntityState(rec.state)
        fresh = (rec.namespace, rec.entity) not in known
        if fresh and state is EntityState.HEALTHY:
            continue
        ef = registry.entity(
            rec.namespace, rec.entity, failover_interval=failover_interval, ping_interval=ping_interval
        )
        local = ef.status()
        if local.state is not state and (fresh or rec.since > _utc(local.since)):
            out.extend(ef.restore(state, "learned from the state table"))
    if backlog_namespace is not None:
        for pull in active_pulls(records, namespace, now).values():
            if registry.rotation.is_available(backlog_namespace, pull.queue):
                until = clock.monotonic() + (pull.until - now).total_seconds()
                registry.rotation.pull(
                    backlog_namespace, pull.queue, until, pull.error_class, "learned from the state table"
                )
    return out


# ---------------------------------------------------------------------------------------------- the stores
class StateStore(Protocol):
    """Where the sink keeps its state tables. Driver side; implementations are thread-safe."""

    def ensure(self) -> None:
        """Create the tables if they do not exist (idempotent)."""

    def read_entities(self) -> list[EntityRecord]:
        """Every entity record."""
        ...

    def entities_version(self) -> int | None:
        """A number that changes whenever the entities table changes (its Delta version), read without a
        Spark job: the writer re-reads the table only when it moved. None: unknown (read it)."""
        ...

    def last_committed(self, sink_id: str) -> int | None:
        """The highest batch id committed by ``sink_id`` (None: none)."""
        ...

    def committed(self, sink_id: str, batch_id: int) -> Event | None:
        """The ``batch_committed`` event of (``sink_id``, ``batch_id``), if that batch was committed."""
        ...

    def write_batch(self, sink_id: str, batch_id: int, writes: BatchWrites) -> None:
        """Write one batch's rows: idempotent per (``sink_id``, ``batch_id``); a repeated or older batch id of
        the same sink is skipped (Delta ``txnAppId``/``txnVersion`` semantics). Events are written last."""

    def append_events(self, events: Sequence[Event]) -> None:
        """Append events outside any batch (replay skipped, the syphon). Not idempotent."""

    def read_events(self, sink_id: str | None = None) -> list[Event]:
        """Events, oldest first (all sinks when ``sink_id`` is None)."""
        ...

    def read_rejects(self, sink_id: str | None = None) -> list[RejectRecord]:
        """Rejects (all sinks when ``sink_id`` is None)."""
        ...


def _newer_or_same(incoming: EntityRecord, existing: EntityRecord | None) -> bool:
    return existing is None or incoming.since >= existing.since


class MemoryStateStore:
    """An in-memory :class:`StateStore` with the Delta store's semantics (tests, tools). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self._entities: dict[tuple[str, str], EntityRecord] = {}
        self._rejects: list[RejectRecord] = []
        self._txn: dict[tuple[str, str], int] = {}
        self._entity_writes = 0

    def ensure(self) -> None:
        return None

    def read_entities(self) -> list[EntityRecord]:
        with self._lock:
            return list(self._entities.values())

    def entities_version(self) -> int | None:
        with self._lock:
            return self._entity_writes

    def last_committed(self, sink_id: str) -> int | None:
        with self._lock:
            ids = [
                e.batch_id
                for e in self._events
                if e.sink_id == sink_id and e.event == BATCH_COMMITTED and e.batch_id is not None
            ]
        return max(ids) if ids else None

    def committed(self, sink_id: str, batch_id: int) -> Event | None:
        with self._lock:
            for e in self._events:
                if e.sink_id == sink_id and e.batch_id == batch_id and e.event == BATCH_COMMITTED:
                    return e
        return None

    def _txn_ok(self, table: str, app_id: str, version: int) -> bool:
        last = self._txn.get((table, app_id))
        if last is not None and version <= last:
            return False
        self._txn[(table, app_id)] = version
        return True

    def write_batch(self, sink_id: str, batch_id: int, writes: BatchWrites) -> None:
        with self._lock:
            if writes.rejects and self._txn_ok("rejects", sink_id, batch_id):
                self._rejects.extend(writes.rejects)
            if writes.entities:
                self._entity_writes += 1  # a MERGE is a new table version, whether or not it changed rows
            for rec in writes.entities:
                key = (rec.namespace, rec.entity)
                if _newer_or_same(rec, self._entities.get(key)):
                    self._entities[key] = rec
            if self._txn_ok("events", sink_id, batch_id):
                self._events.extend(writes.events)

    def append_events(self, events: Sequence[Event]) -> None:
        with self._lock:
            self._events.extend(events)

    def read_events(self, sink_id: str | None = None) -> list[Event]:
        with self._lock:
            return [e for e in self._events if sink_id is None or e.sink_id == sink_id]

    def read_rejects(self, sink_id: str | None = None) -> list[RejectRecord]:
        with self._lock:
            return [r for r in self._rejects if sink_id is None or r.sink_id == sink_id]


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
    ) -> None:
        self.store = store
        self.sink_id = sink_id
        self.view = view
        self.max_pending = max_pending
        self.refresh = refresh
        self.commit_interval = commit_interval
        self._oldest = 0.0  # time.monotonic() when the oldest queued batch was queued
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
                self._oldest = time.monotonic()
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
            wait = self._oldest + self.commit_interval - time.monotonic()
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


def _fallback_for(store: StateStore, exc: BaseException) -> StateStore | None:
    """The store to finish a write with when ``store``'s Spark session is gone: the same path tables through
    ``deltalake`` (:class:`~spark_sb.state_deltars.DeltaRsStateStore`). None when the session is not gone, the
    tables are catalog tables (they need Spark) or ``deltalake`` is not installed (logged)."""
    if not session_gone(exc):
        return None
    location = getattr(getattr(store, "tables", None), "location", None)
    if location is None:
        log.error("state tables: the Spark session is gone and catalog tables need one: the writes are lost")
        return None
    try:
        import deltalake  # noqa: F401 - only whether it is there

        from spark_sb.state_deltars import DeltaRsStateStore
    except ImportError:
        log.error(
            "state tables: the Spark session is gone and deltalake is not installed: the writes are lost"
        )
        return None
    return DeltaRsStateStore(location)


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


class DeltaStateStore:
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

    # -- plumbing
    def _retry(self, what: str, fn: Any, *, creating: bool = False) -> Any:
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except Exception as exc:
                if attempt >= self.attempts or not is_conflict(exc, creating=creating):
                    raise
                log.info(
                    "state table %s: conflict with another writer (%s), retry %d",
                    what,
                    type(exc).__name__,
                    attempt,
                )
                self._sleep(min(5.0, self.backoff * 2 ** (attempt - 1)))
        raise AssertionError("unreachable")  # pragma: no cover

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
        for table, ddl in (("events", EVENTS_DDL), ("entities", ENTITIES_DDL), ("rejects", REJECTS_DDL)):
            sql = (
                f"CREATE TABLE IF NOT EXISTS {self.tables.sql_name(table)} ({ddl}) USING DELTA "
                f"TBLPROPERTIES ({props})"
            )
            self._retry(table, lambda sql=sql: self.spark.sql(sql).collect(), creating=True)
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
                "'until', unix_micros(p.until), 'error_class', p.error_class)) AS pulls",
                "unix_micros(updated_at) AS updated_at",
                "updated_by",
            )
            .collect()
        )
        return [
            EntityRecord(
                r["namespace"],
                r["entity"],
                r["state"],
                _from_micros(r["since"]) or _EPOCH,
                r["last_error_class"],
                r["backlog_namespace"],
                tuple(
                    PulledQueue(p["queue"], _from_micros(p["until"]) or _EPOCH, p["error_class"])
                    for p in (r["pulls"] or [])
                ),
                _from_micros(r["updated_at"]) or _EPOCH,
                r["updated_by"],
            )
            for r in rows
        ]

    def entities_version(self) -> int | None:
        self.ensure()
        rows = self.spark.sql(f"DESCRIBE HISTORY {self.tables.sql_name('entities')} LIMIT 1").collect()
        return int(rows[0]["version"]) if rows else None

    def _events_df(self, sink_id: str | None) -> DataFrame:
        from pyspark.sql import functions as F

        df = self._read("events")
        return df if sink_id is None else df.where(F.col("sink_id") == sink_id)

    def last_committed(self, sink_id: str) -> int | None:
        from pyspark.sql import functions as F

        self.ensure()
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
        rows = df.selectExpr("unix_micros(time) AS time_us", *cols).orderBy("time_us").collect()
        return [
            Event(
                time=_from_micros(r["time_us"]) or _EPOCH,
                **{c: r[c] for c in cols if c not in ("count", "detail")},
                count=int(r["count"] or 0),
                detail=r["detail"] or "",
            )
            for r in rows
        ]

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
            "unix_micros(time) AS time_us", "sink_id", "batch_id", "entity", "column", "reason", "row_json"
        ).collect()
        return [
            RejectRecord(
                _from_micros(r["time_us"]) or _EPOCH,
                r["sink_id"],
                r["batch_id"],
                r["entity"],
                r["column"],
                r["reason"],
                r["row_json"],
            )
            for r in rows
        ]

    # -- writes
    def _events_frame(self, events: Sequence[Event]) -> DataFrame:
        rows = [tuple(getattr(e, c) for c in EVENT_COLUMNS) for e in events]
        return self.spark.createDataFrame(rows, EVENTS_DDL)

    def write_batch(self, sink_id: str, batch_id: int, writes: BatchWrites) -> None:
        self.ensure()
        if writes.rejects:
            rows = [
                (r.time, r.sink_id, r.batch_id, r.entity, r.column, r.reason, r.row_json)
                for r in writes.rejects
            ]
            self._append("rejects", self.spark.createDataFrame(rows, REJECTS_DDL), sink_id, batch_id)
        if writes.entities:
            self._merge_entities(writes.entities)
        self._append("events", self._events_frame(writes.events), sink_id, batch_id)

    def append_events(self, events: Sequence[Event]) -> None:
        if events:
            self.ensure()
            self._append("events", self._events_frame(events), None, None)

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


EVENT_COLUMNS: tuple[str, ...] = tuple(part.split()[0] for part in EVENTS_DDL.split(", "))


# ------------------------------------------------------------------------------- table settings, maintenance
#: Delta table properties of the three tables: set by ``CREATE TABLE`` in :meth:`DeltaStateStore.ensure`, and by
#: :func:`maintain` on tables made before. What open-source Delta (delta-spark 4.x) does with each:
#:
#: * ``delta.autoOptimize.autoCompact``: honoured since Delta 3.1 (``hooks.AutoCompact``): after a commit that
#:   leaves 50 or more small files, the committing writer (the sink's background writer) compacts them. The
#:   state writes are one small file per commit, so without it the events table is thousands of files a day.
#: * ``delta.autoOptimize.optimizeWrite``: honoured since Delta 3.1 (``DeltaOptimizedWriterExec``): a write is
#:   shuffled into fewer, larger files. Not set: a state write is one small DataFrame already written as one
#:   file (``coalesce(1)``), and the extra shuffle stage would cost every commit.
#: * ``delta.checkpointInterval``: honoured (a checkpoint every N commits; a reader replays at most N - 1 JSON
#:   commits after it). 10, Delta's default, stated.
#: * ``delta.logRetentionDuration``: honoured at each checkpoint (JSON commits older are deleted); 7 days
#:   instead of 30: a sink commits every ~30 s, so 30 days would keep ~86,000 commit files.
#: * ``delta.deletedFileRetentionDuration``: honoured by ``VACUUM`` (files removed longer ago are deleted);
#:   7 days, Delta's default, stated (VACUUM refuses less without a session flag).
#:
#: Not set, because open-source Delta rejects them as unknown ``delta.`` keys (Databricks-only, no-ops
#: elsewhere): ``delta.targetFileSize``, ``delta.tuneFileSizesForRewrites``. The ``deltalake`` (delta-rs) writers
#: of the data source and ``status`` read these tables whatever the properties (none changes the protocol).
TABLE_PROPERTIES: dict[str, str] = {
    "delta.autoOptimize.autoCompact": "true",
    "delta.checkpointInterval": "10",
    "delta.logRetentionDuration": "interval 7 days",
    "delta.deletedFileRetentionDuration": "interval 7 days",
}

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
       table (the failover state) is never deleted from.
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
    done = tuple(
        _maintain_table(store, table, cutoff, optimize=optimize, vacuum=vacuum)
        for table in ("events", "entities", "rejects")
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
    # entities: never deleted from (the failover state)
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


__all__ = [
    "BATCH_COMMITTED",
    "DEFAULT_RETENTION",
    "MAINTAINED",
    "TABLE_PROPERTIES",
    "MaintenanceReport",
    "TableMaintenance",
    "maintain",
    "maintain_if_due",
    "EVENTS",
    "MAX_PENDING_BATCHES",
    "MAX_VIEW_AGE",
    "BatchWrites",
    "DeltaStateStore",
    "EntityRecord",
    "EntityView",
    "Event",
    "MemoryStateStore",
    "PartitionResult",
    "PulledQueue",
    "RejectRecord",
    "StateStore",
    "StateTables",
    "StateWriteError",
    "StateWriter",
    "apply_handoff",
    "coalesce",
    "plan_batch",
    "store_for",
]
