"""The sink's executor side without Spark: a partition task takes its paired sender from the worker's pool
(SENDERS), gives it back after a send, closes it after a failed one or with ``client_cache: false``, and the pool
closes senders left idle for ``idle_timeout``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from servicebus_local.clock import FakeClock
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.failover.outcome import SendOutcome
from spark_sb.message.outbound import OutboundMessage
from spark_sb.sender.pool import SenderPool
from spark_sb.spark import partition as sink_partition
from tests.unit.sender.rig import make_config


class FakeSender:
    """Stands in for a PairedSender: counts the messages of each send, or fails."""

    built: list[FakeSender] = []
    fail = False

    def __init__(self, config: ServiceBusConfig) -> None:
        self.closed = False
        self.sends = 0
        FakeSender.built.append(self)

    def send(self, messages: Iterator[OutboundMessage]) -> SendOutcome:
        n = sum(1 for _ in messages)
        self.sends += 1
        if FakeSender.fail:
            raise ConnectionError("primary and backlog both failed")
        return SendOutcome(sent={"orders": n})

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    clock = FakeClock()
    FakeSender.built = []
    FakeSender.fail = False
    monkeypatch.setattr(sink_partition, "SENDERS", SenderPool(clock=clock))
    monkeypatch.setattr(sink_partition, "PairedSender", FakeSender)
    return clock


ROWS: list[dict[str, Any]] = [{"body": "a"}, {"body": "b"}]


def test_tasks_reuse_the_workers_sender_until_it_idles_past_idle_timeout(clock: FakeClock) -> None:
    config = make_config()
    first = sink_partition.send_partition(config, iter(ROWS))
    sink_partition.send_partition(config, iter(ROWS))
    assert first.rows == 2 and first.outcome.sent == {"orders": 2}
    assert (
        len(FakeSender.built) == 1 and FakeSender.built[0].sends == 2 and sink_partition.SENDERS.idle() == 1
    )
    clock.advance(config.idle_timeout + 1)
    sink_partition.send_partition(config, iter(ROWS))
    assert len(FakeSender.built) == 2 and FakeSender.built[0].closed and not FakeSender.built[1].closed


def test_a_failed_send_closes_its_sender_and_never_gives_it_back(clock: FakeClock) -> None:
    FakeSender.fail = True
    with pytest.raises(ConnectionError):
        sink_partition.send_partition(make_config(), iter(ROWS))
    assert FakeSender.built[0].closed and sink_partition.SENDERS.idle() == 0


def test_without_the_client_cache_each_task_closes_its_sender(clock: FakeClock) -> None:
    sink_partition.send_partition(make_config(client_cache=False), iter(ROWS))
    assert FakeSender.built[0].closed and sink_partition.SENDERS.idle() == 0
