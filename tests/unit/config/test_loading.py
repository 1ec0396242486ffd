"""Reading configuration sources (:mod:`spark_sb.config.loading`, SPEC S8): a YAML file, nested or dotted dicts and
Spark options become one flat mapping; :func:`config_fields` reads it through the settings table, resolves secret
references, and gathers every problem into one error that names each key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spark_sb.config.loading import config_fields, flatten, option_keys, read_yaml, resolver
from spark_sb.config.namespace import CredentialConfig, NamespaceConfig, RetryConfig
from spark_sb.config.secret import Resolver, Secret
from spark_sb.core.errors import ConfigError

KEY = "LoadingTestKey0123456789abcdef="
CS = f"Endpoint=sb://contoso.servicebus.windows.net/;SharedAccessKeyName=Send;SharedAccessKey={KEY}"
CS2 = f"Endpoint=sb://contoso-dr.servicebus.windows.net/;SharedAccessKeyName=Send;SharedAccessKey={KEY}"
ENV = {"SB_PRIMARY": CS, "SB_SECONDARY": CS2}


def fields_of(flat: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
    return config_fields(flat, resolver(ENV if env is None else env, None))


def error_of(flat: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        fields_of(flat)
    return caught.value


# ----------------------------------------------------------------------------------------------- read_yaml
def test_a_yaml_file_gives_its_settings_as_written(tmp_path: Path) -> None:
    path = tmp_path / "sb.yaml"
    path.write_text(
        "primary:\n  connection_string: ${env:SB_PRIMARY}\nentity: orders\nretry.mode: fixed\nsyphon:\n"
        "  batch_size: 50\n",
        encoding="utf-8",
    )
    assert read_yaml(path) == {
        "primary": {"connection_string": "${env:SB_PRIMARY}"},
        "entity": "orders",
        "retry.mode": "fixed",
        "syphon": {"batch_size": 50},
    }
    assert read_yaml(str(path)) == read_yaml(path)


def test_an_empty_yaml_file_has_no_settings(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing yet\n", encoding="utf-8")
    assert read_yaml(path) == {}


def test_a_missing_file_is_a_config_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=r"cannot read config file '.*nope\.yaml'"):
        read_yaml(missing)


def test_invalid_yaml_is_reported_by_line_without_showing_the_text(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(f"entity: orders\nprimary:\n  connection_string: '{CS}\n  other: [\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        read_yaml(path)
    text = str(caught.value)
    assert "bad.yaml" in text and "is not valid YAML at line" in text
    assert KEY not in text and "SharedAccessKey" not in text


@pytest.mark.parametrize("body", ["- entity\n- orders\n", "just a string\n", "42\n"])
def test_the_top_level_of_a_yaml_file_is_a_mapping(tmp_path: Path, body: str) -> None:
    path = tmp_path / "list.yaml"
    path.write_text(body, encoding="utf-8")
    with pytest.raises(ConfigError, match="the top level must be a mapping of settings"):
        read_yaml(path)


# ------------------------------------------------------------------------------------------------- flatten
def test_nested_dotted_and_mixed_dicts_flatten_alike() -> None:
    nested = {"primary": {"credential": {"kind": "default"}}, "retry": {"total": 0}, "entity": "q"}
    dotted = {"primary.credential.kind": "default", "retry.total": 0, "entity": "q"}
    mixed = {"primary": {"credential.kind": "default"}, "retry.total": 0, "entity": "q"}
    assert flatten(nested) == flatten(dotted) == flatten(mixed) == dotted


def test_an_empty_section_gives_no_key() -> None:
    assert flatten({"secondary": {}, "entity": "q"}) == {"entity": "q"}


def test_a_key_given_nested_and_dotted_is_an_error_naming_it() -> None:
    with pytest.raises(ConfigError) as caught:
        flatten({"retry": {"total": 0}, "retry.total": 1})
    assert caught.value.errors == [("retry.total", "given twice (nested and dotted)")]


def test_keys_must_be_strings() -> None:
    with pytest.raises(ConfigError, match=r"^syphon\.1: keys must be strings"):
        flatten({"syphon": {1: "x"}})


def test_flatten_leaves_its_input_alone() -> None:
    nested = {"retry": {"total": 0}}
    flatten(nested)
    assert nested == {"retry": {"total": 0}}


# --------------------------------------------------------------------------------------------- option_keys
def test_option_keys_are_case_insensitive_and_trimmed() -> None:
    assert option_keys({" Primary.Connection_String ": "x", "ENTITY": "q", "retry.mode": "fixed"}) == {
        "primary.connection_string": "x",
        "entity": "q",
        "retry.mode": "fixed",
    }


def test_an_option_given_twice_in_different_cases_is_an_error() -> None:
    with pytest.raises(ConfigError) as caught:
        option_keys({"entity": "a", "Entity": "b"})
    assert caught.value.errors == [("entity", "given twice (option keys are case-insensitive)")]


# ------------------------------------------------------------------------------------------------ resolver
def test_the_resolver_reads_the_given_environment_or_the_process_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SB_LOADING_TEST", "from-process")
    assert resolver({"SB_LOADING_TEST": "given"}, None).resolve("k", "${env:SB_LOADING_TEST}") == (
        "given",
        True,
    )
    assert resolver(None, None).resolve("k", "${env:SB_LOADING_TEST}") == ("from-process", True)
    assert isinstance(resolver(None, None), Resolver)


# ------------------------------------------------------------------------------------------- config_fields
def test_raw_values_are_read_into_the_configurations_types() -> None:
    got = fields_of(
        {
            "primary.connection_string": "${env:SB_PRIMARY}",
            "entity": "orders",
            "backlog_queue_count": "4",
            "failover_interval": "5m",
            "client_cache": "no",
            "retry.backoff_factor": "0.5",
            "retry.mode": "fixed",
            "syphon.prefetch": 10,
            "columns.body": "payload",
        }
    )
    assert (got["entity"], got["backlog_queue_count"], got["failover_interval"]) == ("orders", 4, 300.0)
    assert got["client_cache"] is False and got["syphon_prefetch"] == 10
    assert got["retry"] == RetryConfig(backoff_factor=0.5, mode="fixed")
    assert got["columns"] == {"body": "payload"}
    assert got["secondary"] is None and got["extra"] == {}
    # settings not given are left to the configuration's defaults
    assert "send_timeout" not in got and "probe_mode" not in got


def test_secret_references_are_resolved_and_remembered() -> None:
    got = fields_of(
        {
            "primary.connection_string": "${env:SB_PRIMARY}",
            "secondary.connection_string": "${env:SB_SECONDARY}",
        }
    )
    primary, secondary = got["primary"], got["secondary"]
    assert isinstance(primary, NamespaceConfig) and isinstance(secondary, NamespaceConfig)
    assert primary.connection_string == Secret(CS, "${env:SB_PRIMARY}")
    assert primary.connection_string.reference == "${env:SB_PRIMARY}"
    assert secondary.endpoint_host() == "contoso-dr.servicebus.windows.net"


def test_a_literal_secret_has_no_reference() -> None:
    got = fields_of({"primary.connection_string": CS})
    assert got["primary"].connection_string.reveal() == CS
    assert got["primary"].connection_string.reference is None


def test_a_reference_to_an_unset_variable_names_the_key_and_the_variable_only() -> None:
    err = error_of({"primary.connection_string": "${env:SB_NOT_SET}"})
    assert err.errors[0][0] == "primary.connection_string"
    assert "'SB_NOT_SET'" in str(err) and "is not set" in str(err)
    # the missing primary is not reported a second time
    assert [k for k, _ in err.errors] == ["primary.connection_string"]


def test_a_credential_namespace_is_built_from_its_parts() -> None:
    got = fields_of(
        {
            "primary.fully_qualified_namespace": "contoso.servicebus.windows.net",
            "primary.credential.client_id": "client-1",
            "primary.use_development_emulator": "true",
            "primary.namespace_name": "contoso",
        }
    )
    primary = got["primary"]
    assert primary.credential == CredentialConfig(kind="default", client_id="client-1")
    assert primary.use_development_emulator is True and primary.namespace_name == "contoso"
    assert primary.connection_string is None


def test_user_keys_are_kept_as_text_unread() -> None:
    got = fields_of(
        {"primary.connection_string": CS, "x-owner": "team", "x-cost.centre": 42, "x-empty": None}
    )
    assert got["extra"] == {"x-owner": "team", "x-cost.centre": "42", "x-empty": ""}


def test_a_key_without_a_value_is_left_to_its_default() -> None:
    got = fields_of({"primary.connection_string": CS, "entity": None, "secondary.connection_string": None})
    assert "entity" not in got and got["secondary"] is None


def test_every_problem_is_reported_at_once_each_under_its_key() -> None:
    err = error_of(
        {
            "primary.connection_string": CS,
            "entitiy": "orders",
            "backlog_queue_count": "many",
            "columns.bdy": "payload",
            "retry.mode": "linear",
        }
    )
    keys = [k for k, _ in err.errors]
    assert keys == ["entitiy", "backlog_queue_count", "columns.bdy", "retry.mode"]
    messages = dict(err.errors)
    assert messages["entitiy"] == "unknown key (did you mean 'entity'?)"
    assert messages["columns.bdy"].startswith("unknown column 'bdy' (did you mean 'body'?)")
    assert "is not one of 'exponential', 'fixed'" in messages["retry.mode"]
    assert str(err) == "; ".join(f"{k}: {m}" for k, m in err.errors)


def test_a_configuration_needs_a_primary() -> None:
    err = error_of({"entity": "orders"})
    assert err.errors == [
        ("primary", "required (primary.connection_string or primary.fully_qualified_namespace)")
    ]


def test_a_secret_that_cannot_be_read_is_never_shown() -> None:
    err = error_of({"primary.connection_string": "   ", "primary.credential.client_secret": 12345678})
    assert [k for k, _ in err.errors] == ["primary.connection_string", "primary.credential.client_secret"]
    assert "12345678" not in str(err)
