"""Deadlines for calls that cannot be given one from inside (SPEC B3, R1): a :class:`Lane` runs each call on a worker
thread that owns the call's resources (an SDK client and sender), and the caller waits at most ``timeout`` seconds.
Past it the worker is abandoned (:class:`DeadlineExceeded`), its context's sockets are shut in the background and
the next call builds a fresh one - except a call still queued behind one that guards its own deadline, which is
withdrawn (:class:`Withdrawn`) and keeps the worker (F10). Also: direct calls on the caller's thread under a
watchdog (:meth:`Lane.direct`), aborting an opening (:func:`abort_when_abandoned`), tending an idle context.

Why (the SDK's SASL phase has no timeout), the hand-off rules and what was measured: docs/design/lane.md.

Where it runs: wherever the sender or syphon runs (executors' Python workers, the driver in tests and the demo).
Not picklable. Worker threads are daemons, so an abandoned, still-stuck worker never holds up the process exit.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from spark_sb.core.errors import LaneClosed
from spark_sb.wire.watchdog import WATCHDOG

_LOGGER = logging.getLogger(__name__)

C = TypeVar("C")
R = TypeVar("R")

#: The worker the current thread is (``_CURRENT.worker``), for :func:`abort_when_abandoned`.
_CURRENT = threading.local()


class DeadlineExceeded(TimeoutError):
    """A call did not finish within its deadline; the lane's worker (and its client) were abandoned.

    A ``TimeoutError``: :func:`spark_sb.core.errors.classify` treats it as a timeout (retry / fail over / rebuild).
    """


class Withdrawn(DeadlineExceeded):
    """A call reached its deadline still queued behind calls that were each within a deadline of their own: it was
    withdrawn (never runs) and the worker and its client were kept - a busy lane is not a stuck one (SPEC F6: ten
    probes of stalled entities queued on the isolated connection must not tear it down one after another). A
    timeout to the caller; about the connection it says nothing (:meth:`SdkTransport._failed
    <spark_sb.wire.sdk_transport.SdkTransport._failed>` leaves the connection alone)."""


class _Call:
    __slots__ = ("done", "error", "fn", "result", "started", "timed", "withdrawn")

    def __init__(self, fn: Callable[[Any], Any], timed: bool = False) -> None:
        self.fn = fn
        self.timed = timed  # its caller waits for it within a deadline (start, call); not so for submit
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.started = False
        self.withdrawn = False  # its caller gave up before it started (Withdrawn): never run


class _Worker(threading.Thread):
    """One thread and the context it built; used until abandoned or closed."""

    def __init__(
        self,
        name: str,
        factory: Callable[[], Any],
        closer: Callable[[Any], None],
        generation: int = 0,
        idle: Callable[[Any], None] | None = None,
        idle_every: float = 0.5,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.generation = generation
        self._factory = factory
        self._closer = closer
        self._idle = idle
        self._idle_every = idle_every
        self.calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self.context: Any = None
        self.retired = False  # abandoned or closed: finish the current call, close the context, exit
        self.use = threading.Lock()  # held while the context is in use: by this thread or by a direct call
        # a call is started by this thread or withdrawn by its caller, never both (see withdraw)
        self._claim = threading.Lock()
        # the call holding the context now (this thread's or a direct call) has a deadline its caller guards
        self._running_timed = False
        # what an opening on this worker registered (abort_when_abandoned): one at a time, in practice
        self._aborts: dict[int, Callable[[BaseException], None]] = {}
        self._aborts_lock = threading.Lock()
        self._abort_error: BaseException | None = (
            None  # set once: the worker was abandoned or its lane closed
        )
        self._abort_keys = itertools.count()

    def register_abort(self, abort: Callable[[BaseException], None]) -> int:
        """On this worker's thread: call ``abort(error)`` if the worker is abandoned or closed before
        :meth:`unregister_abort` (at once if it was already)."""
        with self._aborts_lock:
            key = next(self._abort_keys)
            self._aborts[key] = abort
            error = self._abort_error
        if error is not None:
            abort(error)
        return key

    def unregister_abort(self, key: int) -> None:
        with self._aborts_lock:
            self._aborts.pop(key, None)

    def abort(self, error: BaseException) -> None:
        """On the abandoning or closing thread: abort whatever is opening on this worker (see
        :func:`abort_when_abandoned`). Each abort must only shut a socket down (no blocking); errors are logged."""
        with self._aborts_lock:
            if self._abort_error is None:
                self._abort_error = error
            aborts = list(self._aborts.values())
        for abort in aborts:
            try:
                abort(error)
            except Exception as exc:  # best effort: the opening's own deadline still holds
                _LOGGER.debug("%s: aborting an opening failed: %s", self.name, type(exc).__name__)

    def run(self) -> None:
        _CURRENT.worker = self
        while True:
            try:
                call = (
                    self.calls.get(timeout=self._idle_every) if self._idle is not None else self.calls.get()
                )
            except queue.Empty:
                self._tend()
                continue
            if call is None or self.retired:
                if call is not None:
                    call.error = LaneClosed("the lane's worker was retired before the call started")
                    call.done.set()
                break
            # Started only once it holds the context: while a direct call holds it, this call is still queued
            # (withdrawn at its deadline, never abandoning the worker the direct call uses: SPEC F10).
            with self.use:
                with self._claim:
                    if call.withdrawn:  # its caller gave up while it waited (it got Withdrawn): not run
                        continue
                    if self.retired:  # abandoned or reset while it waited for the context: never run on it
                        call.error = LaneClosed("the lane's worker was retired before the call started")
                        call.done.set()
                        break
                    call.started = True
                    self._running_timed = call.timed
                try:
                    if self.context is None:
                        self.context = self._factory()
                    call.result = call.fn(self.context)
                except BaseException as exc:  # handed to the caller
                    call.error = exc
                with self._claim:
                    self._running_timed = False
            call.done.set()
        self._finish()

    def withdraw(self, call: _Call) -> bool:
        """On the caller's thread, at ``call``'s deadline: withdraw it if it has not started (it starts once it
        holds the context) and the call holding the context now - on the worker, or a direct call on its caller's
        thread - has a deadline of its own: the worker is busy, and whether it is stuck is for that call's caller to
        tell at that deadline (it waits for it, and abandons the worker if it is passed) - so that the worker and
        its context are kept (True). False: the call started, or the worker runs a call without a deadline
        (:meth:`Lane.submit`) or none at all: the worker is retired here, under the lock a direct call's start takes,
        and the caller then abandons it. Calls queued together (probes
        started at once) reach their deadlines together: the queued ones are withdrawn and the running one's
        caller alone decides about the worker."""
        with self._claim:
            if call.started or not self._running_timed:
                # its caller abandons the worker next: from now on nothing starts on it (a direct call of another
                # caller would have its socket shut under it by that abandonment)
                self.retired = True
                return False
            call.withdrawn = True
            return True

    def _tend(self) -> None:
        """No call came for ``idle_every`` seconds: let ``idle`` look after the context (skipped while a direct
        call holds it). Its errors are logged, never raised: the next call meets whatever state it left."""
        if self.retired or self.context is None or self._idle is None:
            return
        if not self.use.acquire(blocking=False):
            return
        try:
            if self.context is not None and not self.retired:
                self._idle(self.context)
        except Exception as exc:
            _LOGGER.info("%s: tending the idle client failed: %s", self.name, type(exc).__name__)
        finally:
            self.use.release()

    def _finish(self) -> None:
        with self.use:  # a direct call still using the context is let finish (its socket is shut down)
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
        idle: called on the worker with the context after ``idle_every`` seconds without a call (see the
            module docstring, "Tending"); it must return quickly (it delays a call that arrives meanwhile).
    """

    def __init__(
        self,
        name: str,
        factory: Callable[[], C],
        closer: Callable[[C], None],
        unblock: Callable[[C], None] | None = None,
        *,
        idle: Callable[[C], None] | None = None,
        idle_every: float = 0.5,
    ) -> None:
        self.name = name
        self._factory = factory
        self._closer = closer
        self._unblock = unblock
        self._idle = idle
        self._idle_every = idle_every
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
        job = _Call(fn, timed=True)
        worker = self._current()
        worker.calls.put(job)
        return Pending(self, worker, job, max(0.0, timeout), slow_after, on_slow)

    def direct(
        self,
        fn: Callable[[C], R],
        timeout: float,
        *,
        slow_after: float | None = None,
        on_slow: Callable[[], None] | None = None,
    ) -> Finished[R] | None:
        """Run ``fn(context)`` on the calling thread if the context is built and the worker is idle (nothing
        running, nothing queued); None otherwise (then use :meth:`start` or :meth:`call`). Only for calls whose
        waits the callee bounds itself (see the module docstring): the deadline is enforced by the watchdog, which
        at ``timeout`` abandons the worker and unblocks the context (the call then returns with an error, raised
        here as :class:`DeadlineExceeded`); ``on_slow`` is called at ``slow_after`` on the watchdog's thread (it
        must not block and must be thread-safe). Returns the settled call: ``result()`` gives the value or raises.
        """
        with self._lock:
            worker = self._worker
        if worker is None or not worker.calls.empty() or not worker.use.acquire(blocking=False):
            return None
        try:
            context = worker.context  # read while held: the worker neither builds nor closes it meanwhile
            if context is None or worker.retired:
                return None
            # a call queued meanwhile is withdrawn at its deadline, never abandons the worker this one uses; one
            # whose caller decided to abandon it already (withdraw said no) retired it under the same lock
            with worker._claim:
                if worker.retired:
                    return None
                worker._running_timed = True
            timeout = max(0.0, timeout)
            now = time.monotonic()
            deadline = WATCHDOG.watch(now + timeout, lambda: self._abandon(worker, _no_answer(timeout)))
            slow = (
                WATCHDOG.watch(now + slow_after, on_slow)
                if on_slow is not None and slow_after is not None and 0.0 < slow_after < timeout
                else None
            )
            value: R | None = None
            error: BaseException | None = None
            try:
                value = fn(context)
            except Exception as exc:  # handed to the caller
                error = exc
            finally:  # also on BaseException: disarm, so that nothing fires for a call that is over
                if slow is not None:
                    slow.cancel()
                late = not deadline.cancel()  # the deadline fired first: the worker was abandoned
        finally:
            with worker._claim:
                worker._running_timed = False
            worker.use.release()
        if late:
            exceeded = self._exceeded(timeout)
            exceeded.__cause__ = error
            return Finished(None, exceeded, worker.generation, now)
        return Finished(value, error, worker.generation, now)

    def submit(self, fn: Callable[[C], object]) -> None:
        """Run ``fn(context)`` on the worker without waiting for it (e.g. open a link ahead of need). Its result
        and errors are dropped; a call made after it waits behind it, within that call's own deadline."""
        with contextlib.suppress(LaneClosed):
            self._current().calls.put(_Call(fn))

    def reset(self, why: str = "reset", generation: int | None = None) -> bool:
        """Retire the current worker and its context (closed in the background); the next call builds anew.
        ``generation``: only if the current worker is that one (a failure resets the connection it met, never a
        newer one built since). True if a worker was retired."""
        with self._lock:
            worker = self._worker
            if worker is None or (generation is not None and worker.generation != generation):
                return False
            self._worker = None
        if worker is not None:
            _LOGGER.debug(
                "%s: %s; the client is closed in the background and rebuilt on next use", self.name, why
            )
            worker.retired = True
            worker.calls.put(None)
        return True

    def close(self) -> None:
        """Retire the worker (its context is closed in the background, never awaited); no call is accepted. An
        opening still under way on the worker is aborted (:func:`abort_when_abandoned`): nobody will use what it
        opens, and the worker exits within moments instead of at the opening's own deadline."""
        with self._lock:
            self._closed = True
            worker = self._worker
        self.reset("closed")
        if worker is not None:
            worker.abort(LaneClosed(f"{self.name}: closed while a connection was being opened"))

    def context(self, generation: int | None = None) -> C | None:
        """The current worker's context if it is built (None otherwise; None too if ``generation`` is given and the
        current worker is another). A read for checks only (is the connection still open?): the context is used
        by the worker or a direct call alone."""
        with self._lock:
            worker = self._worker
        if worker is None or (generation is not None and worker.generation != generation):
            return None
        return worker.context  # type: ignore[no-any-return]

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
                    f"spark-sb-{self.name}-{self.generation}",
                    self._factory,
                    self._closer,
                    self.generation,
                    self._idle,
                    self._idle_every,
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
        worker.abort(DeadlineExceeded(f"{self.name}: {why} (abandoned while opening a connection)"))
        unblock = self._unblock
        if unblock is not None:
            threading.Thread(
                target=_quietly, args=(unblock, worker), name=f"{worker.name}-unblock", daemon=True
            ).start()

    def _exceeded(self, timeout: float) -> DeadlineExceeded:
        return DeadlineExceeded(
            f"{self.name}: {_no_answer(timeout)} (the client was abandoned and is rebuilt)"
        )

    def __repr__(self) -> str:
        return f"Lane({self.name!r}, generation={self.generation}, abandoned={self.abandoned})"


