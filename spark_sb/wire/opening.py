"""Opening one AMQP connection to a namespace, every step within a deadline (SPEC F8).

:func:`open_connection` builds the connection as the SDK builds a sender's own, plus an idle timeout the namespace
answers with heartbeats; TCP, TLS, SASL and the AMQP open each end by the deadline, and an :class:`Opening` can be
aborted from another thread (the watchdog, a lane abandoning its worker, the shared connection's unblock). Runs on a
lane's worker or a spare's helper thread; the abort on any thread. Nothing here is picklable.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from spark_sb.wire.closing import close_quietly
from spark_sb.wire.lane import abort_when_abandoned
from spark_sb.wire.pyamqp_state import connection_error, keep_when_idle, new_connection, socket_of
from spark_sb.wire.timing import (
    ABORT_RETRIES,
    ABORT_RETRY,
    CONNECT_TIMEOUT,
    HEARTBEAT,
    SDK_SLICE,
)
from spark_sb.wire.watchdog import WATCHDOG

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusClient

__all__ = ["Opening", "listening", "open_connection"]


def open_connection(client: ServiceBusClient, timeout: float) -> Any:
    """Open one AMQP connection to ``client``'s namespace, built as the SDK builds a sender's own (same host, TLS,
    proxy, custom endpoint, container and properties), plus an idle timeout (:data:`HEARTBEAT`). Runs on a lane's
    worker (or any thread that may block for ``timeout``).

    Bounded whatever the namespace does (SPEC F8): every step has a deadline, ``timeout`` seconds from now. The
    TCP connect has its own (:data:`CONNECT_TIMEOUT`, per address, never past the deadline); TLS, SASL and the
    AMQP open - TLS and SASL run on a blocking socket without any timeout in the SDK - end at the deadline, when
    the process's watchdog shuts the socket down (:class:`Opening`; ``TimeoutError``). The opening can be aborted
    sooner from another thread: by the lane abandoning or closing the worker it runs on
    (:func:`~spark_sb.wire.lane.abort_when_abandoned`: it then raises the lane's error), and by a
    :meth:`~spark_sb.wire.connection.SharedConnection.unblock` of the shared connection it is opened for. A
    connection that failed to open is closed (its socket too) before the error is raised."""
    from azure.servicebus._pyamqp.constants import ConnectionState

    timeout = max(0.0, timeout)
    deadline = time.monotonic() + timeout
    connection = new_connection(
        client,
        idle_timeout=HEARTBEAT,
        socket_timeout=SDK_SLICE,  # the reads of every call on it (see SDK_SLICE)
        connect_timeout=max(0.01, min(CONNECT_TIMEOUT, timeout)),  # the TCP connect's, per address
    )
    opening = Opening(connection, deadline)
    watch = WATCHDOG.watch(
        deadline,
        lambda: opening.expire(
            TimeoutError(
                f"the namespace did not open the connection within {timeout:.3g} s "
                f"(stalled in {opening.phase()})"
            )
        ),
    )
    try:
        with abort_when_abandoned(opening.expire), _announced(opening):
            try:
                connection.open()
                while connection.state != ConnectionState.OPENED:
                    if connection.state in (
                        ConnectionState.END,
                        ConnectionState.CLOSE_RCVD,
                        ConnectionState.DISCARDING,
                    ):
                        from azure.servicebus._pyamqp.error import AMQPConnectionError, ErrorCondition

                        error = connection_error(connection)
                        if error is not None:
                            raise error
                        raise AMQPConnectionError(
                            ErrorCondition.SocketError, description="the connection was closed"
                        )
                    if opening.error is not None or time.monotonic() > deadline:
                        raise TimeoutError("the namespace did not open the connection in time")
                    connection.listen(wait=0.05)
            except BaseException as exc:
                opening.finish()
                close_quietly(connection)
                if opening.error is not None:  # aborted: what the abort says, not the socket error it caused
                    raise opening.error from exc
                raise
    finally:
        watch.cancel()
        opening.finish()
    if opening.error is not None:  # aborted as it opened: its socket may be shut down already
        close_quietly(connection)
        raise opening.error
    # The idle timeout went out in the open frame (the namespace sends heartbeats); pyamqp would also close the
    # connection itself after that long without a frame, on its next read. Not that: the lane's deadlines and the
    # namespace-wide evidence decide what a silence means.
    keep_when_idle(connection)
    return connection


class Opening:
    """A connection being opened by :func:`open_connection`, and the means to abort it from another thread (the
    watchdog at the opening's deadline, a lane abandoning or closing the worker,
    :meth:`~spark_sb.wire.connection.SharedConnection.unblock`).

    Aborting shuts the socket down, so that a read blocked in TLS or SASL (no timeout in the SDK) returns at once
    with an error, and records the error the opening then raises. TLS replaces the connected socket with an SSL
    one and detaches the first before its handshake; so that the handshake can be aborted too, a duplicate of the
    connected socket (one file descriptor, for the opening's duration only) is taken just before TLS starts
    (pyamqp's ``_setup_transport``) and shut down instead. An abort before the socket exists (in the TCP connect,
    bounded by :data:`CONNECT_TIMEOUT`) is tried again every :data:`ABORT_RETRY` seconds, and a socket that appears
    after an abort is refused before TLS. Thread-safe; the aborting side never blocks (a shutdown, a flag)."""

    __slots__ = ("_handle", "_lock", "connection", "deadline", "done", "error", "retries")

    def __init__(self, connection: Any, deadline: float) -> None:
        self.connection = connection
        self.deadline = deadline  # monotonic
        self.error: BaseException | None = None  # set by the first abort: what the opening raises
        self.done = False
        self.retries = 0
        self._handle: Any = None  # a duplicate of the connected socket, while the opening lasts
        self._lock = threading.Lock()
        transport = getattr(connection, "_transport", None)
        setup = getattr(transport, "_setup_transport", None)
        if transport is not None and setup is not None:

            def setup_transport() -> None:  # on the opening thread, the socket connected, before TLS
                self._take_handle(transport.sock)
                setup()

            transport._setup_transport = setup_transport

    def _take_handle(self, sock: Any) -> None:
        with self._lock:
            if self.error is not None:
                raise OSError("the opening was aborted")  # the SDK closes the socket and raises
            if sock is not None:
                with contextlib.suppress(OSError):
                    self._handle = sock.dup()

    def phase(self) -> str:
        """Where the opening is (for the error's text): TCP connect or TLS, SASL, the AMQP open. No I/O."""
        state = getattr(self.connection, "state", None)
        name = getattr(state, "name", None)
        if name is None:
            return "TCP connect or TLS"
        if name == "START":
            return "SASL"
        return "the AMQP open"

    def abort(self, error: BaseException) -> bool:
        """Record ``error`` (the first one wins) and shut the socket down; False if there was no socket to shut
        down yet (and the opening is still under way). Any thread; never blocks, never raises."""
        with self._lock:
            if self.done:
                return True
            if self.error is None:
                self.error = error
            handle = self._handle
            if handle is not None:
                with contextlib.suppress(OSError):
                    handle.shutdown(socket.SHUT_RDWR)
                return True
            sock = socket_of(self.connection)
            if sock is None:
                return False
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                return sock.fileno() >= 0  # a detached socket (in TLS): not shut down, try again
            except Exception:  # a transport of another kind (websocket): its own timeouts bound it
                return True
            return True

    def expire(self, error: BaseException) -> None:
        """:meth:`abort`, tried again every :data:`ABORT_RETRY` seconds (on the watchdog) while the socket does not
        exist yet. Any thread; never blocks."""
        if self.abort(error) or self.retries >= ABORT_RETRIES:
            return
        self.retries += 1
        WATCHDOG.watch(time.monotonic() + ABORT_RETRY, lambda: self.expire(error))

    def finish(self) -> None:
        """The opening returned (opened or failed): later aborts do nothing; the duplicate socket is closed. On
        the opening thread."""
        with self._lock:
            self.done = True
            handle, self._handle = self._handle, None
            self.connection = None  # an armed watch may keep this object a while: not the connection
        if handle is not None:
            with contextlib.suppress(OSError):
                handle.close()


#: Per thread: who wants to know of a connection being opened on it
#: (:meth:`~spark_sb.wire.connection.SharedConnection.ensure`).
_LISTENERS = threading.local()


@contextlib.contextmanager
def listening(listener: Callable[[Opening | None], None]) -> Iterator[None]:
    """While the block runs, ``listener`` is told of each :class:`Opening` begun on this thread (and of its end,
    with None)."""
    listeners: list[Callable[[Opening | None], None]] = _LISTENERS.__dict__.setdefault("stack", [])
    listeners.append(listener)
    try:
        yield
    finally:
        listeners.remove(listener)


@contextlib.contextmanager
def _announced(opening: Opening) -> Iterator[None]:
    listeners = list(getattr(_LISTENERS, "stack", ()))
    for listener in listeners:
        listener(opening)
    try:
        yield
    finally:
        for listener in listeners:
            listener(None)
