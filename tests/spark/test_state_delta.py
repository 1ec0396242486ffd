"""The Delta state store runs the same contract as the in-memory one (tests/unit/state/test_store.py::StoreContract),
on path tables and on catalog tables (``state_table_prefix``), on the session-scoped local Spark with Delta."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from spark_sb.state.delta import DeltaStateStore, StateTables
from tests.unit.state.store_contract import StoreContract

pytestmark = pytest.mark.slow


class TestDeltaPathStore(StoreContract):
    """The contract on path tables. Two writers' conflicts run on catalog tables (TestDeltaCatalogStore, on both
    Spark pairs): the same MERGE and appends, the same Delta exceptions and retry; on path tables two sinks' queries
    writing the same tables at once meet them too (tests/spark/test_sink_state.py)."""

    test_concurrent_writers = None  # type: ignore[assignment]  # 46 s of the tier's budget: the catalog twin's

    @pytest.fixture(autouse=True)
    def _store(self, spark: Any, tmp_path: Path) -> None:
        self.store = DeltaStateStore(spark, StateTables(location=str(tmp_path / "state")), backoff=0.05)

    def test_tables_are_delta_path_tables_with_idempotent_commits(self, spark: Any, tmp_path: Path) -> None:
        from datetime import datetime, timezone

        from spark_sb.state.records import BATCH_COMMITTED, BatchWrites, Event

        self.store.ensure()
        for name in ("events", "entities", "rejects"):
            assert spark.read.format("delta").load(str(tmp_path / "state" / name)).columns
        writes = BatchWrites(
            (Event(datetime(2026, 1, 1, tzinfo=timezone.utc), "s", 5, BATCH_COMMITTED),), (), ()
        )
        self.store.write_batch("s", 5, writes)
        self.store.write_batch("s", 5, writes)
        history = spark.sql(f"DESCRIBE HISTORY delta.`{tmp_path / 'state' / 'events'}`").collect()
        assert len([h for h in history if h.operation == "WRITE"]) == 1  # the repeat was skipped by Delta

    def test_a_group_commit_is_one_write_per_table_and_skipped_when_retried(
        self, spark: Any, tmp_path: Path
    ) -> None:
        from datetime import datetime, timezone

        from spark_sb.state.records import BATCH_COMMITTED, BatchWrites, Event, RejectRecord
        from spark_sb.state.writer import coalesce

        t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
        group = [
            (
                b,
                BatchWrites(
                    (Event(t0, "g", b, BATCH_COMMITTED),),
                    (),
                    (RejectRecord(t0, "g", b, "q", None, "r", "{}"),),
                ),
            )
            for b in (6, 7, 8)
        ]
        version, writes = coalesce(group)
        self.store.write_batch("g", version, writes)
        self.store.write_batch("g", version, writes)  # the group again (a retry): skipped
        assert self.store.last_committed("g") == 8 and self.store.committed("g", 7) is not None
        assert len(self.store.read_rejects("g")) == 3
        for table in ("events", "rejects"):
            history = spark.sql(f"DESCRIBE HISTORY delta.`{tmp_path / 'state' / table}`").collect()
            assert len([h for h in history if h.operation == "WRITE"]) == 1


class TestDeltaCatalogStore(StoreContract):
    """The contract's tests whose code differs for catalog tables: creation by name, reads through
    ``spark.table``, appends through ``saveAsTable`` with and without Delta transaction ids (round trip, replays),
    the last committed batch by a scan (no log to read), the entities table's version by name, conflicts between
    writers. The rest run the same statements as on path tables, which TestDeltaPathStore runs (the tier's time is
    a budget: each contract test costs seconds of Delta commits)."""

    test_empty_store_reads_nothing = None  # type: ignore[assignment]  # ensure(): creation covered by every test
    test_pulled_queues_round_trip = None  # type: ignore[assignment]  # the same row shape as the round trip
    test_append_events_outside_batches = None  # type: ignore[assignment]  # the round trip's append, no txn id
    test_entity_state_only_moves_forward_in_time = None  # type: ignore[assignment]  # the same MERGE statement

    @pytest.fixture(autouse=True)
    def _store(self, spark: Any) -> Any:
        prefix = f"spark_catalog.default.sb_{uuid.uuid4().hex[:8]}_"
        self.store = DeltaStateStore(spark, StateTables(prefix=prefix), backoff=0.05)
        yield
        for name in ("events", "entities", "rejects"):
            spark.sql(f"DROP TABLE IF EXISTS {prefix}{name}")


def test_held_sessions_in_catalog_tables_are_replaced_per_sink_and_acknowledgements_found_by_marker(
    spark: Any,
) -> None:
    """The ``sessions`` table (ordering, spark_sb/state/sessions.py) as a catalog table: created on first use, a
    sink's lines replaced as a whole (``replaceWhere`` through ``saveAsTable``) without touching another sink's,
    emptied, and the syphon's acknowledgements read by marker and time from the events table. On path tables the
    same calls run in tests/spark/cluster_ordering.py (through test_cluster.py) and test_state_maintenance.py."""
    from datetime import datetime, timedelta, timezone

    from spark_sb.state.records import ACKNOWLEDGED, Event
    from spark_sb.state.sessions import HeldLine, PendingMarker

    prefix = f"spark_catalog.default.sb_{uuid.uuid4().hex[:8]}_"
    store = DeltaStateStore(spark, StateTables(prefix=prefix), backoff=0.05)
    try:
        t0 = datetime(2026, 11, 27, 8, 0, tzinfo=timezone.utc)
        assert not store.sessions_exist()

        def line(session: str, *markers: str) -> HeldLine:
            return HeldLine("orders", session, "q1", t0, tuple(PendingMarker("q1", m, t0) for m in markers))

        store.write_sessions("a", [line("s1", "m1"), line("s2", "m2", "m3")])
        store.write_sessions("b", [line("s9", "m9")])
        assert store.sessions_exist()
        assert store.read_sessions("a") == [line("s1", "m1"), line("s2", "m2", "m3")]
        store.write_sessions("a", [line("s2", "m4")])  # s1 released, s2 marked again
        assert store.read_sessions("a") == [line("s2", "m4")]
        assert store.read_sessions("b") == [line("s9", "m9")]
        store.write_sessions("a", [])
        assert store.read_sessions("a") == [] and store.read_sessions("b") == [line("s9", "m9")]

        acks = [
            Event(
                t0 + timedelta(seconds=5),
                "syphon/p",
                1,
                ACKNOWLEDGED,
                namespace="p",
                entity="orders",
                detail=m,
            )
            for m in ("m4", "m9")
        ]
        store.append_events(acks)
        assert store.read_acknowledgements("p", {"m4", "m5"}, t0) == {"m4"}
        assert store.read_acknowledgements("p", {"m4"}, t0 + timedelta(minutes=1)) == set()
        assert store.read_acknowledgements("other", {"m9"}, t0) == set()
        assert store.read_acknowledgements("P:5671/", {"m4", "m5"}, t0) == {"m4"}  # another spelling (O6)
    finally:
        for name in ("events", "entities", "rejects", "sessions"):
            spark.sql(f"DROP TABLE IF EXISTS {prefix}{name}")
