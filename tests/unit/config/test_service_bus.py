"""Unit tests for spark_sb.config.service_bus (SPEC S8)."""

from __future__ import annotations

import io
import logging
import pickle
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from spark_sb.config.endpoints import parse_connection_string
from spark_sb.config.namespace import CredentialConfig, NamespaceConfig, RetryConfig
from spark_sb.config.secret import Secret
from spark_sb.config.service_bus import ServiceBusConfig, load_config
from spark_sb.core.errors import ConfigError
from spark_sb.core.redact import RedactingFilter
from spark_sb.message.rows import LOGICAL_COLUMNS

KEY1 = "PrimaryKeyValue0123456789abcdef="
KEY2 = "SecondaryKeyValue9876543210zyx="
CLIENT_SECRET = "AadClientSecret~42~xyz"
CS1 = f"Endpoint=sb://127.0.0.1:5671;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={KEY1};UseDevelopmentEmulator=true"
CS2 = f"Endpoint=sb://contoso-dr.servicebus.windows.net/;SharedAccessKeyName=Send;SharedAccessKey={KEY2}"
ENV = {"SB_PRIMARY": CS1, "SB_SECONDARY": CS2, "SB_CLIENT_SECRET": CLIENT_SECRET}
SECRETS = (KEY1, KEY2, CLIENT_SECRET)

NESTED: dict[str, Any] = {
    "primary": {"connection_string": "${env:SB_PRIMARY}", "namespace_name": "primary"},
    "secondary": {"connection_string": "${env:SB_SECONDARY}"},
    "entity": "orders",
    "backlog_queue_count": 4,
    "failover_interval": "5s",
    "ping_primary_interval": "PT1M",
    "probe_mode": "ping",
    "backlog_retry_interval": "2m",
    "backlog_selection": "session-affine",
    "send_timeout": 12.5,
    "retry": {"total": 0, "backoff_factor": 0.5, "backoff_max": 30, "mode": "fixed"},
    "max_message_size": 1048576,
    "on_reject": "fail",
    "state_location": "/tmp/state",
    "columns": {"body": "payload", "entity": "dest"},
    "syphon": {"max_wait": "1h", "batch_size": 50, "prefetch": 10},
    "idle_timeout": "250ms",
    "client_cache": False,
    "x-owner": "data-platform",
}
FLAT = {
    "primary.connection_string": "${env:SB_PRIMARY}",
    "primary.namespace_name": "primary",
    "secondary.connection_string": "${env:SB_SECONDARY}",
    "entity": "orders",
    "backlog_queue_count": "4",
    "failover_interval": "5",
    "ping_primary_interval": "60s",
    "probe_mode": "ping",
    "backlog_retry_interval": "120",
    "backlog_selection": "session-affine",
    "send_timeout": "12.5",
    "retry.total": "0",
    "retry.backoff_factor": "0.5",
    "retry.backoff_max": "30",
    "retry.mode": "fixed",
    "max_message_size": "1048576",
    "on_reject": "fail",
    "state_location": "/tmp/state",
    "columns.body": "payload",
    "columns.entity": "dest",
    "syphon.max_wait": "3600",
    "syphon.batch_size": "50",
    "syphon.prefetch": "10",
    "idle_timeout": "0.25",
    "client_cache": "false",
    "x-owner": "data-platform",
}
YAML = """
primary:
  connection_string: ${env:SB_PRIMARY}
  namespace_name: primary
secondary:
  connection_string: ${env:SB_SECONDARY}
entity: orders
backlog_queue_count: 4
failover_interval: 5s
ping_primary_interval: 1m
probe_mode: ping
backlog_retry_interval: 2m
backlog_selection: session-affine
send_timeout: 12.5
retry: {total: 0, backoff_factor: 0.5, backoff_max: 30, mode: fixed}
max_message_size: 1048576
on_reject: fail
state_location: /tmp/state
columns: {body: payload, entity: dest}
syphon: {max_wait: 1h, batch_size: 50, prefetch: 10}
idle_timeout: 250ms
client_cache: false
x-owner: data-platform
"""


def cfg(**overrides: Any) -> ServiceBusConfig:
    return ServiceBusConfig.from_dict({**NESTED, **overrides}, env=ENV)


