"""Packaging: what `pip install spark-servicebus` brings, the extras, the pinned development set, the console
script, and that the core imports without the optional extras (pyspark, delta-spark, qpid-proton, trustme)."""

from __future__ import annotations

import argparse
import ast
import io
import os
import re
import shutil
import subprocess
import sys
import textwrap
import venv
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from spark_sb import __version__
from spark_sb.admin import cli

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]

#: Top-level modules of the extras, never needed by the core at run time.
OPTIONAL_MODULES = ("pyspark", "delta", "proton", "trustme", "pyarrow", "pandas", "grpc", "IPython")
#: Runtime distribution -> the top-level modules the core may import at module level.
RUNTIME_MODULES = {"azure-servicebus": {"azure"}, "azure-identity": {"azure"}, "pyyaml": {"yaml"}}
#: The core: every module of the package but the session builder (extra `spark`). The local namespace is a
#: distribution of its own (servicebus_local/).
CORE = sorted(p for p in (ROOT / "spark_sb").rglob("*.py") if p.name != "session.py")
#: What an emulator module looks like in a file list: the modules of servicebus_local/, by name.
EMULATOR_MODULES = sorted(
    p.name for p in (ROOT / "servicebus_local").glob("*.py") if p.name not in ("__init__.py", "__main__.py")
)


def _requirement_name(req: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0].lower().replace("_", "-")


