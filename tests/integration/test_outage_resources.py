"""Bounded under any outage (SPEC F8): every step of opening a connection has a deadline (TCP connect, TLS, SASL,
AMQP open, CBS), so that during an outage of any shape the process's threads and sockets stay within a small
constant of steady state, and return to it within 5 s after ``close()``. Real SDK, real TCP, the local namespace.

The shape that used to leak: a namespace that accepts TCP and never answers SASL held each opening lane worker
in pyamqp's SASL read (a blocking socket, no timeout) until the namespace answered again: 6 calls left 6
``spark-sb-primary-*`` threads alive after ``close()``. Here a :class:`~spark_sb.sender.paired.PairedSender` sends and
probes repeatedly against each outage shape while the ``spark-sb-`` threads and the sockets to the namespaces are
counted (``/proc/self/fd`` and the kernel's TCP table: the in-process namespaces' own sockets are not the
sender's). The deadlines themselves are shown on ``open_connection`` and a lane: a stall before SASL, and a
listener that accepts TCP and never answers TLS (the local namespace speaks plain AMQP).
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from azure.core.credentials import AzureNamedKeyCredential
from azure.servicebus import ServiceBusClient, TransportType

from harness.outages import make_config, prepare
from spark_sb.failover.registry import FailoverRegistry
from spark_sb.message.outbound import OutboundMessage
from spark_sb.sender.paired import PairedSender
from spark_sb.wire.connection import SharedConnection
from spark_sb.wire.lane import DeadlineExceeded, Lane
from spark_sb.wire.opening import open_connection
from spark_sb.wire.watchdog import WATCHDOG

pytestmark = pytest.mark.slow

# ------------------------------------------------------------------------------------------------- counting


def spark_threads() -> list[str]:
    """The names of this library's threads (``spark-sb-``; the in-process namespaces' ``spark-sb-local-`` are
    not the sender's)."""
    return sorted(
        t.name
        for t in threading.enumerate()
        if t.name.startswith("spark-sb-") and not t.name.startswith("spark-sb-local-")
    )


