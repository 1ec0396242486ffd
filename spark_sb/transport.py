"""The seam between the paired sender and the azure-servicebus SDK.

:class:`Transport` is what :class:`spark_sb.sender.PairedSender` needs: size-bounded batches for a target
(namespace + entity), sending one batch, scheduling/cancelling a probe message, and closing. Every method may
raise the SDK's exceptions; :func:`spark_sb.errors.classify` says what they mean. Unit tests use a fake
transport behind this interface (``tests/unit/fakes.py``).

:class:`SdkTransport` is the real one. It runs on executors (Python workers), is built lazily there from the
picklable :class:`~spark_sb.config.ServiceBusConfig`, and is not picklable. Connections do not grow with entities
(SPEC F2): each namespace has ONE AMQP connection, owned by a :class:`~spark_sb.lane.Lane` (a worker thread), and
every entity is a link (an SDK ``ServiceBusSender`` whose handler is opened on that connection) - the connection
sharing the SDK's ``ServiceBusClient`` leaves switched off. Links a batch needs are opened together
(:meth:`SdkTransport.prepare`, F3). Every call has a deadline that holds whatever the SDK does: a connection that
does not answer (TCP, SASL - which the SDK does not bound - or later) is abandoned at the deadline (its socket shut
down, closed in the background, never awaited) and the next call builds a new one; a link that fails (an entity's
error, an entity that stalls while the connection keeps answering) is closed alone and reopened on next use. A
batch send on a link known to be open runs on the caller's thread (:meth:`~spark_sb.lane.Lane.direct`: the SDK
bounds that phase itself, the lane's watchdog keeps the deadline), which keeps the failed-over and healthy paths at
the raw SDK's speed. :meth:`SdkTransport.answered_within` reads the connection's last frame (the namespace's
heartbeats, asked for with an idle timeout) so that the sender can tell a namespace's fault from an entity's (F1).
SPEC B10: the two namespaces' connections are a pair - closing one closes both, and the pair is rebuilt on the next
use. A faulted connection is closed and rebuilt alone: tearing the backlog's down with a failing primary's would
make every failover wait for a new backlog connection.

Reads SDK internals (pyamqp's ``Connection``, a handler's ``open(connection=...)``, ``_running`` and the link's size
limits), all pinned by ``constraints-dev.txt`` and exercised by the integration tests against the unmodified SDK.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from spark_sb.backlog import to_backlog_sdk
from spark_sb.errors import classify, condition_of
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

#: The SDK's own timeout of a call on an open link ends this much before the lane's deadline (the SDK reads
#: the socket in slices of its ``socket_timeout``, 0.2 s), so that a stalled entity costs its link, not the
#: connection that the namespace's other entities share.
SDK_MARGIN = 0.3


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

    def schedule(self, target: Target, message: OutboundMessage, at: datetime, timeout: float) -> int:
        """Schedule ``message`` on ``target`` for ``at``; returns its sequence number."""

    def cancel_scheduled(self, target: Target, sequence_number: int, timeout: float) -> None:
        """Cancel a scheduled message."""

    def connected(self, target: Target) -> bool:
        """True when ``target``'s link answered a call within the last :data:`CONNECTED_FRESH` seconds and its
        client was not replaced since: a send needs no new connection, so its deadline need not allow for one
        (no I/O)."""

    def answered_within(self, target: Target, seconds: float) -> bool:
        """True when ``target``'s namespace answered anything (on any link of its connection, heartbeats
        included) in the last ``seconds`` seconds: a failure then was the entity's, not the namespace's (SPEC F1,
        :func:`spark_sb.failover.namespace_wide`). No I/O."""

    def prepare(self, targets: Iterable[Target], silence: float) -> dict[Target, BaseException]:
        """Open the links to ``targets`` that are not open yet, concurrently (SPEC F3), within a deadline that
        grows with their number; the per-target errors are returned, a namespace's connection failure (or
        ``silence`` seconds without an answer) is raised."""

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


#: Links opened concurrently on a connection cost about this much each (CPU and frames), on top of a fixed part:
#: the deadline of :meth:`SdkTransport.prepare` is ``PREPARE_BASE + PREPARE_PER_LINK * n`` (SPEC F3).
PREPARE_BASE = 1.5
PREPARE_PER_LINK = 0.02

#: Links being opened at once on one connection (a wave): bounds the handlers polled per round of answers.
OPENING_AT_ONCE = 128

#: The idle timeout the shared connection asks of the namespace (seconds). The namespace then sends an empty
#: frame when it has had nothing else to send for half of it, so a live connection is heard from at least every
#: ``HEARTBEAT / 2`` s even while one entity stalls; a silent connection is the namespace's fault (SPEC F1). pyamqp's
#: own close after this long without a frame is switched off (:func:`_open_connection`): the lane's deadlines and the
#: namespace-wide evidence decide what a silence means.
HEARTBEAT = 4.0


#: A connection that said nothing (no frame, not even a heartbeat) for this long is dead: silently dropped on the
#: way (a middlebox forgot the flow), or the namespace stopped answering. Half a :data:`HEARTBEAT` is the
#: namespace's beat, so this is three missed beats; well above what a live connection's jitter reaches.
SILENT_AFTER = 1.5 * HEARTBEAT

#: How often a lane with nothing to do looks after its connection (:meth:`_Conn.tend`).
TEND_EVERY = 0.5

#: Error conditions with which the service ends a link or connection for its lifecycle, not for an outage: a link
#: idle for 10 minutes (``detach-forced``, "IdleTimerExpired"), a token that expired (``unauthorized-access`` on a
#: link that was authorized), a connection without links for a minute (``connection:forced``). A send that meets
#: one is made once more on a fresh link or connection, within its own deadline, and never counts as a failure.
#: A renewed call needs at least this much of its deadline left (a fresh link on a live connection: a few round trips).
RENEW_AT_LEAST = 0.05

RENEWABLE = frozenset({"amqp:link:detach-forced", "amqp:unauthorized-access", "amqp:connection:forced"})


class _Conn:
    """A lane's context: ONE AMQP connection to a namespace and one link (an SDK ``ServiceBusSender``) per entity
    on it (SPEC F2), as the SDK's own connection sharing intends. Used by the lane's thread, or by a direct call
    while it holds the lane's ``use`` lock; never by two threads at once.

    The connection lives for weeks (SPEC L1-L3): between calls :meth:`tend` reads its frames (the namespace's
    heartbeats, a detach or close the service sends) and sends ours when due, renews the links' tokens, and drops
    a connection that went silent or was closed; :meth:`ensure` opens a new one when the next call needs it.

    ``senders`` is bounded by the entities this process sends to on the namespace; a link that failed or that the
    service detached is dropped (closed) and reopened on next use, the connection stays.
    """

    __slots__ = ("client", "connection", "detached", "dropped", "opener", "renewed", "senders")

    def __init__(self, client: ServiceBusClient, opener: Callable[[float], Any]) -> None:
        self.client = client
        self.opener = opener  # opens a new pyamqp connection within a timeout (and counts it)
        self.connection: Any = None
        self.senders: dict[str, ServiceBusSender] = {}
        self.dropped = 0  # connections found dead (silent or closed) and dropped before a call needed them
        # calls made once more because the service had ended their link or connection (RENEWABLE)
        self.renewed = 0
        self.detached = (
            0  # links found detached by the service between calls (idle, an expired token), dropped
        )

    @property
    def broken(self) -> bool:
        """The connection is no longer open (closed by the service, a socket error, an idle timeout)."""
        from azure.servicebus._pyamqp.constants import ConnectionState

        return self.connection is None or bool(self.connection.state != ConnectionState.OPENED)

    def heard(self) -> float | None:
        """When the connection last received a frame (``time.time()``), None if never."""
        value = getattr(self.connection, "_last_frame_received_time", None)
        return float(value) if value else None

    def silent(self) -> bool:
        """Nothing heard for :data:`SILENT_AFTER` seconds: the connection is dead (no I/O)."""
        heard = self.heard()
        return heard is not None and time.time() - heard > SILENT_AFTER

    def ensure(self, timeout: float, may_connect: bool = True) -> Any:
        """The open connection; a new one (within ``timeout``) if there is none, or the one there was is closed or
        silent. Raises what opening raised; :class:`_NeedsWorker` instead of connecting when not ``may_connect``
        (a direct call: TCP and SASL run on the lane's worker only, see :meth:`~spark_sb.lane.Lane.direct`)."""
        if self.connection is not None and (self.broken or self.silent()):
            self.discard("closed" if self.broken else f"silent for more than {SILENT_AFTER:.3g} s")
        if self.connection is None:
            if not may_connect:
                raise _NeedsWorker("a new connection is needed")
            self.connection = self.opener(timeout)
        return self.connection

    def discard(self, why: str) -> None:
        """Drop the connection and every link on it (closed without waiting: a dead socket is shut down first, so
        nothing blocks); the next call opens a new one."""
        connection, self.connection = self.connection, None
        self.senders.clear()
        if connection is None:
            return
        self.dropped += 1
        _LOGGER.info("a connection was dropped (%s); a new one is opened on next use", why)
        _shut_down(connection)
        with contextlib.suppress(Exception):  # closing a dead connection may fail; it is being dropped anyway
            connection.close()

    def tend(self) -> None:
        """Between calls (a lane's idle tick, on its worker): read what came (heartbeats, detaches, a close) and
        send our empty frame when the namespace's idle timeout wants one (pyamqp's ``listen`` does both), drop the
        connection if it went silent or was closed, drop links the service detached, and renew each link's token
        when its refresh window opens (the SDK renews only inside its own calls). Cost: one short read plus a
        look at each link - bounded by the entities of this namespace."""
        if self.connection is None:
            return
        if self.broken or self.silent():
            self.discard("closed" if self.broken else f"silent for more than {SILENT_AFTER:.3g} s")
            return
        try:
            with _short_reads(self.connection):
                self.connection.listen(batch=64)
        except Exception as exc:
            self.discard(f"reading it failed: {type(exc).__name__}")
            return
        if self.broken:
            self.discard("closed by the namespace")
            return
        for entity, sender in list(self.senders.items()):
            if not _attached(sender):
                self.detached += 1
                self.drop(entity)
                continue
            cbs = getattr(sender._handler, "_cbs_authenticator", None)
            if cbs is None:
                continue
            try:
                cbs.handle_token()
            except (
                Exception
            ) as exc:  # the renewal failed: the link is reopened (with a new token) on next use
                _LOGGER.info(
                    "renewing the token of a link failed (%s): reopened on next use", type(exc).__name__
                )
                self.drop(entity)

    def sender(self, entity: str, timeout: float, may_connect: bool = True) -> ServiceBusSender:
        """The open link to ``entity``, opened now if needed (within ``timeout``, on a new connection if the one
        there was is closed or silent); raises what opening raised (``may_connect``: see :meth:`ensure`)."""
        self.ensure(timeout, may_connect)
        found = self.senders.get(entity)
        if found is not None and getattr(found, "_running", False) and _attached(found):
            return found
        errors = self.open_links([entity], timeout)
        if entity in errors:
            raise errors[entity]
        return self.senders[entity]

    def on_link(
        self,
        entity: str,
        fn: Callable[[ServiceBusSender, float], Any],
        timeout: float,
        may_connect: bool = True,
    ) -> Any:
        """``fn(sender, seconds_left)`` on the open link to ``entity``. If the service had ended that link or its
        connection for its lifecycle (:func:`renewable`: idle, an expired token), the call is made once more on a
        fresh link - on a fresh connection if the old one closed - within the same ``timeout``. A link that failed
        is dropped either way (reopened on next use)."""
        deadline = time.monotonic() + timeout
        sender = self.sender(entity, timeout, may_connect)
        link = getattr(
            getattr(sender, "_handler", None), "_link", None
        )  # the SDK replaces the handler on errors
        try:
            return fn(sender, deadline - time.monotonic())
        except Exception as exc:
            # The SDK reports a detach met during a send as an unknown error; the link keeps what the service said.
            ended = _ended_by_service(link, self.connection)
            self.drop(entity)
            left = deadline - time.monotonic()
            if not (renewable(exc) or ended in RENEWABLE) or left <= RENEW_AT_LEAST:
                raise
            _LOGGER.info(
                "the service ended a link (%s): the call is made once more on a fresh one", condition_of(exc)
            )
            self.renewed += 1
        sender = self.sender(entity, left, may_connect)
        try:
            return fn(sender, deadline - time.monotonic())
        except Exception:
            self.drop(entity)
            raise

    def open_links(
        self, entities: list[str], timeout: float, silence: float | None = None
    ) -> dict[str, BaseException]:
        """Open links to ``entities`` concurrently on the shared connection: every handler's begin, CBS put-token
        and attach go out together and the answers are read as they come (SPEC F3). Returns the per-entity errors
        (an entity that does not exist, a refused token, an attach not answered by the deadline); a connection
        error raises (every entity has it), and so does a namespace that said nothing for ``silence`` seconds
        while links were waiting (a ``TimeoutError``: the namespace stalled, SPEC F1)."""
        deadline = time.monotonic() + max(0.0, timeout)
        self.ensure(timeout)
        errors: dict[str, BaseException] = {}
        waiting: list[str] = []
        for entity in dict.fromkeys(entities):
            old = self.senders.get(entity)
            if old is not None:
                if getattr(old, "_running", False) and _attached(old):
                    continue
                self.drop(entity)
            waiting.append(entity)
        if waiting:
            with _short_reads(self.connection):
                self._pump(waiting, deadline, silence, errors)
        return errors

    def _pump(
        self, waiting: list[str], deadline: float, silence: float | None, errors: dict[str, BaseException]
    ) -> None:
        """Begin links in waves of at most :data:`OPENING_AT_ONCE` (the answers are read between waves: a long
        silence of the reader would look like a dead connection) and finish them as their answers come."""
        pending: dict[str, ServiceBusSender] = {}  # bounded by OPENING_AT_ONCE
        todo = iter(waiting)
        left_to_begin = len(waiting)
        began = time.time()
        try:
            while pending or left_to_begin:
                while left_to_begin and len(pending) < OPENING_AT_ONCE:
                    entity = next(todo)
                    left_to_begin -= 1
                    try:
                        pending[entity] = self._begin(entity)
                    except Exception as exc:
                        if self.broken:
                            raise
                        errors[entity] = exc
                if silence is not None and time.time() - max(began, self.heard() or 0.0) > silence:
                    raise TimeoutError(
                        f"the namespace answered nothing for {silence:.3g} s while links were opened"
                    )
                if time.monotonic() >= deadline:
                    for entity in [*pending, *todo]:
                        errors[entity] = TimeoutError(f"the link to {entity!r} was not attached in time")
                    break
                self.connection.listen(batch=256)
                for entity, sender in list(pending.items()):
                    try:
                        ready = self._ready(sender)
                    except Exception as exc:
                        if self.broken:
                            raise
                        errors[entity] = exc
                        self._quiet_close_handler(pending.pop(entity))
                        continue
                    if ready:
                        self._finish(sender)
                        self.senders[entity] = pending.pop(entity)
        finally:
            for sender in pending.values():
                if not getattr(sender, "_running", False):
                    self._quiet_close_handler(sender)

    def _begin(self, entity: str) -> ServiceBusSender:
        from azure.servicebus._common.utils import create_authentication

        # Topics take the same link. keep_alive 0: no SDK keep-alive thread (threads must not grow with entities).
        sender = self.client.get_queue_sender(entity, keep_alive=0)
        sender._create_handler(create_authentication(sender))
        handler: Any = sender._handler
        handler.open(connection=self.connection)  # a session and CBS links on the shared connection
        session = handler._session
        session.end = functools.partial(_end_session, session, session.end)
        return sender

    @staticmethod
    def _ready(sender: ServiceBusSender) -> bool:
        handler: Any = sender._handler
        cbs = handler._cbs_authenticator
        if cbs is not None and not cbs.handle_token():
            return False
        return bool(handler._client_ready())

    @staticmethod
    def _finish(sender: ServiceBusSender) -> None:
        """What ``ServiceBusSender._open`` does once its link is ready (the link's size limits)."""
        from azure.servicebus._common.constants import (
            MAX_BATCH_SIZE_PREMIUM,
            MAX_BATCH_SIZE_STANDARD,
            MAX_MESSAGE_LENGTH_BYTES,
        )

        s: Any = sender
        transport = s._amqp_transport
        s._running = True
        s._max_message_size_on_link = (
            transport.get_remote_max_message_size(s._handler) or MAX_MESSAGE_LENGTH_BYTES
        )
        vendor = getattr(transport, "get_remote_max_message_batch_size", lambda _h: None)(s._handler)
        if vendor is not None:
            s._max_batch_size_on_link = vendor
        elif s._max_message_size_on_link >= MAX_BATCH_SIZE_PREMIUM:
            s._max_batch_size_on_link = MAX_BATCH_SIZE_PREMIUM
        else:
            s._max_batch_size_on_link = MAX_BATCH_SIZE_STANDARD

    def drop(self, entity: str) -> None:
        """Close the link to ``entity`` (a failure on it); the connection stays; reopened on next use."""
        sender = self.senders.pop(entity, None)
        if sender is not None:
            self._quiet_close_handler(sender)

    @staticmethod
    def _quiet_close_handler(sender: ServiceBusSender) -> None:
        s: Any = sender
        s._running = False
        handler = getattr(s, "_handler", None)
        if handler is not None and not getattr(handler, "_shutdown", True):
            try:
                handler.close()  # its link, session and CBS links; the shared connection stays
            except Exception as exc:  # closing a failed link may fail; it is being dropped anyway
                _LOGGER.debug("closing a link failed: %s", type(exc).__name__)

    def close(self) -> None:
        self.senders.clear()
        connection, self.connection = self.connection, None
        if connection is None:
            return
        try:
            connection.close()
        except Exception as exc:  # a broken connection may fail to close; it is being dropped anyway
            _LOGGER.info("closing a connection failed: %s", type(exc).__name__)


class _NeedsWorker(Exception):
    """A direct call (on the caller's thread) found that it needs a new connection: it is made on the lane's
    worker instead, within what is left of the same deadline."""


def _attached(sender: ServiceBusSender) -> bool:
    """The sender's link is still attached (the service did not detach it: idle, an expired token, a forced
    detach). Reads pyamqp's link state; no I/O."""
    from azure.servicebus._pyamqp.constants import LinkState

    link = getattr(getattr(sender, "_handler", None), "_link", None)
    return link is None or link.state == LinkState.ATTACHED


def sdk_timeout(left: float) -> float:
    """The SDK's own timeout for a call with ``left`` seconds to its deadline: :data:`SDK_MARGIN` earlier (a
    quarter of ``left`` when that is less), so that the SDK gives up first and a stalled entity costs its link,
    not the shared connection. Pure."""
    return max(0.02, left - min(SDK_MARGIN, 0.25 * left))


def _condition_text(error: Any) -> str | None:
    condition = getattr(error, "condition", None)
    if condition is None:
        return None
    condition = getattr(condition, "value", condition)
    return condition.decode("utf-8", "replace") if isinstance(condition, bytes) else str(condition)


def _ended_by_service(link: Any, connection: Any) -> str | None:
    """The error condition with which the service detached ``link`` or closed ``connection``, if it did (pyamqp
    keeps it on the link and the connection); None otherwise. No I/O."""
    return _condition_text(getattr(link, "_error", None)) or _condition_text(
        getattr(connection, "_error", None)
    )


def renewable(exc: BaseException) -> bool:
    """The service ended the link or connection for its lifecycle (:data:`RENEWABLE`), not for an outage. Pure."""
    return (condition_of(exc) or "") in RENEWABLE


def _tend(conn: _Conn) -> None:
    conn.tend()


#: While links are opened, a read with nothing to read waits this long (the SDK's socket timeout is 0.2 s: one such
#: wait per round of answers would cost tenths of a second per link).
PUMP_READ_TIMEOUT = 0.005


@contextlib.contextmanager
def _short_reads(connection: Any) -> Iterator[None]:
    sock = getattr(getattr(connection, "_transport", None), "sock", None)
    previous = sock.gettimeout() if sock is not None else None
    if sock is not None:
        sock.settimeout(PUMP_READ_TIMEOUT)
    try:
        yield
    finally:
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.settimeout(previous)


def _open_connection(client: ServiceBusClient, timeout: float) -> Any:
    """Open one AMQP connection to ``client``'s namespace, built as the SDK builds a sender's own (same host, TLS,
    proxy, custom endpoint, container and properties), plus an idle timeout (:data:`HEARTBEAT`). Runs on a lane's
    worker: TCP connect and SASL have no deadline of their own, the lane's deadline covers them."""
    from azure.servicebus._common.utils import create_authentication
    from azure.servicebus._pyamqp._connection import Connection
    from azure.servicebus._pyamqp.constants import ConnectionState

    template: Any = client.get_queue_sender("$connection", keep_alive=0)  # no I/O: a handler's settings
    template._create_handler(create_authentication(template))
    h = template._handler
    connection = Connection(
        ("amqps://" if h._use_tls else "amqp://") + h._hostname,
        sasl_credential=h._auth.sasl,
        ssl_opts=h._ssl_opts,
        container_id=f"SBSender-{uuid.uuid4()}",
        max_frame_size=h._max_frame_size,
        channel_max=h._channel_max,
        idle_timeout=HEARTBEAT,
        properties=h._properties,
        network_trace=False,
        transport_type=h._transport_type,
        http_proxy=h._http_proxy,
        custom_endpoint_address=h._custom_endpoint_address,
        socket_timeout=h._socket_timeout,
        use_tls=h._use_tls,
    )
    connection.open()
    deadline = time.monotonic() + timeout
    while connection.state != ConnectionState.OPENED:
        if connection.state in (ConnectionState.END, ConnectionState.CLOSE_RCVD, ConnectionState.DISCARDING):
            from azure.servicebus._pyamqp.error import AMQPConnectionError, ErrorCondition

            error = getattr(connection, "_error", None)
            if error is not None:
                raise error
            raise AMQPConnectionError(ErrorCondition.SocketError, description="the connection was closed")
        if time.monotonic() > deadline:
            raise TimeoutError("the namespace did not open the connection in time")
        connection.listen(wait=0.05)
    # The idle timeout went out in the open frame (the namespace sends heartbeats); pyamqp would also close the
    # connection itself after that long without a frame, on its next read. Not that: the lane's deadlines and the
    # namespace-wide evidence decide what a silence means.
    connection._idle_timeout = None
    return connection


def _end_session(session: Any, end: Callable[..., None], error: Any = None, wait: bool = False) -> None:
    """End a session on a shared connection after detaching its links: pyamqp's ``Session.end`` sends the end
    first and then detaches the links still attached (a management link's, say), and the service closes the whole
    connection - every other entity's link with it - for a frame on a channel that has ended ("no such
    channel"). Installed on each session the transport opens (``session.end``), whoever ends it: the SDK ends it
    itself when a call on the link fails."""
    for link in list(getattr(session, "links", {}).values()):
        with contextlib.suppress(Exception):
            link.detach(close=True)
    end(error=error, wait=wait)


def _open_links(
    conn: _Conn, *, entities: list[str], timeout: float, silence: float
) -> dict[str, BaseException]:
    return conn.open_links(entities, timeout, silence)


def _ensure(conn: _Conn, *, timeout: float) -> None:
    conn.ensure(timeout)


def _close_conn(conn: _Conn) -> None:
    conn.close()


def shut_down_socket(handler_owner: Any) -> None:
    """Shut down the socket of an SDK sender or receiver so that a call stuck in it (e.g. the SDK's SASL
    negotiation, which has no timeout) returns with an error. Reads SDK internals; best effort, never raises.
    Called from a thread other than the stuck one (a lane's unblock)."""
    handler = getattr(handler_owner, "_handler", None)
    _shut_down(getattr(handler, "_connection", None))


def _shut_down(connection: Any) -> None:
    import socket

    transport = getattr(connection, "_transport", None)
    sock = getattr(transport, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _unblock_conn(conn: _Conn) -> None:
    if conn.connection is not None:
        _shut_down(conn.connection)


class SdkTransport:
    """The real :class:`Transport` over azure-servicebus (sync). See the module docstring.

    One :class:`~spark_sb.lane.Lane` per namespace: its own worker thread and ONE AMQP connection, every entity a
    link on it (SPEC F2: connections and threads do not grow with entities). Every call has a deadline that holds
    whatever the SDK does: a connection that does not answer (before or after SASL) is abandoned and rebuilt; a
    link that fails is closed and reopened alone, its connection and the other entities' links stay. Links to
    many entities open concurrently (:meth:`prepare`, SPEC F3). The SDK does not retry inside a call
    (``retry_total = 0``): the paired sender's attempt loop retries, so each failed attempt reaches the failover
    timer at once. Batches are bounded by the link's batch size (known once the link is open) and by
    ``config.max_message_size``. Thread-safe.
    """

    def __init__(self, config: ServiceBusConfig, **client_kwargs: Any) -> None:
        self._config = config
        # retry_total 0: the attempt loop retries, so each failed attempt reaches the failover timer at once.
        self._client_kwargs = {**config.client_kwargs(), "retry_total": 0, **client_kwargs}
        self._lanes: dict[str, Lane[_Conn]] = {}  # one per namespace (two at most)
        self._last: dict[str, _Conn] = {}  # the namespace's latest connection (read by answered_within)
        self._link_max: dict[Target, int] = {}  # bounded by the targets this process sends to
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

    def _lane(self, namespace: str) -> Lane[_Conn]:
        with self._lock:
            if self._closed:
                raise LaneClosed("the Service Bus transport is closed")
            lane = self._lanes.get(namespace)
            if lane is None:
                ns = self._namespace_config(namespace)
                connect_timeout = float(self._config.send_timeout)

                def build() -> _Conn:
                    client = ns.client(**self._client_kwargs)

                    def opener(timeout: float) -> Any:
                        with self._lock:
                            self.generation[namespace] = self.generation.get(namespace, 0) + 1
                        return _open_connection(client, timeout)

                    conn = _Conn(client, opener)
                    self._last[namespace] = conn
                    conn.ensure(connect_timeout)
                    return conn

                lane = Lane(namespace, build, _close_conn, _unblock_conn, idle=_tend, idle_every=TEND_EVERY)
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

        def run(conn: _Conn) -> Any:
            return conn.on_link(entity, fn, timeout)

        started = time.monotonic()
        try:
            return self._lane(target.namespace).call(
                run, timeout, slow_after=timeout - SLOW_MARGIN, on_slow=on_slow
            )
        except Exception as exc:
            self._failed(target, exc, started)
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
        return min(limit, link) if link else limit

    def new_batch(self, target: Target) -> SdkBatch:
        from azure.servicebus import ServiceBusMessageBatch

        return SdkBatch(target, ServiceBusMessageBatch(max_size_in_bytes=self.max_batch_size(target)))

    def send(self, batch: Batch, timeout: float, on_slow: Callable[[], None] | None = None) -> None:
        if len(batch) == 0:
            return
        if isinstance(batch, SdkBatch):
            payload: Any = batch.sdk_batch
        else:  # a foreign batch: let the SDK pack it (raises if it does not fit one batch)
            payload = [m.to_sdk() for m in batch.messages]
        target = batch.target
        entity = target.entity

        def on_link(sender: ServiceBusSender, left: float) -> Any:
            # The SDK's own timeout ends a send on an open link a little before the lane's deadline: a stalled
            # entity then costs its link only, not the connection every other entity uses.
            sender.send_messages(payload, timeout=sdk_timeout(left))
            return getattr(sender, "_max_batch_size_on_link", None)

        def send(conn: _Conn) -> Any:
            return conn.on_link(entity, on_link, timeout)

        def send_direct(conn: _Conn) -> Any:
            return conn.on_link(entity, on_link, timeout, may_connect=False)

        lane = self._lane(target.namespace)
        started = time.monotonic()
        # On a link known to be open the SDK bounds the send itself (its timeout covers the wait for the answer;
        # no connect, SASL or CBS): send on this thread, the lane's watchdog keeping the deadline.
        pending: Pending[Any] | Finished[Any] | None = (
            lane.direct(send_direct, timeout, slow_after=timeout - SLOW_MARGIN, on_slow=on_slow)
            if self.connected(target)
            else None
        )
        if isinstance(pending, Finished) and isinstance(pending.error, _NeedsWorker):
            pending = None  # the connection went away meanwhile: a new one is opened on the worker
        if pending is None:
            left = max(0.0, timeout - (time.monotonic() - started))
            pending = lane.start(send, left, slow_after=left - SLOW_MARGIN, on_slow=on_slow)
        else:
            self.direct_sends += 1
        self._settled(target, pending)

    def _settled(self, target: Target, pending: Pending[Any] | Finished[Any]) -> None:
        try:
            link_max = pending.result()
        except Exception as exc:
            self._answered.pop(target, None)
            self._failed(target, exc, pending.started)
            raise
        self._answered[target] = (pending.generation, time.monotonic())
        if isinstance(link_max, int) and link_max > 0:
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
                lane.call(functools.partial(_ensure, timeout=silence), silence)
                failed = lane.call(
                    functools.partial(_open_links, entities=entities, timeout=budget, silence=silence),
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

    def warm(self, target: Target) -> None:
        timeout = float(self._config.send_timeout)
        entity = target.entity
        self._lane(target.namespace).submit(lambda conn: conn.open_links([entity], timeout))

    def _failed(self, target: Target, exc: BaseException, started: float) -> None:
        """A call to ``target`` that started at ``started`` (monotonic) failed with ``exc``: the link was closed
        already; the connection is closed too (rebuilt on next use) unless the failure was the link's alone - a
        link-level error condition, or a timeout while the connection kept answering (a stalled entity)."""
        cls = classify(exc)
        if not cls.rebuild_client:
            return
        condition = condition_of(exc) or ""
        if condition.startswith("amqp:link:"):
            return
        if cls.name == "timeout" and self.answered_within(target, time.monotonic() - started):
            return
        with self._lock:
            lane = self._lanes.get(target.namespace)
        if lane is not None and lane.live:
            _LOGGER.info(
                "%s: the connection faulted (%s): it is closed and rebuilt on next use", target, cls.name
            )
            lane.reset("faulted")

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
        """Close every connection in the background (never blocks). Final: a later call (a probe still running,
        say) raises :class:`~spark_sb.lane.LaneClosed` instead of opening a connection nobody would close."""
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
            live = sorted(ns for ns, lane in self._lanes.items() if lane.live)
        return f"SdkTransport(open={live})"
