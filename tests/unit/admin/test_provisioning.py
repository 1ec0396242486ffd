"""Unit tests of backlog-queue provisioning (SPEC B1) with a small in-memory admin client; no network."""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from azure.core.exceptions import ClientAuthenticationError, HttpResponseError, ResourceExistsError

import spark_sb.config.service_bus as config_module
from servicebus_local.clock import FakeClock
from spark_sb.admin import cli
from spark_sb.admin.provisioning import provision_backlog_queues
from spark_sb.admin.report import BACKLOG_QUEUE_SPEC, QueueStatus
from spark_sb.config.endpoints import derive_namespace_name, is_address_host
from spark_sb.config.namespace import NamespaceConfig
from spark_sb.config.secret import Secret
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.errors import ConfigError, ProvisioningError
from spark_sb.message.backlog import backlog_queue_names, parse_backlog_queue_name

NS = "contoso"


def http_error(status: int, message: str = "boom") -> HttpResponseError:
    exc = HttpResponseError(message=message)
    exc.status_code = status
    return exc


def ns_config(host: str, name: str | None = None) -> NamespaceConfig:
    """A namespace config with a (fake, never used) SAS key."""
    cs = f"Endpoint=sb://{host}/;SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0LWtleQ=="
    return NamespaceConfig(connection_string=Secret(cs), namespace_name=name)


def spec_props(name: str, **overrides: Any) -> SimpleNamespace:
    values = dict(BACKLOG_QUEUE_SPEC.create_kwargs())
    values.update(overrides)
    return SimpleNamespace(name=name, **values)


@dataclass
class FakeAdmin:
    """The part of ServiceBusAdministrationClient provisioning uses, in memory."""

    fully_qualified_namespace: str = "secondary.servicebus.windows.net"
    namespace_name: str = "reported-name"
    queues: dict[str, SimpleNamespace] = field(default_factory=dict)
    # queue name -> list of exceptions raised by successive create calls (then success)
    create_failures: dict[str, list[BaseException]] = field(default_factory=dict)
    fail_all_creates: BaseException | None = None
    list_failures: list[BaseException] = field(default_factory=list)
    exists_race: set[str] = field(default_factory=set)
    creates: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    closed: bool = False

    def list_queues(self, **kwargs: Any) -> Iterator[SimpleNamespace]:
        self.calls.append("list")
        assert kwargs.get("retry_total") == 0
        if self.list_failures:
            raise self.list_failures.pop(0)
        return iter(list(self.queues.values()))

    def create_queue(self, name: str, **kwargs: Any) -> SimpleNamespace:
        self.calls.append(f"create {name}")
        assert kwargs.pop("retry_total") == 0
        if name in self.exists_race:
            self.queues[name] = spec_props(name, lock_duration=timedelta(seconds=30))
            raise ResourceExistsError("exists")
        if self.fail_all_creates is not None:
            raise self.fail_all_creates
        plan = self.create_failures.get(name)
        if plan:
            raise plan.pop(0)
        if name in self.queues:
            raise ResourceExistsError("exists")
        self.creates.append((name, kwargs))
        self.queues[name] = SimpleNamespace(name=name, **kwargs)
        return self.queues[name]

    def get_queue(self, name: str, **kwargs: Any) -> SimpleNamespace:
        self.calls.append(f"get {name}")
        return self.queues[name]

    def get_namespace_properties(self, **kwargs: Any) -> SimpleNamespace:
        self.calls.append("namespace")
        return SimpleNamespace(name=self.namespace_name)

    def close(self) -> None:
        self.closed = True


def run(admin: FakeAdmin, clock: FakeClock | None = None, **kwargs: Any) -> Any:
    kwargs.setdefault("count", 4)
    return provision_backlog_queues(
        admin_client=admin,  # type: ignore[arg-type]
        primary_namespace_name=NS,
        clock=clock or FakeClock(),
        **kwargs,
    )


