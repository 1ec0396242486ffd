"""spark_sb.state.delta.transaction_version: the Spark store's last committed batch read from the events table's
Delta log (the app id's transaction version) instead of a scan of every kept event; None where it cannot tell
(a catalog table, a remote path, no transaction for the app id), so the store scans instead."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from spark_sb.state.delta import transaction_version
from spark_sb.state.records import BATCH_COMMITTED, BatchWrites, Event

pytest.importorskip("deltalake")

from spark_sb.state.deltars import DeltaRsStateStore  # noqa: E402

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_the_transaction_version_is_the_highest_batch_a_sink_committed(tmp_path: Path) -> None:
    store = DeltaRsStateStore(str(tmp_path / "state"), sleep=lambda _: None)
    for batch in (0, 1, 5):
        store.write_batch(
            "sink-a", batch, BatchWrites((Event(T0, "sink-a", batch, BATCH_COMMITTED),), (), ())
        )
    store.write_batch("sink-b", 2, BatchWrites((Event(T0, "sink-b", 2, BATCH_COMMITTED),), (), ()))
    events = str(tmp_path / "state" / "events")
    assert transaction_version(events, "sink-a") == 5 == store.last_committed("sink-a")
    assert transaction_version(events, "sink-b") == 2
    assert transaction_version(events, "sink-c") is None  # never committed: the store scans (and finds none)
    assert transaction_version(f"file://{events}", "sink-a") == 5


def test_where_it_cannot_tell_it_says_none_and_the_store_scans(tmp_path: Path) -> None:
    assert transaction_version(None, "sink-a") is None  # a catalog table
    assert transaction_version("abfss://c@acct.dfs.core.windows.net/state/events", "sink-a") is None  # remote
    assert transaction_version(str(tmp_path / "no-table-here"), "sink-a") is None  # no log to read
