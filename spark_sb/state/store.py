"""The state store interface (:class:`StateStore`), what the two Delta stores share (:class:`DeltaTableStore`) and
the in-memory store for tests and Spark-less use (:class:`MemoryStateStore`). Runs on the driver.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from typing import Any, ClassVar, Protocol, TypeVar

from spark_sb.state.records import (
    ACKNOWLEDGED,
    BATCH_COMMITTED,
    BatchWrites,
    EntityRecord,
    Event,
    RejectRecord,
)
from spark_sb.state.sessions import HeldLine, namespace_spellings

log = logging.getLogger(__name__)

R = TypeVar("R")


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

    def read_sessions(self, sink_id: str) -> list[HeldLine]:
        """The held lines of ``sink_id`` (ordering; :mod:`spark_sb.state.sessions`), from the ``sessions`` table."""
        ...

    def write_sessions(self, sink_id: str, lines: Sequence[HeldLine]) -> None:
        """Replace the held lines of ``sink_id`` by ``lines`` (one commit; no line: its rows are deleted)."""

    def read_acknowledgements(self, namespace: str, markers: Collection[str], since: datetime) -> set[str]:
        """Which of ``markers`` the syphon acknowledged (``acknowledged`` events dated ``since`` or later): a read
        bounded by time, made only while lines are held. ``namespace`` matches every spelling of it
        (:func:`~spark_sb.state.sessions.namespace_spellings`: case, default port, trailing slash - SPEC O6)."""
        ...


class DeltaTableStore:
    """What the two Delta stores (:class:`~spark_sb.state.delta.DeltaStateStore` through Spark,
    :class:`~spark_sb.state.deltars.DeltaRsStateStore` through delta-rs) do alike: a write that lost a race with
    another writer is tried again (:meth:`_retry`), and one batch's rows are written in one order - rejects, entity
    records, events last (:meth:`write_batch`). Each store says how it tells a conflict, appends records and merges
    entity records."""

    attempts: int
    backoff: float
    _sleep: Callable[[float], None]
    #: The longest pause between two tries of a write (seconds).
    BACKOFF_CAP: ClassVar[float] = 5.0

    def ensure(self) -> None:
        raise NotImplementedError

    def _is_conflict(self, exc: BaseException, creating: bool) -> bool:
        """``exc`` is a write conflict with another writer (retried); ``creating``: the write creates a table."""
        raise NotImplementedError

    def _append_records(
        self, table: str, records: Sequence[Any], app_id: str | None, version: int | None
    ) -> None:
        """Append ``records`` to ``table`` (its :data:`~spark_sb.state.records.COLUMNS`, one row a record), once
        per (``app_id``, ``version``) when they are given."""
        raise NotImplementedError

    def _merge_entities(self, records: Sequence[EntityRecord]) -> None:
        raise NotImplementedError

    def _retry(self, what: str, fn: Callable[[], R], *, creating: bool = False) -> R:
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except Exception as exc:
                if attempt >= self.attempts or not self._is_conflict(exc, creating):
                    raise
                logging.getLogger(type(self).__module__).info(  # the store's own logger
                    "state table %s: conflict with another writer (%s), retry %d",
                    what,
                    type(exc).__name__,
                    attempt,
                )
                self._sleep(min(self.BACKOFF_CAP, self.backoff * 2 ** (attempt - 1)))
        raise AssertionError("unreachable")  # pragma: no cover

    def write_batch(self, sink_id: str, batch_id: int, writes: BatchWrites) -> None:
        self.ensure()
        if writes.rejects:
            self._append_records("rejects", writes.rejects, sink_id, batch_id)
        if writes.entities:
            self._merge_entities(writes.entities)
        self._append_records("events", writes.events, sink_id, batch_id)

    def append_events(self, events: Sequence[Event]) -> None:
        if events:
            self.ensure()
            self._append_records("events", events, None, None)

    def read_sessions(self, sink_id: str) -> list[HeldLine]:
        raise NotImplementedError(f"{type(self).__name__} does not keep held sessions (ordering)")

    def write_sessions(self, sink_id: str, lines: Sequence[HeldLine]) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not keep held sessions (ordering)")

    def read_acknowledgements(self, namespace: str, markers: Collection[str], since: datetime) -> set[str]:
        raise NotImplementedError(f"{type(self).__name__} does not read acknowledgements (ordering)")


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
        self._sessions: dict[str, tuple[HeldLine, ...]] = {}  # sink id -> its held lines

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

    def read_sessions(self, sink_id: str) -> list[HeldLine]:
        with self._lock:
            return list(self._sessions.get(sink_id, ()))

    def write_sessions(self, sink_id: str, lines: Sequence[HeldLine]) -> None:
        with self._lock:
            if lines:
                self._sessions[sink_id] = tuple(lines)
            else:
                self._sessions.pop(sink_id, None)

    def read_acknowledgements(self, namespace: str, markers: Collection[str], since: datetime) -> set[str]:
        wanted, spellings = set(markers), set(namespace_spellings(namespace))
        with self._lock:
            return {
                e.detail
                for e in self._events
                if e.event == ACKNOWLEDGED
                and (e.namespace or "").lower() in spellings
                and e.time >= since
                and e.detail in wanted
            }
