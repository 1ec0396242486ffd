"""State tables over a long life, without Spark: the retention condition, SQL literals, what says a Spark session
is gone, and the state writer finishing its writes through deltalake once the program stopped Spark."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from spark_sb.state.delta import StateTables
from spark_sb.state.maintenance import retention_predicate, sql_string
from spark_sb.state.records import BATCH_COMMITTED, BatchWrites, EntityRecord, Event
from spark_sb.state.writer import EntityView, StateWriter, session_gone

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc)


def test_sql_string_escapes_quotes_and_backslashes() -> None:
    assert sql_string("plain") == "'plain'"
    assert sql_string("it's") == "'it\\'s'"
    assert sql_string("a\\'b") == "'a\\\\\\'b'"


def test_retention_keeps_each_sinks_newest_commits() -> None:
    cutoff = NOW - timedelta(days=30)
    condition = retention_predicate([("b", 1000), ("a'x", 7)], cutoff, keep=100)
    micros = int((cutoff - datetime(1970, 1, 1, tzinfo=timezone.utc)).total_seconds()) * 1_000_000
    assert condition == (
        f"time < timestamp_micros({micros}) AND NOT (event = 'batch_committed' AND "
        "((sink_id = 'a\\'x' AND batch_id > -93) OR (sink_id = 'b' AND batch_id > 900)))"
    )
    assert retention_predicate([], cutoff) == f"time < timestamp_micros({micros})"


@pytest.mark.parametrize(
    ("error", "gone"),
    [
        (AttributeError("'NoneType' object has no attribute 'sc'"), True),
        (
            RuntimeError("java.lang.IllegalStateException: Cannot call methods on a stopped SparkContext."),
            True,
        ),
        (RuntimeError("Job 7 cancelled because SparkContext was shut down"), True),
        (RuntimeError("ConcurrentAppendException: Files were added"), False),
        (ValueError("bad row"), False),
    ],
)
def test_session_gone(error: Exception, gone: bool) -> None:
    assert session_gone(error) is gone


class StoppedSparkStore:
    """A Delta store whose Spark session the program stopped: every write fails as PySpark does then."""

    def __init__(self, location: str) -> None:
        self.tables = StateTables(location=location)
        self.calls = 0

    def write_batch(self, sink_id: str, batch_id: int, writes: BatchWrites) -> None:
        self.calls += 1
        raise AttributeError("'NoneType' object has no attribute 'sc'")

    def entities_version(self) -> int | None:
        raise AttributeError("'NoneType' object has no attribute 'sc'")

    def read_entities(self) -> list[EntityRecord]:
        raise AttributeError("'NoneType' object has no attribute 'sc'")


def _batch(sink: str, batch_id: int) -> BatchWrites:
    return BatchWrites(
        (Event(NOW, sink, batch_id, "sent", count=3), Event(NOW, sink, batch_id, BATCH_COMMITTED, count=3)),
        (EntityRecord("primary", "orders", "failed_over", NOW, "refused"),) if batch_id == 1 else (),
        (),
    )


def test_writes_queued_when_spark_stops_reach_the_tables_through_deltalake(tmp_path: Path) -> None:
    pytest.importorskip("deltalake")
    from spark_sb.state.deltars import DeltaRsStateStore

    location = str(tmp_path / "state")
    stopped = StoppedSparkStore(location)
    writer = StateWriter(stopped, "s", EntityView(), refresh=False, commit_interval=3600)  # type: ignore[arg-type]
    for batch_id in range(3):
        writer.submit(batch_id, batch_id, _batch("s", batch_id))
    writer.close(timeout=60)
    assert stopped.calls == 1  # tried once through Spark, then through deltalake
    tables = DeltaRsStateStore(location)
    commits = sorted(e.batch_id for e in tables.read_events("s") if e.event == BATCH_COMMITTED)
    assert commits == [0, 1, 2]
    assert [(r.entity, r.state) for r in tables.read_entities()] == [("orders", "failed_over")]
    # a later group goes on through deltalake; a repeated batch id is skipped (txnVersion), as with Spark
    writer.submit(3, 2, _batch("s", 2))
    writer.flush(timeout=60)
    writer.submit(4, 3, _batch("s", 3))
    writer.flush(timeout=60)
    commits = sorted(e.batch_id for e in tables.read_events("s") if e.event == BATCH_COMMITTED)
    assert commits == [0, 1, 2, 3]


def test_other_write_errors_are_raised_not_redirected(tmp_path: Path) -> None:
    from spark_sb.state.writer import StateWriteError

    class Failing(StoppedSparkStore):
        def write_batch(self, sink_id: str, batch_id: int, writes: BatchWrites) -> None:
            raise RuntimeError("disk full")

    writer = StateWriter(Failing(str(tmp_path)), "s", EntityView(), refresh=False)  # type: ignore[arg-type]
    writer.submit(0, 0, _batch("s", 0))
    with pytest.raises(StateWriteError, match="disk full"):
        writer.flush(timeout=60)
    assert not (tmp_path / "events").exists()
