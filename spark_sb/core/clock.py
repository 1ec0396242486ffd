"""Injected time: every timing decision in ``spark_sb`` (failover timers, probe intervals, backlog rotation, idle
client eviction, the catch-up's waits) reads and waits through a :class:`Clock`.

* ``monotonic()`` is for measuring intervals (never goes backwards).
* ``now()`` is UTC wall time, for what is written to Delta or put on the wire.
* ``sleep()`` waits.

Tests hand the code a ``servicebus_local.clock.FakeClock`` (the repository's one fake clock), which advances itself
instead of sleeping. Runs anywhere (driver and executors); picklable.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
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
