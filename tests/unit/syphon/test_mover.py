"""The syphon's drain loop (:class:`spark_sb.syphon.mover.Syphon`) on a fake clock, with ``ordering: none``: what it
forwards to the primary and completes, what it drops, dead-letters or leaves for redelivery, how a failed send or
probe backs an entity off and a wrong destination is dead-lettered at its last attempt, and that nothing raises out
of a drain. The backlog queue and the primary are fakes (tests/unit/syphon/test_ordered.py's world, the fake
transport); the ordered drain is tested there, the real receivers in tests/integration."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from azure.servicebus import exceptions as sbe

from servicebus_local.clock import FakeClock
from spark_sb.failover.ordering import SessionBook
from spark_sb.failover.registry import FailoverRegistry
from spark_sb.message.backlog import BACKLOG_PATH, BACKLOG_TTL, backlog_queue_names, probe_message, to_backlog
from spark_sb.message.outbound import OutboundMessage
from spark_sb.syphon.mover import Syphon
from spark_sb.syphon.rules import DESTINATION_NOT_FOUND, EXPIRED_IN_BACKLOG, NOT_A_BACKLOG_MESSAGE
from spark_sb.wire.transport import PRIMARY, SECONDARY, Target
from tests.unit.sender.rig import QUEUES, conn_error, make_config
from tests.unit.syphon.test_ordered import Delivered, FakeLane, FakeQueue, World

QUEUE = QUEUES[0]


class Queue(FakeQueue):
    """The fake backlog queue, recording what was dead-lettered (message id, reason, description)."""

    def __init__(self, world: World, name: str) -> None:
        super().__init__(world.clock, lambda: world.rig.transport.at(SECONDARY, name))
        self.dead: list[tuple[str, str, str]] = []

    def dead_letter_message(self, m: Delivered, *, reason: str, error_description: str) -> None:
        self.dead.append((m.message_id, reason, error_description))
        super().dead_letter_message(m, reason=reason, error_description=error_description)

    def locked(self) -> int:
        now = self.clock.now()
        return sum(1 for e in self.entries.values() if e.locked_until is not None and e.locked_until > now)


class Plain:
    """A syphon (``ordering: none``) over one recording backlog queue and the fake transport as the primary."""

    def __init__(self, **config: object) -> None:
        self.world = World(ordering="none")
        self.world.syphon.config = make_config(ordering="none", **config)
        self.syphon = self.world.syphon
        self.clock = self.world.clock
        self.transport = self.world.rig.transport
        self.queue = Queue(self.world, QUEUE)
        self.world.queues[QUEUE] = self.queue
        self.world.lanes[QUEUE] = FakeLane(QUEUE, self.queue)
        self.replaced: list[str] = []
        self.syphon._replace_receiver = lambda queue, dl, why: self.replaced.append(why)  # type: ignore[method-assign]

    def put(self, *messages: OutboundMessage, entity: str = "orders", age: timedelta = timedelta(0)) -> None:
        """Messages diverted to the backlog ``age`` ago, for ``entity``."""
        self.transport.delivered.setdefault(Target(SECONDARY, QUEUE), []).extend(
            to_backlog(m, entity, self.clock.now() - age) for m in messages
        )

    def put_raw(self, message: OutboundMessage) -> None:
        self.transport.delivered.setdefault(Target(SECONDARY, QUEUE), []).append(message)

    def drain(self, **kwargs: object) -> object:
        kwargs.setdefault("max_wait", 0)
        kwargs.setdefault("max_batches", 5)  # a bug that keeps messages coming back fails, never hangs
        return self.syphon.drain_queue(QUEUE, **kwargs)  # type: ignore[arg-type]

    def primary(self, entity: str = "orders") -> list[str | None]:
        return self.transport.ids(PRIMARY, entity)

    def ops(self) -> list[tuple[str, str]]:
        return [(op, result) for op, target, _, result in self.transport.calls if target.namespace == PRIMARY]


def msgs(n: int, prefix: str = "m", **kwargs: object) -> list[OutboundMessage]:
    return [OutboundMessage(body=b"x", message_id=f"{prefix}{i}", **kwargs) for i in range(n)]  # type: ignore[arg-type]


@pytest.fixture
def plain() -> Iterator[Plain]:
    p = Plain()
    yield p
    p.syphon.close()


# ------------------------------------------------------------------------------------------------ construction


def test_a_syphon_needs_a_secondary_namespace() -> None:
    with pytest.raises(ValueError, match="secondary"):
        Syphon(make_config(secondary=None), backlog_queues=QUEUES, clock=FakeClock())


def test_the_backlog_queues_default_to_the_names_derived_from_the_primary() -> None:
    clock = FakeClock()
    named = Syphon(
        make_config(), primary_namespace_name="contoso", clock=clock, registry=FailoverRegistry(clock)
    )
    assert named.backlog_queues == backlog_queue_names("contoso", 3)
    named.close()
    derived = Syphon(make_config(), clock=clock, registry=FailoverRegistry(clock))  # the FQDN's first label
    assert derived.backlog_queues == backlog_queue_names("primary", 3)
    derived.close()


def test_the_registry_book_is_the_default_acknowledgement_of_a_syphon_given_the_registry() -> None:
    clock = FakeClock()
    registry = FailoverRegistry(clock)
    syphon = Syphon(make_config(ordering="session"), backlog_queues=QUEUES, clock=clock, registry=registry)
    assert syphon.acks is registry.sessions("primary.servicebus.windows.net")
    assert isinstance(syphon.acks, SessionBook)
    syphon.close()
    plain = Syphon(make_config(), backlog_queues=QUEUES, clock=clock, registry=registry)
    assert plain.acks is None and not plain.ordered
    plain.close()


def test_a_syphon_given_a_registry_acknowledges_there_even_on_the_system_clock() -> None:
    registry = FailoverRegistry(FakeClock())
    syphon = Syphon(make_config(ordering="entity"), backlog_queues=QUEUES, registry=registry)
    assert syphon.acks is registry.sessions("primary.servicebus.windows.net")
    syphon.close()


# ------------------------------------------------------------------------------------------------------ the drain


def test_backlog_messages_are_forwarded_to_their_entity_and_completed(plain: Plain) -> None:
    plain.syphon.record_ids = True
    plain.put(*msgs(3))
    out = plain.drain()
    assert plain.primary() == ["m0", "m1", "m2"]
    delivered = plain.transport.at(PRIMARY, "orders")
    assert all(BACKLOG_PATH not in m.properties for m in delivered)  # restored: the backlog's marks removed
    assert out.received == 3 and out.forwarded == {"orders": 3} and out.abandoned == 0
    assert out.from_dead_letter == 0
    assert out.moved_ids == [("orders", "m0"), ("orders", "m1"), ("orders", "m2")]
    assert len(plain.queue) == 0
    assert out.errors == []


def test_each_entity_gets_its_own_messages(plain: Plain) -> None:
    plain.put(*msgs(2, "a"), entity="orders")
    plain.put(*msgs(1, "b"), entity="invoices")
    plain.syphon.set_hints({"orders": "healthy", "invoices": "healthy"})
    out = plain.drain()
    assert plain.primary("orders") == ["a0", "a1"] and plain.primary("invoices") == ["b0"]
    assert out.forwarded == {"orders": 2, "invoices": 1}


def test_a_probe_in_the_backlog_is_completed_never_forwarded(plain: Plain) -> None:
    plain.put_raw(probe_message("orders"))
    plain.put(*msgs(1))
    out = plain.drain()
    assert out.probes_dropped == 1 and plain.primary() == ["m0"]
    assert len(plain.queue) == 0 and plain.queue.dead == []


def test_a_message_whose_time_to_live_ran_out_in_the_backlog_is_dead_lettered(plain: Plain) -> None:
    plain.put(*msgs(1, "old", time_to_live=timedelta(seconds=30)), age=timedelta(minutes=1))
    plain.put(*msgs(1, "young", time_to_live=timedelta(minutes=5)), age=timedelta(minutes=1))
    out = plain.drain()
    assert plain.primary() == ["young0"]
    assert [(i, r) for i, r, _ in plain.queue.dead] == [("old0", EXPIRED_IN_BACKLOG)]
    assert out.expired == 1 and out.expired_by_entity == {"orders": 1}
    forwarded = plain.transport.at(PRIMARY, "orders")[0]
    assert forwarded.time_to_live == timedelta(minutes=4)  # what is left of it


def test_a_message_that_is_not_a_backlog_message_is_dead_lettered(plain: Plain) -> None:
    plain.put_raw(OutboundMessage(body=b"x", message_id="stray"))
    out = plain.drain()
    assert out.invalid == 1 and plain.primary() == []
    assert [(i, r) for i, r, _ in plain.queue.dead] == [("stray", NOT_A_BACKLOG_MESSAGE)]


def test_a_backlog_message_that_cannot_be_restored_is_dead_lettered_saying_why(plain: Plain) -> None:
    plain.put_raw(
        OutboundMessage(body=b"x", message_id="bad", properties={BACKLOG_PATH: "orders", BACKLOG_TTL: "soon"})
    )
    out = plain.drain()
    assert out.invalid == 1 and plain.primary() == []
    [(message_id, reason, description)] = plain.queue.dead
    assert message_id == "bad" and reason == NOT_A_BACKLOG_MESSAGE
    assert description.startswith(f"{NOT_A_BACKLOG_MESSAGE}: ") and description != reason


def test_a_message_whose_lock_is_about_to_run_out_is_left_for_redelivery(plain: Plain) -> None:
    plain.put(*msgs(2))
    real = plain.queue.receive_messages

    def receive(max_message_count: int, max_wait_time: float) -> list[Delivered]:
        out = real(max_message_count, max_wait_time)
        for m in out:
            if m.message_id == "m0":
                m.locked_until_utc = plain.clock.now() + timedelta(seconds=1.5)  # inside the 2 s margin
        return out

    plain.queue.receive_messages = receive  # type: ignore[method-assign]
    out = plain.drain(max_batches=1)
    assert out.skipped_lock_expiring == 1 and plain.primary() == ["m1"]
    assert (
        len(plain.queue) == 1 and plain.queue.locked() == 1
    )  # not settled: its lock runs out, it comes back
    assert out.abandoned == 0


def test_a_dead_letter_drain_moves_what_the_queue_dead_lettered_and_leaves_what_the_syphon_parked(
    plain: Plain,
) -> None:
    plain.put(*msgs(3))
    real = plain.queue.receive_messages
    reasons = {
        "m0": EXPIRED_IN_BACKLOG,
        "m1": "MaxDeliveryCountExceeded",
        "m2": DESTINATION_NOT_FOUND + ": gone",
    }

    def receive(max_message_count: int, max_wait_time: float) -> list[Delivered]:
        out = real(max_message_count, max_wait_time)
        for m in out:
            m.dead_letter_reason = reasons[m.message_id]  # type: ignore[attr-defined]
        return out

    plain.queue.receive_messages = receive  # type: ignore[method-assign]
    out = plain.drain(dead_letter=True)
    assert plain.primary() == ["m1"]
    assert out.from_dead_letter == 1 and out.parked == 2 and out.forwarded == {"orders": 1}
    assert len(plain.queue) == 2 and plain.queue.locked() == 0 and plain.queue.dead == []  # left, unlocked


def test_a_failed_send_abandons_and_backs_the_entity_off_then_probes_it_first(plain: Plain) -> None:
    plain.transport.fail(conn_error, namespace=PRIMARY, count=1)
    plain.put(*msgs(2))
    first = plain.drain()
    assert first.abandoned == 2 and plain.primary() == []
    assert first.errors == ["orders: send failed: ServiceBusConnectionError"]
    assert len(plain.queue) == 2 and plain.queue.locked() == 0  # abandoned: available again
    sends = len(plain.transport.sends(PRIMARY))
    backing_off = plain.drain()
    assert backing_off.abandoned == 2 and len(plain.transport.sends(PRIMARY)) == sends  # not tried meanwhile
    plain.clock.advance(plain.syphon.entity_backoff)
    plain.transport.calls.clear()
    after = plain.drain()
    assert after.probes == 1 and plain.primary() == ["m0", "m1"]
    assert plain.ops() == [("schedule", "ok"), ("cancel", "ok"), ("send", "ok")]


def test_an_entity_not_known_healthy_is_probed_before_its_first_send(plain: Plain) -> None:
    plain.syphon.set_hints(None)
    plain.put(*msgs(1))
    out = plain.drain()
    assert out.probes == 1 and plain.primary() == ["m0"]
    assert plain.ops() == [("schedule", "ok"), ("cancel", "ok"), ("send", "ok")]


def test_an_entity_whose_probe_fails_is_not_sent_to(plain: Plain) -> None:
    plain.syphon.set_hints({"orders": "failed_over"})
    plain.transport.fail(conn_error, op="schedule", namespace=PRIMARY)
    plain.put(*msgs(2))
    out = plain.drain()
    assert out.probes == 1 and out.abandoned == 2 and plain.primary() == []
    assert out.errors == ["orders: probe failed: ServiceBusConnectionError"]
    assert ("send", "ok") not in plain.ops()


def test_a_missing_entity_is_dead_lettered_at_its_last_attempt_and_abandoned_before() -> None:
    p = Plain(syphon_max_attempts=2)
    p.syphon.set_hints({"gone": "healthy"})
    p.transport.fail(lambda: sbe.MessagingEntityNotFoundError(message="no such entity"), entity="gone")
    p.put(*msgs(2), entity="gone")
    first = p.drain()
    assert first.abandoned == 2 and first.undeliverable == 0 and p.queue.dead == []
    p.clock.advance(p.syphon.entity_backoff)
    second = p.drain()  # their second delivery: syphon.max_attempts
    assert second.undeliverable == 2 and second.undeliverable_by_entity == {"gone": 2}
    assert [(i, r) for i, r, _ in p.queue.dead] == [
        ("m0", DESTINATION_NOT_FOUND),
        ("m1", DESTINATION_NOT_FOUND),
    ]
    description = p.queue.dead[0][2]
    assert "'gone'" in description and "primary.servicebus.windows.net" in description
    assert len(p.queue) == 0
    p.syphon.close()


def test_an_outage_never_dead_letters_however_many_deliveries() -> None:
    p = Plain(syphon_max_attempts=1)
    p.transport.fail(conn_error, namespace=PRIMARY)
    p.put(*msgs(1))
    for _ in range(3):
        out = p.drain()
        assert out.abandoned == 1 and out.undeliverable == 0
        p.clock.advance(p.syphon.entity_backoff)
    assert p.queue.dead == [] and len(p.queue) == 1
    p.syphon.close()


def test_a_failed_receive_is_counted_and_its_receiver_replaced_never_raised(plain: Plain) -> None:
    plain.put(*msgs(1))
    plain.queue.fail_receives = 1
    out = plain.drain()
    assert out.errors == [f"{QUEUE}: receive failed: ConnectionError"] and out.receive_calls == 1
    assert plain.replaced == ["receive failed"]
    assert not plain.syphon.lines.paused(QUEUE)  # no order to keep: the queue is not left alone
    plain.clock.advance(61)
    plain.drain()
    assert plain.primary() == ["m0"]


def test_a_drain_stops_after_max_batches(plain: Plain) -> None:
    plain.syphon.config = make_config(ordering="none", syphon_batch_size=2)
    plain.put(*msgs(5))
    out = plain.drain(max_batches=2)
    assert out.receive_calls == 2 and plain.primary() == ["m0", "m1", "m2", "m3"]
    rest = plain.drain()
    assert (
        plain.primary() == [f"m{i}" for i in range(5)] and rest.receive_calls == 2
    )  # the last receive is empty


def test_a_drain_stops_at_its_deadline(plain: Plain) -> None:
    plain.put(*msgs(1))
    out = plain.drain(until=plain.clock.monotonic())
    assert out.receive_calls == 0 and plain.primary() == []


def test_a_cancelled_syphon_moves_nothing_until_resumed(plain: Plain) -> None:
    plain.put(*msgs(2))
    plain.syphon.cancel()
    assert plain.syphon.cancelled
    out = plain.drain()
    assert out.cancelled and out.receive_calls == 0 and plain.primary() == []
    plain.syphon.resume()
    assert not plain.syphon.cancelled
    assert not plain.drain().cancelled and plain.primary() == ["m0", "m1"]


def test_a_cancel_during_a_drain_abandons_what_is_held(plain: Plain) -> None:
    plain.put(*msgs(2), entity="orders")
    plain.put(*msgs(2, "i"), entity="invoices")
    plain.syphon.set_hints({"orders": "healthy"})  # invoices would be probed first
    real = plain.transport.send

    def send(batch: object, timeout: float, *args: object, **kwargs: object) -> None:
        real(batch, timeout, *args, **kwargs)  # type: ignore[arg-type]
        plain.syphon.cancel()  # after the first entity's batch

    plain.transport.send = send  # type: ignore[method-assign]
    out = plain.drain()
    assert out.cancelled and plain.primary() == ["m0", "m1"] and plain.primary("invoices") == []
    assert out.abandoned == 2 and len(plain.queue) == 2 and plain.queue.locked() == 0
    assert [op for op, _ in plain.ops()] == ["send"]  # nothing more after the cancel, not even a probe
