"""The syphon's ordered drain (``ordering: session`` / ``entity``; the rule is :mod:`spark_sb.failover.ordering`): a
line - (primary entity, session id), or the entity - is moved in queue order, and a message the syphon did not
move (abandoned: its entity backs off, its send failed, its lock was about to run out, the drain was cancelled)
holds back every later message of its line until it comes back. The service redelivers an abandoned message
before anything behind it in the queue, so the rest of its line is abandoned too and comes back after it.

:class:`Lines` keeps, per (backlog queue, entity, line), the sequence number of the first message held back - the
line's *head* - on an injected clock. A later message of the line is not moved (:meth:`Lines.admits` is False)
until the head, or anything before it, is received again. Sequence numbers make this hold across receive batches,
drains and a receiver's prefetch buffer: a message received after the head went back is behind it whatever
path brought it. An entry whose head is not met again within ``horizon`` seconds (it left the queue some other
way: dead-lettered by hand, say) is dropped.

:meth:`Lines.pause` stops a queue's drain for a while: after a receive failed, the messages it may have locked
are not known, and a later message of their lines must not be moved before their locks run out.

What bounds it: the lines held back (each dropped when its head is met again, or after ``horizon``) and the
queues paused. Where it runs: in the syphon's process, on the draining thread; not picklable, not shared.
"""

from __future__ import annotations

from spark_sb.core.clock import Clock

#: A line key: (backlog queue, primary entity, session id - ``""`` for a whole entity).
LineKey = tuple[str, str, str]

#: How long an entry waits for its head before it is dropped (seconds): ten times the backlog queues' lock (60 s).
HORIZON = 600.0
#: How long a queue is left alone after a receive failed (seconds): the backlog queues' lock duration (provisioned
#: at 60 s) and a margin, so that whatever that receive locked is available again, in queue order.
RECEIVE_FAILURE_PAUSE = 65.0


class Lines:
    """The heads of the lines held back, per backlog queue (see the module docstring)."""

    def __init__(self, clock: Clock, *, horizon: float = HORIZON) -> None:
        self.clock = clock
        self.horizon = horizon
        self._heads: dict[LineKey, tuple[int, float]] = {}  # line -> (head's sequence number, held since)
        self._paused: dict[str, float] = {}  # queue -> monotonic time its drain may go on

    def admits(self, line: LineKey, sequence: int | None) -> bool:
        """May the message ``sequence`` of ``line`` be moved now? True when nothing of its line is held back, or
        when it is the head (or before it): the entry is dropped then."""
        entry = self._heads.get(line)
        if entry is None:
            return True
        head, since = entry
        if sequence is not None and sequence <= head:
            del self._heads[line]
            return True
        if self.clock.monotonic() - since > self.horizon:
            del self._heads[line]
            return True
        return False

    def hold(self, line: LineKey, sequence: int | None) -> None:
        """The message ``sequence`` of ``line`` was not moved: nothing after it in the queue is, until it is back.
        (A message without a sequence number cannot be placed: not held.)"""
        if sequence is None:
            return
        entry = self._heads.get(line)
        if entry is None or sequence <= entry[0]:
            self._heads[line] = (sequence, self.clock.monotonic())

    def held(self, queue: str | None = None) -> list[LineKey]:
        """The lines held back (of ``queue``)."""
        return [line for line in self._heads if queue is None or line[0] == queue]

    def pause(self, queue: str, seconds: float = RECEIVE_FAILURE_PAUSE) -> None:
        self._paused[queue] = self.clock.monotonic() + seconds

    def paused(self, queue: str) -> bool:
        until = self._paused.get(queue)
        if until is None:
            return False
        if self.clock.monotonic() >= until:
            del self._paused[queue]
            return False
        return True

    def __len__(self) -> int:
        return len(self._heads)
