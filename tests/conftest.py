"""Shared fixtures (the session-scoped SparkSession, local[2] with Delta; Azure connection strings) and the test
tiers: each test's tier marker comes from its directory, one marker per tier, so that the two never disagree.

| directory            | marker  | what                                                              |
| tests/unit           | unit    | pure logic with fakes and a fake clock                            |
| tests/sim            | unit    | the ordering simulation: real code, fake namespaces and clock     |
| tests/integration    | local   | the real SDK over real TCP against local namespaces               |
| tests/spark          | spark   | the session SparkSession (local[2], Delta), local namespaces too   |
| tests/acceptance     | spark   | the acceptance scenario, run against two local namespaces         |
| tests/packaging      | packaging | building and installing the distributions into fresh venvs      |
| tests/bench          | bench   | every bench/bench_*.py in its smoke mode, in a child process       |

Tests parametrized with ``backend="azure"`` also get ``azure`` (they run when SB_PRIMARY_CONNECTION_STRING and
SB_SECONDARY_CONNECTION_STRING are set). ``slow`` stays a file's or test's own mark.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.jvm_archive import CHILD_JVM_OPTIONS, ENGINE_CONF, ENGINE_PROPERTIES, archive_options

TESTS = Path(__file__).resolve().parent

#: The JVMs of the suite's child processes (Connect servers, spark-submit and job runs, the shutdown programs, the
#: local cluster's driver - its executors get them from ``cluster_harness``), which inherit the environment: short
#: lives, many of them on a 2-core machine, their JIT work mostly wasted. C1 only and the serial collector spend
#: about 40% less CPU on a child's work (a session start, 15 Delta appends and reads, 10 micro-batches: 158 -> 97
#: CPU-seconds, wall 87 -> 75 s alone). The test session's own JVM (:func:`spark`: 10-25 minutes of Delta work in a
#: pytest-xdist worker) keeps C2: it pays off there (test_state_maintenance: 222 s with the defaults, 262 s C1 only,
#: side by side). The product's sessions and the benches' own runs keep the defaults. A value already set
#: in the environment is kept, for the session too.
#: Every JVM of the suite, the session's too, maps the class-data archive that ``make jvm-archive`` builds for this
#: venv where there is one (tests/jvm_archive.py: a child's start and first Delta write 35 -> 24 CPU-seconds).
_ARCHIVE_OPTIONS = archive_options()
#: The test session's own JVM keeps C2 but takes the serial collector too: on 2 cores G1's concurrent threads cost
#: more than its pauses save there (tests/spark/test_state_delta.py alone: 185 -> 165 s, 320 -> 272 CPU-seconds,
#: 2026-12-07).
SESSION_JVM_OPTIONS = f"-XX:+UseSerialGC {_ARCHIVE_OPTIONS}".strip()
#: The test session's engine settings (``ENGINE_CONF``; not the product's, whose sessions keep Spark's defaults):
#: the suite runs thousands of small, different queries (a state table's few rows, a micro-batch of tens) on 2
#: cores, where whole-stage code generation (a Janino compile per new plan) and adaptive execution (its re-planning)
#: cost CPU and buy nothing. tests/spark/test_state_delta.py alone: 291 -> 270 s beside other work (2026-12-06).
#: The same holds for the expressions' own code generation (``spark.sql.codegen.factoryMode``: NO_CODEGEN evaluates them
#: interpreted, the path Spark's own tests check against the generated one): the state store's ensure, writes and
#: reads three times over on fresh tables, 86-95 -> 74-78 CPU-seconds alone (2026-12-07). Nothing of Delta's (its
#: files, logs and statistics) changes.
#: The children's JVMs take the same engine settings as system properties (a ``SparkConf`` reads every ``spark.*``
#: one; the children's own sessions, jobs and Connect servers otherwise keep what the product sets): a Connect
#: server's three scenarios, tests/spark/test_connect.py alone, 96 -> 77 CPU-seconds (2026-12-07). The local
#: cluster's executors take the JVM options without them (``cluster_harness``): Spark refuses ``spark.*`` there,
#: and its tasks carry the driver's SQL settings anyway.
TEST_JVM_OPTIONS = " ".join(filter(None, [CHILD_JVM_OPTIONS, _ARCHIVE_OPTIONS, ENGINE_PROPERTIES]))
_CHILD_JVM_OPTIONS_OURS = "SPARK_SUBMIT_OPTS" not in os.environ
os.environ.setdefault("SPARK_SUBMIT_OPTS", TEST_JVM_OPTIONS)
TIERS = {
    "unit": "unit",
    "sim": "unit",
    "packaging": "packaging",
    "integration": "local",
    "spark": "spark",
    "acceptance": "spark",
    "bench": "bench",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            parts = item.path.resolve().relative_to(TESTS).parts
        except ValueError:
            continue  # not under tests/ (the local namespace's own tests mark themselves)
        tier = TIERS.get(parts[0]) if len(parts) > 1 else None
        if tier is not None:
            item.add_marker(tier)
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("backend") == "azure":
            item.add_marker("azure")
    if getattr(config.option, "numprocesses", None) or hasattr(config, "workerinput"):
        # Under pytest-xdist the longest files go first (LONGEST_FIRST, then the other files marked slow, then the
        # rest; stable: a file's tests keep their order): a worker that starts a 5-minute file last keeps the whole
        # tier waiting while the other worker idles. It is the workers' order that counts (the controller hands
        # out what they collected), and xdist unsets numprocesses in a worker: before, they never sorted. The Spark tiers hand out whole files in this order (--dist
        # loadfile --no-loadscope-reorder: xdist's own reorder puts the files with the most tests first instead).
        items.sort(key=_longest_first)


#: The Spark tiers' longest files, longest first (seconds in one worker of the pinned pair, `make test-spark` with
#: the oldest pair's tier beside it as CI runs them, on the 2-core machine, 2026-12-07), except test_source.py: it
#: waits more than it computes (an idle query's 60 s, batches that sleep twice the lock duration), so it runs while
#: the oldest pair's tier keeps the cores busy, not in the pinned pair's last minutes alone, where a wait leaves a
#: core idle. tests/unit/test_tiers.py checks that each exists.
LONGEST_FIRST = (
    "tests/spark/test_state_delta.py",  # 325: a fresh table's first write costs seconds, each test has its own
    "tests/spark/test_cluster.py",  # 290: one child, a local cluster and four scenarios
    "tests/spark/test_source.py",  # 130: waits (above)
    "tests/spark/test_syphon_job_runs.py",  # 220
    "tests/spark/test_source_kills.py",  # 195: a child session per kill
    "tests/spark/test_syphon_job_cli.py",  # 135: three jobs/syphon.py runs, one of them under spark-submit
    "tests/spark/test_connect.py",  # 130: one child, one Connect server, three scenarios
    "tests/spark/test_state_maintenance.py",  # 125
    "tests/spark/test_sink_state.py",  # 105
    "tests/spark/test_source_connect.py",  # 95: a Connect server per kill
    "tests/spark/test_pipelines.py",  # 80: two spark-pipelines runs (each its own Connect server)
    "tests/spark/test_datasource.py",  # 80
    "tests/spark/test_shutdown.py",  # 75: three child programs
    "tests/spark/test_datasource_catalog.py",  # 75
    "tests/acceptance/test_readme_examples.py",  # 65: the spark-submit example
    "tests/acceptance/test_acceptance_local.py",  # 60
    "tests/spark/test_syphon_job.py",  # 40
    "tests/spark/test_syphon_job_available_now.py",  # 35
    "tests/spark/test_datasource_ordering.py",  # 30
    "tests/spark/test_sink_counts.py",  # 20
)


def _longest_first(item: pytest.Item) -> tuple[int, bool]:
    try:
        name = item.path.resolve().relative_to(TESTS.parent).as_posix()
    except ValueError:
        name = ""
    rank = LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)
    return rank, item.get_closest_marker("slow") is None


# The local Service Bus namespace fixtures (namespace_pair, local_namespace) come from the servicebus-local
# distribution's pytest plugin (its `pytest11` entry point), so that anyone's tests can use them.


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One SparkSession for the whole run: local[2], UI off, 2 shuffle partitions, Delta enabled."""
    from spark_sb.spark.session import build_spark_session

    warehouse = tempfile.mkdtemp(prefix="spark-sb-warehouse-")
    # the session's own options here (SESSION_JVM_OPTIONS); the children's (TEST_JVM_OPTIONS) are put back once it
    # has started
    children = os.environ.pop("SPARK_SUBMIT_OPTS") if _CHILD_JVM_OPTIONS_OURS else None
    if children is not None:
        os.environ["SPARK_SUBMIT_OPTS"] = SESSION_JVM_OPTIONS
    try:
        session = build_spark_session(
            "spark-servicebus-tests",
            "local[2]",
            {
                "spark.sql.warehouse.dir": warehouse,
                "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
                **ENGINE_CONF,
            },
        )
    finally:
        if children is not None:
            os.environ["SPARK_SUBMIT_OPTS"] = children
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
    shutil.rmtree(warehouse, ignore_errors=True)


@pytest.fixture
def azure_connection_strings() -> tuple[str, str]:
    """Connection strings of a real primary and secondary namespace, or skip (integration against Azure)."""
    primary = os.environ.get("SB_PRIMARY_CONNECTION_STRING")
    secondary = os.environ.get("SB_SECONDARY_CONNECTION_STRING")
    if not primary or not secondary:
        pytest.skip("SB_PRIMARY_CONNECTION_STRING / SB_SECONDARY_CONNECTION_STRING not set")
    return primary, secondary
