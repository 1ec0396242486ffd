"""The Spark ``foreachBatch`` sink (SPEC S1, S2, S3; minimal: Delta state and replay skipping come later).

Usage (driver)::

    from spark_sb import ServiceBusSink, load_config
    sb_sink = ServiceBusSink(load_config("conf/prod.yaml"))
    df.writeStream.foreachBatch(sb_sink).option("checkpointLocation", ckpt).start()

Where things run:

* ``ServiceBusSink.__call__`` runs on the driver (Spark calls the ``foreachBatch`` function there). It holds only
  the picklable configuration; it never builds a Service Bus client.
* :func:`send_partition` runs in executor Python workers, once per partition task. It streams the partition's
  rows into a :class:`~spark_sb.sender.PairedSender` taken from a process-level cache keyed by the configuration
  (workers are reused across tasks and micro-batches, so clients live across batches), one sender per task in
  flight, closed when idle for ``idle_timeout``.

Delivery guarantee: at least once. A partition task returns only after every message was accepted by the primary,
accepted by a backlog queue, or recorded as a reject; otherwise the task fails and Spark retries it (message ids
plus duplicate detection on the primary make retries harmless).
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from spark_sb.config import ServiceBusConfig
from spark_sb.mapping import OutboundMessage, Reject, RejectError, row_to_message
from spark_sb.sender import PairedSender, SendOutcome, with_namespace_name

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)


class RejectedRowsError(ValueError):
    """Raised (``on_reject = "fail"``) when a row cannot become a message; names the row's field and reason."""


# -- executor side -------------------------------------------------------------------------------------------
_cache_lock = threading.Lock()
_idle: dict[str, list[tuple[float, PairedSender]]] = {}


def _config_key(config: ServiceBusConfig) -> str:
    return hashlib.sha256(pickle.dumps(config)).hexdigest()


def _acquire(config: ServiceBusConfig) -> tuple[str, PairedSender]:
    key = _config_key(config)
    now = time.monotonic()
    stale: list[PairedSender] = []
    sender: PairedSender | None = None
    with _cache_lock:
        for k, entries in list(_idle.items()):
            stale.extend(s for since, s in entries if now - since > config.idle_timeout)
            _idle[k] = [(since, s) for since, s in entries if now - since <= config.idle_timeout]
        entries = _idle.get(key) or []
        if entries:
            sender = entries.pop()[1]
    for s in stale:
        s.close()
    return key, sender or PairedSender(config)


def _release(key: str, sender: PairedSender, config: ServiceBusConfig) -> None:
    if not config.client_cache:
        sender.close()
        return
    with _cache_lock:
        _idle.setdefault(key, []).append((time.monotonic(), sender))


def close_cached_senders() -> int:
    """Close every idle cached sender in this process; returns how many. Runs wherever it is called."""
    with _cache_lock:
        senders = [s for entries in _idle.values() for _, s in entries]
        _idle.clear()
    for s in senders:
        s.close()
    return len(senders)


def _messages(
    rows: Iterable[Any], config: ServiceBusConfig, rejects: list[Reject]
) -> Iterator[OutboundMessage]:
    for index, row in enumerate(rows):
        try:
            yield row_to_message(row, config.columns, config.entity, config.max_message_size)
        except RejectError as err:
            if config.on_reject == "fail":
                raise RejectedRowsError(f"row {index}: {err}") from None
            rejects.append(Reject.from_error(row, err, entity=config.entity, row_index=index))


def send_partition(config: ServiceBusConfig, rows: Iterable[Any]) -> SendOutcome:
    """Send one partition's rows (executor). Streams the rows; returns the outcome including row rejects."""
    rejects: list[Reject] = []
    key, sender = _acquire(config)
    try:
        outcome = sender.send(_messages(rows, config, rejects))
    except BaseException:
        sender.close()  # a failed sender is never reused: the task fails and Spark retries it
        raise
    _release(key, sender, config)
    if rejects:
        outcome = SendOutcome(rejects=tuple(rejects)).merge(outcome)
    return outcome


# -- driver side ---------------------------------------------------------------------------------------------
class ServiceBusSink:
    """A ``foreachBatch`` function that sends every row of each micro-batch to Service Bus (driver).

    Picklable: holds only the configuration. ``last_outcome`` and ``total`` hold the merged per-partition outcomes
    of the last batch and of all batches seen by this driver process.
    """

    def __init__(self, config: ServiceBusConfig) -> None:
        # The primary's namespace name is resolved here, on the driver, and shipped in the config: executors
        # never ask the primary's admin endpoint (a worker started during an outage could not).
        self.config = with_namespace_name(config)
        self.last_outcome: SendOutcome | None = None
        self.total = SendOutcome()

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        config = self.config

        def run(rows: Iterable[Any]) -> Iterator[bytes]:
            yield pickle.dumps(send_partition(config, rows))

        parts = batch_df.rdd.mapPartitions(run).collect()
        outcome = SendOutcome()
        for blob in parts:
            outcome = outcome.merge(pickle.loads(blob))
        self.last_outcome = outcome
        self.total = self.total.merge(outcome)
        log.info(
            "batch %s: %d sent, %d diverted, %d rejected",
            batch_id,
            outcome.total_sent,
            outcome.total_diverted,
            outcome.total_rejected,
        )

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["config"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"ServiceBusSink(entity={self.config.entity!r})"


def sink(config: ServiceBusConfig) -> ServiceBusSink:
    """Factory: ``df.writeStream.foreachBatch(spark_sb.sink(config))``."""
    return ServiceBusSink(config)
