"""Connection strings and endpoint hosts (:mod:`spark_sb.config.endpoints`, SPEC S8, B1): a connection string is
parsed without ever echoing it, refused at load - naming the key - when the SDK would refuse or misread it once a
client is built, and the primary's namespace name is derived from its host (asked of the namespace for an
address)."""

from __future__ import annotations

import pytest
from azure.servicebus import ServiceBusClient

from spark_sb.config.endpoints import (
    ConnectionStringInfo,
    derive_namespace_name,
    is_address_host,
    parse_connection_string,
)
from spark_sb.core.errors import ConfigError

KEY = "Qx7TestKey0123456789abcdefWXYZ+/k="
SIG = "Sg7TestSig0123456789xyz"
AUTH = f"SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={KEY}"
SAS = f"SharedAccessSignature=SharedAccessSignature sr=sb%3a%2f%2fns&sig={SIG}&se=1999999999&skn=Send"


def refused(conn: str, key: str = "primary.connection_string") -> str:
    """The error text for ``conn``, checked to name ``key`` and to show no secret."""
    with pytest.raises(ConfigError) as caught:
        parse_connection_string(conn, key)
    text = str(caught.value)
    assert text.startswith(f"{key}: malformed connection string")
    assert [k for k, _ in caught.value.errors] == [key]
    assert KEY not in text and SIG not in text and KEY[:12] not in text
    return text


# ------------------------------------------------------------------------------------------------- parsing
def test_a_connection_string_gives_its_non_secret_parts() -> None:
    info = parse_connection_string(f"Endpoint=sb://contoso.servicebus.windows.net/;{AUTH};EntityPath=orders")
    assert info == ConnectionStringInfo(
        endpoint="sb://contoso.servicebus.windows.net/",
        host="contoso.servicebus.windows.net",
        shared_access_key_name="RootManageSharedAccessKey",
        has_shared_access_key=True,
        has_shared_access_signature=False,
        entity_path="orders",
        use_development_emulator=False,
    )
    assert KEY not in repr(info)


def test_a_local_namespace_keeps_its_port_and_says_it_is_an_emulator() -> None:
    info = parse_connection_string(f"Endpoint=sb://127.0.0.1:5682;{AUTH};UseDevelopmentEmulator=true")
    assert (info.host, info.endpoint, info.use_development_emulator) == (
        "127.0.0.1:5682",
        "sb://127.0.0.1:5682/",
        True,
    )


def test_a_sas_token_is_noted_never_kept() -> None:
    info = parse_connection_string(f"Endpoint=sb://ns.servicebus.windows.net/;{SAS}")
    assert info.has_shared_access_signature and not info.has_shared_access_key
    assert info.shared_access_key_name is None
    assert SIG not in repr(info)


@pytest.mark.parametrize(
    "endpoint",
    [
        "sb://ns.servicebus.windows.net/",
        "sb://ns.servicebus.windows.net",
        "amqps://ns.servicebus.windows.net/",
        "https://ns.servicebus.windows.net",
        " sb://ns.servicebus.windows.net/ ",
        "SB://ns.servicebus.windows.net/",  # the scheme in any case, as the SDK takes it
        "Amqps://ns.servicebus.windows.net",
    ],
)
def test_an_endpoint_is_normalised_to_sb(endpoint: str) -> None:
    info = parse_connection_string(f"Endpoint={endpoint};{AUTH}")
    assert (info.endpoint, info.host) == ("sb://ns.servicebus.windows.net/", "ns.servicebus.windows.net")


def test_part_names_are_case_insensitive_and_a_trailing_semicolon_is_fine() -> None:
    info = parse_connection_string(
        f"endpoint=sb://ns.example/;SHAREDACCESSKEYNAME=Send;sharedaccesskey={KEY};entitypath=q;"
    )
    assert (info.host, info.shared_access_key_name, info.entity_path) == ("ns.example", "Send", "q")
    assert parse_connection_string(f"Endpoint=sb://ns.example/;{AUTH};EntityPath=").entity_path is None


