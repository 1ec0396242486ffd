"""The collector policy of ``python -m servicebus_local`` (collector.py): held messages leave the collector's
scans, and what is frozen stays bounded by what is held."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from servicebus_local.collector import OBJECTS_PER_MESSAGE, SLACK, CollectorPolicy


class FakeGc:
    """Objects as numbers: ``young`` tracked (one young generation for short), ``frozen``, ``garbage`` (cyclic
    garbage among the frozen: freed by a full collection only)."""

    def __init__(self) -> None:
        self.young = 0
        self.frozen = 0
        self.garbage = 0
        self.calls: list[str] = []

    def collect(self, generation: int = 2) -> int:
        self.calls.append(f"collect({generation})")
        if generation == 2:
            freed, self.garbage = self.garbage, 0
            self.young -= freed
            return freed
        return 0

    def freeze(self) -> None:
        self.calls.append("freeze")
        self.frozen += self.young
        self.young = 0

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")
        self.young += self.frozen
        self.frozen = 0

    def get_freeze_count(self) -> int:
        return self.frozen


def test_each_step_freezes_survivors_and_a_full_collection_happens_only_past_the_bound() -> None:
    g, held = FakeGc(), [0]
    policy = CollectorPolicy(lambda: held[0], gc_module=g)
    g.young = 5_000  # the server's own objects
    policy.start()
    assert (g.frozen, policy.full_collections) == (5_000, 1)
    # messages arrive and are held: frozen, never a full collection (the pause this avoids)
    for _ in range(50):
        held[0] += 10_000
        g.young += OBJECTS_PER_MESSAGE * 10_000
        g.calls.clear()
        policy.step()
        assert g.calls == ["collect(1)", "freeze"]
        assert g.young == 0
    assert policy.full_collections == 1
    # they expire: refcounting frees frozen objects too
    g.frozen -= OBJECTS_PER_MESSAGE * held[0]
    held[0] = 0
    policy.step()
    assert policy.full_collections == 1
    # frozen cyclic garbage (dropped connections) builds up: collected once it passes the bound, not before
    leaked = 0
    while policy.full_collections == 1:
        g.frozen += 1_000
        g.garbage += 1_000
        leaked += 1_000
        policy.step()
        assert g.frozen <= policy.bound() or policy.full_collections == 2
    assert leaked <= 2 * 5_000 + SLACK + 1_000
    assert g.frozen == 5_000 and g.garbage == 0  # back to the server's own objects


def test_the_bound_follows_the_messages_held() -> None:
    g, held = FakeGc(), [0]
    policy = CollectorPolicy(lambda: held[0], gc_module=g)
    g.young = 1_000
    policy.start()
    assert policy.bound() == 2 * 1_000 + SLACK
    held[0] = 100_000
    assert policy.bound() == 2 * (1_000 + OBJECTS_PER_MESSAGE * 100_000) + SLACK


def test_with_the_real_collector_held_messages_leave_the_scans_and_are_freed_when_gone() -> None:
    # In a child process: the policy is process-wide (never run in the test process).
    code = textwrap.dedent(
        """
        import gc
        from datetime import timedelta
        from servicebus_local.amqp import encode_message
        from servicebus_local.broker import Broker
        from servicebus_local.clock import FakeClock
        from servicebus_local.collector import CollectorPolicy
        from servicebus_local.model import QueueSettings

        clock = FakeClock()
        b = Broker("ns", clock=clock)
        b.create_queue("q", QueueSettings(default_message_time_to_live=timedelta(seconds=5)))
        policy = CollectorPolicy(b.held_messages)
        policy.start()
        for i in range(50):
            b.send("q", [encode_message(body=f"m{i}-{j}") for j in range(1000)])
            policy.step()
        scanned = len(gc.get_objects())
        frozen = gc.get_freeze_count()
        clock.advance(10)
        b.tick()
        policy.step()
        print(b.held_messages(), scanned, frozen, gc.get_freeze_count(), policy.full_collections)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    held, scanned, frozen, frozen_after, fulls = map(int, out.stdout.split())
    assert held == 0
    assert frozen >= OBJECTS_PER_MESSAGE * 50_000  # the 50,000 messages were out of the scans...
    assert scanned < 5_000  # ...so a collection scanned almost nothing
    assert frozen_after < frozen - OBJECTS_PER_MESSAGE * 49_000  # expired: freed although frozen
    assert fulls == 1  # only the one at start