def _module_level_imports(path: Path) -> set[str]:
    """Top-level names imported outside functions and outside ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
            elif isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.With):
                visit(node.body)

    visit(tree.body)
    return found


def test_runtime_dependencies_are_only_what_the_core_imports() -> None:
    names = {_requirement_name(r) for r in PROJECT["dependencies"]}
    assert names == set(RUNTIME_MODULES)
    allowed = {"spark_sb", "__future__", *sys.stdlib_module_names, *set().union(*RUNTIME_MODULES.values())}
    for path in CORE:
        stray = _module_level_imports(path) - allowed
        assert not stray, f"{path.relative_to(ROOT)} imports {sorted(stray)} at module level"


def test_extras_use_ranges_and_keep_heavy_packages_out_of_the_runtime() -> None:
    extras = PROJECT["optional-dependencies"]
    assert set(extras) >= {"spark", "local", "connect", "test"}
    spark = {_requirement_name(r): r for r in extras["spark"]}
    assert {"pyspark", "delta-spark"} <= set(spark)
    for name in ("pyspark", "delta-spark"):
        assert "==" not in spark[name] and ">=" in spark[name], spark[name]
    assert "<=4.4.0" in spark["delta-spark"]  # 4.4.1's jar is not on Maven Central
    assert {_requirement_name(r) for r in extras["local"]} == {"servicebus-local"}
    assert {_requirement_name(r) for r in extras["connect"]} >= {
        "grpcio",
        "grpcio-status",
        "googleapis-common-protos",
        "pandas",
        "zstandard",
        "pyarrow",
    }
    assert "markdown-it-py" in {_requirement_name(r) for r in extras["test"]}


def test_the_development_set_is_pinned_and_installed_with_every_extra() -> None:
    pins = {}
    for line in (ROOT / "constraints-dev.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"not an exact pin: {line}"
            pins[_requirement_name(name)] = version
    assert pins["pyspark"] == "4.2.0"
    assert pins["delta-spark"] == "4.4.0"
    wanted = {_requirement_name(r) for extra in PROJECT["optional-dependencies"].values() for r in extra}
    wanted |= {_requirement_name(r) for r in PROJECT["dependencies"]}
    # servicebus-local comes from this repository (installed editable); what it needs is pinned like the rest
    wanted.discard("servicebus-local")
    local = tomllib.loads((ROOT / "servicebus_local" / "pyproject.toml").read_text())["project"]
    wanted |= {_requirement_name(r) for r in local["dependencies"]}
    assert not wanted - set(pins), f"unpinned: {sorted(wanted - set(pins))}"
    makefile = (ROOT / "Makefile").read_text()
    assert "EXTRAS := spark,local,connect,test" in makefile
    assert re.search(
        r"pip install -q -e \./servicebus_local -e '\.\[\$\(EXTRAS\)\]' -c \$\(CONSTRAINTS\)", makefile
    )
    assert "CONSTRAINTS := constraints-dev.txt" in makefile
    assert re.search(r"^wheel:", makefile, re.M)


def test_license_file_matches_the_license_expression() -> None:
    assert PROJECT["license"] == "MIT"
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert any(c.startswith("Programming Language :: Python :: 3") for c in PROJECT["classifiers"])
    assert PROJECT["urls"]


def test_console_script_is_the_module_entry_point() -> None:
    assert PROJECT["scripts"] == {"spark-sb": "spark_sb.admin.cli:console_main"}
    assert callable(cli.console_main)
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "spark_sb.__version__"}


def test_version_flag_prints_the_package_version() -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(["--version"], prog="spark-sb") == 0
    assert out.getvalue().strip() == f"spark-servicebus {__version__}"


@pytest.mark.parametrize(
    ("argv", "level"),
    [
        (["provision", "--config", "c.yaml"], 0),
        (["-v", "provision", "--config", "c.yaml"], 1),
        (["provision", "--config", "c.yaml", "-v"], 1),
        (["provision", "-vv", "--config", "c.yaml"], 2),
        (["-v", "provision", "--config", "c.yaml", "--verbose"], 2),
    ],
)
def test_verbose_is_accepted_before_and_after_the_command(
    argv: list[str], level: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []

    def fake_provision(args: argparse.Namespace) -> int:
        seen.append(args.verbose)
        return 0

    monkeypatch.setattr(cli, "run_provision", fake_provision)
    monkeypatch.setattr(cli, "_setup_logging", lambda verbose: None)
    assert cli.main(argv) == 0
    assert seen == [level]


_BLOCKER = textwrap.dedent(
    """
    import importlib.abc, sys
    BLOCKED = {blocked!r}
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
            return None
    sys.meta_path.insert(0, Block())
    """
)


def test_the_core_imports_and_works_without_the_extras() -> None:
    """pyspark, delta-spark, qpid-proton, trustme, pyarrow: blocked; the core still imports, loads a config,
    maps a message and runs the CLI. Only the Spark-facing function names need pyspark, and only when called."""
    modules = [".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__") for p in CORE]
    script = (
        _BLOCKER.format(blocked=OPTIONAL_MODULES)
        + f"MODULES = {modules!r}\n"
        + textwrap.dedent(
            """
        import importlib
        for name in MODULES:  # every module of the core
            importlib.import_module(name)
        import spark_sb, spark_sb.config.service_bus, spark_sb.sender.paired, spark_sb.spark.sink, spark_sb.syphon.mover
        import spark_sb.admin.provisioning, spark_sb.message.rows, spark_sb.core.errors, spark_sb.failover, spark_sb.admin.cli
        from spark_sb import ServiceBusSink, PairedSender, Syphon, OutboundMessage, load_config, is_probe
        config = load_config({
            "primary": {"connection_string": "Endpoint=sb://a.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=s"},
            "secondary": {"connection_string": "Endpoint=sb://b.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=s"},
            "entity": "orders",
        })
        sink = ServiceBusSink(config)
        import pickle; pickle.loads(pickle.dumps(sink))
        OutboundMessage(body="x", message_id="1")
        try:
            import pyspark
        except ModuleNotFoundError:
            pass
        else:
            raise SystemExit("the blocker did not block pyspark")
        assert not [m for m in sys.modules if m.split(".")[0] in BLOCKED], sorted(sys.modules)
        sys.argv = ["spark-sb", "--version"]
        spark_sb.admin.cli.console_main()
        """
        )
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"spark-servicebus {__version__}"


@pytest.mark.slow
def test_the_wheel_installs_alone_in_a_fresh_venv(tmp_path: Path) -> None:
    """Build the wheel, install it with its runtime dependencies only in a venv that does not see this one, and
    use it: the extras are absent and the core imports, the console script answers."""
    # setuptools builds in the source tree (build/, *.egg-info): build from a copy, not the checkout.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "spark_sb", src / "spark_sb", ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(src)],
        check=True,
        timeout=300,
    )
    wheel = next(dist.glob("spark_servicebus-*.whl"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True, system_site_packages=False)
    python = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(wheel), "-c", str(ROOT / "constraints-dev.txt")],
        check=True,
        timeout=600,
        env=env,
    )
    check = textwrap.dedent(
        f"""
        import importlib.util, sys
        missing = [m for m in {OPTIONAL_MODULES!r} if importlib.util.find_spec(m) is None]
        assert missing == list({OPTIONAL_MODULES!r}), missing
        import spark_sb, spark_sb.config.service_bus, spark_sb.sender.paired, spark_sb.spark.sink, spark_sb.syphon.mover, spark_sb.admin.provisioning
        assert spark_sb.__file__.startswith(sys.prefix), spark_sb.__file__
        """
    )
    subprocess.run([str(python), "-c", check], check=True, timeout=120, env=env, cwd=tmp_path)
    out = subprocess.run(
        [str(env_dir / "bin" / "spark-sb"), "--version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=env,
    )
    assert out.stdout.strip() == f"spark-servicebus {__version__}"


# ------------------------------------------------------------------------------- the local namespace's own home
def test_the_local_namespace_depends_on_nothing_of_the_product() -> None:
    """servicebus_local (its modules and its tests) never imports spark_sb, even inside a function."""
    for path in sorted((ROOT / "servicebus_local").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            stray = [n for n in names if n.split(".")[0] == "spark_sb"]
            assert not stray, f"{path.relative_to(ROOT)}:{node.lineno} imports {stray}"
    local = tomllib.loads((ROOT / "servicebus_local" / "pyproject.toml").read_text())
    assert local["project"]["name"] == "servicebus-local"
    assert local["project"]["entry-points"]["pytest11"] == {"servicebus_local": "servicebus_local.fixtures"}
    assert not any(_requirement_name(r) == "spark-servicebus" for r in local["project"]["dependencies"])


def _build_wheel(source: Path, tmp_path: Path, pattern: str) -> Path:
    src = tmp_path / f"src-{source.name}"
    shutil.copytree(
        source,
        src,
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build", ".venv", "dist", ".git"),
    )
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(src)],
        check=True,
        timeout=300,
        capture_output=True,
    )
    return next(dist.glob(pattern))


@pytest.mark.slow
def test_the_product_wheel_has_no_emulator_and_no_pytest_and_the_emulator_wheel_has_no_tests(
    tmp_path: Path,
) -> None:
    import zipfile

    product_src = tmp_path / "product"
    product_src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, product_src / name)
    shutil.copytree(ROOT / "spark_sb", product_src / "spark_sb", ignore=shutil.ignore_patterns("__pycache__"))
    product = zipfile.ZipFile(_build_wheel(product_src, tmp_path, "spark_servicebus-*.whl"))
    names = product.namelist()
    modules = [n for n in names if n.endswith(".py")]
    assert "spark_sb/spark/sink.py" in modules
    shipped_emulator = [n for n in modules if n.rsplit("/", 1)[-1] in EMULATOR_MODULES and "/local/" in n]
    assert not shipped_emulator, shipped_emulator
    assert not [n for n in modules if n.startswith("spark_sb/local/")]  # no alias package
    importing_pytest = [n for n in modules if "pytest" in _module_level_imports_of(product.read(n).decode())]
    assert not importing_pytest, importing_pytest
    emulator = zipfile.ZipFile(_build_wheel(ROOT / "servicebus_local", tmp_path, "servicebus_local-*.whl"))
    emulator_modules = [n for n in emulator.namelist() if n.endswith(".py")]
    assert (
        "servicebus_local/server.py" in emulator_modules
        and "servicebus_local/fixtures.py" in emulator_modules
    )
    assert not [n for n in emulator_modules if "/tests/" in n or n.startswith("tests/")]
    entry_points = next(n for n in emulator.namelist() if n.endswith("entry_points.txt"))
    assert "servicebus_local = servicebus_local.fixtures" in emulator.read(entry_points).decode()


def _module_level_imports_of(source: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


#: pyspark releases tried with a delta-spark release whose jar resolves (the Spark tier and the demo passed), by
#: pyspark minor version. A range in pyproject.toml that admits a pyspark outside these fails the test below:
#: pyspark 4.2.1 and 4.3.0 make pip pick delta-spark 4.4.1 / 4.1.0, whose jars are not on Maven Central.
TRIED_PAIRS: dict[str, tuple[str, ...]] = {
    "4.0": ("4.0.1", "4.4.0"),  # pyspark 4.0.5 with delta-spark 4.0.1 and 4.4.0
    "4.1": ("4.4.0",),  # pyspark 4.1.4 with delta-spark 4.4.0
    "4.2": ("4.4.0",),  # pyspark 4.2.0 with delta-spark 4.4.0 (the pinned pair)
}
TRIED_PYSPARK = ("4.0.1", "4.0.5", "4.1.4", "4.2.0")


def test_the_spark_ranges_admit_only_tried_pairs() -> None:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    spark = {_requirement_name(r): r for r in PROJECT["optional-dependencies"]["spark"]}
    pyspark = SpecifierSet(spark["pyspark"][len("pyspark") :])
    delta = SpecifierSet(spark["delta-spark"][len("delta-spark") :])
    # releases that exist and must be refused: no delta-spark declares them with a jar on Maven Central
    for refused in ("4.2.1", "4.3.0", "5.0.0"):
        assert Version(refused) not in pyspark, f"pyspark {refused} is admitted by {pyspark}"
    assert Version("4.4.1") not in delta and Version("4.1.0") not in delta  # jars not on Maven Central
    for version in TRIED_PYSPARK:
        assert Version(version) in pyspark, f"tried pyspark {version} is refused by {pyspark}"
        minor = ".".join(version.split(".")[:2])
        assert any(Version(d) in delta for d in TRIED_PAIRS[minor]), (version, delta)
    assert Version("4.0.0") not in pyspark  # never tried


def _pins(name: str) -> dict[str, str]:
    """The exact pins of a constraints file, by normalized distribution name."""
    pins = {}
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            dist, _, version = line.partition("==")
            assert version, f"{name}: not an exact pin: {line}"
            pins[_requirement_name(dist)] = version
    return pins


def _lower_bound(spec: str) -> tuple[int, ...]:
    """major.minor of a range's ``>=`` bound (``pyspark>=4.0.1,<=4.2.0`` -> (4, 0))."""
    from packaging.version import Version

    (bound,) = re.findall(r">=\s*([\w.]+)", spec)
    return Version(bound).release[:2]


