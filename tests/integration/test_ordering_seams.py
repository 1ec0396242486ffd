"""The ordered syphon at the seams between Python workers (SPEC O6, O7; issue 47 items 3 and 6), against two local
namespaces (real SDK, real TCP): every worker has its own Syphon; the backlog queue is the only truth they share.
Worker A's receive locked a line's head and never settled it (its answer lost, or its task killed: nobody's memory
holds that lock); worker B must neither move what follows the head nor acknowledge the line's return marker
until the head is back and moved - at ce9de6a the primary's session receiver got [s-2, s-1]."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient

from harness.queues import take_ids
from servicebus_local.model import QueueSettings
from spark_sb.failover.ordering import return_marker
from spark_sb.message.backlog import to_backlog
from spark_sb.message.outbound import OutboundMessage
from spark_sb.syphon.mover import Syphon

from .rigs import BACKLOG, put_messages, syphon_config

pytestmark = pytest.mark.slow

QUEUE = BACKLOG[0]


class Acks:
    """Where B acknowledges the markers it passes."""

    def __init__(self) -> None:
        self.passed: list[tuple[str, str, str]] = []

    def acknowledged(self, entity: str, session: str, marker: str) -> None:
        self.passed.append((entity, session, marker))


@pytest.fixture
def pair(namespace_pair: Any) -> Any:
    namespace_pair.primary.broker.create_queue(
        "orders", QueueSettings(requires_session=True, requires_duplicate_detection=True)
    )
    for name in BACKLOG:  # the service's default delivery count: churn would dead-letter (item 6)
        namespace_pair.secondary.broker.create_queue(
            name, QueueSettings(lock_duration=timedelta(seconds=30), max_delivery_count=10)
        )
    return namespace_pair


def session_ids(pair: Any, session: str) -> list[str]:
    """What a session receiver on the primary gets, in order."""
    return take_ids(pair.primary.connection_string, "orders", session_id=session, batch=50)


def test_a_worker_does_not_move_a_line_past_a_head_another_worker_holds_locked(pair: Any) -> None:
    now = datetime.now(timezone.utc)
    line = [OutboundMessage(body=b"x", message_id=f"s-{i}", session_id="s") for i in (1, 2)]
    marker = return_marker("orders", "s", "m1")
    put_messages(pair.secondary, QUEUE, [to_backlog(m, "orders", now) for m in [*line, marker]])
    config = replace(syphon_config(pair), ordering="session")
    acks = Acks()
    with (
        ServiceBusClient.from_connection_string(pair.secondary.connection_string) as client,
        client.get_queue_receiver(QUEUE) as worker_a,  # A: received s-1, then its answer was lost
    ):
        (head,) = worker_a.receive_messages(max_message_count=1, max_wait_time=5)
        assert head.message_id == "s-1"
        with Syphon(config, backlog_queues=[QUEUE], healthy_hints={"orders": "healthy"}, acks=acks) as b:
            for _ in range(3):  # B's passes while s-1 is locked: nothing of s moves, the marker waits
                out = b.drain_queue(QUEUE, max_wait=0.5)
                assert out.forwarded_total == 0 and out.markers == 0, out
            assert acks.passed == []
            worker_a.abandon_message(head)  # the head is back (its lock ran out, or A's abandon got through)
            out = b.drain_queue(QUEUE, max_wait=0.5)
    assert out.forwarded == {"orders": 2} and out.markers == 1, out
    assert acks.passed == [("orders", "s", "m1")]
    assert session_ids(pair, "s") == ["s-1", "s-2"]
    counts = pair.secondary.broker.counts(QUEUE)
    assert counts.active_message_count == 0 and counts.dead_letter_message_count == 0
