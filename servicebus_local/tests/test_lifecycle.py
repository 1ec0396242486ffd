"""The service's lifecycle in the local namespace, seen through the unmodified SDK over real TCP: idle links
detached (IdleTimerExpired), connections holding no link closed, CBS tokens that expire unless renewed,
credit-based throttling (server-busy), a middlebox's silent drop (blackhole) and forced detaches; and the SDK's
own reaction to each (what a plain ``ServiceBusSender.send_messages`` raises, whether the next call recovers).

Timers are shortened (``link_idle_timeout=0.5``...) and run on real time, or on a :class:`FakeClock`; tests wait
for conditions with a deadline, never for a fixed time they could await.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from azure.core.credentials import AccessToken
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus._pyamqp.utils import generate_sas_token
from azure.servicebus.exceptions import (
    MessageLockLostError,
    OperationTimeoutError,
    ServiceBusAuthenticationError,
    ServiceBusConnectionError,
    ServiceBusServerBusyError,
)

from servicebus_local.__main__ import build_parser
from servicebus_local.clock import FakeClock
from servicebus_local.durations import parse_seconds
from servicebus_local.server import LocalNamespace

SETUP = 5.0  # deadline for what takes the SDK about half a second (connection, CBS, link)


def count(ns: LocalNamespace, name: str) -> int:
    return ns.counters()[name]


def queued(ns: LocalNamespace, queue: str = "q") -> int:
    return ns.broker.get_queue(queue).runtime.active_message_count


def client(ns: LocalNamespace, **kw: Any) -> ServiceBusClient:
    """An SDK client with its network trace on (the tests read the frames it received from it)."""
    kw.setdefault("retry_total", 0)
    return ServiceBusClient.from_connection_string(ns.connection_string, logging_enable=True, **kw)


@pytest.fixture
def received(caplog: pytest.LogCaptureFixture) -> Callable[[str], list[str]]:
    """``received("DetachFrame")``: the frames of that kind the SDK logged as received (``<- ...``)."""
    caplog.set_level(logging.DEBUG, logger="azure.servicebus._pyamqp")

    def frames(kind: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if f"<- {kind}" in r.getMessage()]

    return frames


@pytest.fixture
def make_ns() -> Iterator[Callable[..., LocalNamespace]]:
    started: list[LocalNamespace] = []

    def make(**kw: Any) -> LocalNamespace:
        kw.setdefault("queues", ["q", "q2"])
        ns = LocalNamespace("life", **kw).start()
        started.append(ns)
        return ns

    yield make
    for ns in started:
        ns.stop()


def send(sender: Any, body: str = "x", **kw: Any) -> None:
    sender.send_messages(ServiceBusMessage(body), **kw)


def pump(sender: Any, frames: int = 10) -> None:
    """Let an open SDK sender read what its connection received (the SDK reads only when it works: a detach
    or close that arrives while it is idle is read, and logged, at its next call)."""
    connection = sender._handler._connection
    with contextlib.suppress(Exception):  # listen raises the close's error; the frame is logged before
        for _ in range(frames):  # one frame per call
            connection.listen(wait=0.05)


class ShortSasCredential:
    """A token credential minting SAS tokens signed with the namespace key, valid ``lifetime`` seconds
    (the SDK treats it as an Azure AD credential: a ``jwt`` put-token carrying ``expiration``)."""

    def __init__(self, ns: LocalNamespace, lifetime: int) -> None:
        self.ns = ns
        self.lifetime = lifetime
        self.issued = 0

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.issued += 1
        expires_on = int(time.time()) + self.lifetime
        return AccessToken(
            generate_sas_token(scopes[0], self.ns.key_name, self.ns.key, expires_on), expires_on
        )


def token_client(ns: LocalNamespace, credential: Any, **kw: Any) -> ServiceBusClient:
    kw.setdefault("retry_total", 0)
    return ServiceBusClient(f"127.0.0.1:{ns.port}", credential, use_tls=False, logging_enable=True, **kw)


# ------------------------------------------------------------------------------------------------------------
# idle links


def test_an_idle_sender_link_is_detached_with_idle_timer_expired(
    make_ns: Callable[..., LocalNamespace], received: Callable[[str], list[str]]
) -> None:
    ns = make_ns(link_idle_timeout=0.5)
    with client(ns) as c, c.get_queue_sender("q") as s:
        send(s, "before")
        sent_at = time.monotonic()
        assert ns.wait_until(lambda: count(ns, "links_detached_idle") == 1, timeout=SETUP)
        assert time.monotonic() - sent_at >= 0.45
        opened = count(ns, "connections_opened")
        # the SDK reads the detach only when it writes its next transfer: that send fails ...
        with pytest.raises(ServiceBusConnectionError, match="amqp:unknown-error"):
            send(s, "lost")
        detaches = [f for f in received("DetachFrame") if "detach-forced" in f]
        assert len(detaches) == 1
        assert "IdleTimerExpired: Idle timeout: 00:00:00.5000000" in detaches[0]
        assert "publisher(link" in detaches[0]
        # ... and the next call recovers by itself on a fresh connection
        send(s, "after")
        assert count(ns, "connections_opened") == opened + 1
    assert queued(ns) == 2  # the failed send was never stored


def test_transfers_keep_a_link_alive(make_ns: Callable[..., LocalNamespace]) -> None:
    ns = make_ns(link_idle_timeout=1.0)
    with client(ns) as c, c.get_queue_sender("q") as s:
        send(s)
        end = time.monotonic() + 2.0  # two idle timeouts, a send every 0.2 s
        while time.monotonic() < end:
            send(s)
            time.sleep(0.2)  # the pace of the sender under test, not a wait for the namespace
        assert count(ns, "links_detached_idle") == 0
        assert count(ns, "connections_opened") == 1


def test_an_idle_receiver_is_detached_and_the_next_receive_recovers(
    make_ns: Callable[..., LocalNamespace],
) -> None:
    # A receive call waiting with credit is no transfer either: max_wait_time stays below the idle timeout.
    ns = make_ns(link_idle_timeout=1.0)
    with client(ns, retry_total=3) as c, c.get_queue_receiver("q") as r:
        assert r.receive_messages(max_wait_time=0.3) == []
        with c.get_queue_sender("q") as s:
            send(s, "m")
        assert ns.wait_until(lambda: count(ns, "links_detached_idle") >= 1, timeout=SETUP)
        # the next receive call raises the detach (not retried, even with retries) or, when the SDK reads the
        # detach only while reattaching, returns; either way a receive after it reattaches and gets the message
        outcomes: list[str] = []
        got: list[Any] = []
        deadline = time.monotonic() + SETUP
        while not got and time.monotonic() < deadline:
            try:
                got = r.receive_messages(max_wait_time=0.3)
                outcomes.append(f"returned {len(got)}")
            except ServiceBusConnectionError as exc:
                assert "IdleTimerExpired" in str(exc)
                outcomes.append("raised the detach")
            except OperationTimeoutError:  # reattaching took longer than max_wait_time
                outcomes.append("timed out reattaching")
        assert [str(m) for m in got] == ["m"], outcomes
        # The SDK may return a message the detached link had delivered (the link held credit): its lock was that
        # link's, so settling it elsewhere is refused (SPEC E8, strict by default) and it stays in the queue, to
        # come back when the lock expires; a message delivered after the reattach is settled. Nothing is lost.
        try:
            r.complete_message(got[0])
            settled = True
        except MessageLockLostError:
            settled = False
        assert ns.broker.get_queue("q").runtime.active_message_count == (0 if settled else 1), outcomes


def test_link_idle_timer_reads_the_namespace_clock(make_ns: Callable[..., LocalNamespace]) -> None:
    clock = FakeClock()
    ns = make_ns(clock=clock)  # the service's 10 minutes
    with client(ns) as c, c.get_queue_sender("q") as s:
        send(s)
        clock.advance(599)
        assert not ns.wait_until(lambda: count(ns, "links_detached_idle") > 0, timeout=0.3)
        clock.advance(2)
        assert ns.wait_until(lambda: count(ns, "links_detached_idle") == 1, timeout=2)
        with pytest.raises(ServiceBusConnectionError):
            send(s)
        send(s)


# ------------------------------------------------------------------------------------------------------------
# connections holding no link


def test_a_connection_without_links_is_closed_with_connection_forced(
    make_ns: Callable[..., LocalNamespace],
) -> None:
    from azure.servicebus._pyamqp._connection import Connection
    from azure.servicebus._pyamqp.constants import ConnectionState
    from azure.servicebus._pyamqp.sasl import SASLAnonymousCredential

    ns = make_ns(connection_idle_timeout=0.5)
    connection = Connection(
        f"amqp://127.0.0.1:{ns.port}", sasl_credential=SASLAnonymousCredential(), use_tls=False
    )
    connection.open()
    try:
        assert ns.wait_until(
            lambda: (connection.listen(wait=0.02), connection.state == ConnectionState.OPENED)[1], timeout=2
        )
        opened = time.monotonic()

        def closed() -> bool:
            try:
                connection.listen(wait=0.05)
            except Exception:  # noqa: BLE001 - the SDK raises the close's error from listen
                return True
            return connection.state != ConnectionState.OPENED

        assert ns.wait_until(closed, timeout=SETUP)
        assert time.monotonic() - opened >= 0.35
        assert connection._error is not None
        assert connection._error.condition == b"amqp:connection:forced"
        assert b"inactive for more than the allowed 500 milliseconds" in connection._error.description
        assert count(ns, "connections_closed_idle") == 1
    finally:
        connection.close()


def test_an_sdk_sender_whose_link_idled_out_loses_its_connection_too(
    make_ns: Callable[..., LocalNamespace], received: Callable[[str], list[str]]
) -> None:
    """The product's shape: one connection whose only entity link idles out holds no link any more."""
    ns = make_ns(link_idle_timeout=0.3, connection_idle_timeout=2.0)
    with client(ns) as c, c.get_queue_sender("q") as s:
        send(s, "before")
        with client(ns) as watched, watched.get_queue_sender("q") as w:
            send(w, "watched")
            assert ns.wait_until(lambda: count(ns, "connections_closed_idle") == 2, timeout=SETUP)
            assert count(ns, "links_detached_idle") == 2
            # the namespace forgets a connection it closed once the peer's socket closes too (a moment later)
            assert ns.wait_until(lambda: ns.connection_count == 0, timeout=SETUP)
            # what the SDK reads from the wire
            pump(w)
            closes = [f for f in received("CloseFrame") if "amqp:connection:forced" in f]
            assert len(closes) == 1 and "inactive for more than the allowed 2000 milliseconds" in closes[0]
        # what a plain send raises: the link's detach comes first (the transfer it wrote fails)
        with pytest.raises(ServiceBusConnectionError):
            send(s, "lost")
        send(s, "after")
    assert queued(ns) == 3