# ---------------------------------------------------------------------------------------------------------- names


def test_backlog_queue_names_follow_the_seed() -> None:
    assert backlog_queue_names("contoso", 3) == [
        "contoso/x-servicebus-transfer/0",
        "contoso/x-servicebus-transfer/1",
        "contoso/x-servicebus-transfer/2",
    ]
    assert parse_backlog_queue_name("Contoso/X-ServiceBus-Transfer/7", "contoso") == "7"
    assert parse_backlog_queue_name("other/x-servicebus-transfer/1", "contoso") is None
    assert parse_backlog_queue_name("contoso/x-servicebus-transfer/", "contoso") is None


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("contoso.servicebus.windows.net", "contoso"),
        ("contoso.servicebus.windows.net:5671", "contoso"),
        ("sb://contoso.servicebus.windows.net/", "contoso"),
        ("fabrikam.servicebus.chinacloudapi.cn.", "fabrikam"),
    ],
)
def test_namespace_name_from_fqdn_is_the_first_label(host: str, expected: str) -> None:
    def lookup() -> str:
        raise AssertionError("an FQDN must not be looked up")

    assert derive_namespace_name(host, lookup=lookup) == expected


@pytest.mark.parametrize("host", ["127.0.0.1:5671", "localhost:5672", "localhost", "[::1]:5671", "10.1.2.3"])
def test_namespace_name_of_an_address_is_asked_from_the_namespace(host: str) -> None:
    assert is_address_host(host)
    assert derive_namespace_name(host, lookup=lambda: "local-primary") == "local-primary"
    with pytest.raises(ValueError, match="namespace_name"):
        derive_namespace_name(host)


def test_namespace_name_override_wins() -> None:
    def lookup() -> str:
        raise AssertionError("an override must not be looked up")

    assert derive_namespace_name("contoso.servicebus.windows.net", override="prod-eu") == "prod-eu"
    assert derive_namespace_name("127.0.0.1:5671", override="prod-eu", lookup=lookup) == "prod-eu"


# ---------------------------------------------------------------------------------------------------- provisioning


def test_first_run_creates_all_with_the_spec_then_second_run_changes_nothing() -> None:
    admin = FakeAdmin()
    report = run(admin)
    names = backlog_queue_names(NS, 4)
    assert report.created == names
    assert report.usable_queues == names
    assert report.ok
    assert [c[0] for c in admin.creates] == names
    for _, kwargs in admin.creates:
        assert kwargs == BACKLOG_QUEUE_SPEC.create_kwargs()

    admin.creates.clear()
    admin.calls.clear()
    again = run(admin)
    assert admin.creates == []
    assert admin.calls == ["list"]
    assert again.present == names
    assert again.summary() == "all 4 present"
    assert again.usable_queues == names


def test_drifted_queue_is_used_reported_and_not_modified() -> None:
    admin = FakeAdmin()
    drifted = spec_props(f"{NS}/x-servicebus-transfer/1", lock_duration=timedelta(seconds=30))
    admin.queues[drifted.name] = drifted
    report = run(admin)
    row = by_name(report)[drifted.name]
    assert row.status is QueueStatus.DRIFTED
    assert row.usable
    assert [(d.name, d.expected, d.actual) for d in row.differences] == [
        ("lock_duration", timedelta(minutes=1), timedelta(seconds=30))
    ]
    assert "lock_duration: expected PT1M, actual PT30S" in report.format_table()
    assert drifted.name in report.usable_queues
    assert drifted.name not in [c[0] for c in admin.creates]
    assert admin.queues[drifted.name].lock_duration == timedelta(seconds=30)
    assert "1 drifted" in report.summary()


