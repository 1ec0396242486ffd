"""Fault injection (SPEC E4) seen through the unmodified SDK, the control API, and the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.exceptions import (
    MessageSizeExceededError,
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusAuthorizationError,
    ServiceBusConnectionError,
    ServiceBusError,
    ServiceBusQuotaExceededError,
    ServiceBusServerBusyError,
)

from servicebus_local.server import LocalNamespace

from .conftest import wait_for


def send_one(conn_str: str, entity: str = "q", body: str = "x", **client_kw: Any) -> None:
    with ServiceBusClient.from_connection_string(conn_str, **client_kw) as c, c.get_queue_sender(entity) as s:
        s.send_messages(ServiceBusMessage(body))


def test_refused_connections_raise_connection_error_then_recover(ns: LocalNamespace) -> None:
    ns.faults.refuse_connections()
    started = time.monotonic()
    with pytest.raises(ServiceBusConnectionError):
        send_one(ns.connection_string, retry_total=0)
    assert time.monotonic() - started < 10
    ns.faults.accept_connections()
    send_one(ns.connection_string, retry_total=0)
    assert ns.broker.get_queue("q").runtime.active_message_count == 1


def test_stall_makes_the_sdk_time_out_then_heals(ns: LocalNamespace) -> None:
    """A new connection during a stall: SASL is answered, then silence; the SDK times out on the link open
    (it needs ``try_timeout``: without it, it waits for the link forever)."""
    ns.faults.stall(True)
    started = time.monotonic()
    with (
        pytest.raises(OperationTimeoutError),
        ServiceBusClient.from_connection_string(ns.connection_string, retry_total=0, try_timeout=1.5) as c,
        c.get_queue_sender("q") as s,
    ):
        s.send_messages(ServiceBusMessage("x"), timeout=2)
    assert time.monotonic() - started < 10
    assert ns.broker.get_queue("q").runtime.active_message_count == 0
    ns.faults.stall(False)
    send_one(ns.connection_string, retry_total=0)
    assert ns.broker.get_queue("q").runtime.active_message_count == 1


def test_stall_on_an_open_connection(ns: LocalNamespace, client: ServiceBusClient) -> None:
    with client.get_queue_sender("q") as s:
        s.send_messages(ServiceBusMessage("before"))
        ns.faults.stall(True)
        with pytest.raises((OperationTimeoutError, ServiceBusError)):
            s.send_messages(ServiceBusMessage("during"), timeout=1.5)
        ns.faults.stall(False)


@pytest.mark.parametrize(
    ("condition", "exc_type"),
    [
        ("com.microsoft:server-busy", ServiceBusServerBusyError),
        ("com.microsoft:entity-disabled", MessagingEntityDisabledError),
        ("amqp:not-found", MessagingEntityNotFoundError),
        ("amqp:resource-limit-exceeded", ServiceBusQuotaExceededError),
        ("com.microsoft:timeout", OperationTimeoutError),
        ("amqp:unauthorized-access", ServiceBusAuthorizationError),
        ("amqp:link:message-size-exceeded", MessageSizeExceededError),
    ],
)
def test_send_error_conditions_map_to_sdk_exceptions(
    ns: LocalNamespace, client: ServiceBusClient, condition: str, exc_type: type[Exception]
) -> None:
    ns.faults.fail_sends("q", condition, "injected", count=1)
    with client.get_queue_sender("q") as s:
        with pytest.raises(exc_type):
            s.send_messages(ServiceBusMessage("x"))
        s.send_messages(ServiceBusMessage("y"))  # count=1: the next send goes through
    assert ns.broker.get_queue("q").runtime.active_message_count == 1


def test_send_fault_forever_until_cleared_and_only_that_entity(
    ns: LocalNamespace, client: ServiceBusClient
) -> None:
    ns.broker.create_queue("other")
    ns.faults.fail_sends("Q", "com.microsoft:entity-disabled")
    with client.get_queue_sender("q") as s:
        for _ in range(3):
            with pytest.raises(MessagingEntityDisabledError):
                s.send_messages(ServiceBusMessage("x"))
    with client.get_queue_sender("other") as s:
        s.send_messages(ServiceBusMessage("fine"))
    ns.faults.clear()
    send_one(ns.connection_string)
    assert ns.broker.get_queue("q").runtime.active_message_count == 1


def test_stall_entity_never_settles_then_heals(ns: LocalNamespace, client: ServiceBusClient) -> None:
    ns.faults.stall_entity("q", True)
    with client.get_queue_sender("q") as s:
        with pytest.raises(OperationTimeoutError):
            s.send_messages(ServiceBusMessage("held"), timeout=1.5)
        assert ns.broker.get_queue("q").runtime.active_message_count == 0
        ns.faults.stall_entity("q", False)
        wait_for(lambda: ns.broker.get_queue("q").runtime.active_message_count == 1)


def test_latency_is_added_to_each_round_trip(ns: LocalNamespace, client: ServiceBusClient) -> None:
    with client.get_queue_sender("q") as s:
        s.send_messages(ServiceBusMessage("warm-up"))
        t0 = time.monotonic()
        for _ in range(5):
            s.send_messages(ServiceBusMessage("x"))
        base = (time.monotonic() - t0) / 5
        ns.faults.set_latency(0.1)
        t0 = time.monotonic()
        for _ in range(5):
            s.send_messages(ServiceBusMessage("x"))
        slow = (time.monotonic() - t0) / 5
        ns.faults.set_latency(0)
    assert slow - base >= 0.09, (base, slow)
    assert slow < 1.0


def test_drop_connections_sdk_recovers_on_next_call(ns: LocalNamespace) -> None:
    with ServiceBusClient.from_connection_string(ns.connection_string) as c, c.get_queue_sender("q") as s:
        s.send_messages(ServiceBusMessage("1"))
        assert ns.connection_count >= 1
        ns.faults.drop_connections()
        assert ns.connection_count == 0
        try:
            s.send_messages(ServiceBusMessage("2"))
        except ServiceBusError:
            s.send_messages(ServiceBusMessage("2"))  # the SDK may surface the drop once, then reconnects
    got: list[str] = []
    with (
        ServiceBusClient.from_connection_string(ns.connection_string) as c,
        c.get_queue_receiver("q", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as r,
    ):
        deadline = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < deadline:
            got += [str(m) for m in r.receive_messages(max_message_count=5, max_wait_time=1)]
    assert "1" in got and "2" in got


def _post(url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def test_control_api_drives_faults_over_http() -> None:
    with LocalNamespace("ctl", queues=["q"], topics={"t": ["s"]}, control_port=0) as ns:
        url = ns.control_url
        assert url is not None
        assert _post(
            f"{url}/faults/send-error", {"entity": "q", "condition": "com.microsoft:server-busy"}
        ) == {"ok": True}
        with pytest.raises(ServiceBusServerBusyError):
            send_one(ns.connection_string, retry_total=0)
        _post(f"{url}/faults/clear")
        send_one(ns.connection_string, retry_total=0)
        status = _get(f"{url}/status")
        assert status["queues"]["q"]["active"] == 1
        assert status["topics"]["t"]["subscriptions"]["s"]["active"] == 0
        assert "key" not in json.dumps(status).lower().replace("key_name", "")
        _post(f"{url}/faults/refuse")
        with pytest.raises(ServiceBusConnectionError):
            send_one(ns.connection_string, retry_total=0)
        _post(f"{url}/faults/accept")
        _post(f"{url}/faults/latency", {"seconds": 0.001})
        assert _get(f"{url}/status")["faults"]["latency"] == 0.001
        _post(f"{url}/faults/drop")
        with pytest.raises(urllib.error.HTTPError) as err:
            _post(f"{url}/faults/nope")
        assert err.value.code == 404


def test_cli_prints_connection_string_and_exits_cleanly_on_sigterm(tmp_path: Path) -> None:
    topology = tmp_path / "topo.yaml"
    topology.write_text("queues:\n  - name: fromfile\n    max_delivery_count: 3\n")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "servicebus_local",
            "--name",
            "cli",
            "--port",
            "0",
            "--control-port",
            "0",
            "--queue",
            "q",
            "--topic",
            "t:a,b",
            "--topology",
            str(topology),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().strip()
        second = proc.stdout.readline().strip()
        assert first.startswith("connection_string=Endpoint=sb://127.0.0.1:")
        assert second.startswith("control_url=http://127.0.0.1:")
        conn_str = first.split("=", 1)[1]
        send_one(conn_str, entity="fromfile", retry_total=0)
        status = _get(second.split("=", 1)[1] + "/status")
        assert status["queues"]["fromfile"]["active"] == 1
        assert set(status["topics"]["t"]["subscriptions"]) == {"a", "b"}
        third = proc.stdout.readline().strip()
        assert third.startswith("ca_file=")
        from azure.servicebus.management import ServiceBusAdministrationClient

        with ServiceBusAdministrationClient.from_connection_string(
            conn_str, connection_verify=third.split("=", 1)[1]
        ) as admin:  # the unmodified admin client, from outside the namespace's process
            assert admin.get_queue_runtime_properties("fromfile").active_message_count == 1
            assert admin.get_namespace_properties().name == "cli"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_namespace_starts_fast() -> None:
    t0 = time.monotonic()
    ns = LocalNamespace("fast", queues=["q"]).start()
    elapsed = time.monotonic() - t0
    ns.stop()
    assert elapsed < 0.5


def test_admin_faults_are_exposed_to_the_admin_endpoint(ns: LocalNamespace) -> None:
    ns.faults.fail_admin("GET", "/q", 503, count=1, code="ServerBusy", detail="busy")
    fault = ns.broker.admin_fault("GET", "/q?api-version=2021-05")
    assert fault is not None and fault.status == 503
    assert ns.broker.admin_fault("GET", "/q") is None


def test_peek_lock_receive_under_latency(ns: LocalNamespace, client: ServiceBusClient) -> None:
    ns.faults.set_latency(0.01)
    with client.get_queue_sender("q") as s:
        s.send_messages([ServiceBusMessage(str(i)) for i in range(20)])
    with client.get_queue_receiver("q", max_wait_time=2) as r:
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 20 and time.monotonic() < deadline:
            for m in r.receive_messages(max_message_count=20, max_wait_time=1):
                r.complete_message(m)
                got.append(str(m))
    assert sorted(got, key=int) == [str(i) for i in range(20)]
    assert ns.broker.get_queue("q").runtime.active_message_count == 0


def test_send_faults_apply_to_schedule_message_too(ns: LocalNamespace, client: ServiceBusClient) -> None:
    """A failover probe that schedules (and cancels) a message sees the same faults as a send."""
    from datetime import datetime, timezone

    far = datetime.now(timezone.utc) + timedelta(days=365)
    ns.faults.fail_sends("q", "com.microsoft:entity-disabled", count=1)
    with client.get_queue_sender("q") as s:
        with pytest.raises(MessagingEntityDisabledError):
            s.schedule_messages(ServiceBusMessage("probe"), far)
        (seq,) = s.schedule_messages(ServiceBusMessage("probe"), far)
        s.cancel_scheduled_messages(seq)
        ns.faults.stall_entity("q", True)
        with pytest.raises(OperationTimeoutError):
            s.schedule_messages(ServiceBusMessage("probe"), far, timeout=1.5)
        ns.faults.stall_entity("q", False)
    assert ns.broker.get_queue("q").runtime.scheduled_message_count == 0


def test_cli_namespaces_share_one_ca_with_tls_dir(tmp_path: Path) -> None:
    """Two namespaces started as separate processes with one --tls-dir: one REQUESTS_CA_BUNDLE trusts both."""
    from azure.servicebus.management import ServiceBusAdministrationClient

    tls_dir = tmp_path / "tls"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "servicebus_local",
                "--name",
                name,
                "--port",
                "0",
                "--tls-dir",
                str(tls_dir),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        for name in ("first", "second")
    ]
    try:
        lines = []
        for proc in procs:
            assert proc.stdout is not None
            conn = proc.stdout.readline().strip().split("=", 1)[1]
            ca = proc.stdout.readline().strip().split("=", 1)[1]
            lines.append((conn, ca))
        assert Path(lines[0][1]).read_bytes() == Path(lines[1][1]).read_bytes()  # the same CA
        bundle = str(tls_dir / "ca.pem")
        for (conn, _), name in zip(lines, ("first", "second"), strict=True):
            with ServiceBusAdministrationClient.from_connection_string(
                conn, connection_verify=bundle
            ) as admin:
                assert admin.get_namespace_properties().name == name
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=15) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_cli_with_tls_dir_prints_the_shared_ca_file_which_outlives_the_namespace(tmp_path: Path) -> None:
    """With --tls-dir the ca_file printed is <dir>/ca.pem - absolute, '~' expanded, kept after the stop - not a
    copy in the namespace's own temporary folder (deleted at its stop), so the path printed is the one to export
    as REQUESTS_CA_BUNDLE for every namespace started with that directory."""
    home = tmp_path / "home"
    proc = subprocess.Popen(
        [sys.executable, "-m", "servicebus_local", "--name", "primary", "--port", "0", "--tls-dir=~/tls"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "HOME": str(home)},
    )
    try:
        assert proc.stdout is not None
        printed = dict(proc.stdout.readline().strip().split("=", 1) for _ in range(2))
        assert printed["ca_file"] == str(home / "tls" / "ca.pem")
        assert b"BEGIN CERTIFICATE" in Path(printed["ca_file"]).read_bytes()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert Path(printed["ca_file"]).is_file()  # still there for the next start with this directory
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_stops_quietly_when_its_parent_stopped_reading(tmp_path: Path) -> None:
    """A parent killed before the namespace stops (a bench cut short by ``timeout``) leaves the namespace's stdout
    a broken pipe: the stop is still clean - exit 0, no traceback on stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "servicebus_local", "--name", "primary", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        printed = [proc.stdout.readline() for _ in range(2)]  # connection_string=, ca_file=: it is serving
        assert printed[0].startswith("connection_string=") and printed[1].startswith("ca_file="), printed
        proc.stdout.close()  # the reader is gone: the "stopped" line meets a broken pipe
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        err = proc.stderr.read()
        assert "BrokenPipeError" not in err and "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def test_a_timed_send_fault_lasts_its_seconds_from_the_first_transfer_it_rejects() -> None:
    """A blip met by whoever sends first (issue 47's cluster scenario): set long before anyone sends, it starts
    with the first rejected transfer and ends ``seconds`` later, on the controller's clock."""
    from servicebus_local.faults import FaultController

    now = [100.0]
    faults = FaultController(monotonic=lambda: now[0])
    faults.fail_sends("Q", "com.microsoft:timeout", "a blip", seconds=4.0)
    now[0] += 60.0  # nobody sent for a minute: the blip has not started
    assert faults.send_fault("other") is None
    assert faults.send_fault("q") == ("com.microsoft:timeout", "a blip")  # starts now
    now[0] += 3.9
    assert faults.send_fault("q") is not None
    now[0] += 0.1
    assert faults.send_fault("q") is None and faults.send_fault("q") is None  # over, and gone
    with pytest.raises(ValueError, match="seconds"):
        faults.fail_sends("q", "com.microsoft:timeout", seconds=0)