def test_a_connection_holding_a_link_is_not_idle(make_ns: Callable[..., LocalNamespace]) -> None:
    ns = make_ns(connection_idle_timeout=0.5)
    with client(ns) as c, c.get_queue_sender("q") as s:
        send(s)
        assert not ns.wait_until(lambda: count(ns, "connections_closed_idle") > 0, timeout=1.2)
        send(s)
        assert count(ns, "connections_opened") == 1


# ------------------------------------------------------------------------------------------------------------
# token expiry


def test_a_link_whose_token_expired_is_detached_unauthorized(
    make_ns: Callable[..., LocalNamespace], received: Callable[[str], list[str]]
) -> None:
    ns = make_ns(key="lifecycle-key")
    credential = ShortSasCredential(ns, lifetime=3)  # too short for the SDK to renew (10% = 0 s)
    with (
        token_client(ns, credential) as c,
        c.get_queue_sender("q") as s,
        token_client(ns, ShortSasCredential(ns, lifetime=3)) as watched,
        watched.get_queue_sender("q") as w,
    ):
        send(s, "before")
        send(w, "watched")
        assert ns.wait_until(lambda: count(ns, "links_detached_token_expired") == 2, timeout=SETUP)
        pump(w)
        detaches = [f for f in received("DetachFrame") if "amqp:unauthorized-access" in f]
        assert len(detaches) == 1
        assert "ExpiredToken" in detaches[0] and "'Send' claim(s) are required" in detaches[0]
        # the SDK checks its token's expiry itself before the next send: its own error, not the detach's
        with pytest.raises(ServiceBusAuthenticationError, match="CBS Authentication Expired"):
            send(s, "lost")
        send(s, "after")  # a fresh connection with a fresh token
        assert credential.issued == 2
    assert queued(ns) == 3


