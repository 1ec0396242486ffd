"""A connection that lives for weeks meets what the network and the service do to it (SPEC L1-L3), and none of it
is an outage: a silently dropped connection, a connection the namespace closed or reset, a link it detached (by
force, or idle), a connection closed for having no link, an expired token. Each costs the next send at most about
a second (a fresh link or connection), never a failover, never a lost message - with failover_interval 0 (the
first failure would fail over) and 60 s.

Real SDK, real TCP, the local namespace pair; timelines asserted, ids compared as sets.
"""

from __future__ import annotations

import math
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import pytest
from azure.core.credentials import AccessToken
from azure.servicebus import ServiceBusClient
from azure.servicebus._pyamqp import cbs
from azure.servicebus._pyamqp.constants import CbsAuthState, CbsState
from azure.servicebus._pyamqp.utils import generate_sas_token

from harness.outages import backlog_count
from servicebus_local.clock import FakeClock
from servicebus_local.server import LocalNamespace
from spark_sb.config.namespace import CredentialConfig, NamespaceConfig, RetryConfig
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.failover.registry import FailoverRegistry
from spark_sb.message.backlog import to_backlog
from spark_sb.message.outbound import OutboundMessage
from spark_sb.sender.paired import PairedSender
from spark_sb.syphon.mover import Syphon
from spark_sb.wire.sdk_transport import SdkTransport
from spark_sb.wire.timing import SILENT_AFTER
from spark_sb.wire.transport import PRIMARY

from .rigs import BACKLOG, ENTITY, batch, config_for, received_ids

pytestmark = pytest.mark.slow

#: "At most about a second": a fresh connection and link on loopback take a few tens of milliseconds; the rest is
#: room for a loaded 2-core machine.
NEXT_SEND_WITHIN = 1.0


