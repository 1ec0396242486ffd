"""Diverting to the backlog and a call's rejects (:mod:`spark_sb.sender.diverter`, SPEC B4-B7): messages wait in
one open batch per backlog queue, translated once, the entity's queue sticky until a batch boundary (a session's
chosen by session); a full batch goes at once; a batch the service refuses as too large is split, a single message
rejected; a failing queue is pulled and its messages go to another; no queue left raises; rejects are recorded or
fail the call. With ordering, a line goes to its pinned queue only, stops when it fails, and gets a return marker
behind its messages that is neither counted nor re-routed."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from azure.servicebus import exceptions as sbe

from spark_sb.core.errors import MessageRejectedError, NoBacklogAvailableError, ServiceBusConfigError
from spark_sb.failover.decisions import choose_session_affine
from spark_sb.failover.ordering import marker_of, return_marker
from spark_sb.failover.outcome import SendOutcome, Tally
from spark_sb.message.backlog import BACKLOG_PATH, BACKLOG_SESSION_ID, from_backlog, to_backlog
from spark_sb.message.outbound import OutboundMessage, RejectError
from spark_sb.sender.attempts import AttemptLoop, Progress
from spark_sb.sender.diverter import Diverter, Open, Rejects
from spark_sb.wire.transport import PRIMARY, SECONDARY, Target
from tests.unit.fakes import BATCH_BASE, FakeBatch, FakeTransport, fake_size
from tests.unit.sender.rig import QUEUES, SECRET, Rig, conn_error, make_context, msgs


class Parts:
    """A diverter over a sender's context alone: the fake transport (1 s a call), a fake clock, a fresh tally."""

    def __init__(self, transport: FakeTransport | None = None, **cfg: Any) -> None:
        self.ctx = make_context(transport, **cfg)
        built = self.ctx.transport()
        assert isinstance(built, FakeTransport)
        self.transport = built
        self.rejects = Rejects(self.ctx)
        self.diverter = Diverter(ctx=self.ctx, loop=AttemptLoop(self.ctx), rejects=self.rejects)
        self.backlog: dict[str, Open] = {}
        self.tally = Tally()

    def divert(self, messages: list[OutboundMessage], progress: Progress | None = None) -> None:
        self.diverter.divert(messages, self.backlog, self.tally, progress)

    def flush(self) -> None:
        self.diverter.flush(self.backlog, self.tally)

    def sends(self) -> list[tuple[str, int, str]]:
        return [(t.entity, n, result) for _, t, n, result in self.transport.sends(SECONDARY)]

    def ids(self, queue: str) -> list[str | None]:
        return self.transport.ids(SECONDARY, queue)

    def pull(self, queue: str) -> None:
        """``queue`` pulled from the rotation by another sender of the process."""
        self.ctx.registry.rotation.pull(self.ctx.secondary_key, queue, self.ctx.clock.monotonic() + 60.0)


class Refusing(FakeBatch):
    """A batch that cannot build the message with id ``bad`` (an SDK type error)."""

    def try_add(self, message: OutboundMessage) -> bool:
        if message.message_id == "bad":
            raise TypeError("unsupported property type")
        return super().try_add(message)


class RefusingTransport(FakeTransport):
    def new_batch(self, target: Target) -> FakeBatch:
        return Refusing(target, self.max_batch)


def backlog_size(m: OutboundMessage) -> int:
    return fake_size(to_backlog(m, "orders", Parts().ctx.clock.now()))


# ---------------------------------------------------------------------------------------------------------
# Open backlog batches, the sticky choice


def test_diverted_messages_wait_in_one_open_batch_of_the_entitys_queue_until_flushed() -> None:
    p = Parts()
    ms = msgs(5)
    p.divert(ms)
    assert p.sends() == []  # not flushed by the divert (one send per queue at the call's end)
    (queue,) = p.backlog
    assert queue in QUEUES and p.tally.sticky == {"orders": queue}
    assert p.backlog[queue].originals == ms and p.backlog[queue].entities == ["orders"] * 5
    p.flush()
    assert p.backlog == {} and p.sends() == [(queue, 5, "ok")]
    assert p.ids(queue) == [f"m{i}" for i in range(5)]
    assert p.tally.diverted == {queue: 5} and p.tally.diverted_by_entity == {"orders": 5}