def test_token_expiry_reads_the_namespace_clock(make_ns: Callable[..., LocalNamespace]) -> None:
    """Without a key the namespace accepts any token and dates it by the put-token's ``expiration``."""
    clock = FakeClock()
    ns = make_ns(clock=clock)  # link idle timer: 10 minutes, beyond what this test advances
    credential = ShortSasCredential(ns, lifetime=30)
    with token_client(ns, credential) as c, c.get_queue_sender("q") as s:
        send(s)
        clock.advance(25)
        assert not ns.wait_until(lambda: count(ns, "links_detached_token_expired") > 0, timeout=0.3)
        clock.advance(10)
        assert ns.wait_until(lambda: count(ns, "links_detached_token_expired") == 1, timeout=2)


def test_a_renewed_token_keeps_the_link(make_ns: Callable[..., LocalNamespace]) -> None:
    """A second put-token for the same audience on the connection (the SDK's own renewal, called when the fake
    clock says so) moves the deadline; without another one the link goes when the renewed token expires."""
    clock = FakeClock()
    ns = make_ns(clock=clock)
    credential = ShortSasCredential(ns, lifetime=30)
    with token_client(ns, credential) as c, c.get_queue_sender("q") as s:
        send(s)
        puts = count(ns, "cbs_put_tokens")
        clock.advance(25)
        s._handler._cbs_authenticator.update_token()  # what pyamqp does in a token's last tenth
        assert ns.wait_until(lambda: (pump(s, 1), count(ns, "cbs_put_tokens") == puts + 1)[1], timeout=SETUP)
        clock.advance(10)  # 35 s: past the first token, within the renewed one
        assert not ns.wait_until(lambda: count(ns, "links_detached_token_expired") > 0, timeout=0.3)
        clock.advance(25)  # 60 s: past the renewed one too
        assert ns.wait_until(lambda: count(ns, "links_detached_token_expired") == 1, timeout=2)


