"""State tables over a long life, without Spark: the retention condition and SQL literals of
spark_sb.state.maintenance. (What says a Spark session is gone, and the state writer finishing its writes through
deltalake once the program stopped Spark, are tested in ``test_writer.py``.)"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from spark_sb.state.maintenance import retention_predicate, sql_string

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
