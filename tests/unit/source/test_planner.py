"""The driver's planner (SOURCE.md §4-§6, R13-R16, R18, R23, R24) on the fake entity and the fake clock."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from servicebus_local.clock import FakeClock
from spark_sb.source.batch import BatchStats, PlannerLimits
from spark_sb.source.manifest import Manifest, PartitionSpec, numbers
from spark_sb.source.planner import SourcePlanner
from spark_sb.source.reader import DataLossError, read_partition
from spark_sb.source.transport import DEFERRED
from tests.unit.source.fakes import LOCKED, FakeEntity

CH = "p/orders"


def world(n: int = 0, **limits: Any) -> tuple[FakeClock, FakeEntity, SourcePlanner]:
    clock = FakeClock()
    e = FakeEntity(clock, lock_duration=30.0)
    for _ in range(n):
        e.send()
    return clock, e, SourcePlanner("orders", e.link(), clock, PlannerLimits(**limits))


def seqs(offset: dict[str, Any]) -> list[int]:
    return list(numbers(Manifest.from_dict(offset).ranges(CH)))


def test_a_batch_is_received_locked_deferred_in_partitions_and_deleted_at_commit() -> None:
    clock, e, p = world(7, max_per_partition=3)
    start = p.initial_offset()
    end = p.latest_offset(start, None)
    assert seqs(end) == list(range(1, 8)) and Manifest.from_dict(end).b == 1
    assert Manifest.from_dict(end).epoch == {CH: e.created_at} and end["n"] == 7
    assert all(m.state == LOCKED for m in e.messages.values())
    specs = p.partitions(start, end)
    assert [s.ranges for s in specs] == [((1, 3),), ((4, 5),), ((6, 7),)]
    assert all(m.state == DEFERRED for m in e.messages.values())
    assert p.partitions(start, end) == specs and e.calls["defer"] == 1  # pure: the second call defers nothing
    p.commit(end)
    assert e.messages == {} and e.calls["delete"] == 1
    assert p.latest_offset(end, None) == end  # nothing new: start unchanged; its settle was not done again
    assert e.calls["delete"] == 1


def test_defer_later_completes_a_batch_committed_within_defer_after_with_its_locks_never_deferring_it() -> (
    None
):
    clock, e, _ = world(4)
    stats: list[BatchStats] = []
    p = SourcePlanner(
        "orders", e.link(), clock, PlannerLimits(defer_after=10.0), defer_later=True, on_batch=stats.append
    )
    start = p.initial_offset()
    end = p.latest_offset(start, None)
    specs = p.partitions(start, end)
    assert all(m.state == LOCKED for m in e.messages.values())
    assert [x.seq for s in specs for x in read_partition(s, e.peeker())] == [1, 2, 3, 4]  # read while locked
    clock.advance(5)
    p.keep_locks()  # not due yet: nothing deferred
    assert e.calls["defer"] == 0
    p.commit(end)  # one range disposition with the locks held: no defer, no delete by number
    assert e.messages == {} and (e.calls["defer"], e.calls["complete"], e.calls["delete"]) == (0, 1, 0)
    assert [(x.received, x.deferred, x.completed) for x in stats] == [(4, 0, 4)]
    assert p.latest_offset(end, None) == end and e.calls["complete"] == 1  # settled once
    # run_defer (production: the keeper once deferAfter passed; here at once) defers; commit then deletes
    e.send()
    start, end = end, p.latest_offset(end, None)
    p.partitions(start, end)
    p.run_defer()
    assert e.calls["defer"] == 1 and e.states()["deferred"] == 1
    p.commit(end)
    assert e.messages == {} and e.calls["delete"] == 1


def test_the_keeper_defers_a_planned_batch_once_it_outlives_defer_after_and_a_lapsed_lock_is_taken_back() -> (
    None
):
    clock, e, _ = world(6)
    p = SourcePlanner(
        "orders", e.link(), clock, PlannerLimits(defer_after=20.0, max_messages=3), defer_later=True
    )
    start = p.initial_offset()
    end = p.latest_offset(start, None)
    p.partitions(start, end)
    assert p.keep_locks() == clock.monotonic() + 15.0  # the locks' half (30 s locks) before the defer's due
    clock.advance(15)
    p.keep_locks()
    assert e.calls["renew"] == 1 and e.calls["defer"] == 0
    clock.advance(5)
    p.keep_locks()  # 20 s: due
    assert e.calls["defer"] == 1 and [m.state for m in e.messages.values()][:3] == [DEFERRED] * 3
    p.commit(end)
    assert sorted(e.messages) == [4, 5, 6]
    # a planned message whose lock lapsed (the keeper starved) and that a read-ahead receives again is held again
    # for its own batch, not the next one
    q = SourcePlanner(
        "orders",
        e.link(),
        clock,
        PlannerLimits(defer_after=60.0, max_messages=2),
        defer_later=True,
        read_ahead=True,
    )
    start = q.initial_offset()
    end = q.latest_offset(start, None)
    assert seqs(end) == [4, 5]
    q.partitions(start, end)
    clock.advance(31)  # no keeper: 4 and 5 are active again
    assert q.read_ahead() == 1  # 6 for the next batch; 4 and 5 for their own, locked again
    q.commit(end)
    assert sorted(e.messages) == [6] and max(m.delivery_count for m in e.messages.values()) == 1
    nxt = q.latest_offset(end, None)
    assert seqs(nxt) == [6]


def test_the_read_ahead_thread_receives_while_the_batch_is_read_and_stops_with_the_planner() -> None:
    clock, e, _ = world(8)
    p = SourcePlanner(
        "orders", e.link(), clock, PlannerLimits(max_messages=4), defer_thread=True, read_ahead=True
    )
    start = p.initial_offset()
    end = p.latest_offset(start, None)
    p.partitions(start, end)
    deadline = time.monotonic() + 10
    while len([m for m in e.messages.values() if m.state == LOCKED]) < 8 and time.monotonic() < deadline:
        time.sleep(0.01)  # the thread's work, awaited (its end is not observable otherwise)
    assert all(m.state == LOCKED for m in e.messages.values())  # this batch and the next, locked
    p.stop()
    assert not p._deferrer.thread.is_alive()  # noqa: SLF001 - the thread ends with the planner
    assert [m.state for m in e.messages.values()][:4] == [DEFERRED] * 4  # stopping defers the planned batch


def test_a_restarted_driver_sweeps_for_orphans_when_the_dead_ones_sweep_never_succeeded() -> None:
    clock, e, _ = world(5)
    link = e.link()
    link.defer(link.receive(2, 0, 1), 1)  # orphans of a lost checkpoint: 1, 2
    failing = True

    def hook(op: str, phase: str, _link: object) -> None:
        if failing and op == "peek" and phase == "before":
            raise ConnectionError(op)

    e.hook = hook
    p = SourcePlanner("orders", e.link(), clock, PlannerLimits(recover_deferred=True))
    start = p.initial_offset()
    clock.advance(31)
    end = p.latest_offset(start, None)  # the sweep failed again: 3..5 only, the offset says a sweep is due
    assert seqs(end) == [3, 4, 5] and end["sweep"] is True
    p.partitions(start, end)  # ... and the driver dies: the new one is never asked for an initial offset
    failing = False
    p2 = SourcePlanner("orders", e.link(), clock, PlannerLimits(recover_deferred=True))
    end2 = p2.latest_offset(end, None)
    assert seqs(end2) == [1, 2] and "sweep" not in end2


def test_nothing_received_returns_start_and_writes_nothing() -> None:
    clock, e, p = world(0, receive_wait=1.0)
    start = p.initial_offset()
    t0 = clock.monotonic()
    assert p.latest_offset(start, None) == start
    assert e.calls["receive"] == 1 and clock.monotonic() - t0 == 1.0  # one empty receiveWaitTime


def test_limits_max_rows_max_messages_max_bytes_and_the_range_cut() -> None:
    _, _, p = world(20, receive_batch=4)
    assert len(seqs(p.latest_offset(p.initial_offset(), 6))) == 6
    _, _, p = world(20, receive_batch=4, max_messages=5)
    assert len(seqs(p.latest_offset(p.initial_offset(), None))) == 5
    _, _, p = world(20, receive_batch=1, max_bytes=200)  # 51 bytes a message: the fourth passes 200
    assert len(seqs(p.latest_offset(p.initial_offset(), None))) == 4
    clock, e, p = world(8, max_offset_ranges=2)
    for s in (2, 4, 6):  # deferred by someone else: 1, 3, 5, 7-8 are received
        e.messages[s].state = DEFERRED
    start = p.initial_offset()
    end = p.latest_offset(start, None)
    assert seqs(end) == [1, 3]  # cut at 2 ranges; 5, 7, 8 carried, still locked, into the next batch
    p.partitions(start, end)
    p.commit(end)
    assert seqs(p.latest_offset(end, None)) == [5, 7, 8]


def test_max_receive_time_ends_a_receive_that_keeps_getting_messages() -> None:
    clock, e, p = world(50, receive_batch=2, max_receive_time=10.0)

    def slow(op: str, phase: str, _link: object) -> None:
        if op == "receive" and phase == "after":
            clock.advance(3)

    e.hook = slow
    assert len(seqs(p.latest_offset(p.initial_offset(), None))) == 8  # 4 receives: 0, 3, 6, 9 s


def test_min_messages_waits_holding_the_locks_until_max_trigger_delay() -> None:
    clock, e, p = world(2, min_messages=5, max_trigger_delay=60.0)
    start = p.initial_offset()
    assert p.latest_offset(start, None) == start
    e.send()
    clock.advance(20)
    assert p.latest_offset(start, None) == start
    clock.advance(41)  # 61 s since the planner started: the delay is over; the locks were renewed on the way
    end = p.latest_offset(start, None)
    assert seqs(end) == [1, 2, 3] and e.states()["locked"] == 3


def test_the_lock_keeper_renews_held_locks_at_half_their_duration_so_a_slow_wal_loses_none() -> None:
    clock, e, p = world(3)
    start = p.initial_offset()
    end = p.latest_offset(start, None)
    renews = []
    for _ in range(12):  # 3 minutes of a slow offset log at a 30 s lock: the keeper's thread ticks every 15 s
        clock.advance(15)
        p.keep_locks()
        renews.append(e.calls["renew"])
    assert renews[-1] >= 6
    p.partitions(start, end)
    assert all(m.state == DEFERRED for m in e.messages.values())
    assert max(m.delivery_count for m in e.messages.values()) == 1


def test_a_defer_refused_for_a_lost_lock_leaves_the_message_owed_then_completed_never_emitted() -> None:
    clock, e, p = world(3)
    start = p.initial_offset()
    end = p.latest_offset(start, None)
    clock.advance(31)  # no keeper: the locks lapse before partitions()
    specs = p.partitions(start, end)
    assert specs == [PartitionSpec(CH, ((1, 3),))]
    # refused for the lapsed locks: nothing deferred
    assert e.calls["defer"] == 1 and e.states()["active"] == 3
    p.commit(end)  # settle: not deferred, still there -> owed
    e.send()
    nxt = p.latest_offset(end, None)
    assert Manifest.from_dict(nxt).owed == {}  # all three completed at once when received again
    assert seqs(nxt) == [4] and list(e.messages) == [4]


def test_a_new_driver_settles_a_batch_that_was_never_deferred_and_completes_it_when_it_comes_back() -> None:
    """The prototype's duplicate: a batch in the WAL whose driver died before the defer."""
    clock, e, p = world(4)
    start = p.initial_offset()
    end = p.latest_offset(start, None)  # WAL'd; the driver dies before partitions()
    clock.advance(5)
    p2 = SourcePlanner("orders", e.link(), clock, PlannerLimits())
    assert p2.partitions(start, end) == [
        PartitionSpec(CH, ((1, 4),))
    ]  # the replay: nothing held, nothing deferred
    p2.commit(end)
    e.send()
    clock.advance(30)  # the dead driver's locks lapse
    nxt = p2.latest_offset(end, None)
    assert seqs(nxt) == [5] and list(e.messages) == [5]
    assert max(d for d in (m.delivery_count for m in e.messages.values())) == 1


