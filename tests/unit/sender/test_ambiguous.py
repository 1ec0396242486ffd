"""SPEC B14 on the send side: a primary send that failed with no verdict once its batch was written may have landed;
its messages, diverted, carry when the first such attempt began into the backlog (and only they: a refusal, a
service's answer, a message never tried on the primary carry nothing). A fake transport and a fake clock."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from azure.servicebus import exceptions as sbe

from spark_sb.core.errors import is_ambiguous, mark_written
from spark_sb.message.backlog import BACKLOG_AMBIGUOUS, ambiguous_attempt, from_backlog, to_backlog
from spark_sb.message.outbound import OutboundMessage
from spark_sb.wire.transport import PRIMARY, SECONDARY
from tests.unit.fakes import BATCH_BASE, FakeTransport, fake_size
from tests.unit.sender.rig import Rig, conn_error, msgs


def timed_out() -> BaseException:
    return sbe.OperationTimeoutError(message="no answer to the transfer")


def starts(rig: Rig) -> list[datetime]:
    """The wall time at which each primary send began (recorded by wrapping the fake transport's send)."""
    began: list[datetime] = []
    send = rig.transport.send

    def recording(batch: Any, *args: Any, **kwargs: Any) -> None:
        if batch.target.namespace == PRIMARY:
            began.append(rig.clock.now())
        send(batch, *args, **kwargs)

    rig.transport.send = recording  # type: ignore[method-assign]
    return began


def marks(rig: Rig) -> dict[str | None, datetime | None]:
    return {m.message_id: ambiguous_attempt(m) for m in rig.backlog()}


def test_a_send_that_timed_out_once_written_carries_its_first_attempt_into_the_backlog() -> None:
    rig = Rig(failover_interval=10.0)
    rig.transport.fail(timed_out, namespace=PRIMARY, written=True)
    began = starts(rig)
    out = rig.sender.send(msgs(3))
    assert out.diverted_by_entity == {"orders": 3} and len(began) > 2  # tried until the failover
    assert marks(rig) == {"m0": began[0], "m1": began[0], "m2": began[0]}  # the first attempt: the earliest
    restored, _ = from_backlog(rig.backlog()[0])
    assert BACKLOG_AMBIGUOUS not in restored.properties  # never the primary's


def test_a_connection_lost_once_written_is_ambiguous_too_and_the_earliest_such_attempt_counts() -> None:
    rig = Rig(failover_interval=10.0)
    rig.transport.fail(conn_error, namespace=PRIMARY, count=2)  # refused: nothing written
    rig.transport.fail(conn_error, namespace=PRIMARY, written=True)  # then dropped under the transfer
    began = starts(rig)
    rig.sender.send(msgs(2))
    assert set(marks(rig).values()) == {began[2]}


def test_a_refusal_and_a_services_answer_leave_no_mark() -> None:
    for failure, written in (
        (conn_error, False),  # refused before anything was written
        (lambda: sbe.MessagingEntityDisabledError(message="disabled"), True),  # the service said no
        (lambda: sbe.ServiceBusQuotaExceededError(message="full"), True),
    ):
        rig = Rig(failover_interval=10.0)
        rig.transport.fail(failure, namespace=PRIMARY, written=written)
        out = rig.sender.send(msgs(2))
        assert out.total_diverted == 2 and marks(rig) == {"m0": None, "m1": None}
        assert all(BACKLOG_AMBIGUOUS not in m.properties for m in rig.backlog())


def test_only_the_batches_tried_on_the_primary_carry_it() -> None:
    """The first full batch is tried until the failover; the rest of the call goes straight to the backlog."""
    rig = Rig(failover_interval=5.0)
    rig.transport.fail(timed_out, namespace=PRIMARY, written=True)
    began = starts(rig)
    out = rig.sender.send(msgs(40))
    assert out.diverted_by_entity == {"orders": 40}
    first = {s[2] for s in rig.transport.sends(PRIMARY)}
    assert len(first) == 1  # one batch was tried
    (size,) = first
    found = marks(rig)
    assert [found[f"m{i}"] for i in range(size)] == [began[0]] * size
    assert {found[f"m{i}"] for i in range(size, 40)} == {None}


def test_a_parked_send_that_ends_without_an_answer_is_ambiguous() -> None:
    """An entity that stalls while the connection answers: its send parks, is resumed, and times out - its batch
    was on the wire all along."""
    rig = Rig(failover_interval=10.0, ping_primary_interval=5.0, send_timeout=30.0)
    rig.transport.stall(namespace=PRIMARY, entity="a")  # not written by itself: parking writes it
    out = rig.sender.send([*msgs(2, "a-", entity="a"), *msgs(1, "c-", entity="c")])
    assert out.sent == {"c": 1} and out.diverted_by_entity == {"a": 2}
    assert any(c[3] == "Parked" for c in rig.transport.calls)
    assert None not in marks(rig).values()


def test_a_marked_message_keeps_its_mark_through_a_pulled_queue_and_a_split() -> None:
    rig = Rig(failover_interval=10.0)
    rig.transport.fail(timed_out, namespace=PRIMARY, written=True)
    rig.transport.fail(lambda: sbe.MessageSizeExceededError(), namespace=SECONDARY, count=1)  # split
    rig.transport.fail(conn_error, namespace=SECONDARY, count=4)  # a half's queue pulled: another takes it
    began = starts(rig)
    out = rig.sender.send(msgs(6))
    assert (
        out.diverted_by_entity == {"orders": 6} and len(out.pulls) == 2
    )  # two queues pulled, the third took it
    assert [c[3] for c in rig.transport.sends(SECONDARY)][0] == "MessageSizeExceededError"
    assert marks(rig) == {f"m{i}": began[0] for i in range(6)}


def test_a_message_that_fits_the_backlog_only_without_its_mark_goes_without_it() -> None:
    """Nothing is rejected for the sake of a diagnostic (SPEC B7): the mark is left off a message it would make too
    large."""
    message = OutboundMessage(body=b"x" * 50, message_id="big")
    plain = fake_size(to_backlog(message, "orders", datetime(2026, 1, 1)))
    transport = FakeTransport(max_batch=BATCH_BASE + plain + 5, op_seconds=1.0)
    rig = Rig(transport=transport, failover_interval=10.0)
    transport.clock = rig.clock
    transport.fail(timed_out, namespace=PRIMARY, written=True)
    out = rig.sender.send([message])
    assert out.rejects == () and out.diverted_by_entity == {"orders": 1}
    assert marks(rig) == {"big": None}


def test_the_mark_is_the_wires_and_the_class_says_whether_the_service_gave_a_verdict() -> None:
    timeout, refused, disabled = timed_out(), conn_error(), sbe.MessagingEntityDisabledError(message="off")
    assert not is_ambiguous(timeout) and not is_ambiguous(refused)  # not written: not ambiguous
    for exc in (timeout, refused, disabled):
        mark_written(exc)
    assert is_ambiguous(timeout) and is_ambiguous(refused) and not is_ambiguous(disabled)
    assert is_ambiguous(mark(TimeoutError("deadline"))) and is_ambiguous(mark(ConnectionResetError()))


def mark(exc: BaseException) -> BaseException:
    mark_written(exc)
    return exc
