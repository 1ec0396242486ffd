"""AMQP idle-timeout heartbeats (AMQP 1.0 section 2.4.5), as the service sends them: when a client's ``open`` carries
``idle-time-out`` T, the namespace sends an empty frame whenever it has sent nothing on the connection for T/2.
A namespace-wide stall silences them with everything else (the client then hears nothing, which is how it tells
a namespace that stopped answering from one entity that stalls); a per-entity stall does not. Driven over real TCP
by a raw-socket AMQP client (every frame counted and timed) and by the unmodified SDK's pyamqp ``Connection``."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from servicebus_local import amqp
from servicebus_local.server import LocalNamespace

from .conftest import wait_for

EMPTY_FRAME = b"\x00\x00\x00\x08\x02\x00\x00\x00"  # size 8, doff 2, type 0 (AMQP), channel 0, no body
IDLE_TIMEOUT_MS = 1000  # heartbeats every 0.5 s

OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DISPOSITION = 0x10, 0x11, 0x12, 0x13, 0x14, 0x15
ACCEPTED = 0x24
SASL_MECHANISMS, SASL_INIT, SASL_OUTCOME = 0x40, 0x41, 0x44


def performative(code: int, *fields: bytes) -> bytes:
    """A described list (descriptor ``code`` as a small ulong) of already encoded fields."""
    body = b"".join(fields)
    return b"\x00\x53" + bytes((code,)) + b"\xd0" + struct.pack(">II", len(body) + 4, len(fields)) + body


def frame(body: bytes, *, channel: int = 0, frame_type: int = 0, payload: bytes = b"") -> bytes:
    return struct.pack(">IBBH", 8 + len(body) + len(payload), 2, frame_type, channel) + body + payload


NULL = b"\x40"
enc = amqp.encode_value


@dataclass
class Frame:
    """One frame as received: its bytes and when (monotonic) it was read."""

    at: float
    raw: bytes

    @property
    def empty(self) -> bool:
        return self.raw == EMPTY_FRAME

    @property
    def code(self) -> int | None:
        """The performative's descriptor (None for an empty frame)."""
        if len(self.raw) <= self.raw[4] * 4:
            return None
        value, _ = amqp.decode_value(self.raw, self.raw[4] * 4)
        return int(value.descriptor)

    @property
    def fields(self) -> list[Any]:
        value, _ = amqp.decode_value(self.raw, self.raw[4] * 4)
        return list(value.value)


