"""Adding per-key counts (:mod:`spark_sb.core.counts`): :func:`merge_counts` sums key by key,
:func:`merge_fields` sums two outcomes of one dataclass field by field, and :class:`SentAndDiverted` totals an
outcome's per-key ``sent`` and ``diverted`` counts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from spark_sb.core.counts import SentAndDiverted, merge_counts, merge_fields


@pytest.mark.parametrize(
    ("counts", "total"),
    [
        ((), {}),
        (({},), {}),
        (({"a": 1},), {"a": 1}),
        (({"a": 1, "b": 2}, {"b": 3, "c": 4}), {"a": 1, "b": 5, "c": 4}),
        (({"a": 1}, {"a": 2}, {"a": 3, "b": 1}), {"a": 6, "b": 1}),
        (({"a": 0.5}, {"a": 1.25, "b": 2.0}), {"a": 1.75, "b": 2.0}),
        (({"a": 0}, {}), {"a": 0}),  # a key counted zero is still a key
    ],
)
def test_merge_counts_sums_key_by_key(counts: tuple[dict[str, Any], ...], total: dict[str, Any]) -> None:
    assert merge_counts(*counts) == total


def test_merge_counts_returns_a_new_dict_and_leaves_its_inputs_alone() -> None:
    first, second = {"a": 1}, {"a": 2, "b": 3}
    merged = merge_counts(first, second)
    assert type(merged) is dict and merged is not first and merged is not second
    assert (first, second) == ({"a": 1}, {"a": 2, "b": 3})
    single = merge_counts(first)
    single["a"] = 99
    assert first == {"a": 1}


@dataclass(frozen=True)
class _Outcome(SentAndDiverted):
    sent: Mapping[str, int] = field(default_factory=dict)
    diverted: Mapping[str, int] = field(default_factory=dict)
    seconds: Mapping[str, float] = field(default_factory=dict)
    failed_over: bool = False
    batches: int = 0
    elapsed: float = 0.0
    rejects: tuple[str, ...] = ()
    errors: list[str] = field(default_factory=list)


def test_merge_fields_sums_two_outcomes_field_by_field() -> None:
    first = _Outcome(
        sent={"q1": 2},
        diverted={"q1": 1},
        seconds={"q1": 0.5},
        failed_over=False,
        batches=1,
        elapsed=1.5,
        rejects=("r1",),
        errors=["e1"],
    )
    second = _Outcome(
        sent={"q1": 3, "q2": 4},
        diverted={},
        seconds={"q1": 0.25},
        failed_over=True,
        batches=2,
        elapsed=0.5,
        rejects=("r2",),
        errors=["e2"],
    )
    merged = merge_fields(first, second)
    assert type(merged) is _Outcome
    assert merged == _Outcome(
        sent={"q1": 5, "q2": 4},
        diverted={"q1": 1},
        seconds={"q1": 0.75},
        failed_over=True,
        batches=3,
        elapsed=2.0,
        rejects=("r1", "r2"),
        errors=["e1", "e2"],
    )


@pytest.mark.parametrize(
    ("mine", "theirs", "either"),
    [(False, False, False), (True, False, True), (False, True, True), (True, True, True)],
)
def test_merge_fields_a_flag_is_true_if_either_is(mine: bool, theirs: bool, either: bool) -> None:
    merged = merge_fields(_Outcome(failed_over=mine), _Outcome(failed_over=theirs))
    assert merged.failed_over is either


def test_merge_fields_leaves_its_inputs_alone() -> None:
    first = _Outcome(sent={"q": 1}, errors=["e1"])
    second = _Outcome(sent={"q": 2}, errors=["e2"])
    merge_fields(first, second)
    assert first == _Outcome(sent={"q": 1}, errors=["e1"])
    assert second == _Outcome(sent={"q": 2}, errors=["e2"])


@pytest.mark.parametrize(
    ("sent", "diverted", "total_sent", "total_diverted"),
    [
        ({}, {}, 0, 0),
        ({"q1": 3}, {}, 3, 0),
        ({"q1": 3, "q2": 4}, {"q1": 1, "backlog-0": 2}, 7, 3),
    ],
)
def test_sent_and_diverted_totals_are_the_sums_over_every_key(
    sent: dict[str, int], diverted: dict[str, int], total_sent: int, total_diverted: int
) -> None:
    outcome = _Outcome(sent=sent, diverted=diverted)
    assert (outcome.total_sent, outcome.total_diverted) == (total_sent, total_diverted)
