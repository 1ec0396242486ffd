"""The syphon against two local namespaces (real SDK, real TCP): B9, B11, B12."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from azure.servicebus import ServiceBusSubQueue

from servicebus_local.clock import FakeClock
from servicebus_local.model import QueueSettings
from spark_sb.message.backlog import probe_message, to_backlog
from spark_sb.message.outbound import OutboundMessage
from spark_sb.syphon.mover import Syphon
from spark_sb.syphon.rules import EXPIRED_IN_BACKLOG, NOT_A_BACKLOG_MESSAGE

from .rigs import BACKLOG, put_messages, syphon_config, take_messages

pytestmark = pytest.mark.slow


@pytest.fixture
def pair(namespace_pair: Any) -> Any:
    namespace_pair.primary.broker.create_queue("orders", QueueSettings(requires_duplicate_detection=True))
    namespace_pair.primary.broker.create_topic("events")
    namespace_pair.primary.broker.create_subscription("events", "audit")
    for name in BACKLOG:
        namespace_pair.secondary.broker.create_queue(name, QueueSettings(lock_duration=timedelta(seconds=30)))
    return namespace_pair


def test_moves_queues_and_topics_restoring_properties(pair: Any) -> None:
    now = datetime.now(timezone.utc)
    to_queue = [
        OutboundMessage(body=f"q{i}", message_id=f"q{i}", session_id=None, properties={"n": i})
        for i in range(5)
    ]
    to_topic = OutboundMessage(body="t", message_id="t1", subject="evt", time_to_live=timedelta(hours=1))
    put_messages(pair.secondary, BACKLOG[0], [to_backlog(m, "orders", now) for m in to_queue])
    put_messages(pair.secondary, BACKLOG[1], [to_backlog(to_topic, "events", now)])

    with Syphon(syphon_config(pair)) as syphon:
        outcome = syphon.drain_all(max_wait=0.5)
    assert outcome.forwarded == {"orders": 5, "events": 1}
    assert (outcome.abandoned, outcome.expired, outcome.invalid) == (0, 0, 0)

    got = {str(m.message_id): m for m in take_messages(pair.primary, "orders")}
    assert sorted(got) == [f"q{i}" for i in range(5)]
    assert got["q3"].application_properties[b"n"] == 3
    assert not any(k.startswith(b"x-ms-") for m in got.values() for k in m.application_properties)
    (event,) = take_messages(pair.primary, "events", subscription="audit")
    assert event.subject == "evt" and event.time_to_live is not None
    assert timedelta(minutes=59) < event.time_to_live <= timedelta(hours=1)
    for name in BACKLOG:  # completed only after the primary accepted them: nothing left behind
        assert pair.secondary.broker.get_queue(name).runtime.active_message_count == 0


def test_expired_in_backlog_dead_lettered_there_and_strays_too(pair: Any) -> None:
    long_ago = datetime.now(timezone.utc) - timedelta(hours=2)
    expired = to_backlog(
        OutboundMessage(body="old", message_id="old", time_to_live=timedelta(hours=1)), "orders", long_ago
    )
    stray = OutboundMessage(body="not from the sender", message_id="stray")
    probe = replace(probe_message("orders", "ping"), time_to_live=None)  # a probe that reached the backlog
    put_messages(pair.secondary, BACKLOG[0], [expired, stray, probe])

    with Syphon(syphon_config(pair)) as syphon:
        outcome = syphon.drain_all(max_wait=0.5)
    assert (outcome.expired, outcome.invalid, outcome.probes_dropped, outcome.forwarded_total) == (1, 1, 1, 0)
    assert take_messages(pair.primary, "orders") == []
    dead = {
        str(m.message_id): m
        for m in take_messages(pair.secondary, BACKLOG[0], ServiceBusSubQueue.DEAD_LETTER)
    }
    assert sorted(dead) == ["old", "stray"]
    assert dead["old"].dead_letter_reason == EXPIRED_IN_BACKLOG
    assert dead["stray"].dead_letter_reason == NOT_A_BACKLOG_MESSAGE


def test_failing_primary_abandons_backs_off_and_loses_nothing(pair: Any) -> None:
    now = datetime.now(timezone.utc)
    put_messages(
        pair.secondary,
        BACKLOG[0],
        [to_backlog(OutboundMessage(body=f"m{i}", message_id=f"m{i}"), "orders", now) for i in range(4)],
    )
    clock = FakeClock()
    pair.primary.faults.fail_sends("orders", "com.microsoft:entity-disabled")
    with Syphon(syphon_config(pair), clock=clock, entity_backoff=30) as syphon:
        first = syphon.drain_queue(BACKLOG[0], max_wait=0.5)
        assert first.forwarded_total == 0 and first.abandoned == 4
        assert pair.secondary.broker.get_queue(BACKLOG[0]).runtime.active_message_count == 4
        pair.primary.faults.clear()
        backing_off = syphon.drain_queue(BACKLOG[0], max_wait=0.5)  # still inside the back-off window
        assert backing_off.forwarded_total == 0 and backing_off.abandoned == 4
        clock.advance(30)
        second = syphon.drain_queue(BACKLOG[0], max_wait=0.5)
    assert second.forwarded == {"orders": 4}
    assert sorted(str(m.message_id) for m in take_messages(pair.primary, "orders")) == [
        f"m{i}" for i in range(4)
    ]


def test_a_primary_namespace_that_refuses_costs_one_probe_not_one_per_entity(pair: Any) -> None:
    """A backlog holding messages for 30 entities while the primary refuses connections: the syphon probes once,
    backs every entity off together, abandons the messages (nothing lost), and moves them all once it answers."""
    entities = [f"tenant-{i:02d}" for i in range(30)]
    for e in entities:
        pair.primary.broker.create_queue(e)
    now = datetime.now(timezone.utc)
    put_messages(
        pair.secondary,
        BACKLOG[0],
        [to_backlog(OutboundMessage(body=e, message_id=f"id-{e}"), e, now) for e in entities],
    )
    clock = FakeClock()
    pair.primary.faults.refuse_connections()
    with Syphon(syphon_config(pair), clock=clock, entity_backoff=30, record_ids=True) as syphon:
        started = time.monotonic()
        outage = syphon.drain_queue(BACKLOG[0], max_wait=0.5)
        took = time.monotonic() - started
        assert outage.probes == 1, outage.errors
        assert outage.forwarded_total == 0 and outage.abandoned == 30
        assert took < 5.0
        pair.primary.faults.accept_connections()
        clock.advance(30)
        # a loaded machine can be slow to hand the 30 back
        healed = syphon.drain_queue(BACKLOG[0], max_wait=2.0)
    assert healed.forwarded_total == 30 and healed.probes <= 30
    assert set(healed.moved_ids) == {(e, f"id-{e}") for e in entities}  # ids compared as sets
    assert [pair.primary.broker.counts(e).active_message_count for e in entities] == [1] * 30


def test_replay_after_a_lost_complete_is_harmless_with_duplicate_detection(pair: Any) -> None:
    now = datetime.now(timezone.utc)
    msg = to_backlog(OutboundMessage(body="once", message_id="once"), "orders", now)
    put_messages(pair.secondary, BACKLOG[0], [msg])
    put_messages(
        pair.secondary, BACKLOG[1], [msg]
    )  # the same message reaches the backlog twice (a task retry)
    with Syphon(syphon_config(pair)) as syphon:
        outcome = syphon.drain_all(max_wait=0.5)
    assert outcome.forwarded == {"orders": 2}
    assert [str(m.message_id) for m in take_messages(pair.primary, "orders")] == [
        "once"
    ]  # duplicate detection


def test_a_blackholed_primary_never_hangs_the_syphon(pair: Any) -> None:
    """The primary accepts TCP and never answers SASL (the SDK would wait forever): each send to it ends at
    send_timeout, the messages are abandoned (nothing lost), and they move once it answers again."""
    now = datetime.now(timezone.utc)
    put_messages(
        pair.secondary,
        BACKLOG[0],
        [to_backlog(OutboundMessage(body=f"m{i}", message_id=f"m{i}"), "orders", now) for i in range(3)],
    )
    clock = FakeClock()
    pair.primary.faults.stall(True, answer_sasl=False)
    config = syphon_config(pair).with_overrides(send_timeout=1.0)
    with Syphon(config, clock=clock, entity_backoff=30) as syphon:
        started = time.monotonic()
        stalled = syphon.drain_queue(BACKLOG[0], max_wait=0.5)
        assert time.monotonic() - started < 10
        assert stalled.forwarded_total == 0 and stalled.abandoned == 3
        # its probe or send ended at a deadline: the lane's (DeadlineExceeded) or, on a loaded machine, the opening
        # watchdog's (a TimeoutError) - both end the wait on the stalled handshake
        assert any(
            e.endswith(("failed: DeadlineExceeded", "failed: TimeoutError")) for e in stalled.errors
        ), stalled.errors
        pair.primary.faults.stall(False)
        clock.advance(30)
        moved = syphon.drain_queue(BACKLOG[0], max_wait=0.5)
    assert moved.forwarded == {"orders": 3}
    assert sorted(str(m.message_id) for m in take_messages(pair.primary, "orders")) == ["m0", "m1", "m2"]


def test_the_receivers_of_every_backlog_queue_share_one_connection(namespace_pair: Any) -> None:
    """SPEC F2 (issue 20 item 6): a syphon draining 8 backlog queues and their dead-letter queues opens one
    connection to the secondary for all 16 receivers - links on it, in one lane - not one per receiver."""
    queues = [f"primary/x-servicebus-transfer/{i}" for i in range(8)]
    namespace_pair.primary.broker.create_queue("orders", QueueSettings(requires_duplicate_detection=True))
    for name in queues:
        namespace_pair.secondary.broker.create_queue(name, QueueSettings(lock_duration=timedelta(seconds=30)))
    now = datetime.now(timezone.utc)
    sent = [OutboundMessage(body=f"m{i}", message_id=f"m{i}") for i in range(16)]
    for i, name in enumerate(queues):
        put_messages(
            namespace_pair.secondary, name, [to_backlog(m, "orders", now) for m in sent[2 * i : 2 * i + 2]]
        )
    config = replace(syphon_config(namespace_pair), backlog_queue_count=8)
    before = namespace_pair.secondary.counters()["connections_opened"]
    with Syphon(config) as syphon:
        outcome = syphon.drain_all(max_wait=0.3, dead_letter=True)
        assert outcome.forwarded == {"orders": 16} and not outcome.errors
        assert namespace_pair.secondary.counters()["connections_opened"] - before == 1
        # and no thread per receiver (the SDK's keep-alive readers): the lane's one thread tends the connection
        assert not [t.name for t in threading.enumerate() if "keep_alive" in t.name]
    assert sorted(str(m.message_id) for m in take_messages(namespace_pair.primary, "orders")) == sorted(
        m.message_id or "" for m in sent
    )