class RawAmqpClient:
    """A raw-socket AMQP 1.0 client: SASL ANONYMOUS, the AMQP header and an ``open`` (with ``idle-time-out`` in
    milliseconds, or none); then frames are written as given and every frame the namespace sends is kept, timed.
    It never sends heartbeats of its own (the namespace advertises no idle timeout)."""

    def __init__(self, port: int, idle_timeout_ms: int | None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.settimeout(0.05)
        self.buf = b""
        self.frames: list[Frame] = []
        self.sock.sendall(b"AMQP\x03\x01\x00\x00")
        self.send(frame(performative(SASL_INIT, enc(amqp.Symbol("ANONYMOUS"))), frame_type=1))
        self.wait(lambda: any(f.code == SASL_OUTCOME for f in self.frames))
        idle = NULL if idle_timeout_ms is None else enc(amqp.UInt(idle_timeout_ms))
        self.sock.sendall(b"AMQP\x00\x01\x00\x00")
        self.send(frame(performative(OPEN, enc("raw-heartbeat-client"), NULL, NULL, NULL, idle)))
        self.server_open = self.wait(lambda: any(f.code == OPEN for f in self.frames))[-1]
        self.opened_at = self.server_open.at

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self, until: float) -> None:
        """Read and keep frames until the monotonic time ``until``."""
        while time.monotonic() < until:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                raise AssertionError("the namespace closed the connection")
            now = time.monotonic()
            self.buf += data
            while len(self.buf) >= 8:
                if self.buf.startswith(b"AMQP"):
                    self.buf = self.buf[8:]
                    continue
                size = int.from_bytes(self.buf[:4], "big")
                if len(self.buf) < size:
                    break
                self.frames.append(Frame(now, self.buf[:size]))
                self.buf = self.buf[size:]

    def wait(self, predicate: Callable[[], bool], timeout: float = 5.0) -> list[Frame]:
        """Read until ``predicate()`` holds (fail the test at the deadline); returns every frame so far."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"condition not met in time; frames: {[f.raw[:16] for f in self.frames]}"
                )
            self.read(min(deadline, time.monotonic() + 0.05))
        return self.frames

    def heartbeats(self, since: float = 0.0) -> list[Frame]:
        return [f for f in self.frames if f.empty and f.at >= since]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def ns() -> Iterator[LocalNamespace]:
    namespace = LocalNamespace("heartbeats", queues=["q"]).start()
    try:
        yield namespace
    finally:
        namespace.faults.clear()
        namespace.stop()


@pytest.fixture
def raw(ns: LocalNamespace) -> Iterator[Callable[..., RawAmqpClient]]:
    clients: list[RawAmqpClient] = []

    def connect(idle_timeout_ms: int | None = IDLE_TIMEOUT_MS) -> RawAmqpClient:
        client = RawAmqpClient(ns.port, idle_timeout_ms)
        clients.append(client)
        return client

    yield connect
    for client in clients:
        client.close()


def test_an_idle_connection_gets_an_empty_frame_every_half_idle_timeout(
    raw: Callable[..., RawAmqpClient],
) -> None:
    client = raw(IDLE_TIMEOUT_MS)
    client.wait(lambda: len(client.heartbeats()) >= 3, timeout=2.0)
    beats = client.heartbeats()
    assert beats[2].at - client.opened_at < 2.0
    assert all(f.raw == EMPTY_FRAME for f in beats)  # size 8, doff 2, type 0, channel 0, no body
    # every T/2 after the last frame sent (not every T, not a burst)
    times = [client.opened_at] + [f.at for f in beats]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert all(0.3 < gap < 0.9 for gap in gaps), gaps
    # the namespace's own open still advertises no idle timeout: it never closes an idle client
    assert len(client.server_open.fields) < 5 or client.server_open.fields[4] is None


def test_no_heartbeats_without_an_idle_timeout_in_the_open(raw: Callable[..., RawAmqpClient]) -> None:
    silent = raw(None)
    # opened after `silent`: it spans the same time, and proves that time long enough
    beating = raw(IDLE_TIMEOUT_MS)
    beating.wait(lambda: len(beating.heartbeats()) >= 3, timeout=2.0)
    silent.read(time.monotonic() + 0.1)
    assert silent.heartbeats() == []
    assert [f.code for f in silent.frames] == [SASL_MECHANISMS, SASL_OUTCOME, OPEN]


def test_the_sdk_connection_hears_heartbeats_and_outlives_its_idle_timeout(ns: LocalNamespace) -> None:
    from azure.servicebus._pyamqp._connection import Connection
    from azure.servicebus._pyamqp.constants import ConnectionState
    from azure.servicebus._pyamqp.sasl import SASLAnonymousCredential

    connection = Connection(
        f"amqp://127.0.0.1:{ns.port}",
        sasl_credential=SASLAnonymousCredential(),
        idle_timeout=1.0,
        use_tls=False,
        network_trace=False,
    )
    connection.open()
    try:
        heard: list[float] = []

        def advanced_three_times() -> bool:
            connection.listen(wait=0.05)
            value = connection._last_frame_received_time
            if value and (not heard or value != heard[-1]):
                heard.append(value)
            return len(heard) >= 4  # the open, then three empty frames

        start = time.monotonic()
        wait_for(advanced_three_times, timeout=2.5)
        assert time.monotonic() - start < 2.5
        # twice its own idle timeout later it has not closed the connection for want of frames
        wait_for(lambda: (connection.listen(wait=0.05), time.monotonic() - start > 2.2)[1], timeout=5)
        assert connection.state == ConnectionState.OPENED
        assert time.time() - connection._last_frame_received_time < 0.75

        # a stalled namespace says nothing at all: the SDK's own idle timeout then closes the connection
        last = connection._last_frame_received_time
        wait_for(lambda: (connection.listen(wait=0.02), connection._last_frame_received_time != last)[1])
        ns.faults.stall()  # right after a heartbeat: the next one was 0.5 s away
        heard_before = connection._last_frame_received_time
        wait_for(
            lambda: (connection.listen(wait=0.05), connection.state != ConnectionState.OPENED)[1], timeout=3
        )
        assert connection._last_frame_received_time == heard_before
    finally:
        ns.faults.stall(False)
        connection.close()


# before SASL = the blackhole (tests call a primary stalled that way "blackholed"): open connections hear nothing
@pytest.mark.parametrize("answer_sasl", [True, False], ids=["stall-after-sasl", "stall-before-sasl"])
def test_a_namespace_stall_silences_heartbeats_until_it_ends(
    ns: LocalNamespace, raw: Callable[..., RawAmqpClient], answer_sasl: bool
) -> None:
    client = raw(IDLE_TIMEOUT_MS)
    client.wait(lambda: len(client.heartbeats()) >= 1, timeout=2.0)
    ns.faults.stall(True, answer_sasl=answer_sasl)  # applied right after a heartbeat: the next is 0.5 s away
    stalled_at = time.monotonic()
    client.read(stalled_at + 1.6)  # three heartbeats' worth
    assert client.heartbeats(since=stalled_at) == []
    assert [f for f in client.frames if f.at >= stalled_at] == []

    ns.faults.stall(False)
    resumed_at = time.monotonic()
    client.wait(lambda: len(client.heartbeats(since=resumed_at)) >= 3, timeout=2.0)
    # one at once (nothing was sent for more than T/2), then every T/2: the silenced ones are not replayed
    beats = client.heartbeats(since=resumed_at)
    assert len([f for f in beats if f.at - resumed_at < 0.3]) <= 1


def test_a_stalled_entity_does_not_silence_heartbeats(
    ns: LocalNamespace, raw: Callable[..., RawAmqpClient]
) -> None:
    client = raw(IDLE_TIMEOUT_MS)
    client.send(
        frame(performative(BEGIN, NULL, enc(amqp.UInt(0)), enc(amqp.UInt(1000)), enc(amqp.UInt(1000))))
    )
    source = performative(0x28, NULL)
    target = performative(0x29, enc("q"))
    attach = performative(
        ATTACH,
        enc("sender-q"),
        enc(amqp.UInt(0)),  # handle
        enc(False),  # role: sender
        NULL,
        NULL,
        source,
        target,
        NULL,
        enc(False),
        enc(amqp.UInt(0)),  # initial-delivery-count
    )
    client.send(frame(attach))  # then wait for the link's credit
    client.wait(lambda: any(f.code == FLOW and len(f.fields) > 6 and f.fields[6] for f in client.frames))

    ns.faults.stall_entity("q")
    transfer = performative(
        TRANSFER,
        enc(amqp.UInt(0)),
        enc(amqp.UInt(0)),
        enc(b"tag-1"),
        enc(amqp.UInt(0)),
        enc(False),
        enc(False),
    )
    client.send(frame(transfer, payload=amqp.encode_message(body="held")))
    wait_for(lambda: ns.counters().get("transfers_received", 0) >= 1)
    held_at = time.monotonic()

    # the entity answers nothing; the connection keeps its heartbeats
    client.wait(lambda: len(client.heartbeats(since=held_at)) >= 3, timeout=2.0)
    assert [f for f in client.frames if f.code == DISPOSITION] == []

    ns.faults.stall_entity("q", on=False)  # the held transfer is settled now
    client.wait(lambda: any(f.code == DISPOSITION for f in client.frames))
    (disposition,) = [f for f in client.frames if f.code == DISPOSITION]
    assert disposition.fields[4].descriptor == ACCEPTED
