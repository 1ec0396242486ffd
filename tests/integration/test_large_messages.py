"""Premium large messages (issue 50 item 1, SPEC B13, E9): against two Premium local namespaces (real SDK, real
TCP), whose sender links advertise 1 MB batches and the entity's own message limit, the paired sender sends
messages over the batch limit alone - 1.5 MB, 5 MB and 20 MB among small ones - to a healthy primary, into the
backlog during an outage, and the syphon moves them back; a message the primary can never take is dead-lettered
in the backlog with reason ``MessageTooLargeForDestination`` while the rest of its entity moves."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import replace
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusSubQueue

from servicebus_local.clock import FakeClock
from servicebus_local.model import QueueSettings
from spark_sb.message.backlog import to_backlog
from spark_sb.message.outbound import OutboundMessage
from spark_sb.sender.paired import PairedSender
from spark_sb.syphon.mover import Syphon
from spark_sb.syphon.rules import TOO_LARGE_FOR_DESTINATION

from .rigs import BACKLOG, ENTITY, config_for, syphon_config, take_messages

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("local_namespace_tier", ["premium"])]

MB = 1_000_000
#: The primary's ``orders`` takes 20 MiB messages; the backlog queues the same plus 64 KB (what provision makes).
ORDERS_KB = 20_480
SIZES = (int(1.5 * MB), int(1.5 * MB), int(1.5 * MB), 5 * MB, 20 * MB)


@pytest.fixture
def pair(namespace_pair: Any) -> Any:
    namespace_pair.primary.broker.create_queue(
        ENTITY, QueueSettings(max_message_size_in_kilobytes=ORDERS_KB, requires_duplicate_detection=True)
    )
    namespace_pair.primary.broker.create_queue("small", QueueSettings())  # Premium's default: 1,024 KB
    for name in BACKLOG:
        namespace_pair.secondary.broker.create_queue(
            name, QueueSettings(max_message_size_in_kilobytes=ORDERS_KB + 64)
        )
    return namespace_pair


def _mix() -> list[OutboundMessage]:
    """50 small messages with the large ones among them (each body its own bytes, to tell them apart)."""
    out = [OutboundMessage(body=f"small-{i}".encode() * 10, message_id=f"s-{i}") for i in range(50)]
    for k, size in enumerate(SIZES):
        body = bytes([65 + k]) * size
        out.insert(10 * k + 5, OutboundMessage(body=body, message_id=f"large-{k}"))
    return out


def _digest(body: Any) -> str:
    data = body if isinstance(body, bytes) else b"".join(body)
    return hashlib.sha256(data).hexdigest()


def _expected() -> dict[str, str]:
    return {str(m.message_id): _digest(m.body) for m in _mix()}


def _received(ns: Any, entity: str) -> dict[str, str]:
    return {str(m.message_id): _digest(m.body) for m in take_messages(ns, entity)}


def _config(pair: Any, interval: float) -> Any:
    return replace(config_for(pair.primary, pair.secondary, interval), max_message_size=20 * 1024 * 1024)


def test_large_messages_reach_a_healthy_primary_alone_and_in_order(pair: Any) -> None:
    with PairedSender(_config(pair, 60.0)) as sender:
        out = sender.send(_mix())
    assert out.rejects == () and out.sent == {ENTITY: len(_mix())}
    got = take_messages(pair.primary, ENTITY)
    assert [str(m.message_id) for m in got] == [str(m.message_id) for m in _mix()]  # one sender: in order
    assert {str(m.message_id): _digest(m.body) for m in got} == _expected()


def test_large_messages_are_diverted_during_an_outage_and_the_syphon_moves_them_back(pair: Any) -> None:
    pair.primary.faults.refuse_connections()
    with PairedSender(_config(pair, 0.0)) as sender:
        out = sender.send(_mix())
    assert out.rejects == () and out.diverted_by_entity == {ENTITY: len(_mix())}
    held = sum(pair.secondary.broker.counts(q).active_message_count for q in BACKLOG)
    assert held == len(_mix())
    pair.primary.faults.clear()
    syphon_cfg = replace(syphon_config(pair), max_message_size=20 * 1024 * 1024)
    with Syphon(syphon_cfg, clock=FakeClock()) as syphon:
        moved = [syphon.drain_queue(q, max_wait=0.5) for q in BACKLOG]
    assert sum(o.forwarded_total for o in moved) == len(_mix()), [o.errors for o in moved]
    assert _received(pair.primary, ENTITY) == _expected()


@pytest.mark.parametrize("known", [True, False], ids=["link-limit-known", "refused"])
def test_the_syphon_dead_letters_a_message_its_primary_can_never_take_and_moves_the_rest(
    pair: Any, caplog: pytest.LogCaptureFixture, known: bool
) -> None:
    """``small`` takes 1,024 KB: a 5 MB backlog message for it is dead-lettered with its reason and a description
    naming the entity (and its limit, once its link said it; first of all, the primary's refusal says it); the
    messages before and after it, and ``orders``' 5 MB one, move."""
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc)
    before = to_backlog(OutboundMessage(body=b"a" * 100, message_id="before"), "small", now)
    large = to_backlog(OutboundMessage(body=b"b" * (5 * MB), message_id="too-large"), "small", now)
    backlog = [before, large] if known else [large, before]
    backlog += [
        to_backlog(OutboundMessage(body=b"c" * 100, message_id="after"), "small", now),
        to_backlog(OutboundMessage(body=b"d" * (5 * MB), message_id="fits"), ENTITY, now),
    ]
    with (
        ServiceBusClient.from_connection_string(pair.secondary.connection_string) as client,
        client.get_queue_sender(BACKLOG[0]) as sender,
    ):
        for m in backlog:
            sender.send_messages(m.to_sdk())  # one by one, as the SDK sends a single message
    caplog.set_level(logging.WARNING, logger="spark_sb.syphon.mover")
    syphon_cfg = replace(syphon_config(pair), max_message_size=20 * 1024 * 1024)
    with Syphon(syphon_cfg, clock=FakeClock()) as syphon:
        first = syphon.drain_queue(BACKLOG[0], max_wait=0.5)
        again = syphon.drain_queue(BACKLOG[0], max_wait=0.5)  # nothing left to try: no loop on it
    assert first.forwarded == {"small": 2, ENTITY: 1}, first.errors
    assert (first.undeliverable, first.undeliverable_by_entity) == (1, {"small": 1})
    assert (again.received, again.abandoned) == (0, 0)
    assert sorted(str(m.message_id) for m in take_messages(pair.primary, "small")) == ["after", "before"]
    assert [str(m.message_id) for m in take_messages(pair.primary, ENTITY)] == ["fits"]
    (dead,) = take_messages(pair.secondary, BACKLOG[0], ServiceBusSubQueue.DEAD_LETTER)
    assert str(dead.message_id) == "too-large" and dead.dead_letter_reason == TOO_LARGE_FOR_DESTINATION
    description = dead.dead_letter_error_description
    assert "'small'" in description and str(5 * MB) in description
    assert ("up to 1048576 bytes" if known else "refused it as too large") in description
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("larger than it takes" in w and TOO_LARGE_FOR_DESTINATION in w for w in warnings), warnings
