"""The lane under simulation (SPEC F10; issue 47): random schedules of direct, started and submitted calls with
deadlines, work and openings that stall, connections that die, resets and abandonments, run through the REAL lane
code on a fake clock by a seeded scheduler (:mod:`tests.unit.wire.lanesim`). After every schedule: no call is cut
short by another caller's abandonment (a call fails with a connection-class error only when its own connection
failed; one cut short otherwise gets LaneClosed, evidence of nothing), every call ends by its deadline (fake time;
slack ``lanesim.SLACK``) and no withdrawal or timeout comes before it, no worker is abandoned while another
caller's call runs on it within its deadline, no call runs on an abandoned worker or a closed context, a context
is used by one call at a time and never tended during one, a withdrawn call never runs, a worker runs its calls in
the order they were queued, and no simulated thread crashes or hangs.

``SIM_SCHEDULES=N`` runs N schedules (default :data:`SCHEDULES`, about 5 s on two cores); ``SIM_SEED=S`` replays
schedule S alone and prints its whole trace; ``SIM_FIRST=F`` starts at seed F. A failing schedule prints its seed,
what it broke and the end of its trace."""

from __future__ import annotations

import os

import pytest

from tests.unit.wire.lanesim import run_schedule

#: Schedules the unit tier runs (seeds 0..SCHEDULES-1): ~5 s on this project's two cores.
SCHEDULES = 400


def _replay_hint(seed: int) -> str:
    return f"replay: SIM_SEED={seed} .venv/bin/python -m pytest -q tests/unit/wire/test_lane_simulation.py -s"


def test_the_lane_keeps_its_promises_through_random_schedules() -> None:
    if "SIM_SEED" in os.environ:
        seeds = [int(os.environ["SIM_SEED"])]
    else:
        first = int(os.environ.get("SIM_FIRST", "0"))
        seeds = list(range(first, first + int(os.environ.get("SIM_SCHEDULES", str(SCHEDULES)))))
    for seed in seeds:
        world = run_schedule(seed)
        if len(seeds) == 1:
            print("\n".join(world.lines))
        if world.violations:
            pytest.fail(
                f"lane simulation, seed {seed} ({_replay_hint(seed)}):\n{world.report()}", pytrace=False
            )


def test_a_seed_replays_its_schedule_exactly() -> None:
    for seed in (3, 17, 2024):
        first, again = run_schedule(seed), run_schedule(seed)
        assert first.lines == again.lines and len(first.lines) > 10