class Pending(Generic[R]):
    """A call started with :meth:`Lane.start`: :meth:`result` waits for it until its deadline (counted from the
    start). Used by one thread (the caller's)."""

    __slots__ = (
        "_deadline",
        "_job",
        "_lane",
        "_on_slow",
        "_slow_at",
        "_timeout",
        "_worker",
        "generation",
        "started",
    )

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
        self.started = now  # monotonic

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
            if self._worker.withdraw(job):
                # queued behind calls each within its own deadline: the connection is busy, not stuck (SPEC F6:
                # probes of stalled entities queued on the isolated connection must not tear it down in turn)
                raise Withdrawn(
                    f"{self._lane.name}: waited {self._timeout:.2f} s behind other calls and never started "
                    "(the client is kept)"
                )
            self._lane._abandon(self._worker, _no_answer(self._timeout))
            raise self._lane._exceeded(self._timeout)
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[no-any-return]


@contextlib.contextmanager
def abort_when_abandoned(abort: Callable[[BaseException], None]) -> Iterator[None]:
    """While the block runs on a lane's worker: if the worker is abandoned at a deadline or its lane is closed,
    ``abort(error)`` is called on the abandoning thread (at once if that happened already) - ``error`` is what
    the block should raise: :class:`DeadlineExceeded` or :class:`LaneClosed`. For an opening that the lane's
    ``unblock`` cannot reach (see the module docstring); ``abort`` must only shut a socket down or set a flag,
    never block, and be safe to call more than once. Outside a lane's worker (a direct call, a test) it does
    nothing. Runs on the worker."""
    worker: _Worker | None = getattr(_CURRENT, "worker", None)
    if worker is None:
        yield
        return
    key = worker.register_abort(abort)
    try:
        yield
    finally:
        worker.unregister_abort(key)


def _no_answer(timeout: float) -> str:
    return f"no answer within {timeout:.3g} s"


def _quietly(unblock: Callable[[Any], None], worker: _Worker) -> None:
    context = worker.context
    if context is None:
        return
    try:
        unblock(context)
    except Exception as exc:  # best effort
        _LOGGER.debug("%s: unblocking failed: %s", worker.name, type(exc).__name__)


class Finished(Generic[R]):
    """A call that ran on the calling thread (:meth:`Lane.direct`): ``result()`` returns its value or raises its
    error."""

    __slots__ = ("_error", "_value", "generation", "started")

    def __init__(
        self, value: R | None, error: BaseException | None, generation: int, started: float = 0.0
    ) -> None:
        self._value = value
        self._error = error
        self.generation = generation  # the worker (and context) the call used
        self.started = started  # monotonic

    @property
    def error(self) -> BaseException | None:
        return self._error

    def result(self) -> R:
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]
