"""The user-facing docs render and say true things: README.md and every page of docs/ parsed with a CommonMark
parser (every code fence closed, every section heading a heading), no internal SPEC ids, the commands they name
exist, the configuration keys they name exist, and conf/example.yaml lists every configuration key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_sb.config.settings import KNOWN_KEYS

markdown_it = pytest.importorskip("markdown_it")

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
#: README.md and the documentation site's pages (docs/**/*.md), by path.
MARKDOWN = {
    "README.md": README,
    **{p.relative_to(ROOT).as_posix(): p.read_text() for p in sorted((ROOT / "docs").rglob("*.md"))},
}
USER_DOCS = {
    **MARKDOWN,
    "CHANGELOG.md": (ROOT / "CHANGELOG.md").read_text(),
    "CONTRIBUTING.md": (ROOT / "CONTRIBUTING.md").read_text(),
    **{f"examples/{p.name}": p.read_text() for p in sorted((ROOT / "examples").glob("*.py"))},
    "conf/example.yaml": (ROOT / "conf/example.yaml").read_text(),
    "conf/local.yaml": (ROOT / "conf/local.yaml").read_text(),
    **{f"notebooks/{p.name}": p.read_text() for p in (ROOT / "notebooks").glob("*.py")},
}


def _tokens(text: str = README) -> list[Any]:
    return markdown_it.MarkdownIt("commonmark").enable("table").parse(text)


def _headings(text: str = README, tag: str = "h2") -> list[str]:
    tokens = _tokens(text)
    return [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open" and t.tag == tag]


@pytest.mark.parametrize("name", sorted(MARKDOWN))
def test_every_code_fence_is_closed_by_a_bare_fence(name: str) -> None:
    text = MARKDOWN[name]
    lines = text.splitlines()
    fences = [t for t in _tokens(text) if t.type == "fence"]
    if name == "README.md":
        assert fences
    for token in fences:
        start, end = token.map
        closing = lines[end - 1].strip() if end - 1 > start else ""
        assert closing == token.markup, (
            f"{name}:{start + 1}: the fence opened here is closed by line {end}: {lines[end - 1]!r}"
        )
        # a fence-like line inside a code block means a closing fence with text after it (not a fence)
        inner = [line for line in token.content.splitlines() if line.lstrip().startswith(("```", "~~~"))]
        assert not inner, f"{name}:{start + 1}: fence-like line inside a code block: {inner[0]!r}"


def test_section_headings_are_headings_not_code() -> None:
    in_source = [line[3:].strip() for line in README.splitlines() if line.startswith("## ")]
    assert _headings() == in_source
    for expected in ("The two commands", "The local Service Bus namespace (`servicebus_local`)", "Tests"):
        assert expected in _headings()


@pytest.mark.parametrize("name", sorted(n for n in MARKDOWN if n.startswith("docs/")))
def test_each_page_has_one_title_and_its_headings_are_headings(name: str) -> None:
    text = MARKDOWN[name]
    assert len(_headings(text, "h1")) == 1 and text.startswith("# "), f"{name}: one '# Title' first"
    for level in (2, 3):
        in_source = [
            line[level + 1 :].strip() for line in text.splitlines() if line.startswith("#" * level + " ")
        ]
        in_code = {t.content for t in _tokens(text) if t.type == "fence"}
        in_source = [h for h in in_source if not any(f"{'#' * level} {h}" in code for code in in_code)]
        assert _headings(text, f"h{level}") == in_source, name


def test_the_readme_is_short_and_points_at_the_docs() -> None:
    assert len(README.splitlines()) <= 300
    linked = set(re.findall(r"\]\(docs/([\w/-]+\.md)(?:#[\w-]*)?\)", README))
    pages = {n.removeprefix("docs/") for n in MARKDOWN if n.startswith("docs/")}
    assert linked <= pages, f"README links to pages that do not exist: {sorted(linked - pages)}"
    # the design notes (for who changes the code) are linked from design/index.md
    unlinked = {p for p in pages - linked if not p.startswith("design/")}
    assert unlinked <= {"index.md"}, f"README does not link {sorted(unlinked)}"
    design = MARKDOWN["docs/design/index.md"]
    notes = {p for p in pages if p.startswith("design/") and p != "design/index.md"}
    assert {f"design/{n}" for n in re.findall(r"\]\(([\w-]+\.md)\)", design)} >= notes, "design/index.md"


def test_the_readme_commands_exist() -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    for name, text in {**MARKDOWN, "CONTRIBUTING.md": USER_DOCS["CONTRIBUTING.md"]}.items():
        for command in re.findall(r"^make ([\w-]+)", text, re.M) + re.findall(r"`make ([\w-]+)`", text):
            assert command in targets, f"{name} mentions make {command}; the Makefile has {sorted(targets)}"
    assert {"demo", "test"} <= set(re.findall(r"^make (\w+)", README, re.M))


def test_user_docs_name_behaviours_not_spec_ids() -> None:
    """The design notes (docs/design/) are for who changes the code: they cite the specification's ids."""
    for name, text in USER_DOCS.items():
        if name.startswith("docs/design/") and name != "docs/design/index.md":
            continue
        # "SPEC", "(S4)", "B2-B8": the ids of the internal specification (but "Amazon S3" is fine)
        found = re.findall(r"\bSPEC\b|\(\s*[BSER]\d{1,2}\b|\b[BSER]\d{1,2}-[BSER]?\d{1,2}\b", text)
        assert not found, f"{name} cites internal ids {found}"


