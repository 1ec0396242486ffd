"""The liveness rule of a shared connection while a call waits on it (SPEC L1, issue 29 item 4;
:class:`spark_sb.wire.liveness.Liveness`, :meth:`SharedConnection.on_link`), on a stand-in pyamqp connection and
a fake clock: nothing heard for QUIET -> a ping; a ping answered -> the call waits on; a ping not answered within
PING_ANSWER -> the connection is dead, dropped, and the call made once more on a fresh one - whose own failure is
raised as it is (the namespace's evidence). The real SDK and namespace: tests/integration/test_silent_drop.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from azure.servicebus._pyamqp.constants import ConnectionState, SessionState
from azure.servicebus.exceptions import OperationTimeoutError

import spark_sb.wire.connection as connection_module
import spark_sb.wire.liveness as liveness_module
from spark_sb.wire.connection import FoundDead, SharedConnection
from spark_sb.wire.liveness import ConnectionSilent, Liveness, Spare
from spark_sb.wire.timing import PING_ANSWER, QUIET, VERIFY_WAIT

SLICE = 0.05  # one read of the connection (the SDK's socket timeout on the shared connection)


class FakeTime:
    """``time`` as connection.py uses it: ``time()`` (wall) and ``monotonic()``, moved by reads only."""

    def __init__(self) -> None:
        self.mono = 0.0

    def time(self) -> float:
        return 1_000_000.0 + self.mono

    def monotonic(self) -> float:
        return self.mono


class Session:
    def __init__(self) -> None:
        self.state = SessionState.UNMAPPED
        self.ended = False

    def begin(self) -> None:
        self.state = SessionState.BEGIN_SENT

    def end(self) -> None:
        self.ended = True
        self.state = SessionState.END_SENT


class Connection:
    """pyamqp's connection as the liveness rule sees it. ``alive``: the peer answers a begun session in the next
    read (a live namespace); otherwise nothing ever comes (a silently dropped connection)."""

    def __init__(self, clock: FakeTime, alive: bool) -> None:
        self.clock = clock
        self.alive = alive
        self.state = ConnectionState.OPENED
        self._transport = None
        self._last_frame_received_time: float | None = clock.time()
        self.sessions: list[Session] = []
        self.closed = False

    def listen(self, **_: Any) -> None:
        time.sleep(0.001)  # a socket read blocks a little: a spare's opening (a thread) gets to run
        self.clock.mono += SLICE
        if not self.alive:
            return
        for session in self.sessions:
            if session.state is SessionState.BEGIN_SENT:
                session.state = SessionState.MAPPED
                self._last_frame_received_time = self.clock.time()

    def create_session(self, **_: Any) -> Session:
        session = Session()
        self.sessions.append(session)
        return session

    def close(self) -> None:
        self.closed = True
        self.state = ConnectionState.END


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr(connection_module, "time", fake)
    monkeypatch.setattr(liveness_module, "time", fake)
    return fake


def wait_on(conn: Connection, seconds: float) -> None:
    """What the SDK's wait for an answer does: read the connection, slice after slice."""
    end = conn.clock.mono + seconds
    while conn.clock.mono < end:
        conn.listen()


# ------------------------------------------------------------------------------------------------- Liveness
def test_a_wait_that_hears_nothing_pings_and_an_answered_ping_lets_it_wait_on(clock: FakeTime) -> None:
    conn = Connection(clock, alive=True)
    watch = Liveness(conn)
    with watch.watching(clock.time()):
        wait_on(conn, 3 * QUIET)
    assert not watch.dead
    assert 2 <= len(conn.sessions) <= 4  # about one ping per QUIET of silence, each answered...
    assert all(s.ended for s in conn.sessions[:-1])  # ...and its session ended
    assert conn.listen.__func__ is Connection.listen  # type: ignore[attr-defined]  # pyamqp's read again


def spare_of(fresh: Callable[[], Any]) -> Callable[[], Spare]:
    """What on_link gives the watch: a fresh connection opened alongside (``fresh()`` opens it, or raises)."""
    return lambda: Spare(lambda _timeout: fresh(), 5.0)


