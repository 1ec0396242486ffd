"""``spark-sb status`` reads the state tables with delta-rs (no Spark) and asks for backlog depths."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from spark_sb.admin.cli import main
from spark_sb.admin.status import format_status, read_status
from tests.unit.sender.rig import make_config

deltalake = pytest.importorskip("deltalake")

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


def _tables(root: Path) -> None:
    import pyarrow as pa

    pulled = pa.struct(
        [("queue", pa.string()), ("until", pa.timestamp("us", "UTC")), ("error_class", pa.string())]
    )
    entities = pa.table(
        {
            "namespace": ["ns"],
            "entity": ["orders"],
            "state": ["failed_over"],
            "since": pa.array([T0], pa.timestamp("us", "UTC")),
            "last_error_class": ["timeout"],
            "backlog_namespace": ["b"],
            "pulled_backlog_queues": pa.array(
                [
                    [
                        {
                            "queue": "primary/x-servicebus-transfer/0",
                            "until": T0 + timedelta(hours=1),
                            "error_class": "timeout",
                        }
                    ]
                ],
                pa.list_(pulled),
            ),
            "updated_at": pa.array([T0], pa.timestamp("us", "UTC")),
            "updated_by": ["s"],
        }
    )
    events = pa.table(
        {
            "time": pa.array([T0, T0 + timedelta(seconds=1)], pa.timestamp("us", "UTC")),
            "sink_id": ["s", "s"],
            "batch_id": pa.array([3, 3], pa.int64()),
            "namespace": ["ns", "ns"],
            "entity": ["orders", None],
            "event": ["state_change", "batch_committed"],
            "from_state": ["failing", None],
            "to_state": ["failed_over", None],
            "backlog_queue": pa.array([None, None], pa.string()),
            "error_class": ["timeout", None],
            "count": pa.array([1, 20], pa.int64()),
            "executor_host": ["h1", None],
            "detail": ["", ""],
        }
    )
    deltalake.write_deltalake(str(root / "entities"), entities)
    deltalake.write_deltalake(str(root / "events"), events)


class Admin:
    def get_queue_runtime_properties(self, name: str) -> Any:
        if name.endswith("/2"):
            raise ConnectionError("refused")
        return SimpleNamespace(total_message_count=7 if name.endswith("/0") else 0)


def test_status_reads_entities_events_and_depths(tmp_path: Path) -> None:
    _tables(tmp_path)
    config = make_config(state_location=str(tmp_path))
    status = read_status(config, last_events=5, admin_client=Admin())
    assert [(r["entity"], r["state"]) for r in status.entities] == [("orders", "failed_over")]
    assert [e["event"] for e in status.events] == ["batch_committed", "state_change"]  # newest first
    assert status.depths == {
        "primary/x-servicebus-transfer/0": 7,
        "primary/x-servicebus-transfer/1": 0,
        "primary/x-servicebus-transfer/2": "unavailable: ConnectionError",
    }
    text = format_status(status, now=T0)
    assert "orders" in text and "failed_over" in text and "pulled until 2026-11-22 13:00:00" in text
    assert "state_change failing->failed_over" in text


def test_status_before_any_write_and_without_state_location(tmp_path: Path) -> None:
    empty = read_status(make_config(state_location=str(tmp_path / "none")), depths=False)
    assert (empty.entities, empty.events) == ([], [])
    with pytest.raises(ValueError, match="state_location is not set"):
        read_status(make_config(), depths=False)


def test_status_command_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _tables(tmp_path / "state")
    conf = tmp_path / "c.yaml"
    conf.write_text(
        f"primary:\n  connection_string: ${{env:CS}}\nentity: orders\nstate_location: {tmp_path / 'state'}\n"
    )
    monkeypatch.setenv(
        "CS", "Endpoint=sb://a.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v"
    )
    assert main(["status", "--config", str(conf), "--json", "--no-depths"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["entities"][0]["state"] == "failed_over" and out["backlog_depths"] == {}
    assert main(["status", "--config", str(tmp_path / "missing.yaml")]) == 2
