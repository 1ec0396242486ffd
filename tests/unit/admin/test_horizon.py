"""The exactly-once horizon as ``provision`` and ``status`` show it (SPEC B14): which primary entities, their
duplicate detection read from a fake admin endpoint, the text, the JSON and the warnings."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest

from spark_sb.admin.horizon import check_horizon, primary_entities
from spark_sb.config.namespace import NamespaceConfig
from tests.unit.fakes import PrimaryAdmin
from tests.unit.sender.rig import make_config

ADMIN = {
    "orders": ("queue", True, timedelta(days=1)),
    "short": ("queue", True, timedelta(minutes=10)),
    "plain": ("queue", False, timedelta(minutes=10)),
}


def test_the_entities_are_the_configs_the_named_and_the_primarys_in_the_state_table_each_once() -> None:
    config = make_config()  # entity orders, primary primary.servicebus.windows.net
    rows = [
        {"namespace": "primary.servicebus.windows.net", "entity": "short"},
        {"namespace": "primary.servicebus.windows.net", "entity": "orders"},
        {"namespace": "other.servicebus.windows.net", "entity": "elsewhere"},  # another primary's
    ]
    assert primary_entities(config, ["plain", "orders"], rows) == ["orders", "plain", "short"]
    assert primary_entities(make_config(entity=None)) == []


def test_each_entity_is_shown_with_its_window_and_a_warning_where_it_falls_short(
    caplog: pytest.LogCaptureFixture,
) -> None:
    admin = PrimaryAdmin(ADMIN)
    horizon = check_horizon(make_config(), ["orders", "short", "plain", "gone"], admin_client=admin)
    assert not admin.closed  # a client given is the caller's
    assert [e.describe() for e in horizon.entities] == [
        "on, window 1 d",
        "on, window 10 min",
        "off",
        "unknown (no queue or topic of that name)",
    ]
    lines = horizon.lines()
    assert lines[0] == "duplicate detection of the primary entities (exactly_once_horizon 1 h):"
    assert lines[1].split() == ["orders", "queue", "on,", "window", "1", "d"]
    assert lines[2].split()[:2] == ["short", "queue"]
    assert lines[3].startswith("    WARNING: short: duplicate detection window 10 min is shorter than")
    assert lines[5].startswith("    WARNING: plain: duplicate detection is off")
    assert lines[7].startswith("    WARNING: gone: duplicate detection could not be read")
    assert len(horizon.warnings) == 3
    data = horizon.to_json()
    assert data["exactly_once_horizon_seconds"] == 3600.0
    assert [(e["entity"], e["duplicate_detection"], e["window_seconds"]) for e in data["entities"]] == [
        ("orders", True, 86400.0),
        ("short", True, 600.0),
        ("plain", False, None),
        ("gone", None, None),
    ]
    assert data["entities"][0]["warning"] is None and "shorter" in data["entities"][1]["warning"]
    caplog.set_level(logging.WARNING, logger="spark_sb")
    horizon.log()
    assert [r.getMessage().split(":")[1].strip() for r in caplog.records] == ["short", "plain", "gone"]


def test_a_longer_horizon_warns_of_a_window_that_was_enough() -> None:
    config = make_config(exactly_once_horizon=2 * 86400.0)
    horizon = check_horizon(config, ["orders"], admin_client=PrimaryAdmin(ADMIN))
    assert horizon.warnings == [
        "orders: duplicate detection window 1 d is shorter than exactly_once_horizon 2 d - a message diverted "
        "after an ambiguous send that returns later than 1 d reaches it twice if that send had landed"
    ]


def test_without_entities_nothing_is_asked_and_the_text_says_how_to_name_one() -> None:
    horizon = check_horizon(
        make_config(entity=None), [], admin_client=PrimaryAdmin(ADMIN, fail=RuntimeError())
    )
    assert horizon.entities == () and horizon.warnings == []
    assert "(no primary entity named: set entity, or give --entity)" in horizon.lines()[1]


def test_the_client_it_builds_is_closed_and_one_that_cannot_be_built_is_an_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[PrimaryAdmin] = []

    def admin_client(self: NamespaceConfig, **_: Any) -> PrimaryAdmin:
        built.append(PrimaryAdmin(ADMIN))
        return built[-1]

    monkeypatch.setattr(NamespaceConfig, "admin_client", admin_client)
    horizon = check_horizon(make_config(), ["short"])
    assert horizon.entities[0].drops_within == 600.0 and built[0].closed

    def refused(self: NamespaceConfig, **_: Any) -> Any:
        raise ConnectionError("refused")

    monkeypatch.setattr(NamespaceConfig, "admin_client", refused)
    horizon = check_horizon(make_config(), ["orders", "short"])
    assert [e.error for e in horizon.entities] == ["ConnectionError: refused"] * 2
