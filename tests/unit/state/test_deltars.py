"""The deltalake (delta-rs) state store of the ``servicebus`` data source runs the same contract as the
in-memory and Spark Delta stores (tests/unit/state/test_store.py::StoreContract), without a JVM."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from spark_sb.state.records import BATCH_COMMITTED, BatchWrites, Event, RejectRecord
from spark_sb.state.writer import coalesce
from tests.unit.state.store_contract import StoreContract

pytest.importorskip("deltalake")

from spark_sb.state.deltars import DeltaRsStateStore  # noqa: E402

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


class TestDeltaRsStore(StoreContract):
    @pytest.fixture(autouse=True)
    def _store(self, tmp_path: Path) -> None:
        self.root = tmp_path / "state"
        self.store = DeltaRsStateStore(str(self.root), sleep=lambda _: None)

    def _writes(self, table: str) -> int:
        from deltalake import DeltaTable

        history = DeltaTable(str(self.root / table)).history()
        return len([h for h in history if h.get("operation") == "WRITE"])

    def test_a_repeated_commit_is_skipped_by_its_transaction_version(self) -> None:
        group = [
            (
                b,
                BatchWrites(
                    (Event(T0, "g", b, BATCH_COMMITTED),),
                    (),
                    (RejectRecord(T0, "g", b, "q", None, "r", "{}"),),
                ),
            )
            for b in (6, 7, 8)
        ]
        version, writes = coalesce(group)
        self.store.write_batch("g", version, writes)
        self.store.write_batch("g", version, writes)  # a retry: skipped
        assert self.store.last_committed("g") == 8 and self.store.committed("g", 7) is not None
        assert len(self.store.read_rejects("g")) == 3
        assert self._writes("events") == 1 and self._writes("rejects") == 1

    def test_last_committed_without_transaction_versions_scans_the_events(self) -> None:
        self.store.append_events([Event(T0, "s", 3, BATCH_COMMITTED), Event(T0, "s", 9, BATCH_COMMITTED)])
        assert self.store.last_committed("s") == 9
        assert self.store.last_committed("other") is None
