"""The state relay's thread, listener and deadline without Spark (a fake session): the listener wakes the thread
for other queries' micro-batches and not for the relay's own; a failed drain is kept and tried again; ``stop``
removes the listener and drains once more; a relay query past its deadline is stopped and named."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from spark_sb.spark.relay import RELAY_QUERY_PREFIX, RelayError, RelayReport, StateRelay


class _Streams:
    def __init__(self) -> None:
        self.listeners: list[Any] = []

    def addListener(self, listener: Any) -> None:  # noqa: N802 - Spark's name
        self.listeners.append(listener)

    def removeListener(self, listener: Any) -> None:  # noqa: N802
        self.listeners.remove(listener)


class _CountingRelay(StateRelay):
    """Drains count themselves; ``fail`` makes the next drain raise."""

    def __init__(self) -> None:
        super().__init__(SimpleNamespace(streams=_Streams()), "/spool", "main.ops.sb_", timeout=5, interval=0)
        self.drains = 0
        self.fail: Exception | None = None
        self.lock = threading.Lock()

    def drain(self) -> RelayReport:
        with self.lock:
            self.drains += 1
            if self.fail is not None:
                error, self.fail = self.fail, None
                raise error
        return RelayReport({"events": self.drains}, 0)


def _progress(name: str | None) -> Any:
    return SimpleNamespace(progress=SimpleNamespace(name=name))


def test_the_listener_wakes_the_thread_for_other_queries_and_not_for_the_relays_own() -> None:
    relay = _CountingRelay().start()
    try:
        (listener,) = relay.spark.streams.listeners
        before = relay.drains_started
        listener.onQueryProgress(_progress(f"{RELAY_QUERY_PREFIX}events-1a2b3c4d"))
        assert not relay.settle(0.3, wake=False, after=before)  # its own query: no drain
        assert relay.drains == 0
        listener.onQueryProgress(_progress(None))  # an unnamed user query
        assert relay.settle(10, wake=False, after=before)
        assert relay.drains == 1
        listener.onQueryProgress(_progress("orders-to-servicebus"))
        assert relay.settle(10, wake=False, after=before + 1)
        assert relay.drains == 2
    finally:
        relay.stop(drain=False)


def test_a_failed_drain_is_kept_and_the_next_wake_up_tries_again() -> None:
    relay = _CountingRelay().start()
    try:
        relay.fail = RelayError("spool unreachable")
        assert relay.settle(10)
        assert isinstance(relay.last_error, RelayError)
        assert relay.settle(10)
        assert relay.last_error is None and relay.drains == 2
    finally:
        relay.stop(drain=False)


def test_stop_removes_the_listener_ends_the_thread_and_drains_once_more() -> None:
    relay = _CountingRelay().start()
    assert relay.start() is relay  # idempotent: one thread, one listener
    assert len(relay.spark.streams.listeners) == 1
    report = relay.stop()
    assert report == RelayReport({"events": 1}, 0)  # the last drain, in the caller's thread
    assert relay.spark.streams.listeners == []
    assert not any(t.name.startswith("spark-sb-relay:") for t in threading.enumerate())
    again = relay.start()  # started again after a stop: the thread runs and drains when woken
    assert again.settle(10) and relay.drains == 2
    relay.stop(drain=False)
    failing = _CountingRelay()
    failing.fail = RelayError("catalog refused")
    with pytest.raises(RelayError, match="catalog refused"):
        failing.stop()  # a batch write's drain: its failure is the caller's


class _DeadlockingStreams(_Streams):
    """pyspark 4.2.0's Connect ``removeListener`` when an event is on its way: it waits for the bus's thread, which
    waits for the lock the remover holds (here: 10 s, then the test fails)."""

    def __init__(self) -> None:
        super().__init__()
        self.removals = 0

    def removeListener(self, listener: Any) -> None:  # noqa: N802
        self.removals += 1
        threading.Event().wait(10)
        raise AssertionError("removeListener deadlocked")


#: A session that says it is Spark Connect's, as ``is_connect`` reads it (its class's module).
_ConnectSession = type("SparkSession", (SimpleNamespace,), {"__module__": "pyspark.sql.connect.session"})


def test_under_spark_connect_stop_leaves_its_listener_inert_rather_than_remove_it() -> None:
    """pyspark's Connect removeListener can deadlock (CI hung in relay.stop()): the relay does not call it there;
    its listener stays on the session and wakes nothing from then on. A classic session's is removed."""
    relay = _CountingRelay()
    streams = _DeadlockingStreams()
    relay.spark = _ConnectSession(streams=streams)
    relay.start()
    (listener,) = streams.listeners
    listener.onQueryProgress(_progress("orders"))
    assert relay.settle(10, wake=False, after=0)  # it woke the relay while running
    started = time.monotonic()
    assert relay.stop() == RelayReport({"events": 2}, 0)
    assert time.monotonic() - started < 5 and streams.removals == 0
    assert streams.listeners == [listener] and listener.relay is None
    listener.onQueryProgress(_progress("orders"))  # inert: no drain, no error
    assert relay.drains_started == 1 and relay.drains == 2
    classic = _CountingRelay().start()
    classic.stop(drain=False)
    assert classic.spark.streams.listeners == []  # removed, as before


class _Chain:
    """A fluent stand-in for ``spark.readStream ... .start()``; ``start`` returns the query."""

    def __init__(self, query: Any) -> None:
        self.query = query
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name == "start":
            return lambda *a, **k: self.query
        if name in ("readStream", "writeStream"):
            return self

        def call(*args: Any, **kwargs: Any) -> _Chain:
            self.calls.append(name)
            return self

        return call


