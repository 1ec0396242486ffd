"""The settle step (SOURCE.md §4 step 1, R13, R15): delete a committed manifest's deferred messages by number.

Runs on the driver (the planner process), from ``latestOffset(start)`` and ``commit(end)``; not picklable.

For one channel, the numbers to settle are the manifest's ``m`` and its ``owed``. They are deleted 100 per request
(:meth:`~spark_sb.source.transport.EntityLink.delete`, no retry). A request refused with
:class:`~spark_sb.source.transport.NotFound` (one number in it is not a deferred message) is resolved by one peek
of its numbers: the DEFERRED ones are deleted again (bisected down to single numbers if refused again), the others
are not deleted. A number not deleted is peeked: still there -> **owed** (completed when next received); gone ->
**dropped**. The peek before the bisect is a change from the design's plain bisect: an owed batch of 50,000 active
numbers would cost 100,000 refused deletes; this costs one peek and one delete per 100.

Every call has a deadline; past the step's deadline, or after a namespace fault, what was not tried stays owed (the
next settle tries it again: a deferred owed number is deleted then). Idempotent: a number already deleted is found
gone. :class:`Settler` remembers the last few manifests it settled completely and skips them.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from spark_sb.core.clock import Clock
from spark_sb.source.manifest import Manifest, Ranges, count, numbers, ranges_of, union
from spark_sb.source.transport import DEFERRED, EntityLink, NotFound

log = logging.getLogger(__name__)

#: Numbers per delete request (the service's receive-by-sequence-number takes a list; SOURCE.md §4).
CHUNK = 100
#: Messages per peek page.
PEEK_PAGE = 100
#: Settled manifests remembered per process (the last few: a start is settled by commit() and latestOffset()).
REMEMBER = 8


@dataclass(frozen=True)
class SettleResult:
    """What one settle did (driver; picklable): the new owed ranges of the channel and the counts."""

    owed: Ranges
    settled: int
    dropped: int
    #: Every number was tried (no deadline passed, no namespace fault).
    complete: bool = True

    @property
    def owed_count(self) -> int:
        return count(self.owed)


class _Deadline:
    def __init__(self, clock: Clock, seconds: float, call_timeout: float) -> None:
        self.clock = clock
        self.end = clock.monotonic() + seconds
        self.call_timeout = call_timeout

    def left(self) -> float:
        return min(self.call_timeout, self.end - self.clock.monotonic())


def _present(link: EntityLink, seqs: Sequence[int], deadline: _Deadline) -> tuple[set[int], set[int], bool]:
    """``(present, deferred, doubt)`` among ``seqs`` by peek. A number whose peek failed counts as present and not
    deferred (never dropped on a doubt: a dropped number that is still there would be emitted again); ``doubt``
    says so, and the settle is incomplete (tried again)."""
    found: set[int] = set()
    deferred: set[int] = set()
    doubt = False
    for lo, hi in ranges_of(seqs):
        cur = lo
        while cur <= hi:
            timeout = deadline.left()
            try:
                if timeout <= 0:
                    raise TimeoutError("the settle step's deadline passed")
                page = link.peek(cur, min(PEEK_PAGE, hi - cur + 1), timeout)
            except Exception as exc:  # noqa: BLE001 - a doubt keeps the rest owed
                log.debug("peek from %d failed (%s): kept owed", cur, exc)
                found.update(range(cur, hi + 1))
                doubt = True
                break
            for p in page:
                if lo <= p.seq <= hi:
                    found.add(p.seq)
                    if p.state == DEFERRED:
                        deferred.add(p.seq)
            if not page or page[-1].seq >= hi:
                break
            cur = page[-1].seq + 1
    return found & set(seqs), deferred & set(seqs), doubt


def settle_numbers(
    link: EntityLink, seqs: Sequence[int], clock: Clock, *, timeout: float = 60.0, call_timeout: float = 10.0
) -> tuple[set[int], set[int], set[int], bool]:
    """Delete ``seqs``: ``(deleted, owed, dropped, complete)``. See the module docstring."""
    deadline = _Deadline(clock, timeout, call_timeout)
    deleted: set[int] = set()
    refused: list[int] = []  # single numbers refused after a peek showed them deferred: peeked again below
    gone: set[int] = set()
    kept: set[int] = set()
    untried: list[int] = []
    ordered = sorted(set(seqs))
    chunks = [ordered[i : i + CHUNK] for i in range(0, len(ordered), CHUNK)]
    faulted = False
    for chunk in chunks:
        if faulted or deadline.left() <= 0:
            untried.extend(chunk)
            faulted = True
            continue
        try:
            link.delete(chunk, deadline.left())
            deleted.update(chunk)
            continue
        except NotFound:
            pass
        except Exception as exc:  # noqa: BLE001 - maybe deleted (a lost reply): tried again next settle
            log.info("settle: delete of %d numbers failed (%s); kept owed", len(chunk), exc)
            untried.extend(chunk)
            faulted = True
            continue
        there, deferred, doubt = _present(link, chunk, deadline)
        faulted = faulted or doubt
        gone.update(n for n in chunk if n not in there)
        kept.update(there - deferred)  # active or locked: owed, completed when next received
        faulted = _bisect(link, sorted(deferred), deadline, deleted, refused, untried) or faulted
    there, _, doubt = _present(link, refused, deadline) if refused else (set(), set(), False)
    faulted = faulted or doubt
    owed = set(untried) | kept | there
    dropped = gone | (set(refused) - there)
    return deleted, owed, dropped, not faulted


def _bisect(
    link: EntityLink,
    seqs: list[int],
    deadline: _Deadline,
    deleted: set[int],
    refused: list[int],
    untried: list[int],
) -> bool:
    """Delete ``seqs``, halving a refused request down to single numbers. True after a namespace fault."""
    stack = [seqs] if seqs else []
    while stack:
        part = stack.pop()
        timeout = deadline.left()
        if timeout <= 0:
            untried.extend(n for p in [part, *stack] for n in p)
            return True
        try:
            link.delete(part, timeout)
            deleted.update(part)
        except NotFound:
            if len(part) == 1:
                refused.append(part[0])
            else:
                mid = len(part) // 2
                stack.extend([part[mid:], part[:mid]])
        except Exception as exc:  # noqa: BLE001
            log.info("settle: delete of %d numbers failed (%s); kept owed", len(part), exc)
            untried.extend(n for p in [part, *stack] for n in p)
            return True
    return False


class Settler:
    """The settle step for one channel on one link (driver; not picklable). Remembers (bounded: :data:`REMEMBER`)
    the manifests it settled completely, so ``commit(end)`` then ``latestOffset(end)`` settle once."""

    def __init__(
        self, channel: str, clock: Clock, *, timeout: float = 60.0, call_timeout: float = 10.0
    ) -> None:
        self.channel = channel
        self.clock = clock
        self.timeout = timeout
        self.call_timeout = call_timeout
        self._done: OrderedDict[str, SettleResult] = OrderedDict()  # bounded: REMEMBER entries

    def settled(self, manifest: Manifest) -> SettleResult | None:
        """The remembered result of settling ``manifest``, if this process settled it completely."""
        return self._done.get(manifest.to_json())

    def settle(self, link: EntityLink, manifest: Manifest) -> SettleResult:
        key = manifest.to_json()
        if key in self._done:
            self._done.move_to_end(key)
            return self._done[key]
        targets = union(manifest.ranges(self.channel), manifest.owed_ranges(self.channel))
        if not targets:
            result = SettleResult(owed=(), settled=0, dropped=0)
        else:
            deleted, owed, dropped, complete = settle_numbers(
                link, list(numbers(targets)), self.clock, timeout=self.timeout, call_timeout=self.call_timeout
            )
            result = SettleResult(ranges_of(owed), len(deleted), len(dropped), complete)
            log.info(
                "settle of batch %d on %s: %d deleted, %d owed, %d dropped%s",
                manifest.b,
                self.channel,
                result.settled,
                result.owed_count,
                result.dropped,
                "" if complete else " (incomplete: tried again at the next settle)",
            )
        if result.complete:
            self._done[key] = result
            while len(self._done) > REMEMBER:
                self._done.popitem(last=False)
        return result
