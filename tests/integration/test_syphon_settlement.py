"""The syphon settles on the link that received (SPEC E8, issue 33 item 2), with the real SDK over real TCP: against
a strict local namespace (``strict_settlement``: update-disposition over ``$management`` only for messages received
by sequence number), every backlog message is completed on its receiving link, several in one round trip, and a
completion the namespace refuses is reported, never settled elsewhere."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from azure.servicebus import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceivedMessage,
    ServiceBusReceiver,
)

from servicebus_local.broker import Outcome
from servicebus_local.model import QueueSettings
from servicebus_local.server import LocalNamespace
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.message.backlog import to_backlog
from spark_sb.message.outbound import OutboundMessage
from spark_sb.syphon.mover import Syphon
from spark_sb.syphon.receivers import Held, complete_on_link

pytestmark = pytest.mark.slow

BACKLOG = ["primary/x-servicebus-transfer/0", "primary/x-servicebus-transfer/1"]


def _receive(receiver: ServiceBusReceiver, n: int, timeout: float = 5.0) -> list[ServiceBusReceivedMessage]:
    out: list[ServiceBusReceivedMessage] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out += receiver.receive_messages(max_message_count=n - len(out), max_wait_time=0.5)
    return out


def test_the_syphon_completes_every_backlog_message_on_its_receiving_link(namespace_pair: Any) -> None:
    primary, secondary = namespace_pair.primary, namespace_pair.secondary
    secondary.broker.strict_settlement = True
    primary.broker.create_queue("orders", QueueSettings(requires_duplicate_detection=True))
    for name in BACKLOG:
        secondary.broker.create_queue(name, QueueSettings(lock_duration=timedelta(seconds=30)))
    now = datetime.now(timezone.utc)
    sent = [OutboundMessage(body=f"m{i}", message_id=f"m{i}") for i in range(12)]
    with (
        ServiceBusClient.from_connection_string(secondary.connection_string) as client,
        client.get_queue_sender(BACKLOG[0]) as sender,
    ):
        sender.send_messages([to_backlog(m, "orders", now).to_sdk() for m in sent])
    config = ServiceBusConfig.from_dict(
        {
            "primary": {"connection_string": primary.connection_string, "namespace_name": "primary"},
            "secondary": {"connection_string": secondary.connection_string},
            "backlog_queue_count": 2,
            "send_timeout": "5s",
            "retry": {"total": 0, "backoff_factor": 0.05, "backoff_max": 0.1},
        }
    )
    with Syphon(config) as syphon:
        outcome = syphon.drain_all(max_wait=0.5)
    assert outcome.forwarded == {"orders": 12}
    assert outcome.settle_failures == 0
    counters = secondary.counters()
    assert counters.get("management:update-disposition", 0) == 0  # nothing settled over $management
    assert counters["settlements"] >= 12  # on the receiver links
    for name in BACKLOG:  # every completion applied: nothing comes back when locks run out
        assert secondary.broker.get_queue(name).runtime.active_message_count == 0
    assert primary.broker.get_queue("orders").runtime.active_message_count == 12


def test_completing_on_the_link_reports_what_the_namespace_refused() -> None:
    """Three messages completed in one round trip on their link; one's lock was settled behind the receiver's back,
    so the namespace refuses that disposition (lock lost): it is reported, and nothing goes to ``$management``."""
    with (
        LocalNamespace("strict", queues=["q"], strict_settlement=True) as ns,
        ServiceBusClient.from_connection_string(ns.connection_string, retry_total=0) as client,
    ):
        with client.get_queue_sender("q") as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(3)])
        with client.get_queue_receiver("q") as receiver:
            msgs = _receive(receiver, 3)
            assert len(msgs) == 3
            ns.broker.settle("q", msgs[1]._delivery_tag, Outcome.COMPLETE)  # noqa: SLF001 - in process
            items = [Held(m, 0) for m in msgs]
            not_done = complete_on_link(receiver, items, time.monotonic() + 5.0)
            assert not_done == [items[1]]
            assert [m._settled for m in msgs] == [True, False, True]  # noqa: SLF001
            assert receiver.receive_messages(max_message_count=3, max_wait_time=0.3) == []
        assert ns.counters().get("management:update-disposition", 0) == 0
        assert ns.broker.get_queue("q").runtime.active_message_count == 0
