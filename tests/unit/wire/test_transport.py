"""The transport's own decisions (:mod:`spark_sb.wire.transport`), without a namespace: what an SDK-backed batch
holds, how big a batch may be, when a target counts as connected, which failure closes the namespace's connection
and which only the entity's link (SPEC F1, F6, F7), and that a closed transport builds nothing. The lanes and
connections are stand-ins; sending over real links is covered by tests/integration."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessageBatch
from azure.servicebus import exceptions as sbe

from spark_sb.core.errors import CLIENT_CLOSED, LaneClosed, classify
from spark_sb.message.outbound import OutboundMessage
from spark_sb.message.packing import Encoded
from spark_sb.wire import sdk_transport as transport_module
from spark_sb.wire.lane import DeadlineExceeded, Finished, Withdrawn
from spark_sb.wire.pyamqp_state import LinkLimits
from spark_sb.wire.sdk_batch import SdkBatch
from spark_sb.wire.sdk_transport import SdkTransport
from spark_sb.wire.timing import CONNECTED_FRESH, HEARTBEAT, MIN_CALL_LEFT
from spark_sb.wire.transport import PRIMARY, SECONDARY, Target
from tests.unit.sender.rig import make_config

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
ORDERS = Target(PRIMARY, "orders")


class Conn:
    """A namespace's connection as the transport reads it: when it last heard anything, whether it is broken."""

    def __init__(self, heard: float | None = None, broken: bool = False) -> None:
        self._heard = heard
        self.broken = broken
        self.connection: object | None = object()

    def heard(self) -> float | None:
        return self._heard


class StandInLane:
    """A namespace's lane: live, its worker's generation, its connection; what was reset or closed."""

    def __init__(self, conn: Conn | None = None, generation: int = 1) -> None:
        self.live = True
        self.generation = generation
        self.conn = conn
        self.resets: list[str] = []
        self.closed = False

    def context(self, generation: int | None = None) -> Conn | None:
        return self.conn if generation in (None, self.generation) else None

    def reset(self, why: str = "reset", generation: int | None = None) -> bool:
        if generation not in (None, self.generation):
            return False
        self.resets.append(why)
        return True

    def close(self) -> None:
        self.closed = True
        self.live = False


def transport_with(lane: StandInLane, namespace: str = PRIMARY, **overrides: Any) -> SdkTransport:
    t = SdkTransport(make_config(**overrides))
    t._lanes[namespace] = lane  # type: ignore[assignment]
    if lane.conn is not None:
        t._last[namespace] = lane.conn  # type: ignore[assignment]
    return t


MB = 1024 * 1024


def answered(t: SdkTransport, target: Target, value: object = None, generation: int = 1) -> None:
    """A call to ``target`` that the namespace answered (on the lane's worker ``generation``)."""
    t._settled(target, Finished(value, None, generation, time.monotonic()))


def failed(t: SdkTransport, target: Target, exc: BaseException) -> None:
    with pytest.raises(type(exc)):
        t._settled(target, Finished(None, exc, 1, time.monotonic()))


# ------------------------------------------------------------------------------------------------------ batches


def test_a_target_reads_as_namespace_and_entity() -> None:
    assert str(Target(SECONDARY, "q/0")) == "secondary:q/0"
    assert Target(PRIMARY, "orders") == ORDERS and hash(Target(PRIMARY, "orders")) == hash(ORDERS)


def test_a_batch_keeps_what_fits_in_order_and_refuses_the_rest_unchanged() -> None:
    batch = SdkBatch(ORDERS, ServiceBusMessageBatch(max_size_in_bytes=1200))
    added = [OutboundMessage(body=b"x" * 300, message_id=str(i)) for i in range(5)]
    fits = [batch.try_add(m) for m in added]
    assert fits[:2] == [True, True] and not all(fits)
    kept = fits.index(False)
    assert batch.messages == added[:kept] and list(batch) == added[:kept] and len(batch) == kept
    size = batch.size_in_bytes
    assert not batch.try_add(OutboundMessage(body=b"x" * 900))
    assert batch.size_in_bytes == size and len(batch) == kept and 0 < size <= 1200


