"""The driver's hooks that write what the sinks still hold (:mod:`spark_sb.spark.hooks`): the ``atexit`` flush,
SIGTERM as an ordinary exit, the query listener that flushes when a query terminates, and ``is_connect``. Fakes
only: fake sinks, a fake session and its ``streams``; no SparkSession, no JVM."""

from __future__ import annotations

import atexit
import gc
import logging
import signal
import subprocess
import sys
import textwrap
import threading
import weakref
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQueryListener

from spark_sb.spark import hooks
from spark_sb.spark.hooks import install_sigterm_handler, is_connect, register_exit_hook


class _Sink:
    """A sink as the hooks see it: records its flushes and closes, and what every sink's ``_force_sync`` was
    when it was closed."""

    def __init__(
        self, sink_id: str, fails: BaseException | None = None, peers: list[_Sink] | None = None
    ) -> None:
        self.sink_id = sink_id
        self._force_sync = False
        self.fails = fails
        self.peers = peers if peers is not None else []
        self.flushes: list[float | None] = []
        self.closes: list[float | None] = []
        self.synced_at_close: list[bool] = []
        self.flushed = threading.Event()

    def flush(self, timeout: float | None = None) -> None:
        self.flushes.append(timeout)
        self.flushed.set()
        if self.fails is not None:
            raise self.fails

    def close(self, timeout: float | None = None) -> None:
        self.closes.append(timeout)
        self.synced_at_close = [p._force_sync for p in self.peers]
        if self.fails is not None:
            raise self.fails


class _Streams:
    def __init__(self, fails: Exception | None = None) -> None:
        self.listeners: list[Any] = []
        self.fails = fails

    def addListener(self, listener: Any) -> None:  # noqa: N802 - Spark's name
        if self.fails is not None:
            raise self.fails
        self.listeners.append(listener)


#: A session that says it is Spark Connect's, as ``is_connect`` reads it (its class's module).
_ConnectSession = type("SparkSession", (SimpleNamespace,), {"__module__": "pyspark.sql.connect.session"})
_ClassicSession = type("SparkSession", (SimpleNamespace,), {"__module__": "pyspark.sql.session"})


