"""The rig of the paired sender's unit tests: a config, a sender over the fake transport and a fake clock, messages."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from azure.servicebus import exceptions as sbe

from spark_sb.config.namespace import NamespaceConfig
from spark_sb.config.secret import Secret
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.clock import FakeClock
from spark_sb.failover.records import EntityState, StateTransition
from spark_sb.failover.registry import FailoverRegistry
from spark_sb.message.outbound import OutboundMessage
from spark_sb.sender.paired import PairedSender
from spark_sb.wire.transport import SECONDARY
from tests.unit.fakes import FakeTransport


def make_config(**overrides: Any) -> ServiceBusConfig:
    def ns(host: str) -> NamespaceConfig:
        return NamespaceConfig(
            connection_string=Secret(
                f"Endpoint=sb://{host}/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={SECRET}"
            )
        )

    base = ServiceBusConfig(
        primary=ns("primary.servicebus.windows.net"),
        secondary=ns("secondary.servicebus.windows.net"),
        entity="orders",
        backlog_queue_count=3,
        failover_interval=60.0,
        ping_primary_interval=30.0,
        backlog_retry_interval=300.0,
    )
    return replace(base, **overrides)


class Rig:
    """A sender wired to a fake transport, a fake clock and a fresh registry."""

    def __init__(
        self,
        registry: FailoverRegistry | None = None,
        transport: FakeTransport | None = None,
        **cfg: Any,
    ) -> None:
        self.clock = registry.clock if registry is not None else FakeClock()
        assert isinstance(self.clock, FakeClock)
        self.registry = registry or FailoverRegistry(self.clock)
        self.transport = transport or FakeTransport(self.clock, max_batch=1000, op_seconds=1.0)
        self.transitions: list[StateTransition] = []
        self.config = make_config(**cfg)
        self.sender = PairedSender(
            self.config,
            transport=self.transport,
            clock=self.clock,
            registry=self.registry,
            listener=self.transitions.append,
            rng=random.Random(42),
        )

    def backlog(self) -> list[OutboundMessage]:
        return [m for q in QUEUES for m in self.transport.at(SECONDARY, q)]

    def moves(self) -> list[tuple[EntityState, EntityState]]:
        return [(t.from_state, t.to_state) for t in self.transitions]


def msgs(
    n: int, prefix: str = "m", entity: str | None = None, size: int = 50, **kw: Any
) -> list[OutboundMessage]:
    return [
        OutboundMessage(body=b"x" * size, entity=entity, message_id=f"{prefix}{i}", **kw) for i in range(n)
    ]


def conn_error() -> BaseException:
    return sbe.ServiceBusConnectionError(message="connection refused")


SECRET = "c2VjcmV0LWtleS1kby1ub3QtbG9n"


QUEUES = [f"primary/x-servicebus-transfer/{i}" for i in range(3)]
