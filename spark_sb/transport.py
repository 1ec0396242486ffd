"""The seam between the paired sender and the azure-servicebus SDK.

:class:`Transport` is what :class:`spark_sb.sender.PairedSender` needs: size-bounded batches for a target
(namespace + entity), sending one batch, scheduling/cancelling a probe message, and closing. Every method may
raise the SDK's exceptions; :func:`spark_sb.errors.classify` says what they mean. Unit tests use a fake
transport behind this interface (``tests/unit/fakes.py``).

:class:`SdkTransport` is the real one. It runs on executors (Python workers), is built lazily there from the
picklable :class:`~spark_sb.config.ServiceBusConfig`, and is not picklable. Every call has a deadline that holds
whatever the SDK does: each target (namespace + entity) has a :class:`~spark_sb.lane.Lane` - a worker thread that
owns that target's ``ServiceBusClient`` and ``ServiceBusSender`` - and a call that misses its deadline abandons
the client (closed in the background, never awaited) and the next call builds a new one. A batch send on a link
known to be open runs on the caller's thread (:meth:`~spark_sb.lane.Lane.direct`: the SDK bounds that phase
itself, the lane's watchdog keeps the deadline), which keeps the failed-over and healthy paths at the raw SDK's
speed; connecting, SASL and CBS always run on the lane's thread. SPEC B10: the two
namespaces' clients are a pair - closing one closes both, and the pair is rebuilt on the next use. A faulted
client (a connection-class error) is closed and rebuilt alone: tearing the backlog's clients down with a failing
primary's would make every failover wait for new backlog connections.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from spark_sb.backlog import to_backlog_sdk
from spark_sb.errors import classify
from spark_sb.lane import Finished, Lane, LaneClosed, Pending
from spark_sb.message import OutboundMessage

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusClient, ServiceBusMessageBatch, ServiceBusSender

    from spark_sb.config import NamespaceConfig, ServiceBusConfig

_LOGGER = logging.getLogger(__name__)

PRIMARY = "primary"
SECONDARY = "secondary"

#: How long before its deadline a call still unanswered counts as slow: enough to open a new connection with
#: the SDK (about 0.5 s), so that a link opened then is ready when the call fails.
SLOW_MARGIN = 1.0

#: How recent a link's last answer must be for the link to count as connected (:meth:`Transport.connected`):
#: well under the service's idle-connection timeout, after which a send would reconnect first.
CONNECTED_FRESH = 60.0


@dataclass(frozen=True)
class Target:
    """Where a batch goes: ``namespace`` is ``"primary"`` or ``"secondary"``; ``entity`` a queue or topic."""

    namespace: str
    entity: str

    def __str__(self) -> str:
        return f"{self.namespace}:{self.entity}"


class Batch(Protocol):
    """A size-bounded batch of messages for one target, built by :meth:`Transport.new_batch`."""

    target: Target

    @property
    def messages(self) -> list[OutboundMessage]:
        """The messages added with :meth:`try_add`, in order (to re-send or divert them on failure)."""

    def try_add(self, message: OutboundMessage) -> bool:
        """Add ``message`` if it fits; False if it does not (the batch is unchanged). May raise
        ``spark_sb.message.RejectError`` / ``ValueError`` / ``TypeError`` when it cannot become an SDK message."""

    def try_add_backlog(self, original: OutboundMessage, entity: str, enqueued: datetime) -> bool:
        """Add the backlog translation (SPEC B6) of ``original``, destined for ``entity``, if it fits; translated
        and encoded once. The caller keeps the originals. Raises like :meth:`try_add`."""

    def __len__(self) -> int: ...


class Sending(Protocol):
    """A send started with :meth:`Transport.start_send`."""

    def result(self) -> None:
        """Wait for the send (within the deadline it was started with); returns when the service accepted the
        batch, raises what :meth:`Transport.send` would."""


class Settled:
    """A :class:`Sending` that has already finished: ``error`` None is success (for transports that send
    synchronously, and for a send that could not start)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error

    def result(self) -> None:
        if self.error is not None:
            raise self.error


