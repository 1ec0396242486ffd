"""Both ``local-cluster[2,1,1024]`` scenarios in one child process and one cluster; prints one JSON report.

A local cluster's start (a driver and two executor JVMs, the Delta jars copied to each, the first tasks' warm-up)
costs about as much as either scenario, so ``tests/spark/test_cluster.py`` runs them in one (issue 30: CI under
25 minutes): ``handoff`` (``cluster_handoff.py``: failover learned across executors) first, then ``fanout``
(``cluster_fanout.py``: 200 entities through a namespace outage). They are independent: each starts its own two
local namespaces and stream and works in its own folder. A scenario that raises is reported as
``{"crashed": "<error>"}`` and the other still runs.

Usage (from the repository root): ``python -m tests.spark.cluster_runs <work dir>``
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.spark import cluster_fanout, cluster_handoff
from tests.spark.cluster_harness import cluster_session, spark_work_cleaned

SCENARIOS: dict[str, Callable[[Path, Any], dict[str, Any]]] = {
    "handoff": cluster_handoff.run,
    "fanout": cluster_fanout.run,
}


def main(work: Path) -> dict[str, Any]:
    report: dict[str, Any] = {}
    with spark_work_cleaned():
        spark = cluster_session("spark-sb-cluster")
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
