"""The transport's side of lane hand-offs (SPEC F10): every call path refuses to start with less than its
minimum of deadline left, and a failure resets only the connection the call used, never a newer one another
call built since. The lanes and connections are stand-ins; the transport's clock is a fake one."""

from __future__ import annotations

import time
from typing import Any

import pytest

from spark_sb.message.outbound import OutboundMessage
from spark_sb.wire import sdk_transport as transport_module
from spark_sb.wire.lane import Finished, Withdrawn
from spark_sb.wire.parking import Parked
from spark_sb.wire.sdk_transport import SdkTransport
from spark_sb.wire.timing import MIN_CALL_LEFT, RESUME_AT_LEAST
from spark_sb.wire.transport import PRIMARY, Target
from tests.unit.sender.rig import make_config

ORDERS = Target(PRIMARY, "orders")


class Clock:
    """The transport's ``time``: monotonic time moves only when a stand-in lane says a call waited."""

    now = 1000.0

    @classmethod
    def monotonic(cls) -> float:
        return cls.now

    @staticmethod
    def time() -> float:
        return time.time()


class Sender:
    def __init__(self) -> None:
        self.sent: list[float] = []

    def send_messages(self, payload: Any, timeout: float) -> None:
        self.sent.append(timeout)


class Conn:
    """An open, answering connection: ``on_link`` runs the call on its one sender."""

    def __init__(self) -> None:
        self.sender = Sender()
        self.broken = False
        self.connection: object | None = object()
        self.calls: list[float] = []

    def heard(self) -> float:
        return time.time()

    def on_link(self, entity: str, fn: Any, timeout: float, **_: Any) -> Any:
        self.calls.append(timeout)
        return fn(self.sender, timeout)


class QueueingLane:
    """A namespace's lane whose worker is busy: no direct call; a started call gets its turn ``waited`` seconds
    later (the clock moves), then runs on the connection."""

    def __init__(self, conn: Conn, direct_ok: bool = False) -> None:
        self.conn = conn
        self.live = True
        self.generation = 1
        self.waited = 0.0
        self.direct_ok = direct_ok
        self.resets: list[str] = []

    def context(self) -> Conn:
        return self.conn

    def direct(self, fn: Any, timeout: float, **_: Any) -> Finished[Any] | None:
        if not self.direct_ok:
            return None
        return self._run(fn)

    def start(self, fn: Any, timeout: float, **_: Any) -> Finished[Any]:
        Clock.now += self.waited
        return self._run(fn)

    def _run(self, fn: Any) -> Finished[Any]:
        started = Clock.now
        try:
            return Finished(fn(self.conn), None, self.generation, started)
        except Exception as exc:
            return Finished(None, exc, self.generation, started)

    def reset(self, why: str = "reset", generation: int | None = None) -> None:
        self.resets.append(why)


@pytest.fixture
def rig(monkeypatch: pytest.MonkeyPatch) -> tuple[SdkTransport, QueueingLane]:
    monkeypatch.setattr(transport_module, "time", Clock)
    lane = QueueingLane(Conn())
    t = SdkTransport(make_config())
    t._lanes[PRIMARY] = lane  # type: ignore[assignment]
    t._last[PRIMARY] = lane.conn  # type: ignore[assignment]
    return t, lane


def one_message_batch(t: SdkTransport) -> Any:
    batch = t.new_batch(ORDERS)
    assert batch.try_add(OutboundMessage(body=b"x", message_id="1"))
    return batch


def test_a_send_whose_turn_on_the_worker_comes_with_too_little_of_its_deadline_left_is_not_started(
    rig: tuple[SdkTransport, QueueingLane],
) -> None:
    # issue 47 item 5: _call refused such a call, _on_link (send, resume) did not: the SDK got the few
    # milliseconds left and the call cost its link (an SDK timeout) or overran the lane's deadline
    t, lane = rig
    lane.waited = 0.3  # its turn came with 0.1 s of 0.4 s left
    with pytest.raises(Withdrawn, match="left when its turn came"):
        t.send(one_message_batch(t), 0.4)
    assert lane.conn.calls == [] and lane.conn.sender.sent == [] and lane.resets == []
    lane.waited = 0.1  # 0.3 s of 0.4 s left: made, with what is left of the deadline
    t.send(one_message_batch(t), 0.4)
    assert lane.conn.calls == [pytest.approx(0.3)] and len(lane.conn.sender.sent) == 1
    assert MIN_CALL_LEFT < 0.3


