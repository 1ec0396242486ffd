"""The source's offset: a manifest of exact sequence numbers per channel, plus the owed set (SOURCE.md §4, R12, R15).

``{"v":1,"b":42,"epoch":{"p/orders":"..."},"n":502,"bytes":514048,"m":{"p/orders":[[1001,1500]]},"owed":{..}}``

Pure data and its rules, no I/O: ranges (sorted, disjoint, inclusive ``(lo, hi)`` tuples, adjacent ones merged),
the JSON round trip (Spark keeps offsets as JSON strings), the ``maxOffsetRanges`` cut and the Kafka-style split into
partitions. Runs on the driver and in executors; :class:`Manifest` and :class:`PartitionSpec` are picklable.
Part 1: non-session channels only (``p/<entity>``); a session manifest (``{"sess": [[..]]}``) is refused.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

VERSION = 1
#: More ranges than this in one batch cut the batch early (SOURCE.md §4).
MAX_OFFSET_RANGES = 10_000
#: A partition reads at most this many messages unless told otherwise (``maxMessagesPerPartition``).
MAX_PER_PARTITION = 5_000

#: Sorted, disjoint, non-adjacent inclusive ranges. Bounded by the batch (at most MAX_OFFSET_RANGES per channel).
Ranges = tuple[tuple[int, int], ...]


def channel_of(entity: str) -> str:
    """The primary channel of ``entity`` (``p/<entity>``)."""
    return f"p/{entity}"


def entity_of(channel: str) -> str:
    """The entity a channel names (``p/orders`` -> ``orders``)."""
    return channel.split("/", 1)[1]


def ranges_of(numbers: Iterable[int]) -> Ranges:
    """The ranges holding exactly ``numbers`` (any order, duplicates allowed)."""
    out: list[tuple[int, int]] = []
    for n in sorted(set(numbers)):
        if out and n == out[-1][1] + 1:
            out[-1] = (out[-1][0], n)
        else:
            out.append((n, n))
    return tuple(out)


def normalize(ranges: Iterable[Iterable[int]]) -> Ranges:
    """Ranges from any list of ``[lo, hi]`` pairs (overlapping or unsorted), merged."""
    pairs = sorted((int(lo), int(hi)) for lo, hi in (tuple(r) for r in ranges))
    out: list[tuple[int, int]] = []
    for lo, hi in pairs:
        if lo > hi:
            raise ValueError(f"an empty range [{lo}, {hi}]")
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def count(ranges: Ranges) -> int:
    return sum(hi - lo + 1 for lo, hi in ranges)


def numbers(ranges: Ranges) -> Iterator[int]:
    for lo, hi in ranges:
        yield from range(lo, hi + 1)


def contains(ranges: Ranges, seq: int) -> bool:
    i = bisect_right(ranges, seq, key=lambda r: r[0]) - 1
    return i >= 0 and ranges[i][0] <= seq <= ranges[i][1]


def union(a: Ranges, b: Ranges) -> Ranges:
    return normalize([*a, *b])


def minus(a: Ranges, b: Ranges) -> Ranges:
    """The numbers of ``a`` not in ``b``."""
    out: list[tuple[int, int]] = []
    j = 0
    for lo, hi in a:
        cur = lo
        while j < len(b) and b[j][1] < cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] <= hi and cur <= hi:
            if b[k][0] > cur:
                out.append((cur, b[k][0] - 1))
            cur = max(cur, b[k][1] + 1)
            k += 1
        if cur <= hi:
            out.append((cur, hi))
    return tuple(out)


def cut(seqs: Iterable[int], max_ranges: int = MAX_OFFSET_RANGES) -> tuple[list[int], list[int]]:
    """``(kept, rest)``: the lowest numbers of ``seqs`` that fit in ``max_ranges`` ranges, and the others."""
    ordered = sorted(set(seqs))
    ranges = 0
    for i, n in enumerate(ordered):
        if i == 0 or n != ordered[i - 1] + 1:
            ranges += 1
            if ranges > max_ranges:
                return ordered[:i], ordered[i:]
    return ordered, []


def _ranges_json(ranges: Mapping[str, Ranges]) -> dict[str, list[list[int]]]:
    return {ch: [[lo, hi] for lo, hi in r] for ch, r in sorted(ranges.items()) if r}


def _ranges_from(raw: Any, what: str) -> dict[str, Ranges]:
    if not isinstance(raw, dict):
        raise ValueError(f"the offset's {what!r} is not an object")
    out: dict[str, Ranges] = {}
    for ch, r in raw.items():
        if isinstance(r, dict):
            raise ValueError(f"the offset's {what!r} for {ch} is by session: sessions come in a later part")
        out[str(ch)] = normalize(r)
    return out


@dataclass(frozen=True)
class Manifest:
    """One offset (driver; picklable). ``m`` and ``owed`` map a channel to its ranges; ``epoch`` a channel to its
    entity's ``created_at``. ``b`` grows with every new offset, so equal manifests never mean new data. ``sweep``:
    recoverDeferred's sweep for orphans had not succeeded when this offset was made (a restarted driver, which
    Spark does not ask for an initial offset, sweeps then); written only when set."""

    b: int
    m: dict[str, Ranges] = field(default_factory=dict)
    owed: dict[str, Ranges] = field(default_factory=dict)
    epoch: dict[str, str] = field(default_factory=dict)
    n: int = 0
    bytes: int = 0
    sweep: bool = False

    def to_dict(self) -> dict[str, Any]:
        out = {
            "v": VERSION,
            "b": self.b,
            "epoch": dict(sorted(self.epoch.items())),
            "n": self.n,
            "bytes": self.bytes,
            "m": _ranges_json(self.m),
            "owed": _ranges_json(self.owed),
        }
        if self.sweep:
            out["sweep"] = True
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Manifest:
        if raw.get("v") != VERSION:
            raise ValueError(f"an offset of version {raw.get('v')!r}: this source reads version {VERSION}")
        return cls(
            b=int(raw["b"]),
            m=_ranges_from(raw.get("m", {}), "m"),
            owed=_ranges_from(raw.get("owed", {}), "owed"),
            epoch={str(k): str(v) for k, v in dict(raw.get("epoch", {})).items()},
            n=int(raw.get("n", 0)),
            bytes=int(raw.get("bytes", 0)),
            sweep=bool(raw.get("sweep", False)),
        )

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        return cls.from_dict(json.loads(text))

    def ranges(self, channel: str) -> Ranges:
        return self.m.get(channel, ())

    def owed_ranges(self, channel: str) -> Ranges:
        return self.owed.get(channel, ())

    def holds(self, channel: str, seq: int) -> bool:
        return contains(self.ranges(channel), seq)


@dataclass(frozen=True)
class PartitionSpec:
    """What one Spark task reads (executor; picklable): a channel and its ranges, in sequence order."""

    channel: str
    ranges: Ranges

    @property
    def entity(self) -> str:
        return entity_of(self.channel)

    @property
    def count(self) -> int:
        return count(self.ranges)


def _pieces(ranges: Ranges, parts: int) -> list[Ranges]:
    """``ranges`` cut into ``parts`` pieces of as-equal counts (ranges split where a piece ends)."""
    total = count(ranges)
    sizes = [total // parts + (1 if i < total % parts else 0) for i in range(parts)]
    out: list[Ranges] = []
    piece: list[tuple[int, int]] = []
    want = sizes[0]
    i = 0
    for lo, hi in ranges:
        cur = lo
        while cur <= hi:
            take = min(want, hi - cur + 1)
            piece.append((cur, cur + take - 1))
            cur += take
            want -= take
            if want == 0:
                out.append(tuple(piece))
                piece = []
                i += 1
                want = sizes[i] if i < parts else 0
                if i == parts:
                    break
    return out


def split(
    manifest: Manifest, min_partitions: int | None = None, max_per_partition: int = MAX_PER_PARTITION
) -> list[PartitionSpec]:
    """The partitions of a batch, Kafka-style: at least ``min_partitions`` (big channels get more pieces, in
    proportion), none over ``max_per_partition`` messages. Pure; runs on the driver."""
    if max_per_partition < 1:
        raise ValueError("maxMessagesPerPartition must be at least 1")
    sizes = {ch: count(r) for ch, r in sorted(manifest.m.items()) if r}
    total = sum(sizes.values())
    specs: list[PartitionSpec] = []
    for ch, size in sizes.items():
        parts = math.ceil(size / max_per_partition)
        if min_partitions and total:
            parts = max(parts, math.ceil(min_partitions * size / total))
        parts = max(1, min(parts, size))
        specs.extend(PartitionSpec(ch, piece) for piece in _pieces(manifest.m[ch], parts))
    return specs
