"""``jobs/syphon.py`` run with plain ``python`` (its own Spark driver) against two local namespaces in this
process: it moves the backlog, and SIGTERM stops it cleanly (exit 0, the summary printed, nothing lost)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient

from spark_sb.local.model import QueueSettings
from spark_sb.mapping import OutboundMessage, to_backlog

pytestmark = [pytest.mark.spark, pytest.mark.local, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BACKLOG = [f"primary/x-servicebus-transfer/{i}" for i in range(2)]


def test_the_job_moves_the_backlog_and_stops_cleanly_on_sigterm(namespace_pair: Any, tmp_path: Path) -> None:
    primary, secondary = namespace_pair.primary, namespace_pair.secondary
    primary.broker.create_queue("orders", QueueSettings(requires_duplicate_detection=True))
    for name in BACKLOG:
        secondary.broker.create_queue(name)
    now = datetime.now(timezone.utc)
    with (
        ServiceBusClient.from_connection_string(secondary.connection_string) as client,
        client.get_queue_sender(BACKLOG[1]) as sender,
    ):
        sender.send_messages(
            [
                to_backlog(OutboundMessage(body=f"m{i}", message_id=f"m{i}"), "orders", now).to_sdk()
                for i in range(25)
            ]
        )
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