class Transport(Protocol):
    """The paired sender's view of Service Bus. Every operation that does I/O takes ``timeout`` (seconds) and
    returns or raises within it (a :class:`~spark_sb.lane.DeadlineExceeded` past it). May be called from the
    sender's thread and its probe thread."""

    def max_batch_size(self, target: Target) -> int:
        """The size limit in bytes of a batch for ``target`` (no I/O)."""

    def new_batch(self, target: Target) -> Batch:
        """An empty batch for ``target`` (no I/O)."""

    def send(self, batch: Batch, timeout: float, on_slow: Callable[[], None] | None = None) -> None:
        """Send one batch; returns when the service accepted it; raises SDK exceptions. ``on_slow`` is called
        (on the caller's thread or a watchdog thread: it must not block and must be thread-safe) if no answer has
        come :data:`SLOW_MARGIN` before the deadline: the caller may prepare for the failure (e.g. open the
        backlog's link)."""

    def start_send(self, batch: Batch, timeout: float, on_slow: Callable[[], None] | None = None) -> Sending:
        """Start sending one batch and return at once; ``result()`` waits for it within ``timeout`` seconds of
        the start. Lets the caller pack the next batch while this one is on the wire (a transport may also send
        at once and return it settled). Never raises: a send that cannot start returns a :class:`Settled` with
        its error."""

    def schedule(self, target: Target, message: OutboundMessage, at: datetime, timeout: float) -> int:
        """Schedule ``message`` on ``target`` for ``at``; returns its sequence number."""

    def cancel_scheduled(self, target: Target, sequence_number: int, timeout: float) -> None:
        """Cancel a scheduled message."""

    def connected(self, target: Target) -> bool:
        """True when ``target``'s link answered a call within the last :data:`CONNECTED_FRESH` seconds and its
        client was not replaced since: a send needs no new connection, so its deadline need not allow for one
        (no I/O)."""

    def warm(self, target: Target) -> None:
        """Open the link to ``target`` in the background (never blocks), so that a send soon after is fast."""

    def fault(self, target: Target) -> None:
        """The client of ``target`` faulted (a connection-class error): close it (in the background); it is
        rebuilt on next use. Other targets' clients - the backlog's above all - stay open."""

    def close(self) -> None:
        """Close both clients (in the background: never blocks)."""


# ---------------------------------------------------------------------------------------------------------


class SdkBatch:
    """A :class:`Batch` backed by the SDK's ``ServiceBusMessageBatch`` (each message encoded once to size it)."""

    def __init__(self, target: Target, sdk_batch: ServiceBusMessageBatch) -> None:
        self.target = target
        self.sdk_batch = sdk_batch
        self._messages: list[OutboundMessage] = []
        self._count = 0
        from azure.servicebus.exceptions import MessageSizeExceededError

        self._too_big = MessageSizeExceededError  # looked up once per batch, not per message

    @property
    def messages(self) -> list[OutboundMessage]:
        return self._messages

    def try_add(self, message: OutboundMessage) -> bool:
        try:
            self.sdk_batch.add_message(message.to_sdk())
        except self._too_big:
            return False
        self._count += 1
        self._messages.append(message)
        return True

    def try_add_backlog(self, original: OutboundMessage, entity: str, enqueued: datetime) -> bool:
        try:
            self.sdk_batch.add_message(to_backlog_sdk(original, entity, enqueued))
        except self._too_big:
            return False
        self._count += 1
        return True

    @property
    def size_in_bytes(self) -> int:
        return int(self.sdk_batch.size_in_bytes)

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[OutboundMessage]:
        return iter(self._messages)


class _Link:
    """A lane's context: one ``ServiceBusClient`` and its sender for one target (used by the lane's thread only)."""

    __slots__ = ("client", "sender")

    def __init__(self, client: ServiceBusClient, sender: ServiceBusSender) -> None:
        self.client = client
        self.sender = sender


def _close_link(link: _Link) -> None:
    _quiet_close(link.sender)
    _quiet_close(link.client)


