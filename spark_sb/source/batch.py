"""The planner's numbers (driver; picklable): its limits, one batch's stats, a planned batch not yet settled, and
the entity's backlog report (``reportLatestOffset``).

:class:`PlannerLimits` comes from the reader's options (:func:`spark_sb.spark.reader.limits_of`); the
:class:`~spark_sb.source.planner.SourcePlanner` fills a :class:`BatchStats` per batch and gives it to ``on_batch``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spark_sb.core.clock import Clock
from spark_sb.source.locks import Held
from spark_sb.source.manifest import MAX_OFFSET_RANGES, MAX_PER_PARTITION, Manifest, Ranges, count
from spark_sb.source.transport import EntityLink

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlannerLimits:
    """The planner's limits, in plain numbers (seconds, counts, bytes); defaults as SOURCE.md §10. Picklable."""

    max_messages: int = 50_000  # maxMessagesPerTrigger
    max_bytes: int | None = None  # maxBytesPerTrigger (no cap on the peek route unless set)
    min_messages: int = 0  # minMessagesPerTrigger
    max_trigger_delay: float = 900.0  # maxTriggerDelay (15m)
    max_receive_time: float = 10.0  # maxReceiveTime
    receive_wait: float = 1.0  # receiveWaitTime
    # messages asked per receive call: 500 receives 5,000 messages in 0.65-1.06 s on the local namespace, 100 in
    # 1.4-2.4 s (the SDK's per-call cost; prefetch 0, so this is the link credit)
    receive_batch: int = 500
    min_partitions: int | None = None  # minPartitions
    max_per_partition: int = MAX_PER_PARTITION  # maxMessagesPerPartition
    max_offset_ranges: int = MAX_OFFSET_RANGES  # maxOffsetRanges
    fail_on_data_loss: bool = True  # failOnDataLoss
    recover_deferred: bool = False  # recoverDeferred
    # deferAfter: a planned batch's messages stay locked (renewed) this long, then are deferred; a batch committed
    # sooner is completed with its locks (no defer, no delete by number). 0: deferred at once
    defer_after: float = 10.0
    call_timeout: float = 10.0  # every link call's deadline
    settle_timeout: float = 60.0  # one settle step's deadline


@dataclass
class BatchStats:
    """One batch's numbers, given to ``on_batch`` once its messages are deferred (driver; picklable)."""

    b: int
    received: int = 0
    read_ahead: int = (
        0  # of ``received``, held before the trigger asked (read ahead, or carried by the range cut)
    )
    bytes: int = 0
    owed_completed: int = 0
    settled: int = 0
    owed: int = 0
    dropped: int = 0
    deferred: int = 0
    completed: int = 0  # completed at commit with their locks (committed within deferAfter: never deferred)
    defer_failed: int = 0
    max_delivery_count: int = 0
    near_dead_letter: int = 0
    receive_seconds: float = 0.0
    defer_seconds: float = 0.0
    settle_seconds: float = 0.0


@dataclass
class Pending:
    """The manifest returned by ``latest_offset`` and not yet planned: its start, and the messages to defer."""

    start: Manifest
    end: Manifest
    held: dict[int, Held]  # bounded by the batch (maxMessagesPerTrigger)
    stats: BatchStats


def backlog_report(
    link: Callable[[], EntityLink],
    known: Manifest | None,
    owed_now: tuple[str, Ranges] | None,
    channel: str,
    clock: Clock,
    timeout: float,
) -> dict[str, Any]:
    """``reportLatestOffset``: the entity's backlog from its admin counts (``deferredOnEntity``: what the query
    planned and has not settled yet); ``None`` where a call failed (driver)."""
    out: dict[str, Any] = {"activeMessages": None, "deferredOnEntity": None}
    out["owed"], out["oldestAgeSeconds"] = count(owed_now[1]) if owed_now else 0, None
    try:
        counts = link().counts(timeout)
        # the service counts a deferred message as active: the planned batch's numbers (deferred, not yet deleted)
        # are told apart by what this query knows, not by a count
        unsettled = 0
        if known is not None and (owed_now is None or owed_now[0] != known.to_json()):
            unsettled = count(known.ranges(channel))
        out["activeMessages"] = max(0, counts.active - unsettled)
        out["deferredOnEntity"] = unsettled
        first = link().peek(0, 1, timeout)
        enqueued = getattr(first[0].message, "enqueued_time_utc", None) if first else None
        if enqueued is not None:
            out["oldestAgeSeconds"] = max(0.0, (clock.now() - enqueued).total_seconds())
    except Exception as exc:  # noqa: BLE001
        log.info("source %s: no backlog report (%s)", channel, exc)
    return out
