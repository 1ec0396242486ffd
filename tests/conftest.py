"""Shared fixtures: the session-scoped SparkSession (local[2], Delta) and the local namespace fixtures."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

# The local Service Bus namespace fixtures (namespace_pair, local_namespace) come from the servicebus-local
# distribution's pytest plugin (its `pytest11` entry point), so that anyone's tests can use them.


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One SparkSession for the whole run: local[2], UI off, 2 shuffle partitions, Delta enabled."""
    from spark_sb.session import build_spark_session

    warehouse = tempfile.mkdtemp(prefix="spark-sb-warehouse-")
    session = build_spark_session(
        "spark-servicebus-tests",
        "local[2]",
        {
            "spark.sql.warehouse.dir": warehouse,
            "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        },
    )
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