def test_a_ping_not_answered_ends_the_wait_once_a_fresh_connection_is_open(clock: FakeTime) -> None:
    conn = Connection(clock, alive=False)
    fresh = Connection(clock, alive=True)
    watch = Liveness(conn)
    with pytest.raises(ConnectionSilent), watch.watching(clock.time(), spare_of(lambda: fresh)):
        wait_on(conn, 30.0)
    assert watch.dead
    assert len(conn.sessions) == 1  # one ping
    assert QUIET + PING_ANSWER <= clock.mono <= QUIET + PING_ANSWER + 2.0  # the spare: a thread
    spare = watch.take_spare()
    assert spare is not None and spare.claim() is fresh


def test_a_fresh_connection_refused_ends_the_wait_too(clock: FakeTime) -> None:
    conn = Connection(clock, alive=False)
    watch = Liveness(conn)

    def refused() -> Any:
        raise ConnectionRefusedError("refused")

    with pytest.raises(ConnectionSilent), watch.watching(clock.time(), spare_of(refused)):
        wait_on(conn, 30.0)
    spare = watch.take_spare()
    assert spare is not None and spare.refused() and spare.claim() is None


def test_a_slow_namespace_keeps_the_wait_going_and_its_late_answer_counts(clock: FakeTime) -> None:
    """A latency of seconds: the ping is not answered in time and a fresh connection does not open either (the
    namespace is slow for everyone) - the call keeps waiting on its connection, and the late answer ends the wait;
    the fresh connection, opened meanwhile, is closed."""
    conn = Connection(clock, alive=False)
    late = Connection(clock, alive=True)
    opening = threading.Event()
    watch = Liveness(conn)
    with watch.watching(clock.time(), spare_of(lambda: opening.wait(5.0) and late)):
        wait_on(conn, 4.0)  # silent for 4 s: no ConnectionSilent, the spare still opening
        conn._last_frame_received_time = clock.time()  # the slow answer
        conn.listen()
    assert not watch.dead and watch.spare is None  # the answer dropped the spare...
    opening.set()
    deadline = time.monotonic() + 5.0
    while not late.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert late.closed  # ...closed once its opening ended


def test_a_wait_that_keeps_hearing_frames_never_pings(clock: FakeTime) -> None:
    conn = Connection(clock, alive=True)
    watch = Liveness(conn)
    with watch.watching(clock.time()):
        for _ in range(100):
            conn.listen()
            conn._last_frame_received_time = clock.time()  # an answer of some link, a heartbeat
    assert conn.sessions == [] and not watch.dead


def test_verify_after_a_short_call(clock: FakeTime) -> None:
    heard = Connection(clock, alive=False)
    watch = Liveness(heard)
    watch.since = clock.time() - 0.1  # the call began before the last frame: heard during the call
    assert watch.verify(0.2) and heard.sessions == []

    alive = Connection(clock, alive=True)
    watch = Liveness(alive)
    watch.since = clock.time() + 0.01  # nothing heard since the call began
    assert watch.verify(0.2) and len(alive.sessions) == 1 and alive.sessions[0].ended

    dead = Connection(clock, alive=False)
    watch = Liveness(dead)
    watch.since = clock.time() + 0.01
    start = clock.mono
    assert not watch.verify(0.2) and watch.dead
    assert 0.2 <= clock.mono - start <= 0.2 + 2 * SLICE


# --------------------------------------------------------------------------------------- on_link's rescue
class Sender:
    def __init__(self, connection: Any) -> None:
        self.connection = connection


def shared(
    clock: FakeTime, monkeypatch: pytest.MonkeyPatch, alive: list[bool | BaseException | threading.Event]
) -> SharedConnection:
    """A shared connection whose openings give, in turn, a connection alive or not (or raise the error, or - an
    event - stall until it is set, then give a live one)."""
    opened = iter(alive)

    def opener(timeout: float) -> Connection:
        nxt = next(opened)
        if isinstance(nxt, BaseException):
            raise nxt
        if isinstance(nxt, threading.Event):  # an opening that stalls until the test sets the event
            nxt.wait(10.0)
            return Connection(clock, alive=True)
        return Connection(clock, alive=nxt)

    conn = SharedConnection(client=None, opener=opener)  # type: ignore[arg-type]

    def sender(self: SharedConnection, entity: str, timeout: float, may_connect: bool = True) -> Sender:
        return Sender(self.ensure(timeout, may_connect))

    monkeypatch.setattr(SharedConnection, "sender", sender)
    return conn