# ------------------------------------------------------------------------------------------ malformed ones
@pytest.mark.parametrize(
    ("conn", "fragment"),
    [
        (AUTH, "Endpoint is missing"),
        (f"Endpoint=;{AUTH}", "Endpoint is missing"),
        (f"Endpoint=sb://ns.example/;Endpoint=sb://other.example/;{AUTH}", "Endpoint given twice"),
        (f"Endpoint=sb://ns.example/;endpoint=sb://ns.example/;{AUTH}", "Endpoint given twice"),
        (f"Endpoint=sb://ns.example/;SharedAccessKey={KEY}", "needs SharedAccessKeyName and SharedAccessKey"),
        (
            "Endpoint=sb://ns.example/;SharedAccessKeyName=Send",
            "needs SharedAccessKeyName and SharedAccessKey",
        ),
        (f"Endpoint=sb://ns.example/;{AUTH};{SAS}", "not both"),
        (f"Endpoint=sb://ns.example/;{AUTH};Password={KEY}", "unknown part 'Password'"),
        (
            f"Endpoint=sb://ns.example/;SharedAccessKeyName=Send;{KEY[:-1]}",
            "every part must look like Name=value",
        ),
        (f"Endpoint=sb://ns.example/;{AUTH};UseDevelopmentEmulator=maybe", "UseDevelopmentEmulator"),
        ("", "Endpoint is missing"),
    ],
)
def test_a_malformed_connection_string_is_refused_naming_the_key_never_echoing_it(
    conn: str, fragment: str
) -> None:
    assert fragment in refused(conn)


def test_an_unknown_part_is_named_only_when_it_looks_like_a_name() -> None:
    """A key pasted without its ``SharedAccessKey=`` is the part's name - a base64 key ends with ``=``: it was shown
    but for its last few characters."""
    assert "unknown part 'Hostname'" in refused(f"Endpoint=sb://ns.example/;{AUTH};Hostname=x")
    for pasted in (KEY, KEY[:24] + "=", "Z" * 40 + "="):
        text = refused(f"Endpoint=sb://ns.example/;SharedAccessKeyName=Send;{pasted}")
        assert "unknown part (not shown)" in text and pasted.rstrip("=")[:8] not in text


@pytest.mark.parametrize(
    "endpoint",
    ["127.0.0.1:5682", "localhost:5682", "ns.servicebus.windows.net", "ns.servicebus.windows.net/"],
)
def test_an_endpoint_without_its_scheme_is_refused_when_loaded(endpoint: str) -> None:
    """The SDK refuses ``Endpoint=127.0.0.1:5682`` ("Invalid Endpoint") only when a client is built, in a task."""
    assert "Endpoint needs its scheme: sb://" in refused(f"Endpoint={endpoint};{AUTH}")


@pytest.mark.parametrize(
    "endpoint", ["sb://", "sb://ns.example/queue", "ftp://ns.example/", "sb:/ns.example", "sb://ns example/"]
)
def test_an_endpoint_that_is_not_a_host_is_refused(endpoint: str) -> None:
    assert "Endpoint must look like sb://<host>[:port]/" in refused(f"Endpoint={endpoint};{AUTH}")


@pytest.mark.parametrize("value", ["True", "TRUE", "tRuE"])
def test_the_emulator_flag_is_lower_case_as_the_sdk_reads_it(value: str) -> None:
    """The SDK takes only ``true`` for the emulator: with ``True`` it speaks TLS on port 5671 to a local namespace
    listening in plain AMQP elsewhere - a connection failure that looks like an outage, and the sink fails over."""
    text = refused(f"Endpoint=sb://127.0.0.1:5682;{AUTH};UseDevelopmentEmulator={value}")
    assert "UseDevelopmentEmulator must be true or false" in text


def test_the_emulator_flag_is_read_as_the_sdk_reads_it_wherever_it_stands() -> None:
    with pytest.raises(ConfigError, match="UseDevelopmentEmulator"):
        parse_connection_string(f"Endpoint=sb://127.0.0.1:5682;UseDevelopmentEmulator=true ;{AUTH}")
    last = parse_connection_string(f"Endpoint=sb://127.0.0.1:5682;{AUTH};UseDevelopmentEmulator=true  ")
    assert last.use_development_emulator  # the whole string is stripped, by the SDK too


def test_false_is_false_whatever_its_case() -> None:
    for value in ("false", "False", "FALSE"):
        info = parse_connection_string(f"Endpoint=sb://ns.example/;{AUTH};UseDevelopmentEmulator={value}")
        assert info.use_development_emulator is False


@pytest.mark.parametrize(
    "conn",
    [
        f"Endpoint=sb://ns.example/;;{AUTH}",
        f";Endpoint=sb://ns.example/;{AUTH}",
        f"Endpoint=sb://ns.example/; {AUTH}",
        f"Endpoint=sb://ns.example/;SharedAccessKeyName =Send;SharedAccessKey={KEY}",
    ],
)
def test_a_connection_string_the_sdk_cannot_split_is_refused_when_loaded(conn: str) -> None:
    """An empty part, or a space around a part's name: the SDK says "blank or malformed", or does not see the
    part at all, only when a client is built."""
    with pytest.raises(ValueError):
        ServiceBusClient.from_connection_string(conn)
    refused(conn)


