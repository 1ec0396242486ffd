"""The local namespace's connection quota (SPEC E7, ``--max-connections``): the connection after the N-th open
one is answered and closed with ``amqp:resource-limit-exceeded``, as the service does; ``/status`` shows the
connections open now and the most open at once. Driven with the unmodified SDK over real TCP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from enum import Enum
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode, ServiceBusSender
from azure.servicebus.exceptions import ServiceBusConnectionError

from servicebus_local.__main__ import build_parser
from servicebus_local.counters import OperationCounters
from servicebus_local.server import DEFAULT_MAX_CONNECTIONS, LocalNamespace

from .conftest import wait_for

QUOTA_CONDITION = "amqp:resource-limit-exceeded"


@contextmanager
def open_sender(conn_str: str, queue: str = "q") -> Iterator[ServiceBusSender]:
    """A sender on a client of its own (so one AMQP connection), its connection opened by a send."""
    with (
        ServiceBusClient.from_connection_string(conn_str, retry_total=0) as client,
        client.get_queue_sender(queue) as sender,
    ):
        sender.send_messages(ServiceBusMessage("hello"))
        yield sender


def amqp_condition(exc: BaseException) -> str | None:
    """The AMQP error condition the SDK's exception carries (from the pyamqp error it wraps)."""
    inner = getattr(exc, "inner_exception", None)
    condition = getattr(inner, "condition", None)
    if isinstance(condition, Enum):
        condition = condition.value
    if isinstance(condition, bytes):
        condition = condition.decode()
    return None if condition is None else str(condition)


def assert_refused_for_the_quota(conn_str: str, limit: int) -> None:
    """A new sender's first send fails: its connection is closed with the quota error."""
    with pytest.raises(ServiceBusConnectionError) as refused, open_sender(conn_str):
        pass
    assert amqp_condition(refused.value) == QUOTA_CONDITION
    text = str(refused.value)
    assert "ConnectionsQuotaExceeded" in text and f"quota of {limit}" in text
    assert QUOTA_CONDITION in text


def http(url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    with urllib.request.urlopen(request, timeout=5) as reply:
        doc = json.loads(reply.read())
    assert isinstance(doc, dict)
    return doc


def active_messages(ns: LocalNamespace, queue: str = "q") -> int:
    with (
        ServiceBusClient.from_connection_string(ns.connection_string, retry_total=0) as client,
        client.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.PEEK_LOCK) as receiver,
    ):
        return len(receiver.peek_messages(max_message_count=100))


# ------------------------------------------------------------------------------------------------------------
# in-process


def test_connections_beyond_the_quota_are_refused_with_resource_limit_exceeded() -> None:
    with LocalNamespace("quota", queues=["q"], max_connections=3, control_port=0) as ns, ExitStack() as held:
        for _ in range(3):
            held.enter_context(open_sender(ns.connection_string))
        assert ns.counters()["connections_open"] == 3

        assert_refused_for_the_quota(ns.connection_string, 3)
        # the refused connection's socket ends once the client has closed its end (well before the grace)
        wait_for(lambda: ns.connection_count == 3, timeout=2.0)
        counters = ns.counters()
        assert counters["connections_refused"] == 1
        assert counters["connections_open"] == 3 and counters["connections_peak"] == 3

        status = http(f"{ns.control_url}/status")
        assert status["max_connections"] == 3
        assert status["counters"]["connections_open"] == 3
        assert status["counters"]["connections_peak"] == 3
        assert status["counters"]["connections_refused"] == 1
        held.close()  # the three senders and their clients
        wait_for(lambda: ns.counters()["connections_open"] == 0)
        # only the three admitted connections sent anything (peeking opens a connection of its own)
        assert active_messages(ns) == 3


def test_closing_a_connection_frees_its_place_under_the_quota() -> None:
    with LocalNamespace("quota", queues=["q"], max_connections=3) as ns, ExitStack() as held:
        first = ExitStack()
        first.enter_context(open_sender(ns.connection_string))
        held.enter_context(first)
        for _ in range(2):
            held.enter_context(open_sender(ns.connection_string))
        assert_refused_for_the_quota(ns.connection_string, 3)

        first.close()
        wait_for(lambda: ns.counters()["connections_open"] == 2)
        with open_sender(ns.connection_string) as sender:  # the freed place is taken again
            sender.send_messages(ServiceBusMessage("again"))
            assert ns.counters()["connections_open"] == 3
            assert_refused_for_the_quota(ns.connection_string, 3)
        counters = ns.counters()
        assert counters["connections_refused"] == 2
        assert counters["connections_peak"] == 3