@pytest.mark.slow
def test_a_plain_sdk_sender_renews_its_token_and_keeps_its_link(
    make_ns: Callable[..., LocalNamespace],
) -> None:
    """pyamqp renews a token in the last 10% of its life, when the sender next pumps its connection (each send
    does): 10 s tokens and a send every 0.1 s for 12 s, no detach, one connection."""
    ns = make_ns(key="lifecycle-key")
    credential = ShortSasCredential(ns, lifetime=10)
    with token_client(ns, credential) as c, c.get_queue_sender("q") as s:
        send(s)
        end = time.monotonic() + 12
        sent = 1
        while time.monotonic() < end:
            send(s)
            sent += 1
            time.sleep(0.1)  # the sender's pace
    assert credential.issued >= 2
    assert count(ns, "cbs_put_tokens") >= 2
    assert count(ns, "links_detached_token_expired") == 0
    assert count(ns, "connections_opened") == 1
    assert queued(ns) == sent


# ------------------------------------------------------------------------------------------------------------
# throttling


def test_throttle_refuses_beyond_the_granted_credits_with_server_busy(
    make_ns: Callable[..., LocalNamespace],
) -> None:
    clock = FakeClock()
    ns = make_ns(clock=clock, throttle=10)
    with client(ns) as c, c.get_queue_sender("q") as s:
        s.send_messages([ServiceBusMessage(str(i)) for i in range(10)])  # a full second's worth at once
        with pytest.raises(ServiceBusServerBusyError, match="namespace life is being throttled"):
            send(s)
        clock.advance(0.5)  # five credits back
        s.send_messages([ServiceBusMessage("b") for _ in range(5)])
        with pytest.raises(ServiceBusServerBusyError):
            send(s)
        clock.advance(1.0)
        ns.faults.set_throttle(0)  # off
        s.send_messages([ServiceBusMessage("c") for _ in range(50)])
        ns.faults.set_throttle(10)
        s.send_messages([ServiceBusMessage("d") for _ in range(40)])  # more than the bucket: passes when full
        with pytest.raises(ServiceBusServerBusyError):
            send(s)
        clock.advance(3.0)  # still in debt: 40 - 10 - 30 = 0 credits
        with pytest.raises(ServiceBusServerBusyError):
            send(s)
        clock.advance(0.1)
        send(s)
    assert count(ns, "messages_throttled") == 4
    assert ns.lifecycle()["messages_throttled"] == 4
    assert queued(ns) == 10 + 5 + 50 + 40 + 1


