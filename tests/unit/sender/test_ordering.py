"""The paired sender with ``ordering: session`` / ``entity`` (spark_sb/failover/ordering.py: R1 pin, R2 mark, R3 return
only when drained, R4 no hop), on the fake transport and a fake clock. A syphon is modelled here (it moves a backlog
queue's head to the primary and acknowledges markers to the process's book): what reaches the "primary" is what a
session receiver would see. The races of issue 31: a late backlog send, a syphon pass that straddles a sender's
check, two threads sending one session (interleaved deterministically inside a message generator)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from spark_sb.failover.ordering import (
    WHOLE_ENTITY,
    QueueUnavailableError,
    SessionBook,
    marker_of,
    pinned_queue,
)
from spark_sb.failover.records import EntityState
from spark_sb.message.backlog import RETURN_MARKER, from_backlog
from spark_sb.message.outbound import OutboundMessage
from spark_sb.sender.paired import PairedSender
from spark_sb.wire.transport import PRIMARY, SECONDARY, Target
from tests.unit.sender.rig import QUEUES, Rig, conn_error

FO, H = EntityState.FAILED_OVER, EntityState.HEALTHY


def _all(_: str) -> bool:
    return True


def session_msgs(session: str, start: int, n: int, entity: str | None = None) -> list[OutboundMessage]:
    return [
        OutboundMessage(body=b"x" * 20, entity=entity, session_id=session, message_id=f"{session}-{i}")
        for i in range(start, start + n)
    ]


def book_of(rig: Rig) -> SessionBook:
    return rig.registry.sessions("primary.servicebus.windows.net")


class Syphon:
    """A model of the ordered syphon over the fake transport: moves the head of a backlog queue to the primary
    entity (restored), acknowledges a return marker to the book instead of moving it."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.book = book_of(rig)
        self.taken: dict[str, int] = {}  # queue -> messages already moved

    def step(self, queue: str) -> str | None:
        """Move one message of ``queue``; its message id (or 'marker'), None when the queue is empty."""
        pending = self.rig.transport.at(SECONDARY, queue)
        n = self.taken.get(queue, 0)
        if n >= len(pending):
            return None
        self.taken[queue] = n + 1
        restored, _ = from_backlog(pending[n])
        assert restored.entity is not None
        marker = marker_of(restored)
        if marker is not None:
            self.book.acknowledged(restored.entity, restored.session_id or WHOLE_ENTITY, marker)
            return "marker"
        self.rig.transport.delivered.setdefault(Target(PRIMARY, restored.entity), []).append(restored)
        return restored.message_id

    def drain(self, queue: str | None = None) -> None:
        for q in [queue] if queue else QUEUES:
            while self.step(q) is not None:
                pass


def primary_ids(rig: Rig, entity: str = "orders") -> list[str]:
    return [m.message_id or "" for m in rig.transport.at(PRIMARY, entity)]