def test_extra_queues_are_left_alone_and_reported() -> None:
    admin = FakeAdmin()
    for name in (
        f"{NS}/x-servicebus-transfer/7",
        f"{NS}/x-servicebus-transfer/4",
        f"{NS}/x-servicebus-transfer/old",
    ):
        admin.queues[name] = spec_props(name)
    admin.queues["unrelated"] = spec_props("unrelated")
    report = run(admin)
    assert report.extras == [
        f"{NS}/x-servicebus-transfer/4",
        f"{NS}/x-servicebus-transfer/7",
        f"{NS}/x-servicebus-transfer/old",
    ]
    assert not set(report.extras) & set(report.usable_queues)
    assert "unrelated" not in by_name(report)
    assert report.usable_queues == backlog_queue_names(NS, 4)
    assert "3 extra left alone" in report.summary()


def test_create_failure_is_retried_after_the_pause_and_then_succeeds() -> None:
    admin = FakeAdmin()
    flaky = f"{NS}/x-servicebus-transfer/2"
    admin.create_failures[flaky] = [http_error(500), http_error(503)]
    clock = FakeClock()
    report = run(admin, clock, retry_pause=30.0)
    row = by_name(report)[flaky]
    assert row.status is QueueStatus.CREATED
    assert row.attempts == 3
    assert row.detail == "created on try 3"
    assert clock.sleeps == [30.0, 30.0]
    assert report.usable_queues == backlog_queue_names(NS, 4)


def test_queue_that_cannot_be_created_is_reported_and_left_out() -> None:
    admin = FakeAdmin()
    bad = f"{NS}/x-servicebus-transfer/0"
    admin.create_failures[bad] = [http_error(500, "internal error") for _ in range(5)]
    clock = FakeClock()
    report = run(admin, clock, tries=3, retry_pause=2.0)
    row = by_name(report)[bad]
    assert row.status is QueueStatus.FAILED
    assert row.attempts == 3
    assert "after 3 tries" in row.detail and "HTTP 500" in row.detail and "internal error" in row.detail
    assert bad not in report.usable_queues
    assert report.usable_queues == backlog_queue_names(NS, 4)[1:]
    assert report.ok
    assert clock.sleeps == [2.0, 2.0]  # rounds: one pause per round, not per queue
    assert admin.calls.count(f"create {bad}") == 3


def test_all_failing_raises_a_clear_error() -> None:
    admin = FakeAdmin(fail_all_creates=http_error(500, "the disk is on fire"))
    with pytest.raises(ProvisioningError) as caught:
        run(admin, tries=2, retry_pause=1.0)
    text = str(caught.value)
    assert "secondary.servicebus.windows.net" in text
    for name in backlog_queue_names(NS, 4):
        assert name in text
    assert "the disk is on fire" in text
    assert caught.value.report is not None and caught.value.report.failed == backlog_queue_names(NS, 4)

    report = run(FakeAdmin(fail_all_creates=http_error(500)), check=False, tries=1)
    assert not report.ok and report.usable_queues == []


def test_unauthorized_is_not_retried_and_names_the_missing_right() -> None:
    admin = FakeAdmin(
        fail_all_creates=http_error(403, "Unauthorized access. 'Manage' claim(s) are required.")
    )
    clock = FakeClock()
    with pytest.raises(ProvisioningError, match="'Manage' right is required"):
        run(admin, clock, tries=3)
    assert clock.sleeps == []
    assert sum(c.startswith("create") for c in admin.calls) == 4


def test_queue_created_concurrently_is_used_as_found() -> None:
    admin = FakeAdmin()
    racy = f"{NS}/x-servicebus-transfer/3"
    admin.exists_race.add(racy)
    report = run(admin)
    row = by_name(report)[racy]
    assert row.status is QueueStatus.DRIFTED  # the racer created it with other properties
    assert racy in report.usable_queues