def test_a_message_without_an_entity_is_diverted_as_the_default_entitys_and_keeps_its_own_otherwise() -> None:
    p = Parts()
    p.divert(msgs(1, "d") + msgs(2, "b", entity="billing"))
    p.flush()
    delivered = [m for q in QUEUES for m in p.transport.at(SECONDARY, q)]
    assert sorted((m.message_id, m.properties[BACKLOG_PATH]) for m in delivered) == [
        ("b0", "billing"),
        ("b1", "billing"),
        ("d0", "orders"),
    ]
    assert p.tally.diverted_by_entity == {"orders": 1, "billing": 2}


def test_a_full_backlog_batch_goes_out_at_once_and_the_message_opens_the_next() -> None:
    p = Parts()
    ms = msgs(3)
    p.transport.max_batch = BATCH_BASE + 2 * backlog_size(ms[0])  # two translated messages fit
    sent = [p.diverter.to_backlog(p.backlog, m, "orders", i, p.tally) for i, m in enumerate(ms)]
    assert sent == [False, False, True]
    (queue,) = p.backlog
    assert p.sends() == [(queue, 2, "ok")] and p.ids(queue) == ["m0", "m1"]
    assert p.backlog[queue].originals == [ms[2]]
    assert p.tally.diverted == {queue: 2}


def test_a_batch_boundary_ends_the_sticky_choice() -> None:
    p = Parts()
    p.divert(msgs(2))
    assert p.tally.sticky
    p.flush()
    assert p.tally.sticky == {}


def test_a_pulled_sticky_queue_is_left_for_another_at_the_next_message() -> None:
    p = Parts()
    p.divert(msgs(1, "a"))
    (first,) = p.backlog
    p.tally.sticky.clear()  # a batch boundary: the queue may be pulled now
    p.pull(first)
    p.divert(msgs(1, "b"))
    assert set(p.backlog) == {first, p.tally.sticky["orders"]} and p.tally.sticky["orders"] != first


def test_a_session_message_goes_to_its_sessions_queue_and_sets_no_sticky_choice() -> None:
    p = Parts(backlog_selection="session-affine")
    p.divert([OutboundMessage(body=b"x", message_id="s", session_id="s-7")])
    assert list(p.backlog) == [choose_session_affine(QUEUES, "s-7")] and p.tally.sticky == {}


def test_a_backlog_batchs_messages_carry_the_time_it_was_opened() -> None:
    p = Parts()
    opened = p.ctx.clock.now()
    p.divert(msgs(1, "a"))
    p.ctx.clock.advance(5.0)
    p.divert(msgs(1, "b"))
    p.flush()
    (queue,) = p.tally.diverted
    entered = [from_backlog(m)[1] for m in p.transport.at(SECONDARY, queue)]
    assert entered == [opened, opened]


def test_translations_made_ahead_are_sent_instead_of_translating_again() -> None:
    p = Parts()
    ms = msgs(2)
    made = [to_backlog(m, "orders", p.ctx.clock.now()) for m in ms]
    p.divert(ms, Progress(p.ctx.clock.monotonic(), ahead=lambda: list(made)))
    p.flush()
    (queue,) = p.tally.diverted
    assert all(a is b for a, b in zip(p.transport.at(SECONDARY, queue), made, strict=True))
    assert p.backlog == {} and p.tally.diverted_by_entity == {"orders": 2}


# ---------------------------------------------------------------------------------------------------------
# Splits, rejects by the service, pulls, errors


