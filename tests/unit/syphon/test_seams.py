"""The ordered syphon at the seams between Python workers (SPEC O6, O7; issue 47 items 3 and 6) and against a skewed
clock, on the fake world of test_ordered.py: every worker has a Syphon of its own (no process state shared), the
backlog queues and the primary are shared. The queue is the only truth the workers share: a line's head locked by
one worker (a lost receive, a failed abandon, a killed task) holds the line back in every other worker; a held
line's messages are deferred once, not received and abandoned at every pass."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from spark_sb.wire.transport import PRIMARY
from tests.unit.sender.rig import conn_error, make_config
from tests.unit.syphon.test_ordered import LOCK, FakeQueue, World, msgs, queue_of


@pytest.fixture
def world() -> Iterator[World]:
    w = World()
    yield w
    w.syphon.close()


def backlogged(world: World, *batches: tuple[str, int, int]) -> FakeQueue:
    """Sessions diverted (the primary down), then the primary back: their messages and markers in one queue."""
    world.fail_over()
    for session, start, n in batches:
        world.rig.sender.send(msgs(session, start, n))
    world.recover()
    queues = {queue_of(session) for session, _, _ in batches}
    assert len(queues) == 1
    return world.queues[queues.pop()]


# ------------------------------------------------------------------------------------------- O6: another worker
def test_a_worker_does_not_pass_a_line_whose_head_another_workers_lost_receive_locked(world: World) -> None:
    """Item 3: worker A's receive locks s-0 and s-1, and its answer is lost (A pauses that queue - in A only). Worker
    B drains meanwhile: s-0 and s-1 are invisible to its receive, s-2, s-3 and the marker are not. B must not move
    them, nor acknowledge the marker, before s-0 and s-1 are back and moved."""
    queue = backlogged(world, ("s", 0, 4))
    a = world.worker(syphon_batch_size=2)
    queue.fail_receives = 1
    assert a.drain_queue(queue_of("s"), max_wait=0).errors  # s-0, s-1 locked, the answer lost
    b = world.worker()
    b.drain_queue(queue_of("s"), max_wait=0)
    assert world.primary() == []  # nothing of s overtakes its locked head
    record = world.book.held("orders", "s")
    assert record is not None and not record.drained  # the marker is not acknowledged
    world.clock.advance(LOCK.total_seconds() + 1)  # A's locks run out
    b.drain_queue(queue_of("s"), max_wait=0)
    assert world.per_session() == {"s": [0, 1, 2, 3]}
    record = world.book.held("orders", "s")
    assert record is not None and record.drained
    assert len(queue) == 0
    for s in (a, b):
        s.close()


def test_a_worker_does_not_pass_a_head_whose_abandon_failed_in_another_worker(world: World) -> None:
    """Item 3, the other way in: worker A's send of the line fails and its abandon of s-3 fails too (s-3 stays
    locked by A); worker B, after the entity's back-off, must not move s-4.. past s-3."""
    world.rig.transport.max_batch = 400  # a few messages per primary batch
    queue = backlogged(world, ("s", 0, 8))
    a = world.worker()
    world.rig.transport.fail(conn_error, namespace=PRIMARY, skip=1, count=1)  # A's second primary batch fails
    queue.fail_abandons.add("s-3")
    a.drain_queue(queue_of("s"), max_wait=0)
    assert world.per_session()["s"] == [0, 1, 2]
    b = world.worker()
    world.clock.advance(6)
    b.drain_queue(queue_of("s"), max_wait=0)
    assert world.per_session()["s"] == [0, 1, 2]  # s-3 is still locked (by A): the rest waits
    world.clock.advance(LOCK.total_seconds() + 1)
    b.drain_queue(queue_of("s"), max_wait=0)
    assert world.per_session() == {"s": list(range(8))}
    for s in (a, b):
        s.close()


def test_a_worker_killed_mid_pass_leaves_locks_nobody_remembers_and_no_line_passes_them(world: World) -> None:
    """Item 3, a task killed (query.stop) after its receive: no process remembers s-0's lock. Another worker's pass
    holds the line until the lock runs out; session t, not held, moves meanwhile."""
    queue = backlogged(world, ("s", 0, 3), ("t", 0, 2))
    assert [m.message_id for m in queue.receive_messages(1, 0)] == ["s-0"]  # the killed task's receive
    world.syphon.drain_queue(queue_of("s"), max_wait=0)
    assert world.per_session() == {"t": [0, 1]}
    world.clock.advance(LOCK.total_seconds() + 1)
    world.syphon.drain_queue(queue_of("s"), max_wait=0)
    assert world.per_session() == {"s": [0, 1, 2], "t": [0, 1]}


