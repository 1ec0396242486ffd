"""Order through failover across processes (``ordering: session`` / ``entity`` with the Spark sink and the syphon job,
issue 31 setting a): the held sessions of a sink, kept by its driver in the ``sessions`` state table, handed to its
tasks at the start of every micro-batch, and released by the syphon job's acknowledgements in the events table.
The rule itself (R1 pin, R2 mark, R3 return, R4 no hop) and its one-process argument are
:mod:`spark_sb.failover.ordering`; this module owns how the two sides of setting (a) carry it out, and the argument
why no interleaving of micro-batches, tasks, processes and syphon passes loses order.

Who does what:

* **The sink's driver** (:class:`SessionLedger`, in :class:`~spark_sb.spark.sink.ServiceBusSink`) holds the sink's
  held lines (a *line*: (entity, session id), or (entity, ``""``) with ``ordering: entity``), each with its pinned
  backlog queue and its *pending markers*: the return markers of the newest micro-batch that marked the line, per
  backlog queue. At the start of a micro-batch, when some line is held, it reads the acknowledgements of its
  pending markers from the events table (:meth:`~spark_sb.state.store.StateStore.read_acknowledgements`: rows
  ``event = 'acknowledged'``, ``detail`` = the marker id, not older than the oldest pending marker less
  :data:`ACK_SKEW`) and releases every line whose pending markers are all acknowledged. It hands the others to the
  tasks (:class:`HeldLine`, picklable). After the batch it merges what the tasks report (:class:`LineMark`: a line
  a task diverted, its queue and the newest marker the task issued for it) and, when anything changed, writes its
  held lines to the ``sessions`` table (:meth:`~spark_sb.state.store.StateStore.write_sessions`) **before** the
  ``foreachBatch`` function returns - whatever ``state_writes`` says -, so a restarted driver reads them
  (:meth:`~spark_sb.state.store.StateStore.read_sessions`) before its first batch sends anything.
* **The tasks** (:func:`~spark_sb.spark.partition.send_partition`, executors) replace their process's
  :class:`~spark_sb.failover.ordering.SessionBook` with the handed lines (:func:`restore_book`: each held, pinned to
  its queue, with an open call that never closes - a task never releases a line), send, and report the lines
  they marked (:func:`marks_of`).
* **The syphon job** drains each backlog queue from one task per micro-batch, in queue order per line
  (:mod:`spark_sb.syphon.lines`); a marker it passes becomes an ``acknowledged`` event, which its ``foreachBatch``
  function writes after the micro-batch (:mod:`spark_sb.spark.syphon_job`). It starts draining one lock duration
  after it starts (a killed run's locked messages are back in the queue, in order, by then).

Catching up (R5 of :mod:`spark_sb.failover.ordering`, the driver's form): a line its stream keeps feeding is marked
again by every micro-batch, and a syphon job whose acknowledgement of a marker lands just after the next batch
started never releases it (the simulation's busy tail found this). A line remembers the markers its newest marks
replaced (:attr:`HeldLine.replaced`, kept in the ``sessions`` table with it); when the syphon job has acknowledged
one of them, the syphon is right behind the line and its newest marker is next, so the batch start reads that
marker's acknowledgement again for up to :data:`CATCH_UP_WAIT` (:meth:`SessionLedger.catch_up`) and, once it
lands, sends the line to the primary in that batch. Order holds as in (2) below: the line is released only once its
newest marker is acknowledged. ``format('servicebus')`` catches up at its plan
(:func:`~spark_sb.spark.datasource.plan_lines`), before its tasks; its commit releases again from the table (what
it reads then is a superset) and never waits.

Why the sessions table (and not the events table) holds the held lines: the driver must know them at the start of
every batch and after a restart. Rebuilt from events it would read back to the oldest line still held - hours of
events after a long outage -; the ``sessions`` table holds one row per (held line, pending marker), rewritten as a
whole for the sink (``replaceWhere sink_id = ...``, one commit) only when its held lines changed: its size and the
cost of reading it are bounded by the held lines. The acknowledgements stay in the events table because the
syphon job already writes there once per micro-batch, and the read is bounded by time (the oldest pending marker):
while no line is held nothing is read (the healthy path costs nothing), and a line is held from its first
diversion until the syphon passed its newest marker.

Why no interleaving loses order (a line, two of its messages a before b in the sink's order: one task's row order,
or a's batch before b's - a micro-batch starts after every task of the one before returned):

(1) Both direct, or both in one task: :mod:`spark_sb.failover.ordering` (one process, one book; the task's
book starts with every line the driver holds, so a held line stays on its queue for the whole task - R3 never
releases in a task).
(2) a in the backlog (batch N), b in a later batch N' > N. The task that diverted a reported a's line with the
newest marker m it issued (after a's send was confirmed, behind a, in the line's queue - R1: the task pinned a new
line by the same hash and availability as :func:`~spark_sb.failover.ordering.pinned_queue`, a held one to the queue
handed to it). The driver merged m into the line's pending markers before batch N returned, and wrote it to the
sessions table before the ``foreachBatch`` function returned. Every later batch's handoff holds the line until every
pending marker was acknowledged; a later batch that marks the line again replaces its pending marker of that queue
by a newer one, behind the older in the same queue. So when b is routed to the primary, the syphon acknowledged a
marker behind a in a's queue: the acknowledgement is written after the micro-batch in which the syphon passed it,
which moved every earlier message of the line in that queue into the primary first (one task per queue, queue
order per line) - a among them. The read that saw the acknowledgement is in batch N'' <= N', before b is sent.
Two tasks of batch N that diverted one line (rows not partitioned by session id - the user's job, README) pinned it
to one queue or, when availability changed between them, two: the line's pending markers keep one per queue and
task, all of which must be acknowledged.
(3) A syphon pass that straddles the driver's read changes nothing: an acknowledgement is read only once it is in
the table, after the moves. A late backlog send: every task of batch N returned before batch N+1's read; a failed
task attempt's diversions are re-sent by its retry with the same message ids (a direct copy that the primary's
duplicate detection keeps first; the syphon's later copy is dropped as a duplicate).
(4) A driver restart: the held lines of every batch that returned are in the sessions table (written before it
returned); a batch that did not return is replayed whole (same ids), so what its first run diverted is sent again
behind the lines the table holds. A replayed batch the sink already committed is skipped.
(5) A syphon job killed mid-drain: the messages its tasks had locked come back to the queue after their lock
duration, before anything behind them; the restarted job drains nothing before that (the planner waits one lock
duration). A marker passed but whose acknowledgement was not written (the job died between the two) leaves its line
held: it never releases early - the line's next micro-batch that marks it issues a newer marker, whose
acknowledgement releases it; a line with nothing more to send gets one from the first task of a batch once its
newest marker is :data:`REMARK_AFTER` old (:meth:`SessionLedger.stale`,
:meth:`~spark_sb.sender.paired.PairedSender.remark`), sent behind everything the line has in its queue.

(6) One syphon task per queue per micro-batch, and no message of a queue locked across micro-batches: a task
abandons what it holds when it ends (back in the queue before anything behind it), and the job refuses
``syphon.prefetch`` above 0 with ordering (a pooled syphon's prefetched messages would stay locked in its worker
while the next micro-batch drains the queue from another).

The data source (``format("servicebus")``, :mod:`spark_sb.spark.datasource`). Spark runs its driver side in two
writer objects per micro-batch, in processes of its own that keep nothing between micro-batches: the *plan* (read
before the writer is pickled to the tasks) and the *commit* (a second writer, after every task returned). Both
start from the ``sessions`` table (path tables, read and written with deltalake):

* The plan reads only: the held lines (nothing beyond a look for the table's log while it does not exist), the
  acknowledgements of their pending markers (only while a line is held), and hands the tasks the lines not all of
  whose pending markers are acknowledged, with the stale ones for the first task
  (:func:`~spark_sb.spark.datasource.plan_lines`).
* The commit reads the same held lines again - the table has not changed: only this sink's commits write its rows,
  and micro-batch N+1 is planned after N's commit returned - and the acknowledgements again, a superset of what the
  plan read (they are only appended, and the time window, from the oldest pending marker, is the same); it releases
  every line whose pending markers are all acknowledged, *then* merges the tasks' marks, and writes the ``sessions``
  table before the events (:meth:`SessionLedger.acknowledged`, then :meth:`SessionLedger.marked`, as the sink's next
  batch start and this batch's end would).

Why the split keeps order - the argument above, with batch N' releasing in two steps:
(7) A line the plan released (all its pending markers acknowledged when the plan read them): its rows in N' are
routed like any line not held, and (2) holds with the read in N''s plan, before b is sent. The commit releases it
too (a superset). If a task diverted it anyway (a worker whose entity was still failed over), the release comes
first and the task's mark makes it a new held line pinned to the queue its messages went to. Merging first would be
a hole: the line would keep its old queue, and the next batch would send to it while this batch's messages of the
line wait in another queue, drained independently (an R4 hop); releasing first closes it
(tests/unit/spark/test_datasource_ordering.py). A line the plan released by catching up (it waited for the newest
markers' acknowledgements) is the same case: the commit's read comes later and finds them.
(8) A line the plan handed: every task holds it for the whole task (R3 never releases in a task) and sends its rows
to its queue, behind its earlier messages, each task that sent some marking it with a fresh marker behind them
(R2). If the commit finds its older markers acknowledged, it releases the line and re-holds it at once by those marks
(fresh markers behind all it sent, in its queue): held until they are acknowledged, as with the sink (only the
events differ: this commit writes ``session_returned`` and ``session_held`` for the line, where the sink, which
merged before its next release, writes neither). If no task marked it, none of its messages
was sent in N', and its acknowledged markers are behind everything it sent before: it is drained, and released
(its next message goes to the primary from N'+1's plan on). Only a task that returned reports marks: a failed
attempt's diversions are (3).
(9) A replay that the plan finds committed sends nothing; its commit records the replay and leaves the table alone.
A commit that dies between its two writes left the ``sessions`` table written and the batch uncommitted: the replay
sends the batch again (same ids) behind the lines it holds, as (4).
Catalog tables (``state_table_prefix``) are refused with ordering: the commit has no Spark session, so it could
write them only through the spool and could not read the syphon job's acknowledgements, which are in the catalog
tables (:func:`~spark_sb.spark.partition.ordering_needs_path_tables`). A batch write (``df.write``) is refused too:
it records under a sink id of its own, so no later write would know the lines it left held.
What it costs while nothing is held: the plan and the commit each look for the ``sessions`` table's log and, once
it exists, read the sink's rows (none: a Delta read of its log and no data file); nothing is written.

Not covered (as in setting b): a backlog send abandoned at its deadline whose bytes reach the service after a later
marker (a duplicate the primary drops); a failed sink task attempt's diversions that the syphon moves after the
primary's duplicate detection window (the retry sent the same messages directly; past the window the late copy is
delivered again, out of place). Two syphon jobs, and a syphon task retried while its dead attempt's locks are held,
are covered since issue 47: a second ordered job is refused; every worker proves a line's head from the queue.

What bounds it: the ledger holds the held lines only, each with at most one pending marker per (backlog queue,
task of its newest marking batch) and the markers those replaced (as many); a line leaves on release. Driver-side classes are not picklable and not shared;
:class:`HeldLine` and :class:`LineMark` are (they travel in the handoff and in the tasks' results).
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
