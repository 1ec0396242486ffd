"""The settle step (SOURCE.md §4 step 1, R13, R15): deferred numbers deleted 100 per request, the others owed or
dropped, idempotent, bounded by its deadline."""

from __future__ import annotations

import pytest

from servicebus_local.clock import FakeClock
from spark_sb.source.manifest import Manifest, ranges_of
from spark_sb.source.settle import REMEMBER, Settler, settle_numbers
from spark_sb.source.transport import DEFERRED
from tests.unit.source.fakes import FakeEntity, FakeLink

CH = "p/orders"


def entity_with(clock: FakeClock, n: int, defer: set[int] | None = None) -> tuple[FakeEntity, FakeLink]:
    """``n`` messages; the ones in ``defer`` (all by default) received and deferred."""
    e = FakeEntity(clock)
    for _ in range(n):
        e.send()
    link = e.link()
    got = link.receive(n, 0, 1)
    link.defer([r for r in got if defer is None or r.seq in defer], 1)
    return e, link


def test_a_committed_batch_is_deleted_100_numbers_per_request() -> None:
    clock = FakeClock()
    e, link = entity_with(clock, 250)
    deleted, owed, dropped, complete = settle_numbers(link, list(range(1, 251)), clock)
    assert (len(deleted), owed, dropped, complete) == (250, set(), set(), True)
    assert e.messages == {} and e.calls["delete"] == 3 and e.calls["peek"] == 0


def test_a_number_not_deferred_is_owed_if_still_there_and_dropped_if_gone() -> None:
    clock = FakeClock()
    e, link = entity_with(clock, 10, defer={1, 2, 3, 5, 6, 7, 8, 9, 10})  # 4 stays locked (never deferred)
    del e.messages[9]  # gone (another consumer, TTL)
    deleted, owed, dropped, complete = settle_numbers(link, list(range(1, 12)), clock)  # 11 never existed
    assert deleted == {1, 2, 3, 5, 6, 7, 8, 10}
    assert owed == {4} and dropped == {9, 11} and complete
    assert list(e.messages) == [4]


def test_a_refusal_after_the_peek_is_bisected_down_to_single_numbers() -> None:
    clock = FakeClock()
    e, link = entity_with(clock, 8)
    refuse = {"left": 2}

    def racing(op: str, phase: str, _link: object) -> None:
        # the first request is refused as if 6 were not deferred, and so is the peek-guided retry
        if op == "delete" and phase == "before" and refuse["left"]:
            refuse["left"] -= 1
            raise_not_found()

    e.hook = racing
    deleted, owed, dropped, _ = settle_numbers(link, list(range(1, 9)), clock)
    assert deleted == set(range(1, 9)) and owed == set() and dropped == set()
    # refused, refused again (all 8 shown deferred by the peek), then the bisect's halves [1..4] and [5..8]
    assert e.calls["delete"] == 4
    assert e.messages == {}


def raise_not_found() -> None:
    from spark_sb.source.transport import NotFound

    raise NotFound("raced")


def test_a_lost_reply_leaves_the_numbers_owed_and_the_next_settle_drops_them() -> None:
    clock = FakeClock()
    e, link = entity_with(clock, 5)

    def lose(op: str, phase: str, _link: object) -> None:
        if op == "delete" and phase == "after":
            raise TimeoutError("reply lost")

    e.hook = lose
    s = Settler(CH, clock)
    start = Manifest(b=3, m={CH: ((1, 5),)})
    first = s.settle(link, start)
    assert e.messages == {} and first.owed == ((1, 5),) and not first.complete
    e.hook = None
    again = s.settle(link, start)  # not remembered: it was incomplete
    assert (again.owed, again.settled, again.dropped, again.complete) == ((), 0, 5, True)


def test_past_its_deadline_the_rest_stays_owed_and_is_deleted_by_the_next_settle() -> None:
    clock = FakeClock()
    e, link = entity_with(clock, 300)

    def slow(op: str, phase: str, _link: object) -> None:
        if op == "delete" and phase == "after":
            clock.advance(35)

    e.hook = slow
    s = Settler(CH, clock, timeout=60, call_timeout=10)
    res = s.settle(link, Manifest(b=1, m={CH: ((1, 300),)}))
    assert res.settled == 200 and res.owed == ((201, 300),) and not res.complete
    assert all(m.state == DEFERRED for m in e.messages.values()) and len(e.messages) == 100
    e.hook = None
    res = s.settle(link, Manifest(b=1, m={CH: ((1, 300),)}, owed={CH: res.owed}))
    assert (res.settled, res.owed, res.dropped) == (100, (), 200)
    assert e.messages == {}


def test_a_settled_manifest_is_remembered_and_not_settled_again_within_a_bound() -> None:
    clock = FakeClock()
    e, link = entity_with(clock, 3)
    s = Settler(CH, clock)
    m = Manifest(b=7, m={CH: ((1, 3),)})
    assert s.settle(link, m).settled == 3
    calls = sum(e.calls.values())
    assert s.settle(link, m).settled == 3 and sum(e.calls.values()) == calls
    for b in range(REMEMBER):
        s.settle(link, Manifest(b=100 + b, m={CH: ranges_of([1000 + b])}))
    assert s.settled(m) is None  # forgotten: a settle again finds the numbers gone
    assert s.settle(link, m).dropped == 3


@pytest.mark.parametrize("fault", ["before", "after"])
def test_a_peek_that_fails_keeps_the_numbers_owed_never_dropped(fault: str) -> None:
    clock = FakeClock()
    e, link = entity_with(clock, 3, defer={1, 2})
    del e.messages[2]  # gone: the delete of [1, 2, 3] is refused

    def broken(op: str, phase: str, _link: object) -> None:
        if op == "peek" and phase == fault:
            raise ConnectionError("peek failed")

    e.hook = broken
    deleted, owed, dropped, complete = settle_numbers(link, [1, 2, 3], clock)
    assert deleted == set() and owed == {1, 2, 3} and dropped == set()
    assert (
        not complete
    )  # 1 is deferred and owed now: the settle must be tried again (found by the simulation)
