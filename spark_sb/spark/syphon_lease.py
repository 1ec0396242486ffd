"""One ordered syphon job a backlog (SPEC O5): a run's lease on its backlog queues, kept as events in the events
table (``syphon_running`` at its start and every :data:`LEASE_HEARTBEAT` seconds, ``syphon_stopped`` when it
stops); a run started on another checkpoint while a lease on the same queues is live is refused in one line naming
the first (:class:`SyphonRefused`).

Where it runs: driver (not picklable). Why two ordered jobs must not drain one queue: docs/design/syphon-job.md.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from spark_sb.core.clock import Clock, SystemClock
from spark_sb.state.records import Event
from spark_sb.state.sessions import EPOCH
from spark_sb.state.store import StateStore

#: The syphon job logs under one name (what users configure): ``spark_sb.spark.syphon_job``.
log = logging.getLogger("spark_sb.spark.syphon_job")


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
