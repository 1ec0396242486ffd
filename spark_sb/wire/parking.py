"""Parked sends: a send that no answer came for within :data:`~spark_sb.wire.timing.PARK_AFTER` on a connection
that answers is set aside, its batch still on the wire, so that the caller can send to the other entities meanwhile
(issue 29 item 1, SPEC F6).

Why: sends are synchronous on the caller's thread (a Spark task), and the namespace's entities share one connection
(SPEC F2). An entity that stalls (its broker answers nothing; the connection and every other entity answer) used to
hold the call for its whole attempt budget - up to ``failover_interval`` - and E such entities in one call failed
over one after the other: 10 stalled entities at an interval of 10 s cost 98 s (``bench/bench_isolation.py``). A
parked send keeps its delivery on its link; every later read of the connection (another entity's send, the lane's
tending) reads its answer when it comes; :func:`resume_send` waits for it once the caller has nothing else to do,
within the attempt's own deadline. E stalled entities then cost one budget together, and the healthy entities of
the call are sent while they wait.

When a send parks: past ``PARK_AFTER`` seconds, and only when the connection was heard from since the send
began (another link's answer, a heartbeat, the answer to the liveness ping that a parkable send asks for after
``PARK_AFTER`` of silence: :class:`~spark_sb.wire.liveness.Liveness`). A connection that says nothing at all
is the namespace's fault, not one entity's: such a send waits as before, and its timeout is the namespace's
evidence (SPEC F7). Parking is no verdict: the state of the entity is decided when the send ends.

How: through the SDK's own ``ServiceBusSender.send_messages`` (its conversion of the batch, its mapping of errors,
its care of the handler), with its pyamqp client's ``_send_message_impl`` replaced for the one call by the same
loop (transfer, then read until the delivery is settled) that may return early, the delivery kept in a
:class:`Ticket`; resuming makes the same call once more with a loop that waits for the kept delivery instead of
transferring a new one. Reads pyamqp internals (``_MessageDelivery``, ``_transfer_message``, ``do_work``), pinned by
``constraints-dev.txt`` and exercised by the integration tests against the unmodified SDK.

Where it runs: on the thread that uses the shared connection (the lane's worker or a direct call), never two at
once. Nothing here is picklable.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from spark_sb.wire.pyamqp_state import last_heard, socket_of
from spark_sb.wire.timing import READ_ARRIVED_WAIT

__all__ = [
    "Parked",
    "Ticket",
    "holds",
    "resume_send",
    "send_parkable",
]


@dataclass(eq=False)
class Ticket:
    """A parked delivery on one link: the pyamqp client (``handler``) it was sent on and its ``delivery``. The
    delivery's state is set by whichever read of the connection gets its answer. Wire-internal."""

    handler: Any
    delivery: Any

    def done(self) -> bool:
        from azure.servicebus._pyamqp.constants import MESSAGE_DELIVERY_DONE_STATES

        return bool(self.delivery.state in MESSAGE_DELIVERY_DONE_STATES)


class Parked(Exception):  # noqa: N818 - not an error: the send goes on
    """Raised by :meth:`~spark_sb.wire.transport.Transport.send` given ``park_after``: the batch was written to its
    link and is not answered yet; the caller finishes it with :meth:`~spark_sb.wire.transport.Transport.resume`
    (which returns or raises as the send would have). ``started``: when the attempt began; ``deadline``: when it
    ends (both ``time.monotonic()``); ``ticket``: the transport's own (None for a fake)."""

    def __init__(self, target: Any, started: float, deadline: float, ticket: Any = None) -> None:
        super().__init__(f"the send to {target} is parked (no answer yet)")
        self.target = target
        self.started = started
        self.deadline = deadline
        self.ticket = ticket


