"""Run a script in a child Python (the repository on its path) and read the JSON report it prints last: for
tests that need a SparkContext of their own (a Connect server, a local cluster) beside the test session's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def child_report(args: list[str], what: str, timeout: float = 600) -> dict[str, Any]:
    """``python <args>`` run from the repository root; its last stdout line that starts with ``{``, parsed. Fails
    the test (naming ``what``, with the child's stderr) when the child fails or prints no report."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, f"{what} failed ({done.returncode}):\n{done.stderr[-4000:]}"
    report: dict[str, Any] = json.loads(lines[-1])
    return report
