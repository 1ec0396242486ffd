"""The Delta state store runs the same contract as the in-memory one (tests/unit/state/test_store.py::StoreContract),
on path tables and on catalog tables (``state_table_prefix``), on the session-scoped local Spark with Delta."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from spark_sb.state import StateTables
from spark_sb.state.delta import DeltaStateStore
from tests.unit.state.store_contract import StoreContract

pytestmark = pytest.mark.slow


class TestDeltaPathStore(StoreContract):
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
    @pytest.fixture(autouse=True)
    def _store(self, spark: Any) -> Any:
        prefix = f"spark_catalog.default.sb_{uuid.uuid4().hex[:8]}_"
        self.store = DeltaStateStore(spark, StateTables(prefix=prefix), backoff=0.05)
        yield
        for name in ("events", "entities", "rejects"):
            spark.sql(f"DROP TABLE IF EXISTS {prefix}{name}")
