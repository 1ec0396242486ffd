"""Fixtures of the Spark tier's files (the session-scoped ``spark`` and the namespace fixtures are in
``tests/conftest.py`` and the servicebus-local plugin)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from servicebus_local.tls import TLS_DIR_ENV, LocalTls
from spark_sb import register


def _trust_local_namespaces() -> None:
    """A ``servicebus`` read's planner process (started by the session's JVM, whose environment it inherits) asks
    the local namespaces' admin endpoints for counts: every namespace of this process shares one CA
    (``SPARK_SB_LOCAL_TLS_DIR``), and ``REQUESTS_CA_BUNDLE`` trusts it beside the public roots (certifi), both set
    here, before the JVM starts."""
    import certifi

    tls_dir = os.environ.setdefault(TLS_DIR_ENV, tempfile.mkdtemp(prefix="spark-sb-tls-"))
    ca = Path(LocalTls.create(tls_dir).ca_file)
    bundle = Path(tls_dir) / "bundle.pem"
    if not bundle.exists():
        bundle.write_bytes(Path(certifi.where()).read_bytes() + b"\n" + ca.read_bytes())
    os.environ.setdefault("REQUESTS_CA_BUNDLE", str(bundle))


_trust_local_namespaces()


@pytest.fixture
def registered(spark: Any) -> None:
    """The ``servicebus`` data source registered on the test session (twice: registering is idempotent). The data
    source files use it for every test (``pytest.mark.usefixtures("registered")``)."""
    register(spark)
    register(spark)