def test_dry_run_changes_nothing_and_prints_the_plan() -> None:
    admin = FakeAdmin()
    present = f"{NS}/x-servicebus-transfer/0"
    admin.queues[present] = spec_props(present)
    report = run(admin, dry_run=True)
    assert admin.creates == [] and not any(c.startswith("create") for c in admin.calls)
    assert report.present == [present]
    assert report.missing == backlog_queue_names(NS, 4)[1:]
    assert report.ok
    table = report.format_table()
    assert "DRY RUN" in table and "would be created" in table


def test_listing_failure_is_retried_then_reported() -> None:
    admin = FakeAdmin(list_failures=[http_error(503)])
    clock = FakeClock()
    assert run(admin, clock, retry_pause=5.0).ok
    assert clock.sleeps == [5.0]

    admin = FakeAdmin(list_failures=[ClientAuthenticationError("no") for _ in range(3)])
    with pytest.raises(ProvisioningError, match="could not list") as caught:
        run(admin)
    assert "Manage" in str(caught.value)
    assert f"{NS}/x-servicebus-transfer/0" in str(caught.value)


def test_arguments_are_validated() -> None:
    with pytest.raises(ValueError):
        run(FakeAdmin(), tries=0)
    with pytest.raises(ValueError):
        run(FakeAdmin(), count=0)
    with pytest.raises(ValueError, match="secondary"):
        provision_backlog_queues(ServiceBusConfig(primary=ns_config("prim.example.net", "x")))


def test_report_json_round_trips() -> None:
    admin = FakeAdmin()
    name = f"{NS}/x-servicebus-transfer/1"
    admin.queues[name] = spec_props(name, max_size_in_megabytes=1024)
    data = json.loads(json.dumps(run(admin).to_dict()))
    assert data["ok"] is True
    assert data["count"] == 4
    row = next(q for q in data["queues"] if q["queue"] == name)
    assert row["status"] == "drifted"
    assert row["differences"] == [{"property": "max_size_in_megabytes", "expected": 5120, "actual": 1024}]


def test_config_drives_count_name_and_closes_the_admin_client_it_builds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[FakeAdmin] = []

    def admin_client(self: NamespaceConfig, **kwargs: Any) -> FakeAdmin:
        built.append(FakeAdmin())
        return built[-1]

    monkeypatch.setattr(NamespaceConfig, "admin_client", admin_client)
    monkeypatch.setattr(NamespaceConfig, "redacted", lambda self: "sb://secondary.example (SAS key name k)")
    config = ServiceBusConfig(
        primary=ns_config("prim.example.net"), secondary=ns_config("sec.example.net"), backlog_queue_count=2
    )
    report = provision_backlog_queues(config, clock=FakeClock())
    assert report.created == ["prim/x-servicebus-transfer/0", "prim/x-servicebus-transfer/1"]
    assert report.namespace == "sb://secondary.example (SAS key name k)"
    assert len(built) == 1 and built[0].closed


# ------------------------------------------------------------------------------------------------------------- CLI


def cli_run(argv: list[str], admin: FakeAdmin, **kwargs: Any) -> tuple[int, str, str]:
    args = cli.build_parser().parse_args(argv)
    out, err = io.StringIO(), io.StringIO()
    code = cli.run_provision(
        args, out=out, err=err, admin_client=admin, primary_namespace_name=NS, clock=FakeClock(), **kwargs
    )
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def fake_config(monkeypatch: pytest.MonkeyPatch) -> ServiceBusConfig:
    config = ServiceBusConfig(primary=ns_config("10.0.0.1:5671", NS), backlog_queue_count=3)

    def load(source: Any) -> ServiceBusConfig:
        if str(source).endswith("bad.yaml"):
            raise ConfigError("backlog_queue_count: must be > 0")
        return config

    monkeypatch.setattr(config_module, "load_config", load)
    return config


