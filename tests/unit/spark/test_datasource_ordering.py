"""``ordering: session`` with the ``servicebus`` data source (issue 31), without Spark: the options it takes and
refuses, the plan (the held lines handed to the tasks, read with deltalake from a temporary ``state_location``; the
stale ones remarked by the first task) and the commit (releasing on the acknowledgements read at commit time, then
merging the tasks' marks, writing the ``sessions`` table; a replay leaves it alone). The argument is
spark_sb/state/sessions.py."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from servicebus_local.clock import FakeClock
from spark_sb.core.errors import ConfigError
from spark_sb.failover.outcome import SendOutcome, namespace_key
from spark_sb.spark import datasource
from spark_sb.spark.datasource import TaskReport, WritePlan, commit_write, read_plan
from spark_sb.spark.datasource_options import parse_options
from spark_sb.state.records import (
    ACKNOWLEDGED,
    REPLAY_SKIPPED,
    SESSION_HELD,
    SESSION_RETURNED,
    Event,
    PartitionResult,
)
from spark_sb.state.sessions import (
    CATCH_UP_POLL,
    CATCH_UP_WAIT,
    REMARK_AFTER,
    HeldLine,
    LineMark,
    PendingMarker,
    SessionLedger,
)

pytest.importorskip("deltalake")

from spark_sb.state.deltars import DeltaRsStateStore  # noqa: E402 - after the skip

PRIMARY = "Endpoint=sb://primary.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=p-secret"
SECONDARY = "Endpoint=sb://secondary.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=s-secret"
SINK = "s"
Q0, Q1 = "primary/x-servicebus-transfer/0", "primary/x-servicebus-transfer/1"
T0 = datetime(2026, 11, 27, 12, 0, tzinfo=timezone.utc)


def _opts(**extra: str) -> dict[str, str]:
    return {
        "primary.connection_string": PRIMARY,
        "secondary.connection_string": SECONDARY,
        "entity": "orders",
        "sink_id": SINK,
        **extra,
    }


def _setup(tmp_path: Path) -> tuple[Any, DeltaRsStateStore]:
    state = tmp_path / "state"
    config = parse_options(_opts(ordering="session", state_location=str(state))).config
    return config, DeltaRsStateStore(str(state))


def _line(session: str, queue: str, marker: str, issued: datetime = T0) -> HeldLine:
    return HeldLine("orders", session, queue, T0, (PendingMarker(queue, marker, issued),))


def _ack(store: DeltaRsStateStore, config: Any, *markers: str) -> None:
    """The syphon job's ``acknowledged`` events (as its foreachBatch function writes them), dated now."""
    now = datetime.now(timezone.utc)
    store.append_events(
        [
            Event(
                now,
                "syphon",
                1,
                ACKNOWLEDGED,
                namespace=namespace_key(config.primary),
                entity="orders",
                detail=m,
            )
            for m in markers
        ]
    )


def _report(batch_id: int, *marks: LineMark) -> TaskReport:
    return TaskReport(batch_id, 1, PartitionResult("h1", 1, SendOutcome(sent={"orders": 1}), marks=marks))


def _held(store: DeltaRsStateStore) -> dict[str, tuple[str, tuple[str, ...]]]:
    return {
        line.session: (line.queue, tuple(p.marker for p in line.pending))
        for line in store.read_sessions(SINK)
    }


# ------------------------------------------------------------------------------------------------ options
def test_ordering_is_taken_with_state_location_and_refused_without_tables_or_with_catalog_tables(
    tmp_path: Path,
) -> None:
    for ordering in ("session", "entity"):
        config = parse_options(_opts(ordering=ordering, state_location=str(tmp_path))).config
        assert config.ordering == ordering
    with pytest.raises(ConfigError, match="option 'ordering': 'session' needs the state tables") as err:
        parse_options(_opts(ordering="session"))
    assert [k for k, _ in err.value.errors] == ["ordering"]
    with pytest.raises(ConfigError) as err:
        parse_options(_opts(ordering="session", state_table_prefix="main.sb.", state_spool=str(tmp_path)))
    text = str(err.value)
    assert "\n" not in text and "'ordering'" in text and "'state_table_prefix'" in text
    assert "use state_location" in text and "foreachBatch sink" in text
    assert [k for k, _ in err.value.errors] == ["ordering", "state_table_prefix"]


