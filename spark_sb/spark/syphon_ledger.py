"""The syphon job's ledger (SPEC S7, F9, O5): the ``foreachBatch`` function :class:`SyphonBatchWriter` aggregates a
micro-batch's rows per (queue, entity, kind) and appends them to the events table, idempotently per micro-batch of
the run (``txnAppId`` ``syphon/<primary namespace name>/<run id>``, ``txnVersion`` the batch id).

Where it runs: driver (the ``foreachBatch`` function; under Spark Connect beside the server); the writer is
picklable (the config, the run id). Why a run's own transaction id: docs/design/syphon-job.md.
"""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.failover.outcome import namespace_key
from spark_sb.spark.partition import ordering_needs_tables
from spark_sb.state.maintenance import maintain_if_due, store_for
from spark_sb.state.records import (
    ACKNOWLEDGED,
    BATCH_COMMITTED,
    DEAD_LETTERED,
    MOVED,
    POSSIBLE_DUPLICATE,
    BatchWrites,
    Event,
)
from spark_sb.state.store import StateStore
from spark_sb.syphon.rules import DESTINATION_NOT_FOUND, ENTITY_NOT_FOUND

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

#: The syphon job logs under one name (what users configure): ``spark_sb.spark.syphon_job``.
log = logging.getLogger("spark_sb.spark.syphon_job")


@dataclass
class SyphonTotals:
    """Counts over the micro-batches this writer recorded (driver; counts only)."""

    batches: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    by_entity: dict[str, int] = field(default_factory=dict)  # moved per entity

    @property
    def moved(self) -> int:
        return self.by_kind.get(MOVED, 0)


def syphon_sink_id(config: ServiceBusConfig) -> str:
    """The syphon's identity in the events table: ``syphon/<primary namespace name>``."""
    try:
        name = config.primary.effective_namespace_name()
    except Exception:  # noqa: BLE001 - an address endpoint without a resolved name
        name = namespace_key(config.primary)
    return f"syphon/{name}"


def new_run_id() -> str:
    """A fresh run id (pure; random): one per query start of the syphon job."""
    return uuid.uuid4().hex


def error_class_of(kind: str, detail: str | None) -> str | None:
    """The ``error_class`` column of a syphon event (pure): ``entity_not_found`` for messages dead-lettered because
    their destination does not exist (what ``spark-sb status`` sums as undeliverable), else none."""
    if kind == DEAD_LETTERED and (detail or "").startswith(DESTINATION_NOT_FOUND):
        return ENTITY_NOT_FOUND
    return None


class SyphonBatchWriter:
    """The ``foreachBatch`` function of the syphon query (driver; picklable: the config and an optional store).

    Aggregates the rows of one micro-batch per (queue, entity, kind) in one Spark action (so the source is read,
    and the queues drained, exactly once) and appends them to the events table as events. ``total`` keeps counts
    (in the process that runs the function: under Spark Connect, beside the server)."""

    def __init__(
        self, config: ServiceBusConfig, *, store: StateStore | None = None, run_id: str | None = None
    ) -> None:
        ordering_needs_tables(config, "the syphon job", store_given=store is not None)
        self.config = config
        self.sink_id = syphon_sink_id(config)
        self.run_id = run_id or new_run_id()
        self.total = SyphonTotals()
        self._store = store

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "run_id": self.run_id}  # the run id travels (Spark Connect)

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        self.__init__(state["config"], run_id=state.get("run_id"))  # type: ignore[misc]

    def start_run(self) -> str:
        """A new run (driver, before the query starts; :func:`run_syphon` calls it): a fresh run id."""
        self.run_id = new_run_id()
        return self.run_id

    @property
    def txn_id(self) -> str:
        """The Delta transaction id of this run's appends: ``syphon/<primary namespace name>/<run id>``."""
        return f"{self.sink_id}/{self.run_id}"

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F

        marker = F.when(F.col("kind") == ACKNOWLEDGED, F.col("message_id")).alias("marker")
        rows = (
            batch_df.groupBy("queue", "entity", "kind", marker)  # one row per acknowledged marker (ordering)
            .agg(F.sum("count").alias("n"), F.first("detail", ignorenulls=True).alias("detail"))
            .collect()
        )
        aggregated = [
            (r["queue"], r["entity"], r["kind"], int(r["n"] or 0), r["marker"] or r["detail"]) for r in rows
        ]
        store = self._store
        if store is None and aggregated:
            store = store_for(batch_df.sparkSession, self.config)
            self._store = store
        self.record(batch_id, aggregated, store)
        maintain_if_due(batch_df.sparkSession, self.config)  # when state_maintain_every is due

    def record(
        self,
        batch_id: int,
        aggregated: Sequence[tuple[str | None, str | None, str, int, str | None]],
        store: StateStore | None,
        now: datetime | None = None,
    ) -> None:
        """Count and write one micro-batch's aggregated rows (Spark-free: unit-testable)."""
        if not aggregated:
            return  # an empty micro-batch (e.g. the first after a restart): nothing happened, nothing written
        self.total.batches += 1
        for _queue, entity, kind, n, _detail in aggregated:
            self.total.by_kind[kind] = self.total.by_kind.get(kind, 0) + n
            if kind == MOVED and entity:
                self.total.by_entity[entity] = self.total.by_entity.get(entity, 0) + n
        late = {e or "": n for _q, e, kind, n, _d in aggregated if kind == POSSIBLE_DUPLICATE}
        if late:  # SPEC B14: one WARNING per micro-batch
            log.warning(
                "syphon: micro-batch %d moved messages after their entity's duplicate detection window since their "
                "ambiguous send (possible duplicates in the primary; %s events): %s",
                batch_id,
                POSSIBLE_DUPLICATE,
                ", ".join(f"{e} {n}" for e, n in sorted(late.items())),
            )
        if store is None:
            return
        at = now or datetime.now(timezone.utc)
        namespace = namespace_key(self.config.primary)
        host = socket.gethostname()
        events = [
            Event(
                at,
                self.sink_id,
                batch_id,
                kind,
                namespace=namespace,
                entity=entity,
                backlog_queue=queue,
                error_class=error_class_of(kind, detail),
                count=n,
                executor_host=host,
                detail=detail or "",
            )
            for queue, entity, kind, n, detail in sorted(
                aggregated, key=lambda a: (a[2], a[1] or "", a[0] or "")
            )
        ]
        moved = sum(n for _q, _e, kind, n, _d in aggregated if kind == MOVED)
        events.append(Event(at, self.sink_id, batch_id, BATCH_COMMITTED, namespace=namespace, count=moved))
        store.ensure()
        store.write_batch(self.txn_id, batch_id, BatchWrites(tuple(events), (), ()))  # events: sink_id
