"""Deadlines for calls that cannot be given one from inside: a :class:`Lane` runs each call on a worker thread
that owns the call's resources, and the caller waits at most ``timeout`` seconds (SPEC B3, R1).

Why: the azure-servicebus SDK negotiates SASL on a blocking socket with no timeout, and its own ``timeout``
and ``try_timeout`` do not cover that phase (protocol-notes.md, "Where the SDK can wait forever"). A namespace
that accepts TCP and then says nothing would hold the calling thread - a Spark task - forever. A lane makes
every call bounded whatever the SDK does:

* the calling thread hands the call to the lane's worker and waits for its result at most ``timeout`` seconds;
* past the deadline the worker is **abandoned**: :class:`DeadlineExceeded` is raised to the caller at once, the
  worker and its context (e.g. an SDK client and sender) are never used again, the context's sockets are shut
  down in the background so the stuck call returns, and the worker closes the context when its call returns -
  nobody waits for any of it;
* the next call builds a fresh worker and a fresh context.

One lane serves one destination (one SDK client and sender): SDK objects are not thread-safe, and each is used
only by its worker. A lane may be called from several threads (the sender's thread, a probe thread); calls run
one at a time in submission order.

Where it runs: wherever the sender or syphon runs (executors' Python workers, the driver in tests and the demo).
Not picklable. Worker threads are daemons, so an abandoned, still-stuck worker never holds up the process exit.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

_LOGGER = logging.getLogger(__name__)

C = TypeVar("C")
R = TypeVar("R")


class DeadlineExceeded(TimeoutError):
    """A call did not finish within its deadline; the lane's worker (and its client) were abandoned.

    A ``TimeoutError``: :func:`spark_sb.errors.classify` treats it as a timeout (retry / fail over / rebuild).
    """


class LaneClosed(ConnectionError):
    """The lane was closed or its worker abandoned before the call started."""


class _Call:
    __slots__ = ("done", "error", "fn", "result", "started")

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.started = False


class _Worker(threading.Thread):
    """One thread and the context it built; used until abandoned or closed."""

    def __init__(
        self, name: str, factory: Callable[[], Any], closer: Callable[[Any], None], generation: int = 0
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.generation = generation
        self._factory = factory
        self._closer = closer
        self.calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self.context: Any = None
        self.retired = False  # abandoned or closed: finish the current call, close the context, exit

    def run(self) -> None:
        while True:
            call = self.calls.get()
            if call is None or self.retired:
                if call is not None:
                    call.error = LaneClosed("the lane's worker was retired before the call started")
                    call.done.set()
                break
            call.started = True
            try:
                if self.context is None:
                    self.context = self._factory()
                call.result = call.fn(self.context)
            except BaseException as exc:  # handed to the caller
                call.error = exc
            call.done.set()
        self._finish()

    def _finish(self) -> None:
        context, self.context = self.context, None
        if context is not None:
            try:
                self._closer(context)
            except Exception as exc:  # closing a broken client may fail; it is being dropped anyway
                _LOGGER.debug("%s: closing an abandoned context failed: %s", self.name, type(exc).__name__)
        while True:  # fail whatever was queued behind the retirement
            try:
                call = self.calls.get_nowait()
            except queue.Empty:
                return
            if call is not None:
                call.error = LaneClosed("the lane's worker was retired before the call started")
                call.done.set()


class Lane(Generic[C]):
    """Runs calls against a context of type ``C`` (built by ``factory`` on the worker thread) with deadlines.

    Args:
        name: for thread names and logs (no secrets).
        factory: builds the context on the worker (no I/O expected, but it is inside the deadline anyway).
        closer: closes a context (runs on the retiring worker; may block - nobody waits for it).
        unblock: called from a background thread on an abandoned context to make a stuck call return
            (e.g. shut its socket down). Best effort; must not block for long.
    """

    def __init__(
        self,
        name: str,
        factory: Callable[[], C],
        closer: Callable[[C], None],
        unblock: Callable[[C], None] | None = None,
    ) -> None:
        self.name = name
        self._factory = factory
        self._closer = closer
        self._unblock = unblock
        self._lock = threading.Lock()
        self._worker: _Worker | None = None
        self._closed = False
        self.generation = 0  # bumped each time a worker (and so a context) is built
        self.abandoned = 0  # workers abandoned at a deadline

    def call(
        self,
        fn: Callable[[C], R],
        timeout: float,
        *,
        slow_after: float | None = None,
        on_slow: Callable[[], None] | None = None,
    ) -> R:
        """Run ``fn(context)`` on the worker; its result, or its exception re-raised here.

        Raises :class:`DeadlineExceeded` if it has not finished after ``timeout`` seconds (the worker is then
        abandoned, see the module docstring) and :class:`LaneClosed` once :meth:`close` was called. If it has
        not finished after ``slow_after`` seconds, ``on_slow()`` is called (on the caller's thread; it must not
        block) and the wait goes on to the deadline.
        """
        return self.start(fn, timeout, slow_after=slow_after, on_slow=on_slow).result()

    def start(
        self,
        fn: Callable[[C], R],
        timeout: float,
        *,
        slow_after: float | None = None,
        on_slow: Callable[[], None] | None = None,
    ) -> Pending[R]:
        """Start ``fn(context)`` on the worker and return at once; :meth:`Pending.result` waits for it within
        the same deadline (``timeout`` seconds from now, whenever ``result`` is called), so the caller may do
        other work (pack the next batch) meanwhile. ``call`` is ``start(...).result()``."""
        job = _Call(fn)
        worker = self._current()
        worker.calls.put(job)
        return Pending(self, worker, job, max(0.0, timeout), slow_after, on_slow)

    def submit(self, fn: Callable[[C], object]) -> None:
        """Run ``fn(context)`` on the worker without waiting for it (e.g. open a link ahead of need). Its result
        and errors are dropped; a call made after it waits behind it, within that call's own deadline."""
        with contextlib.suppress(LaneClosed):
            self._current().calls.put(_Call(fn))

    def reset(self, why: str = "reset") -> None:
        """Retire the current worker and its context (closed in the background); the next call builds anew."""
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            _LOGGER.debug(
                "%s: %s; the client is closed in the background and rebuilt on next use", self.name, why
            )
            worker.retired = True
            worker.calls.put(None)

    def close(self) -> None:
        """Retire the worker (its context is closed in the background, never awaited); no call is accepted."""
        with self._lock:
            self._closed = True
        self.reset("closed")

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def live(self) -> bool:
        """True while a worker (with or without a built context) is current."""
        with self._lock:
            return self._worker is not None

    def _current(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise LaneClosed(f"{self.name}: closed")
            worker = self._worker
            if worker is None:
                self.generation += 1
                worker = _Worker(
                    f"spark-sb-{self.name}-{self.generation}", self._factory, self._closer, self.generation
                )
                worker.start()
                self._worker = worker
            return worker

    def _abandon(self, worker: _Worker, why: str) -> None:
        with self._lock:
            if self._worker is worker:
                self._worker = None
            self.abandoned += 1
        worker.retired = True
        worker.calls.put(None)
        _LOGGER.info(
            "%s: %s; abandoning its client (closed in the background) and building a new one", self.name, why
        )
        unblock = self._unblock
        if unblock is not None:
            threading.Thread(
                target=_quietly, args=(unblock, worker), name=f"{worker.name}-unblock", daemon=True
            ).start()

    def __repr__(self) -> str:
        return f"Lane({self.name!r}, generation={self.generation}, abandoned={self.abandoned})"


class Pending(Generic[R]):
    """A call started with :meth:`Lane.start`: :meth:`result` waits for it until its deadline (counted from the
    start). Used by one thread (the caller's)."""

    __slots__ = ("_deadline", "_job", "_lane", "_on_slow", "_slow_at", "_timeout", "_worker", "generation")

    def __init__(
        self,
        lane: Lane[Any],
        worker: _Worker,
        job: _Call,
        timeout: float,
        slow_after: float | None,
        on_slow: Callable[[], None] | None,
    ) -> None:
        now = time.monotonic()
        self._lane = lane
        self._worker = worker
        self._job = job
        self._timeout = timeout
        self._deadline = now + timeout
        self._slow_at = (
            now + slow_after
            if on_slow is not None and slow_after is not None and 0.0 < slow_after < timeout
            else None
        )
        self._on_slow = on_slow
        self.generation = worker.generation  # the worker (and context) the call runs on

    @property
    def done(self) -> bool:
        """True once the call has finished (successfully or not)."""
        return self._job.done.is_set()

    def result(self) -> R:
        """The call's result, or its exception re-raised; :class:`DeadlineExceeded` past the deadline."""
        job = self._job
        done = job.done.is_set()
        if not done and self._slow_at is not None:
            done = job.done.wait(max(0.0, self._slow_at - time.monotonic()))
            if not done:
                self._slow_at = None
                assert self._on_slow is not None
                self._on_slow()
        if not done and not job.done.wait(max(0.0, self._deadline - time.monotonic())):
            self._lane._abandon(self._worker, f"no answer within {self._timeout:.3g} s")
            raise DeadlineExceeded(
                f"{self._lane.name}: no answer within {self._timeout:.3g} s (the client was abandoned and is "
                "rebuilt)"
            )
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[no-any-return]


def _quietly(unblock: Callable[[Any], None], worker: _Worker) -> None:
    context = worker.context
    if context is None:
        return
    try:
        unblock(context)
    except Exception as exc:  # best effort
        _LOGGER.debug("%s: unblocking failed: %s", worker.name, type(exc).__name__)
