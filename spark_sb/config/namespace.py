"""The parts of a configuration that build live SDK objects: a namespace (:class:`NamespaceConfig`), its Azure AD
credential (:class:`CredentialConfig`) and the retry settings (:class:`RetryConfig`).

Frozen, validated, picklable settings: built on the driver inside a :class:`~spark_sb.config.service_bus.ServiceBusConfig`
and shipped to executors with it. :meth:`NamespaceConfig.client`, :meth:`NamespaceConfig.admin_client` and
:meth:`CredentialConfig.build` make live objects (through :mod:`spark_sb.config.clients`) where they are used - on the
executor, or on the driver for provisioning - and those are neither picklable nor thread-safe: never ship them.
Errors are :class:`~spark_sb.core.errors.ConfigError` naming the key (under ``primary`` / ``secondary``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_sb.config import clients
from spark_sb.config.endpoints import ConnectionStringInfo, derive_namespace_name, parse_connection_string
from spark_sb.config.secret import Secret
from spark_sb.config.settings import CREDENTIAL_KINDS, RETRY_SETTINGS, one_of
from spark_sb.core.errors import ConfigError
from spark_sb.core.hosts import name_and_port

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from azure.servicebus import ServiceBusClient
    from azure.servicebus.management import ServiceBusAdministrationClient

__all__ = ["CredentialConfig", "NamespaceConfig", "RetryConfig"]

_err = ConfigError.at


@dataclass(frozen=True)
class CredentialConfig:
    """Azure AD credential settings (azure-identity). Built into a live credential on the executor."""

    kind: str = "default"
    tenant_id: str | None = None
    client_id: str | None = None
    client_secret: Secret | None = None

    def check(self, prefix: str) -> None:
        """Raise :class:`ConfigError` (keys under ``prefix``) if the settings do not fit ``kind``."""
        if self.kind not in CREDENTIAL_KINDS:
            raise one_of(f"{prefix}.kind", self.kind, CREDENTIAL_KINDS)
        if self.client_secret is not None and not isinstance(self.client_secret, Secret):
            raise _err(f"{prefix}.client_secret", "must be a Secret")
        if self.kind == "client_secret":
            for name in ("tenant_id", "client_id", "client_secret"):
                if not getattr(self, name):
                    raise _err(f"{prefix}.{name}", "required when kind is 'client_secret'")
        elif self.client_secret is not None:
            raise _err(
                f"{prefix}.client_secret", f"only used when kind is 'client_secret' (kind is {self.kind!r})"
            )
        if self.kind == "managed_identity" and self.tenant_id:
            # a managed identity belongs to the machine's tenant: ManagedIdentityCredential takes no tenant
            raise _err(
                f"{prefix}.tenant_id",
                f"not used with {prefix}.kind 'managed_identity' (the identity's own tenant is used): remove it, "
                "or use kind 'client_secret' or 'default'",
            )

    def build(self) -> TokenCredential:
        """A live azure-identity credential. Call where the client is built (executor), never pickle it."""
        secret = self.client_secret.reveal() if self.client_secret is not None else None
        return clients.credential(self.kind, self.tenant_id, self.client_id, secret)


@dataclass(frozen=True)
class RetryConfig:
    """Retry settings: the paired sender's back-off between attempts, and the SDK's own retries stated explicitly.

    ``backoff_factor``, ``backoff_max`` and ``mode`` shape the paired sender's attempt loop (read into its
    :class:`~spark_sb.failover.decisions.RetryPolicy`): the pause between tries of a send doubles from ``backoff_factor`` up
    to ``backoff_max``, or is ``backoff_factor`` every time with ``mode: fixed``. The loop keeps trying until the
    failover timer runs out, whatever these are, so failover is on time (SPEC B3).

    ``total`` is the SDK's own retry count inside one call, and it is 0: every client the sink, the syphon and
    provisioning build goes without SDK retries (:meth:`client_kwargs`), because each layer retries itself within
    its deadlines - the sender's attempt loop, the syphon's receive lanes, provisioning's rounds of tries - and an
    SDK retry inside a call would outlast them. ``retry.total`` once promised SDK retries to the syphon's receivers
    and the admin client that no client made; a config that sets another count still loads, with a
    ``FutureWarning`` naming the key, and its clients get 0 all the same.
    """

    total: int = 0
    backoff_factor: float = 0.8
    backoff_max: float = 120.0
    mode: str = "exponential"

    def check(self, prefix: str = "retry") -> None:
        for s in RETRY_SETTINGS:
            s.check(getattr(self, s.attr), f"{prefix}.{s.attr}", self)
        self.check_together(prefix)

    def check_together(self, prefix: str = "retry") -> None:
        """The settings that cannot work together (each one valid): a longest pause below the first. The paired
        sender raises its cap to ``backoff_factor`` then (``PairedSender``: ``backoff_cap = max(base, backoff_max)``),
        so ``backoff_max`` would not be honoured, in either mode."""
        if self.backoff_max < self.backoff_factor:
            raise _err(
                f"{prefix}.backoff_max",
                f"{self.backoff_max:g} is below {prefix}.backoff_factor {self.backoff_factor:g} (the first pause): "
                "every pause would be backoff_factor; raise backoff_max or lower backoff_factor",
            )

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``ServiceBusClient`` / ``ServiceBusAdministrationClient`` constructors: no SDK
        retries (``retry_total`` 0), the back-off stated anyway."""
        return {
            "retry_total": 0,  # whatever an old config says (retry.total: not honoured, and warned about)
            "retry_backoff_factor": self.backoff_factor,
            "retry_backoff_max": self.backoff_max,
            "retry_mode": self.mode,
        }


