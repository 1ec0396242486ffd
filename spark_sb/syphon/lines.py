"""The syphon's ordered drain (``ordering: session`` / ``entity``; the rule is :mod:`spark_sb.failover.ordering`): a
line - (primary entity, session id), or the entity - is moved in queue order (SPEC O1, O6, O7).

:class:`QueueView` is the proof, and it lives in the queue, not in a process (the syphon job's next task may run in
another Python worker; a killed task leaves locks nobody remembers): for each receive batch a pass proves, by peeks
(browses), what the queue holds through the highest sequence number it received - a peek lists messages locked by
anybody and deferred ones, which a receive skips. A message of a line that is in the queue before one the pass
received, and that the pass does not hold, holds the rest of the line back (its return marker is not acknowledged).
What is held back is *deferred*, not abandoned: it keeps its place, no receive returns it again and its delivery
count does not rise; a later pass finds it in the view and fetches it by sequence number when its line can move,
merged in sequence order with the line's received messages. Only a real attempt to move a message (a failed send)
abandons it, and only once (:func:`~spark_sb.syphon.rules.keeps_count`): its count does not follow an outage.

Cost, per pass and queue: a peek shows only what a receive could not. Sequence numbers are assigned gapless and
increasing per (non-partitioned) entity - the service's rule, the local namespace's too; backlog queues are
provisioned unpartitioned - so a message of the queue that the pass did not receive lies before the first one it
received, or in a gap between two it received (:func:`next_peek`): one one-message peek from sequence number 1 shows
whether anything is ahead; each gap is peeked with as many messages as it has numbers (gaps a few received messages
apart in one peek); what the view covers is not peeked again in the pass. A receive batch continuing a contiguous
run costs no peek. A pass that leaves nothing of what it covered in the queue proves that nothing up to there is in
it for good (no number is given twice): the syphon's next passes start there, for :data:`CLEAR_FOR` at most. When a receive comes back empty the rest of the queue (locked or deferred messages only) is peeked
once (pages of :data:`PEEK_PAGE`); deferred messages are fetched at most ``syphon.batch_size`` per batch, and not at
all while their entity backs off.

:class:`Lines` pauses a queue after a failed receive (the worker that saw it waits for the locks it may have
taken; every other worker is protected by the view). Its heads (:meth:`Lines.hold`, :meth:`Lines.admits`) are a
process's memory of held lines, kept for callers; the drain itself no longer relies on them.

Where it runs: in the syphon's process, on the draining thread; not picklable, not shared.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

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


# ------------------------------------------------------------------------------------------- the queue's view
#: Peeked message states (the service's ``x-opt-message-state``): active (available or locked), deferred, scheduled.
ACTIVE, DEFERRED, SCHEDULED = 0, 1, 2
#: Messages per peek page (the most one peek asks for).
PEEK_PAGE = 250
#: How long a syphon starts its passes' views where its last pass left the queue clear (seconds): at least this
#: often a pass proves from the queue's start (what another worker left behind there is found within it).
CLEAR_FOR = 60.0
#: Two gaps at most this many received messages apart are peeked in one call (the received ones between read once
#: more): a peek's round trip costs more than reading a few messages.
PEEK_MERGE = 16


def next_peek(covered: int, received: Sequence[int]) -> tuple[int, tuple[int, int] | None]:
    """The next peek that proves a view covering sequence numbers through ``covered`` up to the last of ``received``
    (this pass's received sequence numbers, sorted, distinct; gapless numbering assumed): ``(covered, (first
    sequence number, max_message_count))`` with ``covered`` moved over the received messages that continue it, or
    ``(covered, None)`` when nothing is left to prove. Nothing covered yet: one message from 1 (the queue's oldest
    present one: ahead of the first received or not). Else the gap up to the next received message, merged with the
    gaps after it while the received runs between are at most :data:`PEEK_MERGE` long, at most :data:`PEEK_PAGE`
    messages. A peek answer is the present messages from its first sequence number on, in order: whatever it
    lists, it covers through its last (pure)."""
    i = bisect_right(received, covered)
    while i < len(received) and received[i] == covered + 1:
        covered += 1
        i += 1
    if i == len(received):
        return covered, None
    start = covered + 1
    if covered == 0:
        return covered, (1, 1)
    end = received[i] - 1  # the gap's last sequence number
    while True:
        run = i
        while run + 1 < len(received) and received[run + 1] == received[run] + 1:
            run += 1
        if run + 1 >= len(received) or run - i + 1 > PEEK_MERGE:
            break
        if received[run + 1] - start > PEEK_PAGE:  # the merged peek would ask for more than a page
            break
        end = received[run + 1] - 1
        i = run + 1
    return covered, (start, min(PEEK_PAGE, end - start + 1))


class QueueView:
    """One drain pass's view of one backlog queue (SPEC O6, O7): what a peek (browse) showed, which - unlike a
    receive - lists messages locked by anybody and deferred ones. The queue is the shared truth between the syphons
    of every Python worker: a message of a line present in the queue before one this pass received, and not received
    by it (locked elsewhere, or by a receive whose answer was lost, or an abandon that failed), holds the line back;
    a deferred one is fetched by sequence number and moved in its place.

    ``through``: every message with a sequence number up to it that was in the queue at its peek, or received by
    the pass, is in the view (sequence numbers only grow, so nothing new appears below it; what leaves is forgotten
    with :meth:`gone`); the caller moves it as its peeks prove (:func:`next_peek`).
    ``failed``: a peek failed - the view proves nothing past ``through``. Pure bookkeeping; where it runs: the
    draining thread of the syphon's process, for one pass. What bounds it: the messages of the queue up to the
    highest sequence number the pass received, and what the peeks showed past it."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.through = 0
        self.failed = False
        self._entries: dict[int, tuple[LineKey | None, int]] = {}  # sequence number -> (line, state)
        self._held: dict[
            LineKey, int
        ] = {}  # line -> sequence number it is held back from, for the rest of the pass

    def add(self, sequence: int, line: LineKey | None, state: int) -> None:
        """A message present in the queue (peeked, or received by the pass: ``ACTIVE``); ``through`` is not moved."""
        self._entries[sequence] = (line, state)

    def covers(self, sequence: int) -> bool:
        return sequence <= self.through

    def gone(self, sequence: int | None) -> None:
        """The message left the queue (completed, dead-lettered by this pass)."""
        if sequence is not None:
            self._entries.pop(sequence, None)

    def mark(self, sequence: int | None, state: int) -> None:
        """The message is back in the queue in ``state`` (deferred, or active after an abandon)."""
        if sequence is not None and sequence in self._entries:
            self._entries[sequence] = (self._entries[sequence][0], state)

    def hold(self, line: LineKey | None, sequence: int | None = None) -> None:
        """Nothing of ``line`` from ``sequence`` on (None: all of it) moves in this pass: it was not moved."""
        if line is not None:
            start = 0 if sequence is None else sequence
            self._held[line] = min(self._held.get(line, start), start)

    def held(self, line: LineKey | None, sequence: int | None = None) -> bool:
        """Is ``line`` held back at ``sequence`` (None: anywhere) in this pass?"""
        if line is None or line not in self._held:
            return False
        return sequence is None or sequence >= self._held[line]

    def deferred(self) -> list[int]:
        return sorted(s for s, (_, state) in self._entries.items() if state == DEFERRED)

    def plan(
        self, mine: dict[int, LineKey | None], budget: int
    ) -> tuple[set[int], dict[LineKey | None, list[int]]]:
        """Which received messages (``mine``: sequence number -> line) may move now, and which deferred messages to
        fetch first (per line, in queue order; at most ``budget`` in all). Per line, in sequence order: a received
        or deferred message moves while nothing before it in the queue held it back; a message present that this
        pass did not receive (locked elsewhere) holds back the rest of its line, as does a held line, a deferred
        message over the budget, or a sequence number the view does not cover. Messages without a line (no order
        kept) move, their deferred ones are fetched within the budget."""
        by_line: dict[LineKey | None, list[tuple[int, bool, int]]] = {}  # line -> (seq, mine, state)
        for seq, (line, state) in self._entries.items():
            if seq not in mine and state != SCHEDULED:
                by_line.setdefault(line, []).append((seq, False, state))
        for seq, line in mine.items():
            by_line.setdefault(line, []).append((seq, True, ACTIVE))
        movable: set[int] = set()
        fetch: dict[LineKey | None, list[int]] = {}
        left = budget
        for line in sorted(by_line, key=lambda k: min(s for s, _, _ in by_line[k])):
            blocked = False
            for seq, received, state in sorted(by_line[line]):
                if line is None:  # no order kept: each message on its own
                    if received:
                        movable.add(seq)
                    elif state == DEFERRED and left > 0:
                        fetch.setdefault(line, []).append(seq)
                        left -= 1
                    continue
                if blocked or self.held(line, seq) or not self.covers(seq):
                    blocked = True
                    continue
                if received:
                    movable.add(seq)
                elif state == DEFERRED and left > 0:
                    fetch.setdefault(line, []).append(seq)
                    left -= 1
                else:  # locked by someone else (or deferred over the budget): the line waits behind it
                    blocked = True
        return movable, fetch

    def __len__(self) -> int:
        return len(self._entries)
