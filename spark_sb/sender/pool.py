"""One pool for the live objects an executor keeps between Spark tasks: the sink's paired senders and the syphon
job's syphons (Spark's ``InternalKafkaProducerPool`` is the model). Keyed by a digest of the configuration; an
object is used by one task at a time (:meth:`SenderPool.acquire` / :meth:`SenderPool.release`); idle objects are
closed once unused for ``idle_timeout`` seconds, read from the injected clock.

Where it runs: on executors, one pool per Python worker process and per kind of object (module globals:
:data:`spark_sb.spark.partition.SENDERS`, :data:`spark_sb.spark.syphon_job.SYPHONS`); the driver in tests and tools.
Not picklable (the objects it holds are not); what it holds is built in the worker from a picklable config.

Bounds: per key, the idle objects are at most the tasks that used the key at once (a Python worker runs one task
at a time: one); every key's idle objects are closed after ``idle_timeout`` of disuse, checked at each acquire,
so a worker keeps nothing longer than ``idle_timeout`` past its last task that acquires from the pool. Generic
over what it holds: ``close`` (default: the object's ``close()``) ends an object that leaves the pool.
"""

from __future__ import annotations

import hashlib
import pickle
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from spark_sb.core.clock import Clock, SystemClock

__all__ = ["SenderPool", "config_key"]

T = TypeVar("T")


def config_key(config: Any) -> str:
    """The pool key of a (picklable) configuration: a digest of its pickled form, so that equal configurations
    share objects and no secret is kept in a key."""
    return hashlib.sha256(pickle.dumps(config)).hexdigest()


def _close(item: Any) -> None:
    item.close()


class SenderPool(Generic[T]):
    """Idle objects per key, reused by the next task with the same key, closed after ``idle_timeout`` unused."""

    def __init__(self, *, clock: Clock | None = None, close: Callable[[T], None] = _close) -> None:
        self._clock = clock or SystemClock()
        self._close = close
        self._lock = threading.Lock()
        self._idle: dict[
            str, list[tuple[float, T]]
        ] = {}  # key -> (idle since, object); bounds: module docstring

    def acquire(self, key: str, idle_timeout: float, build: Callable[[], T]) -> T:
        """An idle object of ``key`` (the most recently used), or a new one from ``build``. Objects of any key
        idle for longer than ``idle_timeout`` are closed first (outside the lock: closing may take time)."""
        now = self._clock.monotonic()
        stale: list[T] = []
        found: T | None = None
        with self._lock:
            for k, entries in list(self._idle.items()):
                stale.extend(item for since, item in entries if now - since > idle_timeout)
                fresh = [(since, item) for since, item in entries if now - since <= idle_timeout]
                if fresh:
                    self._idle[k] = fresh
                else:
                    del self._idle[k]
            mine = self._idle.get(key)
            if mine:
                found = mine.pop()[1]
                if not mine:
                    del self._idle[key]
        for item in stale:
            self._close(item)
        return found if found is not None else build()

    def release(self, key: str, item: T, keep: bool = True) -> None:
        """Give ``item`` back: kept idle for the next task with ``key``, or closed now (``keep`` False)."""
        if not keep:
            self._close(item)
            return
        with self._lock:
            self._idle.setdefault(key, []).append((self._clock.monotonic(), item))

    def idle(self) -> int:
        """How many objects are idle in the pool now."""
        with self._lock:
            return sum(len(entries) for entries in self._idle.values())

    def close_all(self) -> int:
        """Close every idle object; how many."""
        with self._lock:
            items = [item for entries in self._idle.values() for _, item in entries]
            self._idle.clear()
        for item in items:
            self._close(item)
        return len(items)
