"""Time for the local namespace: lock expiry, TTL, idle timers and token expiry read it through a :class:`Clock`.

The namespace reads the time and never waits on it: :class:`Clock` is ``monotonic()`` (intervals) and ``now()``
(UTC wall time, what goes on the wire). :class:`FakeClock` is the one fake clock of the repository: the namespace's
tests and the product's advance it instead of sleeping (it has ``sleep`` too, which ``spark_sb.core.clock.Clock``
adds, so a test hands one :class:`FakeClock` to both). Runs in the namespace's process; picklable.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """What the namespace reads of time."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin; only differences are meaningful."""

    def now(self) -> datetime:
        """Current UTC wall time (timezone-aware)."""


class SystemClock:
    """The real clock: ``time.monotonic`` and ``datetime.now(timezone.utc)``."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def __repr__(self) -> str:
        return "SystemClock()"


class FakeClock:
    """A clock that only moves when told to (``advance``) or when code under test calls ``sleep``.

    Thread-safe. ``sleep`` records each requested duration in :attr:`sleeps` and advances the clock by it,
    so code that backs off can be tested without real waiting.
    """

    def __init__(self, start: datetime | None = None, monotonic_start: float = 1000.0) -> None:
        self._lock = threading.Lock()
        self._wall = start or datetime(2026, 1, 1, tzinfo=timezone.utc)
        self._mono = monotonic_start
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def now(self) -> datetime:
        with self._lock:
            return self._wall

    def advance(self, seconds: float) -> None:
        """Move both the monotonic and the wall clock forward by ``seconds``."""
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        with self._lock:
            self._mono += seconds
            self._wall += timedelta(seconds=seconds)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if seconds > 0:
            self.advance(seconds)

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"FakeClock(now={self._wall.isoformat()}, monotonic={self._mono})"
