"""The executor's pool of senders and syphons: reuse per configuration key, one task at a time per object, idle
objects closed after idle_timeout on the injected clock."""

from __future__ import annotations

from dataclasses import dataclass

from servicebus_local.clock import FakeClock
from spark_sb.sender.pool import SenderPool, config_key


@dataclass
class Thing:
    name: str
    closed: bool = False

    def close(self) -> None:
        self.closed = True


def test_an_idle_object_is_reused_by_the_next_task_with_its_key_only() -> None:
    clock = FakeClock()
    pool: SenderPool[Thing] = SenderPool(clock=clock)
    a = pool.acquire("k1", 60.0, lambda: Thing("a"))
    b = pool.acquire("k1", 60.0, lambda: Thing("b"))  # a is in use: a second task gets its own
    assert (a.name, b.name) == ("a", "b")
    pool.release("k1", a)
    assert pool.acquire("k2", 60.0, lambda: Thing("c")).name == "c"  # another key never gets a
    assert pool.acquire("k1", 60.0, lambda: Thing("d")) is a
    assert pool.idle() == 0


def test_idle_objects_are_closed_after_the_idle_timeout_and_never_handed_out() -> None:
    clock = FakeClock()
    pool: SenderPool[Thing] = SenderPool(clock=clock)
    old = pool.acquire("k", 10.0, lambda: Thing("old"))
    pool.release("k", old)
    clock.advance(10.5)
    new = pool.acquire("k", 10.0, lambda: Thing("new"))
    assert new.name == "new" and old.closed and pool.idle() == 0


def test_release_without_keeping_closes_and_close_all_empties_the_pool() -> None:
    pool: SenderPool[Thing] = SenderPool(clock=FakeClock())
    once = pool.acquire("k", 10.0, lambda: Thing("once"))
    pool.release("k", once, keep=False)
    assert once.closed and pool.idle() == 0
    kept = [pool.acquire("k", 10.0, lambda n=n: Thing(f"t{n}")) for n in range(3)]
    for t in kept:
        pool.release("k", t)
    assert pool.idle() == 3 and pool.close_all() == 3 and all(t.closed for t in kept) and pool.idle() == 0


def test_config_keys_are_digests_equal_for_equal_configs() -> None:
    assert config_key({"a": 1}) == config_key({"a": 1}) != config_key({"a": 2})
    assert len(config_key({"secret": "s3cr3t"})) == 64 and "s3cr3t" not in config_key({"secret": "s3cr3t"})
