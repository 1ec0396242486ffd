"""Secrets of the configuration (:mod:`spark_sb.config.secret`): a :class:`Secret` never shows its value (repr, str,
formatting, logs), registers it (and a connection string's key) for redaction, also when unpickled; a
:class:`Resolver` substitutes ``${env:NAME}`` and ``{{secrets/<scope>/<key>}}`` references and reports a reference it
cannot resolve by key, never with a value. Assertions here test ``leaked`` flags, so that a failure never prints a
secret."""

from __future__ import annotations

import logging
import pickle
import sys
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

import spark_sb.config.secret as secret_module
import spark_sb.core.redact as redact_module
from spark_sb.config.secret import Resolver, Secret
from spark_sb.core.errors import ConfigError
from spark_sb.core.redact import redact

KEY = "SecretTestKey0123456789abcdef="
CS = f"Endpoint=sb://contoso.servicebus.windows.net/;SharedAccessKeyName=Send;SharedAccessKey={KEY}"
ENV = {"SB_PRIMARY": CS, "SB_OTHER": "OtherSecretValue-42", "SB_NAME": "orders"}


def _shows(value: str, text: str) -> bool:
    return value in text


# ------------------------------------------------------------------------------------------------ Secret
def test_secret_objects_register_themselves() -> None:
    Secret("Endpoint=sb://h/;SharedAccessKeyName=k;SharedAccessKey=SelfRegisteredKey77")
    leaked = "SelfRegisteredKey77" in redact("oops SelfRegisteredKey77 leaked raw")
    assert not leaked


def test_a_secret_never_shows_its_value() -> None:
    s = Secret(CS, "${env:SB_PRIMARY}")

    @dataclass
    class Holder:
        connection_string: Secret

    texts = [
        repr(s),
        str(s),
        f"{s}",
        f"{s!r}",
        format(s),
        repr([s]),
        repr({"cs": s}),
        repr(Holder(s)),
    ]
    leaked = [_shows(KEY, t) or _shows(CS, t) for t in texts]
    assert leaked == [False] * len(texts)
    assert repr(s) == str(s) == "Secret('***')"
    assert (
        repr(Holder(s))
        == "test_a_secret_never_shows_its_value.<locals>.Holder(connection_string=Secret('***'))"
    )


def test_a_secret_logged_as_an_argument_shows_no_value_even_without_a_redacting_filter(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="test_secret"):
        logging.getLogger("test_secret").info("connecting with %s (%r)", Secret(CS), Secret(CS))
    (record,) = caplog.records
    leaked = _shows(KEY, record.getMessage())
    assert not leaked
    assert record.getMessage() == "connecting with Secret('***') (Secret('***'))"


def test_reveal_gives_the_value_and_the_reference_is_kept() -> None:
    s = Secret(CS, "${env:SB_PRIMARY}")
    same = s.reveal() == CS
    assert same and s.reference == "${env:SB_PRIMARY}"
    assert Secret(CS).reference is None


def test_secrets_are_equal_by_value_and_reference() -> None:
    assert Secret(CS, "${env:A}") == Secret(CS, "${env:A}")
    assert hash(Secret(CS, "${env:A}")) == hash(Secret(CS, "${env:A}"))
    assert Secret(CS, "${env:A}") != Secret(CS, "${env:B}")
    assert Secret(CS) != Secret(CS + "x")
    assert Secret(CS) != CS


@pytest.mark.parametrize("value", [b"bytes-value-1234", None, 12345678], ids=lambda v: type(v).__name__)
def test_a_secret_value_must_be_text_and_the_error_does_not_show_it(value: Any) -> None:
    with pytest.raises(TypeError) as caught:
        Secret(value)
    assert str(caught.value) == "Secret value must be a str"


def test_a_secret_registers_its_value_and_the_key_parts_of_a_connection_string() -> None:
    key = "RegisteredKeyPart-0123456789="
    signature = "RegisteredSignaturePart-0123456789"
    Secret(f"Endpoint=sb://h/;SharedAccessKeyName=k;SharedAccessKey={key}")
    Secret(f"Endpoint=sb://h/;SharedAccessSignature={signature};EntityPath=q")
    Secret("a-plain-literal-secret")
    said = redact(f"key {key} signature {signature} literal a-plain-literal-secret")
    leaked = [_shows(v, said) for v in (key, signature, "a-plain-literal-secret")]
    assert leaked == [False, False, False]
    assert said == "key *** signature *** literal ***"


