"""``jobs/syphon.py`` run with plain ``python`` (its own Spark driver) against two local namespaces in this
process: it moves the backlog, and SIGTERM stops it cleanly (exit 0, the summary printed, nothing lost); killed
mid-move and restarted, it loses and duplicates nothing; under ``spark-submit --once`` it moves the backlog.

The first two share one run (CI time: a job's Spark start is most of its cost): the job killed mid-move, then
restarted, and the restarted job is the one SIGTERM stops (:func:`killed_and_restarted`, module-scoped: this file's
tests run in one pytest-xdist worker, ``--dist loadfile``). Its summary must name exactly what the backlog held
after the kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient

from harness.queues import take_ids
from servicebus_local.model import QueueSettings
from spark_sb.message.backlog import to_backlog
from spark_sb.message.outbound import OutboundMessage

from .cluster_harness import two_namespaces

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BACKLOG = [f"primary/x-servicebus-transfer/{i}" for i in range(2)]


@dataclass
class KilledAndRestarted:
    """What the shared run did (:func:`killed_and_restarted`): the first job's progress when it was killed, what
    the backlog still held then, and the restarted job's end (stopped by SIGTERM)."""

    produced: list[str]
    secrets: tuple[str, str]
    moving_at_kill: bool = False  # the first job had sent 40 messages to the primary when it was killed
    moved_before: int = -1  # on the primary after the kill
    closed_at_kill: bool = False  # the dead job's connections seen closed by both namespaces
    left: int = -1  # in the backlog queues after the kill: what the restarted job has to move
    done: bool = False  # everything on the primary within the restarted job's 180 s
    returncode: int | None = None
    out: str = ""
    err: str = ""
    got: list[str] = field(default_factory=list)  # what the primary held at the end
    backlog_total: dict[str, int] = field(default_factory=dict)  # each backlog queue's total count at the end
    backlog_active: dict[str, int] = field(default_factory=dict)  # its active count at the end


@pytest.fixture(scope="module")
def killed_and_restarted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilledAndRestarted]:
    """One run shared by two tests (CI time: a job's start is most of its cost; this file's tests run in one
    pytest-xdist worker, ``--dist loadfile``): the job is SIGKILLed while it moves 600 messages, restarted on the
    same checkpoint, and the restarted job is stopped by SIGTERM once everything is on the primary."""
    with two_namespaces() as (primary, secondary):
        yield _kill_and_restart(primary, secondary, tmp_path_factory.mktemp("killed"))


def _kill_and_restart(primary: Any, secondary: Any, tmp_path: Path) -> KilledAndRestarted:
    from datetime import timedelta

    primary.broker.create_queue("orders", QueueSettings(requires_duplicate_detection=True))
    short = QueueSettings(lock_duration=timedelta(seconds=5))  # the dead job's locks run out soon
    for name in BACKLOG:
        secondary.broker.create_queue(name, short)
    now = datetime.now(timezone.utc)
    run = KilledAndRestarted([f"m{i}" for i in range(600)], (primary.key, secondary.key))
    with ServiceBusClient.from_connection_string(secondary.connection_string) as client:
        for q, ids in ((BACKLOG[0], run.produced[:300]), (BACKLOG[1], run.produced[300:])):
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
        args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, start_new_session=True
    )
    try:
        run.moving_at_kill = primary.wait_until(
            lambda: primary.counters()["messages_received"] >= 40, timeout=120
        )
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)
    primary.faults.set_latency(0)
    # the dead job's last frames handled (its connections seen closed) before the counts are read
    run.closed_at_kill = all(
        ns.wait_until(lambda ns=ns: ns.counters()["connections_open"] == 0, timeout=30)
        for ns in (primary, secondary)
    )
    run.moved_before = primary.broker.get_queue("orders").runtime.active_message_count
    run.left = sum(secondary.broker.get_queue(name).runtime.total_message_count for name in BACKLOG)
    # the restarted job's own locks the service's default (60 s): a lock of 5 s that ran out under load while a
    # message was being moved would move it twice and make the moved count of its summary inexact
    for name in BACKLOG:
        secondary.broker.update_queue(name, replace(short, lock_duration=timedelta(minutes=1)))
    job = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run.done = primary.wait_until(
            lambda: primary.broker.get_queue("orders").runtime.active_message_count == len(run.produced),
            timeout=180,
        )
        job.send_signal(signal.SIGTERM)
        run.out, run.err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    run.returncode = job.returncode
    for name in BACKLOG:
        runtime = secondary.broker.get_queue(name).runtime
        run.backlog_total[name], run.backlog_active[name] = (
            runtime.total_message_count,
            runtime.active_message_count,
        )
    run.got = take_ids(primary.connection_string, "orders", wait=1)
    return run


def test_the_job_moves_the_backlog_and_stops_cleanly_on_sigterm(
    killed_and_restarted: KilledAndRestarted,
) -> None:
    """The restarted job of the shared run (:func:`killed_and_restarted`): it moves what the backlog holds, and
    SIGTERM stops it cleanly - exit 0, the summary of exactly what it moved, no key in its output."""
    run = killed_and_restarted
    assert run.done, run.returncode
    assert run.returncode == 0, run.err[-2000:]
    assert run.closed_at_kill  # what the backlog held after the kill is what the restarted job had to move
    assert f"syphon: stopped (between micro-batches); moved {run.left} (orders={run.left})" in run.out
    assert run.backlog_active == dict.fromkeys(BACKLOG, 0)
    for secret in run.secrets:
        assert secret not in run.out and secret not in run.err


def test_killed_mid_move_and_restarted_nothing_lost_nothing_duplicated(
    killed_and_restarted: KilledAndRestarted,
) -> None:
    """R1: the job's process group (driver, JVM, Python workers) is SIGKILLed while it moves; the restarted job
    (same checkpoint) moves the rest once the dead job's locks run out. Ids compared as sets; duplicate detection
    on the primary."""
    run = killed_and_restarted
    assert run.moving_at_kill
    assert 0 < run.moved_before < len(run.produced)
    assert run.done
    assert set(run.got) == set(run.produced) and len(run.got) == len(run.produced)  # 0 lost, 0 duplicates
    assert run.backlog_total == dict.fromkeys(BACKLOG, 0)


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
