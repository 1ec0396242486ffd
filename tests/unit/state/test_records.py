"""The records of the state tables (spark_sb.state.records): the event names, the column lists derived from the
DDL, what the records do on construction (UTC times, redaction, bounded detail), pickling, and the round trip of
each record through a table row (:func:`event_from_row`, :func:`entity_from_row`, :func:`reject_from_row`)."""

from __future__ import annotations

import dataclasses
import pickle
import re
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from spark_sb.state.records import (
    ENTITIES_DDL,
    EVENT_COLUMNS,
    EVENTS,
    REJECT_COLUMNS,
    SENT,
    STATE_CHANGE,
    SYPHON_EVENTS,
    EntityRecord,
    Event,
    PulledQueue,
    RejectRecord,
    _from_micros,
    _utc,
    entity_from_row,
    event_from_row,
    reject_from_row,
)
from tests.unit.sender.rig import SECRET, make_config
from tests.unit.state.store_contract import NS, T0

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
PLUS_2 = timezone(timedelta(hours=2))


def _micros(dt: datetime) -> int:
    return (dt - EPOCH) // timedelta(microseconds=1)


def _row(record: Any) -> dict[str, Any]:
    """A record as a store reads its row back: timestamps as microseconds, nested structs as dicts."""

    def cell(value: Any) -> Any:
        if isinstance(value, datetime):
            return _micros(value)
        if isinstance(value, tuple):
            return [{k: cell(v) for k, v in dataclasses.asdict(p).items()} for p in value]
        return value

    return {f.name: cell(getattr(record, f.name)) for f in dataclasses.fields(record)}


def test_records_redact_secrets_and_pickle() -> None:
    make_config()  # loading a config registers its secrets with spark_sb.core.redact
    e = Event(T0, "s", 1, STATE_CHANGE, detail=f"SharedAccessKey={SECRET} refused")
    r = RejectRecord(T0, "s", 1, "orders", "body", f"bad {SECRET}", f'{{"k": "{SECRET}"}}')
    assert SECRET not in e.detail and SECRET not in r.reason and SECRET not in r.row_json
    rec = EntityRecord(NS, "orders", "failed_over", T0, pulled_backlog_queues=(PulledQueue("q", T0),))
    assert pickle.loads(pickle.dumps(rec)) == rec


@pytest.mark.parametrize(
    ("given", "utc"),
    [
        pytest.param(
            datetime(2026, 11, 22, 12, 0), datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc), id="naive"
        ),
        pytest.param(
            datetime(2026, 11, 22, 14, 0, tzinfo=PLUS_2),
            datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc),
            id="another zone",
        ),
        pytest.param(T0, T0, id="utc"),
    ],
)
def test_every_time_of_a_record_is_held_in_utc(given: datetime, utc: datetime) -> None:
    assert _utc(given) == utc and _utc(given).tzinfo is timezone.utc
    assert Event(given, "s", 1, SENT).time.tzinfo is timezone.utc
    assert Event(given, "s", 1, SENT).time == utc
    assert PulledQueue("q", given).until.tzinfo is timezone.utc
    rec = EntityRecord(NS, "orders", "healthy", given, updated_at=given)
    assert (rec.since, rec.updated_at) == (utc, utc)
    assert rec.since.tzinfo is timezone.utc and rec.updated_at.tzinfo is timezone.utc
    assert RejectRecord(given, "s", 1, None, None, "r", "{}").time.tzinfo is timezone.utc


def test_an_event_detail_is_cut_at_a_thousand_characters() -> None:
    assert Event(T0, "s", 1, SENT, detail="x" * 1000).detail == "x" * 1000
    assert Event(T0, "s", 1, SENT, detail="y" * 5000).detail == "y" * 1000
    assert Event(T0, "s", 1, SENT).detail == ""


def test_pulled_queues_given_as_a_list_are_held_as_a_tuple_so_the_record_stays_hashable() -> None:
    rec = EntityRecord(NS, "orders", "failed_over", T0, pulled_backlog_queues=[PulledQueue("q", T0)])  # type: ignore[arg-type]
    assert rec.pulled_backlog_queues == (PulledQueue("q", T0),)
    assert hash(rec) == hash(
        EntityRecord(NS, "orders", "failed_over", T0, pulled_backlog_queues=(PulledQueue("q", T0),))
    )


def test_the_column_lists_are_the_ddl_columns_and_name_every_record_field() -> None:
    assert EVENT_COLUMNS == (
        "time",
        "sink_id",
        "batch_id",
        "namespace",
        "entity",
        "event",
        "from_state",
        "to_state",
        "backlog_queue",
        "error_class",
        "count",
        "executor_host",
        "detail",
    )
    assert sorted(EVENT_COLUMNS) == sorted(f.name for f in dataclasses.fields(Event))  # the table's own order
    assert tuple(f.name for f in dataclasses.fields(RejectRecord)) == REJECT_COLUMNS
    flat = re.sub(r"<.*>", "", ENTITIES_DDL)  # the pulled queues' struct is one column
    assert [part.split()[0] for part in flat.split(", ")] == [
        f.name for f in dataclasses.fields(EntityRecord)
    ]


def test_event_names_are_distinct_and_include_the_syphons() -> None:
    assert len(set(EVENTS)) == len(EVENTS)
    assert set(SYPHON_EVENTS) <= set(EVENTS)


def test_microseconds_become_utc_times_and_none_stays_none() -> None:
    assert _from_micros(None) is None
    assert _from_micros(0) == EPOCH
    assert _from_micros(_micros(T0) + 7) == T0 + timedelta(microseconds=7)


def test_an_event_round_trips_through_a_row_and_empty_cells_read_as_defaults() -> None:
    event = Event(
        T0,
        "s",
        9,
        STATE_CHANGE,
        NS,
        "orders",
        "healthy",
        "failing",
        "q1",
        "timeout",
        3,
        "h1",
        "send timed out",
    )
    assert event_from_row(_row(event), _from_micros) == event
    sparse = {**_row(Event(T0, "s", None, SENT)), "count": None, "detail": None}
    assert event_from_row(sparse, _from_micros) == Event(T0, "s", None, SENT, count=0, detail="")


def test_an_entity_record_round_trips_through_a_row_with_its_pulled_queues() -> None:
    rec = EntityRecord(
        NS,
        "orders",
        "failed_over",
        T0,
        "timeout",
        "backlog:5671",
        (
            PulledQueue("q0", T0 + timedelta(minutes=5), "timeout"),
            PulledQueue("q2", T0 + timedelta(minutes=1)),
        ),
        T0 + timedelta(seconds=2),
        "sink s",
    )
    assert entity_from_row(_row(rec), _from_micros) == rec
    bare = {**_row(EntityRecord(NS, "orders", "healthy", T0)), "pulled_backlog_queues": None}
    assert entity_from_row(bare, _from_micros).pulled_backlog_queues == ()


def test_a_reject_round_trips_through_a_row() -> None:
    rej = RejectRecord(T0, "s", 4, "orders", "session_id", "longer than 128 characters", '{"body": "x"}')
    assert reject_from_row(_row(rej), _from_micros) == rej
    whole = RejectRecord(T0, "s", None, None, None, "too large", "{}")  # the message as a whole, no batch
    assert reject_from_row(_row(whole), _from_micros) == whole
