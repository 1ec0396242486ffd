"""Every ``local-cluster[2,1,1024]`` scenario in one child process and one cluster; prints one JSON report.

A local cluster's start (a driver and two executor JVMs, the Delta jars copied to each, the first tasks' warm-up)
costs about as much as the handoff or fanout scenario, so ``tests/spark/test_cluster.py`` runs them in one (issue
30: CI under 25 minutes): ``handoff`` (``cluster_handoff.py``: failover learned across executors) first, then
``fanout`` (``cluster_fanout.py``: 200 entities through a namespace outage), then ``ordering`` and
``ordering_none`` (``cluster_ordering.py``: ``ordering: session`` through an outage with the syphon job as a second
query, and its ``ordering: none`` control). They are independent: each starts its own two local namespaces and
stream and works in its own folder. A scenario that raises is reported as
``{"crashed": "<error>"}`` and the others still run. Each scenario's report also says how long it took
(``seconds``), and ``started_in`` how long the cluster's start took.

Usage (from the repository root): ``python -m tests.spark.cluster_runs <work dir>``
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.spark import cluster_fanout, cluster_handoff, cluster_ordering
from tests.spark.cluster_harness import cluster_session, spark_work_cleaned

SCENARIOS: dict[str, Callable[[Path, Any], dict[str, Any]]] = {
    "handoff": cluster_handoff.run,
    "fanout": cluster_fanout.run,
    "ordering": cluster_ordering.run_ordered,
    "ordering_none": cluster_ordering.run_control,
}


def main(work: Path) -> dict[str, Any]:
    report: dict[str, Any] = {}
    start = time.monotonic()
    with spark_work_cleaned():
        spark = cluster_session("spark-sb-cluster")
        try:
            report["started_in"] = round(time.monotonic() - start, 1)
            for name, scenario in SCENARIOS.items():
                begun = time.monotonic()
                try:
                    report[name] = scenario(work / name, spark)
                except Exception:  # noqa: BLE001 - reported to the test that reads this scenario
                    report[name] = {"crashed": traceback.format_exc()[-4000:]}
                report[name]["seconds"] = round(time.monotonic() - begun, 1)
        finally:
            spark.stop()
    return report


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1])), default=str))