def test_a_backlog_batch_the_service_refuses_as_too_large_is_split_in_halves_to_the_same_queue() -> None:
    p = Parts()
    p.transport.fail(lambda: sbe.MessageSizeExceededError(), namespace=SECONDARY, count=1)
    p.divert(msgs(5))
    (queue,) = p.backlog
    p.flush()
    assert p.sends() == [(queue, 5, "MessageSizeExceededError"), (queue, 2, "ok"), (queue, 3, "ok")]
    assert p.ids(queue) == [f"m{i}" for i in range(5)]
    assert p.tally.diverted == {queue: 5} and p.tally.rejects == [] and p.tally.pulls == []


def test_a_single_message_the_service_refuses_as_too_large_is_rejected_not_pulled() -> None:
    p = Parts()
    p.transport.fail(lambda: sbe.MessageSizeExceededError(), namespace=SECONDARY)
    p.divert(msgs(1))
    p.flush()
    (reject,) = p.tally.rejects
    assert reject.reason == "message too large after backlog translation: refused by the service"
    assert reject.entity == "orders" and "m0" in reject.row_json
    assert p.tally.diverted == {} and p.tally.pulls == []


def test_a_failing_queue_is_pulled_for_the_backlog_retry_interval_and_its_messages_go_to_another() -> None:
    p = Parts(backlog_retry_interval=123.0)
    p.divert(msgs(4))
    (first,) = p.backlog
    p.transport.fail(conn_error, namespace=SECONDARY, entity=first)
    p.flush()
    (pull,) = p.tally.pulls
    assert pull.queue == first and pull.error_class == "connection" and "connection refused" in pull.detail
    assert pull.until - pull.at == timedelta(seconds=123.0)
    (other,) = p.tally.diverted
    assert other != first and p.ids(other) == [f"m{i}" for i in range(4)] and p.ids(first) == []
    rotation = p.ctx.registry.rotation
    left = (pull.until - p.ctx.clock.now()).total_seconds()
    p.ctx.clock.advance(left - 0.5)
    assert not rotation.is_available(p.ctx.secondary_key, first)
    p.ctx.clock.advance(0.5)
    assert rotation.is_available(p.ctx.secondary_key, first)


def test_a_retryable_backlog_error_is_tried_again_on_the_same_queue_before_a_pull() -> None:
    p = Parts()
    p.transport.fail(lambda: sbe.ServiceBusServerBusyError(), namespace=SECONDARY, count=1)
    p.divert(msgs(3))
    (queue,) = p.backlog
    p.flush()
    assert p.sends() == [(queue, 3, "ServiceBusServerBusyError"), (queue, 3, "ok")]
    assert p.tally.pulls == [] and p.tally.retries == 1 and p.tally.diverted == {queue: 3}


def test_a_queue_pulled_while_its_batch_was_packed_gets_no_send_and_the_batch_goes_to_another() -> None:
    p = Parts()
    p.divert(msgs(3))
    (first,) = p.backlog
    p.pull(first)  # by another sender, while this batch was packed
    p.flush()
    (other,) = p.tally.diverted
    assert other != first and [q for q, _, _ in p.sends()] == [other]
    assert p.ids(other) == ["m0", "m1", "m2"] and p.tally.pulls == []  # this sender pulled nothing


def test_a_configuration_error_on_a_backlog_queue_raises_naming_the_secondary_and_pulls_nothing() -> None:
    p = Parts()
    p.transport.fail(lambda: sbe.ServiceBusAuthorizationError(message="unauthorized"), namespace=SECONDARY)
    p.divert(msgs(2))
    (queue,) = p.backlog
    with pytest.raises(ServiceBusConfigError) as info:
        p.flush()
    assert "secondary" in str(info.value) and queue in str(info.value)
    assert p.tally.pulls == [] and p.tally.diverted == {}


def test_with_every_queue_pulled_the_divert_raises_naming_them() -> None:
    p = Parts()
    for q in QUEUES:
        p.pull(q)
    with pytest.raises(NoBacklogAvailableError) as info:
        p.divert(msgs(1))
    text = str(info.value)
    assert "every backlog queue is pulled" in text and all(q in text for q in QUEUES)
    assert "'orders'" in text and p.backlog == {}


