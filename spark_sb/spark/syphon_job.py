"""The syphon as a restartable Structured Streaming query (SPEC S7, B9, B11, B12).

``run_syphon(spark, config, checkpoint=...)`` starts a query that reads the Python streaming data source
``servicebus-syphon`` and writes what it did to the Delta events table with ``foreachBatch``:

* **Planning (driver machine; the data source's planner process).** Each trigger, ``latestOffset`` reads the
  backlog queues' runtime counts through the secondary's administration endpoint (management reads, not billable
  receives; one request per trigger when the listing answers) and offers a micro-batch only when there is work: a
  backlog queue with active messages, or a dead-letter queue with more messages than the last pass left there
  (parked on purpose). Nothing to do: no micro-batch, no receive call, no Delta write. When the counts cannot be
  read every backlog queue is drained (a receive each). With ``state_location`` path tables and the
  ``deltalake`` package, the entity states ride along in the offset as hints.
* **Draining (executors).** Each queue to drain is one input partition; ``read()`` drains it with a
  :class:`~spark_sb.syphon.mover.Syphon` taken from the worker's pool (:data:`SYPHONS`, a
  :class:`~spark_sb.sender.pool.SenderPool`: Python workers are reused, so clients live across micro-batches; a syphon
  unused for ``idle_timeout`` is closed) for at most ``syphon.batch_duration``, and yields one row per message
  moved, plus one row per (entity, kind) for anything else (expired, abandoned, dead-lettered, settle failures,
  errors, parked). So a micro-batch's ``numInputRows`` in ``StreamingQueryProgress`` counts messages moved (plus
  those few summary rows).
* **Recording (driver; the ``foreachBatch`` function).** :class:`SyphonBatchWriter` aggregates the rows per
  (entity, kind) and appends them to the events table (kinds ``moved``, ``expired``, ``abandoned``,
  ``dead_lettered``, ``settle_failed``, ``syphon_error``, ``parked``; a ``dead_lettered`` row of an entity whose
  destination does not exist has detail ``DestinationNotFound`` and error class ``entity_not_found``, SPEC F9),
  idempotently per micro-batch of the run (``txnAppId`` = ``syphon/<primary namespace name>/<run id>``, a run id
  fresh at every query start; ``txnVersion`` = batch id). The events' ``sink_id`` is ``syphon/<primary namespace
  name>`` (what readers filter on). The transaction id is the run's (SPEC O5): a run on a fresh checkpoint, the
  other entry point or a second job counts its batch ids from 0 again, and a replayed micro-batch (restart on the
  same checkpoint) drained the queues again - new events each time, never a copy to skip.

One ordered job a backlog: with ``ordering``, a run records a lease in the events table (``syphon_running`` at its
start and every minute, ``syphon_stopped`` when it stops) and a run started on another checkpoint while a lease on
the same queues is live is refused in one line naming the first (:class:`SyphonLease`; SPEC O5).

Restartable: the checkpoint holds only offsets (a replayed micro-batch drains again: moving is idempotent with
message ids and duplicate detection on the primary). Stopping: :func:`request_stop` lets the running micro-batch
finish (every message it holds is completed or abandoned) and keeps the next one from starting; ``query.stop()``
kills the tasks instead (their Python workers are killed: the locks they held run out and those messages are
redelivered, never lost).

DataFrame operations only (a Python data source and ``foreachBatch``): runs under Spark Connect. The data source
classes are built by :func:`syphon_source` (pyspark is imported only then); they carry the picklable config.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.clock import Clock, SystemClock
from spark_sb.core.errors import ConfigError
from spark_sb.failover.outcome import namespace_key
from spark_sb.sender.pool import SenderPool, config_key
from spark_sb.spark.partition import ordering_needs_tables
from spark_sb.state.maintenance import maintain_if_due, store_for
from spark_sb.state.records import (
    ABANDONED,
    ACKNOWLEDGED,
    BATCH_COMMITTED,
    DEAD_LETTERED,
    EXPIRED,
    MOVED,
    PARKED,
    SETTLE_FAILED,
    SYPHON_ERROR,
    BatchWrites,
    Event,
)
from spark_sb.state.sessions import EPOCH
from spark_sb.state.store import StateStore
from spark_sb.syphon.lines import RECEIVE_FAILURE_PAUSE
from spark_sb.syphon.mover import Syphon
from spark_sb.syphon.rules import (
    DESTINATION_NOT_FOUND,
    ENTITY_NOT_FOUND,
    LOCK_DURATION,
    NOT_A_BACKLOG_MESSAGE,
    SyphonOutcome,
)
from spark_sb.wire.admin_api import with_namespace_name

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

SOURCE_NAME = "servicebus-syphon"
ROW_SCHEMA = (
    "queue STRING, dead_letter BOOLEAN, entity STRING, kind STRING, count BIGINT, message_id STRING, "
    "detail STRING"
)
#: Ordering: added to the backlog queues' longest lock duration before a run's first drain (seconds).
LOCK_MARGIN = 5.0
#: The MaxDeliveryCount ``spark-sb provision`` gives the backlog queues (never dead-lettered by deliveries).
BOUNDLESS = 2147483647
#: The receive wait inside a micro-batch: the planner already knows there are messages (admin counts), so a
#: receive that comes back empty after this long ends the queue's pass.
RECEIVE_WAIT = 1.0


# ------------------------------------------------------------------------------------------- planning
@dataclass
class BacklogWatcher:
    """Decides which backlog queues a micro-batch drains, from runtime counts (management reads). Runs in the
    data source's planner process on the driver machine; not picklable (holds an admin client), built there.

    ``admin``: a ``ServiceBusAdministrationClient`` of the secondary (built from the config when None).
    """

    config: ServiceBusConfig
    queues: Sequence[str]
    admin: Any = None
    admin_kwargs: Mapping[str, Any] = field(default_factory=dict)
    parked: dict[str, int] = field(default_factory=dict)  # dead-letter count a pass left behind
    _dlq_pass: set[str] = field(default_factory=set)
    reads: int = 0
    failures: int = 0
    #: ``Trigger.AvailableNow``: each queue's active count when the query started (None: another trigger). Bounded,
    #: like the two maps below, by the backlog queues.
    at_start: dict[str, int] | None = None
    _drained: dict[str, int] = field(
        default_factory=dict
    )  # messages gone from a queue since the start, at least
    _seen: dict[str, int] = field(default_factory=dict)  # its active count when it was last offered
    _blind: int = 0  # passes over every queue made without counts (AvailableNow: one at most)
    #: ordering: seconds the first drain waits after the watcher's first look (None: the backlog queues' longest
    #: lock duration + :data:`LOCK_MARGIN`, read from the admin endpoint; :data:`RECEIVE_FAILURE_PAUSE` unread)
    lock_wait: float | None = None
    clock: Clock = field(default_factory=SystemClock)
    _not_before: float | None = None
    _locks: dict[str, float] | None = None  # :meth:`lock_durations`, once read

    def _ordered_start(self) -> bool:
        """Ordering: True once the locks a killed run of the job may have held ran out (then its messages are back
        in their queues, before anything behind them); until then no queue is drained."""
        if self.config.ordering == "none":
            return True
        if self._not_before is None:
            wait = self.lock_wait if self.lock_wait is not None else self._longest_lock()
            self._not_before = self.clock.monotonic() + wait
            if wait > 0:
                log.info(
                    "syphon: ordering: the first drain waits %.0f s for a killed run's locks to run out", wait
                )
        return self.clock.monotonic() >= self._not_before

    def _longest_lock(self) -> float:
        locks = self.lock_durations()
        if not locks:
            log.info("syphon: lock durations unavailable: waiting %.0f s", RECEIVE_FAILURE_PAUSE)
            return RECEIVE_FAILURE_PAUSE
        return max(locks.values()) + LOCK_MARGIN

    def lock_durations(self) -> dict[str, float]:
        """Each backlog queue's lock duration (seconds), read once from the admin endpoint (empty when it cannot be
        read: the drains assume the provisioned lock, :data:`~spark_sb.syphon.rules.LOCK_DURATION`). The ordered
        drain measures every lock it holds with it (a queue created by hand may lock for less than the provisioned
        60 s). Bounded by the backlog queues."""
        if self._locks is None:
            try:
                admin = self._admin()
                props = {q: admin.get_queue(q) for q in self.queues}
            except Exception as exc:  # noqa: BLE001 - read again at the next look
                log.info("syphon: lock durations unavailable (%s)", type(exc).__name__)
                return {}
            self._locks = {q: float(p.lock_duration.total_seconds()) for q, p in props.items()}
            bounded = sorted(
                q
                for q, p in props.items()
                if (getattr(p, "max_delivery_count", None) or BOUNDLESS) < BOUNDLESS
            )
            if bounded and self.config.ordering != "none":
                log.warning(
                    "syphon: ordering: backlog queues %s dead-letter a message after MaxDeliveryCount deliveries: "
                    "a held line's head whose locks keep running out (syphon workers killed, settles lost) can "
                    "lose its place - create them with `spark-sb provision` (MaxDeliveryCount %d)",
                    ", ".join(bounded),
                    BOUNDLESS,
                )
        return self._locks

    def prepare_available_now(self) -> None:
        """``Trigger.AvailableNow`` starts: remember what each queue holds now. From here a queue is offered while
        the messages it held at the start have not all left it (however many micro-batches that takes) and each
        pass over it made progress. Messages gone are told by the counts, which new arrivals hide: a run may move
        some that came after the start (harmless for a syphon), and ends when the counts say that at least as many
        as were there have left, or when a pass moved nothing. Without counts, every queue is drained once."""
        try:
            counts = self.counts()
        except Exception as exc:  # noqa: BLE001 - the run still drains: every queue, once
            log.warning("syphon: backlog counts unavailable at start (%s); draining every queue once", exc)
            self.at_start = {}
            return
        self.at_start = {queue: active for queue, (active, _) in counts.items()}

    def _admin(self) -> Any:
        if self.admin is None:
            assert self.config.secondary is not None
            timeout = float(self.config.send_timeout)
            self.admin = self.config.secondary.admin_client(
                **{
                    "retry_total": 0,
                    "connection_timeout": timeout,
                    "read_timeout": timeout,
                    **self.admin_kwargs,
                }
            )
        return self.admin

    def counts(self) -> dict[str, tuple[int, int]]:
        """(active, dead-lettered) per backlog queue; raises when the admin endpoint does not answer."""
        admin = self._admin()
        wanted = set(self.queues)
        out: dict[str, tuple[int, int]] = {}
        self.reads += 1
        try:
            for props in admin.list_queues_runtime_properties():
                if props.name in wanted:
                    out[props.name] = (
                        int(props.active_message_count or 0),
                        int(props.dead_letter_message_count or 0),
                    )
        except Exception:  # noqa: BLE001 - a listing is an optimisation: ask queue by queue
            out = {}
        for queue in self.queues:
            if queue not in out:
                props = admin.get_queue_runtime_properties(queue)
                out[queue] = (int(props.active_message_count or 0), int(props.dead_letter_message_count or 0))
        return out

    def work(self) -> list[tuple[str, bool]]:
        """(queue, dead_letter) pairs to drain now; every queue when the counts cannot be read. With ordering,
        nothing until one lock duration after the first look (:meth:`_ordered_start`); under ``Trigger.AvailableNow``
        this call waits that long instead (an empty offer would end the run before its first drain)."""
        if not self._ordered_start():
            if self.at_start is None:
                return []
            assert self._not_before is not None
            self.clock.sleep(self._not_before - self.clock.monotonic())
        try:
            counts = self.counts()
        except Exception as exc:  # noqa: BLE001 - the loop never dies: drain blind instead
            self.failures += 1
            self.admin = None
            if self.at_start is not None:  # AvailableNow: one blind pass, then the run ends
                self._blind += 1
                if self._blind > 1:
                    return []
            log.warning("syphon: backlog counts unavailable (%s); draining every queue", type(exc).__name__)
            return [(q, False) for q in self.queues]
        if self.at_start == {}:  # AvailableNow without counts at the start: the first counts stand for it
            self.at_start = {queue: active for queue, (active, _) in counts.items()}
        work: list[tuple[str, bool]] = []
        for queue in self.queues:
            active, dead = counts.get(queue, (0, 0))
            if queue in self._dlq_pass:  # a pass ran since: what is left there is parked
                self._dlq_pass.discard(queue)
                self.parked[queue] = dead
            if active > 0 and self._still_due(queue, active):
                work.append((queue, False))
            if dead > self.parked.get(queue, 0):
                work.append((queue, True))
                self._dlq_pass.add(queue)
            elif dead < self.parked.get(queue, 0):
                self.parked[queue] = dead
        return work

    def _still_due(self, queue: str, active: int) -> bool:
        """Whether ``queue`` (``active`` messages now) is drained in this micro-batch: always, but under
        ``Trigger.AvailableNow`` only while messages it held at the start may still be there - fewer have left it
        than it held, and its last pass made progress (a pass that moved nothing: its entities are down, or new
        messages arrive as fast as they leave; the next run goes on)."""
        if self.at_start is None:
            return True
        held = self.at_start.get(queue, 0)
        last = self._seen.get(queue)
        if last is not None:
            if active >= last:
                return False
            self._drained[queue] = self._drained.get(queue, 0) + (last - active)
        if self._drained.get(queue, 0) >= held:
            return False
        self._seen[queue] = active
        return True


def read_entity_hints(config: ServiceBusConfig) -> dict[str, str]:
    """entity -> state from the ``entities`` path table (``deltalake``, no Spark); {} when unavailable."""
    if not config.state_location:
        return {}
    try:
        from spark_sb.state.deltars import DeltaRsStateStore

        primary = namespace_key(config.primary)
        table = DeltaRsStateStore(config.state_location).snapshot("entities")
        rows = [] if table is None else table.to_pylist()
        return {str(r["entity"]): str(r["state"]) for r in rows if r.get("namespace") == primary}
    except Exception as exc:  # noqa: BLE001 - hints only: without them every entity is probed first
        log.info("syphon: entity states unavailable (%s); entities are probed", type(exc).__name__)
        return {}


# ------------------------------------------------------------------------------------------- draining
#: The executor's syphons, kept between micro-batches (one task at a time each; closed after ``idle_timeout``).
SYPHONS: SenderPool[Syphon] = SenderPool()


def outcome_rows(queue: str, dead_letter: bool, outcome: SyphonOutcome) -> Iterator[tuple[Any, ...]]:
    """The rows of one receive batch's outcome (pure): one per message moved, one per (entity, kind) else."""
    for entity, message_id in outcome.moved_ids:
        yield (queue, dead_letter, entity, MOVED, 1, message_id, None)
    for entity, n in sorted(outcome.expired_by_entity.items()):
        yield (queue, dead_letter, entity or None, EXPIRED, n, None, None)
    for entity, n in sorted(outcome.abandoned_by_entity.items()):
        yield (queue, dead_letter, entity or None, ABANDONED, n, None, None)
    if outcome.invalid:
        yield (queue, dead_letter, None, DEAD_LETTERED, outcome.invalid, None, NOT_A_BACKLOG_MESSAGE)
    for entity, n in sorted(outcome.undeliverable_by_entity.items()):
        yield (queue, dead_letter, entity or None, DEAD_LETTERED, n, None, DESTINATION_NOT_FOUND)
    if outcome.settle_failures:
        yield (queue, dead_letter, None, SETTLE_FAILED, outcome.settle_failures, None, None)
    if outcome.parked:
        yield (queue, dead_letter, None, PARKED, outcome.parked, None, None)
    for error in outcome.errors:
        yield (queue, dead_letter, None, SYPHON_ERROR, 1, None, error[:500])


