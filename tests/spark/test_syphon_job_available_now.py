"""The syphon with ``Trigger.AvailableNow`` (issue 22): ``run_syphon(..., available_now=True)`` and
``jobs/syphon.py --available-now`` drain what the backlog queues hold when they start, then stop by themselves
(what serverless jobs run). Local Spark against two local namespaces.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusReceiveMode

from servicebus_local.model import QueueSettings
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.message.backlog import to_backlog
from spark_sb.message.outbound import OutboundMessage
from spark_sb.spark.syphon_job import run_syphon

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BACKLOG = [f"primary/x-servicebus-transfer/{i}" for i in range(2)]


def _config(pair: Any, state: Path) -> ServiceBusConfig:
    return ServiceBusConfig.from_dict(
        {
            "primary": {"connection_string": pair.primary.connection_string, "namespace_name": "primary"},
            "secondary": {"connection_string": pair.secondary.connection_string},
            "backlog_queue_count": len(BACKLOG),
            "send_timeout": "5s",
            "ping_primary_interval": "60s",
            "state_location": str(state),
            "syphon": {"batch_duration": "20s"},
        }
    )


def _put(ns: Any, queue: str, prefix: str, n: int) -> None:
    now = datetime.now(timezone.utc)
    messages = [
        to_backlog(OutboundMessage(body=f"{prefix}{i}", message_id=f"{prefix}{i}"), "orders", now).to_sdk()
        for i in range(n)
    ]
    with (
        ServiceBusClient.from_connection_string(ns.connection_string) as client,
        client.get_queue_sender(queue) as sender,
    ):
        sender.send_messages(messages)


def _take(ns: Any, entity: str) -> list[str]:
    with (
        ServiceBusClient.from_connection_string(ns.connection_string) as client,
        client.get_queue_receiver(entity, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver,
    ):
        out: list[str] = []
        while batch := receiver.receive_messages(max_message_count=200, max_wait_time=0.5):
            out.extend(str(m.message_id) for m in batch)
        return out


@pytest.fixture
def pair(namespace_pair: Any) -> Any:
    namespace_pair.primary.broker.create_queue("orders", QueueSettings(requires_duplicate_detection=True))
    for name in BACKLOG:
        namespace_pair.secondary.broker.create_queue(name)
    return namespace_pair


def test_available_now_drains_the_backlog_and_stops_then_a_rerun_with_nothing_there_receives_nothing(
    spark: Any, pair: Any, tmp_path: Path
) -> None:
    primary, secondary = pair.primary, pair.secondary
    state, checkpoint = tmp_path / "state", str(tmp_path / "chk")
    config = _config(pair, state)
    admin = {"connection_verify": secondary.ca_file}
    _put(secondary, BACKLOG[0], "a", 30)
    _put(secondary, BACKLOG[1], "b", 10)

    query = run_syphon(spark, config, checkpoint=checkpoint, available_now=True, admin_kwargs=admin)
    try:
        stopped = query.awaitTermination(240)  # generous: CI shares 2 cores
        assert stopped, f"an availableNow query stops by itself: {query.status} {query.recentProgress}"
    finally:
        if query.isActive:
            query.stop()
    assert query.exception() is None
    assert sum(p["numInputRows"] for p in query.recentProgress) == 40  # one row per message moved
    assert sorted(_take(primary, "orders")) == sorted(
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
    spark: Any, pair: Any, tmp_path: Path
) -> None:
    """Issue 32 item 4: the source says it supports Trigger.AvailableNow (pyspark 4.1+), so Spark does not fall
    back to one micro-batch: a backlog that one micro-batch's budget (``syphon.batch_duration``) cannot move is
    moved in several, and the query stops by itself. With the fallback, the query would stop after the first."""
    if not _supports_available_now():
        pytest.skip(
            "this pyspark has no SupportsTriggerAvailableNow: Spark runs one micro-batch (and says so)"
        )
    primary, secondary = pair.primary, pair.secondary
    config = _config(pair, tmp_path / "state").with_overrides(
        syphon_batch_duration=0.1,
        syphon_batch_size=5,  # 5 messages a receive, for 0.1 s a micro-batch
    )
    _put(secondary, BACKLOG[0], "m", 400)
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
    assert sum(batches) == 400
    assert sorted(_take(primary, "orders")) == sorted(f"m{i}" for i in range(400))
    assert secondary.broker.get_queue(BACKLOG[0]).runtime.active_message_count == 0


def _supports_available_now() -> bool:
    try:
        from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow  # noqa: F401
    except ImportError:
        return False
    return True


def test_once_and_available_now_together_are_refused(spark: Any, pair: Any, tmp_path: Path) -> None:
    config = _config(pair, tmp_path / "state")
    with pytest.raises(ValueError, match="once=True or available_now=True"):
        run_syphon(spark, config, checkpoint=str(tmp_path / "chk"), once=True, available_now=True)


def test_the_job_with_available_now_moves_the_backlog_and_exits_by_itself(pair: Any, tmp_path: Path) -> None:
    """``python jobs/syphon.py --available-now``: no signal needed, exit 0, what it moved printed."""
    primary, secondary = pair.primary, pair.secondary
    _put(secondary, BACKLOG[0], "s", 7)
    conf = tmp_path / "syphon.yaml"
    conf.write_text(
        "primary: {connection_string: '${env:SB_PRIMARY_CONNECTION_STRING}', namespace_name: primary}\n"
        "secondary: {connection_string: '${env:SB_SECONDARY_CONNECTION_STRING}'}\n"
        f"backlog_queue_count: {len(BACKLOG)}\n"
        f"state_location: {tmp_path / 'state'}\n"
    )
    env = {
        **os.environ,
        "SB_PRIMARY_CONNECTION_STRING": primary.connection_string,
        "SB_SECONDARY_CONNECTION_STRING": secondary.connection_string,
        "REQUESTS_CA_BUNDLE": secondary.ca_file,
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "jobs/syphon.py"), "--config", str(conf), "--available-now"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "moved 7 (orders=7)" in done.stdout
    assert sorted(_take(primary, "orders")) == sorted(f"s{i}" for i in range(7))
    refused = subprocess.run(
        [sys.executable, str(ROOT / "jobs/syphon.py"), "--config", str(conf), "--once", "--available-now"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2 and "not allowed with argument" in refused.stderr
