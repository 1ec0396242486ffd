"""The three Spark Connect scenarios in one child process and one local Connect server; prints one JSON report.

A Connect server's start (a JVM, the Delta jars through Ivy, the first query's warm-up) costs more than any of the
scenarios run in it, and each test tier paid it three times (issue 30: CI under 25 minutes). So the tests that
need a Connect session share this child's report (``connect_reports`` in ``tests/spark/test_connect.py``, where they
all are, so that one pytest-xdist worker runs the child once). The scenarios are independent - each starts its own two
local namespaces and works in its own folder - and run one after the other in the same session:

* ``stream``: ``foreachBatch(ServiceBusSink(config))`` through a primary outage (``connect_stream.py``);
* ``syphon``: the syphon query moving two backlog queues (``connect_syphon.py``);
* ``datasource``: ``format("servicebus")`` with catalog state tables and the relay, last because the relay's
  listener stays registered on the session (``connect_datasource.py``).

A scenario that raises is reported as ``{"crashed": "<error>"}`` and the others still run.

Usage (from the repository root): ``python tests/spark/connect_runs.py <work dir>``
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.spark import connect_datasource, connect_stream, connect_syphon
from tests.spark.connect_stream import _session

SCENARIOS: dict[str, Callable[[Path, Any], dict[str, Any]]] = {
    "stream": connect_stream.run,
    "syphon": connect_syphon.run,
    "datasource": connect_datasource.run,
}


def main(work: Path) -> dict[str, Any]:
    spark = _session(work / "warehouse")
    report: dict[str, Any] = {}
    try:
        for name, scenario in SCENARIOS.items():
            try:
                report[name] = scenario(work / name, spark)
            except Exception:  # noqa: BLE001 - reported to the test that reads this scenario
                report[name] = {"crashed": traceback.format_exc()[-4000:]}
    finally:
        spark.stop()
    return report


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1])), default=str))