class CollectedAcks:
    """The syphon job's :class:`~spark_sb.failover.ordering.Acknowledgements` (executor; one per pooled syphon):
    the return markers its syphon passed, kept until :func:`drain_partition` yields them as ``acknowledged`` rows,
    which the ``foreachBatch`` function writes to the events table after the micro-batch (the sink's driver reads
    them there: :mod:`spark_sb.state.sessions`). Bounded by the markers one receive batch passes."""

    def __init__(self) -> None:
        self._passed: list[tuple[str, str, str]] = []

    def acknowledged(self, entity: str, session: str, marker: str) -> None:
        self._passed.append((entity, session, marker))

    def take(self) -> list[tuple[str, str, str]]:
        """The markers passed since the last take: (entity, session, marker id)."""
        passed, self._passed = self._passed, []
        return passed


def drain_partition(
    config: ServiceBusConfig,
    queue: str,
    dead_letter: bool,
    hints: Mapping[str, str] | None = None,
    queues: Sequence[str] = (),
    lock_duration: float | None = None,
) -> Iterator[tuple[Any, ...]]:
    """Drain one backlog queue (its dead-letter queue with ``dead_letter``) for at most
    ``syphon.batch_duration``; yields rows of :data:`ROW_SCHEMA`. Executor (a Python worker). Never raises: an
    error becomes a ``syphon_error`` row (B11). If the caller stops iterating, what is held is abandoned.
    ``lock_duration``: the queue's lock (seconds, read by the planner; None: the provisioned lock)."""
    try:
        key = config_key(config)
        names = list(queues or [queue])
        ordered = config.ordering != "none"

        def build() -> Syphon:
            if not ordered:
                return Syphon(config, backlog_queues=names, record_ids=True)
            return Syphon(config, backlog_queues=names, record_ids=True, acks=CollectedAcks())

        syphon = SYPHONS.acquire(key, float(config.idle_timeout), build)
        syphon.lock_duration = float(lock_duration) if lock_duration else LOCK_DURATION
        acks = getattr(syphon, "acks", None) if ordered else None
        acks = acks if isinstance(acks, CollectedAcks) else None
        try:
            if hints is not None:
                syphon.set_hints(hints)
            until = time.monotonic() + float(config.syphon_batch_duration)
            wait = min(float(config.syphon_max_wait), RECEIVE_WAIT)
            batches = syphon.drain_batches(queue, max_wait=wait, dead_letter=dead_letter, until=until)
            try:
                for outcome in batches:
                    yield from outcome_rows(queue, dead_letter, outcome)
                    for entity, _session, marker in acks.take() if acks is not None else ():
                        yield (queue, dead_letter, entity, ACKNOWLEDGED, 1, marker, marker)
            finally:
                batches.close()
        finally:
            SYPHONS.release(key, syphon)  # kept whatever happened, as its receivers replace themselves
    except Exception as exc:  # noqa: BLE001 - B11: the job never dies on a drain
        log.warning("syphon: draining %s failed (%s)", queue, type(exc).__name__)
        yield (queue, dead_letter, None, SYPHON_ERROR, 1, None, f"{queue}: {type(exc).__name__}")


