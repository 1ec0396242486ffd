"""The syphon job's task (SPEC S7, B11, B12): one backlog queue (or its dead-letter queue) drained for at most
``syphon.batch_duration`` by a :class:`~spark_sb.syphon.mover.Syphon` from the worker's pool (:data:`SYPHONS`,
kept across micro-batches, closed after ``idle_timeout``), yielding one row per message moved and one per (entity,
kind) for anything else (:data:`ROW_SCHEMA`); with ordering, the return markers passed as ``acknowledged`` rows.

Where it runs: executors (a Python worker, the data source's ``read``). Never raises: an error becomes a
``syphon_error`` row. Why: docs/design/syphon-job.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.sender.pool import SenderPool, config_key
from spark_sb.state.records import (
    ABANDONED,
    ACKNOWLEDGED,
    DEAD_LETTERED,
    EXPIRED,
    MOVED,
    PARKED,
    POSSIBLE_DUPLICATE,
    SETTLE_FAILED,
    SYPHON_ERROR,
)
from spark_sb.syphon.mover import Syphon
from spark_sb.syphon.rules import DESTINATION_NOT_FOUND, LOCK_DURATION, NOT_A_BACKLOG_MESSAGE, SyphonOutcome

#: The syphon job logs under one name (what users configure): ``spark_sb.spark.syphon_job``.
log = logging.getLogger("spark_sb.spark.syphon_job")


ROW_SCHEMA = (
    "queue STRING, dead_letter BOOLEAN, entity STRING, kind STRING, count BIGINT, message_id STRING, "
    "detail STRING"
)
#: The receive wait inside a micro-batch: the planner already knows there are messages (admin counts), so a
#: receive that comes back empty after this long ends the queue's pass.
RECEIVE_WAIT = 1.0


#: The executor's syphons, kept between micro-batches (one task at a time each; closed after ``idle_timeout``).
SYPHONS: SenderPool[Syphon] = SenderPool()


def outcome_rows(queue: str, dead_letter: bool, outcome: SyphonOutcome) -> Iterator[tuple[Any, ...]]:
    """The rows of one receive batch's outcome (pure): one per message moved, one per (entity, kind) else."""
    for entity, message_id in outcome.moved_ids:
        yield (queue, dead_letter, entity, MOVED, 1, message_id, None)
    for entity, n in sorted(outcome.possible_duplicates.items()):  # SPEC B14; the detail: their ids
        ids = ", ".join(str(i) for e, i in outcome.possible_duplicate_ids if e == entity)
        yield (queue, dead_letter, entity, POSSIBLE_DUPLICATE, n, None, f"message ids: {ids}"[:500])
    for entity, n in sorted(outcome.expired_by_entity.items()):
        yield (queue, dead_letter, entity or None, EXPIRED, n, None, None)
    for entity, n in sorted(outcome.abandoned_by_entity.items()):
        yield (queue, dead_letter, entity or None, ABANDONED, n, None, None)
    if outcome.invalid:
        yield (queue, dead_letter, None, DEAD_LETTERED, outcome.invalid, None, NOT_A_BACKLOG_MESSAGE)
    for entity, n in sorted(outcome.undeliverable_by_entity.items()):
        yield (queue, dead_letter, entity or None, DEAD_LETTERED, n, None, DESTINATION_NOT_FOUND)
    if outcome.settle_failures:
        yield (queue, dead_letter, None, SETTLE_FAILED, outcome.settle_failures, None, None)
    if outcome.parked:
        yield (queue, dead_letter, None, PARKED, outcome.parked, None, None)
    for error in outcome.errors:
        yield (queue, dead_letter, None, SYPHON_ERROR, 1, None, error[:500])


class CollectedAcks:
    """The syphon job's :class:`~spark_sb.failover.ordering.Acknowledgements` (executor; one per pooled syphon):
    the return markers its syphon passed, kept until :func:`drain_partition` yields them as ``acknowledged`` rows,
    which the ``foreachBatch`` function writes to the events table after the micro-batch (the sink's driver reads
    them there: :mod:`spark_sb.state.sessions`). Bounded by the markers one receive batch passes."""

    def __init__(self) -> None:
        self._passed: list[tuple[str, str, str]] = []

    def acknowledged(self, entity: str, session: str, marker: str) -> None:
        self._passed.append((entity, session, marker))

    def take(self) -> list[tuple[str, str, str]]:
        """The markers passed since the last take: (entity, session, marker id)."""
        passed, self._passed = self._passed, []
        return passed


def drain_partition(
    config: ServiceBusConfig,
    queue: str,
    dead_letter: bool,
    hints: Mapping[str, str] | None = None,
    queues: Sequence[str] = (),
    lock_duration: float | None = None,
) -> Iterator[tuple[Any, ...]]:
    """Drain one backlog queue (its dead-letter queue with ``dead_letter``) for at most
    ``syphon.batch_duration``; yields rows of :data:`ROW_SCHEMA`. Executor (a Python worker). Never raises: an
    error becomes a ``syphon_error`` row (B11). If the caller stops iterating, what is held is abandoned.
    ``lock_duration``: the queue's lock (seconds, read by the planner; None: the provisioned lock)."""
    try:
        key = config_key(config)
        names = list(queues or [queue])
        ordered = config.ordering != "none"

        def build() -> Syphon:
            if not ordered:
                return Syphon(config, backlog_queues=names, record_ids=True)
            return Syphon(config, backlog_queues=names, record_ids=True, acks=CollectedAcks())

        syphon = SYPHONS.acquire(key, float(config.idle_timeout), build)
        syphon.lock_duration = float(lock_duration) if lock_duration else LOCK_DURATION
        acks = getattr(syphon, "acks", None) if ordered else None
        acks = acks if isinstance(acks, CollectedAcks) else None
        try:
            if hints is not None:
                syphon.set_hints(hints)
            until = time.monotonic() + float(config.syphon_batch_duration)
            wait = min(float(config.syphon_max_wait), RECEIVE_WAIT)
            batches = syphon.drain_batches(queue, max_wait=wait, dead_letter=dead_letter, until=until)
            try:
                for outcome in batches:
                    yield from outcome_rows(queue, dead_letter, outcome)
                    for entity, _session, marker in acks.take() if acks is not None else ():
                        yield (queue, dead_letter, entity, ACKNOWLEDGED, 1, marker, marker)
            finally:
                batches.close()
        finally:
            SYPHONS.release(key, syphon)  # kept whatever happened, as its receivers replace themselves
    except Exception as exc:  # noqa: BLE001 - B11: the job never dies on a drain
        log.warning("syphon: draining %s failed (%s)", queue, type(exc).__name__)
        yield (queue, dead_letter, None, SYPHON_ERROR, 1, None, f"{queue}: {type(exc).__name__}")
