"""State tables grown as a long-running sink grows them, and what a sink and ``spark-sb status`` pay to read
them: shared by ``tests/spark/test_state_maintenance.py`` (small numbers) and ``bench/bench_state_growth.py``.

Driver only. The bulk of the history (``batches`` batches' worth of events) is written with DataFrame
operations in one Spark write of many files, not one commit per batch; the log of many small commits is written
with ``deltalake`` (delta-rs: one small file and one commit each, ~20 ms instead of ~0.5 s through Spark),
which is what a sink's background writer leaves behind between two maintenances.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

from spark_sb.admin.status import read_status
from spark_sb.state.delta import DeltaStateStore, StateTables
from spark_sb.state.records import BATCH_COMMITTED, SENT, BatchWrites, EntityRecord, Event

SINKS = ("orders-ns/orders", "orders-ns/payments")
ENTITIES = 4


def bulk_history(
    spark: Any,
    location: str,
    batches: int,
    *,
    end: datetime,
    every: float = 30.0,
    files: int = 40,
    entities: int = ENTITIES,
) -> int:
    """``batches`` batches' worth of events (per batch: one ``sent`` row per entity and the ``batch_committed``
    row), the batches of :data:`SINKS` interleaved, one every ``every`` seconds up to ``end``, in ``files``
    files of one commit. Returns the rows written."""
    from pyspark.sql import functions as F

    n = len(SINKS)
    sinks = F.array(*[F.lit(s) for s in SINKS])
    end_us = int(end.timestamp() * 1_000_000)
    df = (
        spark.range(batches)
        .withColumn("k", F.explode(F.sequence(F.lit(0), F.lit(entities))))
        .select(
            F.timestamp_micros(F.lit(end_us) - (F.lit(batches) - F.col("id")) * int(every * 1_000_000)).alias(
                "time"
            ),
            F.element_at(sinks, (F.col("id") % n + 1).cast("int")).alias("sink_id"),
            (F.col("id") / n).cast("long").alias("batch_id"),
            F.lit("orders-ns.servicebus.windows.net").alias("namespace"),
            F.when(F.col("k") < entities, F.concat(F.lit("entity-"), F.col("k").cast("string"))).alias(
                "entity"
            ),
            F.when(F.col("k") < entities, F.lit(SENT)).otherwise(F.lit(BATCH_COMMITTED)).alias("event"),
            F.lit(None).cast("string").alias("from_state"),
            F.lit(None).cast("string").alias("to_state"),
            F.lit(None).cast("string").alias("backlog_queue"),
            F.lit(None).cast("string").alias("error_class"),
            F.when(F.col("k") < entities, F.lit(250))
            .otherwise(F.lit(250 * entities))
            .cast("long")
            .alias("count"),
            F.when(F.col("k") < entities, F.lit("10.0.0.7")).alias("executor_host"),
            F.lit("").alias("detail"),
        )
        .repartition(files)
    )
    DeltaStateStore(spark, StateTables(location=location)).ensure()
    df.write.format("delta").mode("append").save(f"{location}/events")
    return batches * (entities + 1)


def entity_records(now: datetime, count: int = 50) -> list[EntityRecord]:
    return [
        EntityRecord(
            "orders-ns.servicebus.windows.net",
            f"entity-{i}",
            "failed_over" if i % 5 == 0 else "healthy",
            now - timedelta(days=40),
            "refused" if i % 5 == 0 else None,
            "orders-sec.servicebus.windows.net",
            (),
            now - timedelta(days=40),
            "bench",
        )
        for i in range(count)
    ]


def small_commits(location: str, commits: int, *, end: datetime, first_batch: int) -> None:
    """``commits`` small appends to the events table through delta-rs, each one batch of one sink as a sink's
    writer commits it (``txnAppId`` = the sink id), the newest ending at ``end``."""
    import pyarrow as pa
    from deltalake import CommitProperties, Transaction, write_deltalake

    ts = pa.timestamp("us", tz="UTC")
    schema = pa.schema(
        [("time", ts), ("sink_id", pa.string()), ("batch_id", pa.int64()), ("namespace", pa.string())]
        + [
            (c, pa.string())
            for c in ("entity", "event", "from_state", "to_state", "backlog_queue", "error_class")
        ]
        + [("count", pa.int64()), ("executor_host", pa.string()), ("detail", pa.string())]
    )
    path = f"{location}/events"
    for i in range(commits):
        sink = SINKS[i % len(SINKS)]
        batch = first_batch + i // len(SINKS)
        at = end - timedelta(seconds=30 * (commits - i))
        rows = [
            Event(at, sink, batch, SENT, "orders-ns.servicebus.windows.net", "entity-0", count=250),
            Event(at, sink, batch, BATCH_COMMITTED, "orders-ns.servicebus.windows.net", count=250),
        ]
        data = pa.Table.from_pylist([{c: getattr(e, c) for c in schema.names} for e in rows], schema=schema)
        write_deltalake(
            path,
            data,
            mode="append",
            commit_properties=CommitProperties(app_transactions=[Transaction(app_id=sink, version=batch)]),
        )


def median_seconds(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # warm (the JVM's first run of a plan)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


@dataclass(frozen=True)
class Costs:
    """Seconds (medians): a restarted sink's first batch start (``last_committed`` + entities), a later batch's
    start (the entities table's version + entities), one group commit, ``status`` (no Spark); the table's
    files."""

    first_batch: float
    per_batch: float
    commit: float
    status: float
    files: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def measure(
    spark: Any, location: str, *, repeat: int = 5, batch_id: int = 10_000_000, commits: bool = True
) -> Costs:
    """What a sink and ``status`` pay to read the tables under ``location`` now (``commits``: and what one group
    commit costs, else 0)."""
    tables = StateTables(location=location)
    sink = SINKS[0]

    def first_batch() -> None:
        store = DeltaStateStore(spark, tables)
        store.ensure()
        store.last_committed(sink)
        store.read_entities()

    store = DeltaStateStore(spark, tables)

    def per_batch() -> None:
        store.entities_version()
        store.read_entities()

    ids = iter(range(batch_id, batch_id + repeat + 1))

    def commit() -> None:
        b = next(ids)
        now = datetime.now(timezone.utc)
        store.write_batch(
            "bench/commit",
            b,
            BatchWrites(
                (
                    Event(now, "bench/commit", b, SENT, count=1),
                    Event(now, "bench/commit", b, BATCH_COMMITTED),
                ),
                (),
                (),
            ),
        )

    # what status pays for the tables (depths and the primary's duplicate detection are admin calls, not theirs)
    config = SimpleNamespace(state_location=location, state_table_prefix=None, secondary=None)
    files = {
        t: int(spark.sql(f"DESCRIBE DETAIL delta.`{location}/{t}`").collect()[0]["numFiles"])
        for t in ("events", "entities", "rejects")
    }
    return Costs(
        first_batch=median_seconds(first_batch, repeat),
        per_batch=median_seconds(per_batch, repeat),
        commit=median_seconds(commit, max(1, repeat // 2)) if commits else 0.0,
        status=median_seconds(
            lambda: read_status(config, depths=False, duplicate_detection=False), max(1, repeat // 2)
        ),
        files=files,
    )


#: The steps a batch start is made of, timed one by one by :func:`sample_once`: a restarted sink's first batch
#: (``ensure`` + ``last_committed`` + ``read_entities`` of a new store), a later batch (``entities_version`` +
#: ``read_entities``), and ``status`` (deltalake, no Spark).
STEPS = ("ensure", "last_committed", "read_entities", "entities_version", "read_entities_again", "status")


def clear_delta_log_cache(spark: Any) -> None:
    """Forget every Delta log Spark holds (``DeltaLog.clearCache``), as a restarted driver has none: the next read
    lists ``_delta_log`` and replays the log from the last checkpoint."""
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


def sample_once(spark: Any, location: str, *, cold: bool = True) -> dict[str, float]:
    """Seconds of each of :data:`STEPS` once on the tables under ``location``, plus the sums ``first_batch``
    (ensure + last_committed + read_entities) and ``per_batch`` (entities_version + read_entities_again).
    ``cold``: the Delta log cache is cleared first (a restarted driver)."""
    if cold:
        clear_delta_log_cache(spark)
    store = DeltaStateStore(spark, StateTables(location=location))
    config = SimpleNamespace(state_location=location, state_table_prefix=None, secondary=None)
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("ensure", store.ensure),
        ("last_committed", lambda: store.last_committed(SINKS[0])),
        ("read_entities", store.read_entities),
        ("entities_version", store.entities_version),
        ("read_entities_again", store.read_entities),
        ("status", lambda: read_status(config, depths=False, duplicate_detection=False)),
    ]
    out: dict[str, float] = {}
    for name, fn in steps:
        started = time.perf_counter()
        fn()
        out[name] = time.perf_counter() - started
    out["first_batch"] = out["ensure"] + out["last_committed"] + out["read_entities"]
    out["per_batch"] = out["entities_version"] + out["read_entities_again"]
    return out


def interleaved(
    spark: Any, locations: dict[str, str], rounds: int, *, cold: bool = True, warm_up: int = 1
) -> dict[str, list[dict[str, float]]]:
    """:func:`sample_once` on each set of tables in turn, ``rounds`` times, the order rotated every round so that
    no set is always measured first or last (machine noise and JIT warm-up fall on all alike). The first
    ``warm_up`` rounds are not kept. Returns the samples per set, in round order."""
    names = list(locations)
    out: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for r in range(warm_up + rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        if r % 2:
            order.reverse()
        for name in order:
            got = sample_once(spark, locations[name], cold=cold)
            if r >= warm_up:
                out[name].append(got)
    return out


def commit_once(spark: Any, location: str, batch_id: int) -> float:
    """Seconds of one group commit (a ``sent`` and a ``batch_committed`` row, as the sink's writer commits) to the
    tables under ``location``, as sink ``bench/commit``."""
    store = DeltaStateStore(spark, StateTables(location=location))
    store.ensure()
    now = datetime.now(timezone.utc)
    writes = BatchWrites(
        (
            Event(now, "bench/commit", batch_id, SENT, count=1),
            Event(now, "bench/commit", batch_id, BATCH_COMMITTED),
        ),
        (),
        (),
    )
    started = time.perf_counter()
    store.write_batch("bench/commit", batch_id, writes)
    return time.perf_counter() - started


def medians(samples: list[dict[str, float]]) -> dict[str, float]:
    """The median of each figure over ``samples``."""
    return {k: statistics.median(s[k] for s in samples) for k in samples[0]}


def paired_ratios(a: list[dict[str, float]], b: list[dict[str, float]], key: str) -> list[float]:
    """``b / a`` of ``key`` round by round (the two samples of a round were taken within seconds)."""
    return [y[key] / x[key] for x, y in zip(a, b, strict=True) if x[key] > 0]


def seed(spark: Any, location: str, now: datetime, records: Sequence[EntityRecord]) -> DeltaStateStore:
    """Tables with the entity records and one committed batch per sink (a young deployment)."""
    store = DeltaStateStore(spark, StateTables(location=location))
    store.ensure()
    for i, sink in enumerate(SINKS):
        store.write_batch(
            sink,
            0,
            BatchWrites(
                (Event(now, sink, 0, SENT, count=1), Event(now, sink, 0, BATCH_COMMITTED, count=1)),
                tuple(records) if i == 0 else (),
                (),
            ),
        )
    return store
