"""The syphon's backlog side: the messages its receivers received (:class:`Held`), and how they are settled
(complete, abandon, dead-letter) on the receivers' lane thread within a deadline (SPEC B11, B12). The receivers
themselves are links on one connection (:mod:`spark_sb.wire.receivers`).

* :func:`settle` settles held messages in one lane call (deadline ``send_timeout``); a message from a receiver
  that was replaced since, or a settle that fails, is counted in the :class:`~spark_sb.syphon.rules.SyphonOutcome`
  and never raised: its lock runs out and it is redelivered.

Where it runs: in the process of the :class:`~spark_sb.syphon.mover.Syphon` that drains (executors' Python workers in
the Spark syphon job; the driver in tests and tools), on the receivers' lane thread. Nothing here is picklable.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from spark_sb.message.outbound import OutboundMessage
from spark_sb.syphon.rules import DEAD_LETTER_PROPERTIES, SyphonOutcome
from spark_sb.wire.receivers import ReceiverLane, Receiving

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

    def settle_all(ctx: Receiving) -> int:
        if action is complete and len(live) > 1 and complete_in_one_call(ctx.receiver, live):
            return 0
        failed = 0
        for h in live:
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


def complete_in_one_call(receiver: ServiceBusReceiver, held: Sequence[Held]) -> bool:
    """Complete ``held`` with one management request (update-disposition by lock tokens: one round trip for the
    batch instead of one per message, which the SDK's ``complete_message`` waits for). Uses the SDK's own
    management-link settlement (a private method); False when it is unavailable or fails, so that the caller
    completes message by message (a message completed here then fails there: counted, harmless)."""
    settle_via_mgmt = getattr(receiver, "_settle_message_via_mgmt_link", None)
    if settle_via_mgmt is None:
        return False
    try:
        settle_via_mgmt("completed", [h.msg.lock_token for h in held])
    except Exception as exc:  # noqa: BLE001 - fall back to one complete per message
        log.debug("syphon: completing %d messages in one call failed (%s)", len(held), type(exc).__name__)
        return False
    for h in held:
        with contextlib.suppress(AttributeError):
            h.msg._settled = True  # noqa: SLF001 - the SDK's own flag: settled, never settle again
    return True


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