def test_spark_4_0_latest_offset_without_start_learns_it_from_partitions_o_o() -> None:
    clock, e, p = world(2)
    start = p.initial_offset()
    end = p.latest_offset(start, None)
    p.partitions(start, end)
    p2 = SourcePlanner("orders", e.link(), clock, PlannerLimits())  # a restart after batch 1 committed
    assert p2.partitions(end, end) == []  # setLatestSeenOffset
    e.send()
    nxt = p2.latest_offset(None, None)
    assert Manifest.from_dict(nxt).b == 2 and seqs(nxt) == [3]
    assert list(e.messages) == [3]  # batch 1 settled first


def test_asked_again_before_planning_the_same_manifest_comes_back() -> None:
    _, e, p = world(2)
    start = p.initial_offset()
    end = p.latest_offset(start, None)
    e.send()
    assert p.latest_offset(start, None) == end


def test_available_now_stops_at_the_watermark_under_a_live_producer() -> None:
    clock, e, p = world(10, receive_batch=4)
    start = p.initial_offset()
    assert p.prepare_available_now() == 10
    got: list[int] = []
    for _ in range(10):
        for _ in range(3):
            e.send()
        end = p.latest_offset(start, None)
        if end == start:
            break
        p.partitions(start, end)
        p.commit(end)
        got.extend(seqs(end))
        start = end
    assert got[:10] == list(range(1, 11)) and max(got) <= 10 + 4  # the overshoot: at most one receive