def test_the_oldest_pair_is_the_oldest_the_spark_ranges_admit() -> None:
    """constraints-oldest.txt pins the oldest pair of the `spark` extra: the newest tried patch of the oldest
    pyspark minor the range admits, with the oldest tried delta-spark for it (which must be in the oldest
    delta-spark minor the range admits); everything else pinned as in the development set."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    spark = {_requirement_name(r): r for r in PROJECT["optional-dependencies"]["spark"]}
    pyspark = SpecifierSet(spark["pyspark"][len("pyspark") :])
    delta = SpecifierSet(spark["delta-spark"][len("delta-spark") :])
    oldest, dev = _pins("constraints-oldest.txt"), _pins("constraints-dev.txt")

    minor = _lower_bound(spark["pyspark"])
    assert Version(oldest["pyspark"]) in pyspark
    assert Version(oldest["pyspark"]).release[:2] == minor, (oldest["pyspark"], spark["pyspark"])
    newest_tried_patch = max((v for v in TRIED_PYSPARK if Version(v).release[:2] == minor), key=Version)
    assert oldest["pyspark"] == newest_tried_patch
    tried_delta = [d for d in TRIED_PAIRS[".".join(map(str, minor))] if Version(d) in delta]
    assert oldest["delta-spark"] == min(tried_delta, key=Version)
    assert Version(oldest["delta-spark"]).release[:2] == _lower_bound(spark["delta-spark"])
    # a second pair, not the pinned one again
    assert (oldest["pyspark"], oldest["delta-spark"]) != (dev["pyspark"], dev["delta-spark"])
    assert set(oldest) == set(dev), sorted(set(oldest) ^ set(dev))