def test_without_a_secondary_the_divert_raises_saying_none_is_configured() -> None:
    p = Parts(secondary=None)
    with pytest.raises(NoBacklogAvailableError, match="no secondary namespace"):
        p.divert(msgs(1))


# ---------------------------------------------------------------------------------------------------------
# Rejects


def test_a_message_that_cannot_be_translated_is_rejected_and_the_others_diverted() -> None:
    p = Parts()
    bad = OutboundMessage(body=b"x", message_id="r", properties={BACKLOG_PATH: "elsewhere"})
    assert p.diverter.to_backlog(p.backlog, bad, "orders", 4, p.tally) is False
    p.divert(msgs(2))
    p.flush()
    (reject,) = p.tally.rejects
    assert reject.row_index == 4 and reject.entity == "orders" and BACKLOG_PATH in reject.reason
    assert p.tally.diverted_by_entity == {"orders": 2}


def test_a_message_the_sdk_cannot_build_is_rejected_as_such() -> None:
    p = Parts(RefusingTransport(make_context().clock))
    ms = msgs(1) + [OutboundMessage(body=b"x", message_id="bad")]
    p.divert(ms)
    p.flush()
    (reject,) = p.tally.rejects
    assert reject.reason == "cannot build the message: TypeError: unsupported property type"
    assert reject.field is None and "bad" in reject.row_json and p.tally.diverted_by_entity == {"orders": 1}


def test_a_message_too_large_once_translated_is_rejected_and_nothing_is_sent() -> None:
    p = Parts()
    huge = OutboundMessage(body=b"z" * 990, message_id="edge")
    assert p.diverter.to_backlog(p.backlog, huge, "orders", 2, p.tally) is False
    p.flush()
    (reject,) = p.tally.rejects
    assert reject.reason == (
        "message too large after backlog translation (B6 adds properties): over the limit of 1000 bytes for one message "
        "(max_message_size)"
    )
    assert reject.row_index == 2 and p.sends() == [] and p.tally.diverted == {}


def test_try_add_says_added_does_not_fit_or_rejected() -> None:
    p = Parts()
    batch = Refusing(Target(PRIMARY, "orders"), BATCH_BASE + fake_size(msgs(1)[0]))
    assert p.rejects.try_add(batch, msgs(1)[0], p.tally, "orders", 0) is True
    assert p.rejects.try_add(batch, msgs(1, "n")[0], p.tally, "orders", 1) is False
    assert p.tally.rejects == []
    bad = OutboundMessage(body=b"x", message_id="bad")
    assert p.rejects.try_add(batch, bad, p.tally, "orders", 2) is None
    assert [(r.row_index, r.entity) for r in p.tally.rejects] == [(2, "orders")] and len(batch) == 1


def test_a_message_too_large_encoded_is_rejected_with_the_message_limit() -> None:
    p = Parts()
    batch = p.transport.new_batch(Target(PRIMARY, "orders"))
    p.rejects.oversize(p.tally, msgs(1)[0], "orders", batch, 3, translated=False)
    (reject,) = p.tally.rejects
    assert reject.reason == (
        "message too large encoded: over the limit of 1000 bytes for one message (max_message_size)"
    )
    assert reject.field is None and reject.row_index == 3


def test_a_reject_error_keeps_its_reason_and_field() -> None:
    p = Parts()
    p.rejects.cannot_build(p.tally, msgs(1)[0], RejectError("not a string", "subject"), "orders", 0)
    (reject,) = p.tally.rejects
    assert (reject.reason, reject.field, reject.entity, reject.row_index) == (
        "not a string",
        "subject",
        "orders",
        0,
    )


def test_a_reject_records_the_row_and_where_it_was_going() -> None:
    p = Parts()
    msg = OutboundMessage(body=b"payload", message_id="id-9", entity="billing")
    p.rejects.reject(p.tally, msg, RejectError("too odd", "body"), "billing", 9)
    (reject,) = p.tally.rejects
    assert (reject.reason, reject.field, reject.entity, reject.row_index) == ("too odd", "body", "billing", 9)
    assert "id-9" in reject.row_json


