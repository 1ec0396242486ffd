"""Run a script in a child Python (the repository on its path) and read the JSON report it prints last: for
tests that need a SparkContext of their own (a Connect server, a local cluster) beside the test session's."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def child_report(args: list[str], what: str, timeout: float = 600) -> dict[str, Any]:
    """``python <args>`` run from the repository root; its last stdout line that starts with ``{``, parsed. Fails
    the test (naming ``what``, with the child's stderr) when the child fails or prints no report. A child still
    running after ``timeout`` s gets SIGABRT: Python's fault handler (on in the child) prints every thread's stack
    to its stderr, which the failure shows - a hang says where it hung."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "PYTHONFAULTHANDLER": "1",
    }
    with subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group: the JVM it starts goes with it
    ) as child:
        try:
            stdout, stderr = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.communicate(timeout=30)  # the stacks (output read so far is kept)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)  # the JVM too, which holds the pipes open
            stdout, stderr = child.communicate()
            raise AssertionError(
                f"{what} still running after {timeout:.0f} s; its stacks (SIGABRT):\n{stderr[-12000:]}"
            ) from None
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert child.returncode == 0 and lines, f"{what} failed ({child.returncode}):\n{stderr[-4000:]}"
    report: dict[str, Any] = json.loads(lines[-1])
    return report