def socket_inodes() -> set[int]:
    """The inodes of this process's open sockets (``/proc/self/fd`` links to ``socket:[inode]``)."""
    found: set[int] = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (the listing's own descriptor, say)
            continue
        if link.startswith("socket:["):
            found.add(int(link[8:-1]))
    return found


def client_sockets(ports: set[int]) -> int:
    """This process's open sockets to the namespaces: the TCP sockets whose remote port is one of ``ports``, plus
    the sockets in no table of the kernel (a TCP socket reset by its peer or never connected is unhashed: it no
    longer shows in ``/proc/self/net/tcp``, yet its descriptor is open - the leak to look for)."""
    mine = socket_inodes()
    listed: set[int] = set()
    n = 0
    for table in ("tcp", "tcp6", "udp", "udp6", "unix", "raw", "raw6", "netlink", "packet"):
        try:
            with open(f"/proc/self/net/{table}") as f:
                rows = f.readlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            column = {"unix": 6, "netlink": 9, "packet": 8}.get(table, 9)
            if len(cols) <= column or not cols[column].isdigit():
                continue
            inode = int(cols[column])
            listed.add(inode)
            if table.startswith("tcp") and inode in mine and int(cols[2].rsplit(":", 1)[1], 16) in ports:
                n += 1
    return n + len(mine - listed)


def wait_until(predicate: Callable[[], bool], timeout: float) -> float | None:
    """Seconds until ``predicate()`` held (polled every 20 ms), None if it did not within ``timeout``."""
    t0 = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            return None
        time.sleep(0.02)


def ports_of(*namespaces: Any) -> set[int]:
    return {int(ns.port) for ns in namespaces}


@pytest.fixture
def watchdog() -> None:
    """The process's watchdog thread (one for the process, started at its first use and never stopped) is
    started before anything is counted."""
    WATCHDOG.watch(time.monotonic(), lambda: None)
    assert wait_until(lambda: "spark-sb-watchdog" in spark_threads(), 2.0) is not None


# ------------------------------------------------------------------------------------- a sender in an outage


def _refuse(ns: Any) -> None:
    ns.faults.refuse_connections()


def _drop(ns: Any) -> None:
    ns.faults.refuse_connections()
    ns.faults.drop_connections()


#: name -> (cold: the sender starts after the fault began, fault)
OUTAGES: dict[str, tuple[bool, Callable[[Any], None]]] = {
    "stall-before-sasl": (True, lambda ns: ns.faults.stall(True, answer_sasl=False)),
    "stall-before-sasl-warm": (False, lambda ns: ns.faults.stall(True, answer_sasl=False)),
    "stall-after-sasl": (False, lambda ns: ns.faults.stall(True)),
    "refused": (True, _refuse),
    "dropped": (False, _drop),
    "blackhole": (False, lambda ns: ns.faults.blackhole()),
}

CALLS = 10  # send calls during the outage (each also leaves the prober time for probes)
PAUSE = 0.15  # between calls: ping_primary_interval is 0.2 s, so the prober probes the primary throughout
THREADS_OVER = 6  # the spark-sb- threads above steady state an outage may cost (workers, prober, unblocks)
SOCKETS_OVER = 6  # the sockets to the namespaces above steady state an outage may cost


def batch(prefix: str) -> list[OutboundMessage]:
    return [OutboundMessage(body=b"x" * 50, message_id=f"{prefix}-{i}") for i in range(5)]


#: every shape at failover_interval 0; the stalls (whose cost is the deadlines) at 1 s too
CASES = [(shape, "0s") for shape in OUTAGES] + [("stall-before-sasl", "1s"), ("stall-after-sasl", "1s")]


@pytest.mark.parametrize(("shape", "interval"), CASES, ids=[f"{s}-{i}" for s, i in CASES])
def test_threads_and_sockets_stay_bounded_and_return_after_close(
    namespace_pair: Any, watchdog: None, shape: str, interval: str
) -> None:
    cold, fault = OUTAGES[shape]
    prepare(namespace_pair)
    ports = ports_of(namespace_pair.primary, namespace_pair.secondary)
    threads0, sockets0 = len(spark_threads()), client_sockets(ports)
    cfg = make_config(namespace_pair, failover_interval=interval, ping_primary_interval="0.2s")
    sender = PairedSender(cfg, registry=FailoverRegistry())
    threads: list[int] = []
    sockets: list[int] = []
    try:
        if not cold:
            assert sender.send(batch("warm")).total_sent == 5
        fault(namespace_pair.primary)
        for call in range(CALLS):
            out = sender.send(batch(f"c{call}"))
            assert out.total_sent + out.total_diverted == 5  # everything went somewhere
            threads.append(len(spark_threads()))
            sockets.append(client_sockets(ports))
            time.sleep(PAUSE)
    finally:
        closed_at = time.monotonic()
        sender.close()
    back = wait_until(lambda: len(spark_threads()) <= threads0 and client_sockets(ports) <= sockets0, 5.0)
    report = (
        f"{shape} at {interval}: threads {threads0} -> {threads} -> {spark_threads()}, "
        f"sockets {sockets0} -> {sockets} -> {client_sockets(ports)}"
    )
    print(report)
    assert max(threads) - threads0 <= THREADS_OVER, report
    assert max(sockets) - sockets0 <= SOCKETS_OVER, report
    half = CALLS // 2  # not growing with calls: the second half's peak is no higher than the first's (+1)
    assert max(threads[half:]) <= max(threads[:half]) + 1, report
    # A socket being closed in the background may overlap the next connection's for one sample (seen once in CI:
    # [1, 3, 2, 2, 2, 5, 2, 2, 2, 2]); what leaks stays, so growth shows in the last samples: no higher than the
    # first half's peak (+1). A socket leaked every second call ends 2 above it.
    assert max(sockets[-3:]) <= max(sockets[:half]) + 1, report
    assert back is not None, f"not back to steady state 5 s after close(): {report}"
    assert time.monotonic() - closed_at < 6.0


def test_a_sender_per_call_in_a_stall_before_sasl_leaves_nothing_behind(
    namespace_pair: Any, watchdog: None
) -> None:
    """As a Spark job does it (a sender per task, closed at its end): 6 senders, each one call at failover
    interval 0 and closed, into a primary that never answers SASL. Each close frees what its sender opened."""
    prepare(namespace_pair)
    namespace_pair.primary.faults.stall(True, answer_sasl=False)
    ports = ports_of(namespace_pair.primary, namespace_pair.secondary)
    threads0, sockets0 = len(spark_threads()), client_sockets(ports)
    cfg = make_config(namespace_pair, failover_interval="0s", ping_primary_interval="0.2s")
    registry = FailoverRegistry()
    peaks: list[tuple[int, int]] = []
    for call in range(6):
        sender = PairedSender(cfg, registry=registry)
        try:
            out = sender.send(batch(f"s{call}"))
            assert out.total_sent + out.total_diverted == 5
            peaks.append((len(spark_threads()), client_sockets(ports)))
        finally:
            sender.close()
    back = wait_until(lambda: len(spark_threads()) <= threads0 and client_sockets(ports) <= sockets0, 5.0)
    report = f"threads/sockets {threads0}/{sockets0} -> {peaks} -> {spark_threads()}/{client_sockets(ports)}"
    print(report)
    assert max(t for t, _ in peaks) - threads0 <= THREADS_OVER, report
    assert max(s for _, s in peaks) - sockets0 <= SOCKETS_OVER, report
    assert back is not None, report


# -------------------------------------------------------------------------------- the deadlines themselves


def test_an_opening_stalled_before_sasl_ends_at_its_deadline_and_closes_its_socket(
    local_namespace: Any,
) -> None:
    local_namespace.faults.stall(True, answer_sasl=False)
    ports = ports_of(local_namespace)
    with ServiceBusClient.from_connection_string(local_namespace.connection_string) as client:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="SASL"):
            open_connection(client, 0.5)
        took = time.monotonic() - t0
    assert 0.45 <= took <= 1.0, took
    assert client_sockets(ports) == 0