def test_a_batch_write_refuses_ordering_a_stream_takes_it(tmp_path: Path) -> None:
    from pyspark.sql.types import StringType, StructField, StructType

    source_class = datasource.__getattr__("ServiceBusDataSource")
    source = source_class(_opts(ordering="session", state_location=str(tmp_path / "state")))
    schema = StructType([StructField("body", StringType())])
    with pytest.raises(ConfigError, match="option 'ordering': applies to streams"):
        source.writer(schema, False)
    writer = source.streamWriter(schema, False)  # nothing read until the plan is needed
    assert writer.plan.held == () and writer.plan.config.ordering == "session"


# ------------------------------------------------------------------------------------------------ the plan
def test_nothing_held_costs_a_look_for_the_sessions_table_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, store = _setup(tmp_path)

    def no_read(*args: Any) -> set[str]:
        raise AssertionError("acknowledgements read while nothing is held")

    monkeypatch.setattr(DeltaRsStateStore, "read_acknowledgements", no_read)
    plan = read_plan(config, SINK, store.location)
    assert (plan.held, plan.remark) == ((), ())
    assert not store.sessions_exist()
    store.write_sessions(SINK, [])  # no line, no table: nothing written
    assert not store.sessions_exist()
    outcome = commit_write(plan, 0, [_report(0)])  # a healthy batch: no mark, nothing released
    assert outcome is not None and outcome.total_sent == 1
    assert not store.sessions_exist()


def test_the_plan_hands_the_held_lines_less_the_acknowledged_and_writes_nothing(tmp_path: Path) -> None:
    config, store = _setup(tmp_path)
    store.write_sessions(SINK, [_line("a", Q0, "m-a"), _line("b", Q1, "m-b")])
    store.write_sessions("other-sink", [_line("c", Q0, "m-c")])  # another sink's lines: not this one's
    _ack(store, config, "m-a")
    plan = read_plan(config, SINK, store.location, now=lambda: T0 + timedelta(minutes=1))
    assert [(line.session, line.queue) for line in plan.held] == [("b", Q1)]
    assert plan.remark == ()
    assert _held(store) == {"a": (Q0, ("m-a",)), "b": (Q1, ("m-b",))}  # the commit releases, not the plan


def test_a_held_line_whose_newest_marker_is_stale_is_remarked_by_the_first_task_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, store = _setup(tmp_path)
    store.write_sessions(SINK, [_line("a", Q0, "m-a"), _line("b", Q1, "m-b", T0 + REMARK_AFTER)])
    plan = read_plan(config, SINK, store.location, now=lambda: T0 + REMARK_AFTER)
    assert plan.remark == (("orders", "a"),)
    calls: list[tuple[Any, ...]] = []

    def fake_send(config: Any, rows: Any, handoff: Any, held: Any, remark: Any) -> PartitionResult:
        calls.append((tuple(line.session for line in held), tuple(remark)))
        return PartitionResult("h1", len(list(rows)), SendOutcome())

    monkeypatch.setattr(datasource, "send_partition", fake_send)
    first = [True, False]
    monkeypatch.setattr(datasource, "first_task", lambda: first.pop(0))
    datasource.write_partition(plan, iter([]), 3)
    datasource.write_partition(plan, iter([]), 3)
    assert calls == [(("a", "b"), (("orders", "a"),)), (("a", "b"), ())]
    calls.clear()
    replayed = WritePlan(config, SINK, store.location, last_committed=3, held=plan.held, remark=plan.remark)
    datasource.write_partition(replayed, iter([]), 3)  # a replay sends nothing, remarks nothing
    assert calls == []


