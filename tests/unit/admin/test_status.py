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
    status = read_status(config, last_events=5, admin_client=Admin(), duplicate_detection=False)
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
    empty = read_status(
        make_config(state_location=str(tmp_path / "none")), depths=False, duplicate_detection=False
    )
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
    assert main(["status", "--config", str(conf), "--json", "--no-depths", "--no-duplicate-detection"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["entities"][0]["state"] == "failed_over" and out["backlog_depths"] == {}
    assert out["duplicate_detection"] is None
    assert main(["status", "--config", str(tmp_path / "missing.yaml")]) == 2


def test_status_shows_the_sessions_still_draining_with_their_queues_depth(tmp_path: Path) -> None:
    """SPEC O4: a sink with ordering keeps its held sessions in the sessions table (one row per pending marker);
    status lists each held session - entity, session, pinned queue and its depth, since when, markers pending -,
    oldest first, and the JSON carries them all."""
    import pyarrow as pa

    from spark_sb.state.records import SESSIONS_DDL
    from spark_sb.state.sessions import HeldLine, PendingMarker, session_rows

    _tables(tmp_path)
    q0, q1 = "primary/x-servicebus-transfer/0", "primary/x-servicebus-transfer/1"
    lines = [
        # s2 was marked again: m0 replaced (kept for the catch-up, R5), not pending
        HeldLine("orders", "s2", q1, T0 + timedelta(minutes=1), (PendingMarker(q1, "m3", T0),), ("m0",)),
        HeldLine("orders", "s1", q0, T0, (PendingMarker(q0, "m1", T0), PendingMarker(q1, "m2", T0))),
    ]
    columns = [part.split()[0] for part in SESSIONS_DDL.split(", ")]
    rows = session_rows("sink-a", lines)
    timestamp = pa.timestamp("us", "UTC")
    types = {"since": timestamp, "issued": timestamp}
    table = pa.table(
        {c: pa.array([r[i] for r in rows], types.get(c, pa.string())) for i, c in enumerate(columns)}
    )
    deltalake.write_deltalake(str(tmp_path / "sessions"), table)
    status = read_status(
        make_config(state_location=str(tmp_path)), admin_client=Admin(), duplicate_detection=False
    )
    assert [(d["session"], d["queue"], d["pending"]) for d in status.sessions] == [
        ("s1", q0, 2),
        ("s2", q1, 1),
    ]
    text = format_status(status, now=T0)
    assert "sessions draining (2;" in text
    assert (
        f"s1                       since 2026-11-22 12:00:00  queue {q0} (depth 7)  markers pending 2" in text
    )
    assert status.to_json()["sessions_draining"][1]["sink_id"] == "sink-a"
    none = make_config(state_location=str(tmp_path / "none"))
    assert read_status(none, depths=False, duplicate_detection=False).sessions == []


def test_status_shows_each_primary_entitys_duplicate_detection_against_the_horizon(tmp_path: Path) -> None:
    """SPEC B14: the config's entity, the ones named and the primary's in the entities table (none here: the
    table's namespace is another's), each with its duplicate detection; a warning where it is off or shorter than
    exactly_once_horizon; text and JSON."""
    from tests.unit.fakes import PrimaryAdmin

    _tables(tmp_path)
    admin = PrimaryAdmin(
        {"orders": ("queue", False, timedelta(minutes=10)), "events": ("topic", True, timedelta(minutes=5))}
    )
    config = make_config(state_location=str(tmp_path))
    status = read_status(config, depths=False, entities=["events"], primary_admin_client=admin)
    assert status.horizon is not None
    assert [(e.entity, e.kind, e.enabled) for e in status.horizon.entities] == [
        ("orders", "queue", False),
        ("events", "topic", True),
    ]
    text = format_status(status, now=T0)
    assert "duplicate detection of the primary entities (exactly_once_horizon 1 h):" in text
    assert "WARNING: orders: duplicate detection is off" in text
    assert (
        "WARNING: events: duplicate detection window 5 min is shorter than exactly_once_horizon 1 h" in text
    )
    data = json.loads(json.dumps(status.to_json(), default=str))
    assert data["duplicate_detection"]["exactly_once_horizon_seconds"] == 3600.0
    assert [(e["entity"], e["window_seconds"]) for e in data["duplicate_detection"]["entities"]] == [
        ("orders", None),
        ("events", 300.0),
    ]


def test_status_command_reports_duplicate_detection_and_warns_on_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from spark_sb.config.namespace import NamespaceConfig
    from tests.unit.fakes import PrimaryAdmin

    _tables(tmp_path / "state")
    conf = tmp_path / "c.yaml"
    conf.write_text(
        "primary:\n  connection_string: ${env:CS}\nentity: orders\nexactly_once_horizon: 12h\n"
        f"state_location: {tmp_path / 'state'}\n"
    )
    monkeypatch.setenv(
        "CS", "Endpoint=sb://a.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v"
    )
    admin = PrimaryAdmin(
        {"orders": ("queue", True, timedelta(days=1)), "audit": ("queue", True, timedelta(hours=1))}
    )
    monkeypatch.setattr(NamespaceConfig, "admin_client", lambda self, **_: admin)
    assert main(["status", "--config", str(conf), "--no-depths", "--entity", "audit"]) == 0
    captured = capsys.readouterr()
    assert "duplicate detection of the primary entities (exactly_once_horizon 12 h):" in captured.out
    assert (
        "WARNING: audit: duplicate detection window 1 h is shorter than exactly_once_horizon 12 h"
        in captured.out
    )
    assert "orders: duplicate" not in captured.out  # a day covers 12 h
    assert "exactly-once horizon: audit: duplicate detection window 1 h" in captured.err
    assert main(["status", "--config", str(conf), "--no-depths", "--json"]) == 0
    entities = json.loads(capsys.readouterr().out)["duplicate_detection"]["entities"]
    assert [(e["entity"], e["duplicate_detection"], e["warning"]) for e in entities] == [
        ("orders", True, None)
    ]


def test_status_sums_the_syphons_possible_duplicates_per_entity(tmp_path: Path) -> None:
    """SPEC B14: ``possible_duplicate`` events (the syphon moved messages after their entity's duplicate detection
    window since their ambiguous send) summed per entity, in the text and the JSON."""
    import pyarrow as pa

    n = 3
    events = pa.table(
        {
            "time": pa.array([T0 + timedelta(minutes=i) for i in range(n)], pa.timestamp("us", "UTC")),
            "sink_id": ["syphon/p"] * n,
            "batch_id": pa.array([1, 2, 2], pa.int64()),
            "namespace": ["ns"] * n,
            "entity": ["orders", "orders", "orders"],
            "event": ["possible_duplicate", "possible_duplicate", "moved"],
            "from_state": pa.array([None] * n, pa.string()),
            "to_state": pa.array([None] * n, pa.string()),
            "backlog_queue": ["q0", "q1", "q1"],
            "error_class": pa.array([None] * n, pa.string()),
            "count": pa.array([2, 1, 5], pa.int64()),
            "executor_host": ["h"] * n,
            "detail": ["message ids: a, b", "message ids: c", ""],
        }
    )
    deltalake.write_deltalake(str(tmp_path / "events"), events)
    status = read_status(make_config(state_location=str(tmp_path)), depths=False, duplicate_detection=False)
    assert [(d["entity"], d["count"], d["queues"]) for d in status.possible_duplicates] == [
        ("orders", 3, ["q0", "q1"])
    ]
    assert "possible duplicates (moved by the syphon after" in format_status(status)
    assert "orders                         count 3  last 2026-11-22 12:01:00" in format_status(status)
    assert status.to_json()["possible_duplicates"][0]["count"] == 3
