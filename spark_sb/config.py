"""Configuration of the Service Bus sink: one frozen, validated, picklable object (SPEC S8).

Built on the driver (from YAML, a dict or Spark options) and shipped to executors by pickling; nothing here
opens a connection. Live clients are built where they are used (``NamespaceConfig.client()`` on the executor).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from azure.servicebus import ServiceBusClient
    from azure.servicebus.management import ServiceBusAdministrationClient


class ConfigError(ValueError):
    """An invalid setting; the message names the dotted key and, where there is a set, the valid values."""


@dataclass(frozen=True)
class Secret:
    """A secret string; never shown by repr/str. ``reveal()`` returns it."""

    value: str = field(repr=False)
    reference: str | None = None

    def reveal(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


@dataclass(frozen=True)
class CredentialConfig:
    kind: str = "default"
    tenant_id: str | None = None
    client_id: str | None = None
    client_secret: Secret | None = None

    def build(self) -> TokenCredential:
        raise NotImplementedError


@dataclass(frozen=True)
class RetryConfig:
    total: int = 3
    backoff_factor: float = 0.8
    backoff_max: float = 120.0
    mode: str = "exponential"


@dataclass(frozen=True)
class NamespaceConfig:
    connection_string: Secret | None = None
    fully_qualified_namespace: str | None = None
    credential: CredentialConfig | None = None
    namespace_name: str | None = None

    def endpoint_host(self) -> str:
        raise NotImplementedError

    def client(self, **kwargs: Any) -> ServiceBusClient:
        raise NotImplementedError

    def admin_client(self, **kwargs: Any) -> ServiceBusAdministrationClient:
        raise NotImplementedError

    def redacted(self) -> str:
        raise NotImplementedError


def _frozen(d: Mapping[str, str] | None = None) -> Mapping[str, str]:
    return MappingProxyType(dict(d or {}))


@dataclass(frozen=True)
class ServiceBusConfig:
    primary: NamespaceConfig
    secondary: NamespaceConfig | None = None
    entity: str | None = None
    backlog_queue_count: int = 10
    failover_interval: float = 60.0
    ping_primary_interval: float = 60.0
    probe_mode: str = "schedule-cancel"
    backlog_retry_interval: float = 300.0
    backlog_selection: str = "random"
    send_timeout: float = 30.0
    retry: RetryConfig = field(default_factory=RetryConfig)
    max_message_size: int = 262144
    on_reject: str = "record"
    state_location: str | None = None
    columns: Mapping[str, str] = field(default_factory=_frozen)
    syphon_max_wait: float = 900.0
    syphon_batch_size: int = 100
    syphon_prefetch: int = 0
    idle_timeout: float = 600.0
    client_cache: bool = True
    extra: Mapping[str, str] = field(default_factory=_frozen)

    @classmethod
    def from_yaml(cls, path: str | Path) -> ServiceBusConfig:
        raise NotImplementedError

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ServiceBusConfig:
        raise NotImplementedError

    @classmethod
    def from_options(cls, flat: Mapping[str, str]) -> ServiceBusConfig:
        raise NotImplementedError

    def to_options(self, include_secrets: bool = False) -> dict[str, str]:
        raise NotImplementedError

    def backlog_queue_names(self, primary_namespace_name: str) -> list[str]:
        return [f"{primary_namespace_name}/x-servicebus-transfer/{i}" for i in range(self.backlog_queue_count)]


def load_config(source: str | Path | Mapping[str, Any]) -> ServiceBusConfig:
    raise NotImplementedError
