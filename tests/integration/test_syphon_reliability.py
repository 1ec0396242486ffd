"""The syphon's receive side against two local namespaces (real SDK, real TCP): receivers in lanes with deadlines
(a stalled secondary never hangs it), cancellation abandons what is held, nothing stranded in dead-letter queues,
locks that run out while buffered, and moving only to entities that are healthy or answer a probe (B9, B11, B12)."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusSubQueue

from harness.queues import take
from servicebus_local.clock import FakeClock
from servicebus_local.model import QueueSettings
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.message.backlog import to_backlog
from spark_sb.message.outbound import OutboundMessage
from spark_sb.syphon.mover import Syphon
from spark_sb.syphon.rules import EXPIRED_IN_BACKLOG

pytestmark = pytest.mark.slow

Q = "primary/x-servicebus-transfer/0"


def _config(pair: Any, **over: Any) -> ServiceBusConfig:
    return ServiceBusConfig.from_dict(
        {
            "primary": {"connection_string": pair.primary.connection_string, "namespace_name": "primary"},
            "secondary": {"connection_string": pair.secondary.connection_string},
            "backlog_queue_count": 1,
            "send_timeout": "2s",
            **over,
        }
    )


def _put(ns: Any, queue: str, messages: list[OutboundMessage]) -> None:
    with (
        ServiceBusClient.from_connection_string(ns.connection_string) as client,
        client.get_queue_sender(queue) as sender,
    ):
        sender.send_messages([m.to_sdk() for m in messages])


def _ids(ns: Any, entity: str, sub_queue: Any = None) -> list[Any]:
    return take(ns.connection_string, entity, sub_queue=sub_queue, batch=200)


def _backlogged(n: int, prefix: str = "m", **kw: Any) -> list[OutboundMessage]:
    now = datetime.now(timezone.utc)
    return [
        to_backlog(OutboundMessage(body=f"{prefix}{i}", message_id=f"{prefix}{i}", **kw), "orders", now)
        for i in range(n)
    ]


@pytest.fixture
def pair(namespace_pair: Any) -> Any:
    namespace_pair.primary.broker.create_queue("orders", QueueSettings(requires_duplicate_detection=True))
    return namespace_pair


def test_a_stalled_secondary_never_hangs_the_syphon_and_its_receiver_is_replaced(pair: Any) -> None:
    """Total silence, SASL included (the SDK alone would wait forever): the receive ends at max_wait +
    send_timeout, the receiver is abandoned, and once the namespace answers a new one moves everything."""
    pair.secondary.broker.create_queue(Q)
    _put(pair.secondary, Q, _backlogged(5))
    pair.secondary.faults.stall(True, answer_sasl=False)
    with Syphon(_config(pair)) as syphon:
        started = time.monotonic()
        stalled = syphon.drain_queue(Q, max_wait=0.5)
        assert time.monotonic() - started < 0.5 + 2 + 2  # max_wait + send_timeout, plus slack
        assert stalled.forwarded_total == 0 and stalled.received == 0
        # a timeout either way: the lane's deadline (DeadlineExceeded) or the open's own (TimeoutError, SPEC F8)
        assert stalled.errors in (
            [f"{Q}: receive failed: DeadlineExceeded"],
            [f"{Q}: receive failed: TimeoutError"],
        )
        pair.secondary.faults.stall(False)
        moved = syphon.drain_queue(Q, max_wait=0.5)
    assert moved.forwarded == {"orders": 5} and not moved.errors
    assert sorted(str(m.message_id) for m in _ids(pair.primary, "orders")) == [f"m{i}" for i in range(5)]


def test_cancel_abandons_what_is_held_and_loses_nothing(pair: Any) -> None:
    pair.secondary.broker.create_queue(Q, QueueSettings(lock_duration=timedelta(seconds=30)))
    _put(pair.secondary, Q, _backlogged(60))
    pair.primary.faults.set_latency(0.05)  # each send to the primary takes a while: cancel lands mid-drain
    config = _config(pair, syphon={"batch_size": 10})
    result: list[Any] = []
    with Syphon(config, healthy_hints={"orders": "healthy"}) as syphon:
        worker = threading.Thread(target=lambda: result.append(syphon.drain_queue(Q, max_wait=0.5)))
        worker.start()
        assert pair.primary.wait_until(lambda: pair.primary.counters()["messages_received"] >= 10, timeout=30)
        syphon.cancel()
        worker.join(30)
        assert not worker.is_alive()
    (outcome,) = result
    assert outcome.cancelled and 10 <= outcome.forwarded_total < 60
    assert outcome.received == outcome.forwarded_total + outcome.abandoned
    pair.primary.faults.set_latency(0)
    # Abandoned, not left locked: the rest is available again at once (the lock would hold it for 30 s).
    left = {str(m.message_id) for m in _ids(pair.secondary, Q)}
    moved = {str(m.message_id) for m in _ids(pair.primary, "orders")}
    assert len(moved) == outcome.forwarded_total and not moved & left
    assert moved | left == {f"m{i}" for i in range(60)}


def test_nothing_stranded_in_a_drifted_backlog_queue(pair: Any) -> None:
    """A backlog queue with max delivery count 3 and a primary outage over three passes: the messages land in
    its dead-letter queue, and the syphon moves them from there; one that expired stays dead-lettered with its
    reason."""
    pair.secondary.broker.create_queue(Q, QueueSettings(max_delivery_count=3))
    _put(pair.secondary, Q, _backlogged(4))
    old = datetime.now(timezone.utc) - timedelta(hours=2)
    expired = to_backlog(
        OutboundMessage(body="old", message_id="old", time_to_live=timedelta(hours=1)), "orders", old
    )
    clock = FakeClock(start=datetime.now(timezone.utc))  # wall time matters: TTLs are checked against it
    pair.primary.faults.fail_sends("orders", "com.microsoft:entity-disabled")
    with Syphon(_config(pair), clock=clock, entity_backoff=1) as syphon:
        for _ in range(3):
            outage = syphon.drain_queue(Q, max_wait=0.5)
            assert outage.forwarded_total == 0 and outage.abandoned == 4
            clock.advance(1)
        runtime = pair.secondary.broker.get_queue(Q).runtime
        assert (runtime.active_message_count, runtime.dead_letter_message_count) == (0, 4)
        _put(pair.secondary, Q, [expired])
        assert syphon.drain_queue(Q, max_wait=0.5).expired_by_entity == {"orders": 1}
        pair.primary.faults.clear()
        clock.advance(1)
        moved = syphon.drain_all(max_wait=0.5, dead_letter=True)
        again = syphon.drain_queue(Q, max_wait=0.5, dead_letter=True)
    assert moved.forwarded == {"orders": 4} and moved.from_dead_letter == 4 and moved.parked == 1
    assert again.forwarded_total == 0 and again.parked == 1  # still there, never moved
    got = _ids(pair.primary, "orders")
    assert sorted(str(m.message_id) for m in got) == [f"m{i}" for i in range(4)]
    assert not any(
        k in m.application_properties
        for m in got
        for k in (b"DeadLetterReason", b"x-ms-path")
        if m.application_properties
    )
    (parked,) = _ids(pair.secondary, Q, ServiceBusSubQueue.DEAD_LETTER)
    assert str(parked.message_id) == "old" and parked.dead_letter_reason == EXPIRED_IN_BACKLOG


def test_a_message_whose_lock_runs_out_while_buffered_is_not_forwarded(pair: Any) -> None:
    """Locks checked before forwarding (B12): messages prefetched into the receiver's buffer when a receive began,
    and handed over 29 s later (30 s locks), are not forwarded; they stay in the backlog for redelivery. The lock is
    measured on the syphon's monotonic clock from that receive, never its wall clock against the service's (issue 47:
    a skewed executor)."""
    pair.secondary.broker.create_queue(Q, QueueSettings(lock_duration=timedelta(seconds=30)))
    clock = FakeClock(start=datetime.now(timezone.utc))
    config = _config(pair, syphon={"prefetch": 10})
    with Syphon(config, clock=clock, healthy_hints={"orders": "healthy"}, lock_duration=30.0) as syphon:
        assert (
            syphon.drain_queue(Q, max_wait=0.5).received == 0
        )  # the receiver's link opens, its credit given
        _put(pair.secondary, Q, _backlogged(3))
        assert pair.secondary.wait_until(lambda: not pair.secondary.broker.has_available(Q), timeout=10)
        clock.advance(29)  # prefetched (locked) since then
        outcome = syphon.drain_queue(Q, max_wait=0.5, max_batches=1)
    assert outcome.skipped_lock_expiring == 3 and outcome.forwarded_total == 0, outcome
    assert pair.primary.counters()["messages_received"] == 0
    assert pair.secondary.broker.get_queue(Q).runtime.active_message_count == 3  # locked, not gone


def test_moves_only_to_healthy_entities_or_those_that_answer_a_probe(pair: Any) -> None:
    pair.secondary.broker.create_queue(Q)
    _put(pair.secondary, Q, _backlogged(2))
    with Syphon(_config(pair), healthy_hints={"orders": "healthy"}) as syphon:
        healthy = syphon.drain_queue(Q, max_wait=0.5)
    assert healthy.forwarded == {"orders": 2} and healthy.probes == 0
    assert pair.primary.counters()["management_operations"] == 0  # no probe: the state table says healthy

    _put(pair.secondary, Q, _backlogged(2, "f"))
    pair.primary.faults.refuse_connections()  # failed over, and the primary does not answer a probe
    clock = FakeClock()
    with Syphon(_config(pair), clock=clock, healthy_hints={"orders": "failed_over"}) as syphon:
        refused = syphon.drain_queue(Q, max_wait=0.5)
        assert refused.forwarded_total == 0 and refused.probes == 1 and refused.abandoned == 2
        assert any(e.startswith("orders: probe failed") for e in refused.errors)
        pair.primary.faults.accept_connections()
        clock.advance(syphon.entity_backoff)
        answered = syphon.drain_queue(Q, max_wait=0.5)
    assert answered.forwarded == {"orders": 2} and answered.probes == 1
    assert pair.primary.counters()["management_operations"] >= 2  # the probe: schedule, then cancel
    assert sorted(str(m.message_id) for m in _ids(pair.primary, "orders")) == ["f0", "f1", "m0", "m1"]


def test_locks_lost_during_a_slow_move_lose_nothing_and_duplicate_nothing(pair: Any) -> None:
    """R1, lock expiry during a move: each send to the primary outlasts the backlog lock; the completes fail
    (counted), the messages come back and are moved again; duplicate detection keeps one copy of each."""
    pair.secondary.broker.create_queue(Q, QueueSettings(lock_duration=timedelta(seconds=3)))
    _put(pair.secondary, Q, _backlogged(1, "warm"))
    with Syphon(_config(pair, send_timeout="10s"), healthy_hints={"orders": "healthy"}) as syphon:
        assert syphon.drain_queue(Q, max_wait=0.5).forwarded == {"orders": 1}  # links open before the latency
        _put(pair.secondary, Q, _backlogged(5))
        pair.primary.faults.set_latency(3.5)
        slow = syphon.drain_queue(Q, max_wait=0.5, max_batches=1)
        assert slow.forwarded == {"orders": 5} and slow.settle_failures == 5, slow
        pair.primary.faults.set_latency(0)
        assert pair.secondary.wait_until(
            lambda: pair.secondary.broker.get_queue(Q).runtime.active_message_count == 5, timeout=10
        )  # the lost locks ran out: the messages are back
        again = syphon.drain_queue(Q, max_wait=0.5)
    assert again.forwarded == {"orders": 5} and again.settle_failures == 0, (slow, again)
    got = [str(m.message_id) for m in _ids(pair.primary, "orders")]
    assert sorted(got) == [f"m{i}" for i in range(5)] + ["warm0"]  # once each


def test_primary_flapping_while_the_syphon_moves_loses_and_duplicates_nothing(pair: Any) -> None:
    """R1, primary flapping: connections refused and dropped every other second while the syphon drains; it backs off,
    probes, and goes on until everything is moved: ids compared as sets, one copy of each."""
    pair.secondary.broker.create_queue(Q, QueueSettings(max_delivery_count=2147483647))  # as provisioned
    produced = [f"m{i}" for i in range(200)]
    _put(pair.secondary, Q, _backlogged(200))
    stop = threading.Event()

    def flap() -> None:
        down = False
        while not stop.wait(1.0):  # the fault schedule's pace, not a wait for a result
            down = not down
            if down:
                pair.primary.faults.refuse_connections()
                pair.primary.faults.drop_connections()
            else:
                pair.primary.faults.accept_connections()

    flapper = threading.Thread(target=flap, daemon=True)
    flapper.start()
    moved = 0
    passes = 0
    try:
        with Syphon(
            _config(pair, send_timeout="1s", syphon={"batch_size": 20}), entity_backoff=0.1
        ) as syphon:
            while moved < len(produced) and passes < 2000:
                passes += 1
                moved += syphon.drain_queue(Q, max_wait=0.2).forwarded_total
    finally:
        stop.set()
        flapper.join(5)
        pair.primary.faults.accept_connections()
    assert moved >= len(produced)
    got = [str(m.message_id) for m in _ids(pair.primary, "orders")]
    assert set(got) == set(produced) and len(got) == len(produced)
    assert pair.secondary.broker.get_queue(Q).runtime.total_message_count == 0
