"""The syphon's receivers against a local namespace (real SDK, real TCP; SPEC F2, B11): what the unit tests stand in
for - the SDK's receiver links opened on one shared connection, settled there, dropped with it - done for real."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient

from servicebus_local.model import QueueSettings
from servicebus_local.server import LocalNamespace
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.message.outbound import OutboundMessage
from spark_sb.syphon.receivers import Held, complete, settle
from spark_sb.syphon.rules import SyphonOutcome
from spark_sb.wire.lane import Lane
from spark_sb.wire.receivers import ReceiverLane, SharedReceivers, receivers_lane

QUEUES = ["primary/x-servicebus-transfer/0", "primary/x-servicebus-transfer/1"]
LOCK = timedelta(seconds=2)


@pytest.fixture
def secondary() -> Iterator[LocalNamespace]:
    ns = LocalNamespace("secondary").start()
    try:
        for name in QUEUES:
            ns.broker.create_queue(name, QueueSettings(lock_duration=LOCK))
        yield ns
    finally:
        ns.stop()


@pytest.fixture
def lane(secondary: LocalNamespace) -> Iterator[Lane[SharedReceivers]]:
    unused_primary = re.sub(r"Endpoint=sb://[^;]+", "Endpoint=sb://127.0.0.1:1", secondary.connection_string)
    config = ServiceBusConfig.from_dict(
        {
            "primary": {"connection_string": unused_primary, "namespace_name": "primary"},
            "secondary": {"connection_string": secondary.connection_string},
            "backlog_queue_count": 2,
            "send_timeout": "5s",
        }
    )
    shared = receivers_lane(config)
    try:
        yield shared
    finally:
        shared.close()


def _put(ns: LocalNamespace, queue: str, ids: list[str]) -> None:
    with (
        ServiceBusClient.from_connection_string(ns.connection_string) as client,
        client.get_queue_sender(queue) as s,
    ):
        s.send_messages([OutboundMessage(body=i, message_id=i).to_sdk() for i in ids])


def _receive(lane: ReceiverLane, count: int = 10, wait: float = 0.5) -> list[Any]:
    return lane.call(lambda r: r.receiver.receive_messages(max_message_count=count, max_wait_time=wait), 15.0)


def _await(what: str, check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_every_queue_and_dead_letter_queue_is_received_on_one_connection(
    secondary: LocalNamespace, lane: Lane[SharedReceivers]
) -> None:
    _put(secondary, QUEUES[0], ["a1", "a2"])
    _put(secondary, QUEUES[1], ["b1"])
    _await("the senders' connections closed", lambda: secondary.connection_count == 0)
    receivers = [ReceiverLane(lane, q, dl) for q in QUEUES for dl in (False, True)]
    got = {(r.queue, r.dead_letter): sorted(str(m.message_id) for m in _receive(r)) for r in receivers}
    assert got == {
        (QUEUES[0], False): ["a1", "a2"],
        (QUEUES[0], True): [],
        (QUEUES[1], False): ["b1"],
        (QUEUES[1], True): [],
    }
    ctx = lane.context()
    assert ctx is not None and ctx.opened == 1 and len(ctx.receivers) == 4
    assert secondary.connection_count == 1  # four receiver links, one connection (F2)


def test_held_messages_are_completed_there_and_after_a_reset_counted_and_redelivered(
    secondary: LocalNamespace, lane: Lane[SharedReceivers]
) -> None:
    _put(secondary, QUEUES[0], ["m1", "m2", "m3"])
    receiver = ReceiverLane(lane, QUEUES[0], False)
    messages = sorted(_receive(receiver, count=3), key=lambda m: str(m.message_id))
    assert [str(m.message_id) for m in messages] == ["m1", "m2", "m3"]
    held = [Held(m, receiver.generation) for m in messages]
    outcome = SyphonOutcome()
    settle(receiver, held[:2], complete, outcome, 5.0)
    assert outcome.settle_failures == 0
    receiver.reset("a test")  # the connection goes, and m3's lock with it
    settle(receiver, held[2:], complete, outcome, 5.0)
    assert outcome.settle_failures == 1  # counted, never raised, never sent down another connection
    _await("the old connection closed", lambda: secondary.connection_count == 0)
    again = _receive(receiver, wait=LOCK.total_seconds() + 3)
    assert [str(m.message_id) for m in again] == ["m3"]  # redelivered; the completed two are gone for good
    assert again[0].delivery_count >= 1
    ctx = lane.context()
    assert (
        ctx is not None and ctx.opened == 1 and secondary.connection_count == 1
    )  # a new context, one connection
