"""The syphon's receivers on one connection (:mod:`spark_sb.wire.receivers`, SPEC F2, F6, B11), without a network:
the SDK's receiver links and the pyamqp connection are stood in for, so that what the module decides is seen -
one connection for every (queue, sub-queue), a receiver reused while it is open and rebuilt when it is not, a
dead or silent connection dropped with every receiver on it, tokens renewed between calls, nothing left open."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from azure.servicebus._pyamqp.constants import ConnectionState

from spark_sb.config.namespace import NamespaceConfig
from spark_sb.config.secret import Secret
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.wire import opening, timing
from spark_sb.wire.lane import DeadlineExceeded, Lane
from spark_sb.wire.receivers import ReceiverLane, Receiving, SharedReceivers, receivers_lane

KEY = "ReceiversTestKey0123456789abcdef="
CONFIG = ServiceBusConfig(
    primary=NamespaceConfig(
        connection_string=Secret(
            f"Endpoint=sb://primary.invalid/;SharedAccessKeyName=k;SharedAccessKey={KEY}"
        ),
        namespace_name="primary",
    ),
    secondary=NamespaceConfig(
        connection_string=Secret(
            f"Endpoint=sb://secondary.invalid/;SharedAccessKeyName=k;SharedAccessKey={KEY}"
        )
    ),
    syphon_prefetch=7,
)


# ------------------------------------------------------------------------------------------------- fakes
class FakeSocket:
    def __init__(self) -> None:
        self.timeout: float | None = 1.0
        self.shut = False

    def gettimeout(self) -> float | None:
        return self.timeout

    def settimeout(self, value: float | None) -> None:
        self.timeout = value

    def shutdown(self, how: int) -> None:
        self.shut = True


class FakeTransport:
    def __init__(self) -> None:
        self.sock: FakeSocket | None = FakeSocket()
        self.closed = False

    def close(self) -> None:
        self.closed = True
        self.sock = None


class FakeConnection:
    """A pyamqp connection as the module looks at it: its state, when it last heard a frame, its socket."""

    def __init__(self, *, heard_ago: float = 0.1, listen_error: Exception | None = None) -> None:
        self.state = ConnectionState.OPENED
        self._last_frame_received_time = time.time() - heard_ago
        self._transport = FakeTransport()
        self.listen_error = listen_error
        self.listened = 0
        self.closed = False
        self.close_on_listen = False

    def listen(self, batch: int = 1) -> None:
        self.listened += 1
        if self.listen_error is not None:
            raise self.listen_error
        if self.close_on_listen:  # the namespace's close frame arrives
            self.state = ConnectionState.END

    def close(self) -> None:
        self.closed = True
        self.state = ConnectionState.END


class FakeCbs:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.renewed = 0

    def handle_token(self) -> None:
        self.renewed += 1
        if self.error is not None:
            raise self.error


class FakeHandler:
    def __init__(self, ready_after: int | None) -> None:
        self.ready_after = ready_after  # None: never attached
        self.pumps = 0
        self._shutdown = False
        self._cbs_authenticator = FakeCbs()

    def client_ready(self) -> bool:
        self.pumps += 1
        return self.ready_after is not None and self.pumps >= self.ready_after


class FakeSdkReceiver:
    def __init__(
        self, queue: str, dead_letter: bool, ready_after: int | None, close_error: bool = False
    ) -> None:
        self.queue = queue
        self.dead_letter = dead_letter
        self._handler: FakeHandler | None = FakeHandler(ready_after)
        self._running = False
        self.closed = 0
        self.close_error = close_error

    def _close_handler(self) -> None:
        self.closed += 1
        if self.close_error:
            raise ConnectionError("link already gone")
        self._running = False


class Receivers(SharedReceivers):
    """:class:`SharedReceivers` with the SDK's link opening stood in for (``_begin``); ``opens`` counts new
    connections, which ``opening.open_connection`` would make."""

    def __init__(self, ready_after: int | None = 2) -> None:
        super().__init__(CONFIG)
        self.ready_after = ready_after
        self.begun: list[FakeSdkReceiver] = []

    def _begin(self, queue: str, dead_letter: bool) -> Any:
        receiver = FakeSdkReceiver(queue, dead_letter, self.ready_after)
        self.begun.append(receiver)
        return receiver


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch) -> list[FakeConnection]:
    """Each connection the receivers open, in order (no network)."""
    opened: list[FakeConnection] = []

    def open_connection(client: Any, timeout: float) -> FakeConnection:
        opened.append(FakeConnection())
        return opened[-1]

    monkeypatch.setattr(opening, "open_connection", open_connection)
    return opened


# ------------------------------------------------------------------------------------------ the connection
def test_the_receivers_client_is_the_secondarys_without_sdk_retries() -> None:
    shared = SharedReceivers(CONFIG)
    try:
        assert shared.client.fully_qualified_namespace == "secondary.invalid"
        assert shared.client._config.retry_total == 0
        assert shared.prefetch == 7
        assert (shared.connection, shared.receivers, shared.opened) == (None, {}, 0)
    finally:
        shared.close()


def test_every_queue_and_dead_letter_queue_is_a_link_on_one_connection(
    connections: list[FakeConnection],
) -> None:
    shared = Receivers()
    got = {(q, dl): shared.receiver(q, dl, 5.0) for q in ("b/0", "b/1", "b/2") for dl in (False, True)}
    assert len(connections) == 1 and shared.opened == 1
    assert len({id(r) for r in got.values()}) == 6
    assert [(r.queue, r.dead_letter) for r in shared.begun] == list(got)
    assert all(r._running for r in shared.begun)  # type: ignore[attr-defined]


def test_an_open_receiver_is_reused(connections: list[FakeConnection]) -> None:
    shared = Receivers()
    first = shared.receiver("b/0", False, 5.0)
    assert shared.receiver("b/0", False, 5.0) is first
    assert len(shared.begun) == 1 and shared.opened == 1


@pytest.mark.parametrize("how", ["stopped", "handler shut down", "handler gone"])
def test_a_receiver_that_is_no_longer_open_is_closed_and_replaced(
    connections: list[FakeConnection], how: str
) -> None:
    shared = Receivers()
    first: Any = shared.receiver("b/0", False, 5.0)
    if how == "stopped":
        first._running = False
    elif how == "handler shut down":
        first._handler._shutdown = True
    else:
        first._handler = None
    second = shared.receiver("b/0", False, 5.0)
    assert second is not first and shared.receivers[("b/0", False)] is second
    assert first.closed == (0 if how == "handler gone" else 1)  # closed as the SDK closes it, when it can be
    assert shared.opened == 1  # the connection stays


@pytest.mark.parametrize("how", ["closed", "silent"])
def test_a_closed_or_silent_connection_is_replaced_with_every_receiver_on_it(
    connections: list[FakeConnection], how: str
) -> None:
    shared = Receivers()
    old = [shared.receiver("b/0", False, 5.0), shared.receiver("b/0", True, 5.0)]
    dead = connections[0]
    if how == "closed":
        dead.state = ConnectionState.END
    else:
        dead._last_frame_received_time = time.time() - timing.SILENT_AFTER - 1
    fresh = shared.receiver("b/0", False, 5.0)
    assert len(connections) == 2 and shared.opened == 2 and shared.connection is connections[1]
    assert fresh not in old
    assert all(r.closed == 1 for r in old)  # type: ignore[attr-defined]
    assert dead._transport.closed  # its socket too: no file descriptor left behind
    assert list(shared.receivers) == [("b/0", False)]  # the dead-letter receiver opens again on its next use


def test_a_receiver_not_attached_in_time_is_closed_and_not_kept(connections: list[FakeConnection]) -> None:
    shared = Receivers(ready_after=None)
    with pytest.raises(TimeoutError, match="'b/3' was not attached in time"):
        shared.receiver("b/3", False, 0.0)
    assert shared.receivers == {}
    assert shared.begun[0].closed == 1  # what it held is released at once
    assert shared.begun[0].dead_letter is False
    # the connection itself is fine: kept for the next try
    assert shared.connection is connections[0]


def test_attaching_pumps_the_shared_connection_until_the_link_is_ready(
    connections: list[FakeConnection],
) -> None:
    shared = Receivers(ready_after=3)
    shared.receiver("b/0", False, 5.0)
    handler = shared.begun[0]._handler
    assert handler is not None and handler.pumps == 3


# --------------------------------------------------------------------------------------------------- tend
def test_tending_without_a_connection_does_nothing() -> None:
    shared = Receivers()
    shared.tend()
    assert shared.connection is None and shared.opened == 0


def test_tending_reads_the_connection_with_short_reads_and_renews_every_token(
    connections: list[FakeConnection],
) -> None:
    shared = Receivers()
    receivers = [shared.receiver("b/0", False, 5.0), shared.receiver("b/1", False, 5.0)]
    conn = connections[0]
    sock = conn._transport.sock
    assert sock is not None
    seen: list[float | None] = []
    conn.listen = lambda batch=1: seen.append(sock.timeout)  # type: ignore[method-assign]
    shared.tend()
    assert seen == [timing.PUMP_READ_TIMEOUT]  # one short read, not a blocking one
    assert sock.timeout == 1.0  # the socket's own timeout back afterwards
    assert [r._handler._cbs_authenticator.renewed for r in receivers] == [1, 1]  # type: ignore[attr-defined]
    assert shared.connection is conn and len(shared.receivers) == 2


def test_a_token_that_cannot_be_renewed_drops_only_its_receiver(connections: list[FakeConnection]) -> None:
    shared = Receivers()
    bad: Any = shared.receiver("b/0", False, 5.0)
    good: Any = shared.receiver("b/1", False, 5.0)
    bad._handler._cbs_authenticator.error = RuntimeError("token refused")
    shared.tend()
    assert list(shared.receivers) == [("b/1", False)]
    assert bad.closed == 1 and good.closed == 0
    assert shared.connection is connections[0]


@pytest.mark.parametrize("how", ["closed before", "silent", "read fails", "closed by the namespace"])
def test_tending_drops_a_dead_connection(connections: list[FakeConnection], how: str) -> None:
    shared = Receivers()
    receiver: Any = shared.receiver("b/0", False, 5.0)
    conn = connections[0]
    if how == "closed before":
        conn.state = ConnectionState.CLOSE_RCVD
    elif how == "silent":
        conn._last_frame_received_time = time.time() - timing.SILENT_AFTER - 1
    elif how == "read fails":
        conn.listen_error = ConnectionResetError("reset by peer")
    else:
        conn.close_on_listen = True
    shared.tend()
    assert shared.connection is None and shared.receivers == {}
    assert receiver.closed == 1
    assert receiver._handler._cbs_authenticator.renewed == 0  # nothing renewed on a dead connection
    shared.receiver("b/0", False, 5.0)  # the next use opens a new one
    assert len(connections) == 2


# ------------------------------------------------------------------------------------ discard, unblock, close
def test_discarding_shuts_the_socket_down_and_closes_everything() -> None:
    shared = Receivers()
    conn = FakeConnection()
    shared.connection = conn
    shared.receivers = {("b/0", False): FakeSdkReceiver("b/0", False, 1)}  # type: ignore[dict-item]
    receiver: Any = shared.receivers[("b/0", False)]
    sock = conn._transport.sock
    shared.discard("a test")
    assert sock is not None and sock.shut
    assert conn.closed and conn._transport.closed
    assert receiver.closed == 1
    assert shared.connection is None and shared.receivers == {}
    shared.discard("again")  # nothing left: nothing happens


def test_unblocking_shuts_the_socket_down_and_never_raises() -> None:
    shared = Receivers()
    shared.unblock()  # no connection yet
    conn = FakeConnection()
    shared.connection = conn
    sock = conn._transport.sock
    shared.unblock()
    assert sock is not None and sock.shut
    assert shared.connection is conn and not conn.closed  # the lane's worker closes it, not this thread


def test_closing_releases_every_receiver_the_connection_and_the_client(
    connections: list[FakeConnection],
) -> None:
    shared = Receivers()
    receivers: list[Any] = [shared.receiver("b/0", False, 5.0), shared.receiver("b/0", True, 5.0)]
    receivers[1].close_error = True  # a link that fails to close is dropped all the same
    closed_client: list[bool] = []
    client_close = shared.client.close
    shared.client.close = lambda: (closed_client.append(True), client_close())  # type: ignore[method-assign]
    shared.close()
    assert [r.closed for r in receivers] == [1, 1]
    assert receivers[1]._running is False
    assert connections[0].closed and connections[0]._transport.closed
    assert shared.connection is None and shared.receivers == {}
    assert closed_client == [True]


def test_dropping_a_receiver_keeps_the_connection(connections: list[FakeConnection]) -> None:
    shared = Receivers()
    receiver: Any = shared.receiver("b/0", True, 5.0)
    shared.drop("b/0", True)
    shared.drop("b/9", False)  # never opened: nothing to do
    assert receiver.closed == 1 and shared.receivers == {}
    assert shared.connection is connections[0] and not connections[0].closed


# ------------------------------------------------------------------------------------------- ReceiverLane
class Context:
    """A receiver lane's context as :class:`ReceiverLane` uses it."""

    def __init__(self) -> None:
        self.client = object()
        self.asked: list[tuple[str, bool, float]] = []
        self.closed = threading.Event()

    def receiver(self, queue: str, dead_letter: bool, timeout: float) -> Any:
        self.asked.append((queue, dead_letter, timeout))
        return f"receiver of {queue}{' (dead letters)' if dead_letter else ''}"

    def close(self) -> None:
        self.closed.set()


