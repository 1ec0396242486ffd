"""The syphon with ``Trigger.AvailableNow`` (issue 22): ``run_syphon(..., available_now=True)`` and
``jobs/syphon.py --available-now`` drain what the backlog queues hold when they start, then stop by themselves
(what serverless jobs run). Local Spark against two local namespaces. The job's own run (``jobs/syphon.py
--available-now``, a Spark driver of its own) is checked in test_syphon_job_runs.py, whose scenario starts with it;
nothing in it depends on the pyspark version beyond what these tests run (the oldest pair runs this file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spark_sb.spark.syphon_job import run_syphon

from .streams import BACKLOG, drain_ids, messages, put_backlog, syphon_config

pytestmark = pytest.mark.slow


def test_available_now_drains_the_backlog_and_stops_then_a_rerun_with_nothing_there_receives_nothing(
    spark: Any, backlog_pair: Any, tmp_path: Path
) -> None:
    primary, secondary = backlog_pair.primary, backlog_pair.secondary
    state, checkpoint = tmp_path / "state", str(tmp_path / "chk")
    config = syphon_config(backlog_pair, state)
    admin = {"connection_verify": secondary.ca_file}
    put_backlog(secondary, BACKLOG[0], messages("a", 30))
    put_backlog(secondary, BACKLOG[1], messages("b", 10))

    query = run_syphon(spark, config, checkpoint=checkpoint, available_now=True, admin_kwargs=admin)
    try:
        stopped = query.awaitTermination(240)  # generous: CI shares 2 cores
        assert stopped, f"an availableNow query stops by itself: {query.status} {query.recentProgress}"
    finally:
        if query.isActive:
            query.stop()
    assert query.exception() is None
    assert sum(p["numInputRows"] for p in query.recentProgress) == 40  # one row per message moved
    assert sorted(drain_ids(primary.connection_string, "orders")) == sorted(
        [f"a{i}" for i in range(30)] + [f"b{i}" for i in range(10)]
    )
    for name in BACKLOG:
        assert secondary.broker.get_queue(name).runtime.active_message_count == 0
    events = spark.read.format("delta").load(str(state / "events")).collect()
    moved = {(e.entity, e.backlog_queue): e["count"] for e in events if e.event == "moved"}
    assert moved == {("orders", BACKLOG[0]): 30, ("orders", BACKLOG[1]): 10}

    # The same checkpoint, nothing in the backlog: the query stops again, having received nothing.
    secondary.reset_counters()
    query = run_syphon(spark, config, checkpoint=checkpoint, available_now=True, admin_kwargs=admin)
    try:
        assert query.awaitTermination(240)
    finally:
        if query.isActive:
            query.stop()
    counters = secondary.counters()
    assert counters["receiver_links_opened"] == 0 and counters["messages_delivered"] == 0
    assert sum(p["numInputRows"] for p in query.recentProgress) == 0


def test_available_now_moves_a_backlog_larger_than_one_micro_batch_in_as_many_as_it_takes(
    spark: Any, backlog_pair: Any, tmp_path: Path
) -> None:
    """Issue 32 item 4: the source says it supports Trigger.AvailableNow (pyspark 4.1+), so Spark does not fall
    back to one micro-batch: a backlog that one micro-batch's budget (``syphon.batch_duration``) cannot move is
    moved in several, and the query stops by itself. With the fallback, the query would stop after the first."""
    if not _supports_available_now():
        pytest.skip(
            "this pyspark has no SupportsTriggerAvailableNow: Spark runs one micro-batch (and says so)"
        )
    primary, secondary = backlog_pair.primary, backlog_pair.secondary
    # 5 messages a receive, for 0.01 s a micro-batch: all 40 in one would take 4,000 msgs/s (seen: 500-1,500 a
    # micro-batch; 25 messages in 0.1 s fitted one micro-batch once the syphon's settling was fast again)
    config = syphon_config(backlog_pair, tmp_path / "state").with_overrides(
        syphon_batch_duration=0.01, syphon_batch_size=5
    )
    put_backlog(secondary, BACKLOG[0], messages("m", 40))
    query = run_syphon(
        spark,
        config,
        checkpoint=str(tmp_path / "chk"),
        available_now=True,
        admin_kwargs={"connection_verify": secondary.ca_file},
    )
    try:
        assert query.awaitTermination(240), f"an availableNow query stops by itself: {query.status}"
    finally:
        if query.isActive:
            query.stop()
    assert query.exception() is None
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"] > 0]
    assert len(batches) >= 2, batches  # more than one micro-batch's budget, so several micro-batches
    assert sum(batches) == 40
    assert sorted(drain_ids(primary.connection_string, "orders")) == sorted(f"m{i}" for i in range(40))
    assert secondary.broker.get_queue(BACKLOG[0]).runtime.active_message_count == 0


def _supports_available_now() -> bool:
    try:
        from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow  # noqa: F401
    except ImportError:
        return False
    return True


def test_once_and_available_now_together_are_refused(spark: Any, backlog_pair: Any, tmp_path: Path) -> None:
    config = syphon_config(backlog_pair, tmp_path / "state")
    with pytest.raises(ValueError, match="once=True or available_now=True"):
        run_syphon(spark, config, checkpoint=str(tmp_path / "chk"), once=True, available_now=True)
