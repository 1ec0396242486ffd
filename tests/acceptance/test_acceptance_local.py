"""The acceptance scenario of ``make test-azure``, run against two local namespaces (so it cannot rot), and the
one-line failures of the run (a dry run without variables, a wrong key, a namespace that does not exist, missing
Manage rights, throttling), with no secret in any output."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.__main__ import main
from tests.acceptance.backends import azure_backend, local_backend
from tests.acceptance.failures import explain
from tests.acceptance.scenario import Scenario, Settings, run_scenario

REPO = Path(__file__).resolve().parents[2]
SECRET = "acceptance-secret-key-0123456789"


@pytest.mark.slow
def test_scenario_against_two_local_namespaces(
    spark: Any, namespace_pair: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(
        rows=40,
        fan_out=8,
        failover_interval=1.0,
        ping_interval=1.0,
        slack=5.0,
        settle_wait=0.5,
        syphon_batch_duration=5.0,
    )
    report = run_scenario(
        spark, local_backend(namespace_pair.primary, namespace_pair.secondary), tmp_path, settings, say=print
    )
    table = report.format_table()
    out, err = capfd.readouterr()
    keys = {namespace_pair.primary.key, namespace_pair.secondary.key}
    assert not [k for k in keys if k in out + err + table], "a key in the run's output"
    print(out + table)  # shown with -s or -rP
    # Everything the run created is gone; nothing else was there to begin with.
    for ns in (namespace_pair.primary, namespace_pair.secondary):
        with ns.admin_client() as admin:
            assert [q.name for q in admin.list_queues()] == []
            assert [t.name for t in admin.list_topics()] == []
    assert report.numbers["lost"] == 0 and report.numbers["duplicates"] == 0, table
    assert 'queue, read by format("servicebus") into Delta' in table  # the source read the queue back
    assert report.numbers["outage_batch_s"] <= settings.failover_interval + settings.slack, table
    # The fan-out outage costs about one failover_interval, not one per disabled entity (each entity's retries
    # are waited for together).
    assert report.numbers["fanout_outage_batch_s"] <= settings.failover_interval + settings.slack, table
    assert report.ok, table


# ---------------------------------------------------------------------------------------------- clear failures
def _env_without_namespaces() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SB_")}


def _run_cli(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.acceptance"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_dry_run_without_variables_says_what_to_set_and_exits_2() -> None:
    done = _run_cli(_env_without_namespaces())
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    [line] = done.stderr.strip().splitlines()
    assert "SB_PRIMARY_CONNECTION_STRING" in line and "SB_SECONDARY_CONNECTION_STRING" in line
    assert "SB_PRIMARY_FQDN" in line and "Manage" in line


@dataclass(frozen=True)
class KeyedPair:
    """Two local namespaces that check their key, and one CA bundle that trusts both admin endpoints."""

    primary: Any
    secondary: Any
    ca_bundle: str


@pytest.fixture
def keyed(tmp_path: Path) -> Iterator[KeyedPair]:
    from servicebus_local.server import LocalNamespace

    with LocalNamespace("p", key=SECRET) as primary, LocalNamespace("s", key=SECRET) as secondary:
        bundle = tmp_path / "ca.pem"
        bundle.write_text(Path(primary.ca_file).read_text() + Path(secondary.ca_file).read_text())
        yield KeyedPair(primary, secondary, str(bundle))


def test_wrong_key_is_one_line_without_a_secret(keyed: KeyedPair) -> None:
    wrong = keyed.primary.connection_string.replace(SECRET, "wrong-key-abcdefghijklmnop")
    env = {
        **_env_without_namespaces(),
        "SB_PRIMARY_CONNECTION_STRING": wrong,
        "SB_SECONDARY_CONNECTION_STRING": keyed.secondary.connection_string,
        "REQUESTS_CA_BUNDLE": keyed.ca_bundle,
    }
    done = _run_cli(env)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Traceback" not in output
    [line] = done.stderr.strip().splitlines()
    assert "primary namespace" in line and "key was rejected" in line
    assert SECRET not in output and "wrong-key-abcdefghijklmnop" not in output


def _one_line(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    ca_file: str,
    primary: str,
    secondary: str,
) -> str:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", ca_file)
    code = main([], {"SB_PRIMARY_CONNECTION_STRING": primary, "SB_SECONDARY_CONNECTION_STRING": secondary})
    out, err = capsys.readouterr()
    assert code == 1, out + err
    assert out == "" and "Traceback" not in err and SECRET not in out + err
    [line] = err.strip().splitlines()
    return line


def test_namespace_that_does_not_exist_is_one_line(
    keyed: KeyedPair, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = (
        f"Endpoint=sb://sbacc-no-such-namespace.invalid/;SharedAccessKeyName=Root;SharedAccessKey={SECRET}"
    )
    line = _one_line(capsys, monkeypatch, keyed.ca_bundle, keyed.primary.connection_string, missing)
    assert "secondary namespace (sbacc-no-such-namespace.invalid)" in line and "does not exist" in line


def test_unreachable_namespace_is_one_line(
    keyed: KeyedPair, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from servicebus_local.server import LocalNamespace

    gone = LocalNamespace("gone", key=SECRET).start()
    conn = gone.connection_string
    gone.stop()  # nothing listens on its port any more
    line = _one_line(capsys, monkeypatch, keyed.ca_bundle, conn, keyed.secondary.connection_string)
    assert "primary namespace" in line and "connection refused" in line


def test_missing_manage_right_is_one_line(
    keyed: KeyedPair, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the service answers a SAS policy with Send/Listen only.
    keyed.secondary.faults.fail_admin(
        "GET", "/$namespaceinfo", 401, detail="Unauthorized access. 'Manage,EntityRead' claim(s) are required"
    )
    p, s = keyed.primary.connection_string, keyed.secondary.connection_string
    line = _one_line(capsys, monkeypatch, keyed.ca_bundle, p, s)
    assert "secondary namespace" in line and "lacks the Manage right" in line


def test_throttling_is_one_line(
    keyed: KeyedPair, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    keyed.primary.faults.fail_admin("GET", "/$namespaceinfo", 429, detail="Request was throttled.")
    p, s = keyed.primary.connection_string, keyed.secondary.connection_string
    line = _one_line(capsys, monkeypatch, keyed.ca_bundle, p, s)
    assert "primary namespace" in line and "throttling" in line


# ---------------------------------------------------------------------------------------------- clean-up
class _BrokenSpark:
    """Stands in for the session where the run breaks right after creating its entities: reading the stream
    raises what it is given (an error, or Ctrl-C)."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    @property
    def readStream(self) -> Any:  # noqa: N802 - the SparkSession attribute's name
        raise self.exc