def send_parkable(sender: Any, payload: Any, timeout: float, park_at: float) -> Ticket | None:
    """``sender.send_messages(payload, timeout=timeout)``, except that its wait for the answer ends at ``park_at``
    (monotonic) if the connection was heard from since the send began: the :class:`Ticket` of the parked delivery
    is returned then; None when the send succeeded. Raises what the SDK raises."""
    handler = sender._handler
    parked: list[Ticket] = []
    began = time.time()

    def impl(message: Any, *, timeout: float = 0) -> None:  # pyamqp's SendClient._send_message_impl, parkable
        from azure.servicebus._pyamqp.constants import MessageDeliveryState
        from azure.servicebus._pyamqp.message import _MessageDelivery

        handler.open()
        delivery = _MessageDelivery(
            message, MessageDeliveryState.WaitingToBeSent, (time.time() + timeout) if timeout else None
        )
        while not handler.client_ready():  # pragma: no cover - the link is open before a send (as in the SDK)
            time.sleep(0.05)
        handler._transfer_message(delivery, timeout)
        ticket = Ticket(handler, delivery)
        if _wait(ticket, park_at, began):
            parked.append(ticket)

    with _replaced(handler, impl):
        sender.send_messages(payload, timeout=timeout)
    return parked[0] if parked else None


def resume_send(
    sender: Any, payload: Any, ticket: Ticket, timeout: float, park_at: float | None = None
) -> bool:
    """Wait for the parked delivery of ``ticket`` (answered meanwhile, or within its own deadline) and return or
    raise as the SDK's send would have - through ``sender.send_messages`` again, whose call transfers nothing new.
    True when parked again instead (``park_at``, monotonic, passed first). ``sender`` must still hold the ticket's
    handler (see :func:`holds`)."""
    parked: list[bool] = []

    def impl(message: Any, *, timeout: float = 0) -> None:
        if _wait(ticket, park_at, 0.0):
            parked.append(True)

    with _replaced(ticket.handler, impl):
        sender.send_messages(payload, timeout=max(timeout, 0.001))
    return bool(parked)


def holds(sender: Any, ticket: Ticket) -> bool:
    """``sender`` still uses the link the ticket's delivery went out on (the link was not dropped or replaced)."""
    handler = getattr(sender, "_handler", None)
    return handler is ticket.handler and not getattr(handler, "_shutdown", True)


def _wait(ticket: Ticket, park_at: float | None, began: float) -> bool:
    """pyamqp's wait for a delivery (read the connection until the delivery is settled, or timed out by its link);
    True when parked instead (``park_at`` passed and the connection heard from since ``began``, ``time.time()``)."""
    from azure.servicebus._pyamqp.constants import MessageDeliveryState
    from azure.servicebus._pyamqp.error import ErrorCondition, MessageException

    handler, delivery = ticket.handler, ticket.delivery
    running = True
    read_first = True
    while running and not ticket.done():
        if park_at is not None and time.monotonic() >= park_at and _heard_since(handler, began):
            return True
        if read_first and delivery.expiry is not None and time.time() >= delivery.expiry:
            # pyamqp's do_work times out the link's expired deliveries before it reads: an answer that came while
            # the send was parked, and that no other read of the connection took, would be lost to a false
            # timeout (the message landed, the attempt fails, at interval 0 it fails over). Read it first.
            read_first = False
            _read_arrived(handler)
            continue
        running = handler.do_work()
    if not ticket.done():
        raise MessageException(
            condition=ErrorCondition.ClientError, description="Send failed - connection not running."
        )
    if delivery.state in (
        MessageDeliveryState.Error,
        MessageDeliveryState.Cancelled,
        MessageDeliveryState.Timeout,
    ):
        if isinstance(delivery.error, BaseException):
            raise delivery.error
        raise MessageException(condition=ErrorCondition.UnknownError, description="Send failed.")
    return False


def _read_arrived(handler: Any) -> None:
    """Process the frames that already came on ``handler``'s connection (reads of at most
    :data:`~spark_sb.wire.timing.READ_ARRIVED_WAIT` each, until one finds nothing), without pyamqp's deadline
    check of the link's deliveries that precedes every read of ``do_work``."""
    connection = getattr(handler, "_connection", None)
    sock = socket_of(connection)
    if connection is None or sock is None:
        return
    previous = sock.gettimeout()
    sock.settimeout(READ_ARRIVED_WAIT)
    try:
        connection.listen(batch=64)
    finally:
        with contextlib.suppress(OSError):
            sock.settimeout(previous)


def _heard_since(handler: Any, began: float) -> bool:
    heard = last_heard(getattr(handler, "_connection", None))
    return heard is not None and heard > began


@contextlib.contextmanager
def _replaced(handler: Any, impl: Callable[..., None]) -> Iterator[None]:
    handler._send_message_impl = impl
    try:
        yield
    finally:
        with contextlib.suppress(AttributeError):
            del handler._send_message_impl  # the class's own again
