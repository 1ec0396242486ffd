"""Backlog-queue provisioning (SPEC B1) against two local namespaces: real SDK admin client, real TCP + TLS.

The secondary's admin client is either injected (``LocalNamespace.admin_client()``, which trusts the local CA)
or built from a YAML config with ``REQUESTS_CA_BUNDLE`` pointing at the local CA (what users do).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("servicebus_local.server")

from servicebus_local.clock import FakeClock  # noqa: E402
from spark_sb.admin.cli import main  # noqa: E402
from spark_sb.admin.provisioning import provision_backlog_queues
from spark_sb.admin.report import BACKLOG_QUEUE_SPEC, QueueStatus
from spark_sb.core.durations import MAX_DURATION
from spark_sb.core.errors import ProvisioningError
from spark_sb.message.backlog import backlog_queue_names  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def secondary_admin(namespace_pair: Any) -> Iterator[Any]:
    client = namespace_pair.secondary.admin_client()
    yield client
    client.close()


@pytest.fixture
def primary_name(namespace_pair: Any) -> str:
    with namespace_pair.primary.admin_client() as client:
        name = client.get_namespace_properties().name
    assert name
    return str(name)


def backlog_in(admin: Any, prefix: str) -> dict[str, Any]:
    return {q.name: q for q in admin.list_queues() if q.name.startswith(f"{prefix}/x-servicebus-transfer/")}


def provision(admin: Any, name: str, **kwargs: Any) -> Any:
    kwargs.setdefault("count", 3)
    kwargs.setdefault("clock", FakeClock())
    return provision_backlog_queues(admin_client=admin, primary_namespace_name=name, **kwargs)


def assert_spec_properties(q: Any) -> None:
    assert q.max_size_in_megabytes == 5120
    assert q.max_delivery_count == 2147483647
    assert q.default_message_time_to_live >= MAX_DURATION - timedelta(seconds=1)
    assert q.auto_delete_on_idle >= MAX_DURATION - timedelta(seconds=1)
    assert q.lock_duration == timedelta(minutes=1)
    assert q.dead_lettering_on_message_expiration is True
    assert q.enable_batched_operations is True


def test_first_run_creates_n_with_the_exact_properties(namespace_pair: Any, secondary_admin: Any) -> None:
    primary = namespace_pair.primary
    report = provision_backlog_queues(
        admin_client=secondary_admin,
        primary_admin_client=primary.admin_client(),
        count=4,
        clock=FakeClock(),
    )
    with primary.admin_client() as p:
        name = p.get_namespace_properties().name
    expected = backlog_queue_names(name, 4)
    assert report.primary_namespace_name == name
    assert report.created == expected
    assert report.usable_queues == expected
    # read back through a fresh admin client
    with namespace_pair.secondary.admin_client() as fresh:
        for queue in expected:
            assert_spec_properties(fresh.get_queue(queue))
    # nothing was created in the primary
    with primary.admin_client() as p:
        assert not [q.name for q in p.list_queues() if "x-servicebus-transfer" in q.name]


def test_second_run_changes_nothing(namespace_pair: Any, secondary_admin: Any, primary_name: str) -> None:
    first = provision(secondary_admin, primary_name)
    assert len(first.created) == 3
    before = {n: q.lock_duration for n, q in backlog_in(secondary_admin, primary_name).items()}
    # tripwire: any create/update (PUT) or delete in the second run would fail and show in the report
    namespace_pair.secondary.faults.fail_admin("PUT", "*", 500, detail="tripwire: a PUT was sent")
    namespace_pair.secondary.faults.fail_admin("DELETE", "*", 500, detail="tripwire: a DELETE was sent")
    second = provision(secondary_admin, primary_name)
    assert second.created == []
    assert second.summary() == "all 3 present"
    assert second.usable_queues == first.usable_queues
    assert {n: q.lock_duration for n, q in backlog_in(secondary_admin, primary_name).items()} == before


def test_drifted_queue_is_used_and_not_modified(secondary_admin: Any, primary_name: str) -> None:
    drifted = f"{primary_name}/x-servicebus-transfer/1"
    secondary_admin.create_queue(drifted, lock_duration=timedelta(seconds=30), max_delivery_count=5)
    report = provision(secondary_admin, primary_name)
    row = by_name(report)[drifted]
    assert row.status is QueueStatus.DRIFTED
    diffs = {d.name: (d.expected, d.actual) for d in row.differences}
    assert diffs["lock_duration"] == (timedelta(minutes=1), timedelta(seconds=30))
    assert diffs["max_delivery_count"] == (2147483647, 5)
    assert drifted in report.usable_queues
    back = secondary_admin.get_queue(drifted)
    assert back.lock_duration == timedelta(seconds=30)
    assert back.max_delivery_count == 5


def test_extra_queue_is_untouched_and_reported(secondary_admin: Any, primary_name: str) -> None:
    extra = f"{primary_name}/x-servicebus-transfer/5"
    secondary_admin.create_queue(extra, max_delivery_count=7)
    report = provision(secondary_admin, primary_name, count=3)
    assert report.extras == [extra]
    assert extra not in report.usable_queues
    assert secondary_admin.get_queue(extra).max_delivery_count == 7
    assert set(backlog_in(secondary_admin, primary_name)) == {*backlog_queue_names(primary_name, 3), extra}


def test_failing_creation_is_retried_then_reported_while_the_rest_succeed(
    namespace_pair: Any, secondary_admin: Any, primary_name: str
) -> None:
    faults = namespace_pair.secondary.faults
    flaky = f"{primary_name}/x-servicebus-transfer/0"
    broken = f"{primary_name}/x-servicebus-transfer/2"
    faults.fail_admin("PUT", f"/{flaky}", 500, count=2, detail="flaky disk")
    faults.fail_admin("PUT", f"/{broken}", 503, detail="broken shard")
    clock = FakeClock()
    report = provision(secondary_admin, primary_name, count=3, tries=3, retry_pause=30.0, clock=clock)
    rows = by_name(report)
    assert rows[flaky].status is QueueStatus.CREATED and rows[flaky].attempts == 3
    assert rows[broken].status is QueueStatus.FAILED and rows[broken].attempts == 3
    assert "broken shard" in rows[broken].detail
    assert rows[f"{primary_name}/x-servicebus-transfer/1"].status is QueueStatus.CREATED
    assert report.usable_queues == [flaky, f"{primary_name}/x-servicebus-transfer/1"]
    assert clock.sleeps == [30.0, 30.0]
    assert broken not in backlog_in(secondary_admin, primary_name)


def test_all_failing_raises_naming_namespace_queues_and_last_error(
    namespace_pair: Any, secondary_admin: Any, primary_name: str
) -> None:
    for queue in backlog_queue_names(primary_name, 3):
        namespace_pair.secondary.faults.fail_admin(
            "PUT", f"/{queue}", 500, detail="quota of the namespace reached"
        )
    with pytest.raises(ProvisioningError) as caught:
        provision(secondary_admin, primary_name, tries=2, retry_pause=1.0)
    text = str(caught.value)
    for queue in backlog_queue_names(primary_name, 3):
        assert queue in text
    assert "quota of the namespace reached" in text
    assert str(secondary_admin.fully_qualified_namespace) in text


def test_unauthorized_names_the_missing_right(primary_name: str) -> None:
    from azure.servicebus.management import ServiceBusAdministrationClient

    from servicebus_local.server import LocalNamespace

    key = "a2V5ZWQtbmFtZXNwYWNlLWtleQ=="
    with LocalNamespace("keyed", key=key) as keyed:
        keyed.start()
        wrong = keyed.connection_string.replace(key, "d3Jvbmcta2V5")
        assert wrong != keyed.connection_string
        with (
            ServiceBusAdministrationClient.from_connection_string(
                wrong, connection_verify=keyed.ca_file
            ) as bad,
            pytest.raises(ProvisioningError) as caught,
        ):
            provision(bad, primary_name)
        assert caught.value.unauthorized
        assert "'Manage' right is required" in str(caught.value)
        assert key not in str(caught.value) and "d3Jvbmcta2V5" not in str(caught.value)


def test_forbidden_create_is_not_retried(
    namespace_pair: Any, secondary_admin: Any, primary_name: str
) -> None:
    detail = "Unauthorized access. 'Manage' claim(s) are required to perform this operation."
    namespace_pair.secondary.faults.fail_admin(
        "PUT", f"/{primary_name}/x-servicebus-transfer/*", 403, detail=detail
    )
    clock = FakeClock()
    with pytest.raises(ProvisioningError) as caught:
        provision(secondary_admin, primary_name, tries=3, clock=clock)
    assert clock.sleeps == []
    assert caught.value.unauthorized
    assert "'Manage' right is required" in str(caught.value) and "HTTP 403" in str(caught.value)
    assert caught.value.report is not None
    assert {q.attempts for q in caught.value.report.backlog} == {1}


# ------------------------------------------------------------------------------------------------------------- CLI


def write_config(tmp_path: Path, **extra: Any) -> Path:
    lines = [
        "primary:",
        '  connection_string: "${env:SB_TEST_PRIMARY}"',
    ]
    if "primary_namespace_name" in extra:
        lines.append(f"  namespace_name: {extra.pop('primary_namespace_name')}")
    lines += [
        "secondary:",
        '  connection_string: "${env:SB_TEST_SECONDARY}"',
        f"backlog_queue_count: {extra.pop('count', 3)}",
    ]
    path = tmp_path / "provision.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def sas_key(connection_string: str) -> str:
    parts = dict(p.split("=", 1) for p in connection_string.split(";") if "=" in p)
    return parts["SharedAccessKey"]


@pytest.fixture
def cli_env(namespace_pair: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """What a user sets: connection strings in environment variables, the local CA(s) in REQUESTS_CA_BUNDLE."""
    pems: list[str] = []
    for ns in (namespace_pair.primary, namespace_pair.secondary):
        pem = Path(ns.ca_file).read_text()
        if pem not in pems:
            pems.append(pem)
    bundle = tmp_path / "local-ca-bundle.pem"
    bundle.write_text("\n".join(pems))
    env = {
        "SB_TEST_PRIMARY": namespace_pair.primary.connection_string,
        "SB_TEST_SECONDARY": namespace_pair.secondary.connection_string,
        "REQUESTS_CA_BUNDLE": str(bundle),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def test_cli_dry_run_creates_nothing_then_run_creates(
    tmp_path: Path,
    cli_env: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    secondary_admin: Any,
    namespace_pair: Any,
) -> None:
    config = write_config(tmp_path, primary_namespace_name="prod-eu")
    namespace_pair.secondary.faults.fail_admin("PUT", "*", 500, detail="tripwire: a PUT was sent")
    assert main(["provision", "--config", str(config), "--dry-run", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["dry_run"] is True
    assert [q["status"] for q in data["queues"]] == ["missing"] * 3
    assert backlog_in(secondary_admin, "prod-eu") == {}
    namespace_pair.secondary.faults.clear()

    assert main(["provision", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "prod-eu/x-servicebus-transfer/0" in out and "created" in out
    assert set(backlog_in(secondary_admin, "prod-eu")) == set(backlog_queue_names("prod-eu", 3))

    assert main(["provision", "--config", str(config)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("all 3 present")


def test_cli_exit_1_when_all_fail(
    tmp_path: Path,
    cli_env: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    namespace_pair: Any,
) -> None:
    for queue in backlog_queue_names("doomed", 2):
        namespace_pair.secondary.faults.fail_admin("PUT", f"/{queue}", 500, detail="no room")
    config = write_config(tmp_path, primary_namespace_name="doomed", count=2)
    code = main(["provision", "--config", str(config), "--tries", "2", "--retry-pause", "0"])
    captured = capsys.readouterr()
    assert code == 1
    assert "no usable backlog queue in namespace" in captured.err
    assert "doomed/x-servicebus-transfer/0" in captured.err and "no room" in captured.err
    assert sas_key(namespace_pair.secondary.connection_string) not in captured.out + captured.err


def test_cli_exit_2_on_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "primary:\n  connection_string: Endpoint=sb://a.example.net/;SharedAccessKeyName=k;SharedAccessKey=eA==\n"
        "secondary:\n  connection_string: Endpoint=sb://b.example.net/;SharedAccessKeyName=k;SharedAccessKey=eA==\n"
        "backlog_queue_count: 0\n"
    )
    assert main(["provision", "--config", str(path)]) == 2
    assert "backlog_queue_count" in capsys.readouterr().err


def test_cli_namespace_name_from_the_local_primary(
    tmp_path: Path, cli_env: dict[str, str], capsys: pytest.CaptureFixture[str], primary_name: str
) -> None:
    config = write_config(tmp_path, count=1)
    assert main(["provision", "--config", str(config), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["primary_namespace_name"] == primary_name
    assert data["usable_queues"] == [f"{primary_name}/x-servicebus-transfer/0"]


def test_cli_namespace_name_from_an_fqdn_primary(
    tmp_path: Path,
    cli_env: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The primary is never contacted when its FQDN names the namespace.
    monkeypatch.setenv(
        "SB_TEST_PRIMARY",
        "Endpoint=sb://contoso.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0",
    )
    config = write_config(tmp_path, count=2)
    assert main(["provision", "--config", str(config), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["primary_namespace_name"] == "contoso"
    assert data["usable_queues"] == backlog_queue_names("contoso", 2)


def test_cli_as_a_process(tmp_path: Path, cli_env: dict[str, str], secondary_admin: Any) -> None:
    config = write_config(tmp_path, primary_namespace_name="proc", count=2)
    env = {**os.environ, **cli_env}
    done = subprocess.run(
        [sys.executable, "-m", "spark_sb", "provision", "--config", str(config)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "2/2 usable (2 created)" in done.stdout
    assert set(backlog_in(secondary_admin, "proc")) == set(backlog_queue_names("proc", 2))
    for cs in (cli_env["SB_TEST_PRIMARY"], cli_env["SB_TEST_SECONDARY"]):
        assert sas_key(cs) not in done.stdout + done.stderr


def by_name(report: Any) -> dict[str, Any]:
    """The report's rows keyed by queue name."""
    return {q.name: q for q in report.queues}


