"""The SDK's private state in one place: what the wire reads and sets of pyamqp's connections and links and of
the SDK's handlers (``_``-prefixed attributes) - building a connection as the SDK does, opening a handler on a
shared connection, its readiness and limits, when a connection last heard a frame - each behind a function that
says what it means.

azure-servicebus offers no public way to share one connection among links, to know when a connection last heard a
frame, or to reach a socket blocked in SASL; the wire needs all three (SPEC F1-F3, F8, L1). These reads are pinned by
``constraints-dev.txt`` and exercised by the integration tests against the unmodified SDK: when the SDK changes, this
module is where the reads break. The wire's replacements of SDK methods (a parkable send, an abortable TLS setup,
a link kept on a refusal, range dispositions) stay with the behaviour they give, in :mod:`~spark_sb.wire.parking`,
:mod:`~spark_sb.wire.opening`, :mod:`~spark_sb.wire.connection` and :mod:`~spark_sb.wire.receivers`.

No I/O unless a function says so; any thread. Nothing here is picklable.
"""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from spark_sb.wire.timing import PUMP_READ_TIMEOUT

__all__ = [
    "close_handler",
    "close_socket",
    "LinkLimits",
    "link_limits",
    "create_handler",
    "disconnect",
    "finish_open",
    "handler_open",
    "keep_when_idle",
    "link_ready",
    "new_connection",
    "open_on",
    "set_running",
    "without_keep_alive",
    "connection_broken",
    "connection_error",
    "connection_of",
    "ended_by_service",
    "handler_of",
    "last_heard",
    "link_attached",
    "link_of",
    "renew_token",
    "running",
    "short_reads",
    "socket_of",
]


def handler_of(owner: Any) -> Any:
    """The pyamqp client (``_handler``) of an SDK sender or receiver; None if it has none."""
    return getattr(owner, "_handler", None)


def link_of(owner: Any) -> Any:
    """The pyamqp link of an SDK sender or receiver (its handler's ``_link``); None if it has none."""
    return getattr(handler_of(owner), "_link", None)


def connection_of(owner: Any) -> Any:
    """The pyamqp connection of an SDK sender or receiver (its handler's ``_connection``); None if it has none."""
    return getattr(handler_of(owner), "_connection", None)


def running(owner: Any) -> bool:
    """The SDK sender or receiver counts itself open (its ``_running`` flag)."""
    return bool(getattr(owner, "_running", False))


def socket_of(connection: Any) -> Any:
    """The socket under a pyamqp connection (its transport's ``sock``); None before it exists or once closed."""
    return getattr(getattr(connection, "_transport", None), "sock", None)


def last_heard(connection: Any) -> float | None:
    """When a pyamqp connection last received a frame (``time.time()``), None if never."""
    value = getattr(connection, "_last_frame_received_time", None)
    return float(value) if value else None


def connection_broken(connection: Any) -> bool:
    """A pyamqp connection that is no longer open (closed by the service, a socket error)."""
    from azure.servicebus._pyamqp.constants import ConnectionState

    return bool(connection.state != ConnectionState.OPENED)


def connection_error(connection: Any) -> Any:
    """The error with which a pyamqp connection was closed (its ``_error``), None if it has none."""
    return getattr(connection, "_error", None)


def link_attached(owner: Any) -> bool:
    """The link of an SDK sender is still attached (the service did not detach it: idle, an expired token, a
    forced detach); True when it has no link."""
    from azure.servicebus._pyamqp.constants import LinkState

    link = link_of(owner)
    return link is None or link.state == LinkState.ATTACHED


def _condition_text(error: Any) -> str | None:
    condition = getattr(error, "condition", None)
    if condition is None:
        return None
    condition = getattr(condition, "value", condition)
    return condition.decode("utf-8", "replace") if isinstance(condition, bytes) else str(condition)


def ended_by_service(link: Any, connection: Any) -> str | None:
    """The error condition with which the service detached ``link`` or closed ``connection``, if it did (pyamqp
    keeps it on the link and the connection); None otherwise."""
    return _condition_text(getattr(link, "_error", None)) or _condition_text(connection_error(connection))


def renew_token(owner: Any) -> None:
    """Renew the CBS token of an SDK sender's or receiver's link if its refresh window is open (the SDK renews only
    inside its own calls); nothing if it has no authenticator. I/O: a put-token, answered later. Raises what the
    SDK raises."""
    cbs = getattr(handler_of(owner), "_cbs_authenticator", None)
    if cbs is not None:
        cbs.handle_token()


@contextlib.contextmanager
def short_reads(connection: Any) -> Iterator[None]:
    """While the block runs, a read of ``connection`` with nothing to read waits :data:`~spark_sb.wire.timing.
    PUMP_READ_TIMEOUT` at most (the socket's own timeout again after)."""
    sock = socket_of(connection)
    previous = sock.gettimeout() if sock is not None else None
    if sock is not None:
        sock.settimeout(PUMP_READ_TIMEOUT)
    try:
        yield
    finally:
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.settimeout(previous)