def test_a_backlog_translation_made_ahead_is_added_and_counted_but_not_kept_as_an_original() -> None:
    t = SdkTransport(make_config())
    original = OutboundMessage(body=b"a", message_id="1", properties={"k": 1})
    prepared = t.prepare_backlog(original, "orders", NOW)
    assert isinstance(prepared, Encoded)
    batch = t.new_batch(Target(SECONDARY, "q"))
    assert batch.try_add_backlog(original, "orders", NOW, prepared)
    assert batch.try_add_backlog(original, "orders", NOW)  # translated here
    assert len(batch) == 2 and batch.messages == []  # the caller keeps the originals
    assert batch.sdk_batch.size_in_bytes > 0


def test_a_batch_is_bounded_by_the_configured_size_until_the_link_says_less() -> None:
    t = transport_with(StandInLane(Conn()), max_message_size=100_000)
    assert t.max_batch_size(ORDERS) == 100_000
    assert t.new_batch(ORDERS).sdk_batch.max_size_in_bytes == 100_000
    answered(t, ORDERS, value=LinkLimits(262_144, 262_144))  # the link allows more: the configured size holds
    assert t.max_batch_size(ORDERS) == 100_000
    answered(t, ORDERS, value=LinkLimits(50_000, 50_000))
    assert t.max_batch_size(ORDERS) == 50_000 and t.max_message_size(ORDERS) == 50_000
    assert t.max_batch_size(Target(PRIMARY, "other")) == 100_000  # per target
    answered(t, ORDERS, value=None)  # no size known (another call's answer): the last one stays
    answered(t, ORDERS, value=[7])
    assert t.max_batch_size(ORDERS) == 50_000


def test_premium_links_bound_a_batch_at_their_batch_limit_and_one_message_at_their_message_limit() -> None:
    """SPEC B13: max_message_size 20 MB; before the link says, batches stay within the service's largest (1 MB) and
    one message may weigh the configured size; then the link's own limits (1 MB batches, 5 MB messages)."""
    t = transport_with(StandInLane(Conn()), max_message_size=20 * MB)
    assert t.max_batch_size(ORDERS) == MB and t.max_message_size(ORDERS) == 20 * MB
    answered(t, ORDERS, value=LinkLimits(MB, 5 * MB))
    assert t.max_batch_size(ORDERS) == MB and t.max_message_size(ORDERS) == 5 * MB
    batch = t.new_batch(ORDERS)
    assert batch.sdk_batch.max_size_in_bytes == MB


def test_a_message_over_the_batch_limit_goes_alone_as_the_sdk_sends_one_message() -> None:
    from azure.servicebus import ServiceBusMessage, ServiceBusMessageBatch

    big = OutboundMessage(body=b"b" * (2 * MB), message_id="big")
    small = OutboundMessage(body=b"s" * 100, message_id="small")
    batch = SdkBatch(ORDERS, ServiceBusMessageBatch(max_size_in_bytes=MB), 5 * MB)
    assert batch.try_add(small)
    assert not batch.try_add(big)  # not beside another: the open batch goes first
    alone = SdkBatch(ORDERS, ServiceBusMessageBatch(max_size_in_bytes=MB), 5 * MB)
    assert alone.try_add(big) and len(alone) == 1 and alone.messages == [big]
    assert isinstance(alone.payload, ServiceBusMessage) and alone.payload.message_id == "big"
    assert 2 * MB < alone.size_in_bytes < 2 * MB + 1024
    assert not alone.try_add(small)  # nothing more beside it
    assert not alone.try_add_backlog(small, "orders", NOW)
    backlog = SdkBatch(ORDERS, ServiceBusMessageBatch(max_size_in_bytes=MB), 5 * MB)
    assert backlog.try_add_backlog(big, "orders", NOW) and len(backlog) == 1
    sent = backlog.payload
    assert isinstance(sent, ServiceBusMessage) and sent.application_properties is not None
    assert len(sent.application_properties) == 2  # the backlog form's destination and time
    over = OutboundMessage(body=b"o" * (5 * MB + 1), message_id="over")
    assert not SdkBatch(ORDERS, ServiceBusMessageBatch(max_size_in_bytes=MB), 5 * MB).try_add(over)
    standard = SdkBatch(ORDERS, ServiceBusMessageBatch(max_size_in_bytes=MB), MB)  # no room over a batch
    assert not standard.try_add(big) and standard.payload is standard.sdk_batch


