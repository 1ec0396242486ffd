"""Mutants of the lane for the simulation (issue 47: "shown, not asserted"): each puts a known break back into
the lane's source, and the simulation is run on it until a schedule fails. Not a test; run by hand:

    .venv/bin/python -m tests.unit.wire.lanesim_mutants [NAME ...] [--max N]

prints, per mutant, the first failing seed and how many schedules it took (and what broke)."""

from __future__ import annotations

import argparse
import time

from tests.unit.wire.lanesim import _SOURCE, run_schedule

#: name -> (what it breaks, [(text in the lane's source, what replaces it)])
MUTANTS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "break5": (
        "issue 47 item 5 put back: a call is marked started before it holds the context, and a direct call does "
        "not count as a running call with a deadline",
        [
            (
                """            with self.use:
                with self._claim:
                    if call.withdrawn:  # its caller gave up while it waited (it got Withdrawn): not run
                        continue
                    if self.retired:  # abandoned or reset while it waited for the context: never run on it
                        call.error = LaneClosed("the lane's worker was retired before the call started")
                        call.done.set()
                        break
                    call.started = True
                    self._running_timed = call.timed
                try:""",
                """            with self._claim:
                if call.withdrawn:
                    continue
                call.started = True
                self._running_timed = call.timed
            with self.use:
                try:""",
            ),
            (
                """            with worker._claim:
                if worker.retired:
                    return None
                worker._running_timed = True
""",
                "",
            ),
        ],
    ),
    "no-withdraw": (
        "a queued call at its deadline always abandons the worker (the withdrawal of issue 45 removed)",
        [("            if call.started or not self._running_timed:", "            if True:")],
    ),
    "withdraw-no-retire": (
        "withdraw() says no without retiring the worker (the race fixed in 9553dbb): a direct call may start on it "
        "before the queued call's caller abandons it",
        [
            (
                "                self.retired = True\n                return False",
                "                return False",
            ),
            (
                "                if worker.retired:\n                    return None\n                worker._running_timed",
                "                worker._running_timed",
            ),
        ],
    ),
    "runs-withdrawn": (
        "the worker runs a call its caller withdrew",
        [
            (
                "                    if call.withdrawn:  # its caller gave up",
                "                    if False:  # its caller gave up",
            )
        ],
    ),
    "late-not-exceeded": (
        "a direct call whose deadline fired reports the error it met instead of DeadlineExceeded",
        [("        if late:\n            exceeded", "        if False:\n            exceeded")],
    ),
}


def mutant(name: str) -> str:
    source = _SOURCE
    for old, new in MUTANTS[name][1]:
        assert source.count(old) == 1, (
            f"{name}: the text to replace is not in the lane's source once: {old!r}"
        )
        source = source.replace(old, new)
    return source


def hunt(name: str, most: int) -> None:
    source = mutant(name)
    began = time.monotonic()
    for seed in range(most):
        world = run_schedule(seed, source)
        if world.violations:
            print(
                f"{name}: found by schedule {seed} ({seed + 1} schedules, {time.monotonic() - began:.1f} s)"
            )
            print(f"  {world.violations[0][:300]}")
            return
    print(f"{name}: not found in {most} schedules ({time.monotonic() - began:.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("names", nargs="*", default=list(MUTANTS))
    parser.add_argument("--max", type=int, default=5000)
    args = parser.parse_args()
    for name in args.names:
        hunt(name, args.max)


if __name__ == "__main__":
    main()
