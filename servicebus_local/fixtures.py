"""Pytest fixtures for the local Service Bus namespace (a pytest plugin: ``pytest_plugins = ["servicebus_local.fixtures"]``).

* ``local_namespace`` - one started :class:`~servicebus_local.server.LocalNamespace` named ``local`` with queues
  ``q1`` and ``q2`` and topic ``t1`` (subscriptions ``s1``, ``s2``), on a free port; stopped after the test.
* ``namespace_pair`` - a :class:`NamespacePair` of two started namespaces ``primary`` and ``secondary`` (no
  entities: tests or the code under test provision them), free ports, stopped after the test.

* ``local_namespace_tier`` - the tier both are started with: ``"standard"``; override the fixture (in a test
  module or a conftest: ``@pytest.fixture`` ``def local_namespace_tier(): return "premium"``) or parametrize it
  (``@pytest.mark.parametrize("local_namespace_tier", ["premium"])``) for Premium namespaces.

Both are function-scoped and start in a few milliseconds (no certificate is made until the admin endpoint is
first used). They run in the test process; the SDK reaches them over real TCP on 127.0.0.1.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from servicebus_local.server import LocalNamespace

__all__ = ["NamespacePair", "local_namespace", "local_namespace_tier", "namespace_pair"]


@dataclass(frozen=True)
class NamespacePair:
    """The primary and secondary namespaces of a paired-namespace test."""

    primary: LocalNamespace
    secondary: LocalNamespace


@pytest.fixture
def local_namespace_tier() -> str:
    """The tier of ``local_namespace`` and ``namespace_pair``: ``standard`` unless a test overrides it."""
    return "standard"


@pytest.fixture
def local_namespace(local_namespace_tier: str) -> Iterator[LocalNamespace]:
    ns = LocalNamespace(
        "local", queues=["q1", "q2"], topics={"t1": ["s1", "s2"]}, tier=local_namespace_tier
    ).start()
    try:
        yield ns
    finally:
        ns.stop()


@pytest.fixture
def namespace_pair(local_namespace_tier: str) -> Iterator[NamespacePair]:
    primary = LocalNamespace("primary", tier=local_namespace_tier).start()
    try:
        secondary = LocalNamespace("secondary", tier=local_namespace_tier).start()
    except BaseException:
        primary.stop()
        raise
    try:
        yield NamespacePair(primary, secondary)
    finally:
        secondary.stop()
        primary.stop()
