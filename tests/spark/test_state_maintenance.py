"""State tables that stay small (smaller numbers than ``bench/bench_state_growth.py``): tables grown by months of
batches, then ``spark-sb maintain``: old events and rejects go, the entities, the held sessions and the rows replay
skipping reads stay, the files are compacted, the table properties set, and what a sink and ``status`` read at batch start costs
about what it costs on young tables."""

from __future__ import annotations

import argparse
import io
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from harness.state_growth import SINKS, bulk_history, entity_records, measure, seed, small_commits
from spark_sb.state.delta import DeltaStateStore, StateTables
from spark_sb.state.maintenance import maintain_if_due
from spark_sb.state.records import (
    BATCH_COMMITTED,
    MAINTAINED,
    TABLE_PROPERTIES,
    BatchWrites,
    Event,
    RejectRecord,
)
from spark_sb.state.sessions import HeldLine, PendingMarker

pytestmark = pytest.mark.slow

NOW = datetime.now(timezone.utc).replace(microsecond=0)
BATCHES = 3_000  # one every 20 minutes: ~42 days, the oldest ~12 days beyond a 30-day retention


def _maintain_cli(spark: Any, config: Path) -> dict[str, Any]:
    from spark_sb.admin.cli import build_parser, run_maintain

    args: argparse.Namespace = build_parser().parse_args(["maintain", "--config", str(config), "--json"])
    out, err = io.StringIO(), io.StringIO()
    assert run_maintain(args, out=out, err=err, spark=spark) == 0, err.getvalue()
    report: dict[str, Any] = json.loads(out.getvalue())
    return report


@pytest.mark.timeout(900)  # ~1.5 min alone; a 2-core machine shared with other Spark runs triples it
def test_maintain_keeps_the_tables_small_and_what_sinks_need(spark: Any, tmp_path: Path) -> None:
    grown = str(tmp_path / "grown")
    records = entity_records(NOW)
    # the grown tables were made before the table properties existed
    for table, ddl in (("events", "EVENTS_DDL"), ("entities", "ENTITIES_DDL"), ("rejects", "REJECTS_DDL")):
        import spark_sb.state.records as state_records

        spark.sql(
            f"CREATE TABLE delta.`{grown}/{table}` ({getattr(state_records, ddl)}) USING DELTA"
        ).collect()
    store = seed(spark, grown, NOW, records)
    # what a sink and status pay at batch start on these tables while young (seeded, not yet grown)
    base = measure(spark, grown, repeat=1, commits=False)
    bulk_history(spark, grown, BATCHES, end=NOW - timedelta(minutes=5), every=20 * 60, files=20)
    small_commits(grown, 20, end=NOW, first_batch=BATCHES)
    # a sink that stopped long ago: its newest commit is older than the retention, and stays
    old = NOW - timedelta(days=60)
    store.write_batch(
        "retired", 41, BatchWrites((Event(old, "retired", 41, BATCH_COMMITTED, count=9),), (), ())
    )
    store.write_batch(
        "orders-ns/orders",
        BATCHES + 100,
        BatchWrites(
            (Event(NOW, "orders-ns/orders", BATCHES + 100, BATCH_COMMITTED),),
            (),
            (
                RejectRecord(old, "orders-ns/orders", 1, "orders", "body", "too large", "{}"),
                RejectRecord(NOW, "orders-ns/orders", 2, "orders", "body", "too large", "{}"),
            ),
        ),
    )
    # a sink with ordering on: its held lines rewritten at every batch that changed them (a file and a commit each)
    assert not store.sessions_exist()
    for n in range(1, 5):
        lines = [
            HeldLine("orders", f"s{i}", "q0", old, (PendingMarker("q0", f"m{n}-{i}", NOW),)) for i in range(n)
        ]
        store.write_sessions("orders-ns/orders", lines)
    assert store.sessions_exist()
    last = {s: store.last_committed(s) for s in (*SINKS, "retired")}

    config = tmp_path / "conf.yaml"
    config.write_text(
        "primary:\n  connection_string: Endpoint=sb://orders-ns.servicebus.windows.net/;"
        "SharedAccessKeyName=k;SharedAccessKey=x\n"
        f"state_location: {grown}\nstate_retention: 30d\nstate_maintain_every: 1d\n"
    )
    report = _maintain_cli(spark, config)
    tables = {t["table"]: t for t in report["tables"]}
    assert tables["entities"]["deleted_rows"] == 0
    assert tables["sessions"]["deleted_rows"] == 0 and tables["sessions"]["files_after"] <= 1
    assert tables["rejects"]["deleted_rows"] == 1
    assert tables["events"]["deleted_rows"] > 0
    assert tables["events"]["files_after"] <= 2 < 20 <= tables["events"]["files_before"]

    after = DeltaStateStore(spark, StateTables(location=grown))
    events = after.read_events()
    cutoff = NOW - timedelta(days=30)
    kept_old = [e for e in events if e.time < cutoff - timedelta(minutes=1)]
    assert kept_old and all(e.event == BATCH_COMMITTED for e in kept_old)
    assert {s: after.last_committed(s) for s in last} == last  # replay skipping reads the same
    for sink in SINKS:  # each sink's newest commits, whatever their age
        assert after.committed(sink, last[sink] or 0) is not None
    assert after.committed("retired", 41) is not None
    assert min(e.time for e in events if e.event != BATCH_COMMITTED and e.sink_id in SINKS) >= cutoff
    assert sorted((r.entity, r.state) for r in after.read_entities()) == sorted(
        (r.entity, r.state) for r in records
    )
    assert [r.batch_id for r in after.read_rejects()] == [2]
    assert after.read_sessions("orders-ns/orders") == lines  # the held lines stay, whatever their age
    assert [e.event for e in events if e.sink_id == "spark-sb/maintain"] == [MAINTAINED]
    for table in ("events", "entities", "rejects", "sessions"):
        props = {
            r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES delta.`{grown}/{table}`").collect()
        }
        assert {k: props.get(k) for k in TABLE_PROPERTIES} == TABLE_PROPERTIES

    # what a sink and status pay at batch start: about the young tables' cost again (the bench holds the 10%).
    # One sample of each, a minute apart, beside another Spark worker on 2 cores, once compared a load spike with a
    # lull: when the bounds are missed, the maintained tables are measured again (twice at most) and the fastest
    # compared - the same bounds.
    bases, maintained_runs = [base], [measure(spark, grown, repeat=1, commits=False)]

    def within_bounds() -> bool:
        young, old = min(b.per_batch for b in bases), min(m.per_batch for m in maintained_runs)
        young_first, old_first = (
            min(b.first_batch for b in bases),
            min(m.first_batch for m in maintained_runs),
        )
        return old <= 1.5 * young + 0.3 and old_first <= 1.5 * young_first + 0.5

    for _ in range(2):
        if within_bounds():
            break
        maintained_runs.append(measure(spark, grown, repeat=1, commits=False))
    assert within_bounds(), (bases, maintained_runs)
    assert min(m.status for m in maintained_runs) < 3.0

    # the syphon job's schedule: not due within a day of the maintenance
    from spark_sb.config.service_bus import load_config

    assert maintain_if_due(spark, load_config(str(config)), now=NOW + timedelta(hours=23)) is None