def test_no_status_line_that_goes_stale() -> None:
    assert not re.search(r"^Status:", README, re.M)
    assert "Still to come" not in README


def test_local_ports_in_the_config_match_the_readme() -> None:
    local = USER_DOCS["conf/local.yaml"]
    ports = set(re.findall(r"sb://127\.0\.0\.1:(\d+)", local))
    assert ports
    readme_ports = set(re.findall(r"sb://127\.0\.0\.1:(\d+)", README))
    assert ports <= readme_ports, (
        f"conf/local.yaml uses ports {sorted(ports)}, the README {sorted(readme_ports)}"
    )


def _keys_in_example() -> set[str]:
    """Keys of conf/example.yaml, set ones and commented-out ones (``# key: value`` at any depth)."""
    lines = []
    for line in USER_DOCS["conf/example.yaml"].splitlines():
        m = re.match(r"^(\s*)#\s?(\s*[a-z_][\w-]*:(\s.*)?)$", line)
        lines.append(m.group(1) + m.group(2) if m else line)
    data = yaml.safe_load("\n".join(lines))
    keys: set[str] = set()

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict) and value:
                walk(value, f"{prefix}{key}.")
            else:
                keys.add(f"{prefix}{key}")

    walk(data, "")
    return keys


def test_the_example_config_lists_every_key() -> None:
    keys = _keys_in_example()
    # the secondary namespace takes the same keys as the primary; the example spells them out once
    expected = {k.replace("secondary.", "primary.", 1) for k in KNOWN_KEYS}
    missing = sorted(expected - keys)
    assert not missing, f"conf/example.yaml does not list {missing}"
    assert {"provision.tries", "provision.retry_pause"} <= keys


@pytest.mark.parametrize("name", sorted(MARKDOWN))
def test_readme_mentions_no_key_the_config_does_not_know(name: str) -> None:
    known = set(KNOWN_KEYS)
    for key in set(re.findall(r"(?<![\w./])((?:provision|syphon|retry)\.[a-z_]+)\b(?!\()", MARKDOWN[name])):
        if key.endswith((".md", ".py")):  # a page or a script (syphon.md, syphon.py), not a key
            continue
        assert key in known, f"{name} mentions {key}"


def test_the_example_config_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_sb.config.service_bus import load_config

    monkeypatch.setenv(
        "SB_PRIMARY_CONNECTION_STRING",
        "Endpoint=sb://a.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=s",
    )
    monkeypatch.setenv(
        "SB_SECONDARY_CONNECTION_STRING",
        "Endpoint=sb://b.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=s",
    )
    config = load_config(str(ROOT / "conf/example.yaml"))
    assert (config.provision_tries, config.provision_retry_pause) == (3, 30.0)


@pytest.mark.parametrize("name", sorted(n for n in USER_DOCS if n.startswith("notebooks/")))
def test_notebooks_install_the_wheel_from_a_path_then_restart_python(name: str) -> None:
    text = USER_DOCS[name]
    assert text.startswith("# Databricks notebook source\n")
    cells = text.split("# COMMAND ----------")
    pip_cells = [i for i, cell in enumerate(cells) if "%pip install" in cell]
    assert pip_cells, f"{name} has no install cell"
    i = pip_cells[0]
    assert cells[i].strip() == "# MAGIC %pip install $wheel"  # the path in the `wheel` widget
    assert 'dbutils.widgets.text("wheel"' in "".join(cells[:i])
    assert "dbutils.library.restartPython()" in cells[i + 1]
    assert "spark_sb" not in "".join(cells[: i + 1]).replace(
        "spark_servicebus", ""
    )  # imported after the restart
    assert "pip install spark-servicebus" not in text  # no index has it
