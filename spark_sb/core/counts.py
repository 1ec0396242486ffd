"""Adding per-key counts (messages per entity, per backlog queue, seconds throttled per entity): the helpers the
outcomes of the sender, the syphon and the sink merge and total with. Pure; runs anywhere."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import fields
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # pragma: no cover
    from _typeshed import DataclassInstance

__all__ = ["SentAndDiverted", "merge_counts", "merge_fields"]

N = TypeVar("N", int, float)
D = TypeVar("D", bound="DataclassInstance")


def merge_counts(*counts: Mapping[str, N]) -> dict[str, N]:
    """The key-wise sum of ``counts`` (a new dict; the inputs are left alone)."""
    total: Counter[str] = Counter()
    for c in counts:
        total.update(c)
    return dict(total)  # type: ignore[arg-type]


def merge_fields(first: D, second: D) -> D:
    """Two outcomes of one dataclass summed field by field (a new one; the inputs are left alone): per-key counts
    merge (:func:`merge_counts`), flags are true if either is, and the rest add - numbers are summed, lists and
    tuples of records concatenated."""
    merged: dict[str, Any] = {}
    for f in fields(first):
        mine, theirs = getattr(first, f.name), getattr(second, f.name)
        if isinstance(mine, Mapping):
            merged[f.name] = merge_counts(mine, theirs)
        elif isinstance(mine, bool):
            merged[f.name] = mine or theirs
        else:
            merged[f.name] = mine + theirs
    return type(first)(**merged)


class SentAndDiverted:
    """The totals of an outcome that counts messages ``sent`` to the primary and ``diverted`` to backlog queues, per
    key (the sender's :class:`~spark_sb.failover.outcome.SendOutcome`, the sink's running totals)."""

    sent: Mapping[str, int]
    diverted: Mapping[str, int]

    @property
    def total_sent(self) -> int:
        return sum(self.sent.values())

    @property
    def total_diverted(self) -> int:
        return sum(self.diverted.values())