def test_maintain_runs_each_statement_on_small_tables(spark: Any, tmp_path: Path) -> None:
    """Every statement of :func:`maintain` on a few rows (the oldest Spark pair runs this one in place of the grown
    tables above: the same DELETE, OPTIMIZE, VACUUM and ALTER TABLE on its Delta): the events and rejects past the
    retention go but the commits replay skipping reads, files are compacted, properties set."""
    from spark_sb.state.maintenance import maintain
    from spark_sb.state.records import SENT

    location = str(tmp_path / "small")
    for table, ddl in (("events", "EVENTS_DDL"), ("entities", "ENTITIES_DDL"), ("rejects", "REJECTS_DDL")):
        import spark_sb.state.records as state_records

        spark.sql(
            f"CREATE TABLE delta.`{location}/{table}` ({getattr(state_records, ddl)}) USING DELTA"
        ).collect()
    store = DeltaStateStore(spark, StateTables(location=location))
    old, recent = NOW - timedelta(days=40), NOW - timedelta(days=1)
    store.append_events(
        [
            *(Event(old, "s", b, kind, count=1) for b in (1, 2) for kind in (SENT, BATCH_COMMITTED)),
            Event(old, "quiet", 7, BATCH_COMMITTED),
        ]
    )
    store.write_batch(
        "s",
        3,
        BatchWrites(
            (Event(recent, "s", 3, SENT, count=1), Event(recent, "s", 3, BATCH_COMMITTED, count=1)),
            (),
            tuple(RejectRecord(t, "s", 3, "orders", "body", "too large", "{}") for t in (old, recent)),
        ),
    )
    report = maintain(spark, StateTables(location=location), retention=30 * 86400.0, now=NOW)
    tables = {t.table: t for t in report.tables}
    # the sent events of batches 1 and 2; their commits are among the sink's newest 100 (replay skipping reads them)
    assert tables["events"].deleted_rows == 2
    assert tables["rejects"].deleted_rows == 1 and tables["entities"].deleted_rows == 0
    assert tables["events"].files_after < tables["events"].files_before == 2
    after = DeltaStateStore(spark, StateTables(location=location))
    kept = sorted(
        (e.sink_id, e.batch_id, e.event) for e in after.read_events() if e.sink_id != "spark-sb/maintain"
    )
    assert kept == [
        ("quiet", 7, BATCH_COMMITTED),
        *(("s", b, BATCH_COMMITTED) for b in (1, 2, 3)),
        ("s", 3, SENT),
    ]
    assert [r.time for r in after.read_rejects()] == [recent]
    for table in ("events", "entities", "rejects"):
        props = {
            r["key"]: r["value"]
            for r in spark.sql(f"SHOW TBLPROPERTIES delta.`{location}/{table}`").collect()
        }
        assert {k: props.get(k) for k in TABLE_PROPERTIES} == TABLE_PROPERTIES


def test_new_tables_are_created_with_the_properties(spark: Any, tmp_path: Path) -> None:
    DeltaStateStore(spark, StateTables(location=str(tmp_path / "s"))).ensure()
    props = {
        r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES delta.`{tmp_path}/s/events`").collect()
    }
    assert {k: props.get(k) for k in TABLE_PROPERTIES} == TABLE_PROPERTIES


def test_the_schedule_counts_from_the_tables_creation(spark: Any, tmp_path: Path) -> None:
    from types import SimpleNamespace

    location = str(tmp_path / "young")
    DeltaStateStore(spark, StateTables(location=location)).ensure()
    config = SimpleNamespace(
        state_location=location,
        state_table_prefix=None,
        state_maintain_every=86400.0,
        state_retention=30 * 86400.0,
    )
    now = datetime.now(timezone.utc)
    assert maintain_if_due(spark, config, now=now + timedelta(hours=20)) is None  # created just now
    off = SimpleNamespace(**{**config.__dict__, "state_maintain_every": 0.0})
    assert maintain_if_due(spark, off, now=now + timedelta(days=400)) is None  # 0: never