def test_cli_prints_a_table_and_exits_0(fake_config: ServiceBusConfig) -> None:
    admin = FakeAdmin()
    code, out, _ = cli_run(["provision", "--config", "conf/x.yaml"], admin)
    assert code == 0
    assert out.splitlines()[1].split() == ["QUEUE", "STATUS", "DETAIL"]
    assert f"{NS}/x-servicebus-transfer/2  created" in out
    assert "3/3 usable (3 created)" in out
    code, out, _ = cli_run(["provision", "--config", "conf/x.yaml"], admin)
    assert code == 0 and out.rstrip().endswith("all 3 present")


def test_cli_takes_tries_and_pause_from_config_keys_unless_flags_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = ServiceBusConfig(
        primary=ns_config("10.0.0.1:5671", NS),
        backlog_queue_count=1,
        provision_tries=4,
        provision_retry_pause=7.0,
    )
    monkeypatch.setattr(config_module, "load_config", lambda source: config)
    for argv, tries, pauses in (
        (["provision", "--config", "c.yaml"], 4, [7.0, 7.0, 7.0]),
        (["provision", "--config", "c.yaml", "--tries", "2", "--retry-pause", "1"], 2, [1.0]),
    ):
        admin = FakeAdmin(fail_all_creates=http_error(500, "down"))
        clock = FakeClock()
        args = cli.build_parser().parse_args(argv)
        code = cli.run_provision(
            args,
            out=io.StringIO(),
            err=io.StringIO(),
            admin_client=admin,
            primary_namespace_name=NS,
            clock=clock,
        )
        assert code == 1
        assert sum(c.startswith("create") for c in admin.calls) == tries
        assert clock.sleeps == pauses


def test_cli_json_and_dry_run(fake_config: ServiceBusConfig) -> None:
    admin = FakeAdmin()
    code, out, _ = cli_run(["provision", "--config", "conf/x.yaml", "--dry-run", "--json"], admin)
    assert code == 0
    data = json.loads(out)
    assert data["dry_run"] is True
    assert [q["status"] for q in data["queues"]] == ["missing"] * 3
    assert admin.queues == {}


def test_cli_exits_1_when_no_queue_is_usable(fake_config: ServiceBusConfig) -> None:
    admin = FakeAdmin(fail_all_creates=http_error(500, "nope"))
    code, out, err = cli_run(
        ["provision", "--config", "conf/x.yaml", "--tries", "2", "--retry-pause", "0"], admin
    )
    assert code == 1
    assert "failed" in out
    assert "no usable backlog queue in namespace secondary.servicebus.windows.net" in err
    assert "nope" in err


def test_cli_exits_2_on_bad_config(fake_config: ServiceBusConfig) -> None:
    code, _, err = cli_run(["provision", "--config", "conf/bad.yaml"], FakeAdmin())
    assert code == 2
    assert "backlog_queue_count" in err


def test_cli_exits_2_without_secondary(fake_config: ServiceBusConfig) -> None:
    args = cli.build_parser().parse_args(["provision", "--config", "conf/x.yaml"])
    err = io.StringIO()
    assert cli.run_provision(args, out=io.StringIO(), err=err) == 2
    assert "secondary.connection_string" in err.getvalue()


def test_cli_bad_arguments_exit_2() -> None:
    assert cli.main(["provision"]) == 2  # --config missing
    assert cli.main(["provision", "--config", "x.yaml", "--tries", "0"]) == 2
    assert cli.main(["nosuchcommand"]) == 2
    assert isinstance(cli.build_parser(), argparse.ArgumentParser)


def test_primary_name_asked_from_the_primary_admin_client_without_config() -> None:
    primary = FakeAdmin(namespace_name="local-primary")
    secondary = FakeAdmin()
    report = provision_backlog_queues(
        admin_client=secondary,  # type: ignore[arg-type]
        primary_admin_client=primary,  # type: ignore[arg-type]
        count=1,
        clock=FakeClock(),
    )
    assert report.created == ["local-primary/x-servicebus-transfer/0"]
    assert primary.calls == ["namespace"] and not primary.closed


