"""An outage harness shared by the outage integration tests and ``bench/bench_failover.py``.

A :class:`SendLoop` runs a :class:`~spark_sb.sender.paired.PairedSender` in a thread, sending batches of uniquely
numbered messages back to back and recording, for each ``send`` call, when it started and returned and how many
messages went to the primary and to the backlog. :data:`SHAPES` are the outage shapes the local namespace can
make (refused, dropped, stalled before and after SASL, DNS failure, entity errors, a per-entity stall), each a
pair of callables (break, heal) on the primary :class:`~servicebus_local.server.LocalNamespace`.

From the record: the failover lag (first diverted message - fault start - ``failover_interval``), the recovery
lag (first message accepted by the primary again - heal), and the message ids to compare as sets (0 lost).
:func:`backlog_count` and :func:`drain` read what a namespace holds (the ordering tests of the integration and Spark
tiers count the backlog with it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.queues import take
from servicebus_local.model import QueueSettings
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.failover.registry import FailoverRegistry
from spark_sb.message.backlog import BACKLOG_PATH
from spark_sb.message.outbound import OutboundMessage
from spark_sb.sender.paired import PairedSender

ENTITY = "orders"
BACKLOG_COUNT = 2
BACKLOG_QUEUES = [f"primary/x-servicebus-transfer/{i}" for i in range(BACKLOG_COUNT)]


@dataclass(frozen=True)
class Shape:
    """An outage shape: ``cold`` means the sender starts after the fault began (no live connection)."""

    name: str
    fault: Callable[[Any], None]
    heal: Callable[[Any], None]
    cold: bool = False
    dns: bool = False  # the primary's host name does not resolve (heal: the sender is given the real one)


def _stall_entity(on: bool) -> Callable[[Any], None]:
    return lambda ns: ns.faults.stall_entity(ENTITY, on)


def _fail_sends(condition: str) -> Callable[[Any], None]:
    return lambda ns: ns.faults.fail_sends(ENTITY, condition)


def _drop(ns: Any) -> None:
    ns.faults.refuse_connections()
    ns.faults.drop_connections()


SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape(
            "refused",
            lambda ns: ns.faults.refuse_connections(),
            lambda ns: ns.faults.accept_connections(),
            cold=True,
        ),
        Shape("dropped", _drop, lambda ns: ns.faults.accept_connections()),
        Shape("stall-after-sasl", lambda ns: ns.faults.stall(True), lambda ns: ns.faults.stall(False)),
        Shape(
            "stall-after-sasl-cold",
            lambda ns: ns.faults.stall(True),
            lambda ns: ns.faults.stall(False),
            cold=True,
        ),
        Shape(
            "stall-before-sasl",
            lambda ns: ns.faults.stall(True, answer_sasl=False),
            lambda ns: ns.faults.stall(False),
        ),
        Shape(
            "stall-before-sasl-cold",
            lambda ns: ns.faults.stall(True, answer_sasl=False),
            lambda ns: ns.faults.stall(False),
            cold=True,
        ),
        Shape("dns", lambda ns: None, lambda ns: None, cold=True, dns=True),
        Shape("entity-disabled", _fail_sends("com.microsoft:entity-disabled"), lambda ns: ns.faults.clear()),
        Shape("entity-not-found", _fail_sends("amqp:not-found"), lambda ns: ns.faults.clear()),
        Shape("quota-exceeded", _fail_sends("amqp:resource-limit-exceeded"), lambda ns: ns.faults.clear()),
        Shape("entity-stall", _stall_entity(True), _stall_entity(False)),
    )
}


def prepare(pair: Any, duplicate_detection: bool = True) -> None:
    """The primary entity (with duplicate detection) and the backlog queues."""
    pair.primary.broker.create_queue(ENTITY, QueueSettings(requires_duplicate_detection=duplicate_detection))
    for q in BACKLOG_QUEUES:
        pair.secondary.broker.create_queue(q)


def make_config(pair: Any, *, dns: bool = False, **overrides: Any) -> ServiceBusConfig:
    primary = pair.primary.connection_string
    if dns:
        primary = primary.replace("sb://127.0.0.1:", "sb://primary.nonexistent.invalid:")
    options: dict[str, Any] = {
        "primary": {"connection_string": primary, "namespace_name": "primary"},
        "secondary": {"connection_string": pair.secondary.connection_string},
        "entity": ENTITY,
        "backlog_queue_count": BACKLOG_COUNT,
        "failover_interval": "2s",
        "ping_primary_interval": "1s",
    }
    options.update(overrides)
    return ServiceBusConfig.from_dict(options)


@dataclass
class Call:
    started: float
    ended: float
    sent: int
    diverted: int
    error: str | None = None


@dataclass
class SendLoop:
    """Sends ``batch`` messages per call, back to back, on a thread, until :meth:`stop`."""

    sender: PairedSender
    batch: int = 50
    prefix: str = "m"
    pause: float = 0.0
    calls: list[Call] = field(default_factory=list)
    produced: list[str] = field(default_factory=list)
    confirmed: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="send-loop", daemon=True)
        self._changed = threading.Condition()

    def start(self) -> SendLoop:
        self._thread.start()
        return self

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            ids = [f"{self.prefix}-{n + i}" for i in range(self.batch)]
            n += self.batch
            self.produced.extend(ids)
            started = time.monotonic()
            try:
                out = self.sender.send([OutboundMessage(body=b"x" * 100, message_id=i) for i in ids])
            except (
                Exception
            ) as exc:  # recorded; the messages of a failed call count as produced, not confirmed
                call = Call(started, time.monotonic(), 0, 0, f"{type(exc).__name__}: {exc}")
            else:
                call = Call(started, time.monotonic(), out.total_sent, out.total_diverted)
                if out.total_sent + out.total_diverted == len(ids):
                    self.confirmed.extend(ids)
            with self._changed:
                self.calls.append(call)
                self._changed.notify_all()
            if self.pause:
                self._stop.wait(self.pause)

    def wait_for(self, predicate: Callable[[Call], bool], after: float, timeout: float) -> Call | None:
        """The first call that ended after ``after`` (monotonic) and satisfies ``predicate``; None on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for call in self.calls:
                    if call.ended >= after and predicate(call):
                        return call
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(left)

    def stop(self, timeout: float = 60.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the send loop did not stop: a send call is hanging"


def backlog_count(ns: Any, queues: Sequence[str]) -> int:
    """Active messages in ``queues`` (the backlog queues) of ``ns``, a ``LocalNamespace``: what failover diverted
    and the syphon has not moved yet."""
    return sum(ns.broker.counts(q).active_message_count for q in queues)


def drain(ns: Any, entity: str) -> list[Any]:
    """Receive-and-delete everything active in ``entity`` of ``ns`` (real SDK)."""
    return take(ns.connection_string, entity, expected=ns.broker.counts(entity).active_message_count, wait=1)


@dataclass
class Timeline:
    shape: str
    failover_lag: float | None  # first diverted message - fault start - failover_interval
    recovery_lag: float | None  # first message accepted by the primary again - heal
    produced: int
    lost: int
    primary_duplicates: int
    diverted: int
    errors: list[str]


def run_outage(
    pair: Any,
    shape: Shape,
    *,
    interval: float = 2.0,
    ping: float = 1.0,
    warmup: float = 0.5,
    settle: float = 0.5,
    **config: Any,
) -> Timeline:
    """Break the primary with ``shape`` while a sender sends, wait for the failover, heal, wait for the return,
    then compare message ids: every produced message is in the primary or the backlog."""
    cfg = make_config(
        pair, dns=shape.dns, failover_interval=f"{interval}s", ping_primary_interval=f"{ping}s", **config
    )
    registry = FailoverRegistry()
    senders: list[PairedSender] = []
    loops: list[SendLoop] = []

    def start(prefix: str, conf: ServiceBusConfig) -> SendLoop:
        sender = PairedSender(conf, registry=registry)
        senders.append(sender)
        loop = SendLoop(sender, prefix=prefix).start()
        loops.append(loop)
        return loop

    failover_lag = recovery_lag = None
    try:
        if not shape.cold:
            loop = start("warm", cfg)
            assert loop.wait_for(lambda c: c.sent > 0, 0.0, 30.0), "the healthy sender never sent"
            time.sleep(warmup)
        fault_at = time.monotonic()
        shape.fault(pair.primary)
        if shape.cold:
            loop = start("cold", cfg)
        first = loop.wait_for(lambda c: c.diverted > 0, fault_at, interval + 30.0)
        if first is not None:
            failover_lag = first.ended - fault_at - interval
        time.sleep(settle)
        heal_at = time.monotonic()
        shape.heal(pair.primary)
        if shape.dns:  # the name resolves again: a sender with the real endpoint in the same process
            loop.stop()
            loop = start(
                "healed",
                make_config(
                    pair, failover_interval=f"{interval}s", ping_primary_interval=f"{ping}s", **config
                ),
            )
        back = loop.wait_for(lambda c: c.sent > 0, heal_at, ping + 30.0)
        if back is not None:
            recovery_lag = back.ended - heal_at
        time.sleep(settle)
    finally:
        for loop in loops:
            loop.stop()
        for sender in senders:
            sender.close()
    produced = [i for loop in loops for i in loop.confirmed]
    in_primary = [str(m.message_id) for m in drain(pair.primary, ENTITY)]
    in_backlog = []
    for q in BACKLOG_QUEUES:
        for m in drain(pair.secondary, q):
            assert m.application_properties[BACKLOG_PATH.encode()] == ENTITY.encode()
            in_backlog.append(str(m.message_id))
    lost = set(produced) - set(in_primary) - set(in_backlog)
    return Timeline(
        shape=shape.name,
        failover_lag=failover_lag,
        recovery_lag=recovery_lag,
        produced=len(produced),
        lost=len(lost),
        primary_duplicates=len(in_primary) - len(set(in_primary)),
        diverted=len(in_backlog),
        errors=[c.error for loop in loops for c in loop.calls if c.error],
    )
