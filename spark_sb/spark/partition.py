"""The executor side of the ``foreachBatch`` sink (SPEC S1-S4): one partition's rows to Service Bus.

Where it runs: :func:`send_partition` runs in executor Python workers, once per partition task (inside
``mapInArrow``, whose one output row carries the pickled :class:`~spark_sb.state.records.PartitionResult`; the
``servicebus`` data source's writer calls it too). It first teaches the worker's failover registry what the state
table says (an entity failed over elsewhere starts failed over here; pulled backlog queues are skipped), then
streams the partition's rows into a :class:`~spark_sb.sender.paired.PairedSender` taken from :data:`SENDERS`, the
worker's :class:`~spark_sb.sender.pool.SenderPool` keyed by the configuration (workers are reused across tasks and
micro-batches, so clients live across batches), one sender per task in flight, closed when idle for
``idle_timeout``.

What must be picklable: what :func:`partition_function` captures, the
:class:`~spark_sb.config.service_bus.ServiceBusConfig` and the entity records handed over by the driver, and what a task
returns (the :class:`~spark_sb.state.records.PartitionResult`). Senders and clients are built here, never shipped.

Delivery guarantee: at least once. A partition task returns only after every message was accepted by the primary,
accepted by a backlog queue, or recorded as a reject; otherwise the task fails and Spark retries it.
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.errors import ConfigError, SendError
from spark_sb.failover.outcome import SendOutcome, namespace_key
from spark_sb.failover.registry import FailoverRegistry, process_registry
from spark_sb.message.outbound import OutboundMessage, Reject, RejectError
from spark_sb.message.rows import reject_row, row_to_message
from spark_sb.sender.paired import PairedSender
from spark_sb.sender.pool import SenderPool, config_key
from spark_sb.state.planning import apply_handoff
from spark_sb.state.records import EntityRecord, PartitionResult
from spark_sb.state.sessions import HeldLine, marks_of, restore_book

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa


log = logging.getLogger(__name__)


class RejectedRowsError(ValueError):
    """Raised (``on_reject = "fail"``) when a row cannot become a message; names the row's field and reason."""


#: The executor's paired senders, kept between tasks (one task at a time each; closed after idle_timeout).
SENDERS: SenderPool[PairedSender] = SenderPool()


def _messages(
    rows: Iterable[Any], config: ServiceBusConfig, rejects: list[Reject], counter: list[int]
) -> Iterator[OutboundMessage]:
    for index, row in enumerate(rows):
        counter[0] = index + 1
        try:
            yield row_to_message(
                row, config.columns, config.entity, config.max_message_size, config.message_id_mode
            )
        except RejectError as err:
            if config.on_reject == "fail":
                raise RejectedRowsError(f"row {index}: {err}") from None
            rejects.append(reject_row(row, err, entity=config.entity, row_index=index))


def send_partition(
    config: ServiceBusConfig,
    rows: Iterable[Any],
    handoff: Sequence[EntityRecord] = (),
    held: Sequence[HeldLine] = (),
    remark: Sequence[tuple[str, str]] = (),
    *,
    registry: FailoverRegistry | None = None,
    sender: PairedSender | None = None,
) -> PartitionResult:
    """Send one partition's rows (executor). Streams the rows; returns the outcome including row rejects, and the
    worker's view of the entity states and pulled backlog queues afterwards.

    ``handoff``: the entity records the driver read at batch start; applied to this process's failover
    registry first (SPEC S4: no second ``failover_interval`` wait, pulled backlog queues skipped). ``held``
    (``ordering`` on): the sink's held lines; the process's session book holds exactly these for the task
    (:func:`~spark_sb.state.sessions.restore_book`), and the result reports the lines the task marked
    (:func:`~spark_sb.state.sessions.marks_of`). ``remark``: held lines that get a fresh return marker after the
    rows, with or without a message (:meth:`~spark_sb.state.sessions.SessionLedger.stale`; a failure to send one is
    logged, the next batch tries again). ``registry`` and ``sender`` (tests: an executor process of
    their own): the process's registry, and a sender of the worker's pool, by default.
    """
    registry = registry or process_registry()
    primary = namespace_key(config.primary)
    book = registry.sessions(primary) if config.ordering != "none" else None
    if book is not None:
        restore_book(book, held)
    secondary = namespace_key(config.secondary) if config.secondary is not None else None
    if handoff:
        apply_handoff(
            registry,
            handoff,
            namespace=primary,
            backlog_namespace=secondary,
            failover_interval=float(config.failover_interval),
            ping_interval=float(config.ping_primary_interval),
        )
    rejects: list[Reject] = []
    counter = [0]
    key = config_key(config)
    pooled = sender is None
    if sender is None:
        sender = SENDERS.acquire(key, config.idle_timeout, lambda: PairedSender(config))
    try:
        outcome = sender.send(_messages(rows, config, rejects, counter))
    except BaseException:
        if pooled:
            sender.close()  # a failed sender is never reused: the task fails and Spark retries it
        raise
    if book is not None and remark:
        try:
            sender.remark(remark)
        except SendError as exc:  # liveness only: the lines stay held, the next batch sends them another
            log.warning(
                "ordering: fresh return markers for %d idle held sessions not sent: %s", len(remark), exc
            )
    if pooled:
        SENDERS.release(key, sender, keep=config.client_cache)
    if rejects:
        outcome = SendOutcome(rejects=tuple(rejects)).merge(outcome)
    return PartitionResult(
        host=socket.gethostname(),
        rows=counter[0],
        outcome=outcome,
        statuses=tuple(s for s in registry.statuses() if s.namespace == primary),
        pulled=tuple(registry.rotation.pulled(secondary)) if secondary is not None else (),
        pid=os.getpid(),
        marks=marks_of(book) if book is not None else (),
    )