def test_status_reports_open_and_peak_and_a_reset_restarts_the_peak_from_the_open_count() -> None:
    with LocalNamespace("gauges", queues=["q"], control_port=0) as ns:
        url = ns.control_url
        assert url is not None
        counters = http(f"{url}/status")["counters"]
        assert (counters["connections_open"], counters["connections_peak"]) == (0, 0)
        with ExitStack() as held:
            for _ in range(3):
                held.enter_context(open_sender(ns.connection_string))
            counters = http(f"{url}/status")["counters"]
            assert (counters["connections_open"], counters["connections_peak"]) == (3, 3)
            held.close()
            wait_for(lambda: http(f"{url}/status")["counters"]["connections_open"] == 0)
        assert http(f"{url}/status")["counters"]["connections_peak"] == 3  # the peak stays after the closes
        with open_sender(ns.connection_string):
            assert http(f"{url}/counters/reset", {}) == {"ok": True}
            counters = http(f"{url}/status")["counters"]
            assert (counters["connections_open"], counters["connections_peak"]) == (1, 1)
        wait_for(lambda: ns.counters()["connections_open"] == 0)
        ns.reset_counters()
        assert ns.counters()["connections_peak"] == 0
        assert http(f"{url}/status")["max_connections"] == DEFAULT_MAX_CONNECTIONS


def test_the_admin_clients_https_connections_do_not_count_against_the_quota() -> None:
    with (
        LocalNamespace("adminquota", queues=["q"], max_connections=1) as ns,
        open_sender(ns.connection_string),
    ):
        with ns.admin_client() as admin:  # HTTPS on the same port while the one AMQP place is taken
            assert admin.get_queue_runtime_properties("q").active_message_count == 1
        counters = ns.counters()
        assert counters["admin_connections_opened"] >= 1
        assert counters["connections_open"] == 1 and counters["connections_refused"] == 0


def test_max_connections_must_be_positive_and_defaults_to_the_services_quota() -> None:
    assert DEFAULT_MAX_CONNECTIONS == 5000
    assert LocalNamespace("default").max_connections == 5000
    with pytest.raises(ValueError, match="max_connections"):
        LocalNamespace("none", max_connections=0)


def test_operation_counters_gauges() -> None:
    counters = OperationCounters()
    assert [counters.admit_connection(2) for _ in range(3)] == [True, True, False]
    snap = counters.snapshot()
    assert (snap["connections_open"], snap["connections_peak"], snap["connections_refused"]) == (2, 2, 1)
    counters.release_connection()
    counters.release_connection()
    counters.release_connection()  # more releases than admissions never go below 0
    assert counters.snapshot()["connections_open"] == 0
    assert counters.snapshot()["connections_peak"] == 2
    counters.reset()
    snap = counters.snapshot()
    assert (snap["connections_open"], snap["connections_peak"], snap["connections_refused"]) == (0, 0, 0)


# ------------------------------------------------------------------------------------------------------------
# command line


def test_cli_parses_max_connections() -> None:
    parser = build_parser()
    assert parser.parse_args([]).max_connections == DEFAULT_MAX_CONNECTIONS
    assert parser.parse_args(["--max-connections", "7"]).max_connections == 7
    for bad in ("0", "-1", "many"):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(["--max-connections", bad])
        assert exit_info.value.code == 2


def test_cli_max_connections_refuses_the_connection_beyond_the_quota() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "servicebus_local",
            "--name",
            "cliquota",
            "--port",
            "0",
            "--control-port",
            "0",
            "--queue",
            "q",
            "--max-connections",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    try:
        assert proc.stdout is not None
        conn_str = proc.stdout.readline().strip().split("=", 1)[1]
        control_url = proc.stdout.readline().strip().split("=", 1)[1]
        assert control_url.startswith("http://127.0.0.1:")
        with ExitStack() as held:
            for _ in range(2):
                held.enter_context(open_sender(conn_str))
            assert_refused_for_the_quota(conn_str, 2)
            status = http(f"{control_url}/status")
            assert status["max_connections"] == 2
            assert status["counters"]["connections_open"] == 2
            assert status["counters"]["connections_peak"] == 2
            assert status["counters"]["connections_refused"] == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
