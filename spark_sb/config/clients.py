"""Building live SDK objects from settings: a ``ServiceBusClient``, a ``ServiceBusAdministrationClient`` and an
azure-identity credential. Called where they are used (executors, the syphon, provisioning on the driver), never
shipped: they are neither picklable nor thread-safe. The settings come from
:class:`~spark_sb.config.service_bus.NamespaceConfig` and :class:`~spark_sb.config.service_bus.CredentialConfig`, whose ``client()``,
``admin_client()`` and ``build()`` call these; this module knows nothing of the configuration's shape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from azure.servicebus import ServiceBusClient
    from azure.servicebus.management import ServiceBusAdministrationClient

__all__ = ["admin_client", "credential", "service_bus_client"]


def credential(
    kind: str, tenant_id: str | None, client_id: str | None, client_secret: str | None
) -> TokenCredential:
    """A live azure-identity credential of ``kind`` (``default``, ``client_secret``, ``managed_identity``)."""
    import azure.identity as identity

    if kind == "client_secret":
        assert tenant_id and client_id and client_secret
        return identity.ClientSecretCredential(tenant_id, client_id, client_secret)
    if kind == "managed_identity":
        if client_id:
            return identity.ManagedIdentityCredential(client_id=client_id)
        return identity.ManagedIdentityCredential()
    kwargs: dict[str, Any] = {}
    if client_id:
        kwargs["managed_identity_client_id"] = client_id
    if tenant_id:
        kwargs["additionally_allowed_tenants"] = [tenant_id]
    return identity.DefaultAzureCredential(**kwargs)


def service_bus_client(
    connection_string: str | None,
    fully_qualified_namespace: str,
    token_credential: TokenCredential | None,
    *,
    plain_amqp: bool = False,
    **options: Any,
) -> ServiceBusClient:
    """A new ``ServiceBusClient``: from the connection string if there is one, else for the namespace with the
    credential (``plain_amqp``: no TLS, the port kept - a local namespace). ``options`` go to the SDK."""
    from azure.servicebus import ServiceBusClient

    if connection_string is not None:
        return ServiceBusClient.from_connection_string(connection_string, **options)
    assert token_credential is not None
    if plain_amqp:
        options.setdefault("use_tls", False)
    return ServiceBusClient(fully_qualified_namespace, token_credential, **options)


def admin_client(
    connection_string: str | None,
    fully_qualified_namespace: str,
    token_credential: TokenCredential | None,
    **options: Any,
) -> ServiceBusAdministrationClient:
    """A new ``ServiceBusAdministrationClient`` (HTTPS): from the connection string if there is one, else for the
    namespace with the credential. ``options`` go to the SDK (``connection_verify=<ca.pem>`` for a local one)."""
    from azure.servicebus.management import ServiceBusAdministrationClient

    if connection_string is not None:
        return ServiceBusAdministrationClient.from_connection_string(connection_string, **options)
    assert token_credential is not None
    return ServiceBusAdministrationClient(fully_qualified_namespace, token_credential, **options)
