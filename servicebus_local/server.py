"""The network side of a local Service Bus namespace: AMQP 1.0 (and the HTTPS admin hand-off) on one port.

:class:`LocalNamespace` is the public entry point (tests, fixtures, the CLI and the demo use it)::

    with LocalNamespace("primary", queues=["q1"], topics={"t": ["s1"]}) as ns:
        ServiceBusClient.from_connection_string(ns.connection_string) ...
        ns.admin_client().get_queue("q1")
        ns.faults.refuse_connections()

One background thread per namespace runs a selector loop over plain sockets and drives python-qpid-proton's
*engine* (``proton.Transport`` / ``Connection`` / ``Collector``, no reactor), so every byte in and out passes
through this module: that is what makes stalls, latency and abrupt drops possible. The first byte of a new
connection decides its kind: ``A`` (``AMQP`` protocol header) stays here; ``0x16`` (a TLS ClientHello from the
SDK's ``ServiceBusAdministrationClient``) is handed to :class:`servicebus_local.admin.AdminEndpoint` in a thread
of its own.

AMQP handled: SASL ANONYMOUS, CBS ``put-token`` on ``$cbs`` (any token, or a SAS token verified against the
namespace key), sender links to queues/topics (single and batched transfers, settled ``accepted`` or
``rejected`` with the broker's error condition), receiver links from queues/subscriptions and their
``$deadletterqueue`` (credit, drain, peek-lock with the lock token as delivery tag, receive-and-delete
pre-settled, every client settlement answered with the outcome applied), session receivers (session filter,
``com.microsoft:locked-until-utc``), and the ``$management`` request/response node (see ``_Management``).

Idle-timeout heartbeats (AMQP 1.0 section 2.4.5), as the service sends them: when a client's ``open`` carries an
``idle-time-out`` T, an empty frame goes out whenever nothing was sent on the connection for T/2 (proton's
keepalive, driven by ticking each transport at the deadline it returns). The namespace's own ``open`` advertises no
idle timeout, so it never closes a quiet client. Heartbeats take the path every other frame takes, so a namespace
stall (``FaultController.stall``, before or after SASL) silences them with the rest, while a per-entity stall
(``stall_entity``: that entity's transfers are held, unanswered) leaves them going.

Connection quota (``max_connections``, the CLI's ``--max-connections``; 5,000 by default, the service's quota):
as on the service, a connection beyond the quota is accepted, its SASL exchange and AMQP open are answered, and
it is then closed with ``amqp:resource-limit-exceeded`` (:func:`connection_quota_description`). A connection
counts from its accepted open until its close (the peer's close frame or the socket's end); the HTTPS admin
connections on the same port do not count. ``counters()`` carries ``connections_open``, ``connections_peak``
and ``connections_refused``.

Lifecycle, as the service (timers on the namespace's clock, looked at when the earliest is due):
``link_idle_timeout`` (10 min) detaches a sender/receiver link with no transfer or receive call
(``amqp:link:detach-forced``, IdleTimerExpired); ``connection_idle_timeout`` (60 s) closes a connection holding no
link but its ``$cbs`` pair (``amqp:connection:forced``); a link whose covering CBS token (same audience, or the
namespace's, or a parent entity's) expired without a renewing put-token is detached with
``amqp:unauthorized-access``; ``throttle`` (``FaultController.set_throttle``) refuses transfers beyond N messages
per second with ``com.microsoft:server-busy``. ``FaultController.blackhole`` turns the connections open now into
:class:`_Blackholed` sockets (read and dropped, never written, closed when the client closes them) and
``FaultController.detach`` detaches links on demand.

Tier (``tier``, the CLI's ``--tier``; :mod:`servicebus_local.tiers`): a sender link advertises the entity's
message limit as ``max-message-size`` and the tier's batch limit as ``com.microsoft:max-message-batch-size``; a
batched transfer over the first is rejected (``amqp:link:message-size-exceeded``), one over the second only
detaches the link (``amqp:not-allowed``), as the service does.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import selectors
import shutil
import socket
import struct
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import cproton
from proton import (
    Collector,
    Condition,
    Connection,
    Delivery,
    Endpoint,
    Event,
    Link,
    Receiver,
    Sender,
    Terminus,
    Transport,
    symbol,
    ulong,
)

from servicebus_local import amqp
from servicebus_local.amqp import BATCH_FORMAT, AmqpDecodeError, Array, Timestamp
from servicebus_local.broker import (
    NOT_FOUND,
    SESSION_LOCK_LOST,
    TIMEOUT,
    UNAUTHORIZED,
    Broker,
    BrokerError,
    Delivered,
    EntityAddress,
    Outcome,
)
from servicebus_local.clock import Clock, SystemClock
from servicebus_local.counters import OperationCounters
from servicebus_local.faults import DetachRequest, FaultController
from servicebus_local.sas import PREFIX as _SAS_PREFIX
from servicebus_local.sas import check_sas
from servicebus_local.tiers import STANDARD, Tier, batch_refusal

__all__ = [
    "DEFAULT_CONNECTION_IDLE_TIMEOUT",
    "DEFAULT_LINK_IDLE_TIMEOUT",
    "DEFAULT_MAX_CONNECTIONS",
    "STRICT_SETTLEMENT_ENV",
    "LocalNamespace",
    "connection_quota_description",
    "strict_settlement_from_env",
]

logger = logging.getLogger(__name__)

_DATETIMEOFFSET_EPOCH = 621355968000000000  # .NET ticks at the Unix epoch
_SESSION_FILTER = "com.microsoft:session-filter"
_RECEIVE_MODE_FIRST = 0  # receiver-settle-mode first = receive-and-delete
_CREDIT_WINDOW = 1000
#: Deliveries written to the socket at a time when a link's credit asks for more (see ``_Server.deliver``).
_DELIVERY_CHUNK = 50
_POLL = 0.05
#: The service's quota of concurrent AMQP connections per namespace (Basic / Standard tier).
DEFAULT_MAX_CONNECTIONS = 5000
_CONNECTION_QUOTA_CONDITION = "amqp:resource-limit-exceeded"
#: How long a connection refused for the quota may stay to answer the close before its socket is closed.
_REFUSED_GRACE = 5.0
#: The service detaches a sender or receiver link with no transfer for 10 minutes (IdleTimerExpired).
DEFAULT_LINK_IDLE_TIMEOUT = 600.0
#: The service closes a connection that holds no link for a minute.
DEFAULT_CONNECTION_IDLE_TIMEOUT = 60.0
_LINK_DETACH_FORCED = "amqp:link:detach-forced"
_CONNECTION_FORCED = "amqp:connection:forced"
_SERVER_BUSY = "com.microsoft:server-busy"
#: Link kinds that carry messages (idle timer, token expiry, injected detaches).
_ENTITY_KINDS = frozenset({"send", "receive"})
#: Link kinds that keep a connection from being idle (the $cbs links do not).
_BUSY_KINDS = frozenset({"send", "receive", "pending-session", "mgmt-in", "mgmt-out"})
#: How often lifecycle timers are looked at when the namespace reads a clock other than the system clock.
_FAKE_CLOCK_POLL = 0.1


def connection_quota_description(namespace: str, limit: int) -> str:
    """The error description of a connection refused for the connection quota (the service's
    ``ConnectionsQuotaExceeded for namespace <name>.`` with the numbers)."""
    return (
        f"ConnectionsQuotaExceeded for namespace {namespace}. Cannot open connection: the number of concurrent "
        f"connections to the namespace exceeds the quota of {limit}. TrackingId:{uuid.uuid4().hex}, "
        f"SystemTracker:{namespace}"
    )


def _raw_tag(dlv: Delivery) -> bytes:
    """The delivery tag as bytes (proton 0.40's ``Delivery.tag`` decodes it as UTF-8 and fails on GUIDs)."""
    return cproton.bytes2pybytes(cproton.lib.pn_delivery_tag(dlv._impl))  # type: ignore[no-any-return]


# ------------------------------------------------------------------------------------------------------------
# SAS verification (CBS put-token)


def verify_sas_token(token: str, key_name: str, key: str, now: float | None = None) -> str | None:
    """Why a ``SharedAccessSignature sr=..&sig=..&se=..&skn=..`` token is refused, or None if valid
    (see :func:`servicebus_local.sas.check_sas`)."""
    refusal = check_sas(token, key_name, key, time.time() if now is None else now)
    return None if refusal is None else refusal.value


# ------------------------------------------------------------------------------------------------------------
# per-link state


class _LinkState:
    """What the server knows about one link (stored on the proton link's attachment record)."""

    __slots__ = (
        "kind",
        "address",
        "addr",
        "peek_lock",
        "session_id",
        "waiting",
        "tag_counter",
        "node",
        "held",
        "pending_attach_deadline",
        "closed",
        "link",
        "conn",
        "last_active",
        "number",
    )

    def __init__(self, kind: str, link: Link, conn: _AmqpConnection) -> None:
        self.kind = kind  # send | receive | cbs-in | cbs-out | mgmt-in | mgmt-out | pending-session
        self.address = ""
        self.addr: EntityAddress | None = None
        self.peek_lock = True
        self.session_id: str | None = None
        self.waiting = False
        self.tag_counter = itertools.count(1)
        self.node = ""
        self.held: list[tuple[Delivery, list[bytes]]] = []
        self.pending_attach_deadline = 0.0
        self.closed = False
        self.link = link
        self.conn = conn
        self.last_active = 0.0  # the namespace clock's monotonic time of the link's latest transfer
        self.number = 0


# ------------------------------------------------------------------------------------------------------------
# one AMQP connection


class _AmqpConnection:
    """One client connection: a socket, a proton transport/connection/collector and a frame sniffer.

    Runs only in the namespace's server thread."""

    def __init__(self, server: _Server, sock: socket.socket) -> None:
        self.server = server
        self.sock = sock
        self.broker = server.broker
        self.collector = Collector()
        self.connection = Connection()
        self.connection.collect(self.collector)
        self.transport = Transport(Transport.SERVER)
        self.transport.max_frame_size = 1024 * 1024
        self.transport.bind(self.connection)
        sasl = self.transport.sasl()
        sasl.allowed_mechs("ANONYMOUS")
        self.sniffer = amqp.FrameSniffer()
        self.inbuf = bytearray()
        self.outq: deque[tuple[float, bytes]] = deque()
        self.closed = False
        self.eof = False
        self.links: set[_LinkState] = set()
        self.authorized = server.key is None
        self.want_write = False
        self.admitted = False  # counted in the connection quota (its AMQP open was accepted, not closed yet)
        self.refused_at: float | None = None  # monotonic time its open was refused for the quota
        self.draining = False  # refused, closed on the AMQP level: read to the client's end, then close
        self.tick_deadline = 0.0  # monotonic time proton's next timer (a heartbeat) is due; 0 = none
        # Lifecycle (namespace clock): since when the connection holds no link (None: it holds one or is not
        # open yet) and, per CBS audience (entity path, "" = the namespace), when its token expires.
        self.idle_since: float | None = None
        self.token_deadlines: dict[str, float] = {}
        self.token_expiry_wall: dict[str, float] = {}

    # ---------------------------------------------------------------- I/O

    def on_readable(self) -> None:
        if self.draining:
            self._drain()
            return
        try:
            data = self.sock.recv(262144)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close(abrupt=True)
            return
        if not data:
            self.eof = True
            if not self.held():
                with contextlib.suppress(Exception):
                    self.transport.close_tail()
                self.process()
            return
        self.inbuf += data
        self.pump_input()

    def held(self) -> bool:
        """Whether a stall holds this connection now (see ``FaultController.stall``)."""
        f = self.server.faults
        return f.stalled and (not f.stall_answers_sasl or self.sniffer.amqp_started)

    def pump_input(self) -> None:
        """Feed buffered input to the sniffer and proton, then process events."""
        while self.inbuf and not self.closed:
            if self.held():
                return
            limit = len(self.inbuf)
            if self.server.faults.stalled:
                # Answer the SASL exchange only: stop right before the AMQP protocol header.
                idx = self.inbuf.find(b"AMQP\x00\x01\x00\x00")
                if idx == 0:
                    self.sniffer.amqp_started = True
                    return
                if idx > 0:
                    limit = idx
            cap = self.transport.capacity()
            if cap < 0:
                # Proton stopped reading (a protocol error): send what it still has to say (its close frame)
                # before closing the socket.
                self.process()
                self.flush()
                self.close(abrupt=False)
                return
            if cap == 0:
                break
            chunk = bytes(self.inbuf[: min(cap, limit)])
            del self.inbuf[:cap]
            self.sniffer.feed(chunk)
            try:
                self.transport.push(chunk)
            except Exception:  # noqa: BLE001 - proton raises on protocol errors: drop the connection
                logger.debug("protocol error on a connection", exc_info=True)
                self.close(abrupt=True)
                return
            self.process()
        if self.eof and not self.inbuf and not self.closed:
            with contextlib.suppress(Exception):
                self.transport.close_tail()
            self.process()

    def collect_output(self) -> None:
        """Move proton's pending output into the (possibly delayed) write queue."""
        if self.closed:
            return
        t = self.transport
        while True:
            n = t.pending()
            if n <= 0:
                if n < 0 and not self.outq:
                    self.close(abrupt=False)
                break
            data = t.peek(n)
            t.pop(n)
            if data:
                release = time.monotonic() + self.server.faults.latency if self.server.faults.latency else 0.0
                self.outq.append((release, bytes(data)))

    def flush(self) -> float | None:
        """Write what is due; returns the monotonic time of the next due chunk (None if nothing waits)."""
        if self.closed:
            return None
        if self.held():
            return None
        now = time.monotonic()
        while self.outq:
            release, data = self.outq[0]
            if release > now:
                self.set_want_write(False)
                return release
            try:
                sent = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                self.set_want_write(True)
                return None
            except OSError:
                self.close(abrupt=True)
                return None
            if sent < len(data):
                self.outq[0] = (release, data[sent:])
                self.set_want_write(True)
                return None
            self.outq.popleft()
            if self.draining and not self.outq:
                self._shut_write()
        self.set_want_write(False)
        if self.transport.closed and not self.outq:
            self.close(abrupt=False)
        return None

    def tick(self, now: float) -> None:
        """Run proton's timers: an empty frame when nothing was sent for half the idle timeout the peer's open
        asked for (``Transport.remote_idle_timeout``; AMQP 1.0 section 2.4.5), as the service does. A connection
        a stall holds is not ticked: its heartbeats stop with everything else it would say (and do not pile up
        to be written when the stall ends); the first tick after it sends one at once."""
        if self.closed or self.held():
            self.tick_deadline = 0.0
            return
        try:
            self.tick_deadline = self.transport.tick(now)
        except Exception:  # noqa: BLE001 - a transport proton gave up on has no timers left
            self.tick_deadline = 0.0
        self.collect_output()

    def set_want_write(self, on: bool) -> None:
        if on != self.want_write and not self.closed:
            self.want_write = on
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if on else 0)
            with contextlib.suppress(KeyError, ValueError):
                self.server.selector.modify(self.sock, events, self)

    def release_quota(self) -> None:
        """Stop counting this connection in the connection quota (idempotent)."""
        if self.admitted:
            self.admitted = False
            self.server.counters.release_connection()

    def _shut_write(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)

    def _drain(self) -> None:
        """Discard what a refused client still writes (the frames it ends its session with after the close)
        until it closes its end."""
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.draining = False
            self.eof = True
            self.close(abrupt=False)

    def close(self, *, abrupt: bool) -> None:
        if self.closed or (self.draining and not abrupt):
            return
        if not abrupt and self.refused_at is not None and not self.eof:
            # Refused for the quota and closed on the AMQP level: the client still writes its session's end
            # after the close exchange; closing the socket now would answer that with a reset, and the SDK
            # would then report the broken pipe instead of the quota error. Send our end, read to theirs.
            self.draining = True
            if not self.outq:
                self._shut_write()
            return
        self.closed = True
        self.release_quota()
        for st in list(self.links):
            self.server.forget_link(st)
        self.links.clear()
        with contextlib.suppress(KeyError, ValueError):
            self.server.selector.unregister(self.sock)
        if abrupt:
            with contextlib.suppress(OSError):
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(Exception):
            self.transport.unbind()
        self.server.conns.pop(self, None)

    def detach_link(self, st: _LinkState, condition: str, description: str) -> None:
        """Detach (closed) one link with an AMQP error; the connection, its session and other links stay."""
        link = st.link
        self.server.forget_link(st)
        if link.state & Endpoint.LOCAL_ACTIVE:
            link.condition = _condition(condition, description)
            link.close()

    def has_busy_link(self) -> bool:
        """Whether the connection holds a link that keeps it from idling (any link but the $cbs pair)."""
        return any(st.kind in _BUSY_KINDS and not st.closed for st in self.links)

    def token_deadline(self, path: str) -> tuple[float, str] | None:
        """(namespace-clock deadline, audience) of the latest-expiring CBS token put on this connection that
        covers the entity ``path`` (an audience of the namespace, the entity or a parent of it), or None."""
        key = path.strip("/").lower()
        best: tuple[float, str] | None = None
        for audience, deadline in self.token_deadlines.items():
            if audience and audience != key and not key.startswith(audience + "/"):
                continue
            if best is None or deadline > best[0]:
                best = (deadline, audience)
        return best

    def close_with_error(self, condition: str, description: str) -> None:
        """Close the connection with an AMQP error (condition, description and an info map: the SDK reads all
        three)."""
        if self.closed:
            return
        conn = self.connection
        if conn.state & Endpoint.LOCAL_ACTIVE:
            conn.condition = _condition(condition, description)
            conn.close()
        self.process()
        self.flush()

    # ---------------------------------------------------------------- events

    def process(self) -> None:
        c = self.collector
        while True:
            ev = c.peek()
            if ev is None:
                break
            try:
                self.dispatch(ev)
            except Exception:  # noqa: BLE001 - one bad event must not kill the namespace
                logger.exception("error handling AMQP event %s", ev.type)
            c.pop()
            if self.closed:
                return
        self.collect_output()

    def dispatch(self, ev: Any) -> None:
        t = ev.type
        if self.refused_at is not None and t not in _REFUSED_EVENTS:
            return  # refused for the quota: what the client pipelined after its open is not served
        if t == Event.DELIVERY:
            dlv = ev.delivery
            link = dlv.link
            st = _state(link)
            if st is None:
                return
            if link.is_receiver:
                self.on_incoming(st, link, dlv)
            else:
                self.on_settlement(st, link, dlv)
        elif t == Event.LINK_FLOW:
            link = ev.link
            st = _state(link)
            if st is not None and link.is_sender and st.kind == "receive":
                if link.credit > 0:
                    self.server.counters.add("receive_flows")
                    st.last_active = self.server.clock.monotonic()
                self.server.deliver(st)
        elif t == Event.LINK_REMOTE_OPEN:
            self.on_link_open(ev.link)
        elif t in (Event.LINK_REMOTE_CLOSE, Event.LINK_REMOTE_DETACH):
            link = ev.link
            st = _state(link)
            if st is not None:
                self.server.forget_link(st)
            if link.state & Endpoint.LOCAL_ACTIVE:
                link.close()
        elif t == Event.SESSION_REMOTE_OPEN:
            ssn = ev.session
            if ssn.state & Endpoint.LOCAL_UNINIT:
                ssn.open()
        elif t == Event.SESSION_REMOTE_CLOSE:
            ssn = ev.session
            if ssn.state & Endpoint.LOCAL_ACTIVE:
                ssn.close()
        elif t == Event.CONNECTION_REMOTE_OPEN:
            conn = ev.connection
            if conn.state & Endpoint.LOCAL_UNINIT:
                conn.container = f"spark-sb-local-{self.server.broker.namespace_name}"
                conn.properties = {symbol("product"): "spark-sb-local"}
                conn.open()
                self.admit()
        elif t == Event.CONNECTION_REMOTE_CLOSE:
            self.release_quota()
            conn = ev.connection
            if conn.state & Endpoint.LOCAL_ACTIVE:
                conn.close()
        elif t == Event.TRANSPORT_ERROR:
            # Proton closes the connection itself on a protocol error; give that close the info map the SDK
            # reads (error[2]) along with the condition and description.
            cond = self.transport.condition
            if cond is not None and not cond.info:
                self.transport.condition = _condition(str(cond.name), str(cond.description or cond.name))
        elif t == Event.TRANSPORT_CLOSED:
            for st in list(self.links):
                self.server.forget_link(st)

    def admit(self) -> None:
        """Count this connection in the quota, or close it with the service's quota error (its open was
        answered)."""
        limit = self.server.max_connections
        if self.server.counters.admit_connection(limit):
            self.admitted = True
            if not self.has_busy_link():
                self.idle_since = self.server.clock.monotonic()
                self.server.arm(self.idle_since + self.server.connection_idle_timeout)
            return
        self.refused_at = time.monotonic()
        name = self.server.broker.namespace_name
        self.connection.condition = _condition(
            _CONNECTION_QUOTA_CONDITION, connection_quota_description(name, limit)
        )
        self.connection.close()
        logger.info("namespace %s: connection refused, the quota of %d connections is reached", name, limit)

    # ---------------------------------------------------------------- attach

    def on_link_open(self, link: Link) -> None:
        if not link.state & Endpoint.LOCAL_UNINIT:
            return
        terminus = link.remote_target if link.is_receiver else link.remote_source
        address = terminus.address or ""
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        node = _node_name(address)
        if node == "$cbs":
            st = _LinkState("cbs-in" if link.is_receiver else "cbs-out", link, self)
            self._register(link, st, address)
            link.open()
            if link.is_receiver:
                assert isinstance(link, Receiver)
                link.flow(100)
            return
        if node.lower().endswith("$management"):
            st = _LinkState("mgmt-in" if link.is_receiver else "mgmt-out", link, self)
            st.node = node
            self._register(link, st, address)
            link.open()
            if link.is_receiver:
                assert isinstance(link, Receiver)
                link.flow(100)
            return
        try:
            if not self.authorized:
                raise BrokerError(UNAUTHORIZED, "Unauthorized access: no valid token was put on $cbs.")
            covering = self.token_deadline(_node_name(address))
            if covering is not None and self.server.clock.monotonic() >= covering[0]:
                raise BrokerError(
                    UNAUTHORIZED,
                    f"Unauthorized access. ExpiredToken: the token for '{covering[1] or '/'}' is expired. "
                    "Put a new token on $cbs.",
                )
            if link.is_receiver:
                addr = self.broker.resolve(address)
                if addr.kind == "subscription" or addr.dead_letter or addr.management:
                    raise BrokerError("amqp:not-allowed", f"Cannot send to '{addr.path}'.")
                st = _LinkState("send", link, self)
                st.addr = addr
                self.server.counters.add("sender_links_opened")
                self._register(link, st, address)
                # The entity's message limit, and the tier's batch limit (servicebus_local.tiers).
                limit = self.broker.message_limit(addr)
                link.max_message_size = limit
                link.properties = {
                    symbol("com.microsoft:max-message-batch-size"): ulong(self.broker.tier.batch_limit(limit))
                }
                link.open()
                assert isinstance(link, Receiver)
                link.flow(_CREDIT_WINDOW)
                return
            session_filter, has_filter = _session_filter(link.remote_source)
            addr = self.broker.check_receiver(address, session=has_filter)
            st = _LinkState("receive", link, self)
            st.addr = addr
            self.server.counters.add("receiver_links_opened")
            st.peek_lock = link.remote_snd_settle_mode != Link.SND_SETTLED
            self._register(link, st, address)
            if has_filter:
                accepted = self.broker.accept_session(addr, session_filter, st)
                if accepted is None:
                    st.kind = "pending-session"
                    props = link.remote_properties or {}
                    timeout_ms = props.get(symbol("com.microsoft:timeout")) or props.get(
                        "com.microsoft:timeout"
                    )
                    wait = (int(timeout_ms) / 1000.0) if timeout_ms else 65.0
                    st.pending_attach_deadline = time.monotonic() + wait
                    self.server.pending_sessions.add(st)
                    return
                self.complete_session_attach(st, *accepted)
                return
            link.open()
        except BrokerError as exc:
            self.refuse_link(link, exc.condition, exc.description)

    def complete_session_attach(self, st: _LinkState, session_id: str, locked_until_ms: int) -> None:
        link = st.link
        st.kind = "receive"
        st.session_id = session_id
        flt = link.source.filter
        flt.clear()
        flt.put_map()
        flt.enter()
        flt.put_symbol(symbol(_SESSION_FILTER))
        flt.put_string(session_id)
        flt.exit()
        ticks = locked_until_ms * 10000 + _DATETIMEOFFSET_EPOCH
        link.properties = {symbol("com.microsoft:locked-until-utc"): ticks}
        link.open()

    def refuse_link(self, link: Link, condition: str, description: str) -> None:
        st = _state(link)
        if st is not None:
            self.server.forget_link(st)
        if link.is_receiver:  # the spec's refusal: an attach with a null terminus, then the detach
            link.target.type = Terminus.UNSPECIFIED
        else:
            link.source.type = Terminus.UNSPECIFIED
        link.open()
        link.condition = _condition(condition, description)
        link.close()

    def _register(self, link: Link, st: _LinkState, address: str) -> None:
        st.address = address
        link.sb_state = st
        self.links.add(st)
        server = self.server
        if st.kind in _BUSY_KINDS:
            self.idle_since = None
        if st.kind in _ENTITY_KINDS:
            st.number = next(server.link_numbers)
            st.last_active = server.clock.monotonic()
            server.arm(st.last_active + server.link_idle_timeout)

    # ---------------------------------------------------------------- incoming transfers

    def on_incoming(self, st: _LinkState, link: Link, dlv: Delivery) -> None:
        if dlv.partial and not dlv.aborted:
            return
        assert isinstance(link, Receiver)
        fmt = self.sniffer.pop_format(link.name)
        if dlv.aborted:
            link.advance()
            dlv.settle()
            return
        data = link.recv(dlv.pending) or b""
        link.advance()
        if link.credit < _CREDIT_WINDOW // 2:
            link.flow(_CREDIT_WINDOW - link.credit)
        if st.kind == "send":
            st.last_active = self.server.clock.monotonic()
            self.on_send(st, dlv, data, fmt)
        elif st.kind == "cbs-in":
            self.server.counters.add("cbs_put_tokens")
            dlv.update(Delivery.ACCEPTED)
            dlv.settle()
            self.on_cbs(st, data)
        elif st.kind == "mgmt-in":
            dlv.update(Delivery.ACCEPTED)
            dlv.settle()
            self.server.management.handle(self, st, data)
        else:
            # Always with a condition: the SDK crashes in its send-complete callback (and then waits forever)
            # on a rejection without one.
            _reject(dlv, "amqp:not-allowed", f"the link {link.name!r} does not accept transfers")

    def on_send(self, st: _LinkState, dlv: Delivery, data: bytes, fmt: int) -> None:
        assert st.addr is not None
        counters = self.server.counters
        counters.add("transfers_received")
        try:
            payloads = amqp.split_batch(data) if fmt == BATCH_FORMAT else [data]
        except AmqpDecodeError as exc:
            _reject(dlv, "amqp:decode-error", str(exc))
            return
        counters.add("messages_received", len(payloads))
        faults = self.server.faults
        if not self.authorized:
            _reject(
                dlv,
                UNAUTHORIZED,
                "Unauthorized access. 'Send' claim(s) are required to perform this operation.",
            )
            return
        if fmt == BATCH_FORMAT:
            limit = self.broker.message_limit(st.addr)
            refusal = batch_refusal(len(data), limit, self.broker.tier.batch_limit(limit), st.link.name)
            if refusal is not None:
                counters.add("batches_over_limit")
                if refusal.detach:
                    self.detach_link(st, refusal.condition, refusal.description)
                else:
                    _reject(dlv, refusal.condition, refusal.description)
                return
        fault = faults.send_fault(st.addr.path)
        if fault is not None:
            _reject(dlv, fault[0], fault[1])
            return
        if not self.server.take_credits(len(payloads)):
            counters.add("messages_throttled", len(payloads))
            _reject(dlv, _SERVER_BUSY, self.server.throttled_description(st.addr))
            return
        if faults.entity_stalled(st.addr.path):
            st.held.append((dlv, payloads))
            self.server.stalled_links.add(st)
            return
        self.settle_send(st, dlv, payloads)

    def settle_send(self, st: _LinkState, dlv: Delivery, payloads: list[bytes]) -> None:
        assert st.addr is not None
        try:
            self.broker.send(st.addr, payloads)
        except BrokerError as exc:
            _reject(dlv, exc.condition, exc.description)
            return
        except AmqpDecodeError as exc:
            _reject(dlv, "amqp:decode-error", str(exc))
            return
        dlv.update(Delivery.ACCEPTED)
        dlv.settle()

    # ---------------------------------------------------------------- CBS

    def on_cbs(self, st: _LinkState, data: bytes) -> None:
        try:
            sections = amqp.message_sections(data)
            props = sections.get(amqp.PROPERTIES) or []
            app = sections.get(amqp.APPLICATION_PROPERTIES) or {}
            token = sections.get(amqp.AMQP_VALUE)
            mid_raw = _message_id_raw(data)
        except AmqpDecodeError:
            return
        reply_to = props[4] if len(props) > 4 else None
        status, description = 202, "Accepted"
        if app.get("operation") != "put-token":
            status, description = 400, "unknown CBS operation"
        elif self.server.key is not None:
            text = token.decode("utf-8", "replace") if isinstance(token, bytes) else str(token)
            reason = verify_sas_token(text, self.server.key_name, self.server.key)
            if reason is not None:
                status, description = 401, f"InvalidSignature: {reason}"
            else:
                self.authorized = True
        if status == 202:
            self.record_token(app, token)
        reply = amqp.encode_reply(
            correlation_id_raw=mid_raw,
            application_properties={"status-code": status, "status-description": description},
            value=None,
            to=reply_to,
        )
        self.send_reply("cbs-out", "$cbs", reply_to, reply, st)

    def record_token(self, app: Mapping[Any, Any], token: Any) -> None:
        """Remember when an accepted put-token's token expires (its SAS ``se``, else the request's
        ``expiration``), for its audience: the links it covers are detached when it expires unless another
        put-token for the same audience renews it. The lifetime left (against the wall clock that minted the
        token) runs on the namespace's clock."""
        audience = _str_or_none(app.get("name"))
        text = token.decode("utf-8", "replace") if isinstance(token, bytes) else str(token or "")
        expiry = _token_expiry(text, app.get("expiration"))
        if audience is None or expiry is None:
            return
        key = _node_name(audience).lower()
        deadline = self.server.clock.monotonic() + (expiry - time.time())
        self.token_deadlines[key] = deadline
        self.token_expiry_wall[key] = expiry
        self.server.arm(deadline)

    def send_reply(
        self, kind: str, node: str, reply_to: str | None, payload: bytes, origin: _LinkState
    ) -> None:
        target: _LinkState | None = None
        for cand in self.links:
            if cand.kind != kind or cand.closed:
                continue
            if reply_to and cand.address == reply_to:
                target = cand
                break
            same_node = cand.node == node or _node_name(cand.address) == node
            if same_node and (target is None or cand.link.session == origin.link.session):
                target = cand
        if target is None:
            logger.debug("no reply link for %s", node)
            return
        link = target.link
        assert isinstance(link, Sender)
        tag = str(next(target.tag_counter)).encode()
        dlv = link.delivery(tag)  # type: ignore[arg-type]
        link.send(payload)
        link.advance()
        dlv.settle()

    # ---------------------------------------------------------------- outgoing deliveries and settlements

    def on_settlement(self, st: _LinkState, link: Link, dlv: Delivery) -> None:
        if st.kind != "receive" or not dlv.updated:
            return
        if dlv.local_state and dlv.settled:
            dlv.settle()
            return
        state = dlv.remote_state
        tag = _raw_tag(dlv)
        remote = dlv.remote
        reason = description = None
        if state == Delivery.ACCEPTED:
            outcome = Outcome.COMPLETE
        elif state == Delivery.RELEASED:
            outcome = Outcome.RELEASE
        elif state == Delivery.MODIFIED:
            outcome = Outcome.DEFER if remote.undeliverable else Outcome.ABANDON
        elif state == Delivery.REJECTED:
            outcome = Outcome.DEAD_LETTER
            cond = remote.condition
            if cond is not None:
                info: Any = cond.info or {}
                reason = _str_or_none(info.get("DeadLetterReason") or info.get(symbol("DeadLetterReason")))
                description = _str_or_none(
                    info.get("DeadLetterErrorDescription") or info.get(symbol("DeadLetterErrorDescription"))
                )
        else:
            return
        assert st.addr is not None
        self.server.counters.add("settlements")
        try:
            self.broker.settle(st.addr, tag, outcome, reason=reason, description=description, owner=st)
        except BrokerError as exc:
            if not dlv.settled:
                dlv.local.condition = _condition(exc.condition, exc.description)
                dlv.update(Delivery.REJECTED)
            dlv.settle()
            return
        if not dlv.settled:
            if state == Delivery.MODIFIED:
                dlv.local.failed = True
                dlv.local.undeliverable = bool(remote.undeliverable)
            dlv.update(state)
        dlv.settle()

    def send_deliveries(self, st: _LinkState, items: list[Delivered]) -> None:
        link = st.link
        assert isinstance(link, Sender)
        self.server.counters.add("messages_delivered", len(items))
        st.last_active = self.server.clock.monotonic()
        for d in items:
            tag = d.lock_token if d.lock_token is not None else next(st.tag_counter).to_bytes(8, "big")
            dlv = link.delivery(tag)  # type: ignore[arg-type]
            link.send(d.payload)
            link.advance()
            if not st.peek_lock:
                dlv.settle()