class _StuckQuery:
    def __init__(self) -> None:
        self.stopped = False
        self.waited: float | None = None
        self.recentProgress: list[dict[str, Any]] = []

    def awaitTermination(self, timeout: float) -> bool:  # noqa: N802 - Spark's name
        self.waited = timeout
        return False

    def stop(self) -> None:
        self.stopped = True


def test_a_relay_query_past_its_deadline_is_stopped_and_named() -> None:
    query = _StuckQuery()
    chain = _Chain(query)
    relay = StateRelay(
        SimpleNamespace(readStream=chain, streams=_Streams()), "/spool/", "main.ops.sb_", timeout=7
    )
    assert relay.spool == "/spool"
    with pytest.raises(
        RelayError, match=r"relay of events from /spool to main.ops.sb_events: not done in 7 s"
    ):
        relay._stream("events")
    assert query.waited == 7 and query.stopped
    assert "foreachBatch" in chain.calls and "trigger" in chain.calls


def test_a_drain_reads_only_the_tables_that_moved_since_its_last_copy() -> None:
    versions = {"events": 3, "rejects": 1, "entities": 5}
    streamed: list[str] = []
    merged: list[int] = []
    relay = StateRelay(SimpleNamespace(streams=_Streams()), "/spool", "main.ops.sb_")
    relay._use_rs = False  # read through the (fake) Spark store
    relay._version = versions.get  # type: ignore[method-assign]
    relay._stream = lambda table: streamed.append(table) or 10  # type: ignore[method-assign]
    entities = ["orders", "payments"]
    relay.source = SimpleNamespace(read_entities=lambda: list(entities))  # type: ignore[assignment]
    relay.target = SimpleNamespace(ensure=lambda: None, merge_entities=lambda r: merged.append(len(r)))  # type: ignore[assignment]

    assert relay.drain() == RelayReport({"rejects": 10, "events": 10}, 2)
    assert relay.drain() == RelayReport({"rejects": 0, "events": 0}, 0)  # idle: no query, no merge
    versions["events"] = 4
    assert relay.drain() == RelayReport({"rejects": 0, "events": 10}, 0)
    assert streamed == ["rejects", "events", "events"] and merged == [2]
    versions["entities"] = 6  # the table moved, one record changed: only that one is merged
    entities[1] = "payments, failed over"
    assert relay.drain().entities == 1 and merged == [2, 1]
    del versions["events"]  # the source has recorded nothing yet
    assert relay.drain() == RelayReport({}, 0, skipped=True)


def test_wake_ups_within_the_interval_share_one_drain_and_stop_still_drains() -> None:
    now = [100.0]
    relay = _CountingRelay()
    relay.interval = 30.0
    relay._clock = lambda: now[0]  # type: ignore[method-assign]
    relay.start()
    try:
        assert relay.settle(10)  # the first drain: at once
        before = relay.drains_started
        relay.wake()
        relay.wake()
        assert not relay.settle(0.3, wake=False, after=before)  # 30 s not over on the clock: no drain yet
        now[0] += 30.0
        relay.wake()  # the thread looks at the clock again when woken
        assert relay.settle(10, wake=False, after=before)
        assert relay.drains == 2  # two wake-ups (and this one) shared one drain
    finally:
        assert relay.stop() == RelayReport({"events": 3}, 0)  # stop drains at once, whatever the interval


def test_the_spool_is_read_with_deltalake_without_spark_and_with_spark_when_deltalake_fails(
    tmp_path: Any,
) -> None:
    pytest.importorskip("deltalake")
    from datetime import datetime, timezone

    from spark_sb.state.deltars import DeltaRsStateStore
    from spark_sb.state.records import EntityRecord

    spool = DeltaRsStateStore(str(tmp_path / "spool"))
    relay = StateRelay(SimpleNamespace(streams=_Streams()), spool.location, "main.ops.sb_")  # no spark.sql
    assert relay._version("events") is None  # nothing recorded yet, and nothing created
    assert not (tmp_path / "spool").exists()
    spool.ensure()
    record = EntityRecord("primary", "orders", "failed_over", datetime(2026, 11, 26, tzinfo=timezone.utc))
    spool._merge_entities([record])
    assert relay._version("events") == 0 and relay._version("entities") == 1
    assert relay._read_entities() == [record]

    class _Broken:
        def version(self, table: str) -> int:
            raise OSError("no credentials for this store")

    sql: list[str] = []
    relay.spark.sql = lambda text: sql.append(text) or SimpleNamespace(collect=lambda: [{"version": 7}])
    relay._rs = _Broken()  # type: ignore[assignment]
    assert relay._version("events") == 7  # Spark answered
    assert sql == [f"DESCRIBE HISTORY delta.`{spool.location}/events` LIMIT 1"]
    assert relay._version("rejects") == 7 and len(sql) == 2  # Spark from now on: deltalake is not tried again


def test_a_failing_last_drain_does_not_hide_the_error_of_the_with_block() -> None:
    relay = _CountingRelay()
    relay.fail = RelayError("catalog refused")
    with pytest.raises(KeyError, match="the stream's own error"), relay:
        raise KeyError("the stream's own error")
    assert relay.spark.streams.listeners == []  # stopped all the same
    relay = _CountingRelay()
    relay.fail = RelayError("catalog refused")
    with pytest.raises(RelayError, match="catalog refused"), relay:
        pass  # without an error of its own, the block's last drain failing is the error
