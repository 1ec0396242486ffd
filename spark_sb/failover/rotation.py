"""The backlog rotation (queues pulled after a failure, shared per process) and one sender's backlog choice (SPEC
B4, B5). Thread-safe; runs where the senders run (executors' Python workers)."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Sequence
from datetime import timedelta

from spark_sb.core.clock import Clock
from spark_sb.failover.decisions import choose_random, choose_session_affine
from spark_sb.failover.records import BacklogPull, redacted

_LOGGER = logging.getLogger(__name__)


class BacklogRotation:
    """Which backlog queues are pulled from the rotation, shared by every sender of the process (B5).

    Keyed by (secondary namespace, queue). A pulled queue returns after its ``until`` (monotonic seconds) or
    when :meth:`mark_good` is called. Thread-safe.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._pulled: dict[tuple[str, str], tuple[float, BacklogPull]] = {}

    def pull(
        self, namespace: str, queue: str, until: float, error_class: str | None = None, detail: str = ""
    ) -> BacklogPull:
        """Pull ``queue`` until the monotonic time ``until``; returns the record."""
        now = self._clock.monotonic()
        wall = self._clock.now()
        record = BacklogPull(
            namespace=namespace,
            queue=queue,
            at=wall,
            until=wall + timedelta(seconds=max(0.0, until - now)),
            error_class=error_class,
            detail=redacted(detail),
        )
        with self._lock:
            self._pulled[(namespace, queue)] = (until, record)
        _LOGGER.warning(
            "backlog queue %r pulled from the rotation until %s (%s)",
            queue,
            record.until.isoformat(),
            error_class or "error",
        )
        return record

    def mark_good(self, namespace: str, queue: str) -> None:
        """Return ``queue`` to the rotation now."""
        with self._lock:
            self._pulled.pop((namespace, queue), None)

    def is_available(self, namespace: str, queue: str) -> bool:
        with self._lock:
            return self._available_locked(namespace, queue, self._clock.monotonic())

    def available(self, namespace: str, queues: Sequence[str]) -> list[str]:
        """The queues of ``queues`` in the rotation, in their given order."""
        now = self._clock.monotonic()
        with self._lock:
            return [q for q in queues if self._available_locked(namespace, q, now)]

    def pulled(self, namespace: str | None = None) -> list[BacklogPull]:
        """The currently pulled queues (expired pulls are dropped)."""
        now = self._clock.monotonic()
        with self._lock:
            for key in [k for k, (until, _) in self._pulled.items() if until <= now]:
                del self._pulled[key]
            return [rec for (ns, _), (_, rec) in self._pulled.items() if namespace is None or ns == namespace]

    def _available_locked(self, namespace: str, queue: str, now: float) -> bool:
        entry = self._pulled.get((namespace, queue))
        if entry is None:
            return True
        if entry[0] <= now:
            del self._pulled[(namespace, queue)]
            return True
        return False


class BacklogChooser:
    """The backlog queue choice of ONE sender (B4/B5): random and sticky per entity until the queue is pulled,
    or session-affine (same session id -> same queue while it is in the rotation). Not shared."""

    def __init__(
        self,
        queues: Sequence[str],
        rotation: BacklogRotation,
        namespace: str,
        *,
        selection: str = "random",
        rng: random.Random | None = None,
    ) -> None:
        if selection not in ("random", "session-affine"):
            raise ValueError(
                f"backlog_selection must be one of 'random', 'session-affine', not {selection!r}"
            )
        self.queues = list(queues)
        self.rotation = rotation
        self.namespace = namespace
        self.selection = selection
        self._rng = rng or random.Random()
        self._sticky: dict[str, str] = {}

    def choose(self, entity: str, session_id: str | None = None) -> str | None:
        """The queue to divert a message of ``entity`` to, or None when every queue is pulled. Called for every
        diverted message: the sticky choice is checked alone, the whole rotation only when it must change."""
        affine = self.selection == "session-affine" and session_id is not None
        current = None if affine else self._sticky.get(entity)
        if current is not None and self.rotation.is_available(self.namespace, current):
            return current
        available = self.rotation.available(self.namespace, self.queues)
        if not available:
            return None
        if affine:
            assert session_id is not None
            return choose_session_affine(available, session_id)
        chosen = choose_random(available, self._rng)
        assert chosen is not None
        self._sticky[entity] = chosen
        return chosen

    def available(self) -> list[str]:
        return self.rotation.available(self.namespace, self.queues)
