"""Fixtures of the Spark tier's files (the session-scoped ``spark`` and the namespace fixtures are in
``tests/conftest.py`` and the servicebus-local plugin)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from servicebus_local.model import QueueSettings
from servicebus_local.tls import TLS_DIR_ENV, LocalTls
from spark_sb import register

from .streams import BACKLOG


def _trust_local_namespaces() -> None:
    """A ``servicebus`` read's planner process (started by the session's JVM, whose environment it inherits) asks
    the local namespaces' admin endpoints for counts: every namespace of this process shares one CA
    (``SPARK_SB_LOCAL_TLS_DIR``), and ``REQUESTS_CA_BUNDLE`` trusts it beside the public roots (certifi), both set
    here, before the JVM starts."""
    import certifi

    tls_dir = os.environ.setdefault(TLS_DIR_ENV, tempfile.mkdtemp(prefix="spark-sb-tls-"))
    ca = Path(LocalTls.create(tls_dir).ca_file)
    bundle = Path(tls_dir) / "bundle.pem"
    # a machine's own roots bundle (REQUESTS_CA_BUNDLE already set) stays trusted, else certifi's
    roots = os.environ.get("REQUESTS_CA_BUNDLE") or certifi.where()
    if not bundle.exists():
        bundle.write_bytes(Path(roots).read_bytes() + b"\n" + ca.read_bytes())
    os.environ["REQUESTS_CA_BUNDLE"] = str(bundle)


_trust_local_namespaces()


@pytest.fixture
def registered(spark: Any) -> None:
    """The ``servicebus`` data source registered on the test session (twice: registering is idempotent). The data
    source files use it for every test (``pytest.mark.usefixtures("registered")``)."""
    register(spark)
    register(spark)


@pytest.fixture
def backlog_pair(namespace_pair: Any) -> Any:
    """The syphon job tests' namespace pair: ``orders`` on the primary (duplicate detection on) and the two
    :data:`~tests.spark.streams.BACKLOG` queues on the secondary."""
    namespace_pair.primary.broker.create_queue("orders", QueueSettings(requires_duplicate_detection=True))
    for name in BACKLOG:
        namespace_pair.secondary.broker.create_queue(name)
    return namespace_pair
