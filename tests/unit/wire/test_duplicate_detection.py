"""A primary entity's duplicate detection read from its admin endpoint, and what it means against the exactly-once
horizon (SPEC B14): pure values, a fake admin client, a fake clock."""

from __future__ import annotations

from datetime import timedelta

from azure.core.exceptions import HttpResponseError

from servicebus_local.clock import FakeClock
from spark_sb.wire.duplicate_detection import (
    WINDOWS_FOR,
    DuplicateDetection,
    PrimaryWindows,
    read_duplicate_detection,
    span,
)
from tests.unit.fakes import PrimaryAdmin

HOUR = 3600.0


ADMIN = {
    "orders": ("queue", True, timedelta(days=1)),
    "short": ("queue", True, timedelta(minutes=10)),
    "plain": ("queue", False, timedelta(minutes=10)),
    "events": ("topic", True, timedelta(hours=2)),
}


def test_a_queue_or_a_topic_is_read_with_its_window_within_a_deadline_and_no_sdk_retries() -> None:
    admin = PrimaryAdmin(ADMIN)
    assert read_duplicate_detection(admin, "orders", timeout=5.0) == DuplicateDetection(
        "orders", "queue", True, 86400.0
    )
    assert read_duplicate_detection(admin, "events", timeout=5.0) == DuplicateDetection(
        "events", "topic", True, 7200.0
    )
    assert [(k, n) for k, n, _ in admin.calls] == [
        ("queue", "orders"),
        ("queue", "events"),
        ("topic", "events"),
    ]
    assert {str(sorted(kw.items())) for _, _, kw in admin.calls} == {
        str(sorted({"retry_total": 0, "connection_timeout": 5.0, "read_timeout": 5.0}.items()))
    }
    missing = read_duplicate_detection(admin, "nope", timeout=5.0)
    assert missing.error == "no queue or topic of that name" and missing.drops_within is None


def test_an_error_is_a_value_never_raised() -> None:
    denied = HttpResponseError(message="Unauthorized")
    denied.status_code = 401
    found = read_duplicate_detection(
        PrimaryAdmin(ADMIN, fail=denied), "orders", timeout=1.0, shown="p.example"
    )
    assert found.enabled is None and found.error is not None and "'Manage' right" in found.error


def test_the_warning_names_off_a_short_window_and_an_unknown_answer() -> None:
    on = DuplicateDetection("orders", "queue", True, 86400.0)
    short = DuplicateDetection("short", "queue", True, 600.0)
    off = DuplicateDetection("plain", "queue", False, 600.0)
    unknown = DuplicateDetection("x", error="HttpResponseError (HTTP 401): no")
    assert (on.drops_within, short.drops_within, off.drops_within, unknown.drops_within) == (
        86400.0,
        600.0,
        0.0,
        None,
    )
    assert on.warning(HOUR) is None and on.describe() == "on, window 1 d"
    assert short.warning(HOUR) == (
        "short: duplicate detection window 10 min is shorter than exactly_once_horizon 1 h - a message diverted "
        "after an ambiguous send that returns later than 10 min reaches it twice if that send had landed"
    )
    assert short.warning(600.0) is None  # as long as the horizon: enough
    assert "duplicate detection is off" in (off.warning(HOUR) or "") and off.describe() == "off"
    assert "could not be read (HttpResponseError (HTTP 401): no)" in (unknown.warning(HOUR) or "")
    assert off.to_json(HOUR) == {
        "entity": "plain",
        "kind": "queue",
        "duplicate_detection": False,
        "window_seconds": None,
        "error": None,
        "warning": off.warning(HOUR),
    }
    assert short.to_json(HOUR)["window_seconds"] == 600.0
    assert [span(s) for s in (45, 90, 600, 3600, 5400, 86400, 0.5)] == [
        "45 s",
        "90 s",
        "10 min",
        "1 h",
        "90 min",
        "1 d",
        "0.5 s",
    ]


def test_a_syphon_asks_once_per_entity_until_the_answer_is_old() -> None:
    clock = FakeClock()
    asked: list[str] = []

    def lookup(entity: str) -> DuplicateDetection:
        asked.append(entity)
        return DuplicateDetection(entity, "queue", True, 600.0)

    windows = PrimaryWindows(clock, lookup)
    assert windows.of("orders").drops_within == 600.0
    windows.of("orders")
    windows.of("short")
    clock.advance(WINDOWS_FOR - 1)
    windows.of("orders")
    assert asked == ["orders", "short"]
    clock.advance(1)
    windows.of("orders")
    assert asked == ["orders", "short", "orders"]


def test_a_syphon_builds_the_primary_admin_client_once_and_closes_it() -> None:
    admin = PrimaryAdmin(ADMIN)
    built: list[PrimaryAdmin] = []

    class Primary:
        def admin_client(self) -> PrimaryAdmin:
            built.append(admin)
            return admin

        def endpoint_host(self) -> str:
            return "primary.example"

    windows = PrimaryWindows(FakeClock(), primary=Primary(), timeout=2.0)
    assert windows.of("short").drops_within == 600.0
    assert windows.of("events").drops_within == 7200.0
    assert len(built) == 1 and admin.calls[0][2]["read_timeout"] == 2.0
    windows.close()
    assert admin.closed
    assert PrimaryWindows(FakeClock()).of("orders").error == "no primary namespace to ask"