def _entities(pair: Any) -> tuple[list[str], list[str], list[str]]:
    with pair.primary.admin_client() as p, pair.secondary.admin_client() as s:
        return (
            [q.name for q in p.list_queues()],
            [t.name for t in p.list_topics()],
            [q.name for q in s.list_queues()],
        )


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()], ids=["failure", "ctrl-c"])
def test_everything_created_is_deleted_after_a_failure_or_ctrl_c(
    namespace_pair: Any, tmp_path: Path, exc: BaseException
) -> None:
    with namespace_pair.primary.admin_client() as admin:
        admin.create_queue("users-own-queue")  # not the run's: must survive
    backend = local_backend(namespace_pair.primary, namespace_pair.secondary)
    with pytest.raises(type(exc)):
        run_scenario(_BrokenSpark(exc), backend, tmp_path, Settings(fan_out=3), say=lambda _t: None)
    assert _entities(namespace_pair) == (["users-own-queue"], [], [])


def test_keep_leaves_the_entities_for_inspection(namespace_pair: Any, tmp_path: Path) -> None:
    backend = local_backend(namespace_pair.primary, namespace_pair.secondary)
    scenario = Scenario(_BrokenSpark(RuntimeError("x")), backend, tmp_path, Settings(fan_out=3, keep=True))
    with pytest.raises(RuntimeError):
        scenario.run()
    queues, topics, backlog = _entities(namespace_pair)
    assert sorted(queues) == sorted([scenario.queue, *scenario.fan_queues]) and topics == [scenario.topic]
    assert backlog == [f"{scenario.prefix}/x-servicebus-transfer/{i}" for i in range(2)]
    assert all(name.startswith(scenario.prefix) for name in [*queues, *topics, *backlog])
    assert "--keep" in scenario.report.notes[0]


def test_basic_tier_is_one_line(keyed: KeyedPair, tmp_path: Path) -> None:
    # What a Basic namespace answers when asked for a topic.
    keyed.primary.faults.fail_admin(
        "PUT", "/sbacc-*-events", 400, detail="SubCode=40000. Cannot create a topic in the Basic tier."
    )
    backend = azure_backend(
        {
            "SB_PRIMARY_CONNECTION_STRING": keyed.primary.connection_string,
            "SB_SECONDARY_CONNECTION_STRING": keyed.secondary.connection_string,
        }
    )
    backend = dataclasses.replace(
        backend,
        primary_admin_kwargs={"connection_verify": keyed.primary.ca_file},
        secondary_admin_kwargs={"connection_verify": keyed.secondary.ca_file},
    )
    scenario = Scenario(_BrokenSpark(RuntimeError("not reached")), backend, tmp_path, Settings(fan_out=2))
    with pytest.raises(Exception) as caught:
        scenario.run()
    line = explain(caught.value, "the run", [SECRET])
    assert "Standard or Premium" in line and SECRET not in line
    assert _entities_of(keyed) == ([], [], [])  # the queues made before the topic were deleted


def _entities_of(pair: KeyedPair) -> tuple[list[str], list[str], list[str]]:
    with pair.primary.admin_client() as p, pair.secondary.admin_client() as s:
        return (
            [q.name for q in p.list_queues()],
            [t.name for t in p.list_topics()],
            [q.name for q in s.list_queues()],
        )
