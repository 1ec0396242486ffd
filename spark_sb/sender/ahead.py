"""Backlog translations made ahead, while a paired sender waits anyway (SPEC F1: a namespace outage over E
entities costs ``failover_interval``, plus as little as possible).

When the primary namespace is down, the last batches of a send call - one per entity - wait for the failover
timer (the namespace refused: they wait in :meth:`~spark_sb.sender.paired.PairedSender._flush`) or for the deadline of
the one attempt in flight (the namespace stalls: the sender's thread is blocked in the SDK's socket read, with
the GIL free). Either way the sender would translate and encode every message into its backlog form (SPEC B6)
only once the timer has run out - at E = 1,000 entities and 2,000 messages a few hundred milliseconds after the
failover was due. :class:`Ahead` does that work during the wait instead: inline before the sender sleeps, or on
a helper thread started by the slow-send signal (``on_slow``, a second before an attempt's deadline). Should the
primary answer after all, the translations are dropped: nothing was sent, the originals are still in the batches.

A translation made ahead records the time it was made as the message's backlog enqueue time: at most the wait
earlier than a translation made at the divert, so the message's time to live is counted from a little earlier,
never later.

Where it runs: inside one ``PairedSender.send`` call (an executor's Python worker), its helper thread at most
one per call. What bounds it: the translations of the call's last batches, which the call holds anyway; it is
dropped when the call's batches are settled. Not picklable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import datetime

from spark_sb.core.clock import Clock
from spark_sb.message.outbound import OutboundMessage
from spark_sb.wire.transport import Batch

Prepare = Callable[[OutboundMessage, str, datetime], object]


class Ahead:
    """The backlog translations of one call's last batches (by their index), made ahead of the divert."""

    def __init__(
        self, batches: Sequence[Batch], prepare: Prepare, clock: Clock, default_entity: str | None
    ) -> None:
        self._batches = batches
        self._prepare = prepare
        self._clock = clock
        self._default = default_entity or ""
        self._ready: dict[int, list[object | None]] = {}  # bounded by len(batches)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None  # set only once started, under _guard
        # Held by start() while it makes and starts the helper, and by stop() while it ends it: stop() never meets
        # a thread made but not started yet (the watchdog that calls start() may be descheduled in between).
        self._guard = threading.Lock()
        self.in_flight = 0  # the batch whose attempt is under way (the helper thread starts there)

    def __len__(self) -> int:
        return len(self._batches)

    def get(self, index: int) -> list[object | None] | None:
        """The translations of batch ``index`` (None at a message that could not be translated: its divert meets
        the error itself), or None when they were not made."""
        return self._ready.get(index)

    def prepare(self, indices: Sequence[int], until: float) -> None:
        """Translate the batches ``indices`` on this thread, until the monotonic time ``until`` (the end of the
        wait), stopping the helper thread first."""
        self.stop()
        for index in indices:
            if self._clock.monotonic() >= until:
                return
            self._one(index, None)

    def start(self) -> None:
        """Start the helper thread (none is running): translate every batch from the one in flight on. Called
        from the lane's watchdog (``on_slow``): never blocks (while :meth:`stop` ends a helper, it starts none)."""
        if not self._guard.acquire(blocking=False):
            return
        try:
            if self._thread is not None:
                return
            self._stop.clear()
            thread = threading.Thread(target=self._run, name="spark-sb-backlog-ahead", daemon=True)
            thread.start()
            self._thread = thread
        finally:
            self._guard.release()

    def stop(self) -> None:
        """End the helper thread, if one runs, after the message it is at (waited for); it may be started again.
        A :meth:`start` under way is waited for first (it takes moments: it only starts a thread)."""
        with self._guard:
            thread = self._thread
            if thread is None or thread is threading.current_thread():
                return
            self._stop.set()
            thread.join()
            self._thread = None

    def _run(self) -> None:
        count = len(self._batches)
        first = self.in_flight
        for index in [*range(first, count), *range(first)]:
            if self._stop.is_set():
                return
            self._one(index, self._stop)

    def _one(self, index: int, stop: threading.Event | None) -> None:
        if index in self._ready:
            return
        now = self._clock.now()
        out: list[object | None] = []
        for message in self._batches[index].messages:
            if stop is not None and stop.is_set():
                return  # unfinished: not kept
            try:
                out.append(self._prepare(message, message.entity or self._default, now))
            except (ValueError, TypeError):  # RejectError is a ValueError: the divert rejects it itself
                out.append(None)
        self._ready[index] = out