# ------------------------------------------------------------------------------------------- O7: a waiting line
def test_a_line_held_for_a_minute_behind_a_locked_head_is_deferred_once_not_churned(world: World) -> None:
    """Item 6: s-0 is locked by a killed task for a minute; a pass runs every second while the sender keeps
    sending to s (held: behind the backlog) and t. Each message of s is delivered once while it waits (then
    deferred: its delivery count stays 0) and once more when it moves; t flows; nothing is dead-lettered."""
    queue = backlogged(world, ("s", 0, 3), ("t", 0, 1))
    queue.receive_messages(1, 0)  # the killed task's lock on s-0
    sent = {"s": 3, "t": 1}
    until = world.clock.monotonic() + LOCK.total_seconds() - 1
    second = 0
    while world.clock.monotonic() < until:  # (a send may move the clock on: its back-offs sleep)
        if second % 5 == 0:
            for session in ("s", "t"):
                world.rig.sender.send(msgs(session, sent[session], 1))
                sent[session] += 1
        if world.clock.monotonic() < until:
            world.syphon.drain_queue(queue_of("s"), max_wait=0)
        world.clock.advance(1)
        second += 1
    held = [m for m in queue.counts() if m.startswith("s-") or "return" in m]
    assert world.per_session() == {"t": list(range(sent["t"]))}  # t was not held back; s was
    assert max(queue.counts().values()) <= 1  # no held message's delivery count rose by waiting
    delivered_while_held = queue.delivered - 1  # the killed task's receive
    world.clock.advance(2)  # s-0's lock runs out
    world.syphon.drain_queue(queue_of("s"), max_wait=0)
    assert world.per_session() == {"s": list(range(sent["s"])), "t": list(range(sent["t"]))}
    assert len(queue) == 0
    # once each while held (the receive that deferred it), once when it moved
    assert queue.delivered - 1 <= delivered_while_held + len(held)
    assert delivered_while_held <= len(held) + sent["t"]


def test_a_line_whose_entity_backs_off_is_not_fetched_and_deferred_again_at_every_pass(world: World) -> None:
    """O7: the primary entity backs off; its deferred messages are not fetched by the passes in between (no receive,
    no delivery), and move in order once it answers."""
    queue = backlogged(world, ("s", 0, 4))
    world.rig.transport.fail(conn_error, namespace=PRIMARY)
    world.rig.transport.fail(conn_error, op="schedule", namespace=PRIMARY)  # its probes fail too
    world.syphon.drain_queue(queue_of("s"), max_wait=0)
    before = queue.delivered
    for _ in range(20):
        world.clock.advance(1)  # within the 5 s back-off, then probes fail
        world.syphon.drain_queue(queue_of("s"), max_wait=0)
    assert max(queue.counts().values()) <= 1
    periods = 20 // 5 + 1  # the entity's back-off is 5 s: one probe (and one fetch of the line) per period
    assert queue.delivered - before <= 5 * periods  # 4 messages and the marker, not one delivery per pass
    world.rig.transport.heal()
    world.clock.advance(31)
    world.syphon.drain_queue(queue_of("s"), max_wait=0)
    assert world.per_session() == {"s": [0, 1, 2, 3]}


def test_a_new_worker_with_a_stale_healthy_hint_probes_before_it_fetches_a_held_line(world: World) -> None:
    """O7 (found by the simulation, tests/sim, seed 30): through a primary outage every micro-batch's task may run
    in a Python worker new to the entity, whose gate knows only the state table's hint - 'healthy', stale. It
    fetched the held line's deferred messages by sequence number (a delivery each), sent, failed and abandoned
    them: one delivery per pass by no attempt the primary could take, until MaxDeliveryCount dead-lettered the
    head. Now a worker that did not send to the entity recently probes before it fetches, or sends what was
    delivered before; the probe fails, nothing is fetched."""
    queue = backlogged(world, ("s", 0, 4))
    world.rig.transport.fail(conn_error, namespace=PRIMARY)
    world.rig.transport.fail(conn_error, op="schedule", namespace=PRIMARY)  # its probes fail too
    world.syphon.drain_queue(queue_of("s"), max_wait=0)  # the line is deferred
    delivered: list[int] = []
    for _ in range(8):
        world.clock.advance(10)  # a micro-batch every 10 s, each in a new worker
        fresh = world.worker()
        try:
            fresh.drain_queue(queue_of("s"), max_wait=0)
        finally:
            fresh.close()
        delivered.append(queue.delivered)
    # the first new worker receives the line again (abandoned by the first pass's real attempt), probes, fails and
    # defers it; from then on a pass costs no delivery: before, each fetched, sent, failed and abandoned it
    assert delivered[1:] == [delivered[1]] * (len(delivered) - 1), delivered
    assert max(queue.counts().values()) <= 2
    world.rig.transport.heal()
    world.clock.advance(31)
    world.syphon.drain_queue(queue_of("s"), max_wait=0)
    assert world.per_session() == {"s": [0, 1, 2, 3]}


