"""The rig of the paired sender's unit tests: a config, a sender over the fake transport and a fake clock, messages."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from azure.servicebus import exceptions as sbe

from servicebus_local.clock import FakeClock
from spark_sb.config.namespace import NamespaceConfig
from spark_sb.config.secret import Secret
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.failover.decisions import RetryPolicy
from spark_sb.failover.ordering import NONE
from spark_sb.failover.records import EntityState, Listener, StateTransition, log_transition
from spark_sb.failover.registry import FailoverRegistry
from spark_sb.failover.rotation import BacklogChooser
from spark_sb.message.outbound import OutboundMessage
from spark_sb.sender.context import SendContext
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


def make_context(
    transport: FakeTransport | None = None,
    *,
    registry: FailoverRegistry | None = None,
    listener: Listener = log_transition,
    given: bool = True,
    **cfg: Any,
) -> SendContext:
    """A sender's context alone (no PairedSender): a fake clock, a fresh registry, the fake transport (``given``
    False: none given, an SDK transport would be built on first use), the rig's queues under a seeded choice."""
    registry = registry or FailoverRegistry(FakeClock())
    clock = registry.clock
    assert isinstance(clock, FakeClock)
    config = make_config(**cfg)
    secondary_key = "secondary-key" if config.secondary is not None else ""
    if transport is None and given:
        transport = FakeTransport(clock, max_batch=1000, op_seconds=1.0)
    return SendContext(
        config=config,
        clock=clock,
        policy=RetryPolicy(backlog_budget=float(config.send_timeout)),
        registry=registry,
        chooser=BacklogChooser(
            QUEUES if config.secondary is not None else [],
            registry.rotation,
            secondary_key,
            selection=config.backlog_selection,
            rng=random.Random(42),
        ),
        primary_key="primary-key",
        secondary_key=secondary_key,
        listener=listener,
        probe_budget=5.0,
        transport_given=transport,
        book=registry.sessions("primary-key") if config.ordering != NONE else None,
    )


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