def arrow_rows(batches: Iterable[pa.RecordBatch]) -> Iterator[dict[str, Any]]:
    """Rows of Arrow record batches as dicts (maps as lists of pairs, structs as dicts). Executor."""
    for batch in batches:
        yield from batch.to_pylist()


def ordering_needs_path_tables(config: ServiceBusConfig, where: str) -> None:
    """Driver: ``where`` (``format('servicebus')``) keeps order through failover (``ordering: session`` /
    ``entity``) with path tables only: its ``commit`` runs in a Python process of Spark's without a session, so with
    catalog tables (``state_table_prefix``, written through the spool) it could not read the syphon job's
    acknowledgements, which are in the catalog tables. A one-line :class:`ConfigError` naming both keys and what to
    use instead. Called before any row is read."""
    if config.ordering != "none" and config.state_table_prefix:
        why = (
            f"ordering {config.ordering!r} with state_table_prefix is not supported by {where} (its commit runs "
            "without a Spark session and cannot read the syphon job's acknowledgements in catalog tables): use "
            "state_location (path tables), or the foreachBatch sink ServiceBusSink with state_table_prefix"
        )
        raise ConfigError(
            f"{where}: option 'ordering' with option 'state_table_prefix': {why}",
            [("ordering", why), ("state_table_prefix", why)],
        )


def ordering_needs_tables(config: ServiceBusConfig, where: str, store_given: bool = False) -> None:
    """Driver: with ``ordering`` on, the Spark sink and the syphon job coordinate through the state tables (the
    held sessions, the acknowledgements: :mod:`spark_sb.state.sessions`); a one-line :class:`ConfigError` naming
    the key when ``config`` names none (and no store is given)."""
    if (
        config.ordering != "none"
        and not store_given
        and not (config.state_location or config.state_table_prefix)
    ):
        raise ConfigError.at(
            "ordering",
            f"{config.ordering!r} needs the state tables in {where} (state_location or state_table_prefix): the "
            "sink keeps its held sessions there and the syphon job writes its acknowledgements there",
        )


def first_task() -> bool:
    """Executor: this task computes the batch's first partition (no task context: outside Spark, True)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return context is None or context.partitionId() == 0


def partition_function(
    config: ServiceBusConfig,
    handoff: Sequence[EntityRecord],
    held: Sequence[HeldLine] = (),
    remark: Sequence[tuple[str, str]] = (),
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of one batch: sends the partition, yields one row ``result`` (the pickled
    :class:`~spark_sb.state.records.PartitionResult`). Built on the driver, runs on executors; captures only the
    picklable ``config``, ``handoff``, ``held`` (the sink's held lines with ``ordering`` on) and ``remark`` (the
    held lines the first partition's task gives a fresh return marker)."""
    records = tuple(handoff)
    lines = tuple(held)
    stale = tuple(remark)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        mine = stale if stale and first_task() else ()
        result = send_partition(config, arrow_rows(batches), records, lines, mine)
        yield pa.RecordBatch.from_arrays([pa.array([pickle.dumps(result)], pa.binary())], names=["result"])

    return run


RESULT_SCHEMA = "result BINARY"