@pytest.fixture(autouse=True)
def _fresh_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees no live sink, no exit hook registered and no watched session."""
    monkeypatch.setattr(hooks, "_live_sinks", type(hooks._live_sinks)())
    monkeypatch.setattr(hooks, "_exit_hook_registered", False)
    monkeypatch.setattr(hooks, "_watched_sessions", set())


@pytest.fixture
def sigterm() -> Iterator[None]:
    """The SIGTERM disposition as it was before the test, restored after it."""
    before = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _active_session(monkeypatch: pytest.MonkeyPatch, session: Any) -> None:
    monkeypatch.setattr(SparkSession, "getActiveSession", lambda: session)


def _join_flush_threads() -> None:
    for thread in threading.enumerate():
        if thread.name == "spark-sb-flush":
            thread.join(timeout=10)


# ------------------------------------------------------------------------------------------- at exit
def test_at_exit_every_sink_writes_synchronously_from_then_on_before_any_is_closed() -> None:
    peers: list[_Sink] = []
    peers += [_Sink("a", peers=peers), _Sink("b", peers=peers), _Sink("c", peers=peers)]
    for sink in peers:
        hooks._live_sinks.add(sink)
    hooks._flush_at_exit()
    for sink in peers:
        assert sink._force_sync is True
        assert sink.closes == [120]
        assert sink.synced_at_close == [True, True, True]
        assert sink.flushes == []


@pytest.mark.parametrize(
    "failure", [RuntimeError("delta down"), SystemExit(3)], ids=lambda e: type(e).__name__
)
def test_a_sink_that_fails_at_exit_is_logged_and_the_others_are_still_closed(
    failure: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    sinks = [_Sink("first", fails=failure), _Sink("second")]
    for sink in sinks:
        hooks._live_sinks.add(sink)
    with caplog.at_level(logging.ERROR, logger=hooks.__name__):
        hooks._flush_at_exit()  # never raises: an exit handler cannot fail a query
    assert [s.closes for s in sinks] == [[120], [120]]
    (record,) = caplog.records
    assert record.levelno == logging.ERROR
    assert (
        record.getMessage() == f"sink first: state writes at exit failed: {type(failure).__name__}: {failure}"
    )


def test_the_hooks_hold_sinks_weakly() -> None:
    kept, dropped = _Sink("kept"), _Sink("dropped")
    hooks._live_sinks.add(kept)
    hooks._live_sinks.add(dropped)
    gone = weakref.ref(dropped)
    del dropped
    gc.collect()
    assert gone() is None
    hooks._flush_at_exit()
    assert list(hooks._live_sinks) == [kept] and kept.closes == [120]


# ------------------------------------------------------------------------------------------- register
def test_registering_sinks_adds_one_exit_handler_and_watches_queries_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registered: list[Any] = []
    watched: list[int] = []
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.setattr(hooks, "_watch_queries", lambda: watched.append(1))
    a, b = _Sink("a"), _Sink("b")
    register_exit_hook(a)
    register_exit_hook(b)
    register_exit_hook(a)
    assert registered == [hooks._flush_at_exit]
    assert set(hooks._live_sinks) == {a, b}
    assert len(watched) == 3


# ------------------------------------------------------------------------------------------- queries
def test_a_classic_session_gets_one_listener_that_flushes_every_sink_when_a_query_terminates(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    streams = _Streams()
    _active_session(monkeypatch, _ClassicSession(streams=streams))
    hooks._watch_queries()
    hooks._watch_queries()  # once per session
    (listener,) = streams.listeners
    assert isinstance(listener, StreamingQueryListener)
    ok, failing = _Sink("ok"), _Sink("failing", fails=RuntimeError("commit conflict"))
    hooks._live_sinks.add(ok)
    hooks._live_sinks.add(failing)
    for event in ("onQueryStarted", "onQueryProgress", "onQueryIdle"):
        getattr(listener, event)(SimpleNamespace(id="q1"))
    assert ok.flushes == [] and failing.flushes == []
    with caplog.at_level(logging.ERROR, logger=hooks.__name__):
        listener.onQueryTerminated(SimpleNamespace(id="q1"))
        assert ok.flushed.wait(10) and failing.flushed.wait(10)
        _join_flush_threads()
    assert ok.flushes == [120] and failing.flushes == [120]
    assert [r.getMessage() for r in caplog.records] == [
        "sink failing: state writes (query q1 terminated) failed: RuntimeError: commit conflict"
    ]


def test_a_spark_connect_session_or_none_gets_no_listener(monkeypatch: pytest.MonkeyPatch) -> None:
    streams = _Streams()
    _active_session(monkeypatch, _ConnectSession(streams=streams))
    hooks._watch_queries()
    assert streams.listeners == [] and hooks._watched_sessions == set()
    _active_session(monkeypatch, None)
    hooks._watch_queries()
    assert hooks._watched_sessions == set()


def test_a_listener_that_cannot_be_added_is_a_warning_and_is_tried_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    streams = _Streams(fails=RuntimeError("no listener bus"))
    _active_session(monkeypatch, _ClassicSession(streams=streams))
    with caplog.at_level(logging.WARNING, logger=hooks.__name__):
        hooks._watch_queries()  # does not raise: the exit flush still covers an exit
    assert [r.getMessage() for r in caplog.records] == [
        "sink: no query listener (RuntimeError: no listener bus); state rows are flushed at exit"
    ]
    assert hooks._watched_sessions == set()
    streams.fails = None
    hooks._watch_queries()
    assert len(streams.listeners) == 1


def test_without_pyspark_no_query_is_watched(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []
    monkeypatch.setattr(SparkSession, "getActiveSession", lambda: asked.append(1))
    monkeypatch.setitem(sys.modules, "pyspark.sql.streaming", None)  # an ImportError
    hooks._watch_queries()
    assert asked == []


# ------------------------------------------------------------------------------------------- SIGTERM
@pytest.mark.usefixtures("sigterm")
def test_sigterm_is_made_an_ordinary_exit_when_nobody_handles_it() -> None:
    install_sigterm_handler()
    assert signal.getsignal(signal.SIGTERM) is hooks._on_sigterm


@pytest.mark.usefixtures("sigterm")
def test_a_sigterm_handler_of_the_program_is_kept() -> None:
    def own(signum: int, frame: Any) -> None:
        pass

    signal.signal(signal.SIGTERM, own)
    install_sigterm_handler()
    assert signal.getsignal(signal.SIGTERM) is own
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    install_sigterm_handler()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN


def test_no_signals_here_is_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any) -> Any:
        raise ValueError("signal only works in main thread of the main interpreter")

    monkeypatch.setattr(signal, "getsignal", refuse)
    install_sigterm_handler()  # an embedded interpreter: nothing to do, nothing raised


@pytest.mark.usefixtures("sigterm")
def test_the_first_sigterm_exits_and_lets_a_second_one_end_the_process_at_once() -> None:
    signal.signal(signal.SIGTERM, hooks._on_sigterm)
    with pytest.raises(SystemExit) as caught:
        hooks._on_sigterm(signal.SIGTERM, None)
    assert caught.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_sigterm_runs_the_exit_flush_in_a_real_process() -> None:
    script = textwrap.dedent(
        """
        import os, signal, sys, time
        from spark_sb.spark import hooks

        class Sink:
            sink_id = "s1"
            _force_sync = False
            def flush(self, timeout=None):
                pass
            def close(self, timeout=None):
                print("closed", self.sink_id, timeout, self._force_sync, flush=True)

        hooks._watch_queries = lambda: None  # no Spark here
        sink = Sink()
        hooks.install_sigterm_handler()
        hooks.register_exit_hook(sink)
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)  # the signal arrives first
        finally:
            print("finally ran", flush=True)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert done.stdout.splitlines() == ["finally ran", "closed s1 120 True"]


# ------------------------------------------------------------------------------------------- is_connect
@pytest.mark.parametrize(
    ("session", "connect"),
    [
        (_ConnectSession(), True),
        (type("X", (), {"__module__": "pyspark.sql.connect.dataframe"})(), True),
        (_ClassicSession(), False),
        (object.__new__(SparkSession), False),
        (SimpleNamespace(), False),
        (None, False),
    ],
    ids=["connect-session", "connect-module", "classic-named", "classic", "namespace", "none"],
)
def test_is_connect_tells_a_spark_connect_session_by_its_module(session: Any, connect: bool) -> None:
    assert is_connect(session) is connect
