"""The parts of a :class:`~spark_sb.syphon.mover.Syphon` share this: its settings, clients and counters (declared
here, set by ``Syphon.__init__``), the line of a received message, how held messages are settled, its logger.

A syphon is one class put together from parts, a module each: :mod:`~spark_sb.syphon.probing` (may it move to an
entity now), :mod:`~spark_sb.syphon.forwarding` (send to the primary, settle in the backlog),
:mod:`~spark_sb.syphon.peeking` (the queue as peeks show it; deferred messages fetched), :mod:`~spark_sb.syphon.sorting`
(what one receive batch becomes), :mod:`~spark_sb.syphon.mover` (the class and its drain loop). The guarantees and
the reasons: docs/design/syphon.md.

Where it runs: in the syphon's process, on the thread that drains (see :mod:`spark_sb.syphon.mover`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.clock import Clock
from spark_sb.failover.ordering import Acknowledgements, order_key
from spark_sb.message.backlog import BACKLOG_SESSION_ID
from spark_sb.syphon.lines import LineKey, QueueView
from spark_sb.syphon.receivers import Held, Pairs, SettleAction, path_of, settle
from spark_sb.syphon.rules import EntityGate, SyphonOutcome
from spark_sb.wire.duplicate_detection import PrimaryWindows
from spark_sb.wire.receivers import ReceiverLane
from spark_sb.wire.sdk_transport import SdkTransport

if TYPE_CHECKING:  # pragma: no cover
    from azure.servicebus import ServiceBusReceivedMessage


#: The syphon's one logger (every part logs under the name users configure: ``spark_sb.syphon.mover``).
log = logging.getLogger("spark_sb.syphon.mover")


class SyphonBase:
    """The state a syphon's parts share, set by :class:`~spark_sb.syphon.mover.Syphon`'s ``__init__``."""

    config: ServiceBusConfig
    clock: Clock
    ordered: bool
    record_ids: bool
    acks: Acknowledgements | None
    gate: EntityGate
    lock_duration: float
    _primary: SdkTransport
    #: SPEC B14: the primary entities' duplicate detection windows (asked for ambiguous messages only)
    windows: PrimaryWindows
    _missing: dict[str, bool]
    _warned_markers: bool
    _cancelled: threading.Event

    def _settle(
        self, lane: ReceiverLane, held: Sequence[Held], action: SettleAction, outcome: SyphonOutcome
    ) -> None:
        """Settle ``held`` on their receiver's lane thread (:func:`~spark_sb.syphon.receivers.settle`, deadline
        ``send_timeout``): failures are counted, never raised (B11)."""
        settle(lane, held, action, outcome, float(self.config.send_timeout))

    @staticmethod
    def _add(into: SyphonOutcome | None, outcome: SyphonOutcome) -> None:
        if into is not None:
            merged = into.merge(outcome)
            into.__dict__.update(merged.__dict__)

    @staticmethod
    def _gone(view: QueueView | None, pairs: Pairs) -> None:
        if view is not None:
            for h in pairs:
                view.gone(h.sequence)

    def _line(self, lane: ReceiverLane, h: Held) -> LineKey | None:
        """:meth:`_line_of` of a held message, worked out once."""
        line = h.line
        if line is False:
            line = h.line = self._line_of(lane, h.msg)
        return line

    def _line_of(self, lane: ReceiverLane, msg: ServiceBusReceivedMessage) -> LineKey | None:
        """The line of a received backlog message with ``ordering`` on - (queue, entity, session id or ``""``) -,
        None when it keeps no order (``ordering: none``, a dead-letter queue, no session id with ``session``)."""
        if not self.ordered or lane.dead_letter:
            return None
        entity = path_of(msg)
        if entity is None:
            return None
        props = getattr(msg, "application_properties", None) or {}
        raw = props.get(BACKLOG_SESSION_ID.encode(), props.get(BACKLOG_SESSION_ID))
        session = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        key = order_key(self.config.ordering, None if session is None else str(session))
        return None if key is None else (lane.queue, entity, key)
