"""The model of a backlog-queue provisioning (:mod:`spark_sb.admin.report`): the expected properties and the drift
check, how values print, each queue's outcome (status, usable, detail) and the report of a run (the backlog rows,
summary, table, JSON, the error raised when no queue is usable). Pure values: no admin client."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from spark_sb.admin.report import (
    BACKLOG_QUEUE_SPEC,
    BacklogQueueSpec,
    PropertyDifference,
    ProvisioningReport,
    QueueOutcome,
    QueueStatus,
    format_duration,
    format_value,
)
from spark_sb.core.durations import MAX_DURATION
from spark_sb.core.errors import ProvisioningError
from tests.unit.admin.test_provisioning import spec_props

CREATED, PRESENT, DRIFTED = QueueStatus.CREATED, QueueStatus.PRESENT, QueueStatus.DRIFTED
EXTRA, FAILED, MISSING = QueueStatus.EXTRA, QueueStatus.FAILED, QueueStatus.MISSING


def q(index: int | None, status: QueueStatus, **kwargs: object) -> QueueOutcome:
    name = f"contoso/x-servicebus-transfer/{index if index is not None else 'x'}"
    return QueueOutcome(name, status, index, **kwargs)  # type: ignore[arg-type]


def report(*queues: QueueOutcome, count: int = 3, **kwargs: object) -> ProvisioningReport:
    return ProvisioningReport("secondary.example.net", "contoso", count, queues, **kwargs)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------------- spec, drift


def test_spec_matches_the_seed() -> None:
    kwargs = BACKLOG_QUEUE_SPEC.create_kwargs()
    assert kwargs == {
        "max_size_in_megabytes": 5120,
        "max_delivery_count": 2147483647,
        "default_message_time_to_live": MAX_DURATION,
        "auto_delete_on_idle": MAX_DURATION,
        "lock_duration": timedelta(minutes=1),
        "dead_lettering_on_message_expiration": True,
        "enable_batched_operations": True,
    }
    # TimeSpan.MaxValue, trimmed so that the SDK's ISO serialization never exceeds it
    assert timedelta(days=10675199, hours=2, minutes=48, seconds=5, microseconds=477580) == MAX_DURATION


def test_differences_tolerate_the_service_rounding_of_the_maximum() -> None:
    rounded_up = timedelta(
        days=10675199, seconds=10085, microseconds=477581
    )  # "...5.4775807S" read by Python
    props = spec_props("q", default_message_time_to_live=rounded_up, auto_delete_on_idle=rounded_up)
    assert BACKLOG_QUEUE_SPEC.differences(props) == ()


def test_differences_name_property_expected_and_actual() -> None:
    props = spec_props(
        "q",
        lock_duration=timedelta(seconds=30),
        default_message_time_to_live=timedelta(days=14),
        enable_batched_operations=False,
        max_delivery_count=None,
    )
    diffs = {d.name: d for d in BACKLOG_QUEUE_SPEC.differences(props)}
    assert set(diffs) == {
        "lock_duration",
        "default_message_time_to_live",
        "enable_batched_operations",
        "max_delivery_count",
    }
    assert diffs["lock_duration"].describe() == "lock_duration: expected PT1M, actual PT30S"
    assert (
        diffs["default_message_time_to_live"].describe()
        == "default_message_time_to_live: expected max, actual P14D"
    )
    assert (
        diffs["enable_batched_operations"].describe()
        == "enable_batched_operations: expected true, actual false"
    )
    assert (
        diffs["max_delivery_count"].describe()
        == "max_delivery_count: expected 2147483647, actual (not reported)"
    )


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(minutes=1), "PT1M"),
        (timedelta(seconds=90), "PT1M30S"),
        (timedelta(days=1, hours=2), "P1DT2H"),
        (timedelta(seconds=1.5), "PT1.5S"),
        (timedelta(0), "PT0S"),
        (MAX_DURATION, "max"),
    ],
)
def test_format_duration(value: timedelta, text: str) -> None:
    assert format_duration(value) == text


@pytest.mark.parametrize(
    ("prop", "actual"),
    [
        ("enable_batched_operations", 1),  # a number is not a flag, even one equal to True
        ("lock_duration", "PT1M"),  # a duration that is not a timedelta
        ("lock_duration", timedelta(minutes=1, microseconds=1)),  # below the maximum: exact
        (
            "default_message_time_to_live",
            MAX_DURATION - timedelta(seconds=2),
        ),  # not within a second of the max
    ],
)
def test_a_value_of_the_wrong_kind_or_off_by_a_little_is_a_difference(prop: str, actual: object) -> None:
    diffs = BACKLOG_QUEUE_SPEC.differences(spec_props("q", **{prop: actual}))
    assert [(d.name, d.actual) for d in diffs] == [(prop, actual)]


def test_a_flag_is_not_a_number_equal_to_it() -> None:
    spec = BacklogQueueSpec(max_size_in_megabytes=1)
    assert [d.name for d in spec.differences(spec_props("q", max_size_in_megabytes=True))] == [
        "max_size_in_megabytes"
    ]
    assert spec.differences(spec_props("q", **spec.create_kwargs())) == ()


def test_a_queue_with_the_specs_properties_has_no_difference() -> None:
    assert BACKLOG_QUEUE_SPEC.differences(spec_props("q")) == ()
    assert len(BACKLOG_QUEUE_SPEC.differences(object())) == len(BACKLOG_QUEUE_SPEC.create_kwargs())


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "(not reported)"),
        (True, "true"),
        (False, "false"),
        (0, "0"),
        (5120, "5120"),
        (timedelta(seconds=30), "PT30S"),
        (MAX_DURATION - timedelta(seconds=0.5), "max"),
        ("x", "x"),
    ],
)
def test_format_value(value: object, text: str) -> None:
    assert format_value(value) == text


def test_a_difference_as_json_shows_durations_as_text() -> None:
    diff = PropertyDifference("default_message_time_to_live", MAX_DURATION, timedelta(days=14))
    assert diff.to_dict() == {"property": "default_message_time_to_live", "expected": "max", "actual": "P14D"}
    assert PropertyDifference("max_delivery_count", 10, None).to_dict()["actual"] is None


# ---------------------------------------------------------------------------------------------------- outcomes


@pytest.mark.parametrize(
    ("status", "usable"),
    [(CREATED, True), (PRESENT, True), (DRIFTED, True), (EXTRA, False), (FAILED, False), (MISSING, False)],
)
def test_only_created_present_or_drifted_queues_are_usable(status: QueueStatus, usable: bool) -> None:
    assert q(0, status).usable is usable
    assert str(status) == status.value


@pytest.mark.parametrize(
    ("outcome", "detail"),
    [
        (q(0, PRESENT), ""),
        (q(0, CREATED, attempts=1), ""),
        (q(0, CREATED, attempts=3), "created on try 3"),
        (q(0, FAILED, attempts=1, error="HTTP 500"), "not created after 1 try: HTTP 500"),
        (q(0, FAILED, attempts=5, error="HTTP 500"), "not created after 5 tries: HTTP 500"),
        (q(0, FAILED, error="listing failed"), "not created: listing failed"),
        (q(None, EXTRA), "index outside [0, count): left alone, not used"),
        (q(0, MISSING), "would be created (dry run)"),
        (
            q(
                0,
                DRIFTED,
                differences=(
                    PropertyDifference("lock_duration", timedelta(minutes=1), timedelta(seconds=30)),
                    PropertyDifference("max_size_in_megabytes", 5120, 1024),
                ),
            ),
            "lock_duration: expected PT1M, actual PT30S; max_size_in_megabytes: expected 5120, actual 1024",
        ),
    ],
)
def test_an_outcomes_detail_says_what_happened(outcome: QueueOutcome, detail: str) -> None:
    assert outcome.detail == detail


# ------------------------------------------------------------------------------------------------------ report


def test_the_backlog_is_the_indexed_rows_and_the_usable_queues_keep_their_order() -> None:
    r = report(
        q(0, FAILED, error="x"), q(1, DRIFTED), q(2, CREATED), q(7, EXTRA), q(None, EXTRA), q(None, PRESENT)
    )
    assert [o.index for o in r.backlog] == [0, 1, 2]  # a row without an index is never a backlog queue
    assert r.usable_queues == ["contoso/x-servicebus-transfer/1", "contoso/x-servicebus-transfer/2"]
    assert r.extras == ["contoso/x-servicebus-transfer/7", "contoso/x-servicebus-transfer/x"]
    assert r.failed == ["contoso/x-servicebus-transfer/0"]
    assert r.ok


@pytest.mark.parametrize(
    ("queues", "kwargs", "summary"),
    [
        ((q(0, PRESENT), q(1, PRESENT), q(2, PRESENT)), {}, "all 3 present"),
        (
            (q(0, PRESENT), q(1, PRESENT), q(2, PRESENT), q(3, EXTRA)),
            {},
            "all 3 present; 1 extra left alone",
        ),
        ((q(0, CREATED), q(1, PRESENT), q(2, FAILED)), {}, "2/3 usable (1 created, 1 present, 1 failed)"),
        (
            (q(0, PRESENT), q(1, PRESENT), q(2, PRESENT), q(None, FAILED)),
            {},
            "3/3 usable (3 present, 1 failed)",
        ),
        ((q(0, DRIFTED), q(1, FAILED), q(2, FAILED)), {}, "1/3 usable (1 drifted, 2 failed)"),
        (
            (q(0, PRESENT), q(1, MISSING), q(2, MISSING)),
            {"dry_run": True},
            "dry run: 1/3 present (1 present, 2 to create)",
        ),
        ((), {}, "0/3 usable"),
    ],
)
def test_the_summary_counts_each_status(
    queues: tuple[QueueOutcome, ...], kwargs: dict[str, object], summary: str
) -> None:
    assert report(*queues, **kwargs).summary() == summary


def test_a_dry_run_is_ok_when_the_queues_would_be_created_a_real_run_is_not() -> None:
    plan = (q(0, MISSING), q(1, MISSING), q(2, MISSING))
    assert report(*plan, dry_run=True).ok
    assert not report(*plan).ok
    assert not report(q(0, FAILED), q(1, EXTRA), dry_run=True).ok


def test_the_table_aligns_its_columns_and_ends_with_the_summary() -> None:
    r = report(q(0, CREATED, attempts=2), q(1, FAILED, attempts=1, error="boom"), count=2, dry_run=False)
    lines = r.format_table().splitlines()
    assert lines[0] == ("Backlog queues in secondary.example.net for primary namespace 'contoso' (count 2)")
    assert lines[1:] == [
        "QUEUE" + " " * 26 + "  STATUS   DETAIL",  # the names are 31 wide, "created" 7
        "contoso/x-servicebus-transfer/0  created  created on try 2",
        "contoso/x-servicebus-transfer/1  failed   not created after 1 try: boom",
        "1/2 usable (1 created, 1 failed)",
    ]


def test_the_table_of_a_dry_run_says_nothing_changed_and_has_no_trailing_blanks() -> None:
    table = report(q(0, PRESENT), count=1, dry_run=True).format_table()
    assert table.splitlines()[0].endswith("(count 1) - DRY RUN, nothing changed")
    assert all(line == line.rstrip() for line in table.splitlines())


def test_the_report_as_json() -> None:
    diff = PropertyDifference("lock_duration", timedelta(minutes=1), timedelta(seconds=30))
    r = report(
        q(0, DRIFTED, differences=(diff,)),
        q(1, FAILED, attempts=2, error="HTTP 503"),
        count=2,
        last_error="HTTP 503",
    )
    data = json.loads(json.dumps(r.to_dict()))
    assert data == {
        "namespace": "secondary.example.net",
        "primary_namespace_name": "contoso",
        "count": 2,
        "dry_run": False,
        "ok": True,
        "summary": "1/2 usable (1 drifted, 1 failed)",
        "usable_queues": ["contoso/x-servicebus-transfer/0"],
        "queues": [
            {
                "queue": "contoso/x-servicebus-transfer/0",
                "index": 0,
                "status": "drifted",
                "usable": True,
                "detail": "lock_duration: expected PT1M, actual PT30S",
                "differences": [{"property": "lock_duration", "expected": "PT1M", "actual": "PT30S"}],
                "attempts": 0,
                "error": None,
            },
            {
                "queue": "contoso/x-servicebus-transfer/1",
                "index": 1,
                "status": "failed",
                "usable": False,
                "detail": "not created after 2 tries: HTTP 503",
                "differences": [],
                "attempts": 2,
                "error": "HTTP 503",
            },
        ],
        "last_error": "HTTP 503",
        "unauthorized": False,
    }


def test_a_report_without_a_usable_queue_raises_naming_the_queues_and_the_last_error() -> None:
    r = report(q(0, FAILED), q(1, FAILED), q(5, EXTRA), count=2, last_error="HTTP 403", unauthorized=True)
    with pytest.raises(ProvisioningError) as caught:
        r.raise_if_unusable()
    err = caught.value
    assert err.tried == ["contoso/x-servicebus-transfer/0", "contoso/x-servicebus-transfer/1"]
    assert err.last_error == "HTTP 403" and err.unauthorized and err.report is r
    assert err.namespace == "secondary.example.net"
    with pytest.raises(ProvisioningError, match="no backlog queue is usable"):
        report(q(0, FAILED), count=1).raise_if_unusable()


def test_a_report_with_a_usable_queue_does_not_raise() -> None:
    report(q(0, FAILED), q(1, DRIFTED), count=2).raise_if_unusable()