# ------------------------------------------------------------------------------------------------ the commit
def test_the_commit_releases_on_the_acknowledgements_read_then_and_merges_the_marks(tmp_path: Path) -> None:
    config, store = _setup(tmp_path)
    store.write_sessions(SINK, [_line("a", Q0, "m-a"), _line("b", Q1, "m-b"), _line("c", Q0, "m-c")])
    plan = read_plan(config, SINK, store.location)  # before the tasks: nothing acknowledged
    assert [line.session for line in plan.held] == ["a", "b", "c"]
    _ack(store, config, "m-a", "m-b")  # the syphon job passes two markers while the tasks run
    # a task diverted a's rows behind m-a (its handed queue) and a new line d's; b and c had no rows
    marks = (LineMark("orders", "a", Q0, "m-a2"), LineMark("orders", "d", Q1, "m-d"))
    commit_write(plan, 4, [_report(4, *marks), _report(4)])
    assert _held(store) == {
        "a": (Q0, ("m-a2",)),  # released by m-a, held again by the newer marker behind its new messages
        "c": (Q0, ("m-c",)),  # still waiting for its marker
        "d": (Q1, ("m-d",)),  # held for the first time
    }  # b: drained (its marker acknowledged, no task marked it): released
    events = {
        (e.event, e.detail) for e in store.read_events(SINK) if e.event in (SESSION_HELD, SESSION_RETURNED)
    }
    assert (SESSION_RETURNED, "b") in events and (SESSION_HELD, "d") in events
    assert (SESSION_RETURNED, "c") not in events

    _ack(store, config, "m-a2", "m-c", "m-d")
    plan = read_plan(config, SINK, store.location)  # the next batch: everything acknowledged, nothing handed
    assert plan.held == ()
    commit_write(plan, 5, [_report(5)])
    assert _held(store) == {}
    returned = [e.detail for e in store.read_events(SINK) if e.event == SESSION_RETURNED and e.batch_id == 5]
    assert sorted(returned) == ["a", "c", "d"]


def test_a_line_the_plan_released_but_a_task_diverted_again_is_pinned_where_its_new_messages_are(
    tmp_path: Path,
) -> None:
    """The plan released a (its marker acknowledged); a worker that still had a's entity failed over diverted a's
    rows to another queue: the commit releases a first, so the line is held again on that queue (not on its old
    one, where its next messages would be moved independently of these)."""
    config, store = _setup(tmp_path)
    store.write_sessions(SINK, [_line("a", Q0, "m-a")])
    _ack(store, config, "m-a")
    plan = read_plan(config, SINK, store.location)
    assert plan.held == ()
    commit_write(plan, 6, [_report(6, LineMark("orders", "a", Q1, "m-a2"))])
    assert _held(store) == {"a": (Q1, ("m-a2",))}
    assert read_plan(config, SINK, store.location).held[0].queue == Q1


class _SyphonAhead(FakeClock):
    """The plan's clock: the syphon job's acknowledgement of ``markers`` lands at the plan's first wait."""

    def __init__(self, land: Callable[[], None] | None) -> None:
        super().__init__()
        self._land = land

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        land, self._land = self._land, None
        if land is not None:
            land()


