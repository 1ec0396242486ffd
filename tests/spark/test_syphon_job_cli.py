"""``jobs/syphon.py`` run with plain ``python`` (its own Spark driver) against two local namespaces in this
process: it moves the backlog, and SIGTERM stops it cleanly (exit 0, the summary printed, nothing lost)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient

from harness.queues import take_ids
from servicebus_local.model import QueueSettings
from spark_sb.message.backlog import to_backlog
from spark_sb.message.outbound import OutboundMessage

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BACKLOG = [f"primary/x-servicebus-transfer/{i}" for i in range(2)]


def test_the_job_moves_the_backlog_and_stops_cleanly_on_sigterm(namespace_pair: Any, tmp_path: Path) -> None:
    primary, secondary = namespace_pair.primary, namespace_pair.secondary
    primary.broker.create_queue("orders", QueueSettings(requires_duplicate_detection=True))
    _backlog(secondary, BACKLOG[1], [f"m{i}" for i in range(25)], lambda i: f"m{i}")
    conf = tmp_path / "syphon.yaml"
    conf.write_text(
        "primary: {connection_string: '${env:SB_PRIMARY_CONNECTION_STRING}', namespace_name: primary}\n"
        "secondary: {connection_string: '${env:SB_SECONDARY_CONNECTION_STRING}'}\n"
        f"backlog_queue_count: {len(BACKLOG)}\n"
        "send_timeout: 5s\n"
        f"state_location: {tmp_path / 'state'}\n"
        "syphon: {batch_duration: 10s}\n"
    )
    env = {
        **os.environ,
        "SB_PRIMARY_CONNECTION_STRING": primary.connection_string,
        "SB_SECONDARY_CONNECTION_STRING": secondary.connection_string,
        "REQUESTS_CA_BUNDLE": secondary.ca_file,
    }
    job = subprocess.Popen(
        [sys.executable, str(ROOT / "jobs/syphon.py"), "--config", str(conf), "--trigger", "1s"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        moved = primary.wait_until(
            lambda: primary.broker.get_queue("orders").runtime.active_message_count == 25, timeout=120
        )
        assert moved, job.poll()
        job.send_signal(signal.SIGTERM)
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, err[-2000:]
    assert "syphon: stopped (between micro-batches); moved 25 (orders=25)" in out
    assert secondary.broker.get_queue(BACKLOG[1]).runtime.active_message_count == 0
    for secret in (primary.key, secondary.key):
        assert secret not in out and secret not in err


def test_killed_mid_move_and_restarted_nothing_lost_nothing_duplicated(
    namespace_pair: Any, tmp_path: Path
) -> None:
    """R1: the job's process group (driver, JVM, Python workers) is SIGKILLed while it moves; the restarted job
    (same checkpoint) moves the rest once the dead job's locks run out. Ids compared as sets; duplicate detection
    on the primary."""
    from datetime import timedelta

    primary, secondary = namespace_pair.primary, namespace_pair.secondary
    primary.broker.create_queue("orders", QueueSettings(requires_duplicate_detection=True))
    for name in BACKLOG:
        secondary.broker.create_queue(name, QueueSettings(lock_duration=timedelta(seconds=5)))
    now = datetime.now(timezone.utc)
    produced = [f"m{i}" for i in range(600)]
    with ServiceBusClient.from_connection_string(secondary.connection_string) as client:
        for q, ids in ((BACKLOG[0], produced[:300]), (BACKLOG[1], produced[300:])):
            with client.get_queue_sender(q) as sender:
                sender.send_messages(
                    [to_backlog(OutboundMessage(body=i, message_id=i), "orders", now).to_sdk() for i in ids]
                )
    conf = tmp_path / "syphon.yaml"
    conf.write_text(
        "primary: {connection_string: '${env:SB_PRIMARY_CONNECTION_STRING}', namespace_name: primary}\n"
        "secondary: {connection_string: '${env:SB_SECONDARY_CONNECTION_STRING}'}\n"
        f"backlog_queue_count: {len(BACKLOG)}\n"
        "send_timeout: 2s\n"
        f"state_location: {tmp_path / 'state'}\n"
        "syphon: {batch_duration: 10s, batch_size: 20}\n"
    )
    env = {
        **os.environ,
        "SB_PRIMARY_CONNECTION_STRING": primary.connection_string,
        "SB_SECONDARY_CONNECTION_STRING": secondary.connection_string,
        "REQUESTS_CA_BUNDLE": secondary.ca_file,
    }
    args = [sys.executable, str(ROOT / "jobs/syphon.py"), "--config", str(conf), "--trigger", "1s"]
    primary.faults.set_latency(0.05)  # slow sends: the kill lands mid-move
    job = subprocess.Popen(
        args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        assert primary.wait_until(lambda: primary.counters()["messages_received"] >= 40, timeout=120)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)
    primary.faults.set_latency(0)
    moved_before = primary.broker.get_queue("orders").runtime.active_message_count
    assert 0 < moved_before < len(produced)
    job = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        done = primary.wait_until(
            lambda: primary.broker.get_queue("orders").runtime.active_message_count == len(produced),
            timeout=180,
        )
        job.send_signal(signal.SIGTERM)
        job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert done
    got = take_ids(primary.connection_string, "orders", wait=1)
    assert set(got) == set(produced) and len(got) == len(produced)  # 0 lost, 0 duplicates
    for name in BACKLOG:
        assert secondary.broker.get_queue(name).runtime.total_message_count == 0


def test_spark_submit_once_moves_the_backlog(namespace_pair: Any, tmp_path: Path) -> None:
    """``spark-submit jobs/syphon.py --once`` (the master and the Delta jars from spark-submit): one micro-batch."""
    primary, secondary = namespace_pair.primary, namespace_pair.secondary
    primary.broker.create_queue("orders")
    _backlog(secondary, BACKLOG[0], [f"s{i}" for i in range(9)], lambda i: "x")
    conf = tmp_path / "syphon.yaml"
    conf.write_text(
        "primary: {connection_string: '${env:SB_PRIMARY_CONNECTION_STRING}', namespace_name: primary}\n"
        "secondary: {connection_string: '${env:SB_SECONDARY_CONNECTION_STRING}'}\n"
        f"backlog_queue_count: {len(BACKLOG)}\n"
        f"state_location: {tmp_path / 'state'}\n"
    )
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",  # spark-submit finds pyspark's home by it
        "PYSPARK_PYTHON": sys.executable,
        "SB_PRIMARY_CONNECTION_STRING": primary.connection_string,
        "SB_SECONDARY_CONNECTION_STRING": secondary.connection_string,
        "REQUESTS_CA_BUNDLE": secondary.ca_file,
    }
    from spark_sb.spark.session import delta_packages

    done = subprocess.run(
        [
            str(bin_dir / "spark-submit"),
            "--master",
            "local[2]",
            "--packages",
            delta_packages(),
            "--conf",
            "spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension",
            "--conf",
            "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog",
            # as the README's spark-submit example: with the defaults (200 shuffle partitions, 50 Delta snapshot
            # partitions) the state tables' reads and writes cost about twice the CPU on local[2]
            "--conf",
            "spark.sql.shuffle.partitions=2",
            "--conf",
            "spark.databricks.delta.snapshotPartitions=2",
            str(ROOT / "jobs/syphon.py"),
            "--config",
            str(conf),
            "--once",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # Spark's INFO lines are off once the session starts (940 of 1,077 lines before; spark-submit's own start
    # logs a few dozen before the session can say so)
    info = [line for line in done.stderr.splitlines() if " INFO " in line]
    assert len(info) < 100, f"{len(info)} INFO lines, e.g. {info[-3:]}"
    assert "moved 9 (orders=9)" in done.stdout
    assert primary.broker.get_queue("orders").runtime.active_message_count == 9


def _backlog(secondary: Any, queue: str, ids: list[str], body: Callable[[int], str]) -> None:
    """The backlog queues made on ``secondary``, and ``ids`` sent to ``queue`` as diverted from entity ``orders``."""
    for name in BACKLOG:
        secondary.broker.create_queue(name)
    now = datetime.now(timezone.utc)
    with (
        ServiceBusClient.from_connection_string(secondary.connection_string) as client,
        client.get_queue_sender(queue) as sender,
    ):
        sender.send_messages(
            [
                to_backlog(OutboundMessage(body=body(i), message_id=m), "orders", now).to_sdk()
                for i, m in enumerate(ids)
            ]
        )