def test_report_latest_gives_backlog_owed_and_the_oldest_age() -> None:
    clock, e, p = world(3)
    clock.advance(42)
    start = p.initial_offset()
    end = p.latest_offset(start, 2)
    p.partitions(start, end)
    assert p.report_latest() == {
        "activeMessages": 1,
        "deferredOnEntity": 2,
        "owed": 0,
        "oldestAgeSeconds": 42.0,
    }


def test_a_re_created_entity_fails_the_query_or_starts_over_without_settling() -> None:
    clock, e, p = world(2)
    old = Manifest(b=5, m={CH: ((1, 2),)}, epoch={CH: "2025-01-01T00:00:00+00:00"}).to_dict()
    with pytest.raises(DataLossError, match="re-created"):
        p.latest_offset(old, None)
    _, e2, p2 = world(2, fail_on_data_loss=False)
    end = p2.latest_offset(old, None)
    assert e2.calls["delete"] == 0 and Manifest.from_dict(end).b == 6 and seqs(end) == [1, 2]


def test_a_new_checkpoint_warns_the_count_of_orphan_deferred_messages_and_can_adopt_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, e, _ = world(5)
    link = e.link()
    link.defer(link.receive(3, 0, 1), 1)  # a dead driver's batch, its checkpoint lost
    for _ in range(200):
        e.send()  # a backlog: 4..205
    with caplog.at_level(logging.WARNING):
        p = SourcePlanner("orders", e.link(), clock, PlannerLimits(max_messages=100))
        start = p.initial_offset()
        assert "deferred messages" not in caplog.text  # counted once the backlog present now is received
        assert e.calls["peek"] <= 2 * 8 + 2  # no sweep of the backlog: W pinned by a galloping peek
        end = p.latest_offset(start, None)
        assert seqs(end) == list(range(4, 104))  # the orphans stay invisible
        p.partitions(start, end)
        e.send()  # 206, above the number pinned at start
        end2 = p.latest_offset(end, None)
        assert seqs(end2) == list(range(104, 204)) and "deferred messages" not in caplog.text
        p.partitions(end, end2)
        peeks = e.calls["peek"]
        end3 = p.latest_offset(end2, None)  # receives past W: counted at the next trigger, after its settle
        assert seqs(end3) == [204, 205, 206]
        p.partitions(end2, end3)
        p.latest_offset(end3, None)
    assert caplog.text.count("3 deferred messages are named by no offset") == 1
    assert e.calls["peek"] - peeks <= 2  # the count peeked what was left up to W: the three orphans
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        p = SourcePlanner("orders", e.link(), clock, PlannerLimits(recover_deferred=True))
        start = p.initial_offset()
    assert (
        "3 deferred messages are named by no offset of this checkpoint (a lost or new checkpoint); adopting"
        in (caplog.text)
    )
    clock.advance(31)
    assert seqs(p.latest_offset(start, None)) == [1, 2, 3]