def test_a_fed_line_the_syphon_is_right_behind_is_caught_up_at_the_plan_and_released_by_the_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R5 in ``format('servicebus')`` (issue 47): every batch marks a fed line again, and the syphon job acknowledges
    each marker just after the next batch's plan read - the line never returned. The markers a batch replaced are
    kept in the sessions table; once the syphon acknowledged one, the plan waits (up to CATCH_UP_WAIT) for the
    newest, and the commit, which never waits, releases the line."""
    config, store = _setup(tmp_path)
    store.write_sessions(SINK, [_line("a", Q0, "m-a1"), _line("b", Q1, "m-b1")])
    plan = read_plan(config, SINK, store.location)
    marks = (LineMark("orders", "a", Q0, "m-a2"), LineMark("orders", "b", Q1, "m-b2"))
    commit_write(plan, 1, [_report(1, *marks)])  # both fed again: newer markers replace the first
    assert {line.session: line.replaced for line in store.read_sessions(SINK)} == {
        "a": ("m-a1",),
        "b": ("m-b1",),
    }  # kept in the table (a row whose issued is null), not pending
    assert _held(store) == {"a": (Q0, ("m-a2",)), "b": (Q1, ("m-b2",))}

    _ack(store, config, "m-a1")  # the syphon passed a's replaced marker: it is right behind a (not b)
    clock = _SyphonAhead(lambda: _ack(store, config, "m-a2"))
    plan = datasource.plan_from(store, config, SINK, store.location, datetime.now(timezone.utc), clock)
    assert [line.session for line in plan.held] == ["b"]  # a goes to the primary in this batch
    assert 0 < sum(clock.sleeps) <= CATCH_UP_POLL

    def no_wait(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the commit waited")

    monkeypatch.setattr(SessionLedger, "catch_up", no_wait)
    commit_write(plan, 2, [_report(2, LineMark("orders", "b", Q1, "m-b3"))])
    assert _held(store) == {"b": (Q1, ("m-b3",))}
    assert [line.replaced for line in store.read_sessions(SINK)] == [("m-b2",)]
    returned = [e.detail for e in store.read_events(SINK) if e.event == SESSION_RETURNED]
    assert returned == ["a"]


def test_the_plans_catch_up_waits_at_most_its_budget_and_only_for_lines_the_syphon_is_behind(
    tmp_path: Path,
) -> None:
    config, store = _setup(tmp_path)
    store.write_sessions(SINK, [_line("a", Q0, "m-a1")])
    commit_write(
        read_plan(config, SINK, store.location), 1, [_report(1, LineMark("orders", "a", Q0, "m-a2"))]
    )
    clock = _SyphonAhead(None)
    plan = datasource.plan_from(store, config, SINK, store.location, datetime.now(timezone.utc), clock)
    assert [line.session for line in plan.held] == [
        "a"
    ] and clock.sleeps == []  # m-a1 not acknowledged: no wait
    _ack(store, config, "m-a1")  # the syphon is right behind a, and then stops
    plan = datasource.plan_from(store, config, SINK, store.location, datetime.now(timezone.utc), clock)
    assert [line.session for line in plan.held] == ["a"]
    assert sum(clock.sleeps) == pytest.approx(CATCH_UP_WAIT)


def test_a_replayed_batch_leaves_the_held_lines_as_they_are(tmp_path: Path) -> None:
    config, store = _setup(tmp_path)
    store.write_sessions(SINK, [_line("a", Q0, "m-a")])
    commit_write(
        read_plan(config, SINK, store.location), 2, [_report(2, LineMark("orders", "a", Q0, "m-a2"))]
    )
    assert _held(store) == {"a": (Q0, ("m-a2",))}
    _ack(store, config, "m-a2")
    plan = read_plan(config, SINK, store.location)  # batch 2 again (a driver restart before the checkpoint)
    assert plan.replayed(2) and plan.held == ()
    assert commit_write(plan, 2, [TaskReport(2, 1, None)]) is None
    assert _held(store) == {"a": (Q0, ("m-a2",))}  # the replay sent nothing: the next batch releases it
    assert [e.batch_id for e in store.read_events(SINK) if e.event == REPLAY_SKIPPED] == [2]
    commit_write(read_plan(config, SINK, store.location), 3, [_report(3)])
    assert _held(store) == {}


def test_the_sessions_table_keeps_each_sinks_rows_apart(tmp_path: Path) -> None:
    _, store = _setup(tmp_path)
    store.write_sessions(SINK, [_line("a", Q0, "m-a"), _line("it's", Q1, "m-q")])
    store.write_sessions("o'ther", [_line("c", Q0, "m-c")])
    assert _held(store) == {"a": (Q0, ("m-a",)), "it's": (Q1, ("m-q",))}
    store.write_sessions(SINK, [_line("b", Q1, "m-b")])
    assert _held(store) == {"b": (Q1, ("m-b",))}
    assert [line.session for line in store.read_sessions("o'ther")] == ["c"]
    store.write_sessions(SINK, [])
    assert _held(store) == {} and [line.session for line in store.read_sessions("o'ther")] == ["c"]


def test_acknowledgements_are_read_by_namespace_marker_and_time(tmp_path: Path) -> None:
    _, store = _setup(tmp_path)
    now = datetime.now(timezone.utc)
    store.append_events(
        [
            Event(now, "syphon", 1, ACKNOWLEDGED, namespace="n's", detail="m'1"),
            Event(now - timedelta(hours=2), "syphon", 1, ACKNOWLEDGED, namespace="n's", detail="m2"),
            Event(now, "syphon", 1, ACKNOWLEDGED, namespace="other", detail="m3"),
            Event(now, "syphon", 1, "moved", namespace="n's", detail="m4"),
        ]
    )
    wanted = {"m'1", "m2", "m3", "m4", "x"}
    assert store.read_acknowledgements("n's", wanted, now - timedelta(hours=1)) == {"m'1"}
    assert store.read_acknowledgements("n's", wanted, now - timedelta(hours=3)) == {"m'1", "m2"}
    assert store.read_acknowledgements("n's", set(), now) == set()
    # another spelling of the namespace (case, default port, trailing slash: SPEC O6) reads the same rows
    assert store.read_acknowledgements("N'S:5671/", wanted, now - timedelta(hours=1)) == {"m'1"}
