"""The syphon's backlog side (:mod:`spark_sb.syphon.receivers`, SPEC B11): settling held messages in one lane call
within a deadline - never raising, counting what could not be settled so that redelivery is expected - and reading
received messages (destination, ids, dead-letter properties)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceivedMessage
from azure.servicebus._common.utils import transform_outbound_messages
from azure.servicebus._pyamqp.constants import LinkState
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport

from spark_sb.message.backlog import to_backlog
from spark_sb.message.outbound import OutboundMessage
from spark_sb.syphon.receivers import (
    Held,
    abandon,
    as_utc,
    complete,
    complete_on_link,
    dead_letter_action,
    from_received,
    path_of,
    settle,
    text_of,
)
from spark_sb.syphon.rules import DEAD_LETTER_PROPERTIES, SyphonOutcome
from spark_sb.wire.lane import DeadlineExceeded, Lane
from spark_sb.wire.receivers import ReceiverLane, Receiving

T0 = datetime(2026, 6, 1, 8, 0, tzinfo=timezone.utc)


# ------------------------------------------------------------------------------------------------- fakes
class FakeMessage:
    def __init__(self, token: str, delivery_id: int | None = None) -> None:
        self.lock_token = token
        self._settled = False
        self._delivery_id = delivery_id
        self._delivery_tag = token.encode()


class FakeReceiver:
    """Records each settle; ``fail`` lists lock tokens whose settle raises."""

    def __init__(self, fail: tuple[str, ...] = ()) -> None:
        self.fail = fail
        self.calls: list[tuple[str, str]] = []
        self.dead_lettered: list[tuple[str, str, str]] = []

    def _settle(self, what: str, msg: FakeMessage) -> None:
        if msg.lock_token in self.fail:
            raise ConnectionError("lock lost")
        self.calls.append((what, msg.lock_token))

    def complete_message(self, msg: FakeMessage) -> None:
        self._settle("complete", msg)

    def abandon_message(self, msg: FakeMessage) -> None:
        self._settle("abandon", msg)

    def dead_letter_message(self, msg: FakeMessage, *, reason: str, error_description: str) -> None:
        self._settle("dead_letter", msg)
        self.dead_lettered.append((msg.lock_token, reason, error_description))


ACCEPTED: dict[str, Any] = {"accepted": []}
LOCK_LOST: dict[str, Any] = {
    "rejected": [[b"com.microsoft:message-lock-lost", b"The lock supplied is invalid."]]
}


class FakeLink:
    """The SDK's pyamqp receive link as :func:`complete_on_link` uses it: dispositions are recorded, and each
    ``listen`` of its connection answers every delivery sent so far with the outcome ``answers`` gives its
    delivery id (accepted by default; ``None``: never answered). ``unknown`` tags are not this link's deliveries;
    ``tags``: the link's record of the tags it received, from which a disposition removes its tag, as the SDK's
    does (None: a link without one)."""

    def __init__(
        self,
        answers: dict[int, dict[str, Any] | None] | None = None,
        unknown: tuple[bytes, ...] = (),
        tags: set[bytes] | None = None,
    ) -> None:
        self.answers = answers or {}
        self.unknown = unknown
        self.tags = tags
        if tags is not None:
            self._received_delivery_tags = tags
        self._pending_dispositions: dict[int, dict[str, Any]] = {}
        self._is_closed = False
        self.state = LinkState.ATTACHED
        self.sent: list[tuple[int, int | None, bytes, bool | None, str]] = []
        self.listens = 0
        self._unanswered: list[int] = []
        self._session = self
        self._connection = self

    def _outgoing_disposition(
        self, first: int, last: int | None, tag: bytes, settled: bool | None, state: Any, batchable: Any
    ) -> None:
        if tag in self.unknown or (self.tags is not None and tag not in self.tags):
            raise ValueError("Delivery tag not found.")
        if self.tags is not None:
            self.tags.remove(tag)
        self.sent.append((first, last, tag, settled, type(state).__name__))
        self._unanswered.extend(range(first, (last if last is not None else first) + 1))

    def listen(self, wait: bool = False, batch: int = 1) -> None:
        self.listens += 1
        for delivery_id in self._unanswered:
            answer = self.answers.get(delivery_id, ACCEPTED)
            if answer is not None:
                self._pending_dispositions[delivery_id] = {"settled": True, "outcome": answer}
        self._unanswered = []


class LinkReceiver(FakeReceiver):
    """A receiver whose handler has a (fake) pyamqp receive link."""

    def __init__(self, link: FakeLink, fail: tuple[str, ...] = ()) -> None:
        super().__init__(fail)
        self._handler = type("Handler", (), {"_link": link})()


class FakeLane:
    """A receiver lane: its generation, and calls run with the receiver (``error``: the call itself fails)."""

    def __init__(self, receiver: FakeReceiver, generation: int = 3, error: Exception | None = None) -> None:
        self.receiver = receiver
        self.generation = generation
        self.error = error
        self.calls: list[float] = []

    def call(self, fn: Callable[[Receiving], Any], timeout: float) -> Any:
        self.calls.append(timeout)
        if self.error is not None:
            raise self.error
        return fn(Receiving(object(), self.receiver))  # type: ignore[arg-type]


def held(*tokens: str, generation: int = 3) -> list[Held]:
    return [Held(FakeMessage(t, i), generation) for i, t in enumerate(tokens)]  # type: ignore[arg-type]


def do_settle(lane: FakeLane, items: list[Held], action: Any, timeout: float = 30.0) -> SyphonOutcome:
    outcome = SyphonOutcome()
    settle(lane, items, action, outcome, timeout)  # type: ignore[arg-type]
    return outcome


# ------------------------------------------------------------------------------------------------- settle
def test_settling_nothing_makes_no_call() -> None:
    lane = FakeLane(FakeReceiver())
    assert do_settle(lane, [], abandon).settle_failures == 0
    assert lane.calls == []


def test_held_messages_are_settled_in_one_lane_call_within_the_deadline() -> None:
    receiver = FakeReceiver()
    lane = FakeLane(receiver)
    outcome = do_settle(lane, held("a", "b", "c"), abandon, timeout=12.5)
    assert lane.calls == [12.5]
    assert receiver.calls == [("abandon", "a"), ("abandon", "b"), ("abandon", "c")]
    assert outcome.settle_failures == 0


def test_messages_from_a_replaced_receiver_are_counted_not_settled() -> None:
    """Their locks belong to a connection that is gone: settling them cannot work; they are redelivered."""
    receiver = FakeReceiver()
    lane = FakeLane(receiver, generation=4)
    items = held("old1", "old2", generation=3) + held("new", generation=4)
    outcome = do_settle(lane, items, abandon)
    assert receiver.calls == [("abandon", "new")]
    assert outcome.settle_failures == 2


def test_when_every_message_is_stale_the_lane_is_not_called() -> None:
    lane = FakeLane(FakeReceiver(), generation=9)
    outcome = do_settle(lane, held("a", "b", generation=8), complete)
    assert lane.calls == [] and outcome.settle_failures == 2


def test_a_settle_that_fails_is_counted_and_the_others_are_still_settled() -> None:
    receiver = FakeReceiver(fail=("b",))
    outcome = do_settle(FakeLane(receiver), held("a", "b", "c"), abandon)
    assert receiver.calls == [("abandon", "a"), ("abandon", "c")]
    assert outcome.settle_failures == 1


@pytest.mark.parametrize(
    "error", [DeadlineExceeded("deadline"), ConnectionError("closed"), RuntimeError("x")]
)
def test_a_lane_call_that_fails_counts_every_live_message_and_never_raises(error: Exception) -> None:
    lane = FakeLane(FakeReceiver(), generation=2, error=error)
    items = held("a", "b", generation=2) + held("stale", generation=1)
    outcome = do_settle(lane, items, complete)
    assert outcome.settle_failures == 3


def test_messages_held_when_the_connection_was_reset_are_never_settled_on_the_next_one() -> None:
    """The syphon resets its receivers' connection when a receive fails, then abandons what it parked: those
    messages' delivery ids mean nothing - or another message - on a new connection's links. They are counted
    (redelivered when their locks run out), and no connection is opened for them."""
    receivers: list[FakeReceiver] = []

    class Context:
        def __init__(self) -> None:
            receivers.append(FakeReceiver())
            self.client = object()

        def receiver(self, queue: str, dead_letter: bool, timeout: float) -> FakeReceiver:
            return receivers[-1]

    shared: Lane[Any] = Lane("test-syphon-receivers", Context, lambda ctx: None)
    try:
        lane = ReceiverLane(shared, "b/0", True)
        lane.call(lambda r: None, 5.0)  # the receive that got the parked messages
        parked = held("p1", "p2", generation=lane.generation)
        lane.reset("receive failed")
        outcome = do_settle(lane, parked, abandon)  # type: ignore[arg-type]
        assert outcome.settle_failures == 2
        assert len(receivers) == 1 and receivers[0].calls == []
    finally:
        shared.close()


def test_failures_add_to_what_the_outcome_counted_before() -> None:
    outcome = SyphonOutcome(settle_failures=5)
    settle(FakeLane(FakeReceiver(fail=("a",))), held("a"), abandon, outcome, 1.0)  # type: ignore[arg-type]
    assert outcome.settle_failures == 6


# ------------------------------------------------------------------------------ completing on the link, at once
def test_several_completions_go_on_the_receiving_link_in_one_round_trip() -> None:
    """SPEC E8: on the link that received them (never update-disposition over $management), each disposition
    sent unsettled and accepted, then one wait for all their outcomes."""
    link = FakeLink()
    receiver = LinkReceiver(link)
    items = held("a", "b", "c")
    outcome = do_settle(FakeLane(receiver), items, complete)
    assert link.sent == [
        (0, None, b"a", False, "Accepted"),
        (1, None, b"b", False, "Accepted"),
        (2, None, b"c", False, "Accepted"),
    ]
    assert link.listens == 1  # one round trip for the three
    assert receiver.calls == []  # none completed one by one
    assert all(h.msg._settled for h in items)  # type: ignore[attr-defined]  # the SDK never settles them again
    assert link._pending_dispositions == {}  # nothing left for the SDK to wait for
    assert outcome.settle_failures == 0


def test_a_completion_the_service_refuses_is_counted_and_the_others_are_done() -> None:
    link = FakeLink(answers={1: LOCK_LOST})
    items = held("a", "b", "c")
    outcome = do_settle(FakeLane(LinkReceiver(link)), items, complete)
    assert outcome.settle_failures == 1
    assert [h.msg._settled for h in items] == [True, False, True]  # type: ignore[attr-defined]


def test_a_completion_without_an_answer_by_the_deadline_is_counted() -> None:
    link = FakeLink(answers={1: None})
    items = held("a", "b")
    assert complete_on_link(LinkReceiver(link), items, time.monotonic() + 0.2) == [items[1]]  # type: ignore[arg-type]
    assert link._pending_dispositions == {}


def test_a_message_that_is_not_the_links_delivery_is_counted_not_settled_elsewhere() -> None:
    """After the SDK reattached its link, an earlier delivery is not the new link's: no disposition for it, and
    no settlement through $management either (its lock runs out, it is redelivered)."""
    link = FakeLink(unknown=(b"old",))
    receiver = LinkReceiver(link)
    items = held("old", "new")
    outcome = do_settle(FakeLane(receiver), items, complete)
    assert [tag for _, _, tag, _, _ in link.sent] == [b"new"]
    assert receiver.calls == []
    assert outcome.settle_failures == 1


def test_consecutive_deliveries_of_the_link_are_completed_with_one_frame_each_run() -> None:
    """Delivery ids 0-2 and 4-5 (3 was settled otherwise; 9 is not the link's: the SDK reattached): two frames,
    0..2 and 4..5 - 9 is refused by the link, never settled elsewhere - and every tag of a run leaves the link's
    record, as the SDK's own disposition removes its one."""
    tags = {b"a", b"b", b"c", b"e", b"f"}
    link = FakeLink(tags=tags, answers={5: LOCK_LOST})
    items = [
        Held(FakeMessage(t, i), 3) for t, i in (("f", 5), ("a", 0), ("b", 1), ("c", 2), ("e", 4), ("z", 9))
    ]
    not_done = complete_on_link(LinkReceiver(link), items, time.monotonic() + 1.0)  # type: ignore[arg-type]
    assert [(first, last) for first, last, _, _, _ in link.sent] == [(0, 2), (4, 5)]
    assert tags == set()
    assert sorted(h.msg.lock_token for h in not_done or []) == ["f", "z"]  # type: ignore[attr-defined]
    assert [h.msg._settled for h in items] == [False, True, True, True, True, False]  # type: ignore[attr-defined]
    assert link.listens == 1


def test_a_link_that_detaches_while_waiting_ends_the_wait() -> None:
    link = FakeLink(answers={0: None, 1: None})
    link.state = LinkState.DETACHED
    items = held("a", "b")
    started = time.monotonic()
    assert complete_on_link(LinkReceiver(link), items, started + 5.0) == items  # type: ignore[arg-type]
    assert time.monotonic() - started < 1.0


def test_without_the_sdks_link_completions_go_one_by_one() -> None:
    receiver = FakeReceiver(fail=("b",))
    assert complete_on_link(receiver, held("a", "b"), time.monotonic() + 1) is None  # type: ignore[arg-type]
    items = held("a", "b")
    outcome = do_settle(FakeLane(receiver), items, complete)
    assert receiver.calls == [("complete", "a")]
    assert outcome.settle_failures == 1


def test_one_completion_or_another_action_is_never_batched() -> None:
    link = FakeLink()
    receiver = LinkReceiver(link)
    do_settle(FakeLane(receiver), held("only"), complete)
    do_settle(FakeLane(receiver), held("a", "b"), abandon)
    assert link.sent == []
    assert receiver.calls == [("complete", "only"), ("abandon", "a"), ("abandon", "b")]


# -------------------------------------------------------------------------------------------- the actions
def test_each_action_settles_the_message_its_way() -> None:
    receiver = FakeReceiver()
    msg = FakeMessage("t")
    complete(receiver, msg)  # type: ignore[arg-type]
    abandon(receiver, msg)  # type: ignore[arg-type]
    dead_letter_action("ExpiredInBacklog", "the TTL ran out in the backlog")(receiver, msg)  # type: ignore[arg-type]
    assert receiver.calls == [("complete", "t"), ("abandon", "t"), ("dead_letter", "t")]
    assert receiver.dead_lettered == [("t", "ExpiredInBacklog", "the TTL ran out in the backlog")]


def test_a_dead_letter_settle_carries_its_reason_for_every_message() -> None:
    receiver = FakeReceiver()
    do_settle(FakeLane(receiver), held("a", "b"), dead_letter_action("DestinationNotFound", "no entity 'x'"))
    assert receiver.dead_lettered == [
        ("a", "DestinationNotFound", "no entity 'x'"),
        ("b", "DestinationNotFound", "no entity 'x'"),
    ]


# ---------------------------------------------------------------------------------------- received messages
def received(msg: OutboundMessage) -> ServiceBusReceivedMessage:
    """``msg`` as a receiver hands it over: encoded by the SDK, decoded as a received message."""
    out = transform_outbound_messages(
        msg.to_sdk(), ServiceBusMessage, PyamqpTransport.to_outgoing_amqp_message
    )
    return ServiceBusReceivedMessage.from_bytes(bytes(PyamqpTransport.encode_message(out)))


def test_a_backlog_message_names_its_primary_entity() -> None:
    backlogged = to_backlog(OutboundMessage(b"x", message_id="m1"), "orders", T0)
    assert path_of(received(backlogged)) == "orders"


def test_a_message_without_a_destination_has_no_path() -> None:
    assert path_of(received(OutboundMessage(b"stray"))) is None
    assert path_of(object()) is None


@pytest.mark.parametrize(
    ("props", "path"),
    [
        ({b"x-ms-path": b"invoices"}, "invoices"),
        ({"x-ms-path": "refunds"}, "refunds"),
        ({"x-ms-path": 7}, "7"),
    ],
)
def test_a_path_is_read_whatever_its_keys_and_values_are_typed(props: dict[Any, Any], path: str) -> None:
    class Msg:
        application_properties = props

    assert path_of(Msg()) == path


def test_a_received_message_becomes_the_message_to_send_again() -> None:
    original = OutboundMessage(
        b"body", message_id="m1", session_id="s1", subject="created", properties={"tenant": "t1", "n": 2}
    )
    out = from_received(received(original), dead_letter=False)
    assert (out.body, out.message_id, out.session_id, out.subject) == (b"body", "m1", "s1", "created")
    assert dict(out.properties) == {"tenant": "t1", "n": 2}


def test_from_a_dead_letter_queue_the_services_dead_letter_properties_are_dropped() -> None:
    """The service adds them when it dead-letters; they are not the sender's and must not reach the primary."""
    props = {"tenant": "t1", **{k: f"set by the service ({k})" for k in DEAD_LETTER_PROPERTIES}}
    msg = received(OutboundMessage(b"x", message_id="m1", properties=props))
    assert dict(from_received(msg, dead_letter=True).properties) == {"tenant": "t1"}
    # from the queue itself the properties are the sender's own: kept
    assert dict(from_received(msg, dead_letter=False).properties) == props


def test_a_message_id_is_text_whatever_it_arrived_as() -> None:
    assert text_of(None) is None
    assert text_of("m-1") == "m-1"
    assert text_of(b"m-1") == "m-1"
    assert text_of(b"\xffid") == "\ufffdid"  # not UTF-8: shown, never an error
    assert text_of(42) == "42"


def test_times_are_made_utc() -> None:
    naive = datetime(2026, 6, 1, 8, 0)
    assert as_utc(naive) == T0 and as_utc(naive).tzinfo is timezone.utc
    two_hours_east = timezone(timedelta(hours=2))
    local = datetime(2026, 6, 1, 10, 0, tzinfo=two_hours_east)
    assert as_utc(local) == T0 and as_utc(local).tzinfo is timezone.utc and as_utc(local).hour == 8
