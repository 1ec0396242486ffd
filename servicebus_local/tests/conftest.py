"""Helpers for the local-namespace tests: SDK clients against a namespace, entity creation with settings. Every
test here is of the ``local`` tier (marked by directory, below)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient

from servicebus_local.server import LocalNamespace

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.resolve().parents:
            item.add_marker("local")


@pytest.fixture
def ns() -> Iterator[LocalNamespace]:
    """A fresh namespace with queue ``q`` and topic ``t`` (subscriptions ``a``, ``b``)."""
    namespace = LocalNamespace("testns", queues=["q"], topics={"t": ["a", "b"]}).start()
    try:
        yield namespace
    finally:
        namespace.stop()


@pytest.fixture
def client(ns: LocalNamespace) -> Iterator[ServiceBusClient]:
    with ServiceBusClient.from_connection_string(ns.connection_string, retry_total=0) as c:
        yield c


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll until ``predicate()`` (real time), fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m servicebus_local --port 0 <args>`` in a child process, its output captured (60 s at most)."""
    return subprocess.run(
        [sys.executable, "-m", "servicebus_local", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
