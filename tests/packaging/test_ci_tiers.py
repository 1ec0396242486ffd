"""CI (.ci/run) and the Makefile's test tiers: `make test` runs the whole suite in one run; CI runs the same suite
as tiers, one `make` target each, so that each tier's time is printed, and together they are everything `make
test` runs; the oldest pyspark / delta-spark pair runs the version-sensitive files of the Spark tier (OLDEST_TIER),
each of which exists."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import TIERS

ROOT = Path(__file__).resolve().parents[2]
MAKEFILE = (ROOT / "Makefile").read_text()
CI = (ROOT / ".ci" / "run").read_text()
#: Each tier's Makefile variable and the target that runs it (CI runs every one of them).
TIER_TARGETS = {
    "UNIT_TIER": "test-unit",
    "PACKAGING_TIER": "test-packaging",
    "SIM_TIER": "test-sim",
    "INTEGRATION_TIER": "test-integration",
    "SERVICEBUS_LOCAL_TIER": "test-servicebus-local",
    "SPARK_TIER": "test-spark",
    "BENCH_TIER": "bench-smoke",
}


def make_variable(name: str) -> list[str]:
    """The words of a ``NAME := ...`` assignment of the Makefile (continuation lines joined)."""
    joined = MAKEFILE.replace("\\\n", " ")
    (value,) = re.findall(rf"^{name} :?= (.+)$", joined, re.M)
    return value.split()


def recipes() -> dict[str, str]:
    """Target -> its recipe lines (tab-indented), and the target line itself under ``target + ':'``."""
    found = dict(re.findall(r"^([\w-]+):[^\n]*\n((?:\t[^\n]*\n)*)", MAKEFILE, re.M))
    found.update({f"{t}:": line for t, line in re.findall(r"^(([\w-]+):[^\n=]*)$", MAKEFILE, re.M)})
    return found


def ci_make_targets() -> list[str]:
    """The ``make`` targets .ci/run runs (comments left out), in order."""
    lines = [line.split("#", 1)[0] for line in CI.splitlines()]
    return [t for line in lines for t in re.findall(r"\bmake ([\w-]+)", line)]


def test_ci_runs_the_spark_tier_on_both_pairs() -> None:
    """The pinned pair runs the whole Spark tier (`make test-spark`, tests/spark and tests/acceptance) and the oldest
    pair its version-sensitive files (`make test-spark-oldest`) in .ci/run; the second builds its own venv from
    constraints-oldest.txt with every extra, and each run says which pair it is on."""
    assert re.search(r"^OLDEST_CONSTRAINTS := constraints-oldest\.txt$", MAKEFILE, re.M)
    assert re.search(r"^OLDEST_VENV := \.venv-oldest$", MAKEFILE, re.M)
    assert set(make_variable("SPARK_TIER")) == {
        "tests/spark",
        "tests/acceptance",
    }  # every directory marked `spark`
    steps = recipes()
    oldest = steps["test-spark-oldest"]
    # the same install rule as .venv (every extra, the local namespace editable), with the oldest constraints
    assert re.search(r"^test-spark-oldest: jars-oldest$", MAKEFILE, re.M)
    assert "VENV=$(OLDEST_VENV) CONSTRAINTS=$(OLDEST_CONSTRAINTS) jars" in steps["jars-oldest"]
    for target in ("test", "test-spark", "test-spark-oldest"):
        assert "$(SPARK_PAIR)" in steps[target], target
    oldest = oldest.replace("\\\n", " ")
    assert re.search(
        r"^\t\$\(OLDEST_VENV\)/bin/python -m pytest .*\$\(addprefix --deselect ,\$\(OLDEST_DESELECT\)\) "
        r"\$\(OLDEST_TIER\)$",
        oldest,
        re.M,
    )
    assert ".venv-oldest/" in (ROOT / ".gitignore").read_text().splitlines()
    targets = ci_make_targets()
    assert "test-spark-oldest" in targets, "CI no longer runs the Spark tier on the oldest pair"
    assert "test-spark" in targets, "CI no longer runs the Spark tier on the pinned pair"


def test_make_test_runs_the_whole_suite_and_ci_runs_all_of_it_tier_by_tier() -> None:
    """`make test` (the README's command) runs every tier's target, as CI does, and the tiers together hold every
    directory of tests there is, each in one tier; each tier runs in its own number of pytest-xdist workers."""
    make_test = re.findall(r"^\t@?\$\(MAKE\) [^\n]*$", recipes()["test"], re.M)
    assert len(make_test) == 1 and set(TIER_TARGETS.values()) <= set(make_test[0].split()), make_test
    assert re.search(r"^PYTEST = \$\(BIN\)/python -m pytest --durations=15$", MAKEFILE, re.M)
    under_tests = {
        p.relative_to(ROOT / "tests").parts[0]
        for p in (ROOT / "tests").rglob("test_*.py")
        if len(p.relative_to(ROOT / "tests").parts) > 1
    }
    assert under_tests <= set(TIERS)
    wanted = {f"tests/{d}" for d in under_tests} | {"servicebus_local/tests"}
    listed = [path for variable in TIER_TARGETS for path in make_variable(variable)]
    assert sorted(listed) == sorted(set(listed)), f"a directory in two tiers: {listed}"
    assert set(listed) == wanted, (
        f"not in a tier: {sorted(wanted - set(listed))}; unknown: {set(listed) - wanted}"
    )
    steps = recipes()
    for variable, target in TIER_TARGETS.items():
        # the benches' runs pace themselves (SMOKE_JOBS); -rP prints each run's own time
        workers = (
            rf"-n \$\({variable.removesuffix('_TIER')}_WORKERS\) " if variable != "BENCH_TIER" else "-rP "
        )
        if variable == "SPARK_TIER":  # a file's tests that share a child process run it once (test_connect),
            workers += "--dist loadfile --no-loadscope-reorder "  # the files in tests/conftest.py's order
            workers += r"\$\(addprefix --deselect ,\$\(SPARK_DESELECT\)\) "  # the oldest pair's stand-ins
        assert re.search(rf"^\t\$\(PYTEST\) {workers}\$\({variable}\)$", steps[target], re.M), target
        if variable != "BENCH_TIER":
            assert re.search(rf"^{variable.removesuffix('_TIER')}_WORKERS \?= \d+$", MAKEFILE, re.M), variable
    targets = ci_make_targets()
    missing = [t for t in TIER_TARGETS.values() if t not in targets]
    assert not missing, f"CI does not run {missing}: part of `make test` would go untested"


def test_ci_prints_each_tiers_time() -> None:
    """Every tier in .ci/run goes through the function that prints its time (``tier "<name>" make <target>``, run
    in the foreground, by ``background <key>`` or in a function that runs in the background)."""
    assert re.search(r"^tier\(\) \{", CI, re.M)
    for target in [*TIER_TARGETS.values(), "test-spark-oldest"]:
        assert re.search(rf'^\s*(?:background \w+ )?tier "[^"]+" make {target}\b', CI, re.M), target


def test_the_oldest_pairs_files_exist_and_hold_the_version_sensitive_tests() -> None:
    """OLDEST_TIER names files of the Spark tier that exist; among them the Spark Connect tests (the README says
    they run on both pairs), the data source, the sink, the Delta state store and its maintenance, and the syphon
    job."""
    files = make_variable("OLDEST_TIER")
    assert files and len(files) == len(set(files))
    for name in files:
        path = ROOT / name
        assert path.is_file(), f"OLDEST_TIER lists {name}, which does not exist"
        assert path.name.startswith("test_") and path.suffix == ".py", name
        assert path.parent.relative_to(ROOT).as_posix() in make_variable("SPARK_TIER"), name
    for node in make_variable("SPARK_DESELECT"):  # the pinned pair's: tests the oldest pair runs
        name, test = node.split("::")
        assert name in files and re.search(rf"^def {test}\(", (ROOT / name).read_text(), re.M), node
        assert node not in make_variable("OLDEST_DESELECT"), f"{node}: run on neither pair"
    for node in make_variable("OLDEST_DESELECT"):  # each a test of a listed file, by its pytest node id
        name, *parts = node.split("::")
        assert name in files and parts, node
        source = (ROOT / name).read_text() + (ROOT / "tests/unit/state/store_contract.py").read_text()
        assert re.search(rf"^\s*def {parts[-1]}\(", source, re.M), f"OLDEST_DESELECT: no test {node}"
        assert len(parts) == 1 or re.search(rf"^class {parts[0]}\(", source, re.M), node
    for must in (
        "tests/spark/test_connect.py",
        "tests/spark/test_datasource.py",
        "tests/spark/test_sink.py",
        "tests/spark/test_state_delta.py",
        "tests/spark/test_state_maintenance.py",
        "tests/spark/test_syphon_job.py",
    ):
        assert must in files, must