def test_throttle_option_is_validated() -> None:
    with pytest.raises(ValueError, match="throttle"):
        LocalNamespace(throttle=-1)
    for option in ("link_idle_timeout", "connection_idle_timeout"):
        with pytest.raises(ValueError, match=option):
            LocalNamespace(**{option: 0})
    with pytest.raises(ValueError, match="credits_per_second"):
        LocalNamespace().faults.set_throttle(1.5)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------------------
# the SDK's own retries


def _idle_detach(ns: LocalNamespace) -> None:
    ns.wait_until(lambda: count(ns, "links_detached_idle") >= 1, timeout=SETUP)


@pytest.mark.slow
@pytest.mark.parametrize(
    "shape", ["idle-detach", "forced-detach", "idle-close", "token-expired", "server-busy"]
)
def test_the_sdk_with_its_default_retries_recovers_within_the_call(
    make_ns: Callable[..., LocalNamespace], shape: str
) -> None:
    ns = make_ns(
        link_idle_timeout=0.3 if shape in ("idle-detach", "idle-close") else 600,
        connection_idle_timeout=1.5 if shape == "idle-close" else 60,
        key="lifecycle-key" if shape == "token-expired" else None,
    )
    if shape == "token-expired":
        c = ServiceBusClient(f"127.0.0.1:{ns.port}", ShortSasCredential(ns, lifetime=3), use_tls=False)
    else:
        c = ServiceBusClient.from_connection_string(ns.connection_string)
    with c, c.get_queue_sender("q") as s:
        send(s, "before")
        if shape == "idle-detach":
            assert ns.wait_until(lambda: count(ns, "links_detached_idle") == 1, timeout=SETUP)
        elif shape == "idle-close":
            assert ns.wait_until(lambda: count(ns, "connections_closed_idle") == 1, timeout=SETUP)
        elif shape == "token-expired":
            assert ns.wait_until(lambda: count(ns, "links_detached_token_expired") == 1, timeout=SETUP)
        elif shape == "forced-detach":
            ns.faults.detach("q")
        else:
            ns.faults.set_throttle(1)
            send(s, "spends the bucket")
        started = time.monotonic()
        send(s, "after")
        took = time.monotonic() - started
    assert took < 6, took  # the SDK's backoff (about 0.8 s then 1.6 s), not a hang
    assert queued(ns) == (3 if shape == "server-busy" else 2)


# ------------------------------------------------------------------------------------------------------------
# forced detach


def test_forced_detach_of_one_entity(
    make_ns: Callable[..., LocalNamespace], received: Callable[[str], list[str]]
) -> None:
    ns = make_ns()
    with client(ns) as c, c.get_queue_sender("q") as s, c.get_queue_sender("q2") as s2:
        send(s)
        send(s2)
        ns.faults.detach("Q", description="maintenance")  # names are case-insensitive
        assert count(ns, "links_detached_fault") == 1
        send(s2)  # the other entity's link (its own connection) is untouched
        with pytest.raises(ServiceBusConnectionError, match="amqp:unknown-error"):
            send(s)
        detaches = [f for f in received("DetachFrame") if "amqp:link:detach-forced" in f]
        assert len(detaches) == 1 and "maintenance" in detaches[0]
        send(s)
    assert queued(ns, "q") == 2 and queued(ns, "q2") == 2


