"""Tests say what they are: the tier marker comes from the directory (tests/conftest.py), never from the file, so
that directory and marker cannot disagree; every directory holding tests has a tier."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.conftest import LONGEST_FIRST, TIERS, pytest_collection_modifyitems

ROOT = Path(__file__).resolve().parents[2]
TEST_FILES = sorted(
    [*(ROOT / "tests").rglob("test_*.py"), *(ROOT / "servicebus_local" / "tests").rglob("test_*.py")]
)
OWN_TIER = re.compile(r"pytest\.mark\.(unit|local|spark)\b")


def test_no_test_file_marks_its_own_tier() -> None:
    offenders = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in TEST_FILES
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if OWN_TIER.search(line) and "-m" not in line
    ]
    assert not offenders, f"tier markers come from the directory (tests/conftest.py): {offenders}"


def test_every_directory_with_tests_has_a_tier() -> None:
    under_tests = {
        p.relative_to(ROOT / "tests").parts[0] for p in TEST_FILES if p.is_relative_to(ROOT / "tests")
    }
    assert under_tests <= set(TIERS), f"no tier for {sorted(under_tests - set(TIERS))}"


def test_the_longest_first_order_names_test_files_of_the_spark_tiers_once() -> None:
    """The Spark tiers hand out files in tests/conftest.py's LONGEST_FIRST order: a renamed or removed file would
    silently fall to the end of the run (where a long file keeps one core busy while the other idles)."""
    assert len(LONGEST_FIRST) == len(set(LONGEST_FIRST))
    for name in LONGEST_FIRST:
        path = ROOT / name
        assert path in TEST_FILES, f"LONGEST_FIRST names {name}, which is not a test file"
        assert TIERS[path.relative_to(ROOT / "tests").parts[0]] == "spark", name


class _Item:
    """What the tier sort reads of a collected test: its path and its ``slow`` mark."""

    def __init__(self, name: str, slow: bool) -> None:
        self.path, self.slow, self.markers = ROOT / name, slow, []

    def get_closest_marker(self, name: str) -> object:
        return object() if name == "slow" and self.slow else None

    def add_marker(self, marker: str) -> None:
        self.markers.append(marker)


def test_an_xdist_worker_sorts_its_collection_longest_first() -> None:
    """The controller hands out what the workers collected, in their order, and xdist unsets numprocesses in a
    worker (before, the sort ran only where numprocesses was set: never in a worker)."""
    names = [
        ("tests/spark/test_sink.py", True),
        ("tests/spark/test_quiet_start.py", False),
        (LONGEST_FIRST[0], True),
    ]
    items: list[Any] = [_Item(name, slow) for name, slow in names]
    worker = SimpleNamespace(option=SimpleNamespace(numprocesses=None), workerinput={})
    pytest_collection_modifyitems(worker, items)  # type: ignore[arg-type]
    assert [i.path.relative_to(ROOT).as_posix() for i in items] == [
        LONGEST_FIRST[0],
        "tests/spark/test_sink.py",
        "tests/spark/test_quiet_start.py",
    ]
