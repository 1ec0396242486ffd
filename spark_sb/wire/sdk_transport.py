"""The real :class:`~spark_sb.wire.transport.Transport` over azure-servicebus: one shared connection per namespace.

Runs on executors (Python workers), built lazily there from the picklable
:class:`~spark_sb.config.service_bus.ServiceBusConfig`; not picklable; called from the sender's thread and its probe
thread. Each namespace has ONE AMQP connection (a :class:`~spark_sb.wire.connection.SharedConnection`) owned by a
:class:`~spark_sb.wire.lane.Lane`; every entity is a link on it (SPEC F2), links a batch needs open together (F3).
Every call has a deadline that holds whatever the SDK does; a send on a link known to be open runs on the caller's
thread (:meth:`~spark_sb.wire.lane.Lane.direct`). A timeout is the namespace's only when its connection was silent
for :data:`~spark_sb.wire.timing.NAMESPACE_SILENCE` (F7); the two namespaces' connections close as a pair (B10);
probes use an isolated transport of their own (F6). Why each of these: ``docs/design/wire.md``.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from spark_sb.core.errors import CLIENT_CLOSED, LaneClosed, classify, condition_of, mark_written
from spark_sb.message.backlog import to_backlog_sdk
from spark_sb.message.outbound import OutboundMessage
from spark_sb.message.packing import Encoded, encode
from spark_sb.wire.closing import abort_connection
from spark_sb.wire.connection import FoundDead, NeedsWorker, SharedConnection
from spark_sb.wire.lane import Finished, Lane, Pending, Withdrawn
from spark_sb.wire.opening import open_connection
from spark_sb.wire.parking import Parked, holds, resume_send, send_parkable
from spark_sb.wire.pyamqp_state import LinkLimits, link_limits
from spark_sb.wire.sdk_batch import UNKNOWN_LINK_BATCH, SdkBatch
from spark_sb.wire.timing import (
    CONNECTED_FRESH,
    MIN_CALL_LEFT,
    NAMESPACE_SILENCE,
    PREPARE_BASE,
    PREPARE_PER_LINK,
    QUIET,
    RESCUE_ROOM,
    RESUME_AT_LEAST,
    SLOW_MARGIN,
    TEND_EVERY,
    sdk_timeout,
)
from spark_sb.wire.transport import PRIMARY, SECONDARY, Batch, Target

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusSender

    from spark_sb.config.namespace import NamespaceConfig
    from spark_sb.config.service_bus import ServiceBusConfig

__all__ = ["SdkBatch", "SdkTransport"]

_LOGGER = logging.getLogger(__name__)


class SdkTransport:
    """The real :class:`~spark_sb.wire.transport.Transport` over azure-servicebus (sync). See the module docstring.

    One :class:`~spark_sb.wire.lane.Lane` per namespace: its own worker thread and ONE AMQP connection, every entity a
    link on it (SPEC F2: connections and threads do not grow with entities). Every call has a deadline that holds
    whatever the SDK does: a connection that does not answer (before or after SASL) is abandoned and rebuilt; a
    link that fails is closed and reopened alone, its connection and the other entities' links stay. Links to
    many entities open concurrently (:meth:`prepare`, SPEC F3). The SDK does not retry inside a call
    (``retry.total`` is 0, :class:`~spark_sb.config.service_bus.RetryConfig`): the paired sender's attempt loop retries, so
    each failed attempt reaches the failover timer at once. Batches are bounded by the link's batch size (known
    once the link is open) and by ``config.max_message_size``. Thread-safe.
    """

    def __init__(self, config: ServiceBusConfig, *, isolated: bool = False, **client_kwargs: Any) -> None:
        self._config = config
        # The isolated transport (SPEC F6, :meth:`isolated`): connections of their own for probes; built on first
        # use, closed with this one. ``_suffix`` names its lanes (threads) apart from the main ones.
        self._suffix = "-isolated" if isolated else ""
        self._extra_kwargs = client_kwargs
        self._isolated: SdkTransport | None = None
        # retry.total (always 0: RetryConfig): the attempt loop retries, so each failed attempt reaches the
        # failover timer at once.
        self._client_kwargs = {**config.client_kwargs(), **client_kwargs}
        self._lanes: dict[str, Lane[SharedConnection]] = {}  # one per namespace (two at most)
        # The namespace's latest connection (read by answered_within); two at most.
        self._last: dict[str, SharedConnection] = {}
        # (batch, message) size limits of each target's link; bounded by the targets this process sends to
        self._link_max: dict[Target, LinkLimits] = {}
        # The lane generation and time of each target's last answer; bounded like _link_max.
        self._answered: dict[Target, tuple[int, float]] = {}
        self._lock = threading.Lock()
        self._closed = False
        # Connections built per namespace (bumped each time one is built): for tests and benchmarks.
        self.generation: dict[str, int] = {PRIMARY: 0, SECONDARY: 0}
        self.direct_sends = 0  # sends that ran on the caller's thread (Lane.direct), for tests and benchmarks

    # -- plumbing
    def _namespace_config(self, namespace: str) -> NamespaceConfig:
        if namespace == PRIMARY:
            return self._config.primary
        if namespace == SECONDARY:
            if self._config.secondary is None:
                raise ValueError("no secondary namespace is configured (key 'secondary')")
            return self._config.secondary
        raise ValueError(f"unknown namespace {namespace!r}; valid: 'primary', 'secondary'")

    def _lane(self, namespace: str) -> Lane[SharedConnection]:
        with self._lock:
            if self._closed:
                raise LaneClosed("the Service Bus transport is closed")
            lane = self._lanes.get(namespace)
            if lane is None:
                ns = self._namespace_config(namespace)
                connect_timeout = float(self._config.send_timeout)

                def build() -> SharedConnection:
                    client = ns.client(**self._client_kwargs)

                    def opener(timeout: float) -> Any:
                        with self._lock:
                            self.generation[namespace] = self.generation.get(namespace, 0) + 1
                        return open_connection(client, timeout)

                    conn = SharedConnection(client, opener)
                    self._last[namespace] = conn
                    conn.ensure(connect_timeout)
                    return conn

                lane = Lane(
                    namespace + self._suffix,
                    build,
                    SharedConnection.close,
                    SharedConnection.unblock,
                    idle=SharedConnection.tend,
                    idle_every=TEND_EVERY,
                )
                self._lanes[namespace] = lane
            return lane

    def _call(
        self,
        target: Target,
        fn: Callable[[ServiceBusSender, float], Any],
        timeout: float,
        on_slow: Callable[[], None] | None = None,
    ) -> Any:
        entity = target.entity
        started = time.monotonic()

        def run(conn: SharedConnection) -> Any:
            # what is left of the deadline when the call starts, not all of it: a call that waited behind others
            # on the lane (probes of stalled entities on the isolated connection) gives up before the lane's
            # deadline, as a call that did not wait does, and costs its link, never the connection (SPEC F6)
            left = started + timeout - time.monotonic()
            if left < MIN_CALL_LEFT:
                raise Withdrawn(
                    f"{target}: {max(0.0, left):.2f} s of its deadline left when its turn came; not started"
                )
            return conn.on_link(entity, fn, left)

        generation: int | None = None  # the lane's worker (connection) the call ran on
        try:
            pending = self._lane(target.namespace).start(
                run, timeout, slow_after=timeout - SLOW_MARGIN, on_slow=on_slow
            )
            generation = pending.generation
            return pending.result()
        except Exception as exc:
            self._failed(target, exc, started, generation)
            raise

    def lifecycle(self, namespace: str) -> dict[str, int]:
        """What the connection's lifecycle cost so far (for tests, benchmarks and logs): ``connections`` built,
        ``dropped`` (found silent or closed between calls), ``detached`` (links the service detached, found between
        calls) and ``renewed`` (calls made once more on a fresh link or connection because the service had ended
        theirs). Counted since the namespace's lane was last built. No I/O."""
        conn = self._last.get(namespace)
        return {
            "connections": self.generation.get(namespace, 0),
            "dropped": conn.dropped if conn is not None else 0,
            "detached": conn.detached if conn is not None else 0,
            "renewed": conn.renewed if conn is not None else 0,
            "rescued": conn.rescued if conn is not None else 0,
        }

    def is_open(self, namespace: str) -> bool:
        """True while a connection for ``namespace`` exists (built and not closed)."""
        with self._lock:
            lane = self._lanes.get(namespace)
        return lane is not None and lane.live

    # -- Transport
    def connected(self, target: Target) -> bool:
        answered = self._answered.get(target)
        if answered is None or time.monotonic() - answered[1] > CONNECTED_FRESH:
            return False
        with self._lock:
            lane = self._lanes.get(target.namespace)
        return lane is not None and lane.live and lane.generation == answered[0]

    def answered_within(self, target: Target, seconds: float) -> bool:
        conn = self._last.get(target.namespace)
        heard = conn.heard() if conn is not None else None
        return heard is not None and time.time() - heard <= seconds

    def max_batch_size(self, target: Target) -> int:
        limit = self._config.max_message_size
        link = self._link_max.get(target)
        # before its link is open: no batch over the service's largest (Premium's 1 MB), whatever max_message_size
        return min(limit, link[0] if link else UNKNOWN_LINK_BATCH)

    def max_message_size(self, target: Target) -> int:
        limit = self._config.max_message_size
        link = self._link_max.get(target)
        return min(limit, link[1]) if link else limit

    def new_batch(self, target: Target) -> SdkBatch:
        from azure.servicebus import ServiceBusMessageBatch

        sdk_batch = ServiceBusMessageBatch(max_size_in_bytes=self.max_batch_size(target))
        return SdkBatch(target, sdk_batch, self.max_message_size(target))

    def send(
        self,
        batch: Batch,
        timeout: float,
        on_slow: Callable[[], None] | None = None,
        park_after: float | None = None,
    ) -> None:
        if len(batch) == 0:
            return
        if isinstance(batch, SdkBatch):
            payload: Any = batch.payload
        else:  # a foreign batch: let the SDK pack it (raises if it does not fit one batch)
            payload = [m.to_sdk() for m in batch.messages]
        target = batch.target
        started = time.monotonic()
        park_at = None if park_after is None else started + park_after
        written = False  # the batch was handed to the SDK's send on an open link: it may land (SPEC B14)

        def on_link(sender: ServiceBusSender, left: float) -> Any:
            nonlocal written
            written = True
            # The SDK's own timeout ends a send on an open link a little before the lane's deadline: a stalled
            # entity then costs its link only, not the connection every other entity uses.
            if park_at is None:
                sender.send_messages(payload, timeout=sdk_timeout(left))
            else:
                ticket = send_parkable(sender, payload, sdk_timeout(left), park_at)
                if ticket is not None:
                    raise Parked(target, started, started + timeout, (ticket, payload))
            return link_limits(sender)

        try:
            self._on_link(
                target,
                on_link,
                timeout,
                on_slow,
                started,
                QUIET if park_after is None else min(park_after, QUIET),
            )
        except Exception as exc:  # Parked too: no failure, the mark is never read there
            if written:
                mark_written(exc)
            raise

    def resume(
        self, parked: Parked, on_slow: Callable[[], None] | None = None, park_after: float | None = None
    ) -> None:
        """Finish a parked send (see :meth:`Transport.resume`): wait for its answer within its own deadline (read
        meanwhile by any call on the connection, or now); if its link was dropped or replaced while it was parked
        (its connection found dead, say), the batch is sent once more on a fresh one within the same deadline
        (at-least-once, as for any retry). ``park_after``: parked again if not answered by then."""
        ticket, payload = parked.ticket
        target = parked.target
        started = time.monotonic()
        timeout = max(parked.deadline - started, RESUME_AT_LEAST)
        park_at = None if park_after is None else started + park_after

        def on_link(sender: ServiceBusSender, left: float) -> Any:
            if holds(sender, ticket):
                if resume_send(sender, payload, ticket, sdk_timeout(left), park_at):
                    raise Parked(target, parked.started, parked.deadline, parked.ticket)
            else:
                sender.send_messages(payload, timeout=sdk_timeout(left))
            return link_limits(sender)

        # no new call: it finishes one already on the wire, with RESUME_AT_LEAST at least (its minimum)
        try:
            self._on_link(target, on_link, timeout, on_slow, started, QUIET, minimum=0.0)
        except Exception as exc:  # its transfer was written when it parked (SPEC B14); Parked again: unread
            mark_written(exc)
            raise

    def _on_link(
        self,
        target: Target,
        on_link: Callable[[ServiceBusSender, float], Any],
        timeout: float,
        on_slow: Callable[[], None] | None,
        started: float,
        quiet: float,
        minimum: float = MIN_CALL_LEFT,
    ) -> None:
        """``on_link(sender, seconds_left)`` on the link to ``target``, within ``timeout`` (see :meth:`send`). Not
        started (:class:`~spark_sb.wire.lane.Withdrawn`) with less than ``minimum`` of the deadline left, at once or
        when its turn on the lane's worker comes (SPEC F10), as :meth:`_call`."""
        if timeout < minimum:
            raise Withdrawn(f"{target}: {max(0.0, timeout):.2f} s of its deadline at its start; not started")
        entity = target.entity
        # The SDK waits at most ``timeout`` (the attempt's budget); a connection found dead while it waits may take
        # RESCUE_ROOM more to make the send once more on a fresh one (SharedConnection.on_link, SPEC L1): the
        # lane's deadline allows for it - when there is an open connection to find dead. A call that must open one
        # first (a cold sender, a namespace whose connection was abandoned) has the attempt's budget alone: with
        # the room, a namespace that stalls new connections failed over 0.57 s past the interval, not 0.07 s
        # (bench_failover.py, stall-after-sasl-cold and stall-before-sasl-cold; goal 0.5 s).
        room = RESCUE_ROOM if self._connection_open(target.namespace) else 0.0
        lane = self._lane(target.namespace)
        rescuing = False

        def send(conn: SharedConnection) -> Any:
            # what is left when its turn comes on the worker (after calls queued before it): too little, and the
            # SDK could not answer in time - the call would cost its link or overrun the lane's deadline
            left = started + timeout + (room if rescuing else 0.0) - time.monotonic()
            if left < minimum:
                raise Withdrawn(
                    f"{target}: {max(0.0, left):.2f} s of its deadline left when its turn came; not started"
                )
            if rescuing:  # the direct call found the connection dead: the rest of the room, on a fresh one
                return conn.on_link(entity, on_link, left)
            return conn.on_link(entity, on_link, left, rescue=room, quiet=quiet)

        def send_direct(conn: SharedConnection) -> Any:
            return conn.on_link(entity, on_link, timeout, may_connect=False, rescue=room, quiet=quiet)

        # On a link known to be open the SDK bounds the send itself (its timeout covers the wait for the answer;
        # no connect, SASL or CBS): send on this thread, the lane's watchdog keeping the deadline.
        pending: Pending[Any] | Finished[Any] | None = (
            lane.direct(send_direct, timeout + room, slow_after=timeout - SLOW_MARGIN, on_slow=on_slow)
            if self.connected(target)
            else None
        )
        if isinstance(pending, Finished) and isinstance(pending.error, NeedsWorker):
            # the connection went away meanwhile, or was found dead while the send waited: a new one is opened on
            # the worker, within what is left of the same deadline
            rescuing = isinstance(pending.error, FoundDead)
            if rescuing:
                self.direct_sends += 1  # it did send on this thread, then found the connection dead
            pending = None
        if pending is None:
            elapsed = time.monotonic() - started
            left = max(0.0, timeout + room - elapsed)
            pending = lane.start(send, left, slow_after=timeout - SLOW_MARGIN - elapsed, on_slow=on_slow)
        else:
            self.direct_sends += 1
        self._settled(target, pending)

    def _connection_open(self, namespace: str) -> bool:
        """The namespace's current lane holds an open connection (one that a call waiting on it may find dead)."""
        with self._lock:
            lane = self._lanes.get(namespace)
        conn = self._last.get(namespace)
        return lane is not None and lane.live and conn is not None and not conn.broken

    def _settled(self, target: Target, pending: Pending[Any] | Finished[Any]) -> None:
        try:
            link_max = pending.result()
        except Parked:
            raise  # no answer yet, no failure either: the caller resumes it
        except Exception as exc:
            self._answered.pop(target, None)
            self._failed(target, exc, pending.started, pending.generation)
            raise
        self._answered[target] = (pending.generation, time.monotonic())
        if isinstance(link_max, LinkLimits):
            self._link_max[target] = link_max

    def prepare(self, targets: Iterable[Target], silence: float) -> dict[Target, BaseException]:
        """Open the links to ``targets`` that are not open yet, concurrently, one connection per namespace (SPEC
        F3), within ``PREPARE_BASE + PREPARE_PER_LINK * n`` seconds. Returns the per-target errors; raises when a
        namespace's connection failed (every target of it has that error): not open within ``silence`` seconds,
        or silent for ``silence`` seconds while links wait."""
        by_ns: dict[str, list[str]] = {}
        for t in targets:
            if not self.connected(t):
                by_ns.setdefault(t.namespace, []).append(t.entity)
        errors: dict[Target, BaseException] = {}
        for namespace, entities in by_ns.items():
            budget = PREPARE_BASE + PREPARE_PER_LINK * len(entities)
            lane = self._lane(namespace)
            try:
                # the connection first: a namespace that does not answer costs silence
                lane.call(functools.partial(SharedConnection.ensure, timeout=silence), silence)
                failed = lane.call(
                    functools.partial(
                        SharedConnection.open_links, entities=entities, timeout=budget, silence=silence
                    ),
                    budget + SLOW_MARGIN,
                )
            except Exception as exc:
                if classify(exc).rebuild_client:
                    self.fault(Target(namespace, entities[0]))
                raise
            generation = lane.generation
            now = time.monotonic()
            for entity in entities:
                target = Target(namespace, entity)
                if entity in failed:
                    errors[target] = failed[entity]
                else:
                    self._answered[target] = (generation, now)
        return errors

    def schedule(self, target: Target, message: OutboundMessage, at: datetime, timeout: float) -> int:
        sdk_message = message.to_sdk()
        numbers = self._call(
            target,
            lambda sender, left: sender.schedule_messages(sdk_message, at, timeout=sdk_timeout(left)),
            timeout,
        )
        return int(numbers[0])

    def cancel_scheduled(self, target: Target, sequence_number: int, timeout: float) -> None:
        self._call(
            target,
            lambda sender, left: sender.cancel_scheduled_messages(sequence_number, timeout=sdk_timeout(left)),
            timeout,
        )

    def prepare_backlog(self, original: OutboundMessage, entity: str, enqueued: datetime) -> Encoded:
        return encode(to_backlog_sdk(original, entity, enqueued))

    def isolated(self) -> SdkTransport:
        """The isolated transport (see :meth:`Transport.isolated`): the same configuration, lanes and connections
        of its own (one per namespace, as here), built on first use and closed with this one; on the isolated
        transport itself, itself. Raises :class:`~spark_sb.wire.lane.LaneClosed` once closed: nothing is built after
        :meth:`close`."""
        if self._suffix:
            return self
        with self._lock:
            if self._closed:
                raise LaneClosed("the Service Bus transport is closed")
            if self._isolated is None:
                self._isolated = SdkTransport(self._config, isolated=True, **self._extra_kwargs)
            return self._isolated

    def warm(self, target: Target) -> None:
        timeout = float(self._config.send_timeout)
        entity = target.entity
        self._lane(target.namespace).submit(lambda conn: conn.open_links([entity], timeout))

    def _failed(self, target: Target, exc: BaseException, started: float, generation: int | None) -> None:
        """A call to ``target`` that started at ``started`` (monotonic) on the lane's worker ``generation`` (None:
        it never reached a worker) failed with ``exc``: the link was closed already; the connection it met is closed
        too (rebuilt on next use) - never a newer one another call built since - unless the failure was the link's
        alone - a
        link-level error condition, or a timeout while the connection kept answering (a stalled entity). Two
        failures say nothing about the connection and leave it alone: a call that met a client closed on our side
        (``client_closed``: a lane reset or abandoned by another call already decided; closing is never evidence,
        SPEC F7) and a call withdrawn unstarted from a busy lane (:class:`~spark_sb.wire.lane.Withdrawn`)."""
        cls = classify(exc)
        if not cls.rebuild_client or cls is CLIENT_CLOSED or isinstance(exc, Withdrawn):
            return
        condition = condition_of(exc) or ""
        if condition.startswith("amqp:link:"):
            return
        if cls.name == "timeout" and self.answered_within(target, NAMESPACE_SILENCE):
            return  # the connection is alive (heard within a heartbeat): only the entity stalled (F6, F7)
        with self._lock:
            lane = self._lanes.get(target.namespace)
        if generation is None or lane is None or not lane.live or lane.generation != generation:
            return  # no connection met, or the one met was replaced already (by an abandonment or a reset)
        _LOGGER.info(
            "%s: the connection faulted (%s): it is closed and rebuilt on next use", target, cls.name
        )
        if cls.name == "timeout":  # silent past its heartbeat: reset, so that nothing left on it lands later
            conn = lane.context(generation)
            if conn is not None and conn.connection is not None:
                abort_connection(conn.connection)
        lane.reset("faulted", generation)

    def fault(self, target: Target) -> None:
        """The call to ``target`` failed with a connection-class error: if its namespace's connection is broken
        (closed, dropped, abandoned at a deadline) it is closed in the background and rebuilt on next use; if only
        the link failed, the link was closed already and the connection stays (the other entities keep theirs).
        Never blocks. A primary outage is exactly when the backlog's connection is needed, so it is not torn down
        with it (B10's pair closing is :meth:`close_namespace` and :meth:`close`)."""
        with self._lock:
            lane = self._lanes.get(target.namespace)
        if lane is None or not lane.live:
            return
        conn = lane.context()
        if conn is None or conn.connection is None or conn.broken:
            _LOGGER.info("%s: the connection faulted: it is closed and rebuilt on next use", target)
            lane.reset("faulted")

    def close_namespace(self, namespace: str) -> None:
        """Close one namespace's connection: its partner's is closed too (B10), all in the background."""
        self._reset_all()

    def close(self) -> None:
        """Close every connection in the background (never blocks), the isolated transport's too. Final: a later
        call (a probe still running, say) raises :class:`~spark_sb.wire.lane.LaneClosed` instead of opening a connection
        nobody would close."""
        with self._lock:
            self._closed = True
            lanes = list(self._lanes.values())
            isolated = self._isolated
        for lane in lanes:
            lane.close()
        if isolated is not None:
            isolated.close()

    def _reset_all(self) -> None:
        with self._lock:
            lanes = list(self._lanes.values())
            isolated = self._isolated
        for lane in lanes:
            lane.reset()
        if isolated is not None:
            isolated._reset_all()

    def __enter__(self) -> SdkTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        with self._lock:
            live = sorted(ns for ns, lane in self._lanes.items() if lane.live)
        return f"SdkTransport(open={live})"
