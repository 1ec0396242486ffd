"""The driver's peek-locks (SOURCE.md §5, R16): the messages received and not yet deferred or completed, renewed at
half their lock, the keeper thread that renews them in production, and the thread the planner reads ahead in
while the executors read (:class:`WakeThread`).

Runs on the driver (the planner process); nothing here is picklable. The planner owns the books (bounded by one
batch plus one receive) and calls :func:`renew_due` under its lock; :class:`KeeperThread` calls the planner's
``keep_locks`` on the real clock, and tests and the simulation call it on their fake clock instead.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from spark_sb.core.clock import Clock
from spark_sb.source.transport import EntityLink, Received

log = logging.getLogger(__name__)


class Held:
    """A message held peek-locked: its receive, and when its lock was last taken or renewed."""

    __slots__ = ("received", "renewed_at", "locked_until")

    def __init__(self, received: Received, now: float) -> None:
        self.received = received
        self.renewed_at = now
        self.locked_until = received.locked_until

    @property
    def due_at(self) -> float:
        return self.renewed_at + (self.locked_until - self.renewed_at) / 2


def renew_due(
    link: Callable[[], EntityLink], books: Sequence[dict[int, Held]], now: float, timeout: float
) -> float | None:
    """Forget the held messages whose lock ran out; renew those past half their lock (one batched call); forget
    those the reply leaves out (lost). A failed call changes nothing (the next tick tries again). Returns the next
    due time, None if nothing is held."""
    for book in books:
        for seq in [s for s, h in book.items() if now >= h.locked_until]:
            del book[seq]
    due = [h for book in books for h in book.values() if now >= h.due_at]
    if due:
        try:
            renewed: dict[int, float] | None = link().renew([h.received for h in due], timeout)
        except Exception as exc:  # noqa: BLE001
            log.info("renewing %d locks failed (%s)", len(due), exc)
            renewed = None
        for h in due if renewed is not None else ():
            seq = h.received.seq
            if renewed is not None and seq in renewed:
                h.renewed_at, h.locked_until = now, renewed[seq]
            else:
                for book in books:
                    book.pop(seq, None)
    times = [h.due_at for book in books for h in book.values()]
    return min(times) if times else None


class KeeperThread:
    """A daemon thread calling ``tick`` (which returns its next due time on ``clock``) until stopped."""

    def __init__(self, tick: Callable[[], float | None], clock: Clock, name: str) -> None:
        self.tick = tick
        self.clock = clock
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                nxt = self.tick()
            except Exception:  # noqa: BLE001 - the keeper never dies; the next tick tries again
                log.warning("the lock keeper failed", exc_info=True)
                nxt = None
            wait = 1.0 if nxt is None else min(5.0, max(0.05, nxt - self.clock.monotonic()))
            if self._stop.wait(wait):
                return

    def stop(self, timeout: float) -> None:
        self._stop.set()
        self.thread.join(timeout=timeout)


class WakeThread:
    """A daemon thread calling ``run`` (its result ignored) each time it is woken (:meth:`wake`), until stopped;
    ``run`` never kills it."""

    def __init__(self, run: Callable[[], object], name: str) -> None:
        self.run = run
        self._wake = threading.Event()
        self._stopped = False
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopped:
                return
            try:
                self.run()
            except Exception:  # noqa: BLE001 - the next wake tries again
                log.warning("%s failed", self.thread.name, exc_info=True)

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float) -> None:
        self._stopped = True
        self._wake.set()
        self.thread.join(timeout=timeout)
