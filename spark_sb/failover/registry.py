"""The process-level failover registry: entity states and the backlog rotation shared by every sender of one
process (an executor's Python worker; SPEC B4, B5), and the held sessions of each primary namespace
(``ordering``, :mod:`spark_sb.failover.ordering`): in a plain application that runs a paired sender and a syphon,
the syphon's acknowledgements reach the senders here. Bounded by the (namespace, entity) pairs the process sends
to, and the held sessions (each released when drained)."""

from __future__ import annotations

import threading

from spark_sb.core.clock import Clock, SystemClock
from spark_sb.failover.machine import EntityFailover
from spark_sb.failover.namespace_health import NamespaceHealth
from spark_sb.failover.ordering import SessionBook
from spark_sb.failover.records import EntityStatus
from spark_sb.failover.rotation import BacklogRotation


class FailoverRegistry:
    """Entity states and the backlog rotation shared by every sender of one process (B4, B5)."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or SystemClock()
        self.rotation = BacklogRotation(self.clock)
        self._lock = threading.Lock()
        # Bounded by the (namespace, entity) pairs this process sends to; one health per primary namespace.
        self._entities: dict[tuple[str, str], EntityFailover] = {}
        self._health: dict[str, NamespaceHealth] = {}
        self._sessions: dict[str, SessionBook] = {}  # one per primary namespace

    def entity(
        self, namespace: str, entity: str, *, failover_interval: float, ping_interval: float
    ) -> EntityFailover:
        """The shared state of ``entity`` in the primary ``namespace`` (created HEALTHY on first use)."""
        key = (namespace, entity)
        with self._lock:
            found = self._entities.get(key)
            if found is None:
                health = self._health_locked(namespace, ping_interval)
                found = EntityFailover(
                    entity,
                    failover_interval=failover_interval,
                    ping_interval=ping_interval,
                    clock=self.clock,
                    namespace=namespace,
                    health=health,
                )
                health.add(found)
                self._entities[key] = found
            return found

    def health(self, namespace: str, *, ping_interval: float) -> NamespaceHealth:
        """The namespace-wide evidence of the primary ``namespace`` (created on first use)."""
        with self._lock:
            return self._health_locked(namespace, ping_interval)

    def _health_locked(self, namespace: str, ping_interval: float) -> NamespaceHealth:
        health = self._health.get(namespace)
        if health is None:
            health = self._health[namespace] = NamespaceHealth(
                namespace, ping_interval=ping_interval, clock=self.clock
            )
        return health

    def sessions(self, namespace: str) -> SessionBook:
        """The held sessions of the primary ``namespace`` (created empty on first use): the senders of the process
        route by it, a syphon of the process acknowledges markers to it."""
        with self._lock:
            book = self._sessions.get(namespace)
            if book is None:
                book = self._sessions[namespace] = SessionBook(clock=self.clock)
            return book

    def namespace(self, namespace: str) -> NamespaceHealth | None:
        """The namespace-wide evidence of the primary ``namespace`` (None before its first entity)."""
        with self._lock:
            return self._health.get(namespace)

    def statuses(self) -> list[EntityStatus]:
        with self._lock:
            entities = list(self._entities.values())
        return [e.status() for e in entities]

    def clear(self) -> None:
        with self._lock:
            self._entities.clear()
            self._health.clear()
            self._sessions.clear()
        self.rotation = BacklogRotation(self.clock)


_PROCESS_REGISTRY: FailoverRegistry | None = None
_PROCESS_LOCK = threading.Lock()


def process_registry() -> FailoverRegistry:
    """The registry of this process (an executor's Python worker), created on first use with the system clock."""
    global _PROCESS_REGISTRY
    with _PROCESS_LOCK:
        if _PROCESS_REGISTRY is None:
            _PROCESS_REGISTRY = FailoverRegistry(SystemClock())
        return _PROCESS_REGISTRY
