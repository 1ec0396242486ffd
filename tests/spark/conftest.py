"""Fixtures of the Spark tier's files (the session-scoped ``spark`` and the namespace fixtures are in
``tests/conftest.py`` and the servicebus-local plugin)."""

from __future__ import annotations

from typing import Any

import pytest

from spark_sb import register


@pytest.fixture
def registered(spark: Any) -> None:
    """The ``servicebus`` data source registered on the test session (twice: registering is idempotent). The data
    source files use it for every test (``pytest.mark.usefixtures("registered")``)."""
    register(spark)
    register(spark)