_NOT_NS_CHARS = re.compile(r"[^A-Za-z0-9._-]")


def _host_key(host: str) -> str:
    """``host[:port]`` as compared: lower case, without a trailing dot on the name. Pure."""
    name, sep, port = (
        host.strip().lower().rpartition(":") if host.count(":") == 1 else (host.strip().lower(), "", "")
    )
    return f"{name.rstrip('.')}{sep}{port}"


@dataclass(frozen=True)
class NamespaceConfig:
    """One Service Bus namespace: a connection string, or a fully qualified namespace plus an AAD credential.

    Picklable settings only; :meth:`client` / :meth:`admin_client` build live clients (on the executor or
    wherever they are used; they are neither thread-safe nor picklable). When a connection string is given
    and ``fully_qualified_namespace`` is not, it is derived from the Endpoint.
    """

    connection_string: Secret | None = None
    fully_qualified_namespace: str | None = None
    credential: CredentialConfig | None = None
    namespace_name: str | None = None
    #: A local namespace or the Service Bus emulator reached with ``fully_qualified_namespace`` + ``credential``:
    #: plain AMQP (no TLS) on the given port, as ``UseDevelopmentEmulator=true`` does in a connection string.
    use_development_emulator: bool = False

    def check(self, prefix: str) -> None:
        """Raise :class:`ConfigError` with keys under ``prefix`` (``primary``/``secondary``) if invalid."""
        if self.connection_string is not None:
            if not isinstance(self.connection_string, Secret):
                raise _err(f"{prefix}.connection_string", "must be a Secret")
            if self.credential is not None:
                raise _err(
                    prefix,
                    "give exactly one of connection_string or fully_qualified_namespace + credential, not both",
                )
            info = parse_connection_string(self.connection_string.reveal(), f"{prefix}.connection_string")
            # the same host however spelled (case, a scheme, a trailing '/' or '.') is the same namespace
            if self.fully_qualified_namespace is not None and _host_key(self._bare_fqns()) != _host_key(
                info.host
            ):
                raise _err(
                    prefix,
                    "give exactly one of connection_string or fully_qualified_namespace + credential "
                    "(fully_qualified_namespace differs from the connection string's Endpoint)",
                )
        else:
            if not self.fully_qualified_namespace:
                raise _err(
                    prefix,
                    "give exactly one of connection_string or fully_qualified_namespace + credential "
                    "(neither is set)",
                )
            if self.credential is None:
                raise _err(f"{prefix}.credential", "required with fully_qualified_namespace")
            self.credential.check(f"{prefix}.credential")
            if not re.fullmatch(r"[A-Za-z0-9.-]+(:\d+)?", self._bare_fqns()):
                raise _err(
                    f"{prefix}.fully_qualified_namespace",
                    "must look like <name>.servicebus.windows.net (host[:port])",
                )
        if self.namespace_name is not None and (
            not self.namespace_name or _NOT_NS_CHARS.search(self.namespace_name)
        ):
            raise _err(f"{prefix}.namespace_name", "must be non-empty letters, digits, '.', '-', '_'")
        if self.connection_string is not None:
            self._check_connection_string_parts(self.connection_string, prefix)

    def _check_connection_string_parts(self, connection_string: Secret, prefix: str) -> None:
        """What a valid connection string may still say that cannot work here (settings checked one by one
        already): an ``EntityPath``, and ``use_development_emulator`` beside a string that does not say it."""
        info = parse_connection_string(connection_string.reveal(), f"{prefix}.connection_string")
        if info.entity_path is not None:
            # The SDK refuses every entity but EntityPath on a client built from the string ("The queue name
            # provided does not match the EntityPath"), and the sink opens one connection per namespace through
            # such a client (wire.opening.open_connection asks it for '$connection'), shared by its entities
            # and backlog queues: no connection would ever open.
            raise _err(
                f"{prefix}.connection_string",
                f"has EntityPath={info.entity_path}, which limits its client to that one entity; the sink shares "
                "one connection per namespace among entities (and backlog queues): give the namespace's "
                "connection string, without EntityPath",
            )
        if self.use_development_emulator and not info.use_development_emulator:
            # a connection string's client takes its transport from the string (clients.service_bus_client)
            raise _err(
                f"{prefix}.use_development_emulator",
                f"applies to fully_qualified_namespace + credential; with {prefix}.connection_string put "
                "UseDevelopmentEmulator=true in the string (or remove the key)",
            )

    def __post_init__(self) -> None:
        if self.connection_string is not None and self.fully_qualified_namespace is None:
            try:
                info = parse_connection_string(self.connection_string.reveal())
            except ConfigError:
                return  # reported with the right key by check()
            object.__setattr__(self, "fully_qualified_namespace", info.host)

    def reach_key(self, prefix: str) -> str:
        """The key that says where this namespace is: ``<prefix>.connection_string`` or
        ``<prefix>.fully_qualified_namespace``."""
        part = "connection_string" if self.connection_string is not None else "fully_qualified_namespace"
        return f"{prefix}.{part}"

    def identity(self) -> str:
        """The namespace this one reaches, as ``host:port`` in lower case (the port the SDK would use when none is
        given: 5672 for a development emulator, else 5671), so that two spellings of one namespace compare
        equal. Pure; for configurations that passed :meth:`check`."""
        emulator = self.use_development_emulator
        info = self.connection_info()
        if info is not None:
            emulator = emulator or info.use_development_emulator
        name, port = name_and_port(self.endpoint_host())
        return f"{name}:{port or (5672 if emulator else 5671)}"

    def _bare_fqns(self) -> str:
        fq = self.fully_qualified_namespace or ""
        fq = re.sub(r"^[a-z]+://", "", fq.strip(), flags=re.IGNORECASE)
        return fq.rstrip("/")

    def connection_info(self) -> ConnectionStringInfo | None:
        """The non-secret parts of the connection string, or ``None`` for credential auth."""
        if self.connection_string is None:
            return None
        return parse_connection_string(self.connection_string.reveal())

    def endpoint_host(self) -> str:
        """``host[:port]`` from the connection string's Endpoint, or from the fully qualified namespace."""
        info = self.connection_info()
        return info.host if info is not None else self._bare_fqns()

    def effective_namespace_name(self, lookup: Callable[[], str] | None = None) -> str:
        """The namespace name used in backlog queue names (SPEC B1), by :func:`derive_namespace_name`:
        ``namespace_name`` if set; else the first DNS label of the host (``contoso`` for
        ``contoso.servicebus.windows.net``); for an IP address or ``localhost`` the name the namespace reports
        about itself, obtained by ``lookup`` (see :func:`spark_sb.wire.admin_api.resolve_primary_namespace_name`).
        Without ``lookup`` such an endpoint raises :class:`ConfigError` asking for ``namespace_name``."""
        return derive_namespace_name(self.endpoint_host(), override=self.namespace_name, lookup=lookup)

    def _reach(self) -> tuple[str | None, str, TokenCredential | None]:
        """How a client reaches the namespace: the connection string (revealed) if there is one, the bare fully
        qualified namespace, and a live credential when there is no connection string. Call where the client is
        built (the credential is live)."""
        if self.connection_string is not None:
            return self.connection_string.reveal(), self._bare_fqns(), None
        credential = self.credential.build() if self.credential is not None else None
        return None, self._bare_fqns(), credential

    def client(self, retry: RetryConfig | None = None, **kwargs: Any) -> ServiceBusClient:
        """A new ``ServiceBusClient`` with the retry settings of ``retry`` (none: the SDK's own defaults; ``kwargs``
        win). The sink's and the syphon's clients pass ``ServiceBusConfig.client_kwargs()``: no SDK retries."""
        options = {**(retry.client_kwargs() if retry is not None else {}), **kwargs}
        return clients.service_bus_client(*self._reach(), plain_amqp=self.use_development_emulator, **options)

    def admin_client(self, retry: RetryConfig | None = None, **kwargs: Any) -> ServiceBusAdministrationClient:
        """A new ``ServiceBusAdministrationClient`` (HTTPS). Pass ``connection_verify=<ca.pem>`` for the local
        namespace."""
        options = {**(retry.client_kwargs() if retry is not None else {}), **kwargs}
        return clients.admin_client(*self._reach(), **options)

    def redacted(self) -> str:
        """A log-safe description, e.g. ``sb://127.0.0.1:5671 (SAS key name RootManageSharedAccessKey)``."""
        try:
            host = self.endpoint_host()  # parses the connection string too
            info = self.connection_info()
        except ConfigError:  # never validated (built directly): described all the same, without the string
            return f"sb://{self._bare_fqns() or '?'} (invalid connection string)"
        if info is not None:
            auth = (
                "SAS token"
                if info.has_shared_access_signature
                else f"SAS key name {info.shared_access_key_name}"
            )
            if info.use_development_emulator:
                auth += ", development emulator"
        else:
            cred = self.credential
            auth = f"credential {cred.kind if cred else '?'}"
            if cred and cred.client_id:
                auth += f", client id {cred.client_id}"
        return f"sb://{host} ({auth})"
