"""Orphan deferred messages at a new checkpoint (SOURCE.md §6, R24): deferred messages no offset of the checkpoint
names, invisible to receive. The planner WARNs their count; with ``recoverDeferred`` it adopts them (its sweep).

:class:`OrphanCount` is the WARN without ``recoverDeferred``. A sweep at ``initialOffset`` would peek the whole
backlog, twice (Spark 4.2 asks a new checkpoint's initial offset twice). So only the highest number present is
pinned then (W, by a galloping peek), and the count waits until a receive comes back empty or passes W. By then
the backlog present at start was received, and only what could not be received is left to peek up to W.

Driver (the planner process), under the planner's lock; not picklable. Bounded: one number and a flag.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from spark_sb.source.manifest import Ranges, count, minus
from spark_sb.source.reader import PeekFn, deferred_numbers, highest
from spark_sb.source.transport import Received

log = logging.getLogger(__name__)

#: recoverDeferred adopts at most this many orphan deferred messages (the rest: a WARN, run it again).
ADOPT_MAX = 1_000_000
#: The messages a counting sweep looks at, at most (400 pages of 250).
COUNT_SWEEP = 100_000


class OrphanCount:
    """One entity's orphan count at a new checkpoint (see the module docstring)."""

    def __init__(self, entity: str, recovering: bool) -> None:
        self.entity = entity
        self.recovering = recovering
        self.upto: int | None = None  # W, the highest number present at start (None: nothing to count)
        self.ready = False  # a receive came back empty or passed W

    def forget(self) -> None:
        self.upto, self.ready = None, False

    def pin(self, peek: PeekFn) -> None:
        """At ``initialOffset``, the entity not empty: pin W."""
        try:
            self.upto = highest(peek)
        except Exception as exc:  # noqa: BLE001
            log.warning("source %s: orphan deferred messages unknown at start (%s)", self.entity, exc)

    def received(self, got: Sequence[Received]) -> None:
        """After each receive."""
        if self.upto is not None and (not got or max(r.seq for r in got) >= self.upto):
            self.ready = True

    def count(self, peek: PeekFn, owed: Ranges) -> None:
        """Right after settling ``start``, once ready: the DEFERRED numbers up to W, by a peek sweep of what is left
        there. This run's deferred numbers are deleted by then, or ``owed`` (left out), so the rest are orphans. A
        failed sweep is tried again next time."""
        upto = self.upto
        if upto is None or not self.ready:
            return
        try:
            found = deferred_numbers(peek, COUNT_SWEEP, limit=COUNT_SWEEP, upto=upto)
        except Exception as exc:  # noqa: BLE001
            log.info("source %s: orphan deferred messages not counted yet (%s)", self.entity, exc)
            return
        self.upto = None
        self.warn(count(minus(found.numbers, owed)), found.complete)

    def warn(self, deferred: int, complete: bool) -> None:
        """The WARN (none for 0)."""
        if deferred:
            log.warning(
                "source %s: %s%d deferred messages are named by no offset of this checkpoint (a lost or new "
                "checkpoint); %s",
                self.entity,
                "" if complete else "at least ",
                deferred,
                "adopting them (recoverDeferred)"
                if self.recovering
                else "they stay invisible: set recoverDeferred=true or run `spark-sb source recover` to read them",
            )