# ------------------------------------------------------------------ SPEC B13: backlog queues as large as primaries
@pytest.mark.parametrize("local_namespace_tier", ["premium"])
def test_cli_creates_premium_backlog_queues_that_take_the_primarys_largest_message(
    tmp_path: Path,
    cli_env: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    secondary_admin: Any,
    namespace_pair: Any,
) -> None:
    """Premium namespaces: the primary's ``orders`` takes 20 MB messages; ``provision`` (with ``--entity orders``)
    creates the backlog queues to take them in their backlog form, and a queue made before at the default size is
    used and reported drifted, with the size it lacks."""
    from azure.servicebus.management import ServiceBusAdministrationClient

    primary_admin = ServiceBusAdministrationClient.from_connection_string(
        namespace_pair.primary.connection_string, connection_verify=namespace_pair.primary.ca_file
    )
    with primary_admin:
        primary_admin.create_queue("orders", max_message_size_in_kilobytes=20_480)
    first = backlog_queue_names("prod-eu", 2)[0]
    # made before, for Standard primaries: the spec but the Premium default size (1,024 KB)
    secondary_admin.create_queue(first, **BACKLOG_QUEUE_SPEC.create_kwargs())
    config = write_config(tmp_path, primary_namespace_name="prod-eu", count=2)
    assert main(["provision", "--config", str(config), "--entity", "orders", "--json"]) == 0
    rows = {q["queue"]: q for q in json.loads(capsys.readouterr().out)["queues"]}
    assert rows[first]["status"] == "drifted"
    assert rows[first]["differences"] == [
        {"property": "max_message_size_in_kilobytes", "expected": 20_544, "actual": 1024, "at_least": True}
    ]
    created = backlog_queue_names("prod-eu", 2)[1]
    assert rows[created]["status"] == "created"
    assert secondary_admin.get_queue(created).max_message_size_in_kilobytes == 20_480 + 64
