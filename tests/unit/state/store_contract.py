"""The one contract every state store runs (STYLE item 4): the in-memory store, delta-rs and Spark Delta."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

from spark_sb.state.records import (
    BATCH_COMMITTED,
    SENT,
    BatchWrites,
    EntityRecord,
    Event,
    PulledQueue,
    RejectRecord,
)
from spark_sb.state.store import StateStore
from tests.unit.sender.rig import QUEUES


class StoreContract:
    """What every state store must do. Subclasses provide ``store`` (a fresh, empty store)."""

    store: StateStore

    def test_empty_store_reads_nothing(self) -> None:
        self.store.ensure()
        assert self.store.read_entities() == []
        assert self.store.last_committed("s") is None
        assert self.store.committed("s", 0) is None
        assert self.store.read_events() == [] and self.store.read_rejects() == []

    def test_batch_rows_round_trip(self) -> None:
        self.store.write_batch("s", 0, _writes("s", 0, entity_state="failed_over"))
        events = self.store.read_events("s")
        assert [(e.event, e.entity, e.count, e.executor_host) for e in events] == [
            (SENT, "orders", 3, "h1"),
            (BATCH_COMMITTED, None, 4, None),
        ]
        assert events[0].time == T0 and events[0].namespace == NS and events[0].batch_id == 0
        (rec,) = self.store.read_entities()
        assert (rec.namespace, rec.entity, rec.state, rec.since, rec.last_error_class) == (
            NS,
            "orders",
            "failed_over",
            T0,
            "quota_exceeded",
        )
        (rej,) = self.store.read_rejects("s")
        assert (rej.entity, rej.column, rej.reason, rej.row_json, rej.batch_id) == (
            "orders",
            "session_id",
            "too long",
            '{"body": "x"}',
            0,
        )
        assert self.store.last_committed("s") == 0
        commit = self.store.committed("s", 0)
        assert commit is not None and commit.count == 4
        assert self.store.committed("s", 1) is None and self.store.committed("other", 0) is None

    def test_repeated_or_older_batch_is_written_once(self) -> None:
        self.store.write_batch("s", 3, _writes("s", 3))
        self.store.write_batch("s", 3, _writes("s", 3))  # a replay after a driver restart
        self.store.write_batch("s", 2, _writes("s", 2))  # older than the last one: skipped like Delta txns
        self.store.write_batch("t", 3, _writes("t", 3))  # another sink: its own sequence
        assert [e.batch_id for e in self.store.read_events("s")] == [3, 3]
        assert len(self.store.read_rejects("s")) == 1 and len(self.store.read_rejects("t")) == 1
        assert self.store.last_committed("s") == 3 and self.store.last_committed("t") == 3

    def test_entity_state_only_moves_forward_in_time(self) -> None:
        later = T0 + timedelta(minutes=5)
        self.store.write_batch("a", 0, _writes("a", 0, entity_state="failed_over", since=later))
        self.store.write_batch("b", 0, _writes("b", 0, entity_state="healthy", since=T0))  # stale writer
        (rec,) = self.store.read_entities()
        assert (rec.state, rec.since) == ("failed_over", later)
        self.store.write_batch("b", 1, _writes("b", 1, entity_state="healthy", since=later + timedelta(1)))
        (rec,) = self.store.read_entities()
        assert rec.state == "healthy"

    def test_pulled_queues_round_trip(self) -> None:
        pulls = (PulledQueue(QUEUES[0], T0 + timedelta(minutes=5), "timeout"),)
        writes = BatchWrites(
            (Event(T0, "s", 0, BATCH_COMMITTED),),
            (EntityRecord(NS, "orders", "failed_over", T0, None, BNS, pulls, T0, "s"),),
            (),
        )
        self.store.write_batch("s", 0, writes)
        (rec,) = self.store.read_entities()
        assert rec.pulled_backlog_queues == pulls and rec.backlog_namespace == BNS

    def test_entities_version_moves_with_entity_writes_only(self) -> None:
        self.store.ensure()
        before = self.store.entities_version()
        self.store.write_batch("s", 0, _writes("s", 0))  # events and rejects only
        assert self.store.entities_version() == before
        self.store.write_batch("s", 1, _writes("s", 1, entity_state="failed_over"))
        after = self.store.entities_version()
        assert after is not None and after != before

    def test_append_events_outside_batches(self) -> None:
        self.store.append_events([Event(T0, "s", 7, "replay_skipped", count=4)])
        self.store.append_events([Event(T0, "s", 7, "replay_skipped", count=4)])
        assert [e.event for e in self.store.read_events("s")] == ["replay_skipped"] * 2
        assert self.store.last_committed("s") is None

    def test_concurrent_writers(self) -> None:
        self.store.ensure()
        errors: list[BaseException] = []

        def writer(sink: str) -> None:
            try:
                for batch in range(2):  # two each: the writers start together, so their first writes meet
                    since = T0 + timedelta(seconds=batch)
                    self.store.write_batch(
                        sink, batch, _writes(sink, batch, entity_state="failing", since=since)
                    )
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(f"sink{i}",)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        for sink in ("sink0", "sink1"):
            assert sorted({e.batch_id for e in self.store.read_events(sink)}) == [0, 1]
            assert self.store.last_committed(sink) == 1
        (rec,) = self.store.read_entities()
        assert rec.since == T0 + timedelta(seconds=1)


T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


NS = "primary.servicebus.windows.net"


BNS = "secondary.servicebus.windows.net"


def _writes(sink: str, batch: int, *, entity_state: str | None = None, since: datetime = T0) -> BatchWrites:
    events = (
        Event(T0, sink, batch, SENT, namespace=NS, entity="orders", count=3, executor_host="h1"),
        Event(T0, sink, batch, BATCH_COMMITTED, namespace=NS, count=4),
    )
    entities = (
        (EntityRecord(NS, "orders", entity_state, since, "quota_exceeded", BNS, (), T0, sink),)
        if entity_state
        else ()
    )
    rejects = (RejectRecord(T0, sink, batch, "orders", "session_id", "too long", '{"body": "x"}'),)
    return BatchWrites(events, entities, rejects)
