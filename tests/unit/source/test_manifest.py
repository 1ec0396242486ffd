"""The offset manifest (SOURCE.md §4, R12, R25): ranges, the JSON round trip, the range cut and the partition split."""

from __future__ import annotations

import json
import pickle
import random

import pytest

from spark_sb.source.manifest import (
    Manifest,
    PartitionSpec,
    contains,
    count,
    cut,
    minus,
    normalize,
    numbers,
    ranges_of,
    split,
    union,
)


def test_ranges_merge_adjacent_numbers_and_ignore_order_and_duplicates() -> None:
    assert ranges_of([5, 1, 2, 3, 3, 9, 10, 7]) == ((1, 3), (5, 5), (7, 7), (9, 10))
    assert normalize([[4, 6], [1, 2], [3, 3], [10, 12], [11, 15]]) == ((1, 6), (10, 15))
    with pytest.raises(ValueError):
        normalize([[3, 2]])


def test_membership_union_and_minus_agree_with_sets() -> None:
    rng = random.Random(7)
    for _ in range(300):
        a = {rng.randrange(60) for _ in range(rng.randrange(30))}
        b = {rng.randrange(60) for _ in range(rng.randrange(30))}
        ra, rb = ranges_of(a), ranges_of(b)
        assert set(numbers(union(ra, rb))) == a | b
        assert set(numbers(minus(ra, rb))) == a - b
        assert minus(ra, rb) == ranges_of(a - b)
        assert count(ra) == len(a)
        assert all(contains(ra, n) == (n in a) for n in range(-1, 62))


def test_an_offset_round_trips_through_json_as_spark_stores_it() -> None:
    m = Manifest(
        b=42,
        m={"p/orders": ((1001, 1500), (1520, 1520))},
        owed={"p/orders": ((998, 998),)},
        epoch={"p/orders": "2026-11-01T10:00:00Z"},
        n=501,
        bytes=514048,
    )
    text = m.to_json()
    assert json.loads(text) == {
        "v": 1,
        "b": 42,
        "epoch": {"p/orders": "2026-11-01T10:00:00Z"},
        "n": 501,
        "bytes": 514048,
        "m": {"p/orders": [[1001, 1500], [1520, 1520]]},
        "owed": {"p/orders": [[998, 998]]},
    }
    assert Manifest.from_json(text) == m
    assert Manifest.from_dict(json.loads(text)).to_json() == text
    assert pickle.loads(pickle.dumps(m)) == m
    assert m.holds("p/orders", 1520) and not m.holds("p/orders", 1519)
    swept = Manifest(b=43, sweep=True)  # a sweep still to do: written only when set
    assert json.loads(swept.to_json())["sweep"] is True and Manifest.from_json(swept.to_json()) == swept


def test_an_unknown_version_or_a_session_manifest_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="version 2"):
        Manifest.from_dict({"v": 2, "b": 1})
    with pytest.raises(ValueError, match="session"):
        Manifest.from_dict({"v": 1, "b": 1, "m": {"p/orders": {"s1": [[1, 2]]}}})


def test_the_range_cut_keeps_the_lowest_numbers_that_fit() -> None:
    assert cut([1, 2, 4, 6, 7, 9], max_ranges=2) == ([1, 2, 4], [6, 7, 9])
    assert cut([3, 1, 2], max_ranges=1) == ([1, 2, 3], [])
    assert cut([], max_ranges=1) == ([], [])


def _all(specs: list[PartitionSpec]) -> list[int]:
    return [n for s in specs for n in numbers(s.ranges)]


def test_a_batch_splits_into_at_least_min_partitions_none_over_the_maximum_every_number_once() -> None:
    m = Manifest(b=1, m={"p/a": ((1, 10_000), (10_050, 10_060)), "p/b": ((5, 7),)})
    specs = split(m, min_partitions=None, max_per_partition=5_000)
    assert [s.count for s in specs] == [3337, 3337, 3337, 3]
    assert _all([s for s in specs if s.channel == "p/a"]) == list(numbers(m.m["p/a"]))
    specs = split(m, min_partitions=8, max_per_partition=5_000)
    assert len(specs) >= 8 and max(s.count for s in specs) <= 5_000
    assert sorted(_all(specs)) == sorted([*numbers(m.m["p/a"]), *numbers(m.m["p/b"])])
    assert specs[-1] == PartitionSpec("p/b", ((5, 7),)) and specs[-1].entity == "b"
    assert split(Manifest(b=1, m={"p/a": ((1, 3),)}), min_partitions=10) == [
        PartitionSpec("p/a", ((1, 1),)),
        PartitionSpec("p/a", ((2, 2),)),
        PartitionSpec("p/a", ((3, 3),)),
    ]
    assert split(Manifest(b=1)) == []
    assert pickle.loads(pickle.dumps(specs[0])) == specs[0]


def test_random_splits_keep_every_number_once_and_the_limits() -> None:
    rng = random.Random(3)
    for _ in range(200):
        nums = {rng.randrange(500) for _ in range(rng.randrange(1, 200))}
        m = Manifest(b=1, m={"p/e": ranges_of(nums)})
        lo_parts, most = rng.choice([None, 1, 3, 17]), rng.randrange(1, 50)
        specs = split(m, lo_parts, most)
        assert _all(specs) == sorted(nums)
        assert all(0 < s.count <= most for s in specs)
        assert len(specs) >= min(lo_parts or 1, len(nums))