@pytest.mark.parametrize("stall", [False, True], ids=["sends-refused", "sends-stall"])
def test_a_probe_answering_entity_whose_sends_fail_does_not_raise_the_heads_delivery_count_per_pass(
    world: World, stall: bool
) -> None:
    """O7, O1 (found by the simulation, tests/sim seeds 57, 139, ...: entity-stall / entity-refuse): the primary
    entity answers its probes while its sends fail. Every pass - in a worker new to the entity, or after the gate's
    back-off in the same one - probes, tries the line's head for real and fails. Before, each failed attempt
    abandoned the head: its delivery count followed the outage (20 passes: 20), and a backlog queue with the
    service's default MaxDeliveryCount 10 dead-letters it out of its line's order. Now a message whose count rose
    once is deferred after a failed attempt: the count stays, the line keeps its place and moves in order."""
    queue = backlogged(world, ("s", 0, 4))
    if stall:
        world.rig.transport.stall(namespace=PRIMARY)
    else:
        world.rig.transport.fail(conn_error, namespace=PRIMARY)  # sends only: the probes (schedule) answer
    counts: list[int] = []
    for n in range(20):
        world.clock.advance(10)  # a micro-batch every 10 s: past the entity's back-off (5 s)
        if n % 2:
            world.syphon.drain_queue(queue_of("s"), max_wait=0)  # the same worker again
        else:
            fresh = world.worker()  # a worker new to the entity
            try:
                fresh.drain_queue(queue_of("s"), max_wait=0)
            finally:
                fresh.close()
        counts.append(max(queue.counts().values()))
    assert world.primary() == []
    assert max(counts) <= 3, counts
    world.rig.transport.heal()
    world.clock.advance(LOCK.total_seconds() + 1)
    world.syphon.drain_queue(queue_of("s"), max_wait=0)
    assert world.per_session() == {"s": [0, 1, 2, 3]}
    assert len(queue) == 0
    record = world.book.held("orders", "s")
    assert record is not None and record.drained


def test_an_ordered_line_whose_entity_does_not_exist_is_still_dead_lettered_at_its_last_attempt(
    world: World,
) -> None:
    """F9 with ordering: a failed attempt that answered not-found abandons (each delivery counts towards the
    verdict), it is not deferred as an outage's is (O7) - else the line would stay in the backlog for ever."""
    from azure.servicebus.exceptions import MessagingEntityNotFoundError

    def gone() -> BaseException:
        return MessagingEntityNotFoundError(message="no such queue")

    queue = backlogged(world, ("s", 0, 2))
    world.rig.transport.fail(gone, namespace=PRIMARY)
    world.rig.transport.fail(gone, op="schedule", namespace=PRIMARY)  # its probes answer not-found too
    undeliverable = 0
    for _ in range(30):
        world.clock.advance(10)
        undeliverable += world.syphon.drain_queue(queue_of("s"), max_wait=0).undeliverable
        if not [m for m in queue.counts() if m.startswith("s-")]:
            break
    assert undeliverable == 2 and world.primary() == []


# ------------------------------------------------------------------------------------------- clock skew
@pytest.mark.parametrize("ordering", ["session", "none"])
def test_an_executor_a_minute_ahead_of_the_service_still_moves_fresh_locks(ordering: str) -> None:
    """Suspicion (issue 47): the service's clock is a minute behind the executor's, so every fresh lock's
    ``locked_until`` reads as now on the executor. A lock is measured from the local time of its receive: the
    messages move."""
    w = World(ordering=ordering)
    for q in w.queues.values():
        q.skew = LOCK
    w.fail_over()
    w.rig.sender.send(msgs("s", 0, 3))
    w.recover()
    out = w.drain()
    assert out.skipped_lock_expiring == 0
    assert w.per_session() == {"s": [0, 1, 2]}
    w.syphon.close()


def test_with_prefetch_a_lock_is_measured_from_the_receive_before_and_a_slow_clock_hides_nothing() -> None:
    """With prefetch, a message may have been locked into the buffer when the previous receive began; an executor a
    minute behind the service (every lock reads as two minutes long) still treats it as that old."""
    w = World()
    w.syphon.config = make_config(ordering="session", syphon_prefetch=10)
    for q in w.queues.values():
        q.skew = -LOCK
    w.fail_over()
    w.rig.sender.send(msgs("s", 0, 2))
    w.recover()
    name = queue_of("s")
    assert w.syphon.drain_queue(name, max_wait=0, max_batches=0).receive_calls == 0
    w.syphon._last_receive[(name, False)] = w.clock.monotonic()  # a receive began (credit issued)
    w.clock.advance(LOCK.total_seconds() - 1)  # the buffer filled then; its locks have a second left
    out = w.syphon.drain_queue(name, max_wait=0, max_batches=1)
    assert (
        out.skipped_lock_expiring == 1 and out.deferred == 3 and w.primary() == []
    )  # s-0; its line behind it
    w.syphon.drain_queue(name, max_wait=0)  # their next delivery is fresh
    assert w.per_session() == {"s": [0, 1]}
    w.syphon.close()
