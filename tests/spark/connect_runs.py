"""The three Spark Connect scenarios in one child process and one local Connect server; prints one JSON report.

A Connect server's start (a JVM, the Delta jars, the first query's warm-up: 30-60 s at load) costs about as much
as a scenario run in it, and a child per scenario paid it three times on each Spark pair (issue 49: CI time). So
``tests/spark/test_connect.py`` runs them in one session, one after the other; each starts its own two local
namespaces and works in its own folder:

* ``stream``: ``foreachBatch(ServiceBusSink(config))`` through a primary outage (``connect_stream.py``);
* ``syphon``: the syphon query moving two backlog queues (``connect_syphon.py``);
* ``datasource``: ``format("servicebus")`` with catalog state tables (in ``<work>/warehouse``) and the relay
  (``connect_datasource.py``), last: the relay's listener stays registered on the session, inert, after its stop.

Once, in one server, a run hung in CI with every test lost (most likely pyspark's Connect removeListener deadlock
in ``relay.stop()``, since fixed in ``spark_sb/spark/relay.py``). So each scenario's work is bounded: it runs in a
thread of its own for at most :data:`DEADLINE` seconds. A scenario that raises is reported as ``{"crashed":
"<error>"}``, one still running at its deadline as ``{"crashed": "still running ..."}`` with every thread's
stack, and the others still run; the session's stop is bounded too. Each scenario's report says how long it took
(``seconds``), and ``started_in`` how long the server's start took. The child's runner (``child_report``) bounds
the whole, the start included.

Usage (from the repository root): ``python -m tests.spark.connect_runs <work dir>``; one scenario alone, in a
session of its own: ``python tests/spark/connect_<name>.py <work dir>``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from tests.spark import connect_datasource, connect_stream, connect_syphon
from tests.spark.connect_stream import _session

SCENARIOS: dict[str, Callable[[Path, Any], dict[str, Any]]] = {
    "stream": connect_stream.run,
    "syphon": connect_syphon.run,
    "datasource": connect_datasource.run,
}

#: The most a scenario's work may take (s): alone, 20-70 s each; the datasource's own waits (the relay's settle,
#: 240 s) stay inside it. ``tests/spark/test_connect.py`` gives the child time for the start and every deadline.
DEADLINE = 300.0
#: The most the session's stop may take (s).
STOP_DEADLINE = 60.0


def _stacks() -> str:
    """Every thread's stack, the scenario's first (what a hang says about where it hung)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    frames = sorted(
        sys._current_frames().items(), key=lambda f: not names.get(f[0], "").startswith("scenario")
    )
    return "\n".join(
        f"--- thread {names.get(ident, ident)}:\n{''.join(traceback.format_stack(frame))}"
        for ident, frame in frames
    )


def bounded(name: str, work: Callable[[], dict[str, Any]], deadline: float) -> dict[str, Any]:
    """``work()`` in a thread of its own (a daemon: a hung one does not hold the process), waited for at most
    ``deadline`` s: its report, ``{"crashed": <traceback>}`` if it raised, ``{"crashed": "still running ...",
    "hung": True}`` if it is still running then."""
    done: dict[str, dict[str, Any]] = {}

    def run() -> None:
        try:
            done["report"] = work()
        except BaseException:  # noqa: BLE001 - reported to the test that reads this scenario
            done["report"] = {"crashed": traceback.format_exc()[-4000:]}

    thread = threading.Thread(target=run, name=f"scenario-{name}", daemon=True)
    thread.start()
    thread.join(deadline)
    if thread.is_alive():
        return {
            "crashed": f"{name} still running after {deadline:.0f} s (the scenarios after it still run); the stacks:\n"
            + _stacks()[:8000],
            "hung": True,
        }
    return done["report"]


def main(work: Path) -> tuple[dict[str, Any], bool]:
    """Every scenario's report by name, and whether all of them (and the session's stop) ended in time."""
    report: dict[str, Any] = {}
    start = time.monotonic()
    spark = _session(work / "warehouse")
    report["started_in"] = round(time.monotonic() - start, 1)
    for name, scenario in SCENARIOS.items():
        begun = time.monotonic()
        report[name] = bounded(name, partial(scenario, work / name, spark), DEADLINE)
        report[name]["seconds"] = round(time.monotonic() - begun, 1)
    stopped = bounded("stop", lambda: spark.stop() or {}, STOP_DEADLINE)
    if stopped:
        report["stop"] = stopped
    return report, not any(isinstance(r, dict) and r.get("hung") for r in report.values())


if __name__ == "__main__":
    result, ended = main(Path(sys.argv[1]))
    print(json.dumps(result, default=str), flush=True)
    # a thread still hangs: the interpreter's exit (its atexit handlers, the session's) might hang on it too
    if not ended:
        sys.stderr.flush()
        os._exit(0)