def await_true(what: str, check: Callable[[], bool], within: float) -> float:
    """Wait (polling) until ``check()``; the seconds it took. Fails the test past ``within``."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < within, f"{what}: not within {within} s"
        time.sleep(0.02)
    return time.monotonic() - start


class Rig:
    """A primary and a secondary namespace (the primary with the given lifecycle settings) and a paired sender."""

    def __init__(self, interval: float, **primary_settings: Any) -> None:
        self.primary = LocalNamespace("primary", queues=[ENTITY], **primary_settings).start()
        self.secondary = LocalNamespace("secondary", queues=BACKLOG).start()
        self.sender = PairedSender(
            config_for(self.primary, self.secondary, interval), registry=FailoverRegistry()
        )

    @property
    def transport(self) -> SdkTransport:
        transport = self.sender.transport
        assert isinstance(transport, SdkTransport)
        return transport

    def lifecycle(self) -> dict[str, int]:
        return self.transport.lifecycle(PRIMARY)

    def send(self, prefix: str) -> tuple[float, Any]:
        start = time.monotonic()
        outcome = self.sender.send(batch(prefix))
        return time.monotonic() - start, outcome

    def close(self) -> None:
        self.sender.close()
        self.primary.stop()
        self.secondary.stop()


@pytest.fixture(params=[0.0, 60.0], ids=["failover_interval=0", "failover_interval=60"])
def rig_factory(request: pytest.FixtureRequest) -> Iterator[Callable[..., Rig]]:
    rigs: list[Rig] = []

    def make(**primary_settings: Any) -> Rig:
        rig = Rig(request.param, **primary_settings)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.close()


def _healthy_after(rig: Rig, elapsed: float, outcome: Any, sent_before: int = 50) -> None:
    assert elapsed <= NEXT_SEND_WITHIN, f"the next send took {elapsed:.2f} s"
    assert outcome.total_sent == 50 and outcome.total_diverted == 0 and not outcome.rejects
    assert list(outcome.transitions) == []  # no failover started
    assert rig.sender.entity_state(ENTITY).value == "healthy"
    got = received_ids(rig.primary, ENTITY)
    assert got == {f"before-{i}" for i in range(sent_before)} | {f"after-{i}" for i in range(50)}
    assert backlog_count(rig.secondary, BACKLOG) == 0


# ------------------------------------------------------------------------------------------------- the shapes
def test_a_connection_the_namespace_closes_while_idle_costs_a_fresh_connection(
    rig_factory: Callable[..., Rig],
) -> None:
    """amqp:connection:forced on an idle connection (what the service sends a connection it retires): found
    between calls, dropped; the next send opens a new one."""
    rig = rig_factory()
    rig.send("before")
    rig.primary.faults.close_connections("amqp:connection:forced", "the service closed the connection")
    await_true("the closed connection dropped", lambda: rig.lifecycle()["dropped"] >= 1, 5.0)
    elapsed, outcome = rig.send("after")
    _healthy_after(rig, elapsed, outcome)
    assert rig.lifecycle()["connections"] == 2


def test_a_connection_reset_while_idle_costs_a_fresh_connection(rig_factory: Callable[..., Rig]) -> None:
    rig = rig_factory()
    rig.send("before")
    rig.primary.faults.drop_connections()
    await_true("the reset connection dropped", lambda: rig.lifecycle()["dropped"] >= 1, 5.0)
    elapsed, outcome = rig.send("after")
    _healthy_after(rig, elapsed, outcome)
    assert rig.lifecycle()["connections"] == 2


def test_a_silently_dropped_idle_connection_is_found_out_and_replaced(
    rig_factory: Callable[..., Rig],
) -> None:
    """A middlebox forgets the flow: the namespace's heartbeats stop coming, nothing says so. The transport finds
    the silence between calls (SILENT_AFTER) and the next send goes out on a new connection."""
    rig = rig_factory()
    rig.send("before")
    rig.primary.faults.blackhole(True)
    took = await_true(
        "the silent connection dropped", lambda: rig.lifecycle()["dropped"] >= 1, SILENT_AFTER + 3
    )
    assert took >= SILENT_AFTER - 1.0  # found by its silence, not by an error
    elapsed, outcome = rig.send("after")
    _healthy_after(rig, elapsed, outcome)


def test_a_link_detached_by_force_costs_a_fresh_link_not_a_failover(rig_factory: Callable[..., Rig]) -> None:
    """The service detaches the link (amqp:link:detach-forced) and the next send comes at once: it meets the
    detach (or finds the link gone) and is made on a fresh link; the connection stays."""
    rig = rig_factory()
    rig.send("before")
    rig.primary.faults.detach(ENTITY, "amqp:link:detach-forced", "The link was detached by the service")
    elapsed, outcome = rig.send("after")
    _healthy_after(rig, elapsed, outcome)
    assert rig.lifecycle()["connections"] == 1


def test_an_idle_link_detached_by_the_namespace_costs_a_fresh_link(rig_factory: Callable[..., Rig]) -> None:
    rig = rig_factory(link_idle_timeout=1.0)
    rig.send("before")
    await_true("the idle link detached", lambda: rig.lifecycle()["detached"] >= 1, 5.0)
    elapsed, outcome = rig.send("after")
    _healthy_after(rig, elapsed, outcome)
    assert rig.lifecycle()["connections"] == 1


def test_a_connection_closed_for_having_no_link_costs_a_fresh_connection(
    rig_factory: Callable[..., Rig],
) -> None:
    rig = rig_factory(link_idle_timeout=0.5, connection_idle_timeout=1.0)
    rig.send("before")
    await_true("the linkless connection dropped", lambda: rig.lifecycle()["dropped"] >= 1, 6.0)
    elapsed, outcome = rig.send("after")
    _healthy_after(rig, elapsed, outcome)
    assert rig.lifecycle()["connections"] == 2


# ------------------------------------------------------------------------------------------- short-lived tokens
@dataclass(frozen=True)
class ShortTokens(CredentialConfig):
    """A credential whose tokens live ``lifetime`` seconds (Azure AD tokens live about an hour; the namespace
    enforces their expiry, so a short life shows renewal at work). Built where the client is built."""

    lifetime: float = 30.0

    def build(self) -> Any:
        return _ShortLived(self.lifetime)


class _ShortLived:
    issued = 0  # across instances: every client of the test asks its own

    def __init__(self, lifetime: float) -> None:
        self.lifetime = lifetime

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        type(self).issued += 1
        return AccessToken(f"short-lived-{uuid.uuid4()}", int(time.time() + self.lifetime))


def short_token_config(
    primary: LocalNamespace, secondary: LocalNamespace, lifetime: float
) -> ServiceBusConfig:
    def namespace(ns: LocalNamespace, name: str | None) -> NamespaceConfig:
        return NamespaceConfig(
            fully_qualified_namespace=f"127.0.0.1:{ns.port}",
            credential=ShortTokens(lifetime=lifetime),
            use_development_emulator=True,
            namespace_name=name,
        )

    return ServiceBusConfig(
        primary=namespace(primary, "primary"),
        secondary=namespace(secondary, None),
        entity=ENTITY,
        backlog_queue_count=len(BACKLOG),
        failover_interval=0.0,  # the first failure would fail over: there must be none
        ping_primary_interval=1.0,
        send_timeout=3.0,
        retry=RetryConfig(total=0, backoff_factor=0.1, backoff_max=0.5),
    )


def _run_with_short_tokens(lifetime: float, seconds: float) -> None:
    """A sender sends a batch a second and a syphon moves what lands in a backlog queue every few seconds, for
    ``seconds``, with tokens of ``lifetime`` seconds that the namespace enforces: no error, no failover, nothing
    lost, tokens renewed."""
    primary = LocalNamespace("primary", queues=[ENTITY]).start()
    secondary = LocalNamespace("secondary", queues=BACKLOG).start()
    issued_before = _ShortLived.issued
    config = short_token_config(primary, secondary, lifetime)
    sender = PairedSender(config, registry=FailoverRegistry())
    syphon = Syphon(config)
    expected: set[str] = set()
    try:
        end = time.monotonic() + seconds
        round_ = 0
        while time.monotonic() < end:
            out = sender.send(batch(f"s{round_}", 20))
            assert out.total_sent == 20 and not out.transitions, out
            expected |= {f"s{round_}-{i}" for i in range(20)}
            if round_ % 3 == 0:  # what a failover would have put in the backlog, moved back by the syphon
                moved = [OutboundMessage(body=b"m", message_id=f"b{round_}-{i}") for i in range(5)]
                with (
                    ServiceBusClient.from_connection_string(secondary.connection_string) as client,
                    client.get_queue_sender(BACKLOG[0]) as put,
                ):
                    put.send_messages(
                        [to_backlog(m, ENTITY, datetime.now(timezone.utc)).to_sdk() for m in moved]
                    )
                drained = syphon.drain_all(max_wait=0.5)
                assert drained.forwarded == {ENTITY: 5} and not drained.errors, drained
                expected |= {m.message_id or "" for m in moved}
            round_ += 1
            time.sleep(1.0)  # a quiet second between batches: the links idle, the tokens age
        assert received_ids(primary, ENTITY) == expected
        assert _ShortLived.issued - issued_before >= 2 * seconds / lifetime  # renewed as they aged
        assert sender.entity_state(ENTITY).value == "healthy"
    finally:
        syphon.close()
        sender.close()
        primary.stop()
        secondary.stop()


def test_tokens_that_expire_every_few_seconds_cost_nothing() -> None:
    """Tokens of 4 s: their refresh window (the last 10%) is shorter than the transport's idle tick, so some
    expire and the namespace detaches their links; the next call opens a fresh link with a fresh token."""
    _run_with_short_tokens(lifetime=4.0, seconds=15.0)


# What 3 minutes of real time with 30 s tokens showed (six lifetimes), on a fake clock: the namespaces' clock and the
# SDK's token clock (pyamqp's ``cbs.utc_now``) are one FakeClock that the test moves a second at a time, so six
# lifetimes take seconds. The network, the SDK and the lanes' idle tend (every TEND_EVERY s of real time) are real.
FAKE_LIFETIME = 30  # seconds of fake time; the SDK's refresh window is the last tenth: 3 s
FAKE_SECONDS = 6 * FAKE_LIFETIME
KEY = "lifecycle-key"


@dataclass(frozen=True)
class FakeTimeTokens(CredentialConfig):
    """SAS tokens signed with the namespaces' key, living ``lifetime`` seconds of the fake clock's time.

    The SDK dates a token by its ``expires_on`` against its own clock (patched to the fake one); the namespace
    dates it by the SAS ``se`` against the wall clock when the token is put, and runs what is left on its own
    clock (the same fake one). So both see ``lifetime`` seconds of fake time. Every token issued is noted in
    ``issued`` (its ``expires_on``)."""

    clock: FakeClock = field(default_factory=FakeClock, hash=False, compare=False)
    issued: list[int] = field(default_factory=list, hash=False, compare=False)
    lifetime: int = FAKE_LIFETIME

    def build(self) -> Any:
        return _FakeTimeToken(self)


class _FakeTimeToken:
    def __init__(self, config: FakeTimeTokens) -> None:
        self.config = config

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        lifetime = self.config.lifetime
        expires_on = int(self.config.clock.now().timestamp()) + lifetime
        # the namespace's view: `lifetime` s from now on the wall clock (rounded up: never shorter than the SDK's)
        token = generate_sas_token(
            scopes[0], "RootManageSharedAccessKey", KEY, math.ceil(time.time()) + lifetime
        )
        self.config.issued.append(expires_on)
        return AccessToken(token, expires_on)


def _due_for_renewal(authenticators: weakref.WeakSet[Any]) -> int:
    """Open links whose token is in its refresh window, or past it, and not being renewed (pyamqp's own test of a
    token, on the patched clock)."""
    due = 0
    for auth in list(authenticators):
        if auth.state != CbsState.OPEN or auth.auth_state != CbsAuthState.OK:
            continue  # closed, or a put-token in flight
        expired, refresh = cbs.check_expiration_and_refresh_status(auth._expires_on, auth._refresh_window)
        due += expired or refresh
    return due


def test_a_sender_and_a_syphon_renew_30_second_tokens_through_six_lifetimes_on_a_fake_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch every second and a syphon pass every thirty, for six token lifetimes of 30 s (fake time; the
    namespaces enforce the expiry on the same clock). Each link's token is renewed in its refresh window - by the
    lanes' idle tend between calls (the syphon's receivers idle 30 s between passes), or by the call that meets
    the window - so no error, no failover, no link detached for an expired token, nothing lost, tokens renewed
    as they aged."""
    clock = FakeClock(start=datetime.fromtimestamp(int(time.time()), timezone.utc))
    monkeypatch.setattr(cbs, "utc_now", clock.now)  # the SDK's token clock: refresh windows and expiry
    authenticators: weakref.WeakSet[Any] = weakref.WeakSet()  # every link's CBS authenticator, to watch
    init = cbs.CBSAuthenticator.__init__

    def watched(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        authenticators.add(self)

    monkeypatch.setattr(cbs.CBSAuthenticator, "__init__", watched)
    primary = LocalNamespace("primary", queues=[ENTITY], key=KEY, clock=clock).start()
    secondary = LocalNamespace("secondary", queues=BACKLOG, key=KEY, clock=clock).start()
    issued: list[int] = []

    def namespace(ns: LocalNamespace, name: str | None) -> NamespaceConfig:
        return NamespaceConfig(
            fully_qualified_namespace=f"127.0.0.1:{ns.port}",
            credential=FakeTimeTokens(clock=clock, issued=issued),
            use_development_emulator=True,
            namespace_name=name,
        )

    config = ServiceBusConfig(
        primary=namespace(primary, "primary"),
        secondary=namespace(secondary, None),
        entity=ENTITY,
        backlog_queue_count=len(BACKLOG),
        failover_interval=0.0,  # the first failure would fail over: there must be none
        ping_primary_interval=1.0,
        send_timeout=3.0,
        retry=RetryConfig(total=0, backoff_factor=0.1, backoff_max=0.5),
    )
    sender = PairedSender(config, registry=FailoverRegistry())
    syphon = Syphon(config)
    expected: set[str] = set()
    try:
        with (  # what a failover would have put in the backlog (a client of its own: the namespace's key)
            ServiceBusClient.from_connection_string(secondary.connection_string) as client,
            client.get_queue_sender(BACKLOG[0]) as backlog,
        ):
            for second in range(FAKE_SECONDS):
                out = sender.send(batch(f"s{second}", 20))
                assert out.total_sent == 20 and not out.transitions, out
                expected |= {f"s{second}-{i}" for i in range(20)}
                if second % 30 == 5:  # moved back by the syphon
                    moved = [OutboundMessage(body=b"m", message_id=f"b{second}-{i}") for i in range(5)]
                    now = datetime.now(timezone.utc)
                    backlog.send_messages([to_backlog(m, ENTITY, now).to_sdk() for m in moved])
                    drained = syphon.drain_all(max_wait=0.5)
                    assert drained.forwarded == {ENTITY: 5} and not drained.errors, (second, drained)
                    expected |= {m.message_id or "" for m in moved}
                clock.advance(1.0)  # a quiet second: the links idle, the tokens age
                # what the lanes' idle tend does between calls (a tick every TEND_EVERY s): awaited, not slept
                await_true(
                    f"the tokens in their refresh window renewed at {second + 1} s",
                    lambda: _due_for_renewal(authenticators) == 0,
                    5.0,
                )
        assert received_ids(primary, ENTITY) == expected
        for ns in (primary, secondary):
            assert ns.counters()["links_detached_token_expired"] == 0, ns.name
        assert len(issued) >= 2 * FAKE_SECONDS / FAKE_LIFETIME  # renewed as they aged
        assert sender.entity_state(ENTITY).value == "healthy"
    finally:
        syphon.close()
        sender.close()
        primary.stop()
        secondary.stop()


# ------------------------------------------------------------------------------------------------- throttling
def test_a_throttled_batch_moves_at_the_granted_rate_and_never_fails_over() -> None:
    """At 1,000 credits a second (the Standard tier's), 20,000 messages go out at >= 0.8 of the granted rate:
    "server busy" is backed off briefly and retried, never a failover (failover_interval 0: the first outage-class
    failure would divert), nothing lost, the time spent backing off in the outcome."""
    rate, count = 1000, 20_000
    primary = LocalNamespace("primary", queues=[ENTITY], throttle=rate).start()
    secondary = LocalNamespace("secondary", queues=BACKLOG).start()
    sender = PairedSender(config_for(primary, secondary, 0.0), registry=FailoverRegistry())
    try:
        messages = [OutboundMessage(body=b"x" * 100, message_id=f"t-{i}") for i in range(count)]
        start = time.monotonic()
        out = sender.send(messages)
        elapsed = time.monotonic() - start
        assert out.total_sent == count and out.total_diverted == 0 and not out.transitions, out
        # the bucket starts full (one second's credits): the rest is granted at `rate`
        assert (count - rate) / elapsed >= 0.8 * rate, f"{count} messages in {elapsed:.1f} s"
        assert out.throttled.get(ENTITY, 0.0) > 1.0  # it was throttled, and says how long it backed off
        assert primary.counters()["messages_throttled"] > 0
        assert received_ids(primary, ENTITY) == {m.message_id for m in messages}
    finally:
        sender.close()
        primary.stop()
        secondary.stop()
