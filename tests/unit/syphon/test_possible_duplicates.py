"""SPEC B14 end to end on fakes: a paired sender whose primary send timed out once written diverts its messages with
the time of that attempt; the syphon strips it and, moving them after the entity's duplicate detection window
has passed since (or with the window unknown, or duplicate detection off), counts them as possible duplicates and
warns once per batch; the syphon job writes them as ``possible_duplicate`` events. A fake transport (sender's
primary and backlog, syphon's primary), fake backlog receivers and one fake clock."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from azure.servicebus import exceptions as sbe

from spark_sb.message.backlog import BACKLOG_AMBIGUOUS, ambiguous_attempt
from spark_sb.message.outbound import OutboundMessage
from spark_sb.spark.syphon_drain import outcome_rows
from spark_sb.spark.syphon_ledger import SyphonBatchWriter
from spark_sb.state.records import POSSIBLE_DUPLICATE
from spark_sb.state.store import MemoryStateStore
from spark_sb.syphon.rules import SyphonOutcome, past_window
from spark_sb.wire.duplicate_detection import DuplicateDetection, PrimaryWindows
from spark_sb.wire.transport import PRIMARY
from tests.unit.sender.rig import conn_error, make_config
from tests.unit.syphon.test_ordered import World

TEN_MINUTES = 600.0


def timed_out() -> BaseException:
    return sbe.OperationTimeoutError(message="no answer to the transfer")


class Diverted:
    """A sender and a syphon of one process (``ordering: none``); the primary's windows answered by ``answer``."""

    def __init__(self, answer: Callable[[str], DuplicateDetection]) -> None:
        self.world = World(ordering="none")
        self.clock = self.world.clock
        self.transport = self.world.rig.transport
        self.asked: list[str] = []

        def lookup(entity: str) -> DuplicateDetection:
            self.asked.append(entity)
            return answer(entity)

        self.world.syphon.windows = PrimaryWindows(self.clock, lookup)

    def divert(
        self, n: int, failure: Callable[[], BaseException] = timed_out, written: bool = True
    ) -> datetime:
        """``n`` messages sent while the primary fails (``failover_interval`` 0: diverted at the first failure);
        returns when the attempt began."""
        began = self.clock.now()
        self.transport.fail(failure, namespace=PRIMARY, count=1, written=written)
        out = self.world.rig.sender.send([OutboundMessage(body=b"x", message_id=f"m{i}") for i in range(n)])
        assert out.diverted_by_entity == {"orders": n}
        return began

    def drain(self, after: float) -> SyphonOutcome:
        self.transport.heal()
        self.clock.advance(after)
        return self.world.drain()

    def primary(self) -> list[OutboundMessage]:
        return self.transport.at(PRIMARY, "orders")


def window(seconds: float) -> Callable[[str], DuplicateDetection]:
    return lambda entity: DuplicateDetection(entity, "queue", True, seconds)


@pytest.fixture
def late(caplog: pytest.LogCaptureFixture) -> Iterator[Diverted]:
    caplog.set_level(logging.WARNING, logger="spark_sb.syphon.mover")
    diverted = Diverted(window(TEN_MINUTES))
    yield diverted
    diverted.world.syphon.close()


def test_moved_after_the_window_it_is_a_possible_duplicate_counted_and_warned_of_once(
    late: Diverted, caplog: pytest.LogCaptureFixture
) -> None:
    began = late.divert(3)
    backlog = late.world.rig.backlog()
    assert {ambiguous_attempt(m) for m in backlog} == {began}  # the mark, in the backlog form
    out = late.drain(after=TEN_MINUTES + 1)
    assert out.forwarded == {"orders": 3}
    assert out.possible_duplicates == {"orders": 3}
    assert sorted(i or "" for _, i in out.possible_duplicate_ids) == ["m0", "m1", "m2"]
    assert all(BACKLOG_AMBIGUOUS not in m.properties for m in late.primary())  # stripped
    warnings = [r.getMessage() for r in caplog.records if "possible duplicates" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once for the batch, not per message
    assert "3 messages moved to orders" in warnings[0] and "on, window 10 min" in warnings[0]
    assert late.asked == ["orders"]


def test_moved_within_the_window_it_is_not(late: Diverted, caplog: pytest.LogCaptureFixture) -> None:
    late.divert(2)
    out = late.drain(after=TEN_MINUTES - 60)
    assert (
        out.forwarded == {"orders": 2} and out.possible_duplicates == {} and out.possible_duplicate_ids == []
    )
    assert not any("possible duplicates" in r.getMessage() for r in caplog.records)


def test_a_clean_diversion_costs_no_question_and_counts_nothing(late: Diverted) -> None:
    late.divert(2, failure=conn_error, written=False)  # refused: nothing was written, nothing may have landed
    assert {ambiguous_attempt(m) for m in late.world.rig.backlog()} == {None}
    out = late.drain(after=10 * TEN_MINUTES)
    assert out.forwarded == {"orders": 2} and out.possible_duplicates == {}
    assert late.asked == []  # the primary's admin endpoint is asked for ambiguous messages only


@pytest.mark.parametrize(
    "answer",
    [
        lambda e: DuplicateDetection(e, "queue", False, TEN_MINUTES),  # off: any copy that landed stays
        lambda e: DuplicateDetection(e, error="HttpResponseError (HTTP 401): no Manage right"),  # unknown
    ],
    ids=["off", "unknown"],
)
def test_with_duplicate_detection_off_or_unknown_every_ambiguous_message_counts(answer: Any) -> None:
    diverted = Diverted(answer)
    diverted.divert(1)
    assert diverted.drain(after=1.0).possible_duplicates == {"orders": 1}
    diverted.world.syphon.close()


def test_the_window_runs_from_the_attempt() -> None:
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    later = datetime(2026, 1, 1, 0, 10, tzinfo=timezone.utc)
    assert not past_window(at, later, TEN_MINUTES) and past_window(at, later, TEN_MINUTES - 1)
    assert past_window(at, later, 0.0) and past_window(at, later, None)


def test_the_syphon_job_writes_possible_duplicate_events_and_warns_once_a_micro_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outcome = SyphonOutcome(
        forwarded={"orders": 3},
        possible_duplicates={"orders": 2},
        possible_duplicate_ids=[("orders", "m0"), ("orders", "m2")],
    )
    rows = [r for r in outcome_rows("q0", False, outcome) if r[3] == POSSIBLE_DUPLICATE]
    assert rows == [("q0", False, "orders", POSSIBLE_DUPLICATE, 2, None, "message ids: m0, m2")]
    store = MemoryStateStore()
    writer = SyphonBatchWriter(make_config(), store=store)
    caplog.set_level(logging.WARNING, logger="spark_sb.spark.syphon_job")
    writer.record(4, [("q0", "orders", POSSIBLE_DUPLICATE, 2, "message ids: m0, m2")], store)
    (event,) = [e for e in store.read_events() if e.event == POSSIBLE_DUPLICATE]
    assert (event.entity, event.backlog_queue, event.count, event.detail) == (
        "orders",
        "q0",
        2,
        "message ids: m0, m2",
    )
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "micro-batch 4" in warning and "orders 2" in warning and POSSIBLE_DUPLICATE in warning
