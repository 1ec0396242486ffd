"""Adding per-key counts (messages per entity, per backlog queue, seconds throttled per entity): the one helper the
outcomes of the sender, the syphon and the sink merge with. Pure; runs anywhere."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TypeVar

__all__ = ["merge_counts"]

N = TypeVar("N", int, float)


def merge_counts(*counts: Mapping[str, N]) -> dict[str, N]:
    """The key-wise sum of ``counts`` (a new dict; the inputs are left alone)."""
    total: Counter[str] = Counter()
    for c in counts:
        total.update(c)
    return dict(total)  # type: ignore[arg-type]
