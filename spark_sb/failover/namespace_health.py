"""Whether a primary namespace is answering, shared by its entities' state machines (SPEC F1, F4, F7): a
namespace-wide fault, the timeouts of several entities with nothing heard between them, and the one probe of the
namespace at a time. Runs where the state machines run (executors' Python workers, the driver's syphon);
thread-safe; not picklable (a lock).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Protocol

from spark_sb.core.clock import Clock
from spark_sb.failover.decisions import probe_due
from spark_sb.failover.records import StateTransition


class Member(Protocol):
    """An entity's state machine as its namespace's health holds it
    (:class:`~spark_sb.failover.machine.EntityFailover`): told when the namespace's evidence changes."""

    def check(self) -> list[StateTransition]: ...

    def namespace_answered(self) -> list[StateTransition]: ...


#: Distinct entities whose attempts time out with nothing heard from the namespace in between: the namespace's fault
#: (SPEC F7), whatever the heartbeats could tell (a ``failover_interval`` below the heartbeat period).
SEVERAL_ENTITIES = 3


class NamespaceHealth:
    """Whether one primary namespace is answering, shared by its entities' state machines (SPEC F1, F4).

    A namespace-wide fault (:func:`namespace_wide`) opens a *fault* that started when the failing attempt started:
    every entity of the namespace that the process sends to is FAILING from that moment (its failover timer
    starts then, whichever entity met the fault), so a batch that touches E entities has all of them diverted
    within ``failover_interval`` of the fault, not E times it. Any answer of the namespace (a send or a probe
    that succeeded on any entity) closes the fault. While the fault is open and the entities are failed over, the
    namespace is probed once per ``ping_primary_interval`` (:meth:`claim_probe`), not once per entity; once it
    answers, every failed-over entity's probe is due at once (:meth:`answered` returns True to say so).

    O(1) per call; one per primary namespace in a :class:`FailoverRegistry`. Thread-safe; never takes an entity's
    lock (entities take this one inside theirs).
    """

    def __init__(self, namespace: str, *, ping_interval: float, clock: Clock) -> None:
        self.namespace = namespace
        self.ping_interval = ping_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._since: float | None = None  # monotonic start of the open fault
        self._since_wall: datetime | None = None
        self._error_class: str | None = None
        self._detail = ""
        self._last_probe: float | None = None
        self._probing = False
        self.epoch = 0  # bumped when a fault opens: entities join each fault once
        # Entity -> start of its attempt that timed out since the namespace last answered (SPEC F7, several
        # entities failing together). Bounded by the namespace's entities; cleared by any answer and by a fault.
        self._timeouts: dict[str, float] = {}
        # When the namespace last answered (monotonic; any entity's success, any probe's, a service error, a
        # connection heard during a failed attempt), on whatever connection: an attempt that was waiting then is
        # not "together with no success in between" (SPEC F7), whatever its own connection heard.
        self._answered_at: float | None = None
        # Entities known to exist for this sink (they accepted a message here, or the state table records them:
        # SPEC F9). Bounded by the namespace's entities. ``reached``: the namespace ever answered this sink.
        self._known: set[str] = set()
        self.reached = False
        self._entities: list[Member] = []  # bounded like the registry's entities (see FailoverRegistry)

    def add(self, entity: Member) -> None:
        with self._lock:
            self._entities.append(entity)

    def entities(self) -> list[Member]:
        """The namespace's entities (a copy)."""
        with self._lock:
            return list(self._entities)

    def fault(self) -> tuple[float, datetime, str | None, str, int] | None:
        """The open fault: (monotonic start, wall start, error class, detail, epoch), or None."""
        with self._lock:
            if self._since is None:
                return None
            assert self._since_wall is not None
            return self._since, self._since_wall, self._error_class, self._detail, self.epoch

    @property
    def faulted(self) -> bool:
        return self._since is not None

    def record_fault(self, error_class: str, detail: str, started: float) -> bool:
        """A namespace-wide failure of an attempt that started at ``started`` (monotonic). True when this opened a
        new fault (the caller moves the namespace's other entities to FAILING)."""
        with self._lock:
            self._error_class = error_class
            self._detail = detail
            if self._since is not None:
                return False
            now = self._clock.monotonic()
            began = min(started, now)
            self._since = began
            self._since_wall = self._clock.now() - timedelta(seconds=now - began)
            self._last_probe = None
            self._timeouts.clear()
            self.epoch += 1
            return True

    def answered(self) -> bool:
        """The namespace answered (a send or a probe succeeded, a service error came back, its connection was heard
        during a failed attempt: SPEC F7). True when that closed an open fault."""
        self._answered_at = self._clock.monotonic()  # one store, no lock (read by answered_since)
        if self._since is None:  # the hot path: no lock while healthy
            if self._timeouts:
                with self._lock:
                    self._timeouts.clear()
            return False
        with self._lock:
            self._timeouts.clear()
            if self._since is None:
                return False
            self._since = None
            self._since_wall = None
            self._last_probe = None
            self._probing = False
            return True

    def mark_known(self, entities: Iterable[str], *, reached: bool = False) -> None:
        """``entities`` exist for this sink (the state table records them); ``reached``: the namespace answered
        this sink before (SPEC F9)."""
        with self._lock:
            self._known.update(entities)
            self.reached = self.reached or reached

    def is_known(self, entity: str) -> bool:
        with self._lock:
            return entity in self._known

    def entity_timed_out(self, entity: str, started: float, silent_since_first: bool) -> bool:
        """An attempt on ``entity`` that started at ``started`` (monotonic) timed out, and its connection was heard
        recently enough that the timeout alone is the entity's (SPEC F7). True when it makes
        :data:`SEVERAL_ENTITIES` distinct entities that timed out since the namespace last answered and
        ``silent_since_first`` (the caller saw nothing from the namespace since the first of them started): then
        the namespace is at fault, the caller records a namespace-wide failure."""
        with self._lock:
            if self._since is not None:
                return False
            first = self._timeouts.get(entity)
            self._timeouts[entity] = started if first is None else min(first, started)
            return len(self._timeouts) >= SEVERAL_ENTITIES and silent_since_first

    def answered_since(self, started: float) -> bool:
        """Did the namespace answer (:meth:`answered`: any entity's success or probe, a service error, a connection
        heard during a failed attempt), on any connection, after ``started`` (monotonic)? Then an attempt that
        started at ``started`` and timed out failed alone: the namespace was answering meanwhile (SPEC F7)."""
        answered_at = self._answered_at
        return answered_at is not None and started < answered_at

    def first_timeout(self) -> float | None:
        """The start of the earliest attempt that timed out since the namespace last answered (None if none)."""
        with self._lock:
            return min(self._timeouts.values()) if self._timeouts else None

    def claim_probe(self) -> bool | None:
        """While a fault is open: True once per ``ping_primary_interval`` for the whole namespace (the caller
        probes one entity for the namespace), False otherwise. None when no fault is open (entities probe on their
        own schedule)."""
        with self._lock:
            if self._since is None:
                return None
            now = self._clock.monotonic()
            if self._probing:
                return False
            if self._last_probe is not None and not probe_due(self._last_probe, now, self.ping_interval):
                return False
            self._last_probe = now
            self._probing = True
            return True

    def probe_done(self) -> None:
        """The namespace probe claimed with :meth:`claim_probe` finished (whatever its result)."""
        with self._lock:
            self._probing = False

    def next_probe_in(self) -> float | None:
        """Seconds until the namespace's next probe is due while a fault is open (None otherwise)."""
        with self._lock:
            if self._since is None:
                return None
            if self._last_probe is None:
                return 0.0
            return max(0.0, self._last_probe + self.ping_interval - self._clock.monotonic())