# ------------------------------------------------------------------------------------------- the source
def check_ordered_job(config: ServiceBusConfig) -> None:
    """Driver: with ``ordering`` on the job needs the state tables (its acknowledgements go to the events table) and
    ``syphon.prefetch`` 0 - a pooled syphon's prefetched messages stay locked in its worker after the task, while
    the next micro-batch may drain the queue from another worker and move their sessions' later messages first.
    One-line :class:`~spark_sb.core.errors.ConfigError` naming the key."""
    ordering_needs_tables(config, "the syphon job")
    if config.ordering != "none" and config.syphon_prefetch:
        raise ConfigError.at(
            "syphon.prefetch",
            f"must be 0 with ordering: {config.ordering} (found {config.syphon_prefetch}): prefetched messages "
            "stay locked in a worker while another drains their queue",
        )


def syphon_source(
    config: ServiceBusConfig,
    *,
    queues: Sequence[str] | None = None,
    admin_kwargs: Mapping[str, Any] | None = None,
    stop_file: str | None = None,
) -> type:
    """The ``servicebus-syphon`` Python data source class for ``config`` (driver; register it with
    ``spark.dataSource.register``). The class carries the picklable config (pickled by value with cloudpickle, to
    the planner process and the executors). ``admin_kwargs``: extra arguments of the admin client (e.g.
    ``connection_verify`` for a local namespace). ``stop_file``: while this file exists no micro-batch starts.
    Raises :class:`~spark_sb.core.errors.ConfigError` for ``ordering`` without state tables or with prefetch
    (:func:`check_ordered_job`)."""
    check_ordered_job(config)
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    try:  # pyspark 4.1+: a Python source may say it supports Trigger.AvailableNow (no single-batch fallback)
        from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

        bases: tuple[type, ...] = (DataSourceStreamReader, SupportsTriggerAvailableNow)
    except (
        ImportError
    ):  # pragma: no cover - the oldest pair: Spark falls back to one micro-batch, and says so
        bases = (DataSourceStreamReader,)

    names = list(queues) if queues is not None else config.backlog_queue_names()
    extra = dict(admin_kwargs or {})

    class SyphonReader(*bases):  # type: ignore[misc]
        """Offsets are {"id", "work", "hints"}; a new one only when there is work (see the module docstring)."""

        def __init__(self) -> None:
            self._watcher: BacklogWatcher | None = None
            self._last: dict[str, Any] = {"id": "start", "work": [], "hints": {}}

        def __getstate__(self) -> dict[str, Any]:
            return {"_watcher": None, "_last": self._last}

        def initialOffset(self) -> dict[str, Any]:  # noqa: N802 - the DataSource API's name
            return {"id": "start", "work": [], "hints": {}}

        def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
            """The query runs with ``Trigger.AvailableNow``: drain what the backlog holds now, in as many
            micro-batches as it takes (:meth:`BacklogWatcher.prepare_available_now`), then stop."""
            if self._watcher is None:
                self._watcher = BacklogWatcher(config, names, admin_kwargs=extra)
            self._watcher.prepare_available_now()

        def latestOffset(  # noqa: N802
            self, start: dict[str, Any] | None = None, limit: Any = None
        ) -> dict[str, Any]:
            """A new offset only when there is work; else ``start`` (the last committed offset; no micro-batch).
            ``limit`` (admission control) is not used: a micro-batch is bounded by ``syphon.batch_duration``."""
            if start is not None:
                self._last = start
            if stop_file is not None and os.path.exists(stop_file):
                return self._last
            if self._watcher is None:
                self._watcher = BacklogWatcher(config, names, admin_kwargs=extra)
            work = self._watcher.work()
            if work:
                self._last = {
                    "id": uuid.uuid4().hex,
                    "work": [[q, d] for q, d in work],
                    "hints": read_entity_hints(config),
                }
                if config.ordering != "none":  # the ordered drain measures its locks with the queues' own
                    self._last["locks"] = self._watcher.lock_durations()
            return self._last

        def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
            hints, locks = end.get("hints") or {}, end.get("locks") or {}
            return [
                InputPartition(json.dumps([q, bool(d), hints, locks.get(q)])) for q, d in end.get("work", [])
            ]

        def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
            queue, dead_letter, hints, *lock = json.loads(partition.value)
            lock_duration = lock[0] if lock and lock[0] else None
            yield from drain_partition(config, queue, dead_letter, hints or None, names, lock_duration)

        def commit(self, end: dict[str, Any]) -> None:
            return None

    class SyphonSource(DataSource):
        """Backlog queues drained into the primary; one row per message moved."""

        @classmethod
        def name(cls) -> str:
            return SOURCE_NAME

        def schema(self) -> str:
            return ROW_SCHEMA

        def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: N802
            return SyphonReader()

    return SyphonSource