def test_on_batch_gets_each_batchs_numbers_once() -> None:
    got: list[BatchStats] = []
    clock, e, _ = world(4)
    p = SourcePlanner("orders", e.link(), clock, PlannerLimits(), on_batch=got.append)
    start = p.initial_offset()
    end = p.latest_offset(start, None)
    p.partitions(start, end)
    p.partitions(start, end)
    assert [(s.b, s.received, s.deferred, s.defer_failed) for s in got] == [(1, 4, 4, 0)]


def test_a_link_factory_reopens_the_link_after_a_fault_and_no_call_raises() -> None:
    clock, e, _ = world(2)
    opened = []

    def factory() -> Any:
        opened.append(e.link())
        return opened[-1]

    p = SourcePlanner("orders", factory, clock, PlannerLimits())
    start = p.initial_offset()

    def down(op: str, phase: str, _link: object) -> None:
        raise ConnectionError("namespace down")

    e.hook = down
    assert p.latest_offset(start, None) == start
    e.hook = None
    assert seqs(p.latest_offset(start, None)) == [1, 2] and len(opened) == 2


def test_an_idle_query_settles_again_what_a_faulted_settle_left_owed() -> None:
    """Found by the simulation (seed 32): a settle cut short left deferred numbers owed, and with no new batch the
    same start was never settled again - the entity kept them deferred for good."""
    clock, e, p = world(3)
    start = p.initial_offset()
    end = p.latest_offset(start, None)
    p.partitions(start, end)

    def fail_delete(op: str, phase: str, _link: object) -> None:
        if op == "delete":
            raise ConnectionError("delete failed")

    e.hook = fail_delete
    assert p.latest_offset(end, None) == end and e.states()["deferred"] == 3
    e.hook = None
    assert p.latest_offset(end, None) == end
    assert e.messages == {}


