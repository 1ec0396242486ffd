"""An opening's abort (SPEC F8, :class:`spark_sb.wire.opening.Opening`): the socket is shut down whatever phase the
opening is in - before the socket exists (tried again until it does), in TLS (through the duplicate taken before
TLS detaches the connected socket), after it - and nothing once the opening is over. A stand-in connection with a
real socket pair: the SDK's own opening is exercised in tests/integration/test_outage_resources.py."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from spark_sb.wire.opening import Opening


class Transport:
    """pyamqp's transport as Opening sees it: ``sock`` and ``_setup_transport`` (TLS would wrap ``sock``)."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.set_up = 0

    def _setup_transport(self) -> None:
        self.set_up += 1


class Connection:
    def __init__(self) -> None:
        self._transport = Transport()
        self.state: Any = None


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    b.settimeout(2.0)
    yield a, b
    a.close()
    b.close()


def peer_sees_eof(b: socket.socket) -> bool:
    return b.recv(1) == b""


def test_an_abort_before_the_socket_exists_is_tried_again_until_it_does(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    conn = Connection()
    opening = Opening(conn, time.monotonic() + 5)
    error = TimeoutError("deadline")
    assert opening.abort(error) is False  # nothing to shut down yet (the TCP connect)
    opening.expire(error)  # re-armed on the watchdog
    conn._transport.sock = a  # the connect returned
    assert peer_sees_eof(b)
    assert opening.error is error
    opening.finish()


def test_a_socket_that_appears_after_an_abort_is_refused_before_tls(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, _b = pair
    conn = Connection()
    opening = Opening(conn, time.monotonic() + 5)
    opening.abort(TimeoutError("deadline"))
    conn._transport.sock = a
    with pytest.raises(OSError, match="aborted"):
        conn._transport._setup_transport()  # what pyamqp's connect calls before TLS
    assert conn._transport.set_up == 0
    opening.finish()


def test_in_tls_the_duplicate_of_the_connected_socket_is_shut_down(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    conn = Connection()
    opening = Opening(conn, time.monotonic() + 5)
    conn._transport.sock = a
    conn._transport._setup_transport()  # the duplicate is taken, then TLS starts
    assert conn._transport.set_up == 1
    conn._transport.sock = None  # TLS detached the connected socket (the SSL one is not assigned yet)
    assert opening.abort(TimeoutError("deadline")) is True
    assert peer_sees_eof(b)
    opening.finish()


def test_the_duplicate_lasts_only_as_long_as_the_opening(pair: tuple[socket.socket, socket.socket]) -> None:
    a, _b = pair
    conn = Connection()
    opening = Opening(conn, time.monotonic() + 5)
    conn._transport.sock = a
    conn._transport._setup_transport()
    handle = opening._handle
    assert handle is not None and handle.fileno() >= 0
    opening.finish()
    assert handle.fileno() == -1 and opening.connection is None


def test_after_the_opening_an_abort_does_nothing(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    conn = Connection()
    opening = Opening(conn, time.monotonic() + 5)
    conn._transport.sock = a
    opening.finish()
    assert opening.abort(TimeoutError("late")) is True
    assert opening.error is None
    a.sendall(b"x")  # still open both ways
    assert b.recv(1) == b"x"


def test_the_phase_follows_the_connection_state() -> None:
    conn = Connection()
    opening = Opening(conn, time.monotonic() + 5)
    assert opening.phase() == "TCP connect or TLS"
    conn.state = type("State", (), {"name": "START"})()
    assert opening.phase() == "SASL"
    conn.state = type("State", (), {"name": "OPEN_PIPE"})()
    assert opening.phase() == "the AMQP open"
    opening.finish()