def shut_down_socket(handler_owner: Any) -> None:
    """Shut down the socket of an SDK sender or receiver so that a call stuck in it (e.g. the SDK's SASL
    negotiation, which has no timeout) returns with an error. Reads SDK internals; best effort, never raises.
    Called from a thread other than the stuck one (a lane's unblock)."""
    import socket

    handler = getattr(handler_owner, "_handler", None)
    connection = getattr(handler, "_connection", None)
    transport = getattr(connection, "_transport", None)
    sock = getattr(transport, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _unblock_link(link: _Link) -> None:
    shut_down_socket(link.sender)


class SdkTransport:
    """The real :class:`Transport` over azure-servicebus (sync). See the module docstring.

    One :class:`~spark_sb.lane.Lane` per target (namespace + entity): its own worker thread, ``ServiceBusClient``
    and ``ServiceBusSender``, so every call has a deadline that holds whatever the SDK does (a stuck client is
    abandoned and rebuilt) and a stalled entity holds up no other. The SDK does not retry inside a call
    (``retry_total = 0``): the paired sender's attempt loop retries, so each failed attempt reaches the failover
    timer at once. Batches are bounded by the link's batch size (known after the first send on a link) and by
    ``config.max_message_size``. Thread-safe.
    """

    def __init__(self, config: ServiceBusConfig, **client_kwargs: Any) -> None:
        self._config = config
        # retry_total 0: the attempt loop retries, so each failed attempt reaches the failover timer at once.
        self._client_kwargs = {**config.client_kwargs(), "retry_total": 0, **client_kwargs}
        self._lanes: dict[Target, Lane[_Link]] = {}
        self._link_max: dict[Target, int] = {}
        self._answered: dict[
            Target, tuple[int, float]
        ] = {}  # the lane generation and time of the last answer
        self._lock = threading.Lock()
        self._closed = False
        self.generation: dict[str, int] = {PRIMARY: 0, SECONDARY: 0}  # bumped each time a client is built
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

    def _lane(self, target: Target) -> Lane[_Link]:
        with self._lock:
            if self._closed:
                raise LaneClosed("the Service Bus transport is closed")
            lane = self._lanes.get(target)
            if lane is None:
                ns = self._namespace_config(target.namespace)

                def build() -> _Link:
                    client = ns.client(**self._client_kwargs)
                    with self._lock:
                        self.generation[target.namespace] = self.generation.get(target.namespace, 0) + 1
                    # Topics take the same link. keep_alive 0: no SDK keep-alive thread, which would use the
                    # connection beside the lane's thread and which closing the sender waits for (up to 1 s).
                    return _Link(client, client.get_queue_sender(target.entity, keep_alive=0))

                lane = Lane(f"{target.namespace}-{target.entity}", build, _close_link, _unblock_link)
                self._lanes[target] = lane
            return lane

    def _call(
        self,
        target: Target,
        fn: Callable[[_Link], Any],
        timeout: float,
        on_slow: Callable[[], None] | None = None,
    ) -> Any:
        try:
            return self._lane(target).call(fn, timeout, slow_after=timeout - SLOW_MARGIN, on_slow=on_slow)
        except Exception as exc:
            if classify(exc).rebuild_client:
                self.fault(target)
            raise

    def is_open(self, namespace: str) -> bool:
        """True while a client for ``namespace`` exists (built and not closed)."""
        with self._lock:
            lanes = [lane for t, lane in self._lanes.items() if t.namespace == namespace]
        return any(lane.live for lane in lanes)

    # -- Transport
    def connected(self, target: Target) -> bool:
        answered = self._answered.get(target)
        if answered is None or time.monotonic() - answered[1] > CONNECTED_FRESH:
            return False
        with self._lock:
            lane = self._lanes.get(target)
        return lane is not None and lane.live and lane.generation == answered[0]

    def max_batch_size(self, target: Target) -> int:
        limit = self._config.max_message_size
        link = self._link_max.get(target)
        return min(limit, link) if link else limit

    def new_batch(self, target: Target) -> SdkBatch:
        from azure.servicebus import ServiceBusMessageBatch

        return SdkBatch(target, ServiceBusMessageBatch(max_size_in_bytes=self.max_batch_size(target)))

    def send(self, batch: Batch, timeout: float, on_slow: Callable[[], None] | None = None) -> None:
        self.start_send(batch, timeout, on_slow).result()

    def start_send(self, batch: Batch, timeout: float, on_slow: Callable[[], None] | None = None) -> Sending:
        if len(batch) == 0:
            return Settled()
        if isinstance(batch, SdkBatch):
            payload: Any = batch.sdk_batch
        else:  # a foreign batch: let the SDK pack it (raises if it does not fit one batch)
            payload = [m.to_sdk() for m in batch.messages]

        def send(link: _Link) -> Any:
            link.sender.send_messages(payload, timeout=timeout)
            return getattr(link.sender, "_max_batch_size_on_link", None)

        target = batch.target
        try:
            lane = self._lane(target)
            # On a link known to be open the SDK bounds the send itself (its timeout covers the wait for the
            # answer; no connect, SASL or CBS): send on this thread, the lane's watchdog keeping the deadline.
            pending: Pending[Any] | Finished[Any] | None = (
                lane.direct(send, timeout, slow_after=timeout - SLOW_MARGIN, on_slow=on_slow)
                if self.connected(target)
                else None
            )
            if pending is None:
                pending = lane.start(send, timeout, slow_after=timeout - SLOW_MARGIN, on_slow=on_slow)
            else:
                self.direct_sends += 1
        except Exception as exc:  # the lane is closed
            return Settled(exc)
        if isinstance(pending, Finished):  # settle now: the next call's connected() must see this answer
            try:
                self._settled(target, pending)
            except Exception as exc:
                return Settled(exc)
            return Settled()
        return _SdkSending(self, target, pending)

    def _settled(self, target: Target, pending: Pending[Any] | Finished[Any]) -> None:
        try:
            link_max = pending.result()
        except Exception as exc:
            self._answered.pop(target, None)
            if classify(exc).rebuild_client:
                self.fault(target)
            raise
        self._answered[target] = (pending.generation, time.monotonic())
        if isinstance(link_max, int) and link_max > 0:
            self._link_max[target] = link_max

    def schedule(self, target: Target, message: OutboundMessage, at: datetime, timeout: float) -> int:
        sdk_message = message.to_sdk()
        numbers = self._call(
            target, lambda link: link.sender.schedule_messages(sdk_message, at, timeout=timeout), timeout
        )
        return int(numbers[0])

    def cancel_scheduled(self, target: Target, sequence_number: int, timeout: float) -> None:
        self._call(
            target,
            lambda link: link.sender.cancel_scheduled_messages(sequence_number, timeout=timeout),
            timeout,
        )

    def warm(self, target: Target) -> None:
        self._lane(target).submit(lambda link: link.sender.__enter__())  # opens the link (SDK context entry)

    def fault(self, target: Target) -> None:
        """Close the faulted client of ``target`` now; it is rebuilt on next use. Never blocks (its lane's
        thread closes it). Only that client: a primary outage is exactly when the backlog's clients are needed,
        so they are not torn down with it (a fault is not a close; B10's pair closing is :meth:`close_namespace`
        and :meth:`close`)."""
        with self._lock:
            lane = self._lanes.get(target)
        if lane is not None and lane.live:
            _LOGGER.info("%s client faulted: it is closed and rebuilt on next use", target)
            lane.reset("faulted")

    def close_namespace(self, namespace: str) -> None:
        """Close one namespace's clients: its partner's are closed too (B10), all in the background."""
        self._reset_all()

    def close(self) -> None:
        """Close every client in the background (never blocks). Final: a later call (a probe still running, say)
        raises :class:`~spark_sb.lane.LaneClosed` instead of opening a client nobody would close."""
        with self._lock:
            self._closed = True
            lanes = list(self._lanes.values())
        for lane in lanes:
            lane.close()

    def _reset_all(self) -> None:
        with self._lock:
            lanes = list(self._lanes.values())
        for lane in lanes:
            lane.reset()

    def __enter__(self) -> SdkTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        with self._lock:
            live = sorted(str(t) for t, lane in self._lanes.items() if lane.live)
        return f"SdkTransport(open={live})"


class _SdkSending:
    """A send on a lane (see :meth:`SdkTransport.start_send`)."""

    __slots__ = ("_pending", "_target", "_transport")

    def __init__(self, transport: SdkTransport, target: Target, pending: Pending[Any]) -> None:
        self._transport = transport
        self._target = target
        self._pending = pending

    def result(self) -> None:
        self._transport._settled(self._target, self._pending)


def _quiet_close(obj: Any) -> None:
    """Close an SDK object; a failure to close is logged (without secrets), never raised."""
    try:
        obj.close()
    except Exception as exc:  # closing a faulted client may fail; it is being dropped anyway
        _LOGGER.info("closing %s failed: %s", type(obj).__name__, type(exc).__name__)