def test_dry_run_with_everything_present_says_so() -> None:
    admin = FakeAdmin()
    run(admin)
    report = run(admin, dry_run=True)
    assert report.summary() == "all 4 present"
    assert report.dry_run and report.ok


def test_error_text_never_carries_a_key() -> None:
    leaky = http_error(
        500, "Endpoint=sb://x.example.net/;SharedAccessKeyName=k;SharedAccessKey=dG9wLXNlY3JldA=="
    )
    admin = FakeAdmin(fail_all_creates=leaky)
    with pytest.raises(ProvisioningError) as caught:
        run(admin, tries=1)
    assert "dG9wLXNlY3JldA==" not in str(caught.value)
    assert "dG9wLXNlY3JldA==" not in caught.value.report.format_table()  # type: ignore[union-attr]


def test_cli_real_config_loading_errors_exit_2(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "primary:\n  connection_string: Endpoint=sb://a.example.net/;SharedAccessKeyName=k;SharedAccessKey=eA==\n"
        "secondary:\n  connection_string: ${env:SB_TEST_UNSET_VARIABLE_XYZ}\n"
    )
    assert cli.main(["provision", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "secondary.connection_string" in err and "SB_TEST_UNSET_VARIABLE_XYZ" in err
    assert cli.main(["provision", "--config", str(tmp_path / "missing.yaml")]) == 2


def by_name(report: Any) -> dict[str, Any]:
    """The report's rows keyed by queue name."""
    return {q.name: q for q in report.queues}


def test_cli_shows_the_primary_entities_duplicate_detection_after_the_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SPEC B14: after the backlog table, each primary entity (``entity``, ``--entity``) with its duplicate detection
    and a warning where it is off or shorter than exactly_once_horizon; the JSON carries it; a config without an
    entity shows nothing more."""
    from tests.unit.fakes import PrimaryAdmin

    config = ServiceBusConfig(primary=ns_config("10.0.0.1:5671", NS), backlog_queue_count=1, entity="orders")
    monkeypatch.setattr(config_module, "load_config", lambda source: config)
    primary = PrimaryAdmin(
        {"orders": ("queue", False, timedelta(minutes=10)), "audit": ("topic", True, timedelta(seconds=30))}
    )
    argv = ["provision", "--config", "c.yaml", "--entity", "audit"]
    code, out, _ = cli_run(argv, FakeAdmin(), primary_admin_client=primary)
    assert code == 0
    table, _, rest = out.partition(
        "duplicate detection of the primary entities (exactly_once_horizon 1 h):\n"
    )
    assert table.rstrip().endswith("1/1 usable (1 created)")
    assert rest.splitlines() == [
        "  orders                         queue  off",
        "    WARNING: orders: duplicate detection is off - a message diverted after an ambiguous send reaches it "
        "twice if that send had landed",
        "  audit                          topic  on, window 30 s",
        "    WARNING: audit: duplicate detection window 30 s is shorter than exactly_once_horizon 1 h - a message "
        "diverted after an ambiguous send that returns later than 30 s reaches it twice if that send had landed",
    ]
    code, out, _ = cli_run([*argv, "--json"], FakeAdmin(), primary_admin_client=primary)
    data = json.loads(out)["duplicate_detection"]
    assert [(e["entity"], e["kind"], e["window_seconds"]) for e in data["entities"]] == [
        ("orders", "queue", None),
        ("audit", "topic", 30.0),
    ]
    assert all(e["warning"] for e in data["entities"])
    code, out, _ = cli_run([*argv, "--no-duplicate-detection"], FakeAdmin(), primary_admin_client=primary)
    assert "duplicate detection" not in out and len(primary.calls) == 2 * 3  # queue, then topic for audit


def test_cli_without_an_entity_prints_the_table_alone(fake_config: ServiceBusConfig) -> None:
    code, out, _ = cli_run(["provision", "--config", "conf/x.yaml", "--json"], FakeAdmin())
    assert code == 0 and json.loads(out)["duplicate_detection"]["entities"] == []


# ------------------------------------------------------------------ SPEC B13: backlog queues as large as primaries
def test_backlog_queues_take_what_the_largest_primary_takes_in_its_backlog_form() -> None:
    from spark_sb.admin.report import BACKLOG_FORM_KB, backlog_spec_for

    assert backlog_spec_for([]) is BACKLOG_QUEUE_SPEC  # nothing read: the namespace's default
    assert backlog_spec_for([None, 256]) is BACKLOG_QUEUE_SPEC  # Standard primaries
    assert "max_message_size_in_kilobytes" not in BACKLOG_QUEUE_SPEC.create_kwargs()
    spec = backlog_spec_for([1024, None, 5120])
    assert spec.max_message_size_in_kilobytes == 5120 + BACKLOG_FORM_KB
    assert spec.create_kwargs() == {
        **BACKLOG_QUEUE_SPEC.create_kwargs(),
        "max_message_size_in_kilobytes": 5120 + BACKLOG_FORM_KB,
    }
    assert backlog_spec_for([102_400]).max_message_size_in_kilobytes == 102_400  # the service's most


def test_a_backlog_queue_smaller_than_its_primaries_is_created_large_or_reported_drifted() -> None:
    from spark_sb.admin.report import backlog_spec_for

    spec = backlog_spec_for([5120])
    admin = FakeAdmin()
    name0, name1, name2 = backlog_queue_names(NS, 3)
    admin.queues[name0] = spec_props(name0, max_message_size_in_kilobytes=256)  # made for Standard primaries
    admin.queues[name1] = spec_props(name1, max_message_size_in_kilobytes=102_400)  # larger: takes them too
    report = run(admin, count=3, spec=spec)
    rows = by_name(report)
    assert rows[name0].status is QueueStatus.DRIFTED
    assert [d.describe() for d in rows[name0].differences] == [
        "max_message_size_in_kilobytes: expected at least 5184, actual 256"
    ]
    assert rows[name0].differences[0].to_dict()["at_least"] is True
    assert rows[name1].status is QueueStatus.PRESENT
    assert rows[name2].status is QueueStatus.CREATED
    assert admin.creates == [(name2, spec.create_kwargs())]
    assert admin.creates[0][1]["max_message_size_in_kilobytes"] == 5184


def test_cli_sizes_the_backlog_queues_by_the_primary_entities_it_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``provision`` reads each primary entity's message size limit with its duplicate detection (one call each)
    and creates the backlog queues to take the largest in its backlog form; ``--no-duplicate-detection`` asks
    nothing of the primary, and the queues get the namespace's default size."""
    from tests.unit.fakes import PrimaryAdmin

    config = ServiceBusConfig(primary=ns_config("10.0.0.1:5671", NS), backlog_queue_count=1, entity="orders")
    monkeypatch.setattr(config_module, "load_config", lambda source: config)
    window = timedelta(hours=2)
    primary = PrimaryAdmin(
        {"orders": ("queue", True, window), "big": ("topic", True, window)}, sizes={"big": 20_480}
    )
    secondary = FakeAdmin()
    code, out, _ = cli_run(
        ["provision", "--config", "c.yaml", "--entity", "big"], secondary, primary_admin_client=primary
    )
    assert code == 0 and "1/1 usable (1 created)" in out
    assert [kw.get("max_message_size_in_kilobytes") for _, kw in secondary.creates] == [20_480 + 64]
    secondary = FakeAdmin()
    argv = ["provision", "--config", "c.yaml", "--entity", "big", "--no-duplicate-detection"]
    code, out, _ = cli_run(argv, secondary, primary_admin_client=primary)
    assert code == 0 and [kw.get("max_message_size_in_kilobytes") for _, kw in secondary.creates] == [None]