def per_session(ids: list[str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i in ids:
        session, n = i.rsplit("-", 1)
        out.setdefault(session, []).append(int(n))
    return out


def in_order(rig: Rig, entity: str = "orders") -> bool:
    return all(v == sorted(v) for v in per_session(primary_ids(rig, entity)).values())


def fail_over(rig: Rig) -> None:
    rig.transport.fail(conn_error, namespace=PRIMARY)


def recover(rig: Rig) -> None:
    """The primary answers again; the next send's admit probes it (due after ping_primary_interval)."""
    rig.transport.heal()
    rig.clock.advance(31)


# ---------------------------------------------------------------------------------------------------------
# Healthy path: nothing changes, nothing extra


def test_healthy_path_with_ordering_sends_as_without_it() -> None:
    plain, ordered = Rig(), Rig(ordering="session")
    batch = [m for s in ("a", "b", "c") for m in session_msgs(s, 0, 20)]
    plain.sender.send(batch)
    out = ordered.sender.send(batch)
    assert primary_ids(ordered) == primary_ids(plain)
    assert ordered.transport.sends() == plain.transport.sends()  # the same round trips, no marker, no look-up
    assert out.total_diverted == 0 and len(book_of(ordered)) == 0 and ordered.backlog() == []


def test_a_user_message_carrying_the_marker_property_is_rejected_not_swallowed_by_the_syphon() -> None:
    rig = Rig(ordering="session", failover_interval=0.0)
    fail_over(rig)
    forged = OutboundMessage(body=b"x", session_id="s", message_id="forged", properties={RETURN_MARKER: "m"})
    out = rig.sender.send([*session_msgs("s", 0, 2), forged])
    assert [r.field for r in out.rejects] == [f"properties.{RETURN_MARKER}"]
    assert out.total_diverted == 2
    Syphon(rig).drain()
    assert primary_ids(rig) == ["s-0", "s-1"]  # and the session's own marker, acknowledged, released it
    recover(rig)
    rig.sender.send(session_msgs("s", 2, 1))
    assert primary_ids(rig) == ["s-0", "s-1", "s-2"]


# ---------------------------------------------------------------------------------------------------------
# R1, R2: pinned, marked


def test_a_diverted_session_is_pinned_to_one_queue_and_marked_behind_its_messages() -> None:
    rig = Rig(ordering="session", failover_interval=0.0)
    fail_over(rig)
    sessions = [f"s{i}" for i in range(8)]
    out = rig.sender.send([m for i in range(3) for s in sessions for m in session_msgs(s, i, 1)])
    assert out.total_diverted == 24  # the markers are not counted as the caller's messages
    for s in sessions:
        queue = pinned_queue(s, QUEUES, _all)
        assert queue is not None
        mine = [
            from_backlog(m)[0]
            for m in rig.transport.at(SECONDARY, queue)
            if from_backlog(m)[0].session_id == s
        ]
        assert [m.message_id for m in mine[:-1]] == [f"{s}-0", f"{s}-1", f"{s}-2"]
        assert RETURN_MARKER in mine[-1].properties  # behind them, in the same queue
        elsewhere = [m for q in QUEUES if q != queue for m in rig.transport.at(SECONDARY, q)]
        assert all(from_backlog(m)[0].session_id != s for m in elsewhere)
    # at most one marker batch per queue for all its sessions, not one send per session
    plain = Rig(ordering="none", failover_interval=0.0)
    fail_over(plain)
    plain.sender.send([m for i in range(3) for s in sessions for m in session_msgs(s, i, 1)])
    assert len(rig.transport.sends(SECONDARY)) <= len(plain.transport.sends(SECONDARY)) + len(QUEUES)


def test_ordering_entity_pins_every_message_of_an_entity_and_marks_the_entity() -> None:
    rig = Rig(ordering="entity", failover_interval=0.0)
    fail_over(rig)
    rig.sender.send(
        [OutboundMessage(body=b"x", message_id=f"e-{i}", session_id=None) for i in range(10)]
        + session_msgs("s", 0, 3)
    )
    queue = pinned_queue("orders", QUEUES, _all)
    assert queue is not None
    restored = [from_backlog(m)[0] for m in rig.transport.at(SECONDARY, queue)]
    assert [m.message_id for m in restored[:-1]] == [f"e-{i}" for i in range(10)] + ["s-0", "s-1", "s-2"]
    assert marker_of(restored[-1]) is not None and restored[-1].session_id is None
    assert book_of(rig).held("orders", WHOLE_ENTITY) is not None


# ---------------------------------------------------------------------------------------------------------
# R3: back to the primary only when drained


def test_after_recovery_a_held_session_waits_behind_its_backlog_until_its_marker_is_acknowledged() -> None:
    rig = Rig(ordering="session", failover_interval=0.0)
    syphon = Syphon(rig)
    fail_over(rig)
    rig.sender.send(session_msgs("old", 0, 5))
    recover(rig)
    rig.sender.send(session_msgs("old", 5, 3) + session_msgs("new", 0, 3))
    assert rig.sender.entity_state("orders") is H
    assert primary_ids(rig) == ["new-0", "new-1", "new-2"]  # never diverted: never delayed
    assert book_of(rig).held("orders", "old") is not None  # behind its 5 messages, in the backlog
    syphon.drain()  # moves old-0..7, acknowledges both markers
    rig.sender.send(session_msgs("old", 8, 2))
    assert per_session(primary_ids(rig))["old"] == list(range(10))
    assert len(book_of(rig)) == 0  # released


def test_a_syphon_pass_that_straddles_the_senders_check_keeps_the_session_held() -> None:
    rig = Rig(ordering="session", failover_interval=0.0)
    syphon = Syphon(rig)
    fail_over(rig)
    rig.sender.send(session_msgs("s", 0, 3))
    recover(rig)
    queue = pinned_queue("s", QUEUES, _all)
    assert queue is not None
    syphon.step(queue)
    syphon.step(queue)  # the pass has moved s-0, s-1; s-2 and the marker are still ahead of it
    rig.sender.send(session_msgs("s", 3, 1))  # the check sees no acknowledgement: behind them
    syphon.drain(queue)  # the pass ends after the check (s-2, marker, s-3, its marker)
    rig.sender.send(session_msgs("s", 4, 1))
    assert per_session(primary_ids(rig))["s"] == [0, 1, 2, 3, 4]


def test_a_late_backlog_send_of_another_call_keeps_the_session_held() -> None:
    """Call A has diverted s-5 (still in its open backlog batch) when call B, on another sender of the process,
    checks the session: the syphon has acknowledged the marker of the earlier call, but A is still sending."""
    rig = Rig(ordering="session", failover_interval=0.0)
    other = PairedSender(rig.config, transport=rig.transport, clock=rig.clock, registry=rig.registry)
    syphon = Syphon(rig)
    fail_over(rig)
    rig.sender.send(session_msgs("s", 0, 5))  # s-0..4 and marker m1

    def call_a() -> Iterator[OutboundMessage]:
        yield from session_msgs("s", 5, 1)  # A routes s-5 to the backlog (its entity is failed over)
        recover(rig)
        syphon.drain()  # the syphon moves s-0..4 and acknowledges m1 meanwhile
        other.send(session_msgs("t", 0, 1) + session_msgs("s", 100, 1))  # B: healthy, checks s
        yield from session_msgs("s", 6, 1)

    rig.sender.send(call_a())
    assert "s-100" not in primary_ids(rig)  # B's s-100 waited in the backlog: A's s-5 was not there yet
    assert "t-0" in primary_ids(rig)  # B's other session was not held back
    syphon.drain()
    other.send(session_msgs("s", 101, 1))
    got = per_session(primary_ids(rig))["s"]
    assert [n for n in got if n < 100] == [0, 1, 2, 3, 4, 5, 6]  # A's calls, in order
    assert [n for n in got if n >= 100] == [100, 101]  # B's (no order between two threads' messages)
    assert len(book_of(rig)) == 0


def test_two_threads_sending_one_session_keep_each_threads_order() -> None:
    """Thread A has s-a0 in an open primary batch when thread B (same process, same registry) diverts the session:
    A's s-a1 follows s-a0 (to the primary batch, which is then diverted whole), never into the backlog ahead of it."""
    rig = Rig(ordering="session", failover_interval=0.0)
    other = PairedSender(rig.config, transport=rig.transport, clock=rig.clock, registry=rig.registry)
    syphon = Syphon(rig)

    def call_b(n: int) -> list[OutboundMessage]:
        return [OutboundMessage(body=b"x", session_id="s", message_id=f"b-{i}") for i in range(n, n + 2)]

    def call_a_renamed() -> Iterator[OutboundMessage]:
        yield OutboundMessage(body=b"x", session_id="s", message_id="a-0")
        fail_over(rig)
        other.send(call_b(0))
        yield OutboundMessage(body=b"x", session_id="s", message_id="a-1")

    rig.sender.send(call_a_renamed())
    queue = pinned_queue("s", QUEUES, _all)
    assert queue is not None
    assert [from_backlog(m)[0].message_id for m in rig.transport.at(SECONDARY, queue)].count("a-0") == 1
    recover(rig)
    syphon.drain()
    rig.sender.send([OutboundMessage(body=b"x", session_id="s", message_id="a-2")])
    other.send(call_b(2))
    got = per_session(primary_ids(rig))
    assert got["a"] == [0, 1, 2] and got["b"] == [0, 1, 2, 3]


# ---------------------------------------------------------------------------------------------------------
# R4: no hop


def test_a_held_sessions_queue_failing_fails_that_session_only_and_nothing_hops() -> None:
    rig = Rig(ordering="session", failover_interval=0.0)
    fail_over(rig)
    rig.sender.send(session_msgs("s", 0, 2))
    queue = pinned_queue("s", QUEUES, _all)
    others = [t for t in (f"t{i}" for i in range(20)) if pinned_queue(t, QUEUES, _all) != queue][:3]
    rig.transport.fail(conn_error, namespace=SECONDARY, entity=queue)
    with pytest.raises(QueueUnavailableError, match=r"'s'.*ordering: session") as caught:
        rig.sender.send(session_msgs("s", 2, 2) + [m for t in others for m in session_msgs(t, 0, 2)])
    assert caught.value.outcome is not None
    assert caught.value.outcome.diverted_by_entity == {"orders": 6}  # the other sessions went out
    for q in QUEUES:
        ids = [from_backlog(m)[0].message_id for m in rig.transport.at(SECONDARY, q)]
        assert "s-2" not in ids and "s-3" not in ids  # not sent anywhere else
    # the queue comes back: the session goes on from where it stopped, behind its messages
    rig.transport.heal()
    rig.transport.fail(conn_error, namespace=PRIMARY)
    rig.clock.advance(301)  # backlog_retry_interval: the pulled queue returns to the rotation
    rig.sender.send(session_msgs("s", 2, 2))
    ids = [from_backlog(m)[0].message_id for m in rig.transport.at(SECONDARY, queue or "")]
    assert [i for i in ids if i and i.startswith("s-")] == ["s-0", "s-1", "s-2", "s-3"]


def test_a_failed_call_closes_its_sessions_so_a_later_marker_releases_them() -> None:
    rig = Rig(ordering="session", failover_interval=0.0)
    syphon = Syphon(rig)
    fail_over(rig)
    queue = pinned_queue("s", QUEUES, _all)
    rig.transport.fail(conn_error, namespace=SECONDARY, entity=queue, count=100)
    with pytest.raises(QueueUnavailableError):
        rig.sender.send(session_msgs("s", 0, 2))
    record = book_of(rig).held("orders", "s")
    assert record is not None and record.sending == 0  # closed although it failed
    rig.transport.heal()
    rig.clock.advance(301)
    rig.sender.send(session_msgs("s", 0, 2))  # the retry of the failed call, still failed over
    recover(rig)
    syphon.drain()
    rig.sender.send(session_msgs("s", 2, 1))
    assert per_session(primary_ids(rig))["s"] == [0, 1, 2]
    assert len(book_of(rig)) == 0


def test_a_marker_whose_queue_fails_is_not_sent_elsewhere_and_the_session_waits_for_the_next() -> None:
    rig = Rig(ordering="session", failover_interval=0.0)
    syphon = Syphon(rig)
    fail_over(rig)
    queue = pinned_queue("s", QUEUES, _all)
    # the marker's tries, for as long as the backlog budget lets its batch try (O8)
    rig.transport.fail(conn_error, namespace=SECONDARY, entity=queue, skip=1)
    rig.sender.send(session_msgs("s", 0, 2))
    assert all(marker_of(from_backlog(m)[0]) is None for q in QUEUES for m in rig.transport.at(SECONDARY, q))
    recover(rig)
    syphon.drain()
    rig.clock.advance(301)  # the queue returns to the rotation
    rig.sender.send(session_msgs("s", 2, 1))  # still held (no marker acknowledged): backlog, with a marker
    assert primary_ids(rig) == ["s-0", "s-1"]
    syphon.drain()
    rig.sender.send(session_msgs("s", 3, 1))
    assert per_session(primary_ids(rig))["s"] == [0, 1, 2, 3]


# ---------------------------------------------------------------------------------------------------------
# The whole story on the model: outages come and go, the syphon moves some of the time


@pytest.mark.parametrize("seed", range(12))
def test_every_session_reaches_the_primary_in_order_through_outages_and_partial_drains(seed: int) -> None:
    import random

    rng = random.Random(seed)
    rig = Rig(ordering="session", failover_interval=0.0)
    syphon = Syphon(rig)
    produced: dict[str, int] = {}
    down = False
    for _ in range(40):
        roll = rng.random()
        if roll < 0.15:
            down = not down
            if down:
                fail_over(rig)
            else:
                recover(rig)
        elif roll < 0.35:
            for _ in range(rng.randint(1, 6)):
                syphon.step(rng.choice(QUEUES))
        else:
            batch = []
            for s in rng.sample([f"s{i}" for i in range(6)], rng.randint(1, 4)):
                n = rng.randint(1, 4)
                batch += session_msgs(s, produced.get(s, 0), n)
                produced[s] = produced.get(s, 0) + n
            rig.sender.send(batch)
    recover(rig)
    syphon.drain()
    got = per_session(primary_ids(rig))
    assert {s: v for s, v in got.items()} == {s: list(range(n)) for s, n in produced.items()}


# ---------------------------------------------------------------------------------------------------------
# O6: the seams of one call


@pytest.mark.parametrize("interval", [0.0, 3.0, 10.0])
def test_an_entity_failing_over_in_the_middle_of_a_call_never_puts_a_later_message_before_an_earlier_one(
    interval: float,
) -> None:
    """Issue 47 item 2: s-0 sits in its entity's open primary batch; a namespace fault met on another entity's
    batch fails the entity over in the same call, a backlog batch goes out (the call's routes are admitted
    again) and s-1 is diverted. The open batch holding s-0 is settled - diverted - before s-1 enters the
    backlog: the pinned queue holds [s-0, s-1, marker], not [s-1, s-0, marker]."""
    rig = Rig(ordering="session", failover_interval=interval)
    rig.transport.fail(conn_error, namespace=PRIMARY, entity="other")
    call = session_msgs("s", 0, 1, entity="orders")
    call += [OutboundMessage(body=b"y" * 300, entity="other", message_id=f"o-{i}") for i in range(12)]
    call += session_msgs("s", 1, 1, entity="orders")
    rig.sender.send(call)
    queue = book_of(rig).held("orders", "s")
    assert queue is not None
    pinned = [from_backlog(m)[0] for m in rig.transport.at(SECONDARY, queue.queue)]
    line = [m.message_id if marker_of(m) is None else "marker" for m in pinned if m.entity == "orders"]
    assert line == ["s-0", "s-1", "marker"]
    rig.transport.heal()
    Syphon(rig).drain()
    assert primary_ids(rig) == ["s-0", "s-1"]


def test_a_held_lines_pulled_queue_is_tried_once_per_call_so_a_blip_never_stops_the_query() -> None:
    """Issue 47 item 4 (SPEC O8): a blip of a held session's queue pulls it from the rotation for
    backlog_retry_interval (300 s). Each later call (a task attempt) tries the queue once, for up to
    send_timeout, before the line fails: while the blip lasts each attempt fails after trying; when the queue
    answers again, well inside the pull, the next attempt goes through and the queue is back in the rotation."""
    rig = Rig(ordering="session", failover_interval=0.0, send_timeout=5.0)
    fail_over(rig)
    rig.sender.send(session_msgs("s", 0, 2))
    queue = pinned_queue("s", QUEUES, _all)
    assert queue is not None
    blip = rig.transport.fail(conn_error, namespace=SECONDARY, entity=queue)
    for attempt in range(3):  # the first call meets the blip; each retry tries the queue again, then fails
        sends = len(rig.transport.sends(SECONDARY))
        began = rig.clock.monotonic()
        with pytest.raises(QueueUnavailableError):
            rig.sender.send(session_msgs("s", 2, 2))
        tries = [c for c in rig.transport.sends(SECONDARY)[sends:] if c[1].entity == queue]
        assert tries, f"attempt {attempt}: the pulled queue was not tried"
        assert rig.clock.monotonic() - began <= 5.0 + 2.0  # within send_timeout (and one op's time)
    rig.transport.heal(blip)  # the blip is over, 300 s of pull are not
    out = rig.sender.send(session_msgs("s", 2, 2))
    assert out.total_diverted == 2
    ids = [from_backlog(m)[0].message_id for m in rig.transport.at(SECONDARY, queue)]
    assert [i for i in ids if i and i.startswith("s-")] == ["s-0", "s-1", "s-2", "s-3"]
    assert rig.registry.rotation.pulled() == []  # back in the rotation for every sender of the process


def test_a_held_lines_queue_failing_in_a_call_is_tried_for_the_backlog_budget_before_its_line_stops() -> None:
    """O8: the batch of a held line has nowhere else to go, so its queue is not pulled after two quick failures
    but tried for up to send_timeout: a blip of a few seconds inside one call costs nothing."""
    rig = Rig(ordering="session", failover_interval=0.0, send_timeout=30.0)
    fail_over(rig)
    rig.sender.send(session_msgs("s", 0, 2))
    queue = pinned_queue("s", QUEUES, _all)
    assert queue is not None
    rig.transport.fail(conn_error, namespace=SECONDARY, entity=queue, count=4)  # about 4 x (1 s + back-off)
    out = rig.sender.send(session_msgs("s", 2, 2))
    assert out.total_diverted == 2
    ids = [from_backlog(m)[0].message_id for m in rig.transport.at(SECONDARY, queue)]
    assert [i for i in ids if i and i.startswith("s-")] == ["s-0", "s-1", "s-2", "s-3"]


def test_a_remark_to_a_pulled_queue_is_tried_not_dropped_for_another_remark_after() -> None:
    """Issue 47's suspicion 'markers dropped with a pulled queue delay a return by up to REMARK_AFTER' (proven at
    ce9de6a): a held line with nothing to send gets a fresh marker (the sink's remark, after REMARK_AFTER); its
    queue had been pulled by a blip meanwhile and the marker was dropped without a try - the line waited another
    10 minutes, against O3. Now the pulled queue is tried once for the marker; it answers, the marker goes."""
    rig = Rig(ordering="session", failover_interval=0.0)
    syphon = Syphon(rig)
    fail_over(rig)
    rig.sender.send(session_msgs("s", 0, 2))
    queue = pinned_queue("s", QUEUES, _all)
    assert queue is not None
    recover(rig)
    syphon.drain()
    book_of(rig).acknowledged("orders", "s", "lost")  # the newest marker's acknowledgement never came
    rig.registry.rotation.pull("secondary.servicebus.windows.net", queue, rig.clock.monotonic() + 300.0)
    assert rig.sender.remark([("orders", "s")]) == 1
    markers = [m for m in rig.transport.at(SECONDARY, queue) if marker_of(from_backlog(m)[0]) is not None]
    assert len(markers) == 2  # the first call's and the remark's, both in the line's queue
    syphon.drain()
    rig.sender.send(session_msgs("s", 2, 1))
    assert primary_ids(rig) == ["s-0", "s-1", "s-2"]
