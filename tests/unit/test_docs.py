"""The documentation site (mkdocs.yml, docs/) says true things that cannot drift: the configuration reference is
what docs/gen_config_reference.py makes of the configuration model (every key, its default, its unit), the API
reference covers the public API, every page is in the nav, the examples the pages include exist, the README's copy
of an example is the example, and the oldest pyspark the docs name is the one CI runs (constraints-oldest.txt)."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

import spark_sb
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.config.settings import KNOWN_KEYS, SETTINGS, Setting, parse_int

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = {p.relative_to(DOCS).as_posix(): p.read_text() for p in DOCS.rglob("*.md")}
SNIPPET = re.compile(r'^\s*--8<--\s+"(?P<path>[^"]+)"\s*$', re.M)


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_config_reference", DOCS / "gen_config_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


GEN = _generator()


def _table_rows(page: str) -> dict[str, list[str]]:
    """Key -> its row's cells (key, value, default, unit, what) from the page's tables."""
    found = {}
    for line in page.splitlines():
        m = re.match(r"^\| `([^`]+)` \|(.*)\|$", line)
        if m:
            found[m.group(1)] = [m.group(1), *(c.strip() for c in re.split(r"(?<!\\)\|", m.group(2)))]
    return found


def test_the_configuration_reference_is_the_generators_output() -> None:
    assert PAGES["configuration.md"] == GEN.render(), (
        "docs/configuration.md differs from the configuration model: run `make docs` and commit the page"
    )


def test_the_configuration_reference_lists_every_key_with_its_default_and_unit() -> None:
    rows = _table_rows(PAGES["configuration.md"])
    assert set(rows) == set(KNOWN_KEYS)
    for key, (_, kind, default, unit, _what) in rows.items():
        assert default, key
        if kind.startswith(("integer", "number", "duration")):
            assert unit != "-", f"{key} is a number without a unit"
    # the defaults are the dataclass's, in the unit the page names
    assert rows["failover_interval"][2:4] == ["`60` (1 minute)", "seconds"]
    assert rows["state_retention"][2:4] == ["`2592000` (30 days)", "seconds"]
    assert rows["max_message_size"][2:4] == [f"`{ServiceBusConfig.max_message_size}`", "bytes"]
    assert rows["retry.backoff_factor"][2:4] == ["`0.8`", "seconds"]
    assert rows["syphon.max_attempts"][1:4] == ["integer >= 1", "`10`", "deliveries"]
    assert rows["ordering"][1] == "one of `none`, `session`, `entity`"
    assert rows["state_location"][2] == "(none)"
    assert rows["client_cache"][1:3] == ["boolean", "`true`"]


def test_a_default_changed_in_the_model_changes_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    fields = {f.name: f for f in dataclasses.fields(ServiceBusConfig)}
    monkeypatch.setattr(fields["send_timeout"], "default", 45.0)
    assert "| `send_timeout` | duration > 0 | `45` | seconds |" in GEN.render()


def test_a_number_the_model_gives_no_unit_is_an_error_not_a_blank_cell() -> None:
    def check(v: Any, key: str, _: Any) -> None:
        pass

    new = Setting("widgets", "backlog_queue_count", parse_int, check)  # an integer without a unit
    with pytest.raises(ValueError, match="widgets: a number without a unit"):
        GEN.rows(known_keys=[*KNOWN_KEYS, "widgets"], settings_rows=[*SETTINGS, new])


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(30.0, "`30`"), (60.0, "`60` (1 minute)"), (300.0, "`300` (5 minutes)"), (86400.0, "`86400` (1 day)")],
)
def test_durations_are_seconds_with_their_size_in_words(seconds: float, text: str) -> None:
    assert GEN.duration_text(seconds) == text


def test_the_api_reference_covers_every_public_name() -> None:
    page = PAGES["api.md"]
    entries = set(re.findall(r"^::: (\S+)$", page, re.M))
    for name in spark_sb.__all__:
        module = spark_sb._EXPORTS[name]
        assert f"{module}.{name}" in entries, f"docs/api.md has no entry for spark_sb.{name} ({module})"


def _nav_files(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node] if node.endswith(".md") else []
    if isinstance(node, list):
        return [f for item in node for f in _nav_files(item)]
    if isinstance(node, dict):
        return [f for value in node.values() for f in _nav_files(value)]
    return []


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_files(config["nav"])
    assert sorted(nav) == sorted(PAGES)
    assert config["theme"]["name"] == "material"
    assert any("mkdocstrings" in (p if isinstance(p, str) else next(iter(p))) for p in config["plugins"])


def test_the_examples_the_pages_include_exist_and_each_is_included() -> None:
    included = {m.group("path") for text in PAGES.values() for m in SNIPPET.finditer(text)}
    assert included, "no page includes an example"
    for path in included:
        assert path.startswith("examples/") and (ROOT / path).is_file(), path
    examples = {p.relative_to(ROOT).as_posix() for p in (ROOT / "examples").glob("*.py")}
    assert examples <= included | {"examples/orders_to_servicebus.py"}, examples - included
    for path in examples:  # each says what it is on its first line, under its own name (the tests read it)
        assert (ROOT / path).read_text().startswith(f"# {path}: "), path


def test_the_readmes_example_is_the_example_file() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```$", readme, re.M | re.S)
    named = [b for b in blocks if b.startswith("# examples/orders_to_servicebus.py: ")]
    assert named, "README.md no longer shows examples/orders_to_servicebus.py"
    assert named[0] == (ROOT / "examples/orders_to_servicebus.py").read_text()


def test_the_oldest_pyspark_the_docs_name_is_the_one_ci_runs() -> None:
    (oldest,) = re.findall(r"^pyspark==(\S+)$", (ROOT / "constraints-oldest.txt").read_text(), re.M)
    texts = {
        "README.md": (ROOT / "README.md").read_text(),
        "CHANGELOG.md": (ROOT / "CHANGELOG.md").read_text(),
    }
    texts |= {f"docs/{k}": v for k, v in PAGES.items()}
    ranges = [
        (name, low) for name, text in texts.items() for low in re.findall(r"(\d+\.\d+\.\d+) to 4\.2\.0", text)
    ]
    assert ranges, "no page says which pyspark versions were tried"
    wrong = [(name, low) for name, low in ranges if low != oldest]
    assert not wrong, f"constraints-oldest.txt has pyspark {oldest}; the docs say {wrong}"
    installing = PAGES["installing.md"]
    assert f"| oldest | {oldest} |" in installing