def test_with_on_reject_fail_a_reject_raises_carrying_it_and_records_nothing() -> None:
    p = Parts(on_reject="fail")
    with pytest.raises(MessageRejectedError, match="on_reject = 'fail'") as info:
        p.rejects.reject(p.tally, msgs(1)[0], RejectError("too odd", "body"), "orders", 1)
    reject = info.value.reject
    assert reject is not None and (reject.reason, reject.field, reject.row_index) == ("too odd", "body", 1)
    assert p.tally.rejects == []


# ---------------------------------------------------------------------------------------------------------
# Ordered lines (ordering: session)


def session_msgs(session: str, n: int) -> list[OutboundMessage]:
    return [OutboundMessage(body=b"x", message_id=f"{session}-{i}", session_id=session) for i in range(n)]


def test_an_ordered_lines_messages_go_to_its_pinned_queue_with_a_return_marker_behind_them() -> None:
    p = Parts(ordering="session")
    p.divert(session_msgs("s1", 3))
    (queue,) = p.backlog
    assert p.tally.ordered == {("orders", "s1"): 3} and p.tally.sticky == {}
    p.flush()
    p.diverter.close_lines(p.backlog, p.tally)
    delivered = p.transport.at(SECONDARY, queue)
    assert [m.message_id for m in delivered[:3]] == ["s1-0", "s1-1", "s1-2"]
    (marker,) = delivered[3:]
    held = p.ctx.book.held("orders", "s1") if p.ctx.book is not None else None
    assert held is not None and held.queue == queue and marker_of(marker) == held.marker
    assert p.tally.diverted == {queue: 3} and p.tally.diverted_by_entity == {
        "orders": 3
    }  # the marker not counted
    assert p.tally.ordered == {} and p.backlog == {}


def test_a_failed_call_closes_its_lines_without_a_marker() -> None:
    p = Parts(ordering="session")
    p.divert(session_msgs("s1", 2))
    p.flush()
    p.diverter.close_lines(p.backlog, p.tally, mark=False)
    (queue,) = p.tally.diverted
    assert p.ids(queue) == ["s1-0", "s1-1"] and p.tally.ordered == {}
    held = p.ctx.book.held("orders", "s1") if p.ctx.book is not None else None
    assert (
        held is not None and held.marker is not None and held.sending == 0
    )  # closed: a later marker releases it


def test_a_line_whose_pinned_queue_is_pulled_stops_and_nothing_goes_elsewhere() -> None:
    p = Parts(ordering="session")
    p.divert(session_msgs("s1", 1))
    (queue,) = p.backlog
    p.flush()
    p.pull(queue)
    p.transport.fail(conn_error, namespace=SECONDARY, entity=queue)  # and still not answering
    p.divert(session_msgs("s1", 2) + session_msgs("s2", 1))
    p.flush()  # O8: the held line's pulled queue is tried once in the call; it fails: the line stops
    line = ("orders", "s1")
    assert line in p.tally.stopped and queue in p.tally.stopped[line]
    p.diverter.close_lines(p.backlog, p.tally)
    assert p.ids(queue) == ["s1-0"]  # the stopped line: no message, no marker
    others = [m.message_id for q in QUEUES if q != queue for m in p.transport.at(SECONDARY, q)]
    assert "s1-1" not in others and "s2-0" in others


def test_a_message_of_a_stopped_line_is_left_out() -> None:
    p = Parts(ordering="session")
    p.tally.stopped[("orders", "s1")] = "its queue failed"
    assert p.diverter.to_backlog(p.backlog, session_msgs("s1", 1)[0], "orders", 0, p.tally) is False
    assert p.backlog == {} and p.tally.ordered == {}


def test_an_ordered_line_without_backlog_queues_raises() -> None:
    p = Parts(ordering="session", secondary=None)
    with pytest.raises(NoBacklogAvailableError, match="no secondary namespace"):
        p.divert(session_msgs("s1", 1))