# ---------------------------------------------------------------------------------------------------- connected


def test_a_target_is_connected_after_an_answer_on_its_current_client() -> None:
    lane = StandInLane(Conn())
    t = transport_with(lane)
    assert not t.connected(ORDERS)
    answered(t, ORDERS)
    assert t.connected(ORDERS)
    assert not t.connected(Target(PRIMARY, "other"))
    lane.generation = 2  # the client was replaced since
    assert not t.connected(ORDERS)
    lane.generation = 1
    lane.live = False
    assert not t.connected(ORDERS)


def test_an_answer_older_than_the_freshness_window_does_not_count() -> None:
    t = transport_with(StandInLane(Conn()))
    t._answered[ORDERS] = (1, time.monotonic() - CONNECTED_FRESH - 1.0)
    assert not t.connected(ORDERS)
    t._answered[ORDERS] = (1, time.monotonic() - CONNECTED_FRESH + 5.0)
    assert t.connected(ORDERS)


def test_a_failed_call_leaves_its_target_unconnected() -> None:
    t = transport_with(StandInLane(Conn(heard=time.time())))
    answered(t, ORDERS)
    failed(t, ORDERS, sbe.MessagingEntityNotFoundError(message="no such entity"))
    assert not t.connected(ORDERS)


def test_the_namespace_answered_within_reads_its_connections_last_frame() -> None:
    t = transport_with(StandInLane(Conn(heard=time.time() - 3.0)))
    assert t.answered_within(ORDERS, 5.0)
    assert not t.answered_within(ORDERS, 1.0)
    assert not t.answered_within(Target(SECONDARY, "q"), 60.0)  # no connection there
    t._last[PRIMARY] = Conn(heard=None)  # type: ignore[assignment]
    assert not t.answered_within(ORDERS, 60.0)


# ----------------------------------------------------------------------------------------- what a failure closes


def test_a_connection_error_closes_the_namespaces_connection() -> None:
    lane = StandInLane(Conn(heard=time.time()))
    t = transport_with(lane)
    failed(t, ORDERS, sbe.ServiceBusConnectionError(message="connection lost"))
    assert lane.resets == ["faulted"]


@pytest.mark.parametrize(
    "exc",
    [
        sbe.MessagingEntityNotFoundError(message="no such entity"),  # the entity's, not the client's
        sbe.MessageSizeExceededError(message="too large"),
    ],
)
def test_an_error_that_needs_no_new_client_keeps_the_connection(exc: BaseException) -> None:
    lane = StandInLane(Conn(heard=None))
    t = transport_with(lane)
    failed(t, ORDERS, exc)
    assert lane.resets == []


def test_a_link_level_error_keeps_the_connection() -> None:
    exc = sbe.ServiceBusConnectionError(message="link detached")
    exc.condition = "amqp:link:detach-forced"  # type: ignore[attr-defined]
    lane = StandInLane(Conn(heard=None))
    t = transport_with(lane)
    failed(t, ORDERS, exc)
    assert lane.resets == []


def test_a_timeout_while_the_connection_kept_answering_is_the_entitys_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    aborted: list[object] = []
    monkeypatch.setattr(transport_module, "abort_connection", aborted.append)
    lane = StandInLane(Conn(heard=time.time() - HEARTBEAT / 2 + 0.25))  # heard within a heartbeat
    t = transport_with(lane)
    failed(t, ORDERS, DeadlineExceeded("no answer"))
    assert lane.resets == [] and aborted == []


def test_a_timeout_on_a_silent_connection_aborts_and_rebuilds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    aborted: list[object] = []
    monkeypatch.setattr(transport_module, "abort_connection", aborted.append)
    conn = Conn(heard=time.time() - HEARTBEAT / 2 - 1.0)  # silent past the namespace's heartbeat and a margin
    lane = StandInLane(conn)
    t = transport_with(lane)
    failed(t, ORDERS, sbe.OperationTimeoutError(message="timed out"))
    assert lane.resets == ["faulted"]
    assert aborted == [conn.connection]  # reset, so that nothing left on it lands later


