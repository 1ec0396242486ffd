"""The kill tests' fault hook (spark_sb/source/faults.py): off by default, the n-th time, the kills capped across
processes. Each case is a small Python process that reaches points and prints what it got past."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROGRAM = "from spark_sb.source.faults import fault\nfor i in range(1, 6):\n    fault('read'); print(i, flush=True)\n"


def _run(env: dict[str, str]) -> tuple[int, list[str]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SPARK_SB_SOURCE_FAULT")}
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        cwd=ROOT,
        env={**base, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.returncode, done.stdout.split()


def test_the_hook_does_nothing_for_other_points() -> None:
    assert _run({"SPARK_SB_SOURCE_FAULT": "sink:1"}) == (0, ["1", "2", "3", "4", "5"])


def test_it_kills_at_the_nth_time_and_the_mark_caps_the_kills(tmp_path: Path) -> None:
    mark = str(tmp_path / "kills")
    env = {"SPARK_SB_SOURCE_FAULT": "read:3", "SPARK_SB_SOURCE_FAULT_MARK": mark}
    assert _run(env) == (-signal.SIGKILL, ["1", "2"])
    assert _run(env) == (0, ["1", "2", "3", "4", "5"])  # one kill was allowed (times: 1)
    assert Path(mark).read_text().split()[0].startswith("read:")