class _Blackholed:
    """A connection a blackhole silenced: what its client writes is read and dropped, nothing is ever written;
    the socket is closed (and the connection leaves the quota) when the client closes its end."""

    def __init__(self, server: _Server, sock: socket.socket, conn: _AmqpConnection | None) -> None:
        self.server = server
        self.sock = sock
        self.conn = conn

    def on_readable(self) -> None:
        try:
            data = self.sock.recv(262144)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.close()

    def close(self, *, abrupt: bool = False) -> None:
        """Close the socket (``abrupt``: with a TCP reset, as ``drop_connections`` does)."""
        with contextlib.suppress(KeyError, ValueError):
            self.server.selector.unregister(self.sock)
        if abrupt:
            with contextlib.suppress(OSError):
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            self.sock.close()
        self.server.black.pop(self.sock, None)
        if self.conn is not None:
            self.conn.release_quota()
            with contextlib.suppress(Exception):
                self.conn.transport.unbind()


#: The events still handled on a connection refused for the quota (its close, its transport's end).
_REFUSED_EVENTS = frozenset({Event.CONNECTION_REMOTE_CLOSE, Event.TRANSPORT_ERROR, Event.TRANSPORT_CLOSED})


def _condition(name: str, description: str) -> Condition:
    """An AMQP error with an info map (the SDK reads ``error[2]``; proton drops an absent info)."""
    return Condition(name, description, {symbol("com.microsoft:tracking-id"): uuid.uuid4().hex})


