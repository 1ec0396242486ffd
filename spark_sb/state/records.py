"""Records of the state tables: event names, table schemas (DDL), and the small frozen, picklable records
(:class:`Event`, :class:`EntityRecord`, :class:`RejectRecord`, :class:`PartitionResult`, :class:`BatchWrites`).
Pure; runs anywhere (:class:`EntityRecord` and :class:`PartitionResult` travel between driver and executors).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from spark_sb.core.redact import redact

if TYPE_CHECKING:  # pragma: no cover
    from spark_sb.failover.outcome import SendOutcome
    from spark_sb.failover.records import BacklogPull, EntityStatus
    from spark_sb.state.sessions import LineMark

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
#: The primary answered "server busy" and the sender backed off (SPEC L4): one row per entity and task, ``count`` is
#: the milliseconds spent backing off in that task (an integer column; ``sum(count) / 1000`` is seconds), ``detail``
#: says the same in seconds. Throttling is not an outage: nothing is diverted for it.
THROTTLED = "throttled"
MAINTAINED = "maintained"  # spark-sb maintain (state.maintain)
# ordering (spark_sb.state.sessions): a line (entity, session id in ``detail``) first held by a sink, and released
# by it (back on the primary); the syphon job passed a return marker (``detail``: the marker id)
SESSION_HELD = "session_held"
SESSION_RETURNED = "session_returned"
ACKNOWLEDGED = "acknowledged"
# the syphon's event names (spark_sb.spark.syphon_job): per entity and backlog queue, per micro-batch
MOVED = "moved"
EXPIRED = "expired"
ABANDONED = "abandoned"
DEAD_LETTERED = "dead_lettered"
SETTLE_FAILED = "settle_failed"
SYPHON_ERROR = "syphon_error"
PARKED = "parked"
#: SPEC B14: moved after its entity's duplicate detection window since its ambiguous primary send (count; detail: ids)
POSSIBLE_DUPLICATE = "possible_duplicate"
SYPHON_EVENTS = (
    MOVED,
    EXPIRED,
    ABANDONED,
    DEAD_LETTERED,
    SETTLE_FAILED,
    SYPHON_ERROR,
    PARKED,
    POSSIBLE_DUPLICATE,
)
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
    THROTTLED,
    MAINTAINED,
    SESSION_HELD,
    SESSION_RETURNED,
    ACKNOWLEDGED,
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
#: One row per (held line, pending marker) of a sink (spark_sb.state.sessions), rewritten whole per sink.
SESSIONS_DDL = (
    "sink_id STRING, entity STRING, session STRING, backlog_queue STRING, since TIMESTAMP, "
    "marker STRING, issued TIMESTAMP"
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
    """One row of the rejects table (``row_json`` already redacted by :func:`spark_sb.message.rows.row_to_json`)."""

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
    #: ordering: the lines this task diverted and marked (spark_sb.state.sessions); bounded by the task's lines
    marks: tuple[LineMark, ...] = ()


@dataclass(frozen=True)
class BatchWrites:
    """What the driver writes after one batch (the output of :func:`plan_batch`)."""

    events: tuple[Event, ...]
    entities: tuple[EntityRecord, ...]
    rejects: tuple[RejectRecord, ...]


#: The events table's columns, in order.
EVENT_COLUMNS: tuple[str, ...] = tuple(part.split()[0] for part in EVENTS_DDL.split(", "))
#: The rejects table's columns, in order (the fields of :class:`RejectRecord`).
REJECT_COLUMNS: tuple[str, ...] = tuple(part.split()[0] for part in REJECTS_DDL.split(", "))
#: The columns of the tables written a record per row, in order.
COLUMNS: dict[str, tuple[str, ...]] = {"events": EVENT_COLUMNS, "rejects": REJECT_COLUMNS}


# ------------------------------------------------------------------------------------------- rows to records
# A row as a store reads it back: a Spark ``Row`` or a dict, by column name. ``when`` turns a timestamp column's
# value as that store reads it (microseconds, a datetime, None) into a UTC datetime.
def event_from_row(row: Any, when: Callable[[Any], datetime]) -> Event:
    """An :class:`Event` from a row of the events table."""
    return Event(
        time=when(row["time"]),
        **{c: row[c] for c in EVENT_COLUMNS if c not in ("time", "count", "detail")},
        count=int(row["count"] or 0),
        detail=row["detail"] or "",
    )


def entity_from_row(row: Any, when: Callable[[Any], datetime]) -> EntityRecord:
    """An :class:`EntityRecord` from a row of the entities table."""
    return EntityRecord(
        row["namespace"],
        row["entity"],
        row["state"],
        when(row["since"]),
        row["last_error_class"],
        row["backlog_namespace"],
        tuple(
            PulledQueue(p["queue"], when(p["until"]), p["error_class"])
            for p in (row["pulled_backlog_queues"] or [])
        ),
        when(row["updated_at"]),
        row["updated_by"],
    )


def reject_from_row(row: Any, when: Callable[[Any], datetime]) -> RejectRecord:
    """A :class:`RejectRecord` from a row of the rejects table."""
    return RejectRecord(when(row["time"]), *(row[c] for c in REJECT_COLUMNS[1:]))


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