def test_a_link_that_cannot_be_opened_leaves_start_owed_and_raises_nothing() -> None:
    clock, e, p0 = world(2)
    start = p0.initial_offset()
    end = p0.latest_offset(start, None)
    p0.partitions(start, end)
    down = [True]

    def factory() -> Any:
        if down[0]:
            raise ConnectionError("no connection")
        return e.link()

    p = SourcePlanner("orders", factory, clock, PlannerLimits())
    assert p.latest_offset(end, None) == end and e.states()["deferred"] == 2
    down[0] = False
    assert p.latest_offset(end, None) == end and e.messages == {}


def test_the_keeper_thread_stops_with_the_planner() -> None:
    clock, e, _ = world(1)
    p = SourcePlanner("orders", e.link(), clock, PlannerLimits(), keeper_thread=True)
    assert p._keeper is not None and p._keeper.thread.is_alive()
    p.stop()
    assert not p._keeper.thread.is_alive()


def test_recover_deferred_does_not_adopt_a_replayed_first_batch() -> None:
    """Found by the simulation: a restart replaying batch 0 calls initialOffset again, whose sweep found batch 0's
    own deferred messages; adopted into batch 1 after batch 0's settle deleted them, they were data loss."""
    clock, e, p = world(3)
    p = SourcePlanner("orders", e.link(), clock, PlannerLimits(recover_deferred=True))
    initial = p.initial_offset()
    end0 = p.latest_offset(initial, None)
    p.partitions(initial, end0)  # deferred; the driver dies before the commit log
    p2 = SourcePlanner("orders", e.link(), clock, PlannerLimits(recover_deferred=True))
    start = p2.initial_offset()  # Spark's start of the replayed batch 0
    assert p2.partitions(start, end0) == [PartitionSpec(CH, ((1, 3),))]
    e.send()
    end1 = p2.latest_offset(end0, None)
    assert seqs(end1) == [4] and list(e.messages) == [4]


def test_recover_deferred_sweeps_without_counts_and_again_after_a_failed_sweep() -> None:
    clock, e, _ = world(4)
    link = e.link()
    link.defer(link.receive(2, 0, 1), 1)  # orphans of a lost checkpoint
    failing = {"counts", "peek"}

    def hook(op: str, phase: str, _link: object) -> None:
        if op in failing and phase == "before":
            raise ConnectionError(op)

    e.hook = hook
    p = SourcePlanner("orders", e.link(), clock, PlannerLimits(recover_deferred=True))
    start = p.initial_offset()
    failing.discard("counts")
    failing.discard("peek")
    clock.advance(31)
    assert seqs(p.latest_offset(start, None)) == [1, 2, 3, 4]


