"""A9 (issue 48; SOURCE.md §13): A1 reduced to two kill points under Spark Connect (``remote("local[2]")``), on
both Spark pairs (the Makefile's OLDEST_TIER runs this file on pyspark 4.0.5, where Spark calls ``latestOffset()``
without a start and has no AvailableNow: the child streams with ``processingTime``).

The query runs in ``source_child.py`` with a local Connect server of its own (``tests/spark/connect_stream.py``'s
session: the Connect port's lock, Delta); the source's fault hook SIGKILLs the child's process group - the client,
the server's JVM, the planner process, the ``foreachBatch`` runner - at 3. after the WAL before the defer and
5. after the Delta commit before the commit log (in the ``foreachBatch``, which runs beside the server), then the
query restarts on the same checkpoint until the entity is empty. Reduced form: 1,000 messages, 250 a batch, locks
of 5 s.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from servicebus_local.server import LocalNamespace

from .source_child import delta_numbers, drain, entity_left, make_entity, run_child

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

N = 1_000
POINTS = {"defer": "defer:2", "sink": "sink:2"}


@pytest.fixture
def namespace() -> Any:
    if importlib.util.find_spec("grpc") is None:
        pytest.skip("Spark Connect client dependencies missing: pip install -e '.[connect]'")
    ns = LocalNamespace("connect-kills").start()
    try:
        yield ns
    finally:
        ns.stop()


def test_a9_the_driver_killed_under_spark_connect_loses_and_duplicates_nothing(
    namespace: LocalNamespace, tmp_path: Path
) -> None:
    make_entity(namespace, "orders", N)
    spec = {
        "cs": namespace.connection_string,
        "entity": "orders",
        "work": str(tmp_path),
        "connect": True,
        "options": {"maxMessagesPerTrigger": "250", "receiveWaitTime": "1s"},
        "timeout": 300,
    }
    for point, fault in POINTS.items():
        run = run_child(spec, tmp_path, fault)
        assert run.killed and run.kills and run.kills[0].startswith(point), (
            f"not killed at {point}: exit {run.returncode}, {run.report}\n{run.stderr[-3000:]}"
        )
    runs = drain(spec, tmp_path)
    got = {**delta_numbers(tmp_path / "out"), **entity_left(namespace, "orders")}
    print("A9", got, [r.report for r in runs])
    assert {k: v for k, v in got.items() if k != "max_delivery_count"} == {
        "rows": N,
        "distinct": N,
        "active": 0,
        "deferred": 0,
        "dead_lettered": 0,
    }, got
    assert got["max_delivery_count"] <= 2, got