def test_a_return_marker_whose_queue_fails_is_not_sent_to_another_queue() -> None:
    p = Parts(ordering="session")
    p.divert(session_msgs("s1", 1))
    (queue,) = p.backlog
    p.flush()
    p.transport.fail(conn_error, namespace=SECONDARY, entity=queue)
    p.diverter.close_lines(p.backlog, p.tally)
    assert [pull.queue for pull in p.tally.pulls] == [queue]
    elsewhere = [m for q in QUEUES if q != queue for m in p.transport.at(SECONDARY, q)]
    assert elsewhere == [] and p.backlog == {}
    assert (
        p.tally.stopped == {}
    )  # the marker was not diverted again (not even tried: its line is not stopped)


def test_a_batch_with_a_return_marker_split_by_the_service_counts_the_callers_messages_only() -> None:
    p = Parts(ordering="session")
    p.transport.fail(lambda: sbe.MessageSizeExceededError(), namespace=SECONDARY, count=1)
    p.divert(session_msgs("s1", 2))
    (queue,) = p.backlog
    p.diverter.close_lines(p.backlog, p.tally)  # the marker joins the open batch: [s1-0, s1-1, marker], split
    assert [n for q, n, _ in p.sends()] == [3, 1, 2]
    delivered = p.transport.at(SECONDARY, queue)
    assert [m.message_id for m in delivered[:2]] == ["s1-0", "s1-1"] and marker_of(delivered[2]) is not None
    assert p.tally.diverted == {queue: 2} and p.tally.diverted_by_entity == {"orders": 2}


def test_a_return_marker_the_service_refuses_is_no_reject_of_the_callers() -> None:
    p = Parts(ordering="session")
    p.divert(session_msgs("s1", 1))
    (queue,) = p.backlog
    p.flush()
    p.transport.fail(lambda: sbe.MessageSizeExceededError(), namespace=SECONDARY, entity=queue, count=1)
    p.diverter.close_lines(p.backlog, p.tally)
    assert p.sends()[-1] == (queue, 1, "MessageSizeExceededError")
    assert p.tally.rejects == [] and p.ids(queue) == ["s1-0"]


def test_an_open_batch_counts_the_callers_messages_not_the_return_markers() -> None:
    p = Parts()
    slot = Open(p.transport.new_batch(Target(SECONDARY, QUEUES[0])), p.ctx.clock.now())
    assert slot.counted() == (0, [])
    for m, e in (
        (msgs(1)[0], "orders"),
        (return_marker("billing", "s", "mk"), "billing"),
        (msgs(1, "b")[0], "a"),
    ):
        slot.originals.append(m)
        slot.entities.append(e)
    slot.markers = 1
    assert slot.counted() == (2, ["orders", "a"])
    slot.markers = 0
    assert slot.counted() == (3, ["orders", "billing", "a"])


# ---------------------------------------------------------------------------------------------------------
# Through the paired sender (moved from test_paired.py)


def test_failing_backlog_queue_is_pulled_and_same_messages_go_to_another() -> None:
    rig = Rig(failover_interval=0.0)
    rig.transport.fail(conn_error, namespace=PRIMARY)
    first = rig.sender._chooser.choose("orders")  # the sticky choice the sender will use
    assert first is not None
    rig.transport.fail(lambda: sbe.MessagingEntityDisabledError(), namespace=SECONDARY, entity=first)
    out = rig.sender.send(msgs(10))
    assert [p.queue for p in out.pulls] == [first] and out.pulls[0].error_class == "entity_disabled"
    assert rig.transport.at(SECONDARY, first) == []
    ids = [m.message_id for m in rig.backlog()]
    assert sorted(ids) == sorted(f"m{i}" for i in range(10)) and len(ids) == len(set(ids))
    assert first not in out.diverted and out.total_diverted == 10
    # returns to the rotation after backlog_retry_interval
    rotation = rig.registry.rotation
    assert first not in rotation.available(rig.sender._secondary_key, QUEUES)
    rig.clock.advance(300.0)
    assert first in rotation.available(rig.sender._secondary_key, QUEUES)


