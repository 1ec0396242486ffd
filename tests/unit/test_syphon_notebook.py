"""The syphon notebook offers ``Trigger.AvailableNow`` (what serverless compute accepts) as its default run."""

from __future__ import annotations

import re
from pathlib import Path

from tests.unit.test_notebooks import cells

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "syphon.py"


def test_available_now_is_the_default_run_and_reaches_run_syphon() -> None:
    sources = "\n".join(source for kind, source in cells(NOTEBOOK) if kind == "python")
    widget = re.search(r'dbutils\.widgets\.dropdown\("run", "([^"]+)", \[([^\]]*)\]\)', sources)
    assert widget is not None, "a `run` dropdown widget"
    assert widget.group(1) == "available now"
    assert {c.strip().strip('"') for c in widget.group(2).split(",")} == {"available now", "continuous"}
    assert 'available_now = dbutils.widgets.get("run") == "available now"' in sources
    call = sources[sources.index("run_syphon(") :]
    assert "available_now=available_now" in call[: call.index("\n)")]
    assert "query.awaitTermination()" in sources  # the notebook (a job's task) ends when the query does