# -- building and opening: what the SDK does inside its own calls, done on a shared connection ---------------------


def create_handler(owner: Any) -> Any:
    """Build an SDK sender's or receiver's pyamqp client (its handler) with its authentication, unopened; returns
    it. No I/O."""
    from azure.servicebus._common.utils import create_authentication

    owner._create_handler(create_authentication(owner))
    return owner._handler


def new_connection(client: Any, *, idle_timeout: float, socket_timeout: float, connect_timeout: float) -> Any:
    """A pyamqp connection (not open yet) to ``client``'s namespace, built as the SDK builds a sender's own (same
    host, TLS, proxy, custom endpoint, container and properties), with these timeouts. No I/O."""
    from azure.servicebus._pyamqp._connection import Connection

    template: Any = client.get_queue_sender("$connection", keep_alive=0)  # no I/O: a handler's settings
    h = create_handler(template)
    return Connection(
        ("amqps://" if h._use_tls else "amqp://") + h._hostname,
        sasl_credential=h._auth.sasl,
        ssl_opts=h._ssl_opts,
        container_id=f"SBSender-{uuid.uuid4()}",
        max_frame_size=h._max_frame_size,
        channel_max=h._channel_max,
        idle_timeout=idle_timeout,
        properties=h._properties,
        network_trace=False,
        transport_type=h._transport_type,
        http_proxy=h._http_proxy,
        custom_endpoint_address=h._custom_endpoint_address,
        socket_timeout=socket_timeout,
        connect_timeout=connect_timeout,
        use_tls=h._use_tls,
    )


def keep_when_idle(connection: Any) -> None:
    """Switch off pyamqp's own close of a connection after its idle timeout without a frame (the idle timeout
    still goes out in the open frame, so the namespace sends heartbeats)."""
    connection._idle_timeout = None


def disconnect(connection: Any) -> None:
    """pyamqp's disconnect without a close frame: state END, the transport (and its socket) closed. Raises what
    pyamqp raises."""
    connection._disconnect()


def close_socket(connection: Any) -> None:
    """Close the connection's transport (its socket; nothing if closed already). Never raises."""
    if socket_of(connection) is not None:
        with contextlib.suppress(Exception):
            connection._transport.close()


def open_on(owner: Any, connection: Any, end_session: Callable[..., None]) -> None:
    """Open an SDK sender's or receiver's handler on a shared ``connection`` (a session and CBS links; the link
    attaches as the connection is read); the session ends through ``end_session(session, end, ...)`` whoever ends
    it. I/O: frames written, none awaited."""
    handler = owner._handler
    handler.open(connection=connection)
    session = handler._session
    session.end = functools.partial(end_session, session, session.end)


def link_ready(owner: Any) -> bool:
    """An SDK sender's link opened on a shared connection is ready (its token put, its link attached); renews the
    token when due. No wait."""
    handler = owner._handler
    cbs = handler._cbs_authenticator
    if cbs is not None and not cbs.handle_token():
        return False
    return bool(handler._client_ready())


def finish_open(owner: Any) -> None:
    """What ``ServiceBusSender._open`` does once its link is ready: running, and the link's size limits."""
    from azure.servicebus._common.constants import (
        MAX_BATCH_SIZE_PREMIUM,
        MAX_BATCH_SIZE_STANDARD,
        MAX_MESSAGE_LENGTH_BYTES,
    )

    s = owner
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


def without_keep_alive(owner: Any) -> None:
    """No keep-alive thread for an SDK receiver's handler: the SDK starts one per receiver that reads the
    connection from its own thread - on a shared connection, a second reader."""
    owner._handler._keep_alive_interval = 0


def close_handler(owner: Any) -> None:
    """Close an SDK sender's or receiver's handler as the SDK closes it (a receiver releases what its link held
    first), leaving the shared connection open. I/O; raises what the SDK raises."""
    owner._close_handler()


class LinkLimits(NamedTuple):
    """An open sender link's size limits in bytes: a batch, and one message (Premium: 1 MB and up to 100 MB)."""

    batch: int
    message: int


def link_limits(owner: Any) -> LinkLimits | None:
    """The size limits of an SDK sender's open link (known once the link is open), None if unknown."""
    batch = getattr(owner, "_max_batch_size_on_link", None)
    message = getattr(owner, "_max_message_size_on_link", None)
    if not isinstance(batch, int) or batch <= 0:
        return None
    return LinkLimits(batch, message if isinstance(message, int) and message >= batch else batch)


def set_running(owner: Any, value: bool) -> None:
    """Set an SDK sender's or receiver's ``_running`` flag (what its own open and close set)."""
    owner._running = value


def handler_open(owner: Any) -> bool:
    """The SDK sender's or receiver's handler exists and is not shut down."""
    handler = handler_of(owner)
    return handler is not None and not getattr(handler, "_shutdown", True)
