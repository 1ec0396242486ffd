"""The syphon's verdict on a wrong destination (issue 29 item 5, syphon side): against two local namespaces (real
SDK, real TCP), a backlog message whose primary entity does not exist is dead-lettered in the backlog after
``syphon.max_attempts`` deliveries, with its reason, while the messages of existing entities move; an entity that
is merely down (disabled, refused connections) never has its messages dead-lettered, however many passes."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from azure.servicebus import ServiceBusSubQueue

from servicebus_local.clock import FakeClock
from servicebus_local.model import QueueSettings
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.message.backlog import to_backlog
from spark_sb.message.outbound import OutboundMessage
from spark_sb.syphon.mover import Syphon
from spark_sb.syphon.rules import DESTINATION_NOT_FOUND

from .rigs import BACKLOG, put_messages, syphon_config, take_messages

pytestmark = pytest.mark.slow

BACKOFF = 30.0


@pytest.fixture
def pair(namespace_pair: Any) -> Any:
    """The primary has ``orders``; the backlog queues have short locks (an abandoned message is redelivered at
    once anyway: each pass is one delivery or more)."""
    namespace_pair.primary.broker.create_queue("orders", QueueSettings(requires_duplicate_detection=True))
    for name in BACKLOG:
        namespace_pair.secondary.broker.create_queue(name, QueueSettings(lock_duration=timedelta(seconds=10)))
    return namespace_pair


def _attempts(pair: Any, max_attempts: int) -> ServiceBusConfig:
    return replace(syphon_config(pair), syphon_max_attempts=max_attempts)


def _backlog(entity: str, ids: list[str]) -> list[OutboundMessage]:
    now = datetime.now(timezone.utc)
    return [to_backlog(OutboundMessage(body=i, message_id=i), entity, now) for i in ids]


def _depth(pair: Any, queue: str) -> tuple[int, int]:
    runtime = pair.secondary.broker.get_queue(queue).runtime
    return runtime.active_message_count, runtime.dead_letter_message_count


def test_a_message_for_an_entity_that_does_not_exist_is_dead_lettered_after_max_attempts(
    pair: Any, caplog: pytest.LogCaptureFixture
) -> None:
    put_messages(
        pair.secondary, BACKLOG[0], _backlog("orderz", ["typo-1", "typo-2"]) + _backlog("orders", ["ok-1"])
    )
    clock = FakeClock()
    caplog.set_level(logging.WARNING, logger="spark_sb.syphon.mover")
    with Syphon(_attempts(pair, 3), clock=clock, entity_backoff=BACKOFF) as syphon:
        total = syphon.drain_queue(BACKLOG[0], max_wait=0.5)
        assert total.forwarded == {"orders": 1}  # the existing entity's message moved at once
        passes = 1
        while total.undeliverable < 2 and passes < 10:
            clock.advance(BACKOFF)  # past the back-off: the entity is tried again at the next pass
            total = total.merge(syphon.drain_queue(BACKLOG[0], max_wait=0.5))
            passes += 1
        # Abandoned at each of the first max_attempts - 1 deliveries (tried again later), dead-lettered at the
        # third (max_attempts 3), when the send met not-found: counted, never abandoned again.
        assert total.abandoned_by_entity == {"orderz": 2 * 2}
        assert (total.undeliverable, total.undeliverable_by_entity) == (2, {"orderz": 2})
        assert _depth(pair, BACKLOG[0]) == (0, 2)  # the backlog is empty: nothing abandoned forever
        after = syphon.drain_queue(BACKLOG[0], max_wait=0.5)
        assert (after.received, after.abandoned) == (0, 0)

    assert [str(m.message_id) for m in take_messages(pair.primary, "orders")] == ["ok-1"]
    dead = take_messages(pair.secondary, BACKLOG[0], ServiceBusSubQueue.DEAD_LETTER)
    assert sorted(str(m.message_id) for m in dead) == ["typo-1", "typo-2"]
    for m in dead:
        assert m.dead_letter_reason == DESTINATION_NOT_FOUND
        assert "'orderz'" in m.dead_letter_error_description
        assert syphon_config(pair).primary.endpoint_host() in m.dead_letter_error_description  # the namespace
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("orderz does not exist" in w and "dead-lettered" in w for w in warnings), warnings


def test_a_dead_letter_pass_leaves_destination_not_found_parked(pair: Any) -> None:
    """What the syphon dead-lettered for a missing destination stays in the backlog's dead-letter queue (parked,
    with its reason) when the dead-letter queue is drained: never forwarded, never retried in a loop."""
    put_messages(pair.secondary, BACKLOG[0], _backlog("orderz", ["typo-1"]))
    with Syphon(_attempts(pair, 1), clock=FakeClock(), entity_backoff=BACKOFF) as syphon:
        first = syphon.drain_queue(BACKLOG[0], max_wait=0.5)
        assert first.undeliverable == 1  # max_attempts 1: the first not-found answer
        dlq = syphon.drain_queue(BACKLOG[0], max_wait=0.5, dead_letter=True)
    assert (dlq.parked, dlq.forwarded_total, dlq.undeliverable) == (1, 0, 0)
    assert _depth(pair, BACKLOG[0]) == (0, 1)


@pytest.mark.parametrize("fault", ["entity_disabled", "refused"])
def test_an_entity_that_is_down_is_never_dead_lettered_however_many_passes(pair: Any, fault: str) -> None:
    put_messages(pair.secondary, BACKLOG[0], _backlog("orders", ["m-1", "m-2"]))
    clock = FakeClock()
    if fault == "refused":
        pair.primary.faults.refuse_connections()
    else:
        pair.primary.faults.fail_sends("orders", "com.microsoft:entity-disabled")
    with Syphon(_attempts(pair, 2), clock=clock, entity_backoff=BACKOFF) as syphon:
        for _ in range(
            5
        ):  # well past max_attempts (2): every delivery is due for a verdict from the third on
            outage = syphon.drain_queue(BACKLOG[0], max_wait=0.5)
            assert (outage.forwarded_total, outage.undeliverable, outage.abandoned) == (0, 0, 2), (
                outage.errors
            )
            clock.advance(BACKOFF)
        assert _depth(pair, BACKLOG[0]) == (2, 0)
        pair.primary.faults.clear()
        healed = syphon.drain_queue(BACKLOG[0], max_wait=0.5)
    assert (healed.forwarded, healed.undeliverable) == ({"orders": 2}, 0)
    assert sorted(str(m.message_id) for m in take_messages(pair.primary, "orders")) == ["m-1", "m-2"]
    assert _depth(pair, BACKLOG[0]) == (0, 0)