def test_a_receiver_lane_runs_calls_with_its_own_receiver_within_the_deadline() -> None:
    contexts: list[Context] = []

    def build() -> Context:
        contexts.append(Context())
        return contexts[-1]

    lane: Lane[Any] = Lane("test-receivers", build, Context.close)
    try:
        main, dead = ReceiverLane(lane, "b/0", False), ReceiverLane(lane, "b/0", True)
        seen: list[Receiving] = []
        assert main.call(lambda r: (seen.append(r), r.receiver)[1], 5.0) == "receiver of b/0"
        assert dead.call(lambda r: r.receiver, 5.0) == "receiver of b/0 (dead letters)"
        assert len(contexts) == 1  # both on the one shared context
        assert seen[0].client is contexts[0].client
        (q1, dl1, left1), (q2, dl2, _) = contexts[0].asked
        assert (q1, dl1, q2, dl2) == ("b/0", False, "b/0", True)
        assert 0 < left1 <= 5.0  # what is left of the call's deadline
        with pytest.raises(KeyError):
            main.call(lambda r: {}["boom"], 5.0)  # a call's own error reaches the caller
    finally:
        lane.close()


def _context_lane(built: list[Context]) -> Lane[Any]:
    def build() -> Context:
        built.append(Context())
        return built[-1]

    return Lane("test-receivers", build, Context.close)


