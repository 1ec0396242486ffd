"""spark_sb.wire.parking: the wait for a parked delivery, against a handler that does what pyamqp's ``SendClient``
does in ``do_work`` - time out the link's expired deliveries, then read the connection."""

from __future__ import annotations

import time
from typing import Any

import pytest
from azure.servicebus._pyamqp.constants import MessageDeliveryState
from azure.servicebus._pyamqp.message import _MessageDelivery

from spark_sb.wire.parking import Ticket, _wait
from spark_sb.wire.timing import READ_ARRIVED_WAIT


class Sock:
    def __init__(self) -> None:
        self.timeout: float | None = 0.2
        self.set: list[float | None] = []

    def gettimeout(self) -> float | None:
        return self.timeout

    def settimeout(self, value: float | None) -> None:
        self.set.append(value)
        self.timeout = value


class Connection:
    """The answers that came on the socket and are not read yet (``arrived``); ``listen`` reads them."""

    def __init__(self) -> None:
        self._transport = type("T", (), {"sock": Sock()})()
        self.arrived: list[_MessageDelivery] = []

    def listen(self, wait: Any = False, batch: int = 1) -> None:
        for delivery in self.arrived[:batch]:
            delivery.state = MessageDeliveryState.Ok
        del self.arrived[:batch]


class Handler:
    """pyamqp's order: ``update_pending_deliveries`` (expired ones time out) before ``listen``."""

    def __init__(self, pending: list[_MessageDelivery]) -> None:
        self._connection = Connection()
        self.pending = pending

    def do_work(self) -> bool:
        now = time.time()
        for d in self.pending:
            if d.state is MessageDeliveryState.WaitingForSendAck and d.expiry is not None and now >= d.expiry:
                d.state = MessageDeliveryState.Timeout
                d.error = TimeoutError("Sending message timed out.")
        self._connection.listen(batch=1)
        return True


def _parked(expired: bool) -> tuple[Handler, Ticket]:
    delivery = _MessageDelivery(
        b"m", MessageDeliveryState.WaitingForSendAck, time.time() + (-0.1 if expired else 5)
    )
    handler = Handler([delivery])
    return handler, Ticket(handler, delivery)


def test_an_answer_that_came_while_parked_is_read_before_the_links_deadline_check() -> None:
    """Resumed past its deadline, with its answer waiting on the socket (no other read took it): the send
    succeeded. Before the fix pyamqp's deadline check ran first and the landed message counted as a timeout."""
    handler, ticket = _parked(expired=True)
    handler._connection.arrived.append(ticket.delivery)
    assert _wait(ticket, None, 0.0) is False
    assert ticket.delivery.state is MessageDeliveryState.Ok
    sock = handler._connection._transport.sock
    assert sock.set == [READ_ARRIVED_WAIT, 0.2]  # a short read, then the socket's own timeout again


def test_a_parked_send_with_no_answer_past_its_deadline_still_times_out() -> None:
    handler, ticket = _parked(expired=True)
    with pytest.raises(TimeoutError):
        _wait(ticket, None, 0.0)
    assert ticket.delivery.state is MessageDeliveryState.Timeout


def test_before_its_deadline_the_wait_reads_as_pyamqp_does() -> None:
    handler, ticket = _parked(expired=False)
    handler._connection.arrived.append(ticket.delivery)
    assert _wait(ticket, None, 0.0) is False
    assert handler._connection._transport.sock.set == []  # no extra read on the hot path
