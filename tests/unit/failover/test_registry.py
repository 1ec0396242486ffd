"""The process-level failover registry (spark_sb.failover.registry): one shared state per (namespace, entity), one
namespace health per primary namespace that its entities report to, one session book per primary namespace, a
rotation on the registry's clock, :meth:`FailoverRegistry.clear`, and the process's own registry."""

from __future__ import annotations

from servicebus_local.clock import FakeClock
from spark_sb.core.clock import SystemClock
from spark_sb.core.errors import CONNECTION
from spark_sb.failover.records import EntityState
from spark_sb.failover.registry import FailoverRegistry, process_registry

H, FO = EntityState.HEALTHY, EntityState.FAILED_OVER


def test_registry_shares_entity_state_and_rotation() -> None:
    reg = FailoverRegistry(FakeClock())
    a = reg.entity("ns", "orders", failover_interval=0, ping_interval=30)
    b = reg.entity("ns", "orders", failover_interval=0, ping_interval=30)
    assert a is b
    assert reg.entity("ns", "other", failover_interval=0, ping_interval=30) is not a
    assert reg.entity("ns2", "orders", failover_interval=0, ping_interval=30) is not a
    a.record_failure(CONNECTION)
    assert {(s.entity, s.state) for s in reg.statuses()} == {("orders", FO), ("other", H), ("orders", H)}
    assert process_registry() is process_registry()


def test_the_entities_of_a_namespace_share_its_health_made_on_first_use() -> None:
    reg = FailoverRegistry(FakeClock())
    assert reg.namespace("ns") is None  # not before its first entity
    health = reg.health("ns", ping_interval=30)
    assert reg.health("ns", ping_interval=99) is health and reg.namespace("ns") is health
    reg.entity("ns", "orders", failover_interval=60, ping_interval=30)
    assert reg.namespace("ns") is health
    reg.entity("ns2", "orders", failover_interval=60, ping_interval=30)
    other = reg.namespace("ns2")
    assert other is not None and other is not health


def test_an_entity_made_first_makes_its_namespace_health() -> None:
    reg = FailoverRegistry(FakeClock())
    reg.entity("ns", "orders", failover_interval=60, ping_interval=30)
    health = reg.namespace("ns")
    assert health is not None and health is reg.health("ns", ping_interval=30)


def test_each_primary_namespace_has_one_session_book() -> None:
    reg = FailoverRegistry(FakeClock())
    book = reg.sessions("ns")
    assert reg.sessions("ns") is book and book.empty
    assert reg.sessions("ns2") is not book


def test_the_rotation_runs_on_the_registrys_clock() -> None:
    clock = FakeClock()
    reg = FailoverRegistry(clock)
    assert reg.clock is clock
    reg.rotation.pull("sec", "q0", clock.monotonic() + 10)
    assert not reg.rotation.is_available("sec", "q0")
    clock.advance(10)
    assert reg.rotation.is_available("sec", "q0")


def test_clear_forgets_entities_namespaces_sessions_and_pulls() -> None:
    clock = FakeClock()
    reg = FailoverRegistry(clock)
    old = reg.entity("ns", "orders", failover_interval=0, ping_interval=30)
    old.record_failure(CONNECTION)
    book = reg.sessions("ns")
    reg.rotation.pull("sec", "q0", clock.monotonic() + 300)
    reg.clear()
    assert reg.statuses() == [] and reg.namespace("ns") is None
    assert reg.sessions("ns") is not book
    assert reg.rotation.is_available("sec", "q0") and reg.rotation.pulled() == []
    fresh = reg.entity("ns", "orders", failover_interval=0, ping_interval=30)
    assert fresh is not old and fresh.state is H


def test_the_process_registry_runs_on_the_system_clock() -> None:
    assert isinstance(process_registry().clock, SystemClock)