def test_a_session_entity_is_refused_in_one_line_before_anything_is_received() -> None:
    from spark_sb.core.errors import ConfigError
    from spark_sb.source.sdk import EntityInfo

    clock, e, p = world(3)
    link = p.link()
    link.info = lambda timeout: EntityInfo(5.0, True, 10)  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"option 'entity': orders is session-enabled") as err:
        p.initial_offset()
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="session-enabled"):
        p.latest_offset(None, None)  # a restarted query (no initialOffset) is refused the same way
    assert e.calls["receive"] == 0 and e.calls["counts"] == 0 and e.locked() == []
    link.info = lambda timeout: EntityInfo(5.0, False, 7)  # type: ignore[attr-defined]
    assert seqs(p.latest_offset(p.initial_offset(), None)) == [1, 2, 3]
    assert p.max_delivery_count == 7  # learned for the near-dead-letter WARN


def test_available_now_ends_when_the_watermark_itself_is_received_without_an_empty_receive() -> None:
    clock, e, p = world(10, receive_batch=4, receive_wait=1.0)
    start = p.initial_offset()
    assert p.prepare_available_now() == 10
    t0 = clock.monotonic()
    end = p.latest_offset(start, None)
    assert seqs(end) == list(range(1, 11))
    assert e.calls["receive"] == 3 and clock.monotonic() == t0  # 4 + 4 + 2: no empty receive waited for
    p.partitions(start, end)
    e.send()  # above W: the next run's
    assert p.latest_offset(end, None) == end  # the run ends after settling the batch; nothing more received
    assert e.calls["receive"] == 3 and e.messages.keys() == {11}


def test_a_trigger_receives_in_calls_of_500() -> None:
    _, e, p = world(1200)
    end = p.latest_offset(p.initial_offset(), None)
    assert len(seqs(end)) == 1200
    assert e.calls["receive"] == 4  # 500 + 500 + 200 + the empty one that ends the trigger


def test_a_session_entity_is_refused_by_the_receive_when_its_properties_cannot_be_read() -> None:
    from spark_sb.core.errors import ConfigError

    _, e, p = world(3)
    link = p.link()

    def no_info(timeout: float) -> Any:
        raise ConnectionError("admin endpoint down")

    def refused(*args: Any) -> Any:  # the service's words (amqp:not-allowed on the receive link's attach)
        raise RuntimeError(
            "It is not possible for an entity that requires sessions to create a non-sessionful message receiver."
        )

    link.info = no_info  # type: ignore[attr-defined]
    link.receive = refused  # type: ignore[method-assign]
    with pytest.raises(ConfigError, match="orders is session-enabled"):
        p.latest_offset(p.initial_offset(), None)


def ahead_world(n: int, **limits: Any) -> tuple[FakeClock, FakeEntity, SourcePlanner]:
    clock = FakeClock()
    e = FakeEntity(clock, lock_duration=30.0)
    for _ in range(n):
        e.send()
    return clock, e, SourcePlanner("orders", e.link(), clock, PlannerLimits(**limits), read_ahead=True)


def test_read_ahead_receives_the_next_batch_while_this_one_is_read_and_the_next_trigger_names_it() -> None:
    clock, e, p = ahead_world(10, max_messages=4, receive_batch=2)
    stats: list[BatchStats] = []
    p.on_batch = stats.append
    start = p.initial_offset()
    end = p.latest_offset(start, None)
    assert p.read_ahead() == 0  # planned, not deferred yet: nothing read ahead
    p.partitions(start, end)
    receives = e.calls["receive"]
    assert p.read_ahead() == 4 and e.calls["receive"] == receives + 2  # up to the batch's limit, locked
    assert [s for s, m in e.messages.items() if m.state == LOCKED] == [5, 6, 7, 8]
    assert [x.seq for x in read_partition(PartitionSpec(CH, ((1, 4),)), e.peeker())] == [1, 2, 3, 4]
    p.commit(end)
    assert sorted(e.messages) == [5, 6, 7, 8, 9, 10]
    nxt = p.latest_offset(end, None)  # named at once: no receive (the batch is full)
    assert seqs(nxt) == [5, 6, 7, 8] and e.calls["receive"] == receives + 2
    p.partitions(end, nxt)
    assert p.read_ahead() == 2  # the backlog's last two, then an empty receive
    p.commit(nxt)
    last = p.latest_offset(nxt, None)
    assert seqs(last) == [9, 10] and max(m.delivery_count for m in e.messages.values()) == 1
    p.partitions(nxt, last)
    assert p.read_ahead() == 0  # the last receive found the entity drained: no backlog, no read-ahead
    assert [(x.received, x.read_ahead) for x in stats] == [(4, 0), (4, 4), (2, 2)]
    # read-ahead messages count in their own batch
    assert [x.max_delivery_count for x in stats] == [1, 1, 1]