@pytest.mark.parametrize(
    "exc",
    [
        LaneClosed("the lane's worker was retired before the call started"),
        ValueError(
            "The handler has already been shutdown. Please use ServiceBusClient to create a new instance."
        ),
    ],
    ids=["lane-closed", "sdk-handler-shut-down"],
)
def test_a_call_that_met_a_client_closed_on_our_side_closes_nothing(
    monkeypatch: pytest.MonkeyPatch, exc: BaseException
) -> None:
    # closing is never evidence (SPEC F7): another call's reset or abandonment already decided, and a reset here
    # would close the connection built since (ten probes queued on the isolated connection each closed the next)
    aborted: list[object] = []
    monkeypatch.setattr(transport_module, "abort_connection", aborted.append)
    lane = StandInLane(Conn(heard=time.time() - HEARTBEAT))  # even on a connection silent for a while
    t = transport_with(lane)
    assert classify(exc) is CLIENT_CLOSED
    failed(t, ORDERS, exc)
    assert lane.resets == [] and aborted == []


def test_a_call_withdrawn_unstarted_from_a_busy_lane_closes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    aborted: list[object] = []
    monkeypatch.setattr(transport_module, "abort_connection", aborted.append)
    lane = StandInLane(Conn(heard=time.time() - HEARTBEAT / 2 - 1.0))  # silent: a timeout would rebuild it
    t = transport_with(lane)
    failed(t, ORDERS, Withdrawn("waited 1.50 s behind other calls and never started"))
    assert lane.resets == [] and aborted == []


def test_a_call_whose_turn_comes_with_too_little_of_its_deadline_left_is_not_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[float] = []
    clock = {"now": 1000.0}

    class Clock:
        """The transport's ``time``: monotonic time moves only when the lane's queue holds a call."""

        @staticmethod
        def monotonic() -> float:
            return clock["now"]

        @staticmethod
        def time() -> float:
            return time.time()

    class RealConn(Conn):
        def on_link(self, entity: str, fn: Any, timeout: float) -> Any:
            return fn(None, timeout)

    class QueueingLane(StandInLane):
        """Runs the call after ``waited`` seconds in the queue (as a worker busy with other calls would)."""

        waited = 0.0

        def start(self, fn: Any, timeout: float, **_: Any) -> Finished[Any]:
            clock["now"] += self.waited
            try:
                return Finished(fn(self.conn), None, self.generation, clock["now"])
            except Exception as exc:
                return Finished(None, exc, self.generation, clock["now"])

    monkeypatch.setattr(transport_module, "time", Clock)
    lane = QueueingLane(RealConn(heard=time.time()))
    t = transport_with(lane)
    assert t._call(ORDERS, lambda sender, left: ran.append(left) or 7, 1.0) == 7
    assert ran == [1.0]
    lane.waited = 0.3  # its turn came with 0.1 s of 0.4 s left: the SDK could not answer in time
    with pytest.raises(Withdrawn, match="left when its turn came"):
        t._call(ORDERS, lambda sender, left: ran.append(left), 0.4)
    assert ran == [1.0] and lane.resets == []
    lane.waited = 0.1  # 0.3 s of 0.4 s left: made, with what is left of the deadline (not all 0.4 s)
    t._call(ORDERS, lambda sender, left: ran.append(left), 0.4)
    assert ran == [1.0, pytest.approx(0.3)]
    assert MIN_CALL_LEFT < 0.3


def test_a_connection_error_on_a_lane_already_gone_closes_nothing() -> None:
    lane = StandInLane(Conn())
    lane.live = False
    t = transport_with(lane)
    failed(t, ORDERS, sbe.ServiceBusConnectionError(message="connection lost"))
    assert lane.resets == []


def test_a_fault_closes_the_connection_only_when_it_is_broken() -> None:
    healthy = StandInLane(Conn(heard=time.time()))
    t = transport_with(healthy)
    t.fault(ORDERS)
    assert healthy.resets == []  # only the link failed: the other entities keep the connection
    healthy.conn.broken = True  # type: ignore[union-attr]
    t.fault(ORDERS)
    assert healthy.resets == ["faulted"]
    gone = StandInLane(None)
    t2 = transport_with(gone)
    t2.fault(ORDERS)
    assert gone.resets == ["faulted"]  # no connection at all
    t2.fault(Target(SECONDARY, "q"))  # no lane there: nothing to do


