"""One probe of a primary entity (SPEC B8): is the entity answering? The same call for a sender's prober
(:mod:`spark_sb.sender.prober`) and the syphon (:mod:`spark_sb.syphon.mover`).

Runs on the caller's thread, in any process; each call of the probe within its budget (the transport's deadline).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

from spark_sb.core.errors import ErrorClass, classify, describe_error
from spark_sb.message.backlog import PROBE_SCHEDULE_AHEAD, probe_message
from spark_sb.wire.transport import Target, Transport

_LOGGER = logging.getLogger(__name__)

#: ``retry(call, target)``: run ``call(timeout)`` under the sender's retry policy for probes; returns the error
#: class and error of the last attempt, or ``(None, None)`` when it succeeded.
Retry = Callable[[Callable[[float], object], Target], tuple[ErrorClass | None, BaseException | None]]


@dataclass(frozen=True)
class Probed:
    """What one probe of a primary entity did, when the entity answered (:func:`probe_call`)."""

    #: ``schedule`` mode: the scheduled probe message's sequence number.
    sequence_number: int | None = None
    cancel_attempts: int = 0
    #: ``schedule`` mode: whether the probe message was cancelled (False: it stays, marked, with a 1 s TTL).
    cancel_ok: bool | None = None
    detail: str = ""


def probe_call(
    transport: Transport, target: Target, mode: str, budget: float, retry: Retry, at: datetime
) -> Probed:
    """One probe of a primary entity (SPEC B8), the same for a sender's :class:`Prober` and the syphon: ``ping``
    sends a probe message; ``schedule`` schedules one far ahead and cancels it (the cancel made under ``retry``).
    Each call within ``budget`` seconds. Raises what the send or the schedule raised: the entity did not answer.
    A cancel that failed is a success of the probe (the entity answered), logged; the message is marked as a
    probe (:func:`~spark_sb.message.backlog.is_probe`) with a 1 s TTL. Runs on the caller's thread."""
    entity = target.entity
    msg = probe_message(entity, mode)
    if mode == "ping":
        batch = transport.new_batch(target)
        batch.try_add(msg)
        transport.send(batch, budget)
        return Probed()
    # The service's clock is real: the wire time comes from the real UTC clock (an injected test clock may be
    # anywhere), so the probe is always scheduled far in the service's future.
    wire_at = max(at, datetime.now(timezone.utc)) + PROBE_SCHEDULE_AHEAD
    number = transport.schedule(target, msg, wire_at, budget)
    tries: list[int] = []

    def cancel(timeout: float) -> None:
        tries.append(1)
        transport.cancel_scheduled(target, number, timeout)

    error_class, error = retry(cancel, target)
    detail = ""
    if error_class is None:
        cancel_ok = True
    elif error_class.name == "message_not_found":
        # Nothing scheduled under that number any more: an earlier cancel went through but its answer was lost
        # (a retry), or - on the first try - it is gone already.
        cancel_ok = len(tries) > 1
        detail = "" if cancel_ok else f"cancel failed: {describe_error(error or Exception())}"
    else:
        cancel_ok = False
        detail = f"cancel failed: {describe_error(error or Exception())}"
    if not cancel_ok:
        _LOGGER.warning(
            "probe of entity %r: the scheduled probe message %s could not be cancelled; it is marked as a probe "
            "(is_probe) with a 1 s TTL",
            entity,
            number,
        )
    return Probed(number, len(tries), cancel_ok, detail)


def single_attempt(budget: float) -> Retry:
    """A :data:`Retry` that makes the call once, within ``budget`` (for callers without a retry policy of their
    own: the syphon's probes)."""

    def once(
        call: Callable[[float], object], target: Target
    ) -> tuple[ErrorClass | None, BaseException | None]:
        try:
            call(budget)
        except Exception as exc:  # noqa: BLE001 - returned to the caller, as a retry loop's last error
            return classify(exc), exc
        return None, None

    return once
