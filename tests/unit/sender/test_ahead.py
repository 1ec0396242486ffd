"""Backlog translations made ahead while the sender waits (spark_sb.sender.ahead, PairedSender._flush): made during the
wait for the failover timer (a refusing namespace) or on a helper thread while an attempt stalls, used by the
divert, dropped when the namespace answers after all; what they record as the backlog enqueue time."""

from __future__ import annotations

import threading
from datetime import datetime

import pytest

from servicebus_local.clock import FakeClock
from spark_sb.message.backlog import from_backlog, to_backlog
from spark_sb.message.outbound import OutboundMessage
from spark_sb.sender.ahead import Ahead
from spark_sb.wire.transport import PRIMARY, Target
from tests.unit.fakes import FakeBatch
from tests.unit.sender.rig import Rig, conn_error, msgs


def _ids(messages: list[OutboundMessage]) -> set[str | None]:
    return {m.message_id for m in messages}


def test_a_refusing_namespace_s_wait_is_used_to_translate_the_waiting_batches_for_the_backlog() -> None:
    rig = Rig(failover_interval=10.0)
    rig.transport.op_seconds = 0.01
    rig.transport.fail(conn_error, namespace=PRIMARY)
    entities = [f"e{i}" for i in range(50)]
    sent = [m for e in entities for m in msgs(2, prefix=f"{e}-", entity=e)]
    began = rig.clock.now()
    out = rig.sender.send(sent)
    assert out.total_diverted == 100 and out.total_sent == 0
    assert rig.transport.prepared_backlog == 100  # every waiting message, once
    backlog = rig.backlog()
    assert _ids(backlog) == _ids(sent) and len(backlog) == 100
    enqueued = {from_backlog(m)[1] for m in backlog}
    # made ahead: recorded when made, during the wait - after the call began, before the failover was due
    assert all(began <= at < began + (rig.clock.now() - began) for at in enqueued), (began, enqueued)
    assert max(enqueued) < rig.clock.now()


def test_translations_made_ahead_are_dropped_when_the_namespace_answers_after_all() -> None:
    rig = Rig(failover_interval=10.0)
    rig.transport.op_seconds = 0.01
    # two attempts fail (the retry after the second waits its back-off), then the namespace answers
    rig.transport.fail(conn_error, namespace=PRIMARY, count=2)
    entities = [f"e{i}" for i in range(20)]
    sent = [m for e in entities for m in msgs(2, prefix=f"{e}-", entity=e)]
    out = rig.sender.send(sent)
    assert rig.transport.prepared_backlog > 0  # made while waiting for the retry
    assert out.total_sent == 40 and out.total_diverted == 0 and rig.backlog() == []
    assert {m.message_id for e in entities for m in rig.transport.at(PRIMARY, e)} == _ids(sent)


def test_a_stalled_attempt_has_the_other_batches_translated_on_a_helper_thread() -> None:
    rig = Rig(failover_interval=5.0)
    rig.transport.stall(namespace=PRIMARY)

    def await_helper() -> (
        None
    ):  # the fake's stall returns at once: let the helper finish, as a real stall would
        for t in threading.enumerate():
            if t.name == "spark-sb-backlog-ahead":
                t.join()

    rig.transport.after_slow = await_helper
    entities = [f"e{i}" for i in range(30)]
    sent = [m for e in entities for m in msgs(2, prefix=f"{e}-", entity=e)]
    out = rig.sender.send(sent)
    assert out.total_diverted == 60
    assert rig.transport.prepared_backlog == 60
    assert _ids(rig.backlog()) == _ids(sent)
    assert not [t for t in threading.enumerate() if t.name == "spark-sb-backlog-ahead"]


def test_ahead_keeps_only_whole_batches_and_a_message_it_cannot_translate_is_left_to_the_divert() -> None:
    clock = FakeClock()
    batches = []
    for e in ("a", "b", "c"):
        b = FakeBatch(Target(PRIMARY, e), 10_000)
        for m in msgs(3, prefix=f"{e}-", entity=e):
            b.try_add(m)
        batches.append(b)
    bad = OutboundMessage(body=b"x", entity="b", message_id="bad", properties={"x-ms-path": "reserved"})
    batches[1].try_add(bad)
    made: list[str] = []

    def prepare(m: OutboundMessage, entity: str, at: datetime) -> object:
        made.append(m.message_id or "")
        return to_backlog(m, entity, at)

    ahead = Ahead(batches, prepare, clock, None)
    ahead.prepare([0, 1], until=clock.monotonic() + 1)
    first, second = ahead.get(0), ahead.get(1)
    assert first is not None and len(first) == 3 and all(isinstance(x, OutboundMessage) for x in first)
    assert second is not None and second[-1] is None  # reserved property: the divert rejects it itself
    assert ahead.get(2) is None
    ahead.prepare([2], until=clock.monotonic())  # no time left: nothing made
    assert ahead.get(2) is None
    ahead.in_flight = 2
    ahead.start()
    ahead.stop()  # waits for the helper; whatever it finished is whole
    third = ahead.get(2)
    assert third is None or len(third) == 3


def test_stop_while_the_watchdog_is_starting_the_helper_waits_for_it_and_ends_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watchdog's start() descheduled between making the helper thread and starting it: stop() on the sender's
    thread waits for it, then ends the helper. It used to join the thread not started yet: RuntimeError("cannot
    join thread before it is started"), which failed the send call (bench_isolation's smoke run in CI, stop 42)."""
    real_thread = threading.Thread
    inside, proceed = threading.Event(), threading.Event()

    class Descheduled(real_thread):  # type: ignore[misc,valid-type]
        def start(self) -> None:
            inside.set()
            assert proceed.wait(10)
            super().start()

    batch = FakeBatch(Target(PRIMARY, "a"), 10_000)
    for m in msgs(3, prefix="a-", entity="a"):
        batch.try_add(m)
    ahead = Ahead([batch], to_backlog, FakeClock(), None)
    monkeypatch.setattr(threading, "Thread", Descheduled)  # what spark_sb.sender.ahead makes its helper with
    watchdog = real_thread(target=ahead.start)
    watchdog.start()
    assert inside.wait(10)
    errors: list[BaseException] = []

    def stop() -> None:
        try:
            ahead.stop()
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    sender = real_thread(target=stop)
    sender.start()
    sender.join(1.0)  # the old stop() raised at once; this one waits for the start under way
    assert errors == [] and sender.is_alive()
    proceed.set()
    sender.join(10)
    watchdog.join(10)
    assert errors == [] and not sender.is_alive()
    assert not [t for t in threading.enumerate() if t.name == "spark-sb-backlog-ahead"]
    made = ahead.get(0)
    assert made is None or len(made) == 3  # whatever the helper finished is whole
