"""A message's line decided once (:mod:`spark_sb.sender.lines`, issue 49): the paired sender decides each message's
line as it comes in and carries its key along - beside its open primary batch, through a split and a divert, into
its open backlog batch - so that the gate, the diverter and a queue's failure read it instead of deciding it again;
with ``ordering: none`` nothing is decided or kept."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from azure.servicebus import exceptions as sbe

from spark_sb.failover import ordering
from spark_sb.failover.ordering import QueueUnavailableError, pinned_queue, return_marker
from spark_sb.failover.outcome import Tally
from spark_sb.message.backlog import from_backlog
from spark_sb.message.outbound import OutboundMessage
from spark_sb.sender import diverter, paired
from spark_sb.sender.diverter import Open
from spark_sb.sender.lines import LineGate
from spark_sb.wire.transport import PRIMARY, SECONDARY, Target
from tests.unit.fakes import FakeBatch
from tests.unit.sender.rig import QUEUES, Rig, conn_error

AT = datetime(2026, 1, 1, tzinfo=timezone.utc)


def decisions(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """Every line the sender decides (the session id it decided it from); the diverter's own way in - for callers
    that hand it messages without their lines - must not be taken on the sender's path."""
    calls: list[str | None] = []

    def decided(how: str, session_id: str | None) -> str | None:
        calls.append(session_id)
        return ordering.order_key(how, session_id)

    def again(how: str, session_id: str | None) -> str | None:
        raise AssertionError("a line decided a second time")

    monkeypatch.setattr(paired, "order_key", decided)
    monkeypatch.setattr(diverter, "order_key", again)
    return calls


def interleaved(sessions: str, n: int) -> list[OutboundMessage]:
    return [
        OutboundMessage(body=b"x" * 60, session_id=s, message_id=f"{s}-{i}")
        for i in range(n)
        for s in sessions
    ]


def in_queue(rig: Rig, session: str) -> list[str | None]:
    """The session's messages in its pinned queue, in order (its return marker last)."""
    queue = pinned_queue(session, QUEUES, lambda _: True)
    assert queue is not None
    restored = [from_backlog(m)[0] for m in rig.transport.at(SECONDARY, queue)]
    return [m.message_id for m in restored if m.session_id == session]


def test_each_line_is_decided_once_and_carried_through_a_split_and_a_divert(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = decisions(monkeypatch)
    rig = Rig(ordering="session", failover_interval=0.0)
    rig.transport.fail(
        lambda: sbe.MessageSizeExceededError(), namespace=PRIMARY, count=1
    )  # the first batch: split
    rig.transport.fail(
        conn_error, namespace=PRIMARY
    )  # then the primary refuses: the halves go to the backlog
    out = rig.sender.send(interleaved("abc", 20))
    assert out.total_diverted == 60 and out.sent == {}
    assert len(calls) == 60  # one decision per message, none for the split, the divert or the markers
    for s in "abc":
        *messages, marker = in_queue(rig, s)
        assert messages == [f"{s}-{i}" for i in range(20)] and (marker or "").startswith("spark-sb-return-")


def test_the_messages_of_a_line_whose_queue_fails_keep_their_line_and_go_nowhere_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = decisions(monkeypatch)
    rig = Rig(ordering="session", failover_interval=0.0)
    rig.transport.fail(conn_error, namespace=PRIMARY)
    pinned = pinned_queue("a", QUEUES, lambda _: True)
    other = next(s for s in "bcdefgh" if pinned_queue(s, QUEUES, lambda _: True) != pinned)
    rig.transport.fail(
        conn_error, namespace=SECONDARY, entity=pinned
    )  # the batch of a's line: sent again (B5)
    with pytest.raises(QueueUnavailableError):  # R4: ... with the key it came with, so a's line stops
        rig.sender.send(interleaved("a" + other, 3))
    assert len(calls) == 6
    elsewhere = [from_backlog(m)[0] for q in QUEUES if q != pinned for m in rig.transport.at(SECONDARY, q)]
    assert {m.session_id for m in elsewhere} == {other} and in_queue(rig, other)[:3] == [
        f"{other}-{i}" for i in range(3)
    ]


def test_with_ordering_none_no_line_is_decided_and_no_key_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = decisions(monkeypatch)
    rig = Rig(failover_interval=0.0)
    rig.transport.fail(lambda: sbe.MessageSizeExceededError(), namespace=PRIMARY, count=1)
    rig.transport.fail(conn_error, namespace=PRIMARY)
    out = rig.sender.send(interleaved("ab", 10))
    assert calls == [] and out.total_diverted == 20


# ---------------------------------------------------------------------------------------------------------
# What carries the keys: an open backlog batch, the gate's answers


def test_an_ordered_open_batch_keeps_each_originals_key_and_knows_its_lines() -> None:
    slot = Open(FakeBatch(Target(SECONDARY, QUEUES[0]), 10_000), AT, ordered=True)
    slot.add(OutboundMessage(body=b"x", message_id="free"), "orders", None)
    assert not slot.holds_lines()  # a message without a session keeps no order: it may go to any queue
    slot.add(OutboundMessage(body=b"x", session_id="s", message_id="s-0"), "orders", "s")
    slot.add(return_marker("orders", "s", "m1"), "orders", "s")
    assert [slot.key(i) for i in range(3)] == [None, "s", "s"] and slot.holds_lines()
    assert slot.markers == 1 and slot.counted() == (2, ["orders", "orders"])


def test_an_unordered_open_batch_keeps_no_keys() -> None:
    slot = Open(FakeBatch(Target(SECONDARY, QUEUES[0]), 10_000), AT)
    slot.add(OutboundMessage(body=b"x", session_id="s", message_id="s-0"), "orders", None)
    assert slot.keys is None and slot.key(0) is None and not slot.holds_lines()


def test_a_primary_batch_follows_a_line_the_call_diverted_read_from_its_keys() -> None:
    tally = Tally()
    assert not LineGate.diverted("orders", ["s", None], tally)  # nothing diverted in the call
    tally.ordered[("orders", "s")] = 1
    assert LineGate.diverted("orders", ["t", None, "s"], tally)
    assert not LineGate.diverted("billing", ["s"], tally)  # the line's entity is the batch's
    assert not LineGate.diverted("orders", [], tally)  # ordering: none keeps no keys