def _token_expiry(text: str, expiration: Any) -> float | None:
    """A CBS token's expiry in epoch seconds: a SAS token's ``se``, else the put-token's ``expiration``
    (a timestamp, or a number of seconds), else None (a token the namespace cannot date never expires)."""
    if text.startswith(_SAS_PREFIX):
        for pair in text[len(_SAS_PREFIX) :].split("&"):
            key, _, value = pair.partition("=")
            if key.strip() == "se":
                with contextlib.suppress(ValueError):
                    return float(int(value.strip()))
    if isinstance(expiration, Timestamp):
        return int(expiration) / 1000.0
    if isinstance(expiration, (int, float)) and not isinstance(expiration, bool):
        return float(expiration) / 1000.0 if expiration > 100_000_000_000 else float(expiration)
    return None


def _timespan(seconds: float) -> str:
    """``seconds`` as .NET writes a TimeSpan (``00:10:00``, ``00:00:00.5000000``), as the service's messages do."""
    ticks = round(seconds * 10_000_000)
    whole, frac = divmod(ticks, 10_000_000)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}" + (f".{frac:07d}" if frac else "")


def _utc_stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())


def _reject(dlv: Delivery, condition: str, description: str) -> None:
    dlv.local.condition = _condition(condition, description)
    dlv.update(Delivery.REJECTED)
    dlv.settle()