def test_closing_one_namespace_closes_its_partner_too() -> None:
    primary, secondary = StandInLane(Conn()), StandInLane(Conn())
    t = transport_with(primary)
    t._lanes[SECONDARY] = secondary  # type: ignore[assignment]
    probes = t.isolated()
    isolated_lane = StandInLane(Conn())
    probes._lanes[PRIMARY] = isolated_lane  # type: ignore[assignment]
    t.close_namespace(PRIMARY)
    assert primary.resets == ["reset"] and secondary.resets == ["reset"] and isolated_lane.resets == ["reset"]


# ----------------------------------------------------------------------------------------- isolation and closing


def test_the_isolated_transport_is_built_once_and_is_its_own_isolated_transport() -> None:
    t = SdkTransport(make_config())
    probes = t.isolated()
    assert probes is not t and t.isolated() is probes
    assert probes.isolated() is probes
    assert probes._config is t._config


def test_a_closed_transport_builds_nothing_and_closes_its_isolated_one() -> None:
    lane = StandInLane(Conn())
    t = transport_with(lane)
    probes = t.isolated()
    t.close()
    assert lane.closed and probes._closed
    with pytest.raises(LaneClosed):
        t.isolated()
    with pytest.raises(LaneClosed):
        t.warm(Target(SECONDARY, "q"))  # would build the secondary's lane
    assert not t.is_open(SECONDARY) and SECONDARY not in t._lanes


def test_an_unknown_namespace_or_a_missing_secondary_is_refused_before_any_client() -> None:
    t = SdkTransport(make_config())
    with pytest.raises(ValueError, match="unknown namespace 'tertiary'"):
        t.warm(Target("tertiary", "q"))
    alone = SdkTransport(make_config(secondary=None))
    with pytest.raises(ValueError, match="no secondary namespace"):
        alone.warm(Target(SECONDARY, "q"))
    assert t._lanes == {} and alone._lanes == {}


def test_an_empty_batch_is_sent_without_opening_anything() -> None:
    t = SdkTransport(make_config())
    t.send(t.new_batch(ORDERS), timeout=1.0)
    assert t._lanes == {} and not t.is_open(PRIMARY)


def test_a_new_transport_has_no_connection_and_says_so() -> None:
    t = SdkTransport(make_config())
    assert t.lifecycle(PRIMARY) == {"connections": 0, "dropped": 0, "detached": 0, "renewed": 0, "rescued": 0}
    assert not t.is_open(PRIMARY) and not t.connected(ORDERS)
    assert repr(t) == "SdkTransport(open=[])"
    t._lanes[PRIMARY] = StandInLane(Conn())  # type: ignore[assignment]
    assert t.is_open(PRIMARY) and repr(t) == "SdkTransport(open=['primary'])"


def test_a_send_that_fails_once_handed_to_the_sdk_is_marked_written_one_that_never_got_there_is_not() -> None:
    """SPEC B14: what the sender calls an ambiguous attempt - the batch reached the SDK's send on an open link (or
    was parked on it) and no verdict came - is told by the mark the transport puts on the error."""
    from spark_sb.core.errors import is_ambiguous
    from spark_sb.wire.parking import Parked

    t = SdkTransport(make_config())
    batch = t.new_batch(ORDERS)
    assert batch.try_add(OutboundMessage(body=b"x", message_id="m"))

    class Sender:
        def send_messages(self, payload: Any, timeout: float) -> None:
            raise sbe.OperationTimeoutError(message="no disposition came")

    def written(target: Target, on_link: Any, *args: Any, **kwargs: Any) -> None:
        on_link(Sender(), 5.0)

    def refused(target: Target, on_link: Any, *args: Any, **kwargs: Any) -> None:
        raise sbe.ServiceBusConnectionError(message="connection refused")

    for on_link, ambiguous in ((written, True), (refused, False)):
        t._on_link = on_link  # type: ignore[method-assign]
        with pytest.raises(sbe.ServiceBusError) as caught:
            t.send(batch, 5.0)
        assert is_ambiguous(caught.value) is ambiguous
    t._on_link = refused  # type: ignore[method-assign]
    with pytest.raises(sbe.ServiceBusConnectionError) as caught:  # a parked batch was on the wire already
        t.resume(Parked(ORDERS, time.monotonic(), time.monotonic() + 5.0, (None, None)))
    assert is_ambiguous(caught.value)