def test_resetting_one_receiver_lane_makes_every_held_message_stale_at_once() -> None:
    """The generation is the shared lane's: after a reset, messages received before on any queue cannot be
    settled (their locks belonged to the dropped connection) - at once, not only after the next call built a new
    connection (a settle in between would send their delivery ids down the new connection's links)."""
    built: list[Context] = []
    lane = _context_lane(built)
    try:
        a, b = ReceiverLane(lane, "b/0", False), ReceiverLane(lane, "b/1", False)
        a.call(lambda r: None, 5.0)
        held = a.generation
        assert b.generation == held
        a.reset("a test")
        assert a.generation != held and b.generation != held  # before any new call
        after_reset = b.generation
        b.call(lambda r: None, 5.0)
        assert a.generation == b.generation == after_reset  # what was reported is the new connection's
        assert len(built) == 2
        assert built[0].closed.wait(5.0)  # the old context is closed (in the background)
    finally:
        lane.close()


def test_a_call_abandoned_at_its_deadline_makes_held_messages_stale_at_once() -> None:
    built: list[Context] = []
    lane = _context_lane(built)
    stuck = threading.Event()
    try:
        a = ReceiverLane(lane, "b/0", False)
        a.call(lambda r: None, 5.0)
        held = a.generation
        with pytest.raises(DeadlineExceeded):
            a.call(lambda r: stuck.wait(5.0), 0.05)  # the connection stalls: its worker is abandoned
        assert a.generation != held
    finally:
        stuck.set()
        lane.close()


def test_before_the_first_call_the_generation_is_the_first_connections() -> None:
    built: list[Context] = []
    lane = _context_lane(built)
    try:
        a = ReceiverLane(lane, "b/0", False)
        first = a.generation
        a.call(lambda r: None, 5.0)
        assert a.generation == first and len(built) == 1
    finally:
        lane.close()


def test_the_syphons_receiver_lane_builds_its_connection_lazily_on_its_thread() -> None:
    lane = receivers_lane(CONFIG)
    try:
        assert lane.name == "syphon-receivers" and lane.context() is None  # nothing built, nothing opened
        ctx = lane.call(lambda c: c, 5.0)
        assert isinstance(ctx, SharedReceivers) and ctx.connection is None and ctx.opened == 0
        assert ctx.prefetch == 7
    finally:
        lane.close()
