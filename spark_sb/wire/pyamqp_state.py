"""The SDK's private state, read in one place: what the wire reads of pyamqp's connections and links and of the
SDK's handlers (``_``-prefixed attributes), each behind a function that says what it means.

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
from collections.abc import Iterator
from typing import Any

from spark_sb.wire.timing import PUMP_READ_TIMEOUT

__all__ = [
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
