"""The syphon's backlog side: the messages its receivers received (:class:`Held`), and how they are settled
(complete, abandon, dead-letter) on the receivers' lane thread within a deadline (SPEC B11, B12). The receivers
themselves are links on one connection (:mod:`spark_sb.wire.receivers`).

* :func:`settle` settles held messages in one lane call (deadline ``send_timeout``); a message from a receiver
  that was replaced since, or a settle that fails, is counted in the :class:`~spark_sb.syphon.rules.SyphonOutcome`
  and never raised: its lock runs out and it is redelivered.
* Every message is settled on the receiver link that received it (SPEC E8: a lock token is the receiving link's);
  several completions go in one round trip on that link (:func:`complete_on_link`). Deferred messages the ordered
  drain fetched by sequence number are settled through ``$management``, as the service requires (completions in
  one request: :func:`complete_by_management`).

Where it runs: in the process of the :class:`~spark_sb.syphon.mover.Syphon` that drains (executors' Python workers in
the Spark syphon job; the driver in tests and tools), on the receivers' lane thread. Nothing here is picklable.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

from spark_sb.message.outbound import OutboundMessage
from spark_sb.syphon.rules import DEAD_LETTER_PROPERTIES, SyphonOutcome
from spark_sb.wire.receivers import ReceiverLane, Receiving, dispose_on_link

if TYPE_CHECKING:  # pragma: no cover
    from azure.servicebus import ServiceBusReceivedMessage, ServiceBusReceiver

log = logging.getLogger(__name__)

#: What a settle does to one message, on the receiver lane's thread.
SettleAction = Callable[["ServiceBusReceiver", "ServiceBusReceivedMessage"], None]


@dataclass
class Held:
    """A received message, the lane generation that received it, and what to do with it."""

    msg: ServiceBusReceivedMessage
    generation: int
    restored: OutboundMessage | None = None
    #: When its lock runs out, on the syphon's monotonic clock (None: unknown).
    lock_ends: float | None = None
    #: Its line with ordering, once the syphon worked it out (``Syphon._line``: read once, not per use); False: not yet.
    line: tuple[str, str, str] | None | Literal[False] = False
    #: SPEC B14: when its primary send that may have landed was attempted (the backlog form's mark), if it was.
    attempted: datetime | None = None

    @cached_property
    def sequence(self) -> int | None:
        """Its sequence number (read from the SDK message once: each read decodes its annotations)."""
        value = getattr(self.msg, "sequence_number", None)
        return None if value is None else int(value)


Pairs = list[Held]


def settle(
    lane: ReceiverLane,
    held: Sequence[Held],
    action: SettleAction,
    outcome: SyphonOutcome,
    timeout: float,
) -> None:
    """Settle ``held`` on their receiver's lane thread, in one lane call (deadline ``timeout``). A message from a
    receiver that was replaced since cannot be settled: counted, it is redelivered after its lock expires. Settle
    failures are logged and counted, never raised (B11)."""
    if not held:
        return
    generation = lane.generation
    live = [h for h in held if h.generation == generation]
    stale = len(held) - len(live)
    if stale:
        outcome.settle_failures += stale
        log.info("syphon: %d messages from a replaced receiver: they will be redelivered", stale)
    if not live:
        return
    #: Outcomes of a batch of completions are awaited until then, within the lane call's deadline.
    outcomes_by = time.monotonic() + timeout * OUTCOME_SHARE

    def settle_all(ctx: Receiving) -> int:
        failed = 0
        on_link = [h for h in live if not by_sequence(h)]
        fetched = [h for h in live if by_sequence(h)]
        if action is complete and len(fetched) > 1:
            # received by sequence number: settled through $management, all in one request
            failed += complete_by_management(ctx.receiver, fetched)
            fetched = []
        if action is complete and len(on_link) > 1:
            not_done = complete_on_link(ctx.receiver, on_link, outcomes_by)
            if not_done is not None:
                if not_done:
                    log.info("syphon: %d completions not confirmed; they will be redelivered", len(not_done))
                failed += len(not_done)
                on_link = []
        for h in on_link + fetched:
            try:
                action(ctx.receiver, h.msg)
            except Exception as exc:  # noqa: BLE001 - B11: logged and counted; redelivery follows
                failed += 1
                log.info("syphon: settle failed (%s); the message will be redelivered", type(exc).__name__)
        return failed

    try:
        outcome.settle_failures += lane.call(settle_all, timeout)
    except Exception as exc:  # noqa: BLE001 - deadline or closed lane: the locks run out, redelivery follows
        outcome.settle_failures += len(live)
        log.info("syphon: settling %d messages failed (%s)", len(live), type(exc).__name__)


# -- settle actions (run on the receiver lane's thread) --------------------------------------------------------
def complete(receiver: ServiceBusReceiver, msg: ServiceBusReceivedMessage) -> None:
    receiver.complete_message(msg)


def defer(receiver: ServiceBusReceiver, msg: ServiceBusReceivedMessage) -> None:
    """Defer: the message keeps its place, no receive returns it, its delivery count stays; fetched again by its
    sequence number (the syphon's ordered drain, SPEC O7)."""
    receiver.defer_message(msg)


def by_sequence(h: Held) -> bool:
    """Was ``h`` received by sequence number (a deferred message: settled through ``$management``)?"""
    return bool(getattr(h.msg, "_is_deferred_message", False))


def complete_by_management(receiver: ServiceBusReceiver, held: Sequence[Held]) -> int:
    """Complete messages received by sequence number in one ``$management`` update-disposition (the SDK sends one
    per message); returns how many were not completed (all of them when the request failed: redelivered after their
    locks, still deferred)."""
    settle_via: Any = getattr(receiver, "_settle_message_via_mgmt_link", None)
    if settle_via is None:
        failed = 0
        for h in held:
            try:
                receiver.complete_message(h.msg)
            except Exception:  # noqa: BLE001 - counted; redelivery follows
                failed += 1
        return failed
    try:
        settle_via("completed", [h.msg.lock_token for h in held])
    except Exception as exc:  # noqa: BLE001 - counted; they stay deferred and are fetched again
        log.info("syphon: completing %d fetched messages failed (%s)", len(held), type(exc).__name__)
        return len(held)
    for h in held:
        with contextlib.suppress(AttributeError):
            h.msg._settled = True  # noqa: SLF001 - the SDK's own flag: settled, never settle again
    return 0


#: The share of a settle call's deadline spent awaiting the outcomes of a batch of completions.
OUTCOME_SHARE = 0.8


def complete_on_link(
    receiver: ServiceBusReceiver, held: Sequence[Held], deadline: float
) -> list[Held] | None:
    """Complete ``held`` on the receiver link that received them, in one round trip (one disposition frame per run
    of consecutive delivery ids, then one wait until ``deadline``, ``time.monotonic()``): :func:`~spark_sb.wire.
    receivers.dispose_on_link` with ``accepted``. Returns the messages whose completion was not confirmed
    (redelivered when their locks run out), or None when this SDK's link offers no such way (the caller completes
    one by one, as the SDK does)."""
    return dispose_on_link(receiver, held, deadline, None, _message_of)


def _message_of(h: Held) -> Any:
    return h.msg


def abandon(receiver: ServiceBusReceiver, msg: ServiceBusReceivedMessage) -> None:
    receiver.abandon_message(msg)


def dead_letter_action(reason: str, description: str) -> SettleAction:
    def act(receiver: ServiceBusReceiver, msg: ServiceBusReceivedMessage) -> None:
        receiver.dead_letter_message(msg, reason=reason, error_description=description)

    return act


# -- received messages -----------------------------------------------------------------------------------------
def as_utc(dt: datetime) -> datetime:
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


def from_received(msg: ServiceBusReceivedMessage, dead_letter: bool) -> OutboundMessage:
    """The received message as an outbound one; from a dead-letter queue, without the service's dead-letter
    properties."""
    out = OutboundMessage.from_received(msg)
    if dead_letter and any(k in out.properties for k in DEAD_LETTER_PROPERTIES):
        props = {k: v for k, v in out.properties.items() if k not in DEAD_LETTER_PROPERTIES}
        out = replace(out, properties=props)
    return out


def text_of(value: Any) -> str | None:
    """A message id (str or bytes) as text."""
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def path_of(msg: Any) -> str | None:
    """The primary entity a backlog message is for (its ``x-ms-path`` property), or None."""
    props = getattr(msg, "application_properties", None) or {}
    value = props.get(b"x-ms-path", props.get("x-ms-path"))
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return None if value is None else str(value)
