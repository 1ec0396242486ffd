"""What one paired sender's parts share (SPEC B2-B5, B10, F6): the :class:`SendContext`.

The attempt loop (:mod:`~spark_sb.sender.attempts`), the diverter (:mod:`~spark_sb.sender.diverter`), the rejects
and the prober (:mod:`~spark_sb.sender.prober`) each get the sender's context instead of callbacks into the
sender: its configuration, clock, retry policy and failover registry; the transport (built on first use, a
client rebuilt after a connection-class fault, none built after :meth:`SendContext.close`); the backlog choice;
where state transitions go (the call's outcome and the listener). The sender itself (:mod:`~spark_sb.sender.paired`)
only routes messages and carries out what the loop returns.

Where it runs: the sender's thread and its probe thread, in an executor's Python worker or any process; thread-safe
where the probe thread uses it (:meth:`transport`, :meth:`entity`); not picklable (live clients).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.clock import Clock
from spark_sb.core.errors import LaneClosed, describe_error
from spark_sb.failover.decisions import RetryPolicy
from spark_sb.failover.machine import EntityFailover
from spark_sb.failover.ordering import SessionBook
from spark_sb.failover.outcome import Tally
from spark_sb.failover.records import Listener, StateTransition, log_transition, log_transitions
from spark_sb.failover.registry import FailoverRegistry
from spark_sb.failover.rotation import BacklogChooser
from spark_sb.wire.sdk_transport import SdkTransport
from spark_sb.wire.transport import SECONDARY, Target, Transport

_LOGGER = logging.getLogger(__name__)


@dataclass(eq=False, kw_only=True)
class SendContext:
    """One paired sender's shared parts.

    Args:
        config: the sender's configuration.
        clock: injected time (sleeps between attempts go through it).
        policy: the retry policy of the attempt loop.
        registry: the failover state shared with the process's other senders.
        chooser: the backlog choice (rotation of the secondary's queues).
        primary_key / secondary_key: the namespaces' secret-free keys in the registry.
        listener: gets every state transition (default: logged, grouped, at the call's end).
        probe_budget: the deadline of each probe call.
        transport: an injected transport (tests); default an :class:`SdkTransport` built on first use.
        book: the held sessions of the primary namespace (the registry's) with ``ordering`` ``session`` or
            ``entity``; None with ``ordering: none``.
    """

    config: ServiceBusConfig
    clock: Clock
    policy: RetryPolicy
    registry: FailoverRegistry
    chooser: BacklogChooser
    primary_key: str
    secondary_key: str
    listener: Listener = log_transition
    probe_budget: float
    transport_given: Transport | None = None
    book: SessionBook | None = None
    closed: bool = field(default=False, init=False)
    _transport: Transport | None = field(default=None, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        self._transport = self.transport_given

    # -- the transport (B10: one per sender, both namespaces)
    def transport(self) -> Transport:
        """The sender's transport, built on first use. After :meth:`close` none is built: a probe still running
        meets :class:`~spark_sb.core.errors.LaneClosed`, which is evidence of nothing."""
        if self._transport is None:
            with self._lock:
                if self._transport is None:
                    if self.closed:
                        raise LaneClosed("the paired sender is closed")
                    self._transport = SdkTransport(self.config)
        return self._transport

    def fault(self, target: Target) -> None:
        """A call to ``target`` met a connection-class error: its client is rebuilt before the next use."""
        if self._transport is not None:
            self._transport.fault(target)

    def warm_backlog(self, entity: str) -> None:
        """``entity`` started failing: open the link to its backlog queue now, so that a failover diverts at once."""
        queue = self.chooser.choose(entity) if self.config.secondary is not None else None
        if queue is not None:
            self.transport().warm(Target(SECONDARY, queue))

    def close(self) -> None:
        """No transport is built after this; the one built is closed (in the background: never blocks)."""
        with self._lock:
            self.closed = True
            transport = self._transport
        if transport is not None:
            transport.close()

    # -- failover state
    def entity(self, entity: str) -> EntityFailover:
        """The failover state of the primary's ``entity`` (the registry's: shared by the process's senders)."""
        return self.registry.entity(
            self.primary_key,
            entity,
            failover_interval=float(self.config.failover_interval),
            ping_interval=float(self.config.ping_primary_interval),
        )

    def emit(self, tally: Tally | None, transitions: list[StateTransition]) -> None:
        """Hand ``transitions`` to the outcome and the listener. The default listener (logging) gets them at the
        call's end, grouped by kind (:meth:`log_emitted`): a namespace outage over E entities is two lines."""
        for t in transitions:
            if tally is not None:
                tally.transitions.append(t)
                if self.listener is log_transition:
                    tally.unlogged.append(t)
                    continue
            try:
                self.listener(t)
            except Exception as exc:  # the listener is observability only; its failure must not fail the send
                _LOGGER.error("state transition listener failed: %s", describe_error(exc))

    def log_emitted(self, tally: Tally) -> None:
        """Log the transitions that :meth:`emit` kept for the default listener, grouped."""
        if tally.unlogged:
            unlogged, tally.unlogged = tally.unlogged, []
            log_transitions(unlogged)