def test_transient_backlog_error_is_retried_on_the_same_queue() -> None:
    rig = Rig(failover_interval=0.0)
    rig.transport.fail(conn_error, namespace=PRIMARY)
    rig.transport.fail(lambda: sbe.ServiceBusServerBusyError(), namespace=SECONDARY, count=1)
    out = rig.sender.send(msgs(4))
    assert out.pulls == () and len(out.diverted) == 1 and out.total_diverted == 4


def test_all_backlog_queues_failing_raises_and_does_not_claim_sent() -> None:
    rig = Rig(failover_interval=0.0)
    rig.transport.fail(conn_error, namespace=PRIMARY, skip=1)  # first batch reaches the primary
    rig.transport.fail(conn_error, namespace=SECONDARY)
    ms = msgs(30)
    with pytest.raises(NoBacklogAvailableError, match="every backlog queue is pulled") as info:
        rig.sender.send(ms)
    outcome = info.value.outcome
    assert isinstance(outcome, SendOutcome)
    delivered = rig.transport.ids(PRIMARY, "orders")
    assert 0 < len(delivered) < 30
    assert outcome.sent == {"orders": len(delivered)} and outcome.total_diverted == 0
    assert {p.queue for p in outcome.pulls} == set(QUEUES)
    assert SECRET not in str(info.value)


def test_no_secondary_configured_raises_when_failed_over() -> None:
    rig = Rig(failover_interval=0.0, secondary=None)
    rig.transport.fail(conn_error, namespace=PRIMARY)
    with pytest.raises(NoBacklogAvailableError, match="no secondary"):
        rig.sender.send(msgs(1))


def test_session_affine_choice_is_stable_per_session() -> None:
    rig = Rig(failover_interval=0.0, backlog_selection="session-affine")
    rig.transport.fail(conn_error, namespace=PRIMARY)
    sessions = [f"s{i}" for i in range(12)]
    batch = [
        OutboundMessage(body=b"x", message_id=f"{s}-{j}", session_id=s) for j in range(3) for s in sessions
    ]
    rig.sender.send(batch)
    rig.sender.send([OutboundMessage(body=b"x", message_id=f"{s}-late", session_id=s) for s in sessions])
    for s in sessions:
        expected = choose_session_affine(QUEUES, s)
        where = {
            q for q in QUEUES for m in rig.transport.at(SECONDARY, q) if m.properties[BACKLOG_SESSION_ID] == s
        }
        assert where == {expected}
    assert len({choose_session_affine(QUEUES, s) for s in sessions}) > 1


def test_oversize_message_rejected_and_batch_goes_on() -> None:
    rig = Rig()
    batch = msgs(2, "a") + [OutboundMessage(body=b"y" * 2000, message_id="huge")] + msgs(2, "b")
    out = rig.sender.send(batch)
    assert rig.transport.ids(PRIMARY, "orders") == ["a0", "a1", "b0", "b1"]
    (reject,) = out.rejects
    assert "too large" in reject.reason and reject.row_index == 2 and reject.entity == "orders"
    assert "huge" in reject.row_json


def test_oversize_with_on_reject_fail_raises() -> None:
    rig = Rig(on_reject="fail")
    with pytest.raises(MessageRejectedError) as info:
        rig.sender.send([OutboundMessage(body=b"y" * 2000, message_id="huge")])
    assert info.value.reject is not None and "too large" in info.value.reject.reason


def test_oversize_after_translation_is_rejected() -> None:
    rig = Rig(failover_interval=0.0)
    rig.transport.fail(conn_error, namespace=PRIMARY)
    # fits the primary batch alone (limit 1000), but not once x-ms-* properties are added
    near_limit = OutboundMessage(body=b"z" * 940, message_id="edge")
    out = rig.sender.send([near_limit, *msgs(2)])
    (reject,) = out.rejects
    assert "after backlog translation" in reject.reason
    assert sorted(m.message_id or "" for m in rig.backlog()) == ["m0", "m1"]