def test_a_send_with_less_than_the_minimum_is_not_started_on_the_calling_thread_either(
    rig: tuple[SdkTransport, QueueingLane],
) -> None:
    t, lane = rig
    lane.direct_ok = True
    t._answered[ORDERS] = (lane.generation, Clock.now)  # connected: the send would run on this thread
    with pytest.raises(Withdrawn, match="not started"):
        t.send(one_message_batch(t), MIN_CALL_LEFT / 2)
    assert lane.conn.calls == []
    t.send(one_message_batch(t), 0.5)
    assert lane.conn.calls == [0.5] and t.direct_sends == 1


def test_a_parked_send_is_resumed_even_past_its_deadline_it_is_no_new_call(
    rig: tuple[SdkTransport, QueueingLane],
) -> None:
    # a resume finishes a send already on the wire (its answer may be waiting): its minimum is RESUME_AT_LEAST
    t, lane = rig
    ticket = type("Ticket", (), {"handler": object()})()  # a link since replaced
    parked = Parked(ORDERS, Clock.now - 2.0, Clock.now - 0.1, (ticket, b"payload"))
    t.resume(parked)
    assert lane.conn.calls == [
        pytest.approx(RESUME_AT_LEAST)
    ]  # the link no longer holds it: sent once more, within that


# ------------------------------------------------------------- a failure resets the connection it met, no other


class GenerationLane(QueueingLane):
    """A lane whose worker (and connection) may be newer than the one a failed call used: a reset or a read of the
    context for a generation other than the current one does nothing."""

    def context(self, generation: int | None = None) -> Conn | None:  # type: ignore[override]
        return self.conn if generation in (None, self.generation) else None

    def reset(self, why: str = "reset", generation: int | None = None) -> bool:  # type: ignore[override]
        if generation not in (None, self.generation):
            return False
        self.resets.append(why)
        return True


@pytest.mark.parametrize(
    "exc",
    [ConnectionResetError("socket shut down"), TimeoutError("no answer")],
    ids=["connection-error", "timeout-on-a-silent-connection"],
)
def test_a_failure_on_an_older_connection_leaves_the_newer_one_alone(
    monkeypatch: pytest.MonkeyPatch, exc: BaseException
) -> None:
    # issue 47's suspicion, proven: a call failed on the lane's worker 1 (abandoned at its deadline, say); before
    # its caller came to _failed, another call (a probe on the same lane) built worker 2 and its connection -
    # not heard from yet. _failed reset "the lane", which by then was worker 2: its connection aborted and closed
    aborted: list[object] = []
    monkeypatch.setattr(transport_module, "abort_connection", aborted.append)
    conn = Conn()
    conn.heard = lambda: None  # type: ignore[method-assign]  # the new connection, nothing heard on it yet
    lane = GenerationLane(conn)
    lane.generation = 2
    t = SdkTransport(make_config())
    t._lanes[PRIMARY] = lane  # type: ignore[assignment]
    t._last[PRIMARY] = conn  # type: ignore[assignment]
    with pytest.raises(type(exc)):
        t._settled(ORDERS, Finished(None, exc, 1, time.monotonic()))
    assert lane.resets == [] and aborted == []
    # the same failure on the connection the call used closes it (as before)
    with pytest.raises(type(exc)):
        t._settled(ORDERS, Finished(None, exc, 2, time.monotonic()))
    assert lane.resets == ["faulted"]
    assert aborted == ([conn.connection] if isinstance(exc, TimeoutError) else [])