def test_read_ahead_holds_no_number_the_offset_log_names_nor_more_than_the_next_trigger_admits_nor_past_available_now() -> (
    None
):
    # a message of the planned batch whose defer failed is active again: reading ahead would take it into the
    # next batch while this one reads it
    clock, e, p = ahead_world(6, max_messages=3)
    start = p.initial_offset()
    end = p.latest_offset(start, None)
    clock.advance(31)  # no keeper: the batch's locks lapse before its defer
    p.partitions(start, end)
    assert e.states()["active"] == 6 and p.read_ahead() == 0 and e.calls["receive"] == 1
    p.commit(end)  # settled: all three owed, active
    nxt = p.latest_offset(end, None)  # completes them when they come back
    assert seqs(nxt) == [4, 5, 6] and Manifest.from_dict(nxt).owed == {}
    for _ in range(5):
        e.send()
    p.partitions(end, nxt)
    assert p.read_ahead() == 3
    p.commit(nxt)
    after = p.latest_offset(nxt, 2)  # the next trigger admits two: the third stays held for the one after
    assert seqs(after) == [7, 8]
    p.partitions(nxt, after)
    p.commit(after)
    assert seqs(p.latest_offset(after, None)) == [9, 10, 11]
    # AvailableNow: a read-ahead that receives the watermark ends the receiving; the next triggers name what it
    # holds, then the run ends
    clock, e, p = ahead_world(6, max_messages=2)
    start = p.initial_offset()
    assert p.prepare_available_now() == 6
    got: list[int] = []
    while True:
        end = p.latest_offset(start, None)
        if end == start:
            break
        got += seqs(end)
        p.partitions(start, end)
        p.read_ahead()
        p.commit(end)
        start = end
    assert got == [1, 2, 3, 4, 5, 6] and e.messages == {}
    assert e.calls["receive"] == 3  # 1-2, then read ahead 3-4 and 5-6 (the watermark: no more receives)
    # nor without read_ahead
    clock, e, _ = ahead_world(6, max_messages=2)
    q = SourcePlanner("orders", e.link(), clock, PlannerLimits(max_messages=2))
    start = q.initial_offset()
    end = q.latest_offset(start, None)
    q.partitions(start, end)
    assert q.read_ahead() == 0


def test_a_read_ahead_stops_at_its_next_receive_when_a_spark_call_waits() -> None:
    clock, e, p = ahead_world(12, max_messages=6, receive_batch=2)
    start = p.initial_offset()
    end = p.latest_offset(start, None)
    p.partitions(start, end)
    committed = threading.Event()

    def commit() -> None:
        p.commit(end)
        committed.set()

    def hook(op: str, phase: str, _link: object) -> None:
        if op == "receive" and phase == "after" and not committed.is_set() and e.calls["receive"] == 4:
            threading.Thread(target=commit, daemon=True).start()
            deadline = time.monotonic() + 10
            while not p._spark_waits.is_set() and time.monotonic() < deadline:  # noqa: SLF001
                time.sleep(0.001)  # the commit's thread, awaited at the mutex

    e.hook = hook
    assert p.read_ahead() == 2  # its first receive; the commit waited, so it stopped there
    assert committed.wait(10) and e.calls["receive"] == 4
    assert seqs(p.latest_offset(end, None)) == [7, 8, 9, 10, 11, 12]