# ------------------------------------------------------------------------------------------- recording
@dataclass
class SyphonTotals:
    """Counts over the micro-batches this writer recorded (driver; counts only)."""

    batches: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    by_entity: dict[str, int] = field(default_factory=dict)  # moved per entity

    @property
    def moved(self) -> int:
        return self.by_kind.get(MOVED, 0)


def syphon_sink_id(config: ServiceBusConfig) -> str:
    """The syphon's identity in the events table: ``syphon/<primary namespace name>``."""
    try:
        name = config.primary.effective_namespace_name()
    except Exception:  # noqa: BLE001 - an address endpoint without a resolved name
        name = namespace_key(config.primary)
    return f"syphon/{name}"


def new_run_id() -> str:
    """A fresh run id (pure; random): one per query start of the syphon job."""
    return uuid.uuid4().hex


def error_class_of(kind: str, detail: str | None) -> str | None:
    """The ``error_class`` column of a syphon event (pure): ``entity_not_found`` for messages dead-lettered because
    their destination does not exist (what ``spark-sb status`` sums as undeliverable), else none."""
    if kind == DEAD_LETTERED and (detail or "").startswith(DESTINATION_NOT_FOUND):
        return ENTITY_NOT_FOUND
    return None


class SyphonBatchWriter:
    """The ``foreachBatch`` function of the syphon query (driver; picklable: the config and an optional store).

    Aggregates the rows of one micro-batch per (queue, entity, kind) in one Spark action (so the source is read,
    and the queues drained, exactly once) and appends them to the events table as events. ``total`` keeps counts
    (in the process that runs the function: under Spark Connect, beside the server)."""

    def __init__(
        self, config: ServiceBusConfig, *, store: StateStore | None = None, run_id: str | None = None
    ) -> None:
        ordering_needs_tables(config, "the syphon job", store_given=store is not None)
        self.config = config
        self.sink_id = syphon_sink_id(config)
        self.run_id = run_id or new_run_id()
        self.total = SyphonTotals()
        self._store = store

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "run_id": self.run_id}  # the run id travels (Spark Connect)

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        self.__init__(state["config"], run_id=state.get("run_id"))  # type: ignore[misc]

    def start_run(self) -> str:
        """A new run (driver, before the query starts; :func:`run_syphon` calls it): a fresh run id."""
        self.run_id = new_run_id()
        return self.run_id

    @property
    def txn_id(self) -> str:
        """The Delta transaction id of this run's appends: ``syphon/<primary namespace name>/<run id>``."""
        return f"{self.sink_id}/{self.run_id}"

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F

        marker = F.when(F.col("kind") == ACKNOWLEDGED, F.col("message_id")).alias("marker")
        rows = (
            batch_df.groupBy("queue", "entity", "kind", marker)  # one row per acknowledged marker (ordering)
            .agg(F.sum("count").alias("n"), F.first("detail", ignorenulls=True).alias("detail"))
            .collect()
        )
        aggregated = [
            (r["queue"], r["entity"], r["kind"], int(r["n"] or 0), r["marker"] or r["detail"]) for r in rows
        ]
        store = self._store
        if store is None and aggregated:
            store = store_for(batch_df.sparkSession, self.config)
            self._store = store
        self.record(batch_id, aggregated, store)
        maintain_if_due(batch_df.sparkSession, self.config)  # when state_maintain_every is due

    def record(
        self,
        batch_id: int,
        aggregated: Sequence[tuple[str | None, str | None, str, int, str | None]],
        store: StateStore | None,
        now: datetime | None = None,
    ) -> None:
        """Count and write one micro-batch's aggregated rows (Spark-free: unit-testable)."""
        if not aggregated:
            return  # an empty micro-batch (e.g. the first after a restart): nothing happened, nothing written
        self.total.batches += 1
        for _queue, entity, kind, n, _detail in aggregated:
            self.total.by_kind[kind] = self.total.by_kind.get(kind, 0) + n
            if kind == MOVED and entity:
                self.total.by_entity[entity] = self.total.by_entity.get(entity, 0) + n
        if store is None:
            return
        at = now or datetime.now(timezone.utc)
        namespace = namespace_key(self.config.primary)
        host = socket.gethostname()
        events = [
            Event(
                at,
                self.sink_id,
                batch_id,
                kind,
                namespace=namespace,
                entity=entity,
                backlog_queue=queue,
                error_class=error_class_of(kind, detail),
                count=n,
                executor_host=host,
                detail=detail or "",
            )
            for queue, entity, kind, n, detail in sorted(
                aggregated, key=lambda a: (a[2], a[1] or "", a[0] or "")
            )
        ]
        moved = sum(n for _q, _e, kind, n, _d in aggregated if kind == MOVED)
        events.append(Event(at, self.sink_id, batch_id, BATCH_COMMITTED, namespace=namespace, count=moved))
        store.ensure()
        store.write_batch(self.txn_id, batch_id, BatchWrites(tuple(events), (), ()))  # events: sink_id


