"""The executors' read of one partition (SOURCE.md §4 ``read(p)``, R13, R17): peek its ranges, keep its numbers.

Runs in executors' Python workers, in ``read(partition)``: stateless; the :class:`~spark_sb.source.manifest.
PartitionSpec` is picklable, the :class:`~spark_sb.source.transport.Peeker` is the process's cached client (not
picklable, never shipped). Peeks have no side effects, so a retried task reads the same messages. Rows are made by
:mod:`~spark_sb.source.rows` from the :class:`~spark_sb.source.transport.Peeked` this yields. Also the driver's peek
walks over any peek function: :func:`highest` (AvailableNow's watermark, the batch read's end) and
:func:`deferred_numbers` (recoverDeferred).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from spark_sb.source.faults import fault
from spark_sb.source.manifest import PartitionSpec, Ranges, count, ranges_of
from spark_sb.source.transport import DEFERRED, Peeked, Peeker

log = logging.getLogger(__name__)

#: Messages per peek page.
PAGE = 100
#: Missing numbers named in an error or a warning (the count is always given).
NAMED = 20


class DataLossError(RuntimeError):
    """Numbers of a committed-to manifest are no longer on the entity (``failOnDataLoss=true``), or the entity was
    re-created under the checkpoint."""


@dataclass
class ReadStats:
    """What one partition's read saw (executor; picklable): messages yielded, pages peeked, numbers missing."""

    yielded: int = 0
    pages: int = 0
    missing: int = 0


def describe(ranges: Ranges) -> str:
    shown = ", ".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in ranges[:NAMED])
    return shown + (f", ... ({len(ranges) - NAMED} more ranges)" if len(ranges) > NAMED else "")


def read_partition(
    spec: PartitionSpec,
    peeker: Peeker,
    *,
    fail_on_data_loss: bool = True,
    timeout: float = 10.0,
    page: int = PAGE,
    stats: ReadStats | None = None,
) -> Iterator[Peeked]:
    """The messages of ``spec`` in sequence order, by peek from each range's ``lo``. Numbers missing fail the
    read at its end with :class:`DataLossError` (``fail_on_data_loss``), or are WARNed and counted in ``stats``."""
    stats = stats if stats is not None else ReadStats()
    missing: list[int] = []
    for lo, hi in spec.ranges:
        cur = lo
        while cur <= hi:
            was = cur
            got = peeker.peek(spec.entity, cur, min(page, hi - cur + 1), timeout)
            stats.pages += 1
            for p in got:
                if p.seq < cur:
                    continue
                if p.seq > hi:
                    break
                missing.extend(range(cur, p.seq))
                cur = p.seq + 1
                stats.yielded += 1
                yield p
            fault("read")  # a test hook (faults.py), off by default
            if not got or got[-1].seq > hi or cur == was:
                break
        if cur <= hi:
            missing.extend(range(cur, hi + 1))
    if not missing:
        return
    gone = ranges_of(missing)
    stats.missing += count(gone)
    msg = (
        f"data loss on {spec.entity}: {count(gone)} messages of the batch's manifest are gone from the entity "
        f"(sequence numbers {describe(gone)}). Likely causes: their time to live ran out, another consumer "
        "received them (one query per entity), or the entity was purged"
    )
    if fail_on_data_loss:
        raise DataLossError(msg + "; set failOnDataLoss=false to go on without them")
    log.warning("%s; going on (failOnDataLoss=false)", msg)


#: ``peek(from_seq, count)``: one peek call with its deadline bound in.
PeekFn = Callable[[int, int], list[Peeked]]


def highest(peek: PeekFn, start: int = 0) -> int:
    """The highest sequence number present from ``start`` (-1: none): a galloping peek, then a bisection
    (about 2*log2 of the span in peeks). Numbers are never reused, so a miss at ``n`` means none at or above it."""
    first = peek(start, 1)
    if not first:
        return -1
    lo, step = first[0].seq, 1
    while True:
        probe = peek(lo + step, 1)
        if not probe:
            hi = lo + step
            break
        lo, step = probe[0].seq, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        probe = peek(mid, 1)
        if probe:
            lo = probe[0].seq
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class Sweep:
    """The DEFERRED numbers a sweep found, and whether it reached the entity's end."""

    numbers: Ranges
    complete: bool


def deferred_numbers(
    peek: PeekFn, most: int, page: int = 250, *, limit: int | None = None, upto: int | None = None
) -> Sweep:
    """The DEFERRED numbers present (a sweep by peek from 0), the lowest ``most`` of them; ``limit``: look at
    no more than that many messages of any state; ``upto``: none above that number."""
    found: list[int] = []
    cur = seen = 0
    complete = False
    while len(found) < most and (limit is None or seen < limit):
        want = page if upto is None else min(page, upto - cur + 1)
        got = peek(cur, want) if want > 0 else []
        got = [p for p in got if upto is None or p.seq <= upto]
        if not got:
            complete = True
            break
        seen += len(got)
        found.extend(p.seq for p in got if p.state == DEFERRED)
        cur = got[-1].seq + 1
    return Sweep(ranges_of(found[:most]), complete)
