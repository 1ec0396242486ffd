"""The executors' read (SOURCE.md §4 read(p), R17): peek the ranges, keep the manifest's numbers, fail on loss."""

from __future__ import annotations

import logging

import pytest

from servicebus_local.clock import FakeClock
from spark_sb.source.manifest import PartitionSpec
from spark_sb.source.reader import DataLossError, ReadStats, read_partition
from spark_sb.source.transport import Peeked
from tests.unit.source.fakes import FakeEntity


def entity(n: int) -> FakeEntity:
    e = FakeEntity(FakeClock())
    for i in range(n):
        e.send(message_id=f"id-{i + 1}")
    return e


def test_a_partition_yields_its_numbers_in_order_page_by_page_and_nothing_between_its_ranges() -> None:
    e = entity(30)
    spec = PartitionSpec("p/orders", ((3, 9), (12, 12), (20, 26)))
    stats = ReadStats()
    got = [p.seq for p in read_partition(spec, e.peeker(), page=3, stats=stats)]
    assert got == [*range(3, 10), 12, *range(20, 27)]
    assert stats.yielded == 15 and stats.missing == 0
    assert e.calls["read"] == stats.pages == 3 + 1 + 3
    assert all(m.delivery_count == 0 for m in e.messages.values())  # peeks have no side effects


def test_a_missing_number_fails_the_read_naming_entity_numbers_and_likely_causes() -> None:
    e = entity(12)
    for gone in (4, 5, 11, 12):
        del e.messages[gone]
    spec = PartitionSpec("p/orders", ((2, 6), (10, 12)))
    seen: list[int] = []
    with pytest.raises(DataLossError) as err:
        seen.extend(p.seq for p in read_partition(spec, e.peeker(), page=2))
    assert seen == [2, 3, 6, 10]
    text = str(err.value)
    assert "orders" in text and "4 messages" in text and "4-5, 11-12" in text
    assert "time to live" in text and "another consumer" in text and "purged" in text


def test_without_fail_on_data_loss_a_missing_number_is_warned_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    e = entity(5)
    del e.messages[3]
    stats = ReadStats()
    with caplog.at_level(logging.WARNING, logger="spark_sb.source.reader"):
        got = [
            p.seq
            for p in read_partition(
                PartitionSpec("p/orders", ((1, 5),)), e.peeker(), fail_on_data_loss=False, stats=stats
            )
        ]
    assert got == [1, 2, 4, 5] and stats.missing == 1
    assert "sequence numbers 3" in caplog.text


def test_the_galloping_peek_finds_the_highest_number_in_about_two_log2_peeks() -> None:
    from spark_sb.source.reader import highest

    e = entity(1000)
    for gone in [*range(1, 300), *range(700, 990)]:
        del e.messages[gone]
    calls: list[int] = []

    def peek(frm: int, n: int) -> list[Peeked]:
        calls.append(frm)
        return e.peek(frm, n)

    assert highest(peek) == 1000 and len(calls) <= 2 * 11
    assert highest(lambda frm, n: []) == -1


def test_the_sweep_finds_deferred_numbers_only_up_to_its_bound() -> None:
    from spark_sb.source.reader import deferred_numbers

    e = entity(20)
    link = e.link()
    got = link.receive(20, 0, 1)
    link.defer([r for r in got if r.seq % 3 == 0], 1)
    assert deferred_numbers(e.peek, 100, page=4).numbers == (
        (3, 3),
        (6, 6),
        (9, 9),
        (12, 12),
        (15, 15),
        (18, 18),
    )
    assert deferred_numbers(e.peek, 2).numbers == ((3, 3), (6, 6))
