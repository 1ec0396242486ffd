"""A primary entity's duplicate detection, as its admin endpoint reports it (SPEC B14, the exactly-once horizon).

Exactly-once into the primary rests on duplicate detection: a send that failed ambiguously (it may have landed) is
diverted, and the syphon's copy is dropped by the primary only within the entity's duplicate detection window.
:func:`read_duplicate_detection` asks the primary's admin endpoint (HTTPS, the ``Manage`` right) whether an entity
- a queue or a topic - has it on and for how long, and :class:`DuplicateDetection` says what that means against
``exactly_once_horizon`` (:meth:`~DuplicateDetection.warning`); :class:`PrimaryWindows` keeps the answers for a
syphon, which asks only for the entities of the ambiguous messages it moves (rare: no cost on its healthy path).

Where it runs: ``spark-sb provision`` and ``status`` (a workstation, the driver) and the syphon's process (an
executor in the syphon job). Every call is bounded (``timeout`` for the connection and for the answer, azure-core's
retries off); an answer that cannot be read is a value (``error``), never an exception.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spark_sb.core.clock import Clock
from spark_sb.wire.admin_api import NO_SDK_RETRY, close_quietly, describe_admin_error

__all__ = ["DuplicateDetection", "PrimaryWindows", "read_duplicate_detection", "span"]

#: How long a syphon keeps an entity's answer (seconds) before it asks again.
WINDOWS_FOR = 600.0


def span(seconds: float) -> str:
    """A duration for people: ``45 s``, ``10 min``, ``1 h``, ``7 d`` (the largest unit it is a whole number of)."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and float(seconds / size).is_integer():
            return f"{int(seconds // size)} {unit}"
    return f"{seconds:g} s"


@dataclass(frozen=True)
class DuplicateDetection:
    """One primary entity's duplicate detection: ``kind`` (``queue`` / ``topic``), ``enabled``, ``window``
    (seconds); or ``error`` (it could not be read: the other fields None). ``max_message_kb``: the entity's message
    size limit from the same answer (SPEC B13: what its backlog queues must take; None if not reported)."""

    entity: str
    kind: str | None = None
    enabled: bool | None = None
    window: float | None = None
    error: str | None = None
    max_message_kb: int | None = None

    @property
    def drops_within(self) -> float | None:
        """Seconds after a send within which the entity drops a copy of its message: its window, 0 when duplicate
        detection is off, None when unknown."""
        if self.error is not None or self.enabled is None:
            return None
        return float(self.window or 0.0) if self.enabled else 0.0

    def describe(self) -> str:
        """``on, window 10 min`` / ``off`` / ``unknown (...)``."""
        if self.drops_within is None:
            return f"unknown ({self.error or 'not reported'})"
        return f"on, window {span(self.drops_within)}" if self.enabled else "off"

    def warning(self, horizon: float) -> str | None:
        """What ``provision`` and ``status`` warn of (None: nothing): duplicate detection off, a window shorter
        than ``horizon`` (``exactly_once_horizon``, seconds), or an answer that could not be read."""
        within = self.drops_within
        if within is None:
            return (
                f"{self.entity}: duplicate detection could not be read ({self.error or 'not reported'}); "
                "whether an outage keeps it exactly-once is unknown"
            )
        if not self.enabled:
            return (
                f"{self.entity}: duplicate detection is off - a message diverted after an ambiguous send reaches it "
                "twice if that send had landed"
            )
        if within < horizon:
            return (
                f"{self.entity}: duplicate detection window {span(within)} is shorter than exactly_once_horizon "
                f"{span(horizon)} - a message diverted after an ambiguous send that returns later than "
                f"{span(within)} reaches it twice if that send had landed"
            )
        return None

    def to_json(self, horizon: float) -> dict[str, Any]:
        return {
            "entity": self.entity,
            "kind": self.kind,
            "duplicate_detection": self.enabled,
            "window_seconds": self.drops_within if self.enabled else None,
            "error": self.error,
            "warning": self.warning(horizon),
        }


def read_duplicate_detection(
    admin: Any, entity: str, *, timeout: float, shown: str = ""
) -> DuplicateDetection:
    """``entity``'s duplicate detection from the admin client ``admin`` (of the primary namespace, named ``shown`` in
    errors): a queue, else a topic. Never raises: an error is the value's ``error``."""
    from azure.core.exceptions import ResourceNotFoundError

    bounded = {**NO_SDK_RETRY, "connection_timeout": timeout, "read_timeout": timeout}
    for kind, get in (("queue", admin.get_queue), ("topic", admin.get_topic)):
        try:
            props = get(entity, **bounded)
        except ResourceNotFoundError:
            continue
        except Exception as exc:  # noqa: BLE001 - the answer is a value: shown, warned of
            return DuplicateDetection(
                entity, error=describe_admin_error(exc, shown or "the primary namespace")
            )
        window = props.duplicate_detection_history_time_window
        size = getattr(props, "max_message_size_in_kilobytes", None)
        return DuplicateDetection(
            entity,
            kind,
            bool(props.requires_duplicate_detection),
            window.total_seconds() if window is not None else None,
            max_message_kb=size if isinstance(size, int) and not isinstance(size, bool) else None,
        )
    return DuplicateDetection(entity, error="no queue or topic of that name")


class PrimaryWindows:
    """A syphon's answers, entity -> :class:`DuplicateDetection`, each asked again after :data:`WINDOWS_FOR`
    (bounded by the entities of ambiguous messages met). ``lookup``: how to ask (default: the primary's admin
    endpoint, a client built on first use, calls bounded by ``timeout``). Thread-safe."""

    def __init__(
        self,
        clock: Clock,
        lookup: Callable[[str], DuplicateDetection] | None = None,
        *,
        primary: Any = None,
        timeout: float = 30.0,
    ) -> None:
        self._clock = clock
        self._lookup = lookup
        self._primary = primary
        self._timeout = timeout
        self._admin: Any = None
        self._known: dict[str, tuple[float, DuplicateDetection]] = {}
        self._lock = threading.Lock()

    def of(self, entity: str) -> DuplicateDetection:
        now = self._clock.monotonic()
        with self._lock:
            known = self._known.get(entity)
        if known is not None and now - known[0] < WINDOWS_FOR:
            return known[1]
        found = self._ask(entity)
        with self._lock:
            self._known[entity] = (now, found)
        return found

    def _ask(self, entity: str) -> DuplicateDetection:
        if self._lookup is not None:
            return self._lookup(entity)
        if self._primary is None:
            return DuplicateDetection(entity, error="no primary namespace to ask")
        try:
            if self._admin is None:
                self._admin = self._primary.admin_client()
        except Exception as exc:  # noqa: BLE001 - a value, as any other failure to read it
            return DuplicateDetection(entity, error=describe_admin_error(exc, "the primary namespace"))
        return read_duplicate_detection(
            self._admin, entity, timeout=self._timeout, shown=str(self._primary.endpoint_host())
        )

    def close(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            close_quietly(admin)
