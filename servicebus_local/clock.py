"""Injected time for the local namespace (its own copy of ``spark_sb.core.clock``: the emulator depends on nothing of
the product).

Lock expiry, TTL, idle timers and token expiry read time through a :class:`Clock` so that tests advance a
:class:`FakeClock` instead of sleeping. Any object with the same methods (such as ``spark_sb.core.clock.FakeClock``)
serves.

* ``monotonic()`` is for measuring intervals (never goes backwards).
* ``now()`` is UTC wall time, for what is written to Delta or put on the wire.
* ``sleep()`` waits; :class:`FakeClock` advances itself instead.

Runs anywhere (driver and executors); both classes are picklable.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """What the library needs from time."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin; only differences are meaningful."""

    def now(self) -> datetime:
        """Current UTC wall time (timezone-aware)."""

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (a fake clock advances instead)."""


class SystemClock:
    """The real clock: ``time.monotonic``, ``datetime.now(timezone.utc)`` and ``time.sleep``."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

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