def _str_or_none(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


def _state(link: Link) -> _LinkState | None:
    try:
        return link.sb_state  # type: ignore[no-any-return]
    except AttributeError:
        return None


def _node_name(address: str) -> str:
    a = address
    if "://" in a:
        a = a.split("://", 1)[1]
        a = a.split("/", 1)[1] if "/" in a else ""
    return a.strip("/")


def _session_filter(source: Terminus) -> tuple[str | None, bool]:
    """(session id or None for next-available, whether the session filter is present)."""
    flt = source.filter
    flt.rewind()
    if not flt.next():
        return None, False
    value = flt.get_object()
    if not isinstance(value, dict):
        return None, False
    for k, v in value.items():
        if str(k) == _SESSION_FILTER:
            if v is None:
                return None, True
            if isinstance(v, bytes):
                return v.decode("utf-8"), True
            return str(v), True
    return None, False


def _message_id_raw(data: bytes) -> bytes:
    """The request's message-id exactly as encoded (echoed as the reply's correlation-id)."""
    return amqp.parse_message(data).message_id_raw


# ------------------------------------------------------------------------------------------------------------
# the management node


def _tokens(values: Any) -> list[bytes]:
    out = []
    for v in values or []:
        if isinstance(v, uuid.UUID):
            out.append(v.bytes_le)
        elif isinstance(v, bytes) and len(v) == 16:
            out.append(uuid.UUID(bytes=v).bytes_le)
        else:
            out.append(uuid.UUID(str(v)).bytes_le)
    return out


_STATUS_BY_CONDITION = {
    NOT_FOUND: 404,
    "com.microsoft:message-not-found": 404,
    "com.microsoft:message-lock-lost": 410,
    SESSION_LOCK_LOST: 410,
    "com.microsoft:session-cannot-be-locked": 409,
    TIMEOUT: 408,
    UNAUTHORIZED: 401,
    "com.microsoft:entity-disabled": 400,
    "amqp:resource-limit-exceeded": 403,
    "amqp:link:message-size-exceeded": 413,
    "com.microsoft:server-busy": 503,
}


class _Management:
    """Request/response on ``<entity>/$management``: the operations the SDK issues (protocol-notes.md)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        #: The receiver links the request being handled speaks for (see :func:`_requesters`); None outside one.
        self.requesters: frozenset[_LinkState] | None = None

    def handle(self, conn: _AmqpConnection, st: _LinkState, data: bytes) -> None:
        try:
            sections = amqp.message_sections(data)
            mid_raw = _message_id_raw(data)
        except AmqpDecodeError:
            return
        props = sections.get(amqp.PROPERTIES) or []
        reply_to = props[4] if len(props) > 4 else None
        app = sections.get(amqp.APPLICATION_PROPERTIES) or {}
        body = sections.get(amqp.AMQP_VALUE)
        operation = str(app.get("operation") or "")
        conn.server.counters.add("management_operations")
        conn.server.counters.add(f"management:{operation.removeprefix('com.microsoft:')}")
        status, description, value, condition = 200, "OK", None, None
        try:
            if not conn.authorized:
                raise BrokerError(UNAUTHORIZED, "Unauthorized access.")
            entity = _node_name(st.node[: -len("$management")])
            if operation.endswith("schedule-message") and not operation.endswith("cancel-scheduled-message"):
                # Scheduling is a send: the entity's send faults apply (so a failover probe sees them).
                faults = conn.server.faults
                if faults.entity_stalled(entity):
                    return  # never answered, like a stalled transfer
                fault = faults.send_fault(entity)
                if fault is not None:
                    raise BrokerError(*fault)
            self.requesters = _requesters(conn, app.get("associated-link-name"))
            try:
                status, value = self.dispatch(entity, operation, body if isinstance(body, dict) else {})
            finally:
                self.requesters = None
            if status == 204:
                description = "No Content"
        except BrokerError as exc:
            status = _STATUS_BY_CONDITION.get(exc.condition, 400)
            description, condition = exc.description, exc.condition
        except (KeyError, TypeError, ValueError, AmqpDecodeError) as exc:
            status, description, condition = 400, f"Bad request: {exc}", "com.microsoft:argument-error"
        app_out: dict[str, Any] = {"statusCode": status, "statusDescription": description}
        if condition is not None:
            app_out["errorCondition"] = amqp.Symbol(condition)
            app_out["error-condition"] = amqp.Symbol(condition)
        reply = amqp.encode_reply(
            correlation_id_raw=mid_raw, application_properties=app_out, value=value, to=reply_to
        )
        conn.send_reply("mgmt-out", st.node, reply_to, reply, st)

    def dispatch(self, entity: str, operation: str, body: dict[str, Any]) -> tuple[int, Any]:
        """Run one operation (by :data:`_OPERATIONS`); returns (status code, reply body)."""
        handler = _OPERATIONS.get(operation.removeprefix("com.microsoft:"))
        if handler is None:
            raise BrokerError("amqp:not-implemented", f"The operation '{operation}' is not supported.")
        return handler(self, entity, body)

    # One method per operation: (entity path, request body) -> (status code, reply body).

    def _schedule_message(self, entity: str, body: dict[str, Any]) -> tuple[int, Any]:
        payloads = [bytes(m["message"]) for m in body.get("messages") or []]
        seqs = self.broker.schedule(entity, payloads)
        return 200, {"sequence-numbers": Array(seqs, element="long")}

    def _cancel_scheduled_message(self, entity: str, body: dict[str, Any]) -> tuple[int, Any]:
        self.broker.cancel_scheduled(entity, [int(s) for s in body.get("sequence-numbers") or []])
        return 200, {}

    def _peek_message(self, entity: str, body: dict[str, Any]) -> tuple[int, Any]:
        msgs = self.broker.peek(
            entity,
            int(body.get("from-sequence-number") or 1),
            int(body.get("message-count") or 1),
            session_id=_session_id(body),
        )
        if not msgs:
            return 204, {}
        return 200, {"messages": [{"message": m} for m in msgs]}

    def _renew_lock(self, entity: str, body: dict[str, Any]) -> tuple[int, Any]:
        expirations = self.broker.renew_lock(entity, _tokens(body.get("lock-tokens")))
        return 200, {"expirations": Array(expirations, element="timestamp")}

    def _receive_by_sequence_number(self, entity: str, body: dict[str, Any]) -> tuple[int, Any]:
        peek_lock = int(body.get("receiver-settle-mode") or 0) != _RECEIVE_MODE_FIRST
        got = self.broker.receive_deferred(
            entity,
            [int(s) for s in body.get("sequence-numbers") or []],
            peek_lock=peek_lock,
            session_id=_session_id(body),
            requesters=self.requesters,
        )
        out = []
        for d in got:
            item: dict[str, Any] = {"message": d.payload}
            if d.lock_token is not None:
                item["lock-token"] = uuid.UUID(bytes_le=d.lock_token)
            out.append(item)
        return 200, {"messages": out}

    def _update_disposition(self, entity: str, body: dict[str, Any]) -> tuple[int, Any]:
        status = str(body.get("disposition-status") or "")
        outcome = _DISPOSITIONS.get(status)
        if outcome is None:
            raise BrokerError("com.microsoft:argument-error", f"Unknown disposition status '{status}'.")
        reason = _str_or_none(body.get("deadletter-reason")) or None
        desc = _str_or_none(body.get("deadletter-description")) or None
        for tag in _tokens(body.get("lock-tokens")):
            self.broker.settle(
                entity, tag, outcome, reason=reason, description=desc, requesters=self.requesters
            )
        return 200, {}

    def _renew_session_lock(self, entity: str, body: dict[str, Any]) -> tuple[int, Any]:
        until = self.broker.renew_session_lock(entity, str(_session_id(body)))
        return 200, {"expiration": Timestamp(until)}

    def _get_session_state(self, entity: str, body: dict[str, Any]) -> tuple[int, Any]:
        return 200, {"session-state": self.broker.session_state(entity, str(_session_id(body)))}

    def _set_session_state(self, entity: str, body: dict[str, Any]) -> tuple[int, Any]:
        raw = body.get("session-state")
        self.broker.set_session_state(entity, str(_session_id(body)), bytes(raw) if raw is not None else None)
        return 200, {}

    def _get_message_sessions(self, entity: str, body: dict[str, Any]) -> tuple[int, Any]:
        skip = int(body.get("skip") or 0)
        top = int(body.get("top") or 100)
        ids = self.broker.list_sessions(entity, skip, top)
        if not ids:
            return 204, {}
        return 200, {"skip": skip + len(ids), "sessions-ids": Array(ids, element="string")}


def _requesters(conn: _AmqpConnection, associated_link_name: Any) -> frozenset[_LinkState]:
    """The receiver links a management request speaks for: the connection's receiver links, or only the one
    its ``associated-link-name`` names (the SDK sends its receiver's link name) when that link is there. A
    session is held by a receiver link, so only requests of that link's connection settle its messages."""
    links = frozenset(st for st in conn.links if st.kind == "receive" and not st.closed)
    name = _str_or_none(associated_link_name)
    if name:
        named = frozenset(st for st in links if st.link.name == name)
        if named:
            return named
    return links


def _session_id(body: dict[str, Any]) -> str | None:
    sid = body.get("session-id")
    return sid.decode() if isinstance(sid, bytes) else sid


_DISPOSITIONS = {
    "completed": Outcome.COMPLETE,
    "abandoned": Outcome.ABANDON,
    "defered": Outcome.DEFER,  # sic: the SDK's spelling
    "deferred": Outcome.DEFER,
    "suspended": Outcome.DEAD_LETTER,
}

_OperationFn = Callable[[_Management, str, dict[str, Any]], tuple[int, Any]]
#: Management operation (without the ``com.microsoft:`` prefix) -> handler, like the admin endpoint's routes.
_OPERATIONS: dict[str, _OperationFn] = {
    "schedule-message": _Management._schedule_message,
    "cancel-scheduled-message": _Management._cancel_scheduled_message,
    "peek-message": _Management._peek_message,
    "renew-lock": _Management._renew_lock,
    "receive-by-sequence-number": _Management._receive_by_sequence_number,
    "update-disposition": _Management._update_disposition,
    "renew-session-lock": _Management._renew_session_lock,
    "get-session-state": _Management._get_session_state,
    "set-session-state": _Management._set_session_state,
    "get-message-sessions": _Management._get_message_sessions,
}


# ------------------------------------------------------------------------------------------------------------
# the server loop


class _Server:
    """The selector loop of one namespace (one thread)."""

    def __init__(self, ns: LocalNamespace) -> None:
        self.ns = ns
        self.broker = ns.broker
        self.faults = ns.faults
        self.counters = ns._counters
        self.key = ns._key
        self.key_name = ns.key_name
        self.max_connections = ns.max_connections
        self.clock: Clock = self.broker.clock
        self._system_clock = isinstance(self.clock, SystemClock)
        self.link_idle_timeout = ns.link_idle_timeout
        self.connection_idle_timeout = ns.connection_idle_timeout
        self.link_numbers = itertools.count(1)
        self._next_due = float("inf")  # namespace-clock time the next lifecycle timer is due
        self._bucket_rate = 0
        self._bucket = 0.0
        self._bucket_at = 0.0
        self._blackhole_generation = self.faults.blackhole_generation
        self.black: dict[socket.socket, _Blackholed] = {}
        self.selector = selectors.DefaultSelector()
        self.conns: dict[_AmqpConnection, None] = {}
        self.sniffing: dict[socket.socket, float] = {}
        self.management = _Management(self.broker)
        self.waiting: set[_LinkState] = set()
        self.pending_sessions: set[_LinkState] = set()
        self.stalled_links: set[_LinkState] = set()
        self.listener: socket.socket | None = None
        self.host = ns.host
        self.port = ns._requested_port
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._applied_version = -1
        self._drop_generation = self.faults.drop_generation
        self._close_generation = self.faults.close_generation
        self._was_stalled = False
        self._notified = False
        self._thread_ident = 0
        self.admin_threads: set[threading.Thread] = set()

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._listen()
        assert self.listener is not None
        self.port = self.listener.getsockname()[1]
        self.selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self.broker.add_listener(self._on_broker_change)
        self.faults.attach_server(self.wake)
        self._thread = threading.Thread(
            target=self._run, name=f"spark-sb-local-{self.broker.namespace_name}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.broker.remove_listener(self._on_broker_change)
        self.faults.detach_server()
        for c in list(self.conns):
            c.close(abrupt=True)
        for s in list(self.sniffing):
            with contextlib.suppress(OSError):
                s.close()
        self.sniffing.clear()
        for b in list(self.black.values()):
            b.close()
        self.black.clear()
        if self.listener is not None:
            with contextlib.suppress(OSError):
                self.listener.close()
            self.listener = None
        with contextlib.suppress(OSError):
            self._wake_r.close()
            self._wake_w.close()
        self.selector.close()

    def wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _on_broker_change(self) -> None:
        if threading.get_ident() == self._thread_ident:
            self._notified = True
        else:
            self._notified = True
            self.wake()

    def _listen(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((self.host, self.port))
        s.listen(128)
        s.setblocking(False)
        self.listener = s

    # ---------------------------------------------------------------- loop

    def _run(self) -> None:
        self._thread_ident = threading.get_ident()
        if self.listener is not None:
            self.selector.register(self.listener, selectors.EVENT_READ, "listen")
        last_tick = 0.0
        while not self._stop.is_set():
            timeout = self._timeout()
            try:
                events = self.selector.select(timeout)
            except OSError:
                events = []
            for key, mask in events:
                data = key.data
                if data == "listen":
                    self._accept()
                elif data == "wake":
                    with contextlib.suppress(OSError):
                        while self._wake_r.recv(4096):
                            pass
                elif data == "sniff":
                    self._sniff(key.fileobj)  # type: ignore[arg-type]
                elif isinstance(data, _Blackholed):
                    data.on_readable()
                elif isinstance(data, _AmqpConnection):
                    if mask & selectors.EVENT_READ:
                        data.on_readable()
                    if mask & selectors.EVENT_WRITE and not data.closed:
                        data.flush()
            try:
                self._apply_faults()
                now = time.monotonic()
                if self._notified or self.waiting or self.pending_sessions or now - last_tick > 0.25:
                    self._notified = False
                    if now - last_tick > _POLL:
                        self.broker.tick()
                        last_tick = now
                    self._service_waiting()
                self._service_stalled_links()
                if self.clock.monotonic() >= self._next_due:
                    self._check_lifecycle()
                for c in list(self.conns):
                    if not c.closed:
                        if c.refused_at is not None and now - c.refused_at > _REFUSED_GRACE:
                            c.close(abrupt=True)  # refused for the quota and never answered the close
                            continue
                        c.tick(now)
                        c.collect_output()
                        c.flush()
            except Exception:  # noqa: BLE001 - keep serving
                logger.exception("local namespace loop error")

    def _timeout(self) -> float:
        timeout = 1.0
        if self.waiting or self.pending_sessions or self._notified:
            timeout = _POLL
        if self.stalled_links:
            timeout = min(timeout, _POLL)
        now = time.monotonic()
        for c in self.conns:
            if c.closed or c.held():
                continue
            if c.outq:
                timeout = min(timeout, max(0.0, c.outq[0][0] - now))
            if c.tick_deadline:
                timeout = min(timeout, max(0.0, c.tick_deadline - now))
        if self._next_due != float("inf"):
            if self._system_clock:
                timeout = min(timeout, max(0.0, self._next_due - self.clock.monotonic()))
            else:
                timeout = min(timeout, _FAKE_CLOCK_POLL)
        return timeout

    # ---------------------------------------------------------------- lifecycle timers and throttling

    def arm(self, deadline: float) -> None:
        """A lifecycle timer is due at ``deadline`` (namespace clock); the loop looks at it then."""
        if deadline < self._next_due:
            self._next_due = deadline
            if threading.get_ident() != self._thread_ident:
                self.wake()

    def _check_lifecycle(self) -> None:
        """Detach idle links and links whose token expired, close connections that hold no link for the
        connection idle timeout; remember when the next of these timers is due."""
        now = self.clock.monotonic()
        self._next_due = float("inf")
        due = float("inf")
        for c in list(self.conns):
            if c.closed or c.refused_at is not None or c.draining:
                continue
            if c.held():
                due = min(due, now + 0.25)  # a stalled connection is looked at again when the stall ends
                continue
            if c.idle_since is not None:
                deadline = c.idle_since + self.connection_idle_timeout
                if now >= deadline:
                    self.counters.add("connections_closed_idle")
                    c.close_with_error(_CONNECTION_FORCED, self._idle_connection_description())
                    continue
                due = min(due, deadline)
            for st in list(c.links):
                if st.closed or st.kind not in _ENTITY_KINDS or st.addr is None:
                    continue
                covering = c.token_deadline(st.addr.path)
                if covering is not None:
                    if now >= covering[0]:
                        self.counters.add("links_detached_token_expired")
                        c.detach_link(st, UNAUTHORIZED, self._expired_token_description(c, st, covering[1]))
                        continue
                    due = min(due, covering[0])
                deadline = st.last_active + self.link_idle_timeout
                if now >= deadline:
                    self.counters.add("links_detached_idle")
                    c.detach_link(st, _LINK_DETACH_FORCED, self._idle_link_description(st))
                    continue
                due = min(due, deadline)
            c.collect_output()
        self._next_due = min(self._next_due, due)

    def _tracking(self, st: _LinkState | None = None) -> str:
        if st is not None and st.addr is not None:
            return self._tracking_for(st.addr)
        ns = self.broker.namespace_name
        return f"TrackingId:{uuid.uuid4().hex}, SystemTracker:{ns}, Timestamp:{_utc_stamp()}"

    def _idle_link_description(self, st: _LinkState) -> str:
        role, kind = ("publisher", "Publisher") if st.kind == "send" else ("consumer", "Consumer")
        return (
            f"The link '{st.link.name}' is force detached. Code: {role}(link{st.number}). Details: "
            f"AmqpMessage{kind}.IdleTimerExpired: Idle timeout: {_timespan(self.link_idle_timeout)}. "
            + self._tracking(st)
        )

    def _idle_connection_description(self) -> str:
        ms = round(self.connection_idle_timeout * 1000)
        return (
            f"The connection was inactive for more than the allowed {ms} milliseconds and is closed by container "
            f"'spark-sb-local-{self.broker.namespace_name}'. " + self._tracking()
        )

    def _expired_token_description(self, c: _AmqpConnection, st: _LinkState, audience: str) -> str:
        assert st.addr is not None
        claim = "Send" if st.kind == "send" else "Listen"
        expiry = c.token_expiry_wall.get(audience)
        when = (
            ""
            if expiry is None
            else time.strftime(" Expiration time: '%Y-%m-%d %H:%M:%SZ'.", time.gmtime(expiry))
        )
        return (
            f"The link '{st.link.name}' is force detached. Code: RenewToken. Details: Unauthorized access. "
            f"'{claim}' claim(s) are required to perform this operation. Resource: "
            f"'sb://{self.host}:{self.port}/{st.addr.path}'. ExpiredToken: The token is expired.{when} "
            + self._tracking(st)
        )

    def throttled_description(self, addr: EntityAddress) -> str:
        ns = self.broker.namespace_name
        return (
            f"The request was terminated because the namespace {ns} is being throttled. Error code : 50009. "
            "Please wait 2 seconds and try again. To know more visit https://aka.ms/sbResourceMgrExceptions "
            + self._tracking_for(addr)
        )

    def _tracking_for(self, addr: EntityAddress) -> str:
        ns = self.broker.namespace_name
        return (
            f"TrackingId:{uuid.uuid4().hex}, SystemTracker:{ns}:{addr.kind.capitalize()}:{addr.path}, "
            f"Timestamp:{_utc_stamp()}"
        )

    def take_credits(self, n: int) -> bool:
        """Spend ``n`` credits of the namespace's throttle (a token bucket of one second's worth, refilled at
        ``FaultController.throttle`` per second on the namespace clock); False if they are not there. A batch
        larger than the bucket passes when the bucket is full (and leaves it in debt)."""
        rate = self.faults.throttle
        if rate <= 0:
            self._bucket_rate = 0
            return True
        now = self.clock.monotonic()
        if rate != self._bucket_rate:
            self._bucket_rate, self._bucket, self._bucket_at = rate, float(rate), now
        else:
            self._bucket = min(float(rate), self._bucket + (now - self._bucket_at) * rate)
            self._bucket_at = now
        if self._bucket < min(n, rate):
            return False
        self._bucket -= n
        return True

    def _blackhole(self) -> None:
        """Silence every connection open now (see ``FaultController.blackhole``)."""
        for c in list(self.conns):
            if c.closed:
                continue
            for st in list(c.links):
                self.forget_link(st)
            c.links.clear()
            c.outq.clear()
            c.closed = True  # the loop never ticks, answers or closes it again
            self.conns.pop(c, None)
            self._watch_black(_Blackholed(self, c.sock, c))
        for s in list(self.sniffing):
            self.sniffing.pop(s, None)
            self._watch_black(_Blackholed(self, s, None))

    def _watch_black(self, b: _Blackholed) -> None:
        self.counters.add("connections_blackholed")
        self.black[b.sock] = b
        try:
            self.selector.modify(b.sock, selectors.EVENT_READ, b)
        except (KeyError, ValueError):
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.selector.register(b.sock, selectors.EVENT_READ, b)

    def _apply_detaches(self, requests: list[DetachRequest]) -> None:
        for req in requests:
            for c in list(self.conns):
                if c.closed:
                    continue
                for st in list(c.links):
                    if st.closed or st.kind not in _ENTITY_KINDS or st.addr is None:
                        continue
                    path = st.addr.path.lower()
                    if (
                        req.entity is not None
                        and path != req.entity
                        and not path.startswith(req.entity + "/")
                    ):
                        continue
                    self.counters.add("links_detached_fault")
                    c.detach_link(st, req.condition, req.description)
                c.collect_output()
                c.flush()

    def _accept(self) -> None:
        if self.listener is None:
            return
        for _ in range(64):
            try:
                sock, _addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sniffing[sock] = time.monotonic()
            if not (self.faults.stalled and not self.faults.stall_answers_sasl):
                self.selector.register(sock, selectors.EVENT_READ, "sniff")

    def _sniff(self, sock: socket.socket) -> None:
        try:
            first = sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            first = b""
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(sock)
        self.sniffing.pop(sock, None)
        if not first:
            with contextlib.suppress(OSError):
                sock.close()
            return
        if first == b"\x16":
            self.counters.add("admin_connections_opened")
            self._hand_to_admin(sock)
            return
        conn = _AmqpConnection(self, sock)
        self.counters.add("connections_opened")
        self.conns[conn] = None
        self.selector.register(sock, selectors.EVENT_READ, conn)
        conn.on_readable()

    def _hand_to_admin(self, sock: socket.socket) -> None:
        endpoint = self.ns._admin_endpoint()
        if endpoint is None:
            with contextlib.suppress(OSError):
                sock.close()
            return
        sock.setblocking(True)

        def serve() -> None:
            try:
                endpoint.serve_connection(sock)
            finally:
                self.admin_threads.discard(threading.current_thread())

        t = threading.Thread(target=serve, name=f"sb-admin-{self.broker.namespace_name}", daemon=True)
        self.admin_threads.add(t)
        t.start()

    # ---------------------------------------------------------------- faults

    def _apply_faults(self) -> None:
        version = self.faults.pending_version()
        if version == self._applied_version:
            return
        f = self.faults
        if f.refusing and self.listener is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(self.listener)
            with contextlib.suppress(OSError):
                self.listener.close()
            self.listener = None
        elif not f.refusing and self.listener is None:
            for _ in range(50):
                try:
                    self._listen()
                    break
                except OSError as exc:
                    if exc.errno != errno.EADDRINUSE:
                        raise
                    time.sleep(0.05)
            if self.listener is not None:
                self.selector.register(self.listener, selectors.EVENT_READ, "listen")
        if f.drop_generation != self._drop_generation:
            self._drop_generation = f.drop_generation
            for c in list(self.conns):
                c.close(abrupt=True)
            for b in list(self.black.values()):
                b.close(abrupt=True)
            for s in list(self.sniffing):
                with contextlib.suppress(KeyError, ValueError):
                    self.selector.unregister(s)
                with contextlib.suppress(OSError):
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    s.close()
            self.sniffing.clear()
        if f.blackhole_generation != self._blackhole_generation:
            self._blackhole_generation = f.blackhole_generation
            self._blackhole()
        detaches = f.take_detach_requests()
        if detaches:
            self._apply_detaches(detaches)
        if f.close_generation != self._close_generation:
            self._close_generation = f.close_generation
            for c in list(self.conns):
                c.close_with_error(*f.close_error)
        if f.stalled != self._was_stalled:
            self._was_stalled = f.stalled
            if f.stalled and not f.stall_answers_sasl:
                for s in self.sniffing:
                    with contextlib.suppress(KeyError, ValueError):
                        self.selector.unregister(s)
            else:
                for s in self.sniffing:
                    with contextlib.suppress(KeyError, ValueError):
                        self.selector.register(s, selectors.EVENT_READ, "sniff")
                for c in list(self.conns):
                    c.pump_input()
        self._applied_version = version
        self.faults.mark_applied(version)

    def _service_stalled_links(self) -> None:
        for st in list(self.stalled_links):
            if st.closed or st.addr is None:
                self.stalled_links.discard(st)
                continue
            if self.faults.entity_stalled(st.addr.path):
                continue
            held, st.held = st.held, []
            self.stalled_links.discard(st)
            for dlv, payloads in held:
                st.conn.settle_send(st, dlv, payloads)
            st.conn.collect_output()

    # ---------------------------------------------------------------- receivers

    def deliver(self, st: _LinkState) -> None:
        """Send what the link's credit allows; answer a drain; remember links still waiting."""
        link = st.link
        if st.closed or st.kind != "receive" or st.addr is None:
            return
        credit = link.credit
        while credit > 0:
            # Streamed a chunk at a time, each written to the socket before the next is taken, as the service
            # streams: the client decodes the first messages of a large credit while the rest are still sent
            # (taken all at once, a 500-message receive was the namespace's work then the client's, one after
            # the other).
            try:
                items = self.broker.receive(
                    st.addr,
                    min(credit, _DELIVERY_CHUNK),
                    peek_lock=st.peek_lock,
                    session_id=st.session_id,
                    owner=st,
                )
            except BrokerError as exc:
                if exc.condition in (SESSION_LOCK_LOST, NOT_FOUND):
                    self.forget_link(st)
                    link.condition = _condition(exc.condition, exc.description)
                    link.close()
                    st.conn.collect_output()
                    return
                items = []
            if not items:
                break
            st.conn.send_deliveries(st, items)
            credit = link.credit
            if credit > 0:
                st.conn.collect_output()
                st.conn.flush()
        if credit > 0:
            if link.drain_mode:
                link.drained()
                self.waiting.discard(st)
            else:
                self.waiting.add(st)
        else:
            self.waiting.discard(st)
        st.conn.collect_output()

    def _service_waiting(self) -> None:
        for st in list(self.waiting):
            if st.closed:
                self.waiting.discard(st)
                continue
            if st.addr is not None and self.broker.has_available(st.addr, st.session_id):
                self.deliver(st)
        now = time.monotonic()
        for st in list(self.pending_sessions):
            if st.closed:
                self.pending_sessions.discard(st)
                continue
            assert st.addr is not None
            try:
                accepted = self.broker.accept_session(st.addr, None, st)
            except BrokerError as exc:
                self.pending_sessions.discard(st)
                st.conn.refuse_link(st.link, exc.condition, exc.description)
                st.conn.collect_output()
                continue
            if accepted is not None:
                self.pending_sessions.discard(st)
                st.conn.complete_session_attach(st, *accepted)
                st.conn.collect_output()
            elif now >= st.pending_attach_deadline:
                self.pending_sessions.discard(st)
                st.conn.refuse_link(st.link, TIMEOUT, "No session available to accept before the timeout.")
                st.conn.collect_output()

    def forget_link(self, st: _LinkState) -> None:
        if st.closed:
            return
        st.closed = True
        self.waiting.discard(st)
        self.pending_sessions.discard(st)
        self.stalled_links.discard(st)
        st.held.clear()
        conn = st.conn
        conn.links.discard(st)
        if (
            st.kind in _BUSY_KINDS
            and conn.admitted
            and conn.idle_since is None
            and not conn.closed
            and not conn.has_busy_link()
        ):
            conn.idle_since = self.clock.monotonic()
            self.arm(conn.idle_since + self.connection_idle_timeout)
        if st.kind == "receive" and st.session_id is not None and st.addr is not None:
            self.broker.release_session(st.addr, st.session_id, st)
        with contextlib.suppress(AttributeError, KeyError):
            del st.link.sb_state


# ------------------------------------------------------------------------------------------------------------
# public API


#: The environment variable that turns :attr:`Broker.strict_settlement` off (``0``/``false``/``no``/``off``) for
#: namespaces that do not say; strict is the default.
STRICT_SETTLEMENT_ENV = "SERVICEBUS_LOCAL_STRICT_SETTLEMENT"


def strict_settlement_from_env() -> bool:
    """Whether settlement is strict for a namespace that does not say: yes, unless :data:`STRICT_SETTLEMENT_ENV`
    says ``0``/``false``/``no``/``off``."""
    return os.environ.get(STRICT_SETTLEMENT_ENV, "").strip().lower() not in ("0", "false", "no", "off")


class LocalNamespace:
    """A local Service Bus namespace: broker + AMQP/HTTPS server on ``host:port`` (+ optional control API).

    Start with :meth:`start` (or use as a context manager); ``port=0`` picks a free port. Runs its server in a
    background thread of the calling process. ``max_connections`` is the quota of concurrent AMQP connections
    (the service's 5,000 by default; see the module docstring). ``strict_settlement``: update-disposition
    (``$management``) settles only messages received by sequence number (deferred), so a lock a receiver link
    holds is settled on that link only, and anything else gets ``com.microsoft:message-lock-lost``. On by default
    (SPEC E8: the documented contract, so that code tested here depends on nothing more); ``False`` also accepts
    what the service accepts beyond it today (settlement by lock token from any receiver of an entity without
    sessions, which the SDKs' fallbacks use: the README's table); ``None`` reads :data:`STRICT_SETTLEMENT_ENV`
    (``0``/``false``/``no``/``off`` turns it off), so a whole run can be made lenient. ``tier``: ``"standard"``
    (the default: 256 KB messages and batches) or ``"premium"`` (entity limits of 1 to 100 MB, batches of at most
    1 MB), as :mod:`servicebus_local.tiers` says.
    """

    def __init__(
        self,
        name: str = "local",
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        queues: Iterable[str] = (),
        topics: Mapping[str, Iterable[str]] | None = None,
        key_name: str = "RootManageSharedAccessKey",
        key: str | None = None,
        clock: Clock | None = None,
        control_port: int | None = None,
        topology: str | os.PathLike[str] | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        link_idle_timeout: float = DEFAULT_LINK_IDLE_TIMEOUT,
        connection_idle_timeout: float = DEFAULT_CONNECTION_IDLE_TIMEOUT,
        throttle: int = 0,
        strict_settlement: bool | None = None,
        tier: str | Tier = STANDARD,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {max_connections}")
        for option, value in (
            ("link_idle_timeout", link_idle_timeout),
            ("connection_idle_timeout", connection_idle_timeout),
        ):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"{option} must be a positive number of seconds, not {value!r}")
        self.name = name
        #: Seconds a sender or receiver link may go without a transfer before it is detached (IdleTimerExpired).
        self.link_idle_timeout = float(link_idle_timeout)
        #: Seconds a connection may hold no link (the $cbs pair aside) before it is closed.
        self.connection_idle_timeout = float(connection_idle_timeout)
        #: Concurrent AMQP connections allowed; the next one is refused with amqp:resource-limit-exceeded.
        self.max_connections = max_connections
        self.host = host
        self._requested_port = port
        self.key_name = key_name
        self._key = key
        self.faults = FaultController()
        try:
            self.faults.set_throttle(throttle)
        except ValueError as exc:
            raise ValueError(f"throttle: {exc}") from None
        self._counters = OperationCounters()
        if strict_settlement is None:
            strict_settlement = strict_settlement_from_env()
        self.broker = Broker(
            name, clock=clock, faults=self.faults, strict_settlement=strict_settlement, tier=tier
        )
        for q in queues:
            self.broker.ensure_queue(q)
        for t, subs in (topics or {}).items():
            self.broker.ensure_topic(t, subs)
        if topology is not None:
            from servicebus_local.topology import apply_topology, load_topology

            apply_topology(self.broker, load_topology(topology))
        self._control_port = control_port
        self._server: _Server | None = None
        self._control: Any = None
        self._tls: Any = None
        self._admin: Any = None
        self._admin_lock = threading.Lock()
        self._tmpdir: str | None = None

    def __repr__(self) -> str:  # never shows the key
        state = f"port={self.port}" if self._server is not None else "stopped"
        return f"LocalNamespace(name={self.name!r}, host={self.host!r}, {state})"

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> LocalNamespace:
        if self._server is not None:
            return self
        server = _Server(self)
        server.start()
        self._server = server
        if self._control_port is not None:
            from servicebus_local.control import ControlServer

            self._control = ControlServer(self, self.host, self._control_port)
            self._control.start()
        return self

    def stop(self) -> None:
        if self._control is not None:
            self._control.stop()
            self._control = None
        if self._server is not None:
            self._server.stop()
            self._server = None
        with self._admin_lock:
            if self._admin is not None:
                with contextlib.suppress(Exception):
                    self._admin.close()
                self._admin = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
            self._tls = None

    def __enter__(self) -> LocalNamespace:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ---------------------------------------------------------------- addresses

    @property
    def port(self) -> int:
        if self._server is None:
            return self._requested_port
        return self._server.port

    @property
    def key(self) -> str:
        """The key the connection string carries (a fixed dummy when the namespace checks no key)."""
        return self._key if self._key is not None else "local-namespace-key"

    @property
    def connection_string(self) -> str:
        return (
            f"Endpoint=sb://{self.host}:{self.port};SharedAccessKeyName={self.key_name};"
            f"SharedAccessKey={self.key};UseDevelopmentEmulator=true"
        )

    @property
    def fully_qualified_namespace(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def control_url(self) -> str | None:
        if self._control is None:
            return None
        return str(self._control.url)

    # ---------------------------------------------------------------- admin (HTTPS on the same port)

    def _ensure_tls(self) -> Any:
        with self._admin_lock:
            if self._tls is None:
                from servicebus_local.tls import LocalTls

                self._tmpdir = tempfile.mkdtemp(prefix=f"spark-sb-{self.name}-")
                self._tls = LocalTls.create(Path(self._tmpdir))
            return self._tls

    def _admin_endpoint(self) -> Any:
        try:
            tls = self._ensure_tls()
            from servicebus_local.admin import AdminEndpoint
        except ImportError:  # pragma: no cover - the admin modules ship with the package
            logger.warning("admin endpoint unavailable")
            return None
        with self._admin_lock:
            if self._admin is None:
                self._admin = AdminEndpoint(
                    self.broker, tls.server_context, self.key_name, self._key, counters=self._counters
                )
            return self._admin

    @property
    def ca_file(self) -> str:
        """PEM file of the CA the admin client must trust (``connection_verify=ca_file``)."""
        return str(self._ensure_tls().ca_file)

    def admin_client(self, **kw: Any) -> Any:
        """An unmodified ``ServiceBusAdministrationClient`` for this namespace (HTTPS on the same port)."""
        from azure.servicebus.management import ServiceBusAdministrationClient

        kw.setdefault("connection_verify", self.ca_file)
        return ServiceBusAdministrationClient.from_connection_string(self.connection_string, **kw)

    # ---------------------------------------------------------------- helpers for tests and tools

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.02) -> bool:
        """Poll ``predicate`` until true or ``timeout`` (real time); returns its last value."""
        deadline = time.monotonic() + timeout
        while True:
            if predicate():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval)

    def counters(self) -> dict[str, int]:
        """Operation counters since start (see :mod:`servicebus_local.counters`): connections, sends, receive
        calls (flows granting credit), management operations, admin requests."""
        return self._counters.snapshot()

    def reset_counters(self) -> None:
        self._counters.reset()

    @property
    def throttle(self) -> int:
        """Messages per second granted to the namespace now (0 = no throttling); see ``faults.set_throttle``."""
        return self.faults.throttle

    def lifecycle(self) -> dict[str, Any]:
        """The lifecycle timers and the throttle as plain data (the control API's status carries it)."""
        counters = self._counters.snapshot()
        return {
            "link_idle_timeout": self.link_idle_timeout,
            "connection_idle_timeout": self.connection_idle_timeout,
            "throttle": self.faults.throttle,
            "links_detached_idle": counters["links_detached_idle"],
            "connections_closed_idle": counters["connections_closed_idle"],
            "links_detached_token_expired": counters["links_detached_token_expired"],
            "links_detached_fault": counters["links_detached_fault"],
            "connections_blackholed": counters["connections_blackholed"],
            "messages_throttled": counters["messages_throttled"],
        }

    @property
    def connections_open(self) -> int:
        """AMQP connections counted in the connection quota now (admitted, not closed yet)."""
        return self._counters.connections_open

    @property
    def connection_count(self) -> int:
        """Live AMQP connections (for tests)."""
        server = self._server
        return len(server.conns) if server is not None else 0