def error_of(settings: dict[str, Any], **kw: Any) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        ServiceBusConfig.from_dict(settings, env=kw.pop("env", ENV), **kw)
    return e.value


# ------------------------------------------------------------------------------- loading
def test_yaml_dict_and_options_give_equal_objects(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(YAML)
    a = ServiceBusConfig.from_yaml(path, env=ENV)
    b = ServiceBusConfig.from_dict(NESTED, env=ENV)
    c = ServiceBusConfig.from_options(FLAT, env=ENV)
    d = load_config(str(path), env=ENV)
    e = load_config(FLAT, env=ENV)
    assert a == b == c == d == e
    assert hash(a) == hash(c)


def test_values_are_parsed() -> None:
    c = cfg()
    assert c.primary.connection_string is not None and c.primary.connection_string.reveal() == CS1
    assert c.primary.fully_qualified_namespace == "127.0.0.1:5671"
    assert (
        c.secondary is not None
        and c.secondary.fully_qualified_namespace == "contoso-dr.servicebus.windows.net"
    )
    assert (c.entity, c.backlog_queue_count, c.failover_interval, c.ping_primary_interval) == (
        "orders",
        4,
        5.0,
        60.0,
    )
    assert (c.probe_mode, c.backlog_retry_interval, c.backlog_selection) == ("ping", 120.0, "session-affine")
    assert c.retry == RetryConfig(total=0, backoff_factor=0.5, backoff_max=30.0, mode="fixed")
    assert (c.max_message_size, c.on_reject, c.state_location) == (1048576, "fail", "/tmp/state")
    assert (c.syphon_max_wait, c.syphon_batch_size, c.syphon_prefetch) == (3600.0, 50, 10)
    assert (c.idle_timeout, c.client_cache) == (0.25, False)
    assert (
        c.columns["body"] == "payload" and c.columns["entity"] == "dest" and c.columns["subject"] == "subject"
    )
    assert set(c.columns) == set(LOGICAL_COLUMNS)
    assert dict(c.extra) == {"x-owner": "data-platform"}


def test_defaults_match_the_contract() -> None:
    c = ServiceBusConfig.from_dict({"primary": {"connection_string": CS1}})
    assert c.secondary is None and not c._failover_enabled and c.entity is None
    assert (c.backlog_queue_count, c.failover_interval, c.ping_primary_interval) == (10, 60.0, 60.0)
    assert (c.probe_mode, c.backlog_retry_interval, c.backlog_selection) == (
        "schedule-cancel",
        300.0,
        "random",
    )
    assert (c.send_timeout, c.max_message_size, c.on_reject) == (30.0, 262144, "record")
    assert c.retry == RetryConfig(0, 0.8, 120.0, "exponential")
    assert (c.syphon_max_wait, c.syphon_batch_size, c.syphon_prefetch) == (900.0, 100, 0)
    assert (c.idle_timeout, c.client_cache, dict(c.extra)) == (600.0, True, {})
    assert dict(c.columns) == {n: n for n in LOGICAL_COLUMNS}
    assert c == ServiceBusConfig(primary=NamespaceConfig(connection_string=Secret(CS1)))


def test_yaml_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("primary: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        ServiceBusConfig.from_yaml(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    lst = tmp_path / "list.yaml"
    lst.write_text("- a\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(lst)


def test_shipped_conf_files_load() -> None:
    root = Path(__file__).resolve().parents[3] / "conf"
    env = {"SB_PRIMARY_CONNECTION_STRING": CS1, "SB_SECONDARY_CONNECTION_STRING": CS2}
    for name in ("example.yaml", "local.yaml"):
        c = load_config(root / name, env=env)
        assert c.secondary is not None
        text = (root / name).read_text()
        assert "SharedAccessKey=" not in text.replace("SharedAccessKey=...", "")


def test_options_keys_are_case_insensitive() -> None:
    c = ServiceBusConfig.from_options({"Primary.Connection_String": CS1, "PROBE_MODE": "ping"})
    assert c.probe_mode == "ping"
    with pytest.raises(ConfigError, match="given twice"):
        ServiceBusConfig.from_options({"entity": "a", "ENTITY": "b", "primary.connection_string": CS1})


# ------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("override", "key", "fragment"),
    [
        ({"probe_mode": "pong"}, "probe_mode", "'pong' is not one of 'schedule-cancel', 'ping'"),
        (
            {"backlog_selection": "roundrobin"},
            "backlog_selection",
            "is not one of 'random', 'session-affine'",
        ),
        ({"on_reject": "drop"}, "on_reject", "is not one of 'record', 'fail'"),
        ({"retry": {"mode": "linear"}}, "retry.mode", "is not one of 'exponential', 'fixed'"),
        ({"backlog_queue_count": 0}, "backlog_queue_count", "> 0"),
        ({"backlog_queue_count": "many"}, "backlog_queue_count", "integer"),
        ({"failover_interval": -1}, "failover_interval", ">= 0"),
        ({"failover_interval": "soon"}, "failover_interval", "not a duration"),
        ({"ping_primary_interval": 0}, "ping_primary_interval", "> 0"),
        ({"send_timeout": "0s"}, "send_timeout", "> 0"),
        ({"max_message_size": 0}, "max_message_size", "> 0"),
        ({"syphon": {"batch_size": 0}}, "syphon.batch_size", "> 0"),
        ({"syphon": {"prefetch": -1}}, "syphon.prefetch", ">= 0"),
        ({"client_cache": "maybe"}, "client_cache", "not one of true, false"),
        ({"retry": {"total": -1}}, "retry.total", "must be 0"),
        ({"entity": ""}, "entity", "non-empty"),
    ],
)
def test_validation_names_the_key(override: dict[str, Any], key: str, fragment: str) -> None:
    err = error_of({**NESTED, **override})
    assert str(err).startswith(f"{key}: ")
    assert fragment in str(err)
    assert err.errors[0][0] == key


def test_probe_mode_message_exact() -> None:
    assert str(error_of({**NESTED, "probe_mode": "pong"})) == (
        "probe_mode: 'pong' is not one of 'schedule-cancel', 'ping'"
    )


def test_failover_interval_zero_is_allowed() -> None:
    assert cfg(failover_interval=0).failover_interval == 0.0


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [
        ("probe_mod", "probe_mode"),
        ("failover_intervall", "failover_interval"),
        ("primary.conection_string", "primary.connection_string"),
        ("syphon.maxwait", "syphon.max_wait"),
    ],
)
def test_unknown_keys_did_you_mean(key: str, suggestion: str) -> None:
    err = error_of({"primary.connection_string": CS1, key: "x"})
    assert str(err) == f"{key}: unknown key (did you mean {suggestion!r}?)"


def test_unknown_key_without_suggestion_and_unknown_column() -> None:
    assert str(error_of({"primary.connection_string": CS1, "zzz": 1})) == "zzz: unknown key"
    err = error_of({"primary.connection_string": CS1, "columns": {"bodyy": "x"}})
    assert str(err).startswith(
        "columns.bodyy: unknown column 'bodyy' (did you mean 'body'?); valid: body, entity"
    )


def test_several_errors_are_all_reported() -> None:
    err = error_of({"primary.connection_string": CS1, "probe_mode": "x", "on_reject": "y", "bogus": 1})
    assert [k for k, _ in err.errors] == ["probe_mode", "on_reject", "bogus"]


def test_x_keys_are_kept_in_extra() -> None:
    c = ServiceBusConfig.from_dict({"primary.connection_string": CS1, "x-team": {"name": "a", "size": 3}})
    assert dict(c.extra) == {"x-team.name": "a", "x-team.size": "3"}


# ------------------------------------------------------------------------------- namespaces
def test_exactly_one_auth_method() -> None:
    both = {"primary": {"connection_string": CS1, "fully_qualified_namespace": "x.servicebus.windows.net"}}
    assert "exactly one of" in str(error_of(both))
    cred_too = {"primary": {"connection_string": CS1, "credential": {"kind": "default"}}}
    assert str(error_of(cred_too)).startswith("primary: give exactly one of")
    neither = {"primary": {"namespace_name": "x"}}
    assert str(error_of(neither)).startswith("primary: give exactly one of")
    no_cred = {"primary": {"fully_qualified_namespace": "x.servicebus.windows.net"}}
    assert str(error_of(no_cred)) == "primary.credential: required with fully_qualified_namespace"
    assert str(error_of({"entity": "q"})).startswith("primary: required")


def test_credential_configs() -> None:
    c = ServiceBusConfig.from_dict(
        {
            "primary": {
                "fully_qualified_namespace": "contoso.servicebus.windows.net",
                "credential": {
                    "kind": "client_secret",
                    "tenant_id": "t",
                    "client_id": "c",
                    "client_secret": "${env:SB_CLIENT_SECRET}",
                },
            }
        },
        env=ENV,
    )
    cred = c.primary.credential
    assert cred is not None and cred.client_secret is not None
    assert cred.client_secret.reveal() == CLIENT_SECRET
    assert c.primary.endpoint_host() == "contoso.servicebus.windows.net"
    assert c.primary.effective_namespace_name() == "contoso"
    assert c.backlog_queue_names()[:2] == [
        "contoso/x-servicebus-transfer/0",
        "contoso/x-servicebus-transfer/1",
    ]
    assert (
        c.primary.redacted() == "sb://contoso.servicebus.windows.net (credential client_secret, client id c)"
    )
    assert c.to_options()["primary.credential.client_secret"] == "${env:SB_CLIENT_SECRET}"
    assert ServiceBusConfig.from_options(c.to_options(), env=ENV) == c
    missing = {
        "primary": {
            "fully_qualified_namespace": "x.servicebus.windows.net",
            "credential": {"kind": "client_secret"},
        }
    }
    assert str(error_of(missing)) == "primary.credential.tenant_id: required when kind is 'client_secret'"
    kind = {
        "primary": {"fully_qualified_namespace": "x.servicebus.windows.net", "credential": {"kind": "cert"}}
    }
    assert "is not one of 'default', 'client_secret', 'managed_identity'" in str(error_of(kind))


def test_credential_build_is_lazy_and_typed() -> None:
    from azure.identity import ClientSecretCredential, ManagedIdentityCredential

    cred = CredentialConfig("client_secret", "tenant", "client", Secret(CLIENT_SECRET))
    assert isinstance(cred.build(), ClientSecretCredential)
    assert isinstance(CredentialConfig("managed_identity", client_id="c").build(), ManagedIdentityCredential)


@pytest.mark.parametrize(
    ("conn", "fragment"),
    [
        ("SharedAccessKeyName=k;SharedAccessKey=abc", "Endpoint is missing"),
        ("Endpoint=sb://h/;SharedAccessKey=abcdefgh", "needs SharedAccessKeyName and SharedAccessKey"),
        ("Endpoint=sb://h/;SharedAccessKeyName=k;SharedAccessKey=abcdefgh;Bogus=1", "unknown part 'Bogus'"),
        ("Endpoint=sb://h/;SharedAccessKeyName=k;SharedAccessKeyabcdefgh", "Name=value"),
        (
            "Endpoint=sb://h/;SharedAccessKeyName=k;SharedAccessKey=abcdefgh;UseDevelopmentEmulator=maybe",
            "true or false",
        ),
        (
            "Endpoint=sb://h/;SharedAccessSignature=SharedAccessSignature sr=x&sig=abcdefgh;SharedAccessKeyName=k",
            "not both",
        ),
    ],
)
def test_malformed_connection_strings_never_echo_the_secret(conn: str, fragment: str) -> None:
    err = error_of({"primary": {"connection_string": conn}})
    assert str(err).startswith("primary.connection_string: malformed connection string")
    assert fragment in str(err)
    assert "abcdefgh" not in str(err) and "abc;" not in str(err)


def test_connection_string_parts() -> None:
    info = parse_connection_string(CS1)
    assert (info.host, info.endpoint, info.shared_access_key_name) == (
        "127.0.0.1:5671",
        "sb://127.0.0.1:5671/",
        "RootManageSharedAccessKey",
    )
    assert (
        info.has_shared_access_key and not info.has_shared_access_signature and info.use_development_emulator
    )
    sas = parse_connection_string(
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessSignature=SharedAccessSignature sr=a&sig=b&se=1;EntityPath=q"
    )
    assert (
        sas.has_shared_access_signature and sas.entity_path == "q" and sas.host == "ns.servicebus.windows.net"
    )
    assert KEY1 not in repr(info)


def test_namespace_helpers() -> None:
    c = cfg()
    assert c.primary.endpoint_host() == "127.0.0.1:5671"
    assert (
        c.primary.redacted()
        == "sb://127.0.0.1:5671 (SAS key name RootManageSharedAccessKey, development emulator)"
    )
    assert c.primary_namespace_name() == "primary"  # explicit namespace_name wins
    assert c.backlog_queue_names("contoso") == [f"contoso/x-servicebus-transfer/{i}" for i in range(4)]
    assert c.backlog_queue_names()[0] == "primary/x-servicebus-transfer/0"
    local = NamespaceConfig(connection_string=Secret(CS1))
    with pytest.raises(
        ConfigError, match="^primary.namespace_name: the endpoint 127.0.0.1:5671 is an address"
    ):
        local.effective_namespace_name()
    assert local.effective_namespace_name(lookup=lambda: "reported") == "reported"
    assert c.secondary is not None and c.secondary.effective_namespace_name() == "contoso-dr"
    sas = (
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessSignature=SharedAccessSignature sr=a&sig=b&se=1"
    )
    assert (
        NamespaceConfig(connection_string=Secret(sas)).redacted()
        == "sb://ns.servicebus.windows.net (SAS token)"
    )


def test_same_namespace_twice_is_an_error() -> None:
    assert str(error_of({"primary.connection_string": CS1, "secondary.connection_string": CS1})) == (
        "secondary.connection_string: names the same namespace as primary.connection_string (127.0.0.1:5671): "
        "the backlog queues must be in another namespace"
    )


SAME_AS_CS2 = [
    CS2.replace("contoso-dr", "Contoso-DR"),  # host names have no case
    CS2.replace(".windows.net/", ".windows.net.:5671/"),  # a trailing dot, the default AMQPS port
    CS2.replace("sb://", "SB://"),
]


@pytest.mark.parametrize("primary", SAME_AS_CS2, ids=["case", "dot-and-port", "scheme-case"])
def test_one_namespace_spelled_twice_is_the_same_namespace(primary: str) -> None:
    """The backlog must be in another namespace: a primary that differs from the secondary only in spelling was
    accepted (case, a trailing dot, the port the SDK uses anyway), and its backlog queues would live beside it."""
    error = error_of({"primary.connection_string": primary, "secondary.connection_string": CS2})
    assert str(error).startswith(
        "secondary.connection_string: names the same namespace as primary.connection_string "
        "(contoso-dr.servicebus.windows.net:5671)"
    )


def test_a_credential_primary_and_a_connection_string_secondary_on_one_namespace_are_refused() -> None:
    error = error_of(
        {
            "primary.fully_qualified_namespace": "CONTOSO-DR.servicebus.windows.net",
            "primary.credential.kind": "default",
            "secondary.connection_string": CS2,
        }
    )
    assert str(error).startswith(
        "secondary.connection_string: names the same namespace as primary.fully_qualified_namespace"
    )


def test_other_ports_of_one_host_are_other_namespaces() -> None:
    """Two local namespaces share 127.0.0.1 on different ports (the tests' pair): they stay apart."""
    other = CS1.replace("127.0.0.1:5671", "127.0.0.1:5682")
    c = ServiceBusConfig.from_dict({"primary.connection_string": CS1, "secondary.connection_string": other})
    assert c.secondary is not None and c.secondary.identity() == "127.0.0.1:5682"
    assert c.primary.identity() == "127.0.0.1:5671"
    no_port = "Endpoint=sb://127.0.0.1;SharedAccessKeyName=k;SharedAccessKey=a2V5;UseDevelopmentEmulator=true"
    assert NamespaceConfig(connection_string=Secret(no_port)).identity() == "127.0.0.1:5672"  # the emulator's


def test_a_longest_pause_below_the_first_is_refused() -> None:
    """retry.backoff_max below retry.backoff_factor: the sender raises its cap to the factor, so backoff_max was not
    honoured (in either mode); equal is fine."""
    assert cfg(retry={"backoff_factor": 2, "backoff_max": 2}).retry.backoff_max == 2.0
    for mode in ("exponential", "fixed"):
        text = str(error_of({**NESTED, "retry": {"backoff_factor": 5, "backoff_max": 1, "mode": mode}}))
        assert text == (
            "retry.backoff_max: 1 is below retry.backoff_factor 5 (the first pause): every pause would be "
            "backoff_factor; raise backoff_max or lower backoff_factor"
        )


def test_clients_are_built_with_retry_settings() -> None:
    c = cfg()
    client = c.primary.client(c.retry)
    try:
        assert client.fully_qualified_namespace == "127.0.0.1:5671"
        assert client._config.retry_total == 0 and client._config.retry_backoff_factor == 0.5
        assert client._config.retry_backoff_max == 30
    finally:
        client.close()
    admin = c.secondary.admin_client() if c.secondary else None
    assert admin is not None
    admin.close()


# ------------------------------------------------------------------------------- secrets
def test_secret_references_and_literals() -> None:
    c = cfg()
    assert c.primary.connection_string == Secret(CS1, "${env:SB_PRIMARY}")
    err = error_of({"primary": {"connection_string": "${env:SB_NOT_SET}"}})
    assert str(err) == (
        "primary.connection_string: environment variable 'SB_NOT_SET' (referenced as ${env:SB_NOT_SET}) is not set"
    )
    partial = {
        "primary": {"connection_string": "Endpoint=sb://h/;SharedAccessKeyName=k;SharedAccessKey=${env:K}"}
    }
    c2 = ServiceBusConfig.from_dict(partial, env={"K": KEY1})
    assert c2.primary.connection_string is not None and c2.primary.connection_string.reveal().endswith(KEY1)


def test_databricks_references() -> None:
    class FakeSecrets:
        def get(self, scope: str, key: str) -> str:
            assert (scope, key) == ("sb", "primary")
            return CS1

    class FakeDbutils:
        secrets = FakeSecrets()

    settings = {"primary": {"connection_string": "{{secrets/sb/primary}}"}}
    c = ServiceBusConfig.from_dict(settings, dbutils=FakeDbutils(), env={})
    assert c.primary.connection_string == Secret(CS1, "{{secrets/sb/primary}}")
    assert c.to_options() == {**c.to_options(), "primary.connection_string": "{{secrets/sb/primary}}"}
    err = error_of(settings, env={})
    assert str(err).startswith(
        "primary.connection_string: secret reference {{secrets/sb/primary}} needs Databricks"
    )

    class Broken:
        class secrets:  # noqa: N801
            @staticmethod
            def get(scope: str, key: str) -> str:
                raise PermissionError(f"denied {KEY1}")

    err = error_of(settings, dbutils=Broken(), env={})
    assert "PermissionError" in str(err) and KEY1 not in str(err)


def test_secret_never_shown() -> None:
    c = cfg()
    c_literal = ServiceBusConfig.from_dict({**NESTED, "primary": {"connection_string": CS1}}, env=ENV)
    cred = NamespaceConfig(
        fully_qualified_namespace="a.servicebus.windows.net",
        credential=CredentialConfig("client_secret", "t", "c", Secret(CLIENT_SECRET)),
    )
    for obj in (c, c_literal, c.primary, c.secondary, cred, cred.credential, c.primary.connection_string):
        for text in (repr(obj), str(obj), f"{obj}", f"{obj!r}"):
            for s in SECRETS:
                assert s not in text
    assert repr(Secret("x")) == str(Secret("x")) == "Secret('***')"


def test_pickle_round_trip_keeps_working() -> None:
    c = cfg()
    c2 = pickle.loads(pickle.dumps(c))
    assert c2 == c and hash(c2) == hash(c)
    assert c2.primary.connection_string is not None and c2.primary.connection_string.reveal() == CS1
    assert c2.columns["body"] == "payload" and c2.extra["x-owner"] == "data-platform"
    assert c2.to_options() == c.to_options()


def test_logging_with_redaction_filter_never_shows_secrets() -> None:
    c = cfg()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger("test_config.secrets")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        assert c.primary.connection_string is not None
        logger.info("config %s", c)
        logger.info("raw connection string %s", c.primary.connection_string.reveal())
        try:
            raise RuntimeError(f"failed with {CS2}")
        except RuntimeError:
            logger.exception("send failed")
    finally:
        logger.removeHandler(handler)
    out = stream.getvalue()
    assert "raw connection string" in out and "send failed" in out and "RuntimeError" in out
    for s in SECRETS:
        assert s not in out


def test_to_options_round_trip_and_literal_secrets() -> None:
    c = cfg()
    opts = c.to_options()
    assert opts["primary.connection_string"] == "${env:SB_PRIMARY}"
    assert all(isinstance(v, str) for v in opts.values())
    assert ServiceBusConfig.from_options(opts, env=ENV) == c
    literal = ServiceBusConfig.from_dict({"primary": {"connection_string": CS1}})
    with pytest.raises(ConfigError) as e:
        literal.to_options()
    assert str(e.value).startswith("primary.connection_string: is a literal secret") and KEY1 not in str(
        e.value
    )
    opts2 = literal.to_options(include_secrets=True)
    assert opts2["primary.connection_string"] == CS1
    assert ServiceBusConfig.from_options(opts2) == literal


def test_direct_construction_is_validated() -> None:
    base = ServiceBusConfig(primary=NamespaceConfig(connection_string=Secret(CS1)))
    with pytest.raises(ConfigError, match="^probe_mode: 'x' is not one of"):
        replace(base, probe_mode="x")
    with pytest.raises(ConfigError, match="^syphon.batch_size: "):
        replace(base, syphon_batch_size=0)
    with pytest.raises(ConfigError, match="^columns.nope: unknown column"):
        replace(base, columns={"nope": "x"})
    with pytest.raises(ConfigError, match="^retry.backoff_max: "):
        replace(base, retry=RetryConfig(backoff_max=-1))
    assert base.with_overrides(entity="q").entity == "q"


def test_provision_keys_parse_and_validate() -> None:
    from spark_sb.config.service_bus import ServiceBusConfig
    from spark_sb.core.errors import ConfigError

    base = {
        "primary": {
            "connection_string": "Endpoint=sb://a.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v"
        }
    }
    cfg = ServiceBusConfig.from_dict({**base, "provision": {"tries": 5, "retry_pause": "2s"}})
    assert (cfg.provision_tries, cfg.provision_retry_pause) == (5, 2.0)
    assert ServiceBusConfig.from_dict(base).provision_tries == 3
    with pytest.raises(ConfigError, match=r"provision\.tries: must be an integer >= 1"):
        ServiceBusConfig.from_dict({**base, "provision": {"tries": 0}})


def test_client_kwargs_bound_every_attempt_with_send_timeout() -> None:
    from spark_sb.config.service_bus import ServiceBusConfig

    cs = "Endpoint=sb://a.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v"
    cfg = ServiceBusConfig.from_dict(
        {"primary": {"connection_string": cs}, "send_timeout": "7s", "retry": {"total": 0}}
    )
    assert cfg.client_kwargs() == {
        "retry_total": 0,
        "retry_backoff_factor": 0.8,
        "retry_backoff_max": 120.0,
        "retry_mode": "exponential",
        "try_timeout": 7.0,
    }


def test_a_credential_namespace_on_a_local_emulator_speaks_plain_amqp() -> None:
    """primary.use_development_emulator: fully_qualified_namespace + credential to a local namespace (plain AMQP on
    its port), as UseDevelopmentEmulator=true does in a connection string; round-trips through the options."""
    plain = {"primary.fully_qualified_namespace": "127.0.0.1:5672", "primary.credential.kind": "default"}
    c = ServiceBusConfig.from_options({**plain, "primary.use_development_emulator": "true"})
    assert c.primary.use_development_emulator is True
    assert ServiceBusConfig.from_options(c.to_options()) == c
    assert ServiceBusConfig.from_options(plain).primary.use_development_emulator is False
    with pytest.raises(ConfigError, match="primary.use_development_emulator"):
        ServiceBusConfig.from_options({**plain, "primary.use_development_emulator": "maybe"})


def test_an_endpoint_without_its_scheme_is_refused_when_the_config_is_loaded() -> None:
    """``Endpoint=127.0.0.1:5682`` was accepted here and refused by the SDK only when a client was built, as a bare
    ValueError from inside a task (issue 32): now the load says so, naming the key."""
    conn = "Endpoint=127.0.0.1:5682;SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0"
    with pytest.raises(ConfigError) as refused:
        load_config({"primary": {"connection_string": conn}, "entity": "q"})
    text = str(refused.value)
    assert "primary.connection_string" in text and "sb://" in text and "c2VjcmV0" not in text
    ok = load_config({"primary": {"connection_string": conn.replace("=127", "=sb://127")}, "entity": "q"})
    assert ok.primary.endpoint_host() == "127.0.0.1:5682"
