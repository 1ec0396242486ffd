"""The deterministic simulation of ordering and the ledger (SPEC O9, issue 47; the world: tests/sim/world.py).

``SIM_SCHEDULES`` schedules (default 2,000, split into chunks for the tier's workers), each from its seed; after
each the checkers (no loss, O1 per session, O3 release in the quiet tail and, every 8th schedule, in a busy one (the sink sending every session while the job commits), duplicates only within the primary's
window, O5 ledger rows, O7 idle deliveries and abandoned attempts, O8 no task failure without a fault). A failing schedule prints its
seed, what it violated and the last steps; ``SIM_SEED=<n>`` replays that one schedule exactly (``make simulate
N=...`` runs more)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest

from tests.sim.world import Violation, World

SCHEDULES = int(os.environ.get("SIM_SCHEDULES", "2000"))
SEED = os.environ.get("SIM_SEED")
FIRST = int(os.environ.get("SIM_FIRST", "0"))
CHUNKS = 8


@pytest.fixture(autouse=True)
def quiet_logs() -> Iterator[None]:
    """The code under test logs every transition; thousands of schedules would spend their time formatting it."""
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


def run(seed: int) -> tuple[list[Violation], World]:
    world = World(seed)
    return world.run(), world


def report(seed: int, violations: list[Violation], world: World) -> str:
    lines = [f"schedule SIM_SEED={seed} violates:", *(f"  {v}" for v in violations), "  last steps:"]
    return "\n".join([*lines, *world.trace])


def seeds(chunk: int) -> list[int]:
    if SEED is not None:
        return [int(SEED)] if chunk == 0 else []
    # Contiguous blocks, not every CHUNKS-th seed: the busy tails fall on every BUSY_EVERY-th seed (8, as CHUNKS), and
    # striding by 8 put all of them in one chunk - a quarter of the tier's time on one worker.
    return list(range(FIRST + chunk * SCHEDULES // CHUNKS, FIRST + (chunk + 1) * SCHEDULES // CHUNKS))


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_every_schedule_keeps_order_loses_nothing_and_releases_every_held_session(chunk: int) -> None:
    failures: list[str] = []
    for seed in seeds(chunk):
        violations, world = run(seed)
        if not violations:
            continue
        failures.append(report(seed, violations, world))
        if len(failures) >= 3:
            break
    assert not failures, "\n\n".join(failures)


def test_a_seed_replays_its_schedule_exactly() -> None:
    """The same seed gives the same steps, faults and outcome (the trace and what the primary received)."""
    for seed in (3, 17, 101):
        a, b = World(seed), World(seed)
        va, vb = a.run(), b.run()
        assert list(a.trace) == list(b.trace)
        assert a.primary == b.primary and [str(v) for v in va] == [str(v) for v in vb]
