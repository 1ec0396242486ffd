"""The syphon job (SPEC S7, B9, B11): a Structured Streaming query on local Spark against two local namespaces.

The query's rows are the messages it moved (``numInputRows``), the Delta events table holds what it did per
entity, it restarts from its checkpoint, and while nothing is in the backlog it issues no receive call.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.spark.syphon_job import run_syphon, stop_gracefully

from .streams import BACKLOG, drain_ids, messages, put_backlog, syphon_config

pytestmark = pytest.mark.slow


def test_job_moves_the_backlog_records_events_restarts_and_idles_without_receives(
    spark: Any, backlog_pair: Any, tmp_path: Path
) -> None:
    primary, secondary = backlog_pair.primary, backlog_pair.secondary
    state, checkpoint, stop_file = tmp_path / "state", str(tmp_path / "chk"), str(tmp_path / "stop")
    config = syphon_config(backlog_pair, state)
    put_backlog(secondary, BACKLOG[0], messages("a", 30))
    put_backlog(secondary, BACKLOG[1], messages("b", 10))
    admin = {"connection_verify": secondary.ca_file}

    query = run_syphon(
        spark, config, checkpoint=checkpoint, trigger="1 second", admin_kwargs=admin, stop_file=stop_file
    )
    try:
        query.processAllAvailable()
        moved_rows = sum(p["numInputRows"] for p in query.recentProgress)
        # Idle: nothing in the backlog, nothing failed over. The planner reads runtime counts (management reads);
        # no receive call reaches the secondary.
        secondary.reset_counters()
        idle_started = query.lastProgress["batchId"] if query.lastProgress else -1
        assert secondary.wait_until(lambda: secondary.counters()["admin_requests"] >= 3, timeout=30)
        idle = secondary.counters()
    finally:
        stop_gracefully(query, stop_file, timeout=30)
    assert moved_rows == 40  # one row per message moved
    assert sorted(drain_ids(primary.connection_string, "orders")) == sorted(
        [f"a{i}" for i in range(30)] + [f"b{i}" for i in range(10)]
    )
    assert (
        idle["receive_flows"] == 0 and idle["receiver_links_opened"] == 0 and idle["messages_delivered"] == 0
    )
    assert query.lastProgress is None or query.lastProgress["batchId"] <= idle_started + 1

    events = spark.read.format("delta").load(str(state / "events")).collect()
    moved = {(e.entity, e.backlog_queue): e["count"] for e in events if e.event == "moved"}
    assert moved == {("orders", BACKLOG[0]): 30, ("orders", BACKLOG[1]): 10}
    assert {e.sink_id for e in events} == {"syphon/primary"}
    assert not any(e.event == "syphon_error" for e in events)

    # Restart from the same checkpoint: new backlog messages are moved by the restarted query.
    Path(stop_file).unlink()
    put_backlog(secondary, BACKLOG[1], messages("c", 5))
    query = run_syphon(
        spark, config, checkpoint=checkpoint, trigger="1 second", admin_kwargs=admin, stop_file=stop_file
    )
    try:
        query.processAllAvailable()
    finally:
        stop_gracefully(query, stop_file, timeout=30)
    assert sorted(drain_ids(primary.connection_string, "orders")) == [f"c{i}" for i in range(5)]
    for name in BACKLOG:
        assert secondary.broker.get_queue(name).runtime.active_message_count == 0


def test_the_planner_reads_entity_states_written_by_the_store_as_hints(spark: Any, tmp_path: Path) -> None:
    """What the state table says reaches the executors as hints (read without Spark, by delta-rs)."""
    from spark_sb.failover.outcome import namespace_key
    from spark_sb.spark.syphon_planner import read_entity_hints
    from spark_sb.state.delta import DeltaStateStore, StateTables
    from spark_sb.state.records import BatchWrites, EntityRecord

    config = ServiceBusConfig.from_dict(
        {
            "primary": {
                "connection_string": "Endpoint=sb://p.example:5672;SharedAccessKeyName=k;SharedAccessKey=a"
            },
            "secondary": {
                "connection_string": "Endpoint=sb://s.example:5672;SharedAccessKeyName=k;SharedAccessKey=b"
            },
            "state_location": str(tmp_path / "state"),
        }
    )
    assert read_entity_hints(config) == {}  # no table yet: every entity is probed
    at = datetime(2026, 3, 1, tzinfo=timezone.utc)
    ns = namespace_key(config.primary)
    records = (
        EntityRecord(ns, "orders", "failed_over", at),
        EntityRecord(ns, "audit", "healthy", at),
        EntityRecord("other:1", "orders", "healthy", at),
    )
    DeltaStateStore(spark, StateTables(location=str(tmp_path / "state"))).write_batch(
        "s", 0, BatchWrites((), records, ())
    )
    assert read_entity_hints(config) == {"orders": "failed_over", "audit": "healthy"}


def test_a_message_for_an_entity_that_does_not_exist_becomes_an_event_and_shows_in_status(
    spark: Any, backlog_pair: Any, tmp_path: Path
) -> None:
    """Issue 29 item 5: with ``syphon.max_attempts`` 1 the first not-found answer dead-letters the message in the
    backlog; the job writes a ``dead_lettered`` event with error class ``entity_not_found`` and ``spark-sb status``
    counts it for the entity, while the other entity's message moves."""
    from dataclasses import replace

    from spark_sb.admin.status import read_status

    state, checkpoint = tmp_path / "state", str(tmp_path / "chk")
    config = replace(syphon_config(backlog_pair, state), syphon_max_attempts=1)
    put_backlog(backlog_pair.secondary, BACKLOG[0], messages("typo", 2, entity="orderz") + messages("ok", 1))
    query = run_syphon(
        spark,
        config,
        checkpoint=checkpoint,
        available_now=True,
        admin_kwargs={"connection_verify": backlog_pair.secondary.ca_file},
    )
    query.awaitTermination(120)
    assert not query.isActive
    assert drain_ids(backlog_pair.primary.connection_string, "orders") == ["ok0"]
    runtime = backlog_pair.secondary.broker.get_queue(BACKLOG[0]).runtime
    assert (runtime.active_message_count, runtime.dead_letter_message_count) == (0, 2)

    events = spark.read.format("delta").load(str(state / "events")).collect()
    dead = [(e.entity, e.error_class, e["count"], e.detail) for e in events if e.event == "dead_lettered"]
    assert dead == [("orderz", "entity_not_found", 2, "DestinationNotFound")]
    status = read_status(config, depths=False)
    assert [(u["entity"], u["count"]) for u in status.undeliverable] == [("orderz", 2)]
