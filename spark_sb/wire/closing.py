"""Closing pyamqp connections and sockets so that nothing blocks and no file descriptor is left behind (SPEC F8).

A close that cannot send its frame, a socket shut down under a blocked read, a connection reset when a call gave up
on it, a session ended after its links: each function here says which thread it runs on and never raises. Used by
the shared connection (:mod:`~spark_sb.wire.connection`), its opening (:mod:`~spark_sb.wire.opening`), its spare
(:mod:`~spark_sb.wire.liveness`) and the receivers' connection (:mod:`~spark_sb.wire.receivers`).
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable
from typing import Any

from spark_sb.wire.pyamqp_state import close_socket, connection_of, disconnect, socket_of

__all__ = [
    "abort_connection",
    "close_connection",
    "close_quietly",
    "end_session_after_links",
    "shut_down_connection",
    "shut_down_socket",
]

_LOGGER = logging.getLogger(__name__)


def close_quietly(connection: Any) -> None:
    """Close a connection that failed to open, its socket with it (no frame is sent: it may be half open).
    Never raises, never blocks."""
    shut_down_connection(connection)
    with contextlib.suppress(Exception):
        disconnect(connection)  # state END, the transport (and its socket) closed
    close_socket(connection)


def close_connection(connection: Any) -> None:
    """Close a pyamqp connection (a close frame if it is still open) and, whatever happened, its socket: pyamqp's
    ``close`` leaves the socket open when the close frame cannot be sent (a connection reset, a socket shut
    down): it then sets the state to END, and its disconnect does nothing in that state - the file descriptor
    stayed open until the garbage collector found the connection (one per dropped connection; an exception's
    traceback keeps it referenced). Runs on the thread that owns the connection. Never raises; bounded by the
    socket's timeout (:data:`~spark_sb.wire.timing.SDK_SLICE`) when the peer is silent."""
    try:
        connection.close()
    except Exception as exc:  # a broken connection may fail to close; it is being dropped anyway
        _LOGGER.info("closing a connection failed: %s", type(exc).__name__)
    close_socket(connection)


def end_session_after_links(
    session: Any, end: Callable[..., None], error: Any = None, wait: bool = False
) -> None:
    """End a session on a shared connection after detaching its links: pyamqp's ``Session.end`` sends the end
    first and then detaches the links still attached (a management link's, say), and the service closes the whole
    connection - every other entity's link with it - for a frame on a channel that has ended ("no such
    channel"). Installed on each session the transport opens (``session.end``), whoever ends it: the SDK ends it
    itself when a call on the link fails."""
    for link in list(getattr(session, "links", {}).values()):
        with contextlib.suppress(Exception):
            link.detach(close=True)
    end(error=error, wait=wait)


def shut_down_socket(handler_owner: Any) -> None:
    """Shut down the socket of an SDK sender or receiver so that a call stuck in it (e.g. the SDK's SASL
    negotiation, which has no timeout) returns with an error. Reads SDK internals; best effort, never raises.
    Called from a thread other than the stuck one (a lane's unblock)."""
    shut_down_connection(connection_of(handler_owner))


def shut_down_connection(connection: Any) -> None:
    """Shut down a pyamqp connection's socket (any thread): a read blocked on it returns with an error. Never
    raises, never blocks."""
    sock = socket_of(connection)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def abort_connection(connection: Any) -> None:
    """Reset a connection given up as dead (TCP RST: linger 0, then close): what was written on it and not yet read
    by the namespace is dropped with it, so a stalled namespace that recovers does not act on a call the sender
    gave up on and diverted (no duplicate of it on the primary; at-least-once still holds when the namespace had
    read it already). Runs on any thread; pyamqp's later use of the closed socket raises and is suppressed. Never
    raises."""
    import struct

    sock = socket_of(connection)
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()