@pytest.fixture
def tls_silence() -> Iterator[int]:
    """A listener on 127.0.0.1 that accepts TCP and never answers (not even TLS); its port."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, name="tls-silence", daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join(2.0)
        for s in held:
            s.close()
        server.close()


def test_an_opening_stalled_in_tls_ends_at_its_deadline_and_closes_its_socket(tls_silence: int) -> None:
    """pyamqp's TLS handshake runs on a blocking socket without a timeout; the socket it runs on is one the SDK
    detached from the connected one, so the watchdog shuts down a duplicate of the connected socket."""
    client = ServiceBusClient(
        "127.0.0.1",
        AzureNamedKeyCredential("name", "key"),
        custom_endpoint_address=f"sb://127.0.0.1:{tls_silence}",
        transport_type=TransportType.Amqp,
    )
    with client:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="TLS"):
            open_connection(client, 0.5)
        took = time.monotonic() - t0
    assert 0.45 <= took <= 1.0, took
    assert client_sockets({tls_silence}) == 0


def test_a_lane_abandoning_an_opening_worker_frees_it_within_its_deadline(
    local_namespace: Any, watchdog: None
) -> None:
    """The factory opens the connection (as the transport's does) with a long timeout of its own; the caller's
    deadline is short: abandoning the worker aborts the opening, so the worker exits at about that deadline."""
    local_namespace.faults.stall(True, answer_sasl=False)
    ports = ports_of(local_namespace)
    threads0 = len(spark_threads())
    client = ServiceBusClient.from_connection_string(local_namespace.connection_string)

    def build() -> SharedConnection:
        conn = SharedConnection(client, lambda timeout: open_connection(client, timeout))
        conn.ensure(30.0)
        return conn

    lane = Lane("abandon-open", build, SharedConnection.close, SharedConnection.unblock)
    try:
        for _ in range(4):
            t0 = time.monotonic()
            with pytest.raises(DeadlineExceeded):
                lane.call(lambda conn: conn.connection, 0.3)
            # the worker gone and its socket closed, both within the same bound (the socket's close may come a
            # moment after the thread's end under load: seen once in a 4-worker integration tier)
            freed = wait_until(lambda: len(spark_threads()) <= threads0 and client_sockets(ports) == 0, 2.0)
            assert freed is not None and time.monotonic() - t0 < 0.3 + 1.0, (
                spark_threads(),
                client_sockets(ports),
            )
    finally:
        lane.close()
        client.close()


@pytest.mark.parametrize("how", ["close", "discard"])
def test_a_connection_reset_by_the_namespace_closes_its_socket(local_namespace: Any, how: str) -> None:
    """pyamqp's close leaves the socket open when its close frame cannot be sent (it sets END, and its disconnect
    then does nothing): a dropped connection's socket must be closed all the same, at once, not by the garbage
    collector."""
    ports = ports_of(local_namespace)
    with ServiceBusClient.from_connection_string(local_namespace.connection_string) as client:
        conn = SharedConnection(client, lambda timeout: open_connection(client, timeout))
        conn.ensure(5.0)
        assert client_sockets(ports) == 1
        local_namespace.faults.drop_connections()  # TCP reset
        assert wait_until(lambda: _reset_seen(conn), 5.0) is not None
        conn.connection._outgoing_empty()  # a heartbeat (as tending sends): it fails, pyamqp keeps the error
        if how == "close":
            conn.close()
        else:
            conn.discard("test")
        assert client_sockets(ports) == 0


def _reset_seen(conn: SharedConnection) -> bool:
    """The reset reached the socket (it polls readable) while pyamqp has not read it yet: the connection is still
    OPENED, so its close sends a close frame, and that write fails (raising the error of the write before)."""
    sock = conn.connection._transport.sock
    return bool(select.select([sock], [], [], 0)[0])


def _phase(conn: SharedConnection) -> str | None:
    opening = conn.opening
    return None if opening is None else opening.phase()


def test_unblock_reaches_a_connection_still_being_opened(local_namespace: Any) -> None:
    """:meth:`SharedConnection.unblock` (from another thread) aborts an ``ensure`` still in SASL."""
    local_namespace.faults.stall(True, answer_sasl=False)
    client = ServiceBusClient.from_connection_string(local_namespace.connection_string)
    conn = SharedConnection(client, lambda timeout: open_connection(client, timeout))
    errors: list[BaseException] = []

    def ensure() -> None:
        try:
            conn.ensure(30.0)
        except BaseException as exc:  # recorded for the test
            errors.append(exc)

    thread = threading.Thread(target=ensure, name="test-ensure", daemon=True)
    try:
        thread.start()
        assert wait_until(lambda: _phase(conn) == "SASL", 5.0) is not None
        t0 = time.monotonic()
        conn.unblock()
        thread.join(2.0)
        assert not thread.is_alive() and time.monotonic() - t0 < 0.5
        assert errors and isinstance(errors[0], TimeoutError)
        assert conn.opening is None and conn.connection is None
    finally:
        client.close()