def test_an_unpickled_secret_is_equal_and_registered_again(monkeypatch: pytest.MonkeyPatch) -> None:
    value = "UnpickledSecretValue-0123456789"
    pickled = pickle.dumps(Secret(value, "${env:SB_X}"))
    monkeypatch.setattr(redact_module, "_registered", frozenset())  # a fresh process: an executor
    scrubbed = redact(f"got {value}") == "got ***"
    assert not scrubbed
    back = pickle.loads(pickled)
    scrubbed = redact(f"got {value}") == "got ***"  # before any other Secret of the value registers it
    assert scrubbed
    same = back == Secret(value, "${env:SB_X}")
    assert same and type(back) is Secret


# ------------------------------------------------------------------------------------------------ Resolver
@pytest.mark.parametrize(
    ("raw", "resolved"),
    [
        ("${env:SB_NAME}", "orders"),
        ("prefix-${env:SB_NAME}-suffix", "prefix-orders-suffix"),
        ("${env:SB_NAME}/${env:SB_NAME}", "orders/orders"),
        (
            "Endpoint=sb://h/;SharedAccessKeyName=${env:SB_NAME};SharedAccessKey=x",
            "Endpoint=sb://h/;SharedAccessKeyName=orders;SharedAccessKey=x",
        ),
    ],
)
def test_environment_references_are_substituted(raw: str, resolved: str) -> None:
    assert Resolver(ENV).resolve("k", raw) == (resolved, True)


@pytest.mark.parametrize(
    "raw", ["orders", "", "$env:SB_NAME", "${env:1BAD}", "${ENV:SB_NAME}", "{{secrets/only-scope}}"]
)
def test_text_without_a_reference_is_returned_as_it_is(raw: str) -> None:
    assert Resolver(ENV).resolve("k", raw) == (raw, False)


def test_an_unset_variable_is_an_error_naming_the_key_and_the_variable_only() -> None:
    with pytest.raises(ConfigError) as caught:
        Resolver(ENV).resolve("primary.connection_string", "${env:SB_PRIMARY}${env:SB_MISSING}")
    leaked = _shows(KEY, str(caught.value)) or _shows(ENV["SB_OTHER"], str(caught.value))
    assert not leaked
    assert caught.value.errors == [
        (
            "primary.connection_string",
            "environment variable 'SB_MISSING' (referenced as ${env:SB_MISSING}) is not set",
        )
    ]


class _Dbutils:
    """``dbutils`` as the resolver uses it: ``dbutils.secrets.get(scope=..., key=...)``."""

    def __init__(
        self, values: dict[tuple[str, str], str] | None = None, fails: Exception | None = None
    ) -> None:
        self.asked: list[tuple[str, str]] = []

        def get(scope: str, key: str) -> str:
            self.asked.append((scope, key))
            if fails is not None:
                raise fails
            return (values or {})[(scope, key)]

        self.secrets = SimpleNamespace(get=get)


def test_databricks_references_are_read_from_dbutils_secrets() -> None:
    dbutils = _Dbutils({("sb", "primary"): CS, ("sb", "name"): "orders"})
    resolver = Resolver({}, dbutils)
    value, had = resolver.resolve("k", "{{secrets/sb/primary}}")
    same = value == CS
    assert same and had
    assert resolver.resolve("k", "q-{{secrets/sb/name}}") == ("q-orders", True)
    assert dbutils.asked == [("sb", "primary"), ("sb", "name")]


def test_a_databricks_secret_that_cannot_be_read_is_reported_by_its_error_type_only() -> None:
    dbutils = _Dbutils(fails=PermissionError(f"denied, the value was {KEY}"))
    with pytest.raises(ConfigError) as caught:
        Resolver({}, dbutils).resolve("primary.connection_string", "{{secrets/sb/primary}}")
    leaked = _shows(KEY, str(caught.value))
    assert not leaked
    assert str(caught.value) == (
        "primary.connection_string: cannot read Databricks secret {{secrets/sb/primary}}: PermissionError"
    )
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_a_databricks_reference_outside_databricks_says_to_use_an_environment_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION", raising=False)
    with pytest.raises(ConfigError) as caught:
        Resolver({}).resolve("k", "{{secrets/sb/primary}}")
    assert str(caught.value) == (
        "k: secret reference {{secrets/sb/primary}} needs Databricks (dbutils.secrets) and this is not a "
        "Databricks runtime; use ${env:NAME} instead"
    )


