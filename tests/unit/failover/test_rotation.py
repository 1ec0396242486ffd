"""The backlog rotation and one sender's backlog choice (spark_sb.failover.rotation, SPEC B4, B5), with a fake
clock: a pulled queue is out of the rotation until its time or until marked good, per secondary namespace; the
chooser is sticky per entity until its queue is pulled, or session-affine."""

from __future__ import annotations

import logging
import random

import pytest

from servicebus_local.clock import FakeClock
from spark_sb.failover.decisions import choose_session_affine
from spark_sb.failover.rotation import BacklogChooser, BacklogRotation
from tests.unit.sender.rig import SECRET, make_config

# -- rotation


def test_pull_returns_after_backlog_retry_interval() -> None:
    clock = FakeClock()
    rot = BacklogRotation(clock)
    queues = ["p/x-servicebus-transfer/0", "p/x-servicebus-transfer/1"]
    rec = rot.pull("sec", queues[0], until=clock.monotonic() + 300.0, error_class="connection")
    assert rec.until == clock.now() + (rec.until - rec.at) and (rec.until - rec.at).total_seconds() == 300.0
    assert rot.available("sec", queues) == [queues[1]]
    assert rot.available("other-namespace", queues) == queues
    clock.advance(299.999)
    assert not rot.is_available("sec", queues[0])
    assert [p.queue for p in rot.pulled("sec")] == [queues[0]]
    clock.advance(0.001)
    assert rot.available("sec", queues) == queues
    assert rot.pulled() == []


def test_mark_good_returns_queue_at_once() -> None:
    clock = FakeClock()
    rot = BacklogRotation(clock)
    rot.pull("sec", "q0", until=clock.monotonic() + 300)
    rot.mark_good("sec", "q0")
    assert rot.is_available("sec", "q0")


def test_a_pull_record_says_when_where_and_why_with_secrets_redacted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    make_config()  # registers the config's secrets with the redaction
    clock = FakeClock()
    rot = BacklogRotation(clock)
    caplog.set_level(logging.WARNING, logger="spark_sb.failover.rotation")
    rec = rot.pull("sec", "q0", clock.monotonic() + 60, "timeout", f"SharedAccessKey={SECRET} timed out")
    assert (rec.namespace, rec.queue, rec.at, rec.error_class) == ("sec", "q0", clock.now(), "timeout")
    assert SECRET not in rec.detail and "timed out" in rec.detail
    (line,) = caplog.records
    assert "'q0'" in line.getMessage() and rec.until.isoformat() in line.getMessage()


def test_a_pull_until_a_time_already_past_ends_at_its_own_time_and_is_over() -> None:
    clock = FakeClock()
    rot = BacklogRotation(clock)
    rec = rot.pull("sec", "q0", clock.monotonic() - 5)
    assert rec.until == rec.at
    assert rot.is_available("sec", "q0") and rot.pulled() == []


def test_pulled_lists_the_pulls_in_force_of_one_namespace_or_all() -> None:
    clock = FakeClock()
    rot = BacklogRotation(clock)
    rot.pull("sec", "q0", clock.monotonic() + 10)
    rot.pull("sec", "q1", clock.monotonic() + 60)
    rot.pull("third", "q0", clock.monotonic() + 60)
    assert [(p.namespace, p.queue) for p in rot.pulled("sec")] == [("sec", "q0"), ("sec", "q1")]
    assert len(rot.pulled()) == 3
    clock.advance(10)
    assert [(p.namespace, p.queue) for p in rot.pulled()] == [("sec", "q1"), ("third", "q0")]


def test_a_second_pull_of_a_queue_replaces_the_first() -> None:
    clock = FakeClock()
    rot = BacklogRotation(clock)
    rot.pull("sec", "q0", clock.monotonic() + 300)
    rot.pull("sec", "q0", clock.monotonic() + 10)
    clock.advance(10)
    assert rot.is_available("sec", "q0")


def test_available_keeps_the_given_order() -> None:
    clock = FakeClock()
    rot = BacklogRotation(clock)
    rot.pull("sec", "q1", clock.monotonic() + 10)
    assert rot.available("sec", ["q3", "q1", "q0", "q2"]) == ["q3", "q0", "q2"]
    assert rot.available("sec", []) == []


# -- one sender's choice


def test_chooser_sticky_until_pulled() -> None:
    clock = FakeClock()
    rot = BacklogRotation(clock)
    queues = [f"q{i}" for i in range(5)]
    chooser = BacklogChooser(queues, rot, "sec", rng=random.Random(7))
    first = chooser.choose("orders")
    assert all(chooser.choose("orders") == first for _ in range(20))
    rot.pull("sec", first, until=clock.monotonic() + 10)  # type: ignore[arg-type]
    second = chooser.choose("orders")
    assert second != first and second in queues
    assert all(chooser.choose("orders") == second for _ in range(20))
    for q in queues:
        rot.pull("sec", q, until=clock.monotonic() + 10)
    assert chooser.choose("orders") is None
    clock.advance(10)
    assert chooser.choose("orders") in queues


def test_chooser_session_affine() -> None:
    rot = BacklogRotation(FakeClock())
    queues = [f"q{i}" for i in range(5)]
    chooser = BacklogChooser(queues, rot, "sec", selection="session-affine", rng=random.Random(1))
    assert chooser.choose("e", "s1") == choose_session_affine(queues, "s1")
    assert chooser.choose("e", None) in queues  # no session: sticky random
    with pytest.raises(ValueError, match="session-affine"):
        BacklogChooser(queues, rot, "sec", selection="round-robin")


def test_each_entity_sticks_to_its_own_queue() -> None:
    rot = BacklogRotation(FakeClock())
    queues = [f"q{i}" for i in range(50)]
    chooser = BacklogChooser(queues, rot, "sec", rng=random.Random(3))
    chosen = {e: chooser.choose(e) for e in (f"entity-{i}" for i in range(20))}
    assert len(set(chosen.values())) > 1  # random per entity, not one queue for all
    assert all(chooser.choose(e) == q for e, q in chosen.items())


def test_a_session_affine_chooser_follows_the_session_not_the_entity() -> None:
    clock = FakeClock()
    rot = BacklogRotation(clock)
    queues = [f"q{i}" for i in range(10)]
    chooser = BacklogChooser(queues, rot, "sec", selection="session-affine")
    sessions = [f"session-{i}" for i in range(40)]
    picks = {s: chooser.choose("orders", s) for s in sessions}
    assert len(set(picks.values())) > 1  # one entity, its sessions spread over the queues
    assert picks == {s: chooser.choose("audit", s) for s in sessions}  # the same session, the same queue
    pulled = picks[sessions[0]]
    assert pulled is not None
    rot.pull("sec", pulled, clock.monotonic() + 10)
    moved = chooser.choose("orders", sessions[0])
    assert moved != pulled and moved == choose_session_affine([q for q in queues if q != pulled], sessions[0])


def test_the_chooser_sees_only_its_own_namespace_and_queues() -> None:
    clock = FakeClock()
    rot = BacklogRotation(clock)
    chooser = BacklogChooser(["q0", "q1"], rot, "sec", rng=random.Random(0))
    rot.pull("third", "q0", clock.monotonic() + 10)  # another secondary namespace's queue of the same name
    rot.pull("sec", "q9", clock.monotonic() + 10)  # not one of this sender's queues
    assert chooser.available() == ["q0", "q1"]
    rot.pull("sec", "q1", clock.monotonic() + 10)
    assert chooser.available() == ["q0"] and chooser.choose("orders") == "q0"
