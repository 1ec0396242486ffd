"""Order through failover (``ordering: session`` / ``entity``, SPEC O1-O4): the rule that keeps a session's messages
in the order the sink was given them, outage or not - R1 pin, R2 mark, R3 return, R4 no hop, R5 catch up - kept
by :class:`SessionBook` (one per process, in the failover registry), with :func:`order_key` (a message's line),
:func:`pinned_queue` (a held line's backlog queue) and :func:`return_marker` (the marker behind its messages).

The rule, its terms, why no interleaving loses order, what is not covered, and which tests show it:
docs/design/ordering.md. The sender and the syphon carry it out (:mod:`spark_sb.sender.diverter`,
:mod:`spark_sb.syphon.lines`); across processes - the Spark sink, the data source and the syphon job - it is
:mod:`spark_sb.state.sessions`.

What bounds it: the book holds held sessions only (those with messages in the backlog), each removed on release; a
record counts its open calls, not their messages' ids. Runs anywhere (the sender's thread, the syphon);
thread-safe; the records are picklable.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from spark_sb.core.clock import Clock
from spark_sb.core.errors import CONNECTION, SendError
from spark_sb.message.backlog import RETURN_MARKER, ReturnMarker
from spark_sb.message.outbound import OutboundMessage

#: The ``ordering`` values (the config key; :data:`spark_sb.config.settings.ORDERINGS`).
NONE, SESSION, ENTITY = "none", "session", "entity"
#: The session part of an entity's key with ``ordering: entity`` (every message of the entity is one line).
WHOLE_ENTITY = ""


def order_key(ordering: str, session_id: str | None) -> str | None:
    """The line a message of an entity keeps its order in: its session id (``session``; a message without one
    keeps none), :data:`WHOLE_ENTITY` (``entity``), or None (``none``: no order kept)."""
    if ordering == SESSION:
        return session_id
    if ordering == ENTITY:
        return WHOLE_ENTITY
    return None


def return_marker(entity: str, key: str, marker: str) -> ReturnMarker:
    """R2: the return marker ``marker`` of the line (``entity``, ``key``), an original message that the backlog
    translation carries like any other (its session id is the key; none for a whole entity). Its property,
    :data:`~spark_sb.message.backlog.RETURN_MARKER`, is reserved: a user message carrying it is rejected."""
    return ReturnMarker(
        body=b"",
        entity=entity,
        message_id=f"spark-sb-return-{marker}",
        session_id=key or None,
        properties={RETURN_MARKER: marker},
    )


def marker_of(message: OutboundMessage) -> str | None:
    """The marker id of a return marker (original or restored from the backlog), None for any other message."""
    value = message.properties.get(RETURN_MARKER) if message.properties else None
    return None if value is None else str(value)


@dataclass(frozen=True)
class Held:
    """A held session's record (picklable: it travels in the sink's handoff to its tasks).

    ``queue``: the backlog queue it is pinned to; ``marker``: the newest return marker issued for it (R2);
    ``sending``: its messages diverted by calls that have not closed yet (each close issues a newer marker);
    ``acknowledged``: the syphon passed ``marker`` (an older marker's acknowledgement is not recorded)."""

    queue: str
    marker: str | None = None
    sending: int = 0
    acknowledged: str | None = None

    @property
    def drained(self) -> bool:
        """R3: everything this session sent to the backlog is in the primary: no call is still diverting it, and
        the syphon passed the marker issued after the last call that did closed."""
        return self.marker is not None and self.acknowledged == self.marker and self.sending == 0


def pinned_queue(session: str, queues: Sequence[str], available: Callable[[str], bool]) -> str | None:
    """R1: the queue a session is pinned to when it is first held: the first available queue of the rotation that
    starts at the session id's hash (the same for every process), or None when none is available."""
    if not queues:
        return None
    start = int.from_bytes(hashlib.sha256(session.encode()).digest()[:8], "big") % len(queues)
    for i in range(len(queues)):
        queue = queues[(start + i) % len(queues)]
        if available(queue):
            return queue
    return None


class QueueUnavailableError(SendError):
    """R4: a held session's queue does not answer; the session's messages are not sent anywhere else (the call
    fails for that session, after the other sessions' messages went out)."""

    error_class = CONNECTION


#: R5: the longest a send call waits for held lines' acknowledgements, all its lines together (O3's "+ 1 s").
RETURN_WAIT = 1.0
#: R5: a call waits only while acknowledgements reach the book: one arrived within this many seconds.
ACKS_LIVE = 10.0
#: R5: how often a waiting call looks at the record again (seconds).
RETURN_POLL = 0.01


class Acknowledgements(Protocol):
    """Where the syphon records that it passed a return marker (R3 reads it). Setting (b), one process: the
    process registry's :class:`SessionBook`; setting (a), the Spark sink and the syphon job: the events table."""

    def acknowledged(self, entity: str, session: str, marker: str) -> None: ...


@dataclass
class SessionBook:
    """The held sessions of one primary namespace (R1-R4). Thread-safe: every method is one step under the lock,
    so two threads sending one session serialise on its record."""

    #: Bounded by the held sessions (those with messages in the backlog), each removed on release.
    _held: dict[tuple[str, str], Held] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    #: R5: the clock of the process's registry (None: no call waits); the monotonic time of the last acknowledgement.
    clock: Clock | None = None
    _acked_at: float | None = None

    @property
    def empty(self) -> bool:
        """No session is held (read without the lock: the healthy path's only cost; a session another thread is
        holding at this very moment is one whose order against this thread's messages nothing defines)."""
        return not self._held

    def held(self, entity: str, session: str) -> Held | None:
        with self._lock:
            return self._held.get((entity, session))

    def route(self, entity: str, session: str, entity_failed_over: bool) -> str | None:
        """Where the session's next message goes: None for the primary, else the backlog queue it is pinned to
        (R3: a held session is released only when drained and its entity is not failed over)."""
        with self._lock:
            record = self._held.get((entity, session))
            if record is None:
                return None
            if record.drained and not entity_failed_over:
                del self._held[(entity, session)]
                return None
            return record.queue

    def diverted(
        self,
        entity: str,
        session: str,
        queues: Sequence[str],
        available: Callable[[str], bool],
        retry: Callable[[str], bool] | None = None,
    ) -> str:
        """One message of the session goes to the backlog, in a call that will :meth:`close_call` it: the queue
        (R1: pinned at first, by the session id's hash - the entity's name with ``ordering: entity``; R4: raises
        :class:`QueueUnavailableError` when the pinned queue is not available - unless ``retry(queue)`` grants a
        held line's pulled queue a try, SPEC O8)."""
        with self._lock:
            record = self._held.get((entity, session))
            if record is None:
                queue = pinned_queue(session or entity, queues, available)
                if queue is None:
                    raise QueueUnavailableError(
                        f"no backlog queue is available for session {session!r} (entity {entity!r})"
                    )
                self._held[(entity, session)] = Held(queue, sending=1)
                return queue
            if not available(record.queue) and (retry is None or not retry(record.queue)):
                raise QueueUnavailableError(
                    f"the backlog queue {record.queue!r} of session {session!r} (entity {entity!r}) is unavailable; "
                    "with ordering: session its messages wait for it rather than go to another queue"
                )
            self._held[(entity, session)] = Held(
                record.queue, record.marker, record.sending + 1, record.acknowledged
            )
            return record.queue

    def close_call(self, entity: str, session: str, diverted: int) -> str | None:
        """R2: a call that diverted ``diverted`` messages of this session is over (its sends confirmed, or failed
        and abandoned): a fresh marker id, newer than every marker issued before, to send behind them - or None
        when the session is not held. Called once per call and session, failed calls too (else the session would
        wait for a call that is gone)."""
        with self._lock:
            record = self._held.get((entity, session))
            if record is None:
                return None
            marker = uuid.uuid4().hex
            self._held[(entity, session)] = Held(
                record.queue, marker, max(0, record.sending - diverted), record.acknowledged
            )
            return marker

    def acknowledged(self, entity: str, session: str, marker: str) -> None:
        """The syphon passed ``marker``: every message of the session before it is in the primary. Recorded only
        for the newest marker issued (an older one says nothing about the calls that closed after it)."""
        with self._lock:
            if self.clock is not None:
                self._acked_at = self.clock.monotonic()
            record = self._held.get((entity, session))
            if record is not None and record.marker == marker:
                self._held[(entity, session)] = Held(record.queue, record.marker, record.sending, marker)

    def await_return(self, entity: str, session: str, timeout: float) -> float:
        """R5: wait up to ``timeout`` seconds for a held line whose entity is back to be drained - when no call is
        diverting it (``sending`` 0), its newest marker is issued and not acknowledged yet, and acknowledgements
        reach the book (one within :data:`ACKS_LIVE`). Returns the seconds waited (0: no wait was worth it); the
        caller routes again (:meth:`route` decides). Waits on the book's clock (a fake clock's sleep moves it)."""
        clock = self.clock
        if clock is None or timeout <= 0:
            return 0.0
        start = clock.monotonic()
        while True:
            with self._lock:
                record = self._held.get((entity, session))
                waiting = (
                    record is not None
                    and record.sending == 0
                    and record.marker is not None
                    and record.acknowledged != record.marker
                    and self._acked_at is not None
                    and clock.monotonic() - self._acked_at <= ACKS_LIVE
                )
            waited = clock.monotonic() - start
            if not waiting or waited >= timeout:
                return waited
            clock.sleep(min(RETURN_POLL, timeout - waited))

    def replace(self, records: Mapping[tuple[str, str], Held]) -> None:
        """Hold exactly ``records`` ((entity, session) -> record): the Spark sink's tasks start from the driver's
        handoff (:func:`spark_sb.state.sessions.restore_book`), whatever an earlier task of the process left."""
        with self._lock:
            self._held = dict(records)

    def records(self) -> dict[tuple[str, str], Held]:
        """A copy of every held record ((entity, session) -> record)."""
        with self._lock:
            return dict(self._held)

    def restore(self, entity: str, session: str, record: Held) -> None:
        """Take a record from elsewhere (the sink's handoff, the state tables): another process's sends."""
        with self._lock:
            self._held[(entity, session)] = record

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)