def test_forced_detach_of_every_link_with_a_chosen_condition(
    make_ns: Callable[..., LocalNamespace], received: Callable[[str], list[str]]
) -> None:
    ns = make_ns(topics={"t": ["s1"]})
    with client(ns) as c, c.get_queue_sender("q") as s, c.get_subscription_receiver("t", "s1") as r:
        send(s)
        assert r.receive_messages(max_wait_time=0.2) == []
        ns.faults.detach(None, condition="com.microsoft:entity-disabled", description="gone for a while")
        assert count(ns, "links_detached_fault") == 2
        with pytest.raises(ServiceBusConnectionError):
            send(s)
        send(s)
    assert len([f for f in received("DetachFrame") if "com.microsoft:entity-disabled" in f]) >= 1
    with pytest.raises(ValueError, match="condition"):
        ns.faults.detach("q", condition="")


# ------------------------------------------------------------------------------------------------------------
# blackhole


def test_blackhole_silences_open_connections_and_serves_new_ones(
    make_ns: Callable[..., LocalNamespace],
) -> None:
    ns = make_ns()
    c = client(ns)
    s = c.get_queue_sender("q")
    send(s, "before")
    ns.faults.blackhole()
    assert count(ns, "connections_blackholed") == 1
    # with a deadline the SDK times out ...
    with pytest.raises(OperationTimeoutError):
        send(s, "lost", timeout=1)
    # ... without one, a plain send waits on the silent connection (the SDK does not find out by itself)
    outcome: list[object] = []

    def plain_send() -> None:
        try:
            send(s, "lost too")
            outcome.append("sent")
        except Exception as exc:  # noqa: BLE001 - recorded for the assertion below
            outcome.append(exc)

    waiter = threading.Thread(target=plain_send, daemon=True)
    waiter.start()
    waiter.join(2.0)
    assert waiter.is_alive() and outcome == []
    # a new connection is served normally
    with client(ns) as c2, c2.get_queue_sender("q") as s2:
        send(s2, "new")
    assert queued(ns) == 2
    # the silenced connection is no longer served (c2's own is forgotten once its socket closes) ...
    assert ns.wait_until(lambda: ns.connection_count == 0, timeout=SETUP)
    assert ns.counters()["connections_open"] == 1  # ... yet still held open (no FIN, no close)
    ns.stop()  # closing the socket ends the waiting send
    waiter.join(SETUP)
    assert not waiter.is_alive() and outcome and outcome[0] != "sent"
    c.close()


def test_blackhole_stops_heartbeats(make_ns: Callable[..., LocalNamespace]) -> None:
    """A connection that asked for heartbeats hears none after the blackhole: the SDK's own idle timeout then
    gives it up, which is how a client finds out."""
    from azure.servicebus._pyamqp._connection import Connection
    from azure.servicebus._pyamqp.constants import ConnectionState
    from azure.servicebus._pyamqp.sasl import SASLAnonymousCredential

    ns = make_ns()
    connection = Connection(
        f"amqp://127.0.0.1:{ns.port}",
        sasl_credential=SASLAnonymousCredential(),
        idle_timeout=1.0,
        use_tls=False,
    )
    connection.open()
    try:
        first = connection._last_frame_received_time
        assert ns.wait_until(
            lambda: (connection.listen(wait=0.05), connection._last_frame_received_time != first)[1],
            timeout=2,
        )
        ns.faults.blackhole()
        blackholed_at = time.time()

        def given_up() -> bool:
            try:
                connection.listen(wait=0.05)
            except Exception:  # noqa: BLE001 - the SDK raises its idle-timeout error from listen
                return True
            return connection.state != ConnectionState.OPENED

        assert ns.wait_until(given_up, timeout=3)
        # nothing after the blackhole (a heartbeat already on its way may land within a few milliseconds)
        assert connection._last_frame_received_time < blackholed_at + 0.05
    finally:
        connection.close()


# ------------------------------------------------------------------------------------------------------------
# control API and CLI


