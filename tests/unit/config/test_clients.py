"""Building live SDK objects from settings (:mod:`spark_sb.config.clients`): the azure-identity credential of each
kind, a ``ServiceBusClient`` and a ``ServiceBusAdministrationClient`` from a connection string or from a namespace and
a credential. The SDK objects are real; building them is offline (they connect on first use, never here)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import azure.identity
import pytest
from azure.servicebus import ServiceBusClient
from azure.servicebus.management import ServiceBusAdministrationClient

from spark_sb.config.clients import admin_client, credential, service_bus_client

#: A made-up client secret: a failed assertion shows where it went, never the value (see ``_Recorder``).
CLIENT_SECRET = "ClientsTestSecret~0123456789"
#: A made-up key: nothing here connects.
CS = "Endpoint=sb://contoso.servicebus.windows.net/;SharedAccessKeyName=Send;SharedAccessKey=ClientsTestKey0123456789="


class _Recorder:
    """Stands in for an azure-identity credential class: records how it was called."""

    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        args = tuple("<the client secret>" if a == CLIENT_SECRET else a for a in args)
        type(self).calls.append((type(self).__name__, args, kwargs))


@pytest.fixture
def identity_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
    for name in ("ClientSecretCredential", "ManagedIdentityCredential", "DefaultAzureCredential"):
        monkeypatch.setattr(azure.identity, name, type(name, (_Recorder,), {"calls": calls}))
    return calls


@pytest.fixture
def closing() -> Iterator[list[Any]]:
    """Clients to close after the test."""
    clients: list[Any] = []
    yield clients
    for client in clients:
        client.close()


# --------------------------------------------------------------------------------------------- credential
@pytest.mark.parametrize(
    ("settings", "call"),
    [
        (
            ("client_secret", "tenant-1", "client-1", CLIENT_SECRET),
            ("ClientSecretCredential", ("tenant-1", "client-1", "<the client secret>"), {}),
        ),
        (
            ("managed_identity", None, "client-1", None),
            ("ManagedIdentityCredential", (), {"client_id": "client-1"}),
        ),
        (("managed_identity", "tenant-1", None, None), ("ManagedIdentityCredential", (), {})),
        (("default", None, None, None), ("DefaultAzureCredential", (), {})),
        (
            ("default", "tenant-1", "client-1", None),
            (
                "DefaultAzureCredential",
                (),
                {"managed_identity_client_id": "client-1", "additionally_allowed_tenants": ["tenant-1"]},
            ),
        ),
        (
            ("default", "tenant-1", None, None),
            ("DefaultAzureCredential", (), {"additionally_allowed_tenants": ["tenant-1"]}),
        ),
    ],
    ids=[
        "client-secret",
        "managed-identity-user",
        "managed-identity-system",
        "default",
        "default-ids",
        "default-tenant",
    ],
)
def test_each_kind_of_credential_is_built_from_its_settings(
    identity_calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]],
    settings: tuple[str, str | None, str | None, str | None],
    call: tuple[str, tuple[Any, ...], dict[str, Any]],
) -> None:
    built = credential(*settings)
    assert type(built).__name__ == call[0]
    assert identity_calls == [call]


@pytest.mark.parametrize(
    ("settings", "kind"),
    [
        (("client_secret", "tenant-1", "client-1", CLIENT_SECRET), azure.identity.ClientSecretCredential),
        (("managed_identity", None, "client-1", None), azure.identity.ManagedIdentityCredential),
        (("default", "tenant-1", "client-1", None), azure.identity.DefaultAzureCredential),
    ],
    ids=["client-secret", "managed-identity", "default"],
)
def test_the_sdk_takes_the_settings_of_each_kind(
    settings: tuple[str, str | None, str | None, str | None], kind: type
) -> None:
    built = credential(*settings)
    assert type(built) is kind
    close = getattr(built, "close", None)
    if close is not None:
        close()


# --------------------------------------------------------------------------------------------- ServiceBusClient
def test_a_connection_string_gives_the_client_of_its_namespace_with_the_options(closing: list[Any]) -> None:
    token = credential("client_secret", "t", "c", CLIENT_SECRET)
    client = service_bus_client(
        CS, "ignored.servicebus.windows.net", token, retry_total=3, retry_backoff_max=30
    )
    closing.append(client)
    assert type(client) is ServiceBusClient
    assert client.fully_qualified_namespace == "contoso.servicebus.windows.net"
    assert client._credential is not token  # the connection string's key, not the credential
    assert (client._config.retry_total, client._config.retry_backoff_max) == (3, 30)
    assert client._config.use_tls is True


def test_a_namespace_and_a_credential_give_a_tls_client(closing: list[Any]) -> None:
    token = credential("client_secret", "t", "c", CLIENT_SECRET)
    client = service_bus_client(None, "contoso.servicebus.windows.net", token, retry_total=1)
    closing.append(client)
    assert client.fully_qualified_namespace == "contoso.servicebus.windows.net"
    assert client._credential is token
    assert client._config.use_tls is True and client._config.retry_total == 1


def test_plain_amqp_turns_tls_off_and_keeps_the_port_unless_told_otherwise(closing: list[Any]) -> None:
    token = credential("client_secret", "t", "c", CLIENT_SECRET)
    plain = service_bus_client(None, "localhost:5672", token, plain_amqp=True)
    told = service_bus_client(None, "localhost:5671", token, plain_amqp=True, use_tls=True)
    closing.extend([plain, told])
    assert (plain._config.hostname, plain._config.use_tls) == ("localhost:5672", False)
    assert told._config.use_tls is True


# --------------------------------------------------------------------------------------------- administration
def test_an_admin_client_from_a_connection_string_takes_its_namespace_and_the_options(
    closing: list[Any],
) -> None:
    admin = admin_client(CS, "ignored.servicebus.windows.net", None, connection_verify="/tmp/local-ca.pem")
    closing.append(admin)
    assert type(admin) is ServiceBusAdministrationClient
    assert admin.fully_qualified_namespace == "contoso.servicebus.windows.net"
    assert admin._pipeline._transport.connection_config.verify == "/tmp/local-ca.pem"


def test_an_admin_client_for_a_namespace_uses_the_credential(closing: list[Any]) -> None:
    token = credential("client_secret", "t", "c", CLIENT_SECRET)
    admin = admin_client(None, "contoso.servicebus.windows.net", token)
    closing.append(admin)
    assert admin.fully_qualified_namespace == "contoso.servicebus.windows.net"
    assert admin._credential is token
    assert admin._pipeline._transport.connection_config.verify is True