def test_a_databricks_reference_in_a_process_without_dbutils_says_how_to_pass_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "15.4")
    monkeypatch.setattr(secret_module, "_find_dbutils", lambda: None)
    with pytest.raises(ConfigError) as caught:
        Resolver({}).resolve("k", "{{secrets/sb/primary}}")
    text = str(caught.value)
    assert text.startswith(
        "k: secret reference {{secrets/sb/primary}} needs dbutils.secrets, which this process"
    )
    assert "(SB_NAME={{secrets/sb/primary}}) and give ${env:SB_NAME}" in text
    assert "foreachBatch(ServiceBusSink(config))" in text


def test_dbutils_is_looked_up_once_and_only_for_a_databricks_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found = _Dbutils({("s", "a"): "one", ("s", "b"): "two"})
    lookups: list[int] = []
    monkeypatch.setattr(secret_module, "_find_dbutils", lambda: lookups.append(1) or found)
    resolver = Resolver(ENV)
    resolver.resolve("k", "${env:SB_NAME}")
    assert lookups == []
    assert resolver.resolve("k", "{{secrets/s/a}}+{{secrets/s/b}}") == ("one+two", True)
    assert resolver.resolve("k", "{{secrets/s/a}}") == ("one", True)
    assert lookups == [1]
    given = Resolver({}, found)
    given.resolve("k", "{{secrets/s/b}}")
    assert lookups == [1]


def test_a_failed_lookup_of_dbutils_is_not_repeated(monkeypatch: pytest.MonkeyPatch) -> None:
    lookups: list[int] = []
    monkeypatch.setattr(secret_module, "_find_dbutils", lambda: lookups.append(1))
    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION", raising=False)
    resolver = Resolver({})
    for _ in range(2):
        with pytest.raises(ConfigError):
            resolver.resolve("k", "{{secrets/s/a}}")
    assert lookups == [1]


def test_an_environment_reference_is_substituted_before_a_databricks_one() -> None:
    dbutils = _Dbutils({("sb", "primary"): "from-databricks"})
    resolver = Resolver({"SB_REF": "{{secrets/sb/primary}}"}, dbutils)
    assert resolver.resolve("k", "${env:SB_REF}") == ("from-databricks", True)


# ------------------------------------------------------------------------------------------------ dbutils
def test_no_dbutils_outside_databricks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION", raising=False)
    monkeypatch.setitem(sys.modules, "IPython", _ipython({"dbutils": object()}))
    assert secret_module._find_dbutils() is None


def _ipython(user_ns: dict[str, Any]) -> Any:
    return SimpleNamespace(get_ipython=lambda: SimpleNamespace(user_ns=user_ns))


def test_a_databricks_notebook_gives_its_dbutils(monkeypatch: pytest.MonkeyPatch) -> None:
    dbutils = object()
    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "15.4")
    monkeypatch.setitem(sys.modules, "IPython", _ipython({"dbutils": dbutils}))
    assert secret_module._find_dbutils() is dbutils


def test_a_databricks_process_without_a_notebook_or_pyspark_dbutils_has_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "15.4")
    monkeypatch.setitem(sys.modules, "IPython", _ipython({}))
    monkeypatch.setitem(sys.modules, "pyspark.dbutils", None)  # not a Databricks runtime's pyspark
    assert secret_module._find_dbutils() is None


def test_a_resolvers_repr_shows_neither_the_environment_nor_dbutils() -> None:
    """The environment holds connection strings (``os.environ``): a traceback with locals or a log of the resolver
    must not show them."""
    resolver = Resolver({"SB_PRIMARY": CS}, dbutils=SimpleNamespace(token=KEY))
    text = repr(resolver)
    leaked = _shows(KEY, text) or _shows(CS, text) or "SB_PRIMARY" in text
    assert not leaked
    assert text.startswith("Resolver(")