@pytest.mark.parametrize(
    "conn",
    [
        f"Endpoint=sb://contoso.servicebus.windows.net/;{AUTH}",
        f"Endpoint=sb://127.0.0.1:5682;{AUTH};UseDevelopmentEmulator=true",
        f"Endpoint=sb://127.0.0.1:5682/;{AUTH};UseDevelopmentEmulator=false;EntityPath=q",
        f"Endpoint=amqps://ns.servicebus.windows.net/;{SAS}",
        f"  endpoint=sb://ns.example/;sharedaccesskeyname=Send;sharedaccesskey={KEY};  ",
        f"Endpoint=SB://ns.servicebus.windows.net/;{AUTH}",
        f"Endpoint=SB://127.0.0.1:5682;{AUTH};UseDevelopmentEmulator=true",
    ],
)
def test_what_is_accepted_the_sdk_reads_the_same_way(conn: str) -> None:
    info = parse_connection_string(conn)
    client = ServiceBusClient.from_connection_string(conn)
    try:
        assert client.fully_qualified_namespace.split(":")[0] == info.host.split(":")[0]
        assert client._config.use_tls is not info.use_development_emulator
    finally:
        client.close()


# ----------------------------------------------------------------------------------------------- hosts
@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "127.0.0.1:5671",
        "sb://10.1.2.3:5672/",
        "[::1]:5671",
        "::1",
        "localhost",
        "LOCALHOST:5672",
        "localhost.",
        "sb://broker.localhost/",
    ],
)
def test_an_ip_or_localhost_is_an_address_host(host: str) -> None:
    assert is_address_host(host)


@pytest.mark.parametrize(
    "host",
    [
        "contoso.servicebus.windows.net",
        "contoso.servicebus.windows.net:5671",
        "amqps://contoso.servicebus.windows.net/",
        "localhost-ns.example",
        "10.0.0.1.example.com",
        "256.1.1.1",
        "sbhost",
    ],
)
def test_a_name_is_a_namespace_host(host: str) -> None:
    assert not is_address_host(host)


# ----------------------------------------------------------------------------------------- namespace names
def never_asked() -> str:
    raise AssertionError("the namespace was asked its name")


@pytest.mark.parametrize(
    "host",
    [
        "contoso.servicebus.windows.net",
        "contoso.servicebus.windows.net:5671",
        "sb://contoso.servicebus.windows.net/",
        "contoso.servicebus.windows.net.",
        " contoso.servicebus.windows.net ",
    ],
)
def test_a_namespace_host_gives_its_first_label(host: str) -> None:
    assert derive_namespace_name(host, lookup=never_asked) == "contoso"


def test_a_given_name_wins_and_nothing_is_asked() -> None:
    assert derive_namespace_name("127.0.0.1:5671", override=" primary ", lookup=never_asked) == "primary"
    assert derive_namespace_name("contoso.servicebus.windows.net", override="other") == "other"
    assert (
        derive_namespace_name("contoso.servicebus.windows.net", override="   ") == "contoso"
    )  # blank: not given


@pytest.mark.parametrize("host", ["127.0.0.1:5671", "localhost:5672", "[::1]:5671"])
def test_an_address_asks_the_namespace_its_name(host: str) -> None:
    asked: list[bool] = []

    def lookup() -> str:
        asked.append(True)
        return "sbemulatorns"

    assert derive_namespace_name(host, lookup=lookup) == "sbemulatorns"
    assert asked == [True]


def test_an_address_without_a_way_to_ask_is_an_error_saying_what_to_do() -> None:
    with pytest.raises(ConfigError) as caught:
        derive_namespace_name(" 127.0.0.1:5671 ")
    text = str(caught.value)
    assert text.startswith("primary.namespace_name: the endpoint 127.0.0.1:5671 is an address")
    assert "set primary.namespace_name" in text and "resolve_primary_namespace_name" in text
    assert (
        caught.value.errors[0][0] == "primary.namespace_name"
    )  # the full key, as every other error names it


def test_a_namespace_that_reports_no_name_is_an_error() -> None:
    with pytest.raises(
        ConfigError, match=r"^primary\.namespace_name: the namespace at '127.0.0.1' did not report its name"
    ):
        derive_namespace_name("127.0.0.1:5671", lookup=lambda: "")


@pytest.mark.parametrize("host", ["", "   ", "sb://", "."])
def test_no_host_no_name(host: str) -> None:
    with pytest.raises(
        ConfigError,
        match=r"^primary\.namespace_name: cannot derive a namespace name from an empty endpoint host",
    ):
        derive_namespace_name(host, lookup=never_asked)