def sdk_send(answers: Callable[[Connection], bool]) -> Callable[[Any, float], str]:
    """The SDK's send: waits for the answer, reading the connection, until its timeout (the call's budget)."""

    def fn(sender: Sender, left: float) -> str:
        conn = sender.connection
        end = conn.clock.mono + left
        while conn.clock.mono < end:
            conn.listen()
            if answers(conn):
                return "sent"
        raise OperationTimeoutError(message="Send operation timed out")

    return fn


def live(conn: Connection) -> bool:
    return conn.alive


@pytest.mark.parametrize("budget", [0.25, 30.0], ids=["short call (interval 0)", "long call (interval 60)"])
def test_a_call_on_a_dead_connection_is_made_once_more_on_a_fresh_one(
    clock: FakeTime, monkeypatch: pytest.MonkeyPatch, budget: float
) -> None:
    conn = shared(clock, monkeypatch, [False, True])
    assert conn.on_link("q", sdk_send(live), budget, rescue=0.5) == "sent"
    assert conn.rescued == 1 and conn.dropped == 1
    # long: the fresh connection opens on a thread of its own (a few slices of the fake clock, load permitting)
    limit = budget + 0.5 if budget < QUIET else QUIET + PING_ANSWER + 2.0
    assert clock.mono <= limit, clock.mono


def test_a_stalled_entity_on_a_live_connection_times_out_and_keeps_the_connection(
    clock: FakeTime, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = shared(clock, monkeypatch, [True])
    first = None
    for budget in (0.25, 5.0):
        with pytest.raises(OperationTimeoutError):
            conn.on_link("q", sdk_send(lambda c: False), budget, rescue=0.5)
        first = first or conn.connection
        assert conn.connection is first and conn.rescued == 0 and conn.dropped == 0


def test_a_fresh_connection_that_fails_too_raises_its_own_error(
    clock: FakeTime, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = ConnectionRefusedError("refused")
    conn = shared(clock, monkeypatch, [False, refused])
    with pytest.raises(ConnectionRefusedError):
        conn.on_link("q", sdk_send(live), 0.25, rescue=0.5)
    assert conn.connection is None  # nothing left that answered: the namespace's evidence (nothing heard)
    assert conn.heard() is None


def test_a_fresh_connection_not_open_by_the_calls_deadline_is_not_waited_for(
    clock: FakeTime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A namespace that stalls every connection (before or after SASL): the spare opened beside the silent
    connection does not open either. The call then fails at its own deadline (and the verifying ping), not at the
    end of the rescue room: failover keeps to the interval (B3). The spare opens 1 s (real time) after the call
    reached its deadline (fake time, moved by the call's reads) - well within the 2 s room: waiting for it through
    the room would have sent on it."""
    stalls = threading.Event()
    conn = shared(clock, monkeypatch, [False, stalls])
    deadline = 3.0

    def open_a_second_after_the_deadline() -> None:
        while not stalls.is_set() and clock.mono < deadline:
            time.sleep(0.001)
        stalls.wait(1.0)
        stalls.set()

    threading.Thread(target=open_a_second_after_the_deadline, daemon=True).start()
    try:
        with pytest.raises(OperationTimeoutError):
            conn.on_link("q", sdk_send(live), deadline, rescue=2.0)
        assert conn.rescued == 1 and clock.mono <= deadline + VERIFY_WAIT + 2 * SLICE
    finally:
        stalls.set()


def test_a_direct_call_that_finds_its_connection_dead_hands_over_to_the_worker(
    clock: FakeTime, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = shared(clock, monkeypatch, [False])
    conn.ensure(1.0)
    with pytest.raises(FoundDead):
        conn.on_link("q", sdk_send(live), 0.25, may_connect=False, rescue=0.5)
    assert conn.connection is None and conn.rescued == 1


def test_without_rescue_room_nothing_is_watched(clock: FakeTime, monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls made without room (a probe's schedule and cancel) keep their verdicts as they were: no ping."""
    conn = shared(clock, monkeypatch, [False])
    with pytest.raises(OperationTimeoutError):
        conn.on_link("q", sdk_send(live), 3.0)
    dead = conn.connection
    assert dead is not None and dead.sessions == [] and conn.rescued == 0
