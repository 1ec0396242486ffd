"""A wrong destination's verdict on the syphon side (issue 29 item 5): the ``syphon.max_attempts`` key, the pure
decision (dead-letter vs abandon from error class + delivery count + max attempts), the events the syphon job
writes for it, and what ``spark-sb status`` shows."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from spark_sb.config.namespace import NamespaceConfig
from spark_sb.config.secret import Secret
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.errors import ConfigError
from spark_sb.spark.syphon_drain import outcome_rows
from spark_sb.spark.syphon_ledger import SyphonBatchWriter, error_class_of
from spark_sb.state.store import MemoryStateStore
from spark_sb.syphon.rules import (
    ABANDON,
    DEAD_LETTER,
    DESTINATION_NOT_FOUND,
    SyphonOutcome,
    attempt_of,
    due_for_verdict,
    is_parked,
    keeps_count,
    not_found_description,
    undelivered_verdict,
)

CS = "Endpoint=sb://p.example:5672;SharedAccessKeyName=k;SharedAccessKey=s1"
CS2 = "Endpoint=sb://s.example:5672;SharedAccessKeyName=k;SharedAccessKey=s2"
BASE = {"primary": {"connection_string": CS}}
T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


# ------------------------------------------------------------------------------------------- the key
def test_max_attempts_defaults_to_10() -> None:
    assert ServiceBusConfig.from_dict(BASE).syphon_max_attempts == 10
    assert ServiceBusConfig(primary=NamespaceConfig(connection_string=Secret(CS))).syphon_max_attempts == 10


@pytest.mark.parametrize(
    "settings",
    [
        {"syphon": {"max_attempts": 3}},  # nested (YAML, dict)
        {"syphon.max_attempts": "3"},  # dotted (Spark options are strings)
    ],
)
def test_max_attempts_is_read_nested_dotted_and_from_options(settings: dict[str, Any]) -> None:
    assert ServiceBusConfig.from_dict({**BASE, **settings}).syphon_max_attempts == 3
    config = ServiceBusConfig.from_options({"primary.connection_string": CS, "syphon.max_attempts": "3"})
    assert config.syphon_max_attempts == 3
    assert ServiceBusConfig.from_options(config.to_options(include_secrets=True)).syphon_max_attempts == 3


@pytest.mark.parametrize(
    ("value", "fragment"),
    [(0, "integer >= 1"), (-2, "integer >= 1"), ("many", "integer"), (True, "integer"), (1.5, "integer")],
)
def test_max_attempts_below_1_or_not_an_integer_is_refused_naming_the_key(value: Any, fragment: str) -> None:
    with pytest.raises(ConfigError) as e:
        ServiceBusConfig.from_dict({**BASE, "syphon": {"max_attempts": value}})
    assert str(e.value).startswith("syphon.max_attempts: ") and fragment in str(e.value)
    assert e.value.errors[0][0] == "syphon.max_attempts"


def test_direct_construction_of_max_attempts_is_validated_too() -> None:
    base = ServiceBusConfig(primary=NamespaceConfig(connection_string=Secret(CS)))
    with pytest.raises(ConfigError, match="^syphon.max_attempts: must be an integer >= 1, found 0"):
        replace(base, syphon_max_attempts=0)
    assert replace(base, syphon_max_attempts=1).syphon_max_attempts == 1


# ------------------------------------------------------------------------------------------- the verdict
@pytest.mark.parametrize(
    ("error_class", "delivery_count", "max_attempts", "verdict"),
    [
        # the destination does not exist: abandoned (tried again) until the max_attempts-th delivery
        ("entity_not_found", 0, 10, ABANDON),  # first delivery
        ("entity_not_found", 8, 10, ABANDON),  # ninth
        ("entity_not_found", 9, 10, DEAD_LETTER),  # tenth
        ("entity_not_found", 500, 10, DEAD_LETTER),  # long past it (abandoned while backing off)
        ("entity_not_found", None, 1, DEAD_LETTER),  # no count: the first delivery; max_attempts 1
        ("entity_not_found", None, 2, ABANDON),
        ("entity_not_found", 1, 2, DEAD_LETTER),
        ("entity_not_found", 2**31 - 2, 10, DEAD_LETTER),  # a backlog queue's max delivery count is 2**31 - 1
        # anything else is an outage, a refusal or a bug: abandoned, however many deliveries
        ("connection", 10_000, 1, ABANDON),
        ("timeout", 10_000, 1, ABANDON),
        ("entity_disabled", 10_000, 1, ABANDON),
        ("quota_exceeded", 10_000, 1, ABANDON),
        ("server_busy", 10_000, 1, ABANDON),
        ("service_error", 10_000, 1, ABANDON),
        ("connection_quota", 10_000, 1, ABANDON),
        ("client_closed", 10_000, 1, ABANDON),
        ("unauthorized", 10_000, 1, ABANDON),
        ("invalid_request", 10_000, 1, ABANDON),
        ("unexpected", 10_000, 1, ABANDON),
        (None, 10_000, 1, ABANDON),  # no answer at all
    ],
)
def test_undelivered_verdict(
    error_class: str | None, delivery_count: int | None, max_attempts: int, verdict: str
) -> None:
    assert undelivered_verdict(error_class, delivery_count, max_attempts) == verdict
    assert due_for_verdict(delivery_count, max_attempts) == (
        undelivered_verdict("entity_not_found", delivery_count, max_attempts) == DEAD_LETTER
    )


def test_the_verdict_reads_the_class_names_of_the_classifier() -> None:
    from azure.servicebus.exceptions import MessagingEntityNotFoundError

    from spark_sb.core import errors
    from spark_sb.core.errors import classify
    from spark_sb.syphon.rules import ENTITY_NOT_FOUND

    assert errors.ENTITY_NOT_FOUND.name == ENTITY_NOT_FOUND
    not_found = MessagingEntityNotFoundError(message="no such queue")
    assert undelivered_verdict(classify(not_found).name, 9, 10) == DEAD_LETTER
    assert undelivered_verdict(classify(ConnectionRefusedError()).name, 9, 10) == ABANDON


def test_attempt_of_counts_deliveries_from_one() -> None:
    assert [attempt_of(c) for c in (None, 0, 1, 9, -1)] == [1, 1, 2, 10, 1]


def test_destination_not_found_is_parked_in_a_dead_letter_queue_and_described_without_secrets() -> None:
    assert is_parked(DESTINATION_NOT_FOUND)
    text = not_found_description("orderz", "p.example:5672", 10)
    assert text.startswith(f"{DESTINATION_NOT_FOUND}: ") and "'orderz'" in text and "p.example:5672" in text
    assert "delivery 10" in text and "syphon.max_attempts" in text


def test_outcome_merges_undeliverable_per_entity() -> None:
    a = SyphonOutcome(undeliverable=2, undeliverable_by_entity={"orderz": 2})
    b = SyphonOutcome(undeliverable=3, undeliverable_by_entity={"orderz": 1, "payments-typo": 2})
    merged = a.merge(b)
    assert (merged.undeliverable, merged.undeliverable_by_entity) == (5, {"orderz": 3, "payments-typo": 2})


# ------------------------------------------------------------------------------------------- the events
CONFIG = ServiceBusConfig.from_dict(
    {"primary": {"connection_string": CS}, "secondary": {"connection_string": CS2}, "backlog_queue_count": 2}
)


def test_rows_and_events_of_undeliverable_messages() -> None:
    outcome = SyphonOutcome(
        invalid=1,
        undeliverable=3,
        undeliverable_by_entity={"orderz": 2, "payments-typo": 1},
        abandoned_by_entity={"orders": 1},
    )
    rows = list(outcome_rows("q0", False, outcome))
    assert [(r[2], r[3], r[4], r[6]) for r in rows] == [
        ("orders", "abandoned", 1, None),
        (None, "dead_lettered", 1, "NotABacklogMessage"),
        ("orderz", "dead_lettered", 2, DESTINATION_NOT_FOUND),
        ("payments-typo", "dead_lettered", 1, DESTINATION_NOT_FOUND),
    ]
    store = MemoryStateStore()
    writer = SyphonBatchWriter(CONFIG, store=store)
    aggregated = [(r[0], r[2], r[3], r[4], r[6]) for r in rows]
    writer.record(4, aggregated, store, now=T0)
    events = [(e.event, e.entity, e.error_class, e.count, e.detail) for e in store.read_events()]
    assert ("dead_lettered", "orderz", "entity_not_found", 2, DESTINATION_NOT_FOUND) in events
    assert ("dead_lettered", None, None, 1, "NotABacklogMessage") in events  # not a wrong destination
    assert writer.total.by_kind["dead_lettered"] == 4
    assert error_class_of("abandoned", DESTINATION_NOT_FOUND) is None


# ------------------------------------------------------------------------------------------- status
def _events(root: Path) -> None:
    deltalake = pytest.importorskip("deltalake")
    import pyarrow as pa

    rows = [
        # (seconds after T0, entity, event, error_class, queue, count, detail)
        (
            0,
            "orderz",
            "dead_lettered",
            "entity_not_found",
            "p/x-servicebus-transfer/0",
            2,
            DESTINATION_NOT_FOUND,
        ),
        (
            5,
            "orderz",
            "dead_lettered",
            "entity_not_found",
            "p/x-servicebus-transfer/1",
            1,
            DESTINATION_NOT_FOUND,
        ),
        (
            9,
            "typo",
            "dead_lettered",
            "entity_not_found",
            "p/x-servicebus-transfer/0",
            4,
            DESTINATION_NOT_FOUND,
        ),
        (7, None, "dead_lettered", None, "p/x-servicebus-transfer/0", 1, "NotABacklogMessage"),
        (8, "orders", "moved", None, "p/x-servicebus-transfer/0", 10, ""),
        (10, None, "batch_committed", None, None, 10, ""),
    ]
    n = len(rows)
    table = pa.table(
        {
            "time": pa.array([T0 + timedelta(seconds=r[0]) for r in rows], pa.timestamp("us", "UTC")),
            "sink_id": ["syphon/p"] * n,
            "batch_id": pa.array([3] * n, pa.int64()),
            "namespace": ["p.example:5672"] * n,
            "entity": pa.array([r[1] for r in rows], pa.string()),
            "event": [r[2] for r in rows],
            "from_state": pa.array([None] * n, pa.string()),
            "to_state": pa.array([None] * n, pa.string()),
            "backlog_queue": pa.array([r[4] for r in rows], pa.string()),
            "error_class": pa.array([r[3] for r in rows], pa.string()),
            "count": pa.array([r[5] for r in rows], pa.int64()),
            "executor_host": ["h"] * n,
            "detail": [r[6] for r in rows],
        }
    )
    deltalake.write_deltalake(str(root / "events"), table)


def test_status_shows_the_undeliverable_messages_per_entity(tmp_path: Path) -> None:
    from spark_sb.admin.status import format_status, read_status, undeliverable

    _events(tmp_path)
    config = replace(CONFIG, state_location=str(tmp_path))
    status = read_status(config, last_events=3, depths=False)
    assert [(u["entity"], u["count"], u["queues"]) for u in status.undeliverable] == [
        ("typo", 4, ["p/x-servicebus-transfer/0"]),  # the most recent first
        ("orderz", 3, ["p/x-servicebus-transfer/0", "p/x-servicebus-transfer/1"]),
    ]
    assert status.undeliverable[0]["last"] == T0 + timedelta(seconds=9)
    assert undeliverable(str(tmp_path)) == status.undeliverable
    assert [e["event"] for e in status.events] == ["batch_committed", "dead_lettered", "moved"]
    text = format_status(status, now=T0)
    assert "undeliverable (the entity does not exist" in text
    line = next(line for line in text.splitlines() if line.strip().startswith("orderz"))
    assert "count 3" in line and "last 2026-11-22 12:00:05" in line and "p/x-servicebus-transfer/1" in line
    as_json = json.loads(json.dumps(status.to_json(), default=str))
    assert [u["entity"] for u in as_json["undeliverable"]] == ["typo", "orderz"]


def test_status_without_undeliverable_messages_shows_no_such_section(tmp_path: Path) -> None:
    from spark_sb.admin.status import format_status, read_status

    pytest.importorskip("deltalake")
    status = read_status(replace(CONFIG, state_location=str(tmp_path / "none")), depths=False)
    assert status.undeliverable == []
    assert "undeliverable" not in format_status(status)


@pytest.mark.parametrize(
    ("error_class", "delivery_count", "kept"),
    [
        ("connection", 0, False),  # the first failed attempt abandons (the count rises once)
        ("connection", None, False),
        ("connection", 1, True),  # then deferred: the count stays, however long the outage
        ("timeout", 9, True),
        (None, 5, True),  # no answer at all (a stall)
        ("entity_not_found", 1, False),  # F9: each delivery counts towards DestinationNotFound
        ("entity_not_found", 9, False),
    ],
)
def test_an_ordered_lines_message_is_abandoned_after_one_failed_attempt_then_deferred(
    error_class: str | None, delivery_count: int | None, kept: bool
) -> None:
    assert keeps_count(error_class, delivery_count) is kept
