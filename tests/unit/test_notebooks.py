"""The notebooks are Databricks source files: the header line, cells split by ``# COMMAND ----------``, magic cells
(``# MAGIC``) with an install cell that installs the wheel from its widget, and Python cells that compile."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py"))
HEADER = "# Databricks notebook source"
SEPARATOR = "# COMMAND ----------"


def cells(path: Path) -> list[tuple[str, str]]:
    """(kind, source) of each cell: kind ``magic`` (every line a ``# MAGIC`` line) or ``python``."""
    text = path.read_text()
    lines = text.splitlines()
    assert lines[0] == HEADER, f"{path.name}: first line must be {HEADER!r}"
    out: list[tuple[str, str]] = []
    for chunk in "\n".join(lines[1:]).split(f"\n{SEPARATOR}\n"):
        body = [line for line in chunk.strip("\n").splitlines() if line.strip()]
        assert body, f"{path.name}: empty cell"
        magic = all(line.startswith("# MAGIC") for line in body)
        out.append(("magic" if magic else "python", chunk.strip("\n")))
    return out


def test_there_are_the_three_notebooks() -> None:
    assert {p.name for p in NOTEBOOKS} >= {"servicebus_sink.py", "syphon.py", "failover_dashboard.py"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_cells_split_and_python_cells_compile(path: Path) -> None:
    parsed = cells(path)
    assert len(parsed) >= 4
    for i, (kind, source) in enumerate(parsed):
        if kind == "python":
            compile(source, f"{path.name}[cell {i}]", "exec")
        else:
            assert all(line.startswith("# MAGIC") for line in source.splitlines() if line.strip())


@pytest.mark.parametrize("name", ["syphon.py", "failover_dashboard.py"])
def test_installs_the_wheel_from_its_widget_and_restarts_python(name: str) -> None:
    parsed = cells(ROOT / "notebooks" / name)
    sources = [s for _, s in parsed]
    assert "# MAGIC %pip install $wheel" in sources
    install = sources.index("# MAGIC %pip install $wheel")
    assert 'dbutils.widgets.text("wheel"' in "\n".join(sources[:install])
    assert "dbutils.library.restartPython()" in sources[install + 1]


def test_the_syphon_notebook_references_secrets_and_never_writes_one() -> None:
    text = (ROOT / "notebooks" / "syphon.py").read_text()
    assert "{{secrets/" in text and "SharedAccessKey=" not in text
    assert "run_syphon(" in text and "stop_gracefully(" in text