# ------------------------------------------------------------------------------------------- the lease
#: Ordering: the events of a syphon job's lease on its backlog (SPEC O5): ``syphon_running`` when a run starts and
#: every :data:`LEASE_HEARTBEAT` seconds while it runs, ``syphon_stopped`` when it stops or is refused.
SYPHON_RUNNING = "syphon_running"
SYPHON_STOPPED = "syphon_stopped"
#: Seconds between two ``syphon_running`` events of a running ordered job (one small commit each).
LEASE_HEARTBEAT = 60.0
#: A run whose newest lease event is ``syphon_running`` and younger than this holds the lease (seconds): a job
#: killed without stopping blocks another for at most this long (a restart on its own checkpoint is not blocked).
LEASE_STALE = 300.0


class SyphonRefused(RuntimeError):
    """Ordering: another syphon job drains the same backlog queues (SPEC O5); the message is one line naming it."""


@dataclass(frozen=True)
class SyphonRun:
    """One run of the syphon job as its lease events tell it (pure data). ``queues``: None for every backlog
    queue of the config (also when the list was too long to record)."""

    run_id: str
    host: str
    checkpoint: str
    started: datetime
    queues: tuple[str, ...] | None = None
    seen: datetime | None = None  # its newest lease event

    def detail(self) -> str:
        return json.dumps(
            {
                "run": self.run_id,
                "checkpoint": self.checkpoint,
                "started": self.started.isoformat(),
                "queues": None if self.queues is None else list(self.queues),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_event(cls, event: Event) -> SyphonRun | None:
        """The run a lease event names (None: not one this code wrote whole; the detail is cut at 1,000 chars)."""
        try:
            d = json.loads(event.detail)
            queues = d.get("queues")
            return cls(
                str(d["run"]),
                event.executor_host or "?",
                str(d.get("checkpoint") or "?"),
                datetime.fromisoformat(str(d["started"])),
                None if queues is None else tuple(str(q) for q in queues),
                event.time,
            )
        except (ValueError, KeyError, TypeError):
            return None

    def overlaps(self, other: SyphonRun) -> bool:
        return self.queues is None or other.queues is None or bool(set(self.queues) & set(other.queues))

    def describe(self, now: datetime) -> str:
        seen = self.seen or self.started
        return (
            f"run {self.run_id} on {self.host} (checkpoint {self.checkpoint}, started "
            f"{self.started:%Y-%m-%d %H:%M:%S} UTC, last seen {max(0.0, (now - seen).total_seconds()):.0f} s ago)"
        )


def live_runs(events: Sequence[Event], now: datetime, stale: float = LEASE_STALE) -> list[SyphonRun]:
    """The runs holding a lease (pure): whose newest lease event is ``syphon_running``, at most ``stale`` seconds
    old. ``events``: lease events of one backlog (any order; bounded by the caller's time window)."""
    newest: dict[str, tuple[Event, SyphonRun]] = {}  # bounded by the runs seen in the window
    for event in events:
        run = SyphonRun.from_event(event)
        if run is None or event.event not in (SYPHON_RUNNING, SYPHON_STOPPED):
            continue
        known = newest.get(run.run_id)
        if known is None or (event.time, event.event == SYPHON_STOPPED) >= (
            known[0].time,
            known[0].event == SYPHON_STOPPED,
        ):
            newest[run.run_id] = (event, run)
    return [
        run
        for event, run in newest.values()
        if event.event == SYPHON_RUNNING and (now - event.time).total_seconds() <= stale
    ]


def read_lease_events(store: StateStore, sink_id: str, since: datetime) -> list[Event]:
    """The lease events of ``sink_id`` dated ``since`` or later (driver; a filtered read on a Delta store)."""
    from spark_sb.state.delta import DeltaStateStore

    if isinstance(store, DeltaStateStore):
        from pyspark.sql import functions as F

        path = store.tables.path("events")
        store.ensure()
        df = (
            store.spark.read.format("delta").load(path)
            if path is not None
            else store.spark.table(store.tables.sql_name("events"))
        )
        rows = (
            df.where(
                (F.col("sink_id") == sink_id)
                & F.col("event").isin(SYPHON_RUNNING, SYPHON_STOPPED)
                & (F.col("time") >= F.lit(since))
            )
            .selectExpr("unix_micros(time) AS us", "event", "namespace", "executor_host", "detail")
            .collect()
        )
        return [
            Event(
                EPOCH + timedelta(microseconds=int(r["us"])),
                sink_id,
                None,
                str(r["event"]),
                namespace=r["namespace"],
                executor_host=r["executor_host"],
                detail=r["detail"] or "",
            )
            for r in rows
        ]
    return [
        e
        for e in store.read_events(sink_id)
        if e.event in (SYPHON_RUNNING, SYPHON_STOPPED) and e.time >= since
    ]


class SyphonLease:
    """Ordering: one run's lease on its backlog queues (driver; not picklable). Two syphons receiving from one
    backlog queue break O1 (one can move a session's later message while the other holds the earlier one locked),
    so a second ordered job is refused while a first runs. :meth:`acquire` records ``syphon_running`` and then reads
    the lease events: another live run on other checkpoint whose queues overlap refuses this one (it records
    ``syphon_stopped``). Of two runs starting together at least one sees the other (each reads after its own
    write): one or both are refused, never neither. Not used with ``ordering: none`` (moving is idempotent)."""

    def __init__(
        self,
        store: StateStore,
        sink_id: str,
        namespace: str,
        run: SyphonRun,
        *,
        clock: Clock | None = None,
        stale: float = LEASE_STALE,
        heartbeat: float = LEASE_HEARTBEAT,
    ) -> None:
        self.store, self.sink_id, self.namespace, self.run = store, sink_id, namespace, run
        self.clock = clock or SystemClock()
        self.stale, self.heartbeat = stale, heartbeat
        self._lock = threading.Lock()
        self._released = False
        self._last_beat: float | None = None

    def _write(self, kind: str) -> None:
        event = Event(
            self.clock.now(),
            self.sink_id,
            None,
            kind,
            namespace=self.namespace,
            executor_host=self.run.host,
            detail=self.run.detail(),
        )
        self.store.append_events([event])

    def acquire(self) -> None:
        """Take the lease or raise :class:`SyphonRefused` naming the run that holds it."""
        self._write(SYPHON_RUNNING)
        self._last_beat = self.clock.monotonic()
        now = self.clock.now()
        events = read_lease_events(self.store, self.sink_id, now - timedelta(seconds=self.stale))
        blocking = [
            r
            for r in live_runs(events, now, self.stale)
            if r.run_id != self.run.run_id and r.checkpoint != self.run.checkpoint and r.overlaps(self.run)
        ]
        if blocking:
            self.release()
            first = min(blocking, key=lambda r: (r.started, r.run_id))
            raise SyphonRefused(
                f"another syphon job drains these backlog queues with ordering: {first.describe(now)}; stop it "
                f"first (two would break the order of sessions), or wait until it has been silent for "
                f"{self.stale:.0f} s"
            )

    def beat(self) -> bool:
        """Record ``syphon_running`` when :attr:`heartbeat` seconds passed since the last (True: written)."""
        with self._lock:
            if self._released:
                return False
            now = self.clock.monotonic()
            if self._last_beat is not None and now - self._last_beat < self.heartbeat:
                return False
            self._write(SYPHON_RUNNING)
            self._last_beat = now
            return True

    def release(self) -> None:
        """Record ``syphon_stopped`` (once; later calls do nothing). Never raises: a lease not released runs out."""
        with self._lock:
            if self._released:
                return
            self._released = True
            try:
                self._write(SYPHON_STOPPED)
            except Exception as exc:  # noqa: BLE001 - it runs out after LEASE_STALE
                log.warning("syphon: the lease of run %s was not released (%s)", self.run.run_id, exc)


#: The leases of the ordered syphon queries this process started, by query id (bounded by its running queries).
_LEASES: dict[str, SyphonLease] = {}


def _keep_lease(query: StreamingQuery, lease: SyphonLease) -> None:
    """The lease's thread (driver): a heartbeat while the query runs, the release when it ends."""
    try:
        while True:
            try:
                if query.awaitTermination(max(1, int(lease.heartbeat))):
                    break
            except Exception:  # noqa: BLE001 - the query failed: it ended
                break
            try:
                lease.beat()
            except Exception as exc:  # noqa: BLE001 - the next beat tries again; the lease runs out if none lands
                log.warning("syphon: lease heartbeat failed (%s)", type(exc).__name__)
    finally:
        lease.release()
        _LEASES.pop(str(query.id), None)


# ------------------------------------------------------------------------------------------- the query
def run_syphon(
    spark: SparkSession,
    config: ServiceBusConfig,
    *,
    checkpoint: str,
    trigger: str = "10 seconds",
    once: bool = False,
    available_now: bool = False,
    queues: Sequence[str] | None = None,
    admin_kwargs: Mapping[str, Any] | None = None,
    stop_file: str | None = None,
    query_name: str | None = "servicebus-syphon",
    writer: SyphonBatchWriter | None = None,
) -> StreamingQuery:
    """Start the syphon query (driver). Returns the query; stop it with :func:`request_stop` +
    :func:`stop_gracefully` (or ``query.stop()``).

    The trigger: ``processingTime=trigger`` by default; ``once``: a single micro-batch (``Trigger.Once``), then the
    query stops; ``available_now``: ``Trigger.AvailableNow`` (the trigger serverless compute accepts), which drains
    what the backlog queues hold when the query starts, in as many micro-batches as that takes (each draining a
    queue for at most ``syphon.batch_duration``; :meth:`BacklogWatcher.prepare_available_now`), and stops. On
    pyspark 4.0 (no ``SupportsTriggerAvailableNow``) Spark runs one micro-batch instead, and warns. ``once`` and ``available_now`` exclude each other."""
    if once and available_now:
        raise ValueError("run_syphon: give once=True or available_now=True, not both")
    check_ordered_job(config)  # before the query starts: no queue is drained

    config = with_namespace_name(config)  # resolved once on the driver; executors never ask
    names = list(queues) if queues is not None else config.backlog_queue_names()
    spark.dataSource.register(
        syphon_source(config, queues=names, admin_kwargs=admin_kwargs, stop_file=stop_file)
    )
    writer = writer or SyphonBatchWriter(config)
    run_id = writer.start_run()  # this run's Delta transaction id (SPEC O5), before the function is pickled
    lease = None
    if (
        config.ordering != "none"
    ):  # a second ordered job on these queues is refused before it drains (SPEC O5)
        store = store_for(spark, config)
        assert store is not None  # check_ordered_job: ordering has the state tables
        all_queues = set(names) == set(config.backlog_queue_names())
        run = SyphonRun(
            run_id,
            socket.gethostname(),
            checkpoint,
            datetime.now(timezone.utc),
            None if all_queues else tuple(sorted(names)),
        )
        lease = SyphonLease(store, writer.sink_id, namespace_key(config.primary), run)
        lease.acquire()
    stream = spark.readStream.format(SOURCE_NAME).load()
    out = stream.writeStream.foreachBatch(writer).option("checkpointLocation", checkpoint)
    if query_name:
        out = out.queryName(query_name)
    if available_now:
        out = out.trigger(availableNow=True)
    elif once:
        out = out.trigger(once=True)
    else:
        out = out.trigger(processingTime=trigger)
    try:
        query = out.start()
    except BaseException:
        if lease is not None:
            lease.release()
        raise
    if lease is not None:
        _LEASES[str(query.id)] = lease
        threading.Thread(target=_keep_lease, args=(query, lease), name="syphon-lease", daemon=True).start()
    return query


def request_stop(stop_file: str) -> None:
    """Keep the next micro-batch from starting (driver; any thread, e.g. a SIGTERM handler)."""
    with open(stop_file, "w") as f:
        f.write("stop\n")


def stop_gracefully(query: StreamingQuery, stop_file: str, timeout: float) -> bool:
    """Stop ``query`` between micro-batches: :func:`request_stop`, wait (at most ``timeout`` s) until no trigger
    runs, then stop it. True when it stopped between batches (False: the running batch was cut short)."""
    request_stop(stop_file)
    deadline = time.monotonic() + timeout
    idle = False
    while time.monotonic() < deadline and query.isActive:
        if not query.status.get("isTriggerActive", False):
            idle = True
            break
        time.sleep(0.1)  # polling the query's status: there is nothing to await
    query.stop()
    lease = _LEASES.pop(str(query.id), None)
    if lease is not None:  # before the caller stops the session (the lease's thread would write too late)
        lease.release()
    return idle or not query.isActive
