"""The process's watchdog (wire): one daemon thread that fires armed deadlines - a lane's direct call abandoned at
its deadline from outside the calling thread (:meth:`~spark_sb.wire.lane.Lane.direct`). :data:`WATCHDOG` is the one
instance; a forked child (a Python worker forked by Spark's daemon) starts it afresh. Not picklable.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable

_LOGGER = logging.getLogger(__name__)


def _nothing() -> None:
    pass


class Watch:
    """One armed deadline of the watchdog; ``cancel`` and firing exclude each other."""

    __slots__ = ("_fire", "_lock", "_state")

    def __init__(self, fire: Callable[[], None]) -> None:
        self._fire = fire
        self._lock = threading.Lock()
        self._state = 0  # 0 armed, 1 cancelled, 2 fired

    @property
    def armed(self) -> bool:
        return self._state == 0

    def cancel(self) -> bool:
        """Disarm; False if it fired already."""
        with self._lock:
            if self._state == 0:
                self._state = 1
                self._fire = (
                    _nothing  # the heap keeps a cancelled watch until its time: not what it refers to
                )
            return self._state == 1

    def fire(self) -> None:
        with self._lock:
            if self._state != 0:
                return
            self._state = 2
        try:
            self._fire()
        except Exception as exc:  # a deadline's action must not kill the watchdog
            _LOGGER.warning("a deadline's action failed: %s", type(exc).__name__)


class Watchdog:
    """One daemon thread for the whole process that fires armed deadlines (:meth:`~spark_sb.wire.lane.Lane.direct`). It sleeps until
    the earliest armed deadline and is woken only when an earlier one is armed, so a stream of calls with the
    same timeout wakes it about once per timeout, not once per call."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Watch]] = []
        self._order = itertools.count()
        self._wake_at = float("inf")
        self._thread: threading.Thread | None = None

    def _after_fork(self) -> None:
        """In a forked child (a Python worker forked by Spark's daemon): the parent's thread and calls are not
        there, and its lock may have been held at the fork. Start afresh."""
        self.__init__()  # type: ignore[misc]

    def watch(self, at: float, fire: Callable[[], None]) -> Watch:
        """Call ``fire()`` (on the watchdog's thread) at monotonic time ``at`` unless cancelled before."""
        watch = Watch(fire)
        with self._cond:
            heapq.heappush(self._heap, (at, next(self._order), watch))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="spark-sb-watchdog", daemon=True)
                self._thread.start()
            elif at < self._wake_at:
                self._cond.notify()
        return watch

    def _run(self) -> None:
        while True:
            due: list[Watch] = []
            with self._cond:
                now = time.monotonic()
                heap = self._heap
                while heap and (heap[0][0] <= now or not heap[0][2].armed):
                    watch = heapq.heappop(heap)[2]
                    if watch.armed:
                        due.append(watch)
                if not due:
                    self._wake_at = heap[0][0] if heap else float("inf")
                    self._cond.wait(None if not heap else self._wake_at - now)
                    continue
            for watch in due:
                watch.fire()


WATCHDOG = Watchdog()
os.register_at_fork(after_in_child=WATCHDOG._after_fork)
