"""Order through failover across processes (``ordering: session`` / ``entity`` with the Spark sink, the data source
and the syphon job): the held lines of a sink, kept by its driver in the ``sessions`` state table, handed to its
tasks at the start of every micro-batch, and released by the syphon job's acknowledgements in the events table.

* :class:`SessionLedger` (driver): loads the lines, releases those whose markers were acknowledged, catches up with
  the ones the syphon job is right behind (R5), merges what the tasks marked.
* :class:`HeldLine`, :class:`LineMark` (picklable): the handoff to the tasks, and what a task reports.
* :func:`restore_book`, :func:`marks_of` (executor): a task's session book from the handoff, and its marks.
* :func:`session_rows`, :func:`lines_from_rows`: a sink's held lines as the ``sessions`` table's rows.

The rule is :mod:`spark_sb.failover.ordering`. Who does what, why no interleaving of micro-batches, tasks,
processes and syphon passes loses order, the data source's two-step release and what is not covered:
docs/design/sessions.md.

What bounds it: the held lines only, each with at most one pending marker per (backlog queue, task of its newest
marking batch) and the markers those replaced; a line leaves on release. Driver-side classes are not picklable and
not shared; :class:`HeldLine` and :class:`LineMark` are.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any

from spark_sb.core.clock import Clock
from spark_sb.core.hosts import name_and_port
from spark_sb.failover.ordering import Held, SessionBook

#: How much older than the oldest pending marker an acknowledgement row may be dated (the syphon's machine clock
#: against the driver's, which dates a marker after its batch): the ack read's time window starts this much earlier.
ACK_SKEW = timedelta(minutes=10)
#: A held line whose newest pending marker is this old gets a fresh one from the batch's first task even without
#: a message (:meth:`SessionLedger.stale`): an acknowledgement lost with a killed syphon run does not keep an idle
#: line held for ever.
REMARK_AFTER = timedelta(minutes=10)
#: R5, the driver's catch-up (:meth:`SessionLedger.catch_up`): the longest a micro-batch's start waits for the
#: newest markers of lines the syphon job is right behind (seconds), and how often it reads them again.
CATCH_UP_WAIT = 5.0
CATCH_UP_POLL = 0.5
#: The start of an acknowledgement read not bounded by time.
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: The marker a task's book carries for a handed line: never acknowledged, so a task never releases it.
HANDED = "handed"


@dataclass(frozen=True)
class PendingMarker:
    """A return marker issued for a held line and not yet acknowledged: its queue, id and when the driver recorded
    it (UTC). Picklable."""

    queue: str
    marker: str
    issued: datetime


@dataclass(frozen=True)
class HeldLine:
    """One held line of a sink (picklable: the handoff to the tasks, a ``sessions`` table row per pending marker).
    ``queue``: the backlog queue the tasks send it to; ``since``: when it was first held (UTC)."""

    entity: str
    session: str
    queue: str
    since: datetime
    pending: tuple[PendingMarker, ...] = ()
    #: R5 (the driver's catch-up): the markers the newest marks of the line replaced (bounded by one batch's markers
    #: of the line; not pending - in the ``sessions`` table, a row whose ``issued`` is null). The syphon job acknowledging one of them
    #: means it is right behind the line: :meth:`SessionLedger.catch_up` waits for the newest.
    replaced: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str]:
        return (self.entity, self.session)


@dataclass(frozen=True)
class LineMark:
    """What a task reports of a line it diverted: its queue and the newest marker the task issued for it (sent
    behind its messages there). Executor-built, picklable."""

    entity: str
    session: str
    queue: str
    marker: str


def namespace_spellings(namespace: str) -> tuple[str, ...]:
    """Every lower-case spelling of the primary ``namespace`` (``host[:port]``, as the sink or the syphon wrote it)
    that names the same namespace: with and without the service's default AMQP ports, a trailing dot or slash
    (SPEC O6: the sink and the syphon job may be configured with ``Contoso...`` and ``contoso...:5671/``).
    An acknowledgement read matches ``lower(namespace)`` against these. Pure."""
    name, port = name_and_port(namespace)
    ports = ("", ":5671", ":5672") if port in ("", "5671", "5672") else (f":{port}",)
    return tuple(sorted({f"{n}{p}{s}" for n in (name, name + ".") for p in ports for s in ("", "/")}))


# ------------------------------------------------------------------------------------------------ table rows
def session_rows(sink_id: str, lines: Iterable[HeldLine]) -> list[tuple[object, ...]]:
    """The ``sessions`` table's rows of a sink's held lines (:data:`~spark_sb.state.records.SESSIONS_DDL` order):
    one per pending marker (a line without one - none is - would get one row with a null marker) and one per
    replaced marker (:attr:`HeldLine.replaced`: its ``issued`` null, its queue the line's)."""
    rows: list[tuple[object, ...]] = []
    for line in lines:
        for p in line.pending or (None,):
            rows.append(
                (
                    sink_id,
                    line.entity,
                    line.session,
                    line.queue if p is None else p.queue,
                    line.since,
                    None if p is None else p.marker,
                    None if p is None else p.issued,
                )
            )
        rows.extend(
            (sink_id, line.entity, line.session, line.queue, line.since, m, None) for m in line.replaced
        )
    return rows


def lines_from_rows(rows: Iterable[Any], when: Callable[[Any], datetime]) -> list[HeldLine]:
    """Held lines from ``sessions`` rows (``entity``, ``session``, ``backlog_queue``, ``since``, ``marker``,
    ``issued``; ``when`` reads a timestamp column as the store returns it; a marker without ``issued`` is a replaced
    one). A line's queue is the queue of its newest pending marker (every task of a later batch sent it there)."""
    grouped: dict[tuple[str, str], list[Any]] = {}
    for row in rows:
        grouped.setdefault((str(row["entity"]), str(row["session"] or "")), []).append(row)
    lines = []
    for (entity, session), mine in sorted(grouped.items()):
        pending = tuple(
            sorted(
                (
                    PendingMarker(str(r["backlog_queue"]), str(r["marker"]), when(r["issued"]))
                    for r in mine
                    if r["marker"] is not None and r["issued"] is not None
                ),
                key=lambda p: (p.issued, p.queue),
            )
        )
        replaced = tuple(
            sorted(str(r["marker"]) for r in mine if r["marker"] is not None and r["issued"] is None)
        )
        # the queue the driver pinned it to before (SessionLedger.marked: its newest markers' first queue by name)
        newest = max((p.issued for p in pending), default=None)
        queue = (
            min(p.queue for p in pending if p.issued == newest)
            if pending
            else min(str(r["backlog_queue"]) for r in mine)
        )
        lines.append(HeldLine(entity, session, queue, min(when(r["since"]) for r in mine), pending, replaced))
    return lines


# ------------------------------------------------------------------------------------------------ the tasks
def restore_book(book: SessionBook, lines: Iterable[HeldLine]) -> None:
    """Executor, at the start of a task: make ``book`` (the process's) hold exactly ``lines``, each pinned to its
    queue with the :data:`HANDED` marker and one open call, the driver's (never closed: the task never releases a
    line, whatever is acknowledged in its process). What an
    earlier task of this worker left in the book is dropped: the driver's handoff is the whole truth."""
    book.replace({line.key: Held(line.queue, marker=HANDED, sending=1) for line in lines})


def marks_of(book: SessionBook) -> tuple[LineMark, ...]:
    """Executor, at the end of a task: the lines this task marked (their marker is not :data:`HANDED`)."""
    return tuple(
        LineMark(entity, session, record.queue, record.marker)
        for (entity, session), record in sorted(book.records().items())
        if record.marker is not None and record.marker != HANDED
    )


# ------------------------------------------------------------------------------------------------ the driver
@dataclass
class SessionLedger:
    """The held lines of one sink (driver; not picklable, not shared). See the module docstring for the rule."""

    #: Bounded by the held lines (each removed on release), each by its pending markers (see the module docstring).
    lines: dict[tuple[str, str], HeldLine] = field(default_factory=dict)
    loaded: bool = False
    #: The held lines whose replaced marker the last :meth:`release` found acknowledged: the syphon is right behind
    #: them, their newest marker next (:meth:`catch_up` waits for it). Bounded by ``lines``.
    catching: set[tuple[str, str]] = field(default_factory=set)

    def load(self, lines: Iterable[HeldLine]) -> None:
        """The lines read from the ``sessions`` table (a driver's first batch)."""
        self.lines = {line.key: line for line in lines}
        self.loaded = True

    def handoff(self) -> tuple[HeldLine, ...]:
        """The held lines, for the tasks (sorted: a stable handoff)."""
        return tuple(self.lines[k] for k in sorted(self.lines))

    def pending(self) -> set[str]:
        """Every pending marker id (the acknowledgements to look for)."""
        return {p.marker for line in self.lines.values() for p in line.pending}

    def oldest(self) -> datetime | None:
        """When the oldest pending marker was recorded (None: nothing pending)."""
        issued = [p.issued for line in self.lines.values() for p in line.pending]
        return min(issued) if issued else None

    def stale(self, now: datetime, after: timedelta = REMARK_AFTER) -> tuple[tuple[str, str], ...]:
        """The lines whose newest pending marker was recorded ``after`` or longer before ``now``: the batch's first
        task sends each a fresh marker (its acknowledgement may have been lost with a killed syphon run)."""
        return tuple(
            key
            for key, line in sorted(self.lines.items())
            if line.pending and max(p.issued for p in line.pending) <= now - after
        )

    def release(
        self, store: Any, namespace: str, sink_id: str, now: datetime | None = None
    ) -> list[HeldLine]:
        """Driver: load ``sink_id``'s held lines from ``store`` (a :class:`~spark_sb.state.store.StateStore`) unless
        loaded, read the acknowledgements of their pending markers in ``namespace`` - only while a marker is
        pending, not older than the oldest less :data:`ACK_SKEW` - and release the lines whose markers are all
        acknowledged (returned). The sink's batch start and the data source's plan and commit run this.
        ``now`` (UTC, the driver's clock): once the oldest pending marker is :data:`REMARK_AFTER` old the read is
        not bounded by time, so a syphon whose clock is more than ``ACK_SKEW`` behind still releases the line."""
        if not self.loaded:
            self.load(store.read_sessions(sink_id))
        self.catching = set()
        since = self._since(now)
        if since is None:
            return []
        replaced = {m for line in self.lines.values() for m in line.replaced}
        acks = set(store.read_acknowledgements(namespace, self.pending() | replaced, since))
        released = self.acknowledged(acks)
        self.catching = {key for key, line in self.lines.items() if acks.intersection(line.replaced)}
        return released

    def catch_up(
        self,
        store: Any,
        namespace: str,
        budget: float,
        clock: Clock,
        now: datetime | None = None,
        poll: float = CATCH_UP_POLL,
    ) -> list[HeldLine]:
        """R5, the driver's (after :meth:`release`): a line its stream keeps feeding is marked again by every batch,
        and a syphon job that acknowledges each marker just after the next batch started never releases it. For the
        lines :attr:`catching` (the syphon passed the marker before their newest), read their newest markers'
        acknowledgements again every ``poll`` seconds for up to ``budget`` seconds of ``clock``; the lines
        released (returned) go to the primary in this batch."""
        released: list[HeldLine] = []
        start = clock.monotonic()
        while self.catching and clock.monotonic() - start < budget:
            clock.sleep(min(poll, budget - (clock.monotonic() - start)))
            since = self._since(now)
            if since is None:
                break
            markers = {
                p.marker for key in self.catching if key in self.lines for p in self.lines[key].pending
            }
            got = self.acknowledged(set(store.read_acknowledgements(namespace, markers, since)))
            released.extend(got)
            self.catching -= {line.key for line in got}
        return released

    def _since(self, now: datetime | None) -> datetime | None:
        """Where an acknowledgement read starts (None: nothing pending)."""
        oldest = self.oldest()
        if oldest is None:
            return None
        if now is not None and oldest <= now - REMARK_AFTER:
            return EPOCH
        return oldest - ACK_SKEW

    def acknowledged(self, markers: Collection[str]) -> list[HeldLine]:
        """Drop the acknowledged ``markers``; release (remove and return) every line left with none pending."""
        released: list[HeldLine] = []
        for key, line in list(self.lines.items()):
            left = tuple(p for p in line.pending if p.marker not in markers)
            if left == line.pending:
                continue
            if left:
                self.lines[key] = replace(line, pending=left)
            else:
                del self.lines[key]
                released.append(line)
        return released

    def marked(self, marks: Sequence[LineMark], now: datetime) -> list[HeldLine]:
        """Merge one batch's marks (every task that returned): per line and queue, this batch's markers replace the
        older pending ones (they are behind them in that queue); a line not held before is held from ``now``,
        pinned to its first queue by name. Returns the lines held for the first time."""
        by_line: dict[tuple[str, str], list[LineMark]] = {}
        for mark in marks:
            by_line.setdefault((mark.entity, mark.session), []).append(mark)
        new: list[HeldLine] = []
        for key, mine in by_line.items():
            queues = {m.queue for m in mine}
            line = self.lines.get(key)
            kept = tuple(p for p in line.pending if p.queue not in queues) if line is not None else ()
            fresh = tuple(PendingMarker(m.queue, m.marker, now) for m in mine)
            if line is None:
                line = HeldLine(key[0], key[1], min(queues), now, fresh)
                new.append(line)
            else:
                replaced = tuple(sorted(p.marker for p in line.pending if p.queue in queues))
                line = replace(line, pending=kept + fresh, replaced=replaced or line.replaced)
            self.lines[key] = line
        return new

    def __len__(self) -> int:
        return len(self.lines)
