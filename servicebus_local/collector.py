"""Keep the messages a namespace holds out of Python's cyclic garbage collector (``python -m servicebus_local``).

A namespace that holds many messages (a primary nobody drains, with a 20 s TTL at 5,000 messages/s: ~120,000
messages, two tracked objects each) paid a full collection of all of them every few seconds: measured 0.2-0.4 s
with the whole server stopped, growing with the messages held. The service has no such pauses, and a producer with
a short send budget (``failover_interval`` 0: 0.45 s) saw healthy entities time out and fail over because of the
emulator alone.

Stored messages form no reference cycles: they are freed by reference counting when they are settled, expire or
are purged, whether the collector tracks them or not. So :class:`CollectorPolicy` moves what survived the young
generations into the collector's permanent generation (:func:`gc.freeze`) every step: the automatic collections
then scan only what was created since the last step. Cyclic garbage among frozen objects (a connection's objects
that were alive at a step and later dropped in a cycle) is not collected until :func:`gc.unfreeze`; the policy
bounds it: when the frozen objects outnumber twice what the messages held and the last full collection's survivors
account for, it unfreezes and collects everything once (the old pause, only then).

Process-wide, so it is only for a process the namespace owns: ``python -m servicebus_local`` runs it from its main
thread; an in-process :class:`~servicebus_local.server.LocalNamespace` (tests, notebooks) leaves the collector of
its host process alone.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Protocol

#: Tracked objects per held message: the broker's ``Message`` and its ``MessageParts``.
OBJECTS_PER_MESSAGE = 2
#: Slack before a full collection: frozen objects beyond twice the expected number plus this many.
SLACK = 100_000


class _Gc(Protocol):
    def collect(self, generation: int = 2) -> int: ...
    def freeze(self) -> None: ...
    def unfreeze(self) -> None: ...
    def get_freeze_count(self) -> int: ...


class CollectorPolicy:
    """Freeze survivors each :meth:`step`; collect everything when the frozen objects exceed their bound.

    ``held_messages`` returns how many messages the namespace holds now (every store, dead-letter queues too).
    ``gc_module`` is :mod:`gc` (a fake in unit tests). Not thread-safe: one caller (the main thread).
    """

    def __init__(self, held_messages: Callable[[], int], gc_module: _Gc | None = None) -> None:
        self._held = held_messages
        self._gc: _Gc = gc_module if gc_module is not None else gc  # type: ignore[assignment]
        self._baseline = 0  # frozen objects right after the last full collection, messages excluded
        self.full_collections = 0

    def start(self) -> None:
        """A full collection, then freeze: the server's own long-lived objects leave the scans for good."""
        self._full()

    def bound(self) -> int:
        """The most frozen objects allowed before a full collection."""
        return 2 * (self._baseline + OBJECTS_PER_MESSAGE * self._held()) + SLACK

    def step(self) -> None:
        """Collect the young generations (short-lived cycles, such as exceptions with their tracebacks, die
        there), freeze what survived; a full collection if the frozen objects exceed :meth:`bound`."""
        g = self._gc
        g.collect(1)
        g.freeze()
        if g.get_freeze_count() > self.bound():
            self._full()

    def _full(self) -> None:
        g = self._gc
        g.unfreeze()
        g.collect()
        g.freeze()
        held = OBJECTS_PER_MESSAGE * self._held()
        self._baseline = max(0, g.get_freeze_count() - held)
        self.full_collections += 1