def _post(url: str, body: object) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_control_api_routes(make_ns: Callable[..., LocalNamespace]) -> None:
    ns = make_ns(control_port=0, link_idle_timeout=20, connection_idle_timeout=30)
    url = ns.control_url
    assert url is not None
    with client(ns) as c, c.get_queue_sender("q") as s:
        send(s)
        assert _post(f"{url}/throttle", {"credits_per_second": 1}) == (200, {"ok": True})
        assert ns.throttle == 1
        send(s, "spends the bucket")
        with pytest.raises(ServiceBusServerBusyError):
            s.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")] * 2)
        assert _post(f"{url}/throttle", {"credits_per_second": 0})[0] == 200
        assert _post(f"{url}/faults/detach", {"entity": "q", "description": "by http"})[0] == 200
        assert ns.wait_until(lambda: count(ns, "links_detached_fault") == 1)
        with pytest.raises(ServiceBusConnectionError):
            send(s)
        send(s)
        assert _post(f"{url}/faults/detach", {"entity": None})[0] == 200
        assert _post(f"{url}/faults/blackhole", {"on": True})[0] == 200
        assert ns.wait_until(lambda: count(ns, "connections_blackholed") == 1)
    with urllib.request.urlopen(f"{url}/status", timeout=5) as resp:
        status = json.loads(resp.read())
    assert status["lifecycle"] == {
        "link_idle_timeout": 20.0,
        "connection_idle_timeout": 30.0,
        "throttle": 0,
        "links_detached_idle": 0,
        "connections_closed_idle": 0,
        "links_detached_token_expired": 0,
        "links_detached_fault": 2,
        "connections_blackholed": 1,
        "messages_throttled": 4,
    }
    assert status["faults"]["throttle"] == 0
    for route, body in [
        ("/throttle", {}),
        ("/throttle", {"credits_per_second": -5}),
        ("/throttle", {"credits_per_second": "many"}),
        ("/faults/blackhole", {"on": "yes"}),
        ("/faults/detach", {"entity": 3}),
        ("/faults/detach", {"entity": "q", "condition": ""}),
    ]:
        code, doc = _post(f"{url}{route}", body)
        assert code == 400 and doc["error"], (route, body)


def test_cli_lifecycle_options() -> None:
    args = build_parser().parse_args(
        ["--link-idle-timeout", "20s", "--connection-idle-timeout", "1m", "--throttle", "1000"]
    )
    assert (args.link_idle_timeout, args.connection_idle_timeout, args.throttle) == (20.0, 60.0, 1000)
    defaults = build_parser().parse_args([])
    assert (defaults.link_idle_timeout, defaults.connection_idle_timeout, defaults.throttle) == (
        600.0,
        60.0,
        0,
    )
    assert [parse_seconds(t) for t in ("20s", "10m", "1h", "90", "0.5", "500ms", "PT2M")] == [
        20.0,
        600.0,
        3600.0,
        90.0,
        0.5,
        0.5,
        120.0,
    ]
    for bad in ("-5s", "ten", "5x", ""):
        with pytest.raises(ValueError, match="not a duration"):
            parse_seconds(bad)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--link-idle-timeout", "soon"], "not a duration"),
        (["--connection-idle-timeout", "0s"], "more than 0"),
        (["--throttle", "-1"], "cannot be negative"),
    ],
)
def test_cli_rejects_bad_lifecycle_options(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_drop_resets_blackholed_connections_too(make_ns: Callable[..., LocalNamespace]) -> None:
    ns = make_ns()
    with client(ns) as c, c.get_queue_sender("q") as s:
        send(s)
        ns.faults.blackhole()
        assert ns.counters()["connections_open"] == 1
        ns.faults.drop_connections()
        assert ns.counters()["connections_open"] == 0
        # the reset wakes the SDK at once: its next send fails fast instead of timing out, the one after works
        started = time.monotonic()
        with pytest.raises(ServiceBusConnectionError):
            send(s, timeout=10)
        assert time.monotonic() - started < 5
        send(s)
    assert queued(ns) == 2


def test_cli_starts_a_namespace_with_its_lifecycle_options() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "servicebus_local",
            "--port",
            "0",
            "--control-port",
            "0",
            "--queue",
            "q",
            "--link-idle-timeout",
            "20s",
            "--connection-idle-timeout",
            "2m",
            "--throttle",
            "5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        control_url = proc.stdout.readline().strip().split("=", 1)[1]
        with urllib.request.urlopen(f"{control_url}/status", timeout=5) as resp:
            lifecycle = json.loads(resp.read())["lifecycle"]
        assert (
            lifecycle["link_idle_timeout"],
            lifecycle["connection_idle_timeout"],
            lifecycle["throttle"],
        ) == (
            20.0,
            120.0,
            5,
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
