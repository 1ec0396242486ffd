"""Configuration of the Service Bus sink: one frozen, validated, picklable object (SPEC S8).

Built on the driver (from YAML, a dict or Spark options) and shipped to executors by pickling; nothing here
opens a connection. Live clients are built where they are used (``NamespaceConfig.client()`` on the
executor). Secrets are referenced (``${env:NAME}``, Databricks ``{{secrets/scope/key}}``), resolved once at
load time, and kept only inside :class:`Secret`, whose repr is ``Secret('***')``; every resolved secret is
registered with :mod:`spark_sb.redact` so log filters scrub it too.

Keys (nested in YAML/dicts, or flat and dotted as Spark options): ``primary.*`` and ``secondary.*`` (a
``connection_string``, or ``fully_qualified_namespace`` + ``credential.{kind,tenant_id,client_id,client_secret}``;
``namespace_name``), ``columns.<logical>``, ``x-*`` (kept in ``extra``), and one key per row of :data:`SETTINGS`,
the table from which reading, checking and :meth:`ServiceBusConfig.to_options` are derived. :data:`KNOWN_KEYS`
lists every key.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_sb import clients
from spark_sb.backlog import PROBE_MODES, backlog_queue_names
from spark_sb.durations import parse_duration
from spark_sb.endpoints import ConnectionStringInfo, derive_namespace_name, parse_connection_string
from spark_sb.errors import ConfigError
from spark_sb.message import FrozenMap
from spark_sb.redact import redact
from spark_sb.rows import LOGICAL_COLUMNS
from spark_sb.secret import Resolver, Secret

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from azure.servicebus import ServiceBusClient
    from azure.servicebus.management import ServiceBusAdministrationClient

__all__ = [
    "ConfigError",
    "ConnectionStringInfo",
    "CredentialConfig",
    "NamespaceConfig",
    "RetryConfig",
    "Secret",
    "ServiceBusConfig",
    "load_config",
    "parse_connection_string",
    "parse_duration",
]

BACKLOG_SELECTIONS = ("random", "session-affine")
ON_REJECT = ("record", "fail")
MESSAGE_ID_MODES = ("column", "content")
STATE_WRITES = ("async", "sync")
RETRY_MODES = ("exponential", "fixed")
CREDENTIAL_KINDS = ("default", "client_secret", "managed_identity")

_err = ConfigError.at


def _one_of(key: str, value: Any, valid: tuple[str, ...]) -> ConfigError:
    return _err(key, f"{value!r} is not one of {', '.join(repr(v) for v in valid)}")


def _parse_int(value: Any, key: str) -> int:
    if isinstance(value, bool):
        raise _err(key, f"expected an integer, found {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise _err(key, f"expected an integer, found {value!r}")


def _parse_float(value: Any, key: str) -> float:
    if isinstance(value, bool):
        raise _err(key, f"expected a number, found {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise _err(key, f"expected a number, found {value!r}")


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def _parse_bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise _err(key, f"{value!r} is not one of true, false")


def _parse_str(value: Any, key: str) -> str:
    if isinstance(value, str) and value.strip():
        return value.strip()
    raise _err(key, f"expected a non-empty string, found {value!r}")


def _parse_secret_text(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _err(key, "expected a non-empty string")
    return value.strip()


# ------------------------------------------------------------------------------------------ settings
@dataclass(frozen=True)
class _Setting:
    """One setting, the single place that names it: the dotted ``key`` (YAML, dicts, Spark options), the
    attribute it fills (``attr`` of :class:`ServiceBusConfig`, or of ``owner`` = ``"retry"``:
    :class:`RetryConfig`), how a raw value is read (``read(raw, key)``: strings from options, YAML scalars) and
    how a value is checked on construction (``check(value, key, owner_object)``).

    Keys, parsing, validation and :meth:`ServiceBusConfig.to_options` are all derived from :data:`SETTINGS`.
    """

    key: str
    attr: str
    read: Callable[[Any, str], Any]
    check: Callable[[Any, str, Any], None]
    owner: str = ""


def _duration(key: str, attr: str, *, positive: bool) -> _Setting:
    def check(v: Any, key: str, _: Any) -> None:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
            raise _err(key, f"expected seconds, found {v!r}")
        if (v <= 0) if positive else (v < 0):
            raise _err(key, f"must be {'>' if positive else '>='} 0 seconds, found {v!r}")

    return _Setting(key, attr, parse_duration, check)


def _integer(key: str, attr: str, bound: str, *, unit: str = "", owner: str = "") -> _Setting:
    """An integer setting; ``bound`` is ``"> n"`` or ``">= n"``."""
    op, n = bound.split()
    low = int(n) + (1 if op == ">" else 0)

    def check(v: Any, key: str, _: Any) -> None:
        if not _is_int(v) or v < low:
            raise _err(key, f"must be an integer {bound}{unit}, found {v!r}")

    return _Setting(key, attr, _parse_int, check, owner)


def _non_negative(key: str, attr: str, *, owner: str = "") -> _Setting:
    def check(v: Any, key: str, _: Any) -> None:
        if v < 0:
            raise _err(key, f"must be >= 0, found {v!r}")

    return _Setting(key, attr, _parse_float, check, owner)


def _choice(key: str, attr: str, valid: tuple[str, ...], *, owner: str = "") -> _Setting:
    def read(raw: Any, key: str) -> str:
        if not isinstance(raw, str) or raw.strip() not in valid:
            raise _one_of(key, raw, valid)
        return raw.strip()

    def check(v: Any, key: str, _: Any) -> None:
        if v not in valid:
            raise _one_of(key, v, valid)

    return _Setting(key, attr, read, check, owner)


def _text(key: str, attr: str, *, noun: str = "string", strip: bool = False) -> _Setting:
    """An optional text setting: ``None`` or a non-empty string (``strip``: not blank either)."""

    def check(v: Any, key: str, _: Any) -> None:
        if v is not None and (not isinstance(v, str) or not (v.strip() if strip else v)):
            raise _err(key, f"expected a non-empty {noun}, found {v!r}")

    return _Setting(key, attr, _parse_str, check)


def _check_table_prefix(v: Any, key: str, config: Any) -> None:
    if v is None:
        return
    if not isinstance(v, str) or not re.fullmatch(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+){1,2}\.?[A-Za-z0-9_]*", v):
        raise _err(key, f"expected catalog.schema.prefix (e.g. 'main.ops.sb_'), found {v!r}")
    if config.state_location is not None:
        raise _err(key, "give state_location (paths) or state_table_prefix, not both")


def _check_bool(v: Any, key: str, _: Any) -> None:
    if not isinstance(v, bool):
        raise _err(key, f"{v!r} is not one of true, false")


#: Every scalar setting of :class:`ServiceBusConfig` and its :class:`RetryConfig`, in the order they are checked.
SETTINGS: tuple[_Setting, ...] = (
    _text("entity", "entity"),
    _integer("backlog_queue_count", "backlog_queue_count", "> 0"),
    _duration("failover_interval", "failover_interval", positive=False),
    _duration("ping_primary_interval", "ping_primary_interval", positive=True),
    _duration("backlog_retry_interval", "backlog_retry_interval", positive=False),
    _duration("send_timeout", "send_timeout", positive=True),
    _duration("syphon.max_wait", "syphon_max_wait", positive=True),
    _duration("syphon.batch_duration", "syphon_batch_duration", positive=True),
    _duration("idle_timeout", "idle_timeout", positive=True),
    _duration("provision.retry_pause", "provision_retry_pause", positive=False),
    _duration("state_retention", "state_retention", positive=True),
    _duration("state_maintain_every", "state_maintain_every", positive=False),
    _choice("probe_mode", "probe_mode", PROBE_MODES),
    _choice("backlog_selection", "backlog_selection", BACKLOG_SELECTIONS),
    _choice("on_reject", "on_reject", ON_REJECT),
    _integer("retry.total", "total", ">= 0", owner="retry"),
    _non_negative("retry.backoff_factor", "backoff_factor", owner="retry"),
    _non_negative("retry.backoff_max", "backoff_max", owner="retry"),
    _choice("retry.mode", "mode", RETRY_MODES, owner="retry"),
    _integer("max_message_size", "max_message_size", "> 0", unit=" (bytes)"),
    _integer("syphon.batch_size", "syphon_batch_size", "> 0"),
    _integer("syphon.prefetch", "syphon_prefetch", ">= 0"),
    _integer("provision.tries", "provision_tries", ">= 1"),
    _Setting("client_cache", "client_cache", _parse_bool, _check_bool),
    _text("state_location", "state_location", noun="path"),
    _Setting("state_table_prefix", "state_table_prefix", _parse_str, _check_table_prefix),
    _text("sink_id", "sink_id", strip=True),
    _choice("message_id_mode", "message_id_mode", MESSAGE_ID_MODES),
    _choice("state_writes", "state_writes", STATE_WRITES),
)
_RETRY_SETTINGS = tuple(s for s in SETTINGS if s.owner == "retry")
_BY_FIELD = {s.attr: s for s in SETTINGS if not s.owner}

#: How each part of a namespace (``primary.<part>``, ``secondary.<part>``) is read; :meth:`NamespaceConfig.check`
#: checks them together.
_NAMESPACE_READERS: dict[str, Callable[[Any, str], Any]] = {
    "connection_string": _parse_secret_text,
    "fully_qualified_namespace": _parse_str,
    "namespace_name": _parse_str,
    "use_development_emulator": _parse_bool,
    "credential.kind": _choice("credential.kind", "kind", CREDENTIAL_KINDS).read,
    "credential.tenant_id": _parse_str,
    "credential.client_id": _parse_str,
    "credential.client_secret": _parse_secret_text,
}

#: Every key and how its raw value is read.
_READERS: dict[str, Callable[[Any, str], Any]] = {
    **{f"{ns}.{part}": read for ns in ("primary", "secondary") for part, read in _NAMESPACE_READERS.items()},
    **{s.key: s.read for s in SETTINGS},
    **{f"columns.{c}": _parse_str for c in LOGICAL_COLUMNS},
}
KNOWN_KEYS: tuple[str, ...] = tuple(_READERS)


# ----------------------------------------------------------------------------------------- dataclasses
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
            raise _one_of(f"{prefix}.kind", self.kind, CREDENTIAL_KINDS)
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

    def build(self) -> TokenCredential:
        """A live azure-identity credential. Call where the client is built (executor), never pickle it."""
        secret = self.client_secret.reveal() if self.client_secret is not None else None
        return clients.credential(self.kind, self.tenant_id, self.client_id, secret)


@dataclass(frozen=True)
class RetryConfig:
    """SDK retry settings, stated explicitly (these are the azure-servicebus 7.15 defaults).

    ``total`` is the SDK's own retry count for the clients that keep it (the syphon's receivers, the admin client).
    The paired sender's clients do not retry inside a call: its attempt loop retries, with ``backoff_factor`` and
    ``backoff_max`` (doubling, or the same step every time with ``mode: fixed``), so that every failed attempt
    reaches the failover timer at once and failover is on time whatever these settings are."""

    total: int = 3
    backoff_factor: float = 0.8
    backoff_max: float = 120.0
    mode: str = "exponential"

    def check(self, prefix: str = "retry") -> None:
        for s in _RETRY_SETTINGS:
            s.check(getattr(self, s.attr), f"{prefix}.{s.attr}", self)

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``ServiceBusClient`` / ``ServiceBusAdministrationClient`` constructors."""
        return {
            "retry_total": self.total,
            "retry_backoff_factor": self.backoff_factor,
            "retry_backoff_max": self.backoff_max,
            "retry_mode": self.mode,
        }


_NOT_NS_CHARS = re.compile(r"[^A-Za-z0-9._-]")


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
            if self.fully_qualified_namespace is not None and self.fully_qualified_namespace != info.host:
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

    def __post_init__(self) -> None:
        if self.connection_string is not None and self.fully_qualified_namespace is None:
            try:
                info = parse_connection_string(self.connection_string.reveal())
            except ConfigError:
                return  # reported with the right key by check()
            object.__setattr__(self, "fully_qualified_namespace", info.host)

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
        about itself, obtained by ``lookup`` (see :func:`spark_sb.provisioning.resolve_primary_namespace_name`).
        Without ``lookup`` such an endpoint raises :class:`ConfigError` asking for ``namespace_name``."""
        return derive_namespace_name(self.endpoint_host(), override=self.namespace_name, lookup=lookup)

    def client(self, retry: RetryConfig | None = None, **kwargs: Any) -> ServiceBusClient:
        """A new ``ServiceBusClient`` with the retry settings of ``retry`` (``kwargs`` win)."""
        options = {**(retry or RetryConfig()).client_kwargs(), **kwargs}
        return clients.service_bus_client(
            self.connection_string.reveal() if self.connection_string is not None else None,
            self._bare_fqns(),
            self.credential.build()
            if self.connection_string is None and self.credential is not None
            else None,
            plain_amqp=self.use_development_emulator,
            **options,
        )

    def admin_client(self, retry: RetryConfig | None = None, **kwargs: Any) -> ServiceBusAdministrationClient:
        """A new ``ServiceBusAdministrationClient`` (HTTPS). Pass ``connection_verify=<ca.pem>`` for the local
        namespace."""
        options = {**kwargs}
        if retry is not None:
            options = {"retry_total": retry.total, "retry_backoff_factor": retry.backoff_factor,
                       "retry_backoff_max": retry.backoff_max, **options}  # fmt: skip
        return clients.admin_client(
            self.connection_string.reveal() if self.connection_string is not None else None,
            self._bare_fqns(),
            self.credential.build()
            if self.connection_string is None and self.credential is not None
            else None,
            **options,
        )

    def redacted(self) -> str:
        """A log-safe description, e.g. ``sb://127.0.0.1:5671 (SAS key name RootManageSharedAccessKey)``."""
        host = self.endpoint_host()
        try:
            info = self.connection_info()
        except ConfigError:
            return f"sb://{host} (invalid connection string)"
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


def _default_columns() -> Mapping[str, str]:
    return FrozenMap({c: c for c in LOGICAL_COLUMNS})


@dataclass(frozen=True)
class ServiceBusConfig:
    """Everything the sink, the paired sender and the syphon need (SPEC S8). Frozen, validated, picklable,
    hashable (usable as a cache key on executors). Built on the driver; validated on construction."""

    primary: NamespaceConfig
    secondary: NamespaceConfig | None = None  # required for failover; absent -> plain sender, no backlog
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
    #: Unity Catalog tables instead of paths: ``catalog.schema.sb_`` -> ``catalog.schema.sb_events`` etc.
    state_table_prefix: str | None = None
    #: The sink's identity in the state tables (replay skipping, S5); None -> ``<primary namespace>/<entity>``.
    sink_id: str | None = None
    #: ``column``: ids from the message_id column; ``content``: rows without one get a hash of their content.
    message_id_mode: str = "column"
    #: ``async``: the state tables are written by a background thread on the driver (group commit), off the
    #: batch's critical path; ``sync``: each batch reads and writes them before ``foreachBatch`` returns.
    state_writes: str = "async"
    #: Events and rejects older than this are deleted by ``spark-sb maintain`` (never the entities table, never
    #: the rows a running sink reads): 30 days.
    state_retention: float = 30 * 86400.0
    #: The syphon job maintains the state tables (OPTIMIZE, VACUUM, retention) this often; 0: never.
    state_maintain_every: float = 86400.0
    columns: Mapping[str, str] = field(default_factory=_default_columns)
    syphon_max_wait: float = 900.0
    syphon_batch_size: int = 100
    syphon_prefetch: int = 0
    #: The syphon job: the longest one micro-batch drains one backlog queue (then the next trigger goes on).
    syphon_batch_duration: float = 60.0
    provision_tries: int = 3
    provision_retry_pause: float = 30.0
    idle_timeout: float = 600.0
    client_cache: bool = True
    extra: Mapping[str, str] = field(default_factory=FrozenMap)

    def __post_init__(self) -> None:
        cols = dict(self.columns or {})
        unknown = [k for k in cols if k not in LOGICAL_COLUMNS]
        if unknown:
            raise _err(
                f"columns.{unknown[0]}",
                f"unknown column {unknown[0]!r}{_did_you_mean(unknown[0], LOGICAL_COLUMNS)}; "
                f"valid: {', '.join(LOGICAL_COLUMNS)}",
            )
        for k, v in cols.items():
            if not isinstance(v, str) or not v:
                raise _err(f"columns.{k}", f"expected a non-empty column name, found {v!r}")
        object.__setattr__(self, "columns", FrozenMap({c: cols.get(c, c) for c in LOGICAL_COLUMNS}))
        extra = dict(self.extra or {})
        for k, v in extra.items():
            if not _is_extra_key(k):
                raise _err(k, "extra keys must start with 'x-'")
            if not isinstance(v, str):
                extra[k] = str(v)
        object.__setattr__(self, "extra", FrozenMap(extra))
        self._check()

    def _check(self) -> None:
        if not isinstance(self.primary, NamespaceConfig):
            raise _err("primary", "required (connection_string or fully_qualified_namespace + credential)")
        self.primary.check("primary")
        if self.secondary is not None:
            self.secondary.check("secondary")
            if self.secondary.endpoint_host() == self.primary.endpoint_host():
                raise _err("secondary", "must be a different namespace than primary")
        for setting in SETTINGS:
            owner = self.retry if setting.owner == "retry" else self
            setting.check(getattr(owner, setting.attr), setting.key, owner)

    def __repr__(self) -> str:
        parts = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))
        return redact(f"ServiceBusConfig({parts})")

    __str__ = __repr__

    # ----------------------------------------------------------------- derived values
    @property
    def _failover_enabled(self) -> bool:
        """True when a secondary namespace is configured (backlog queues + syphon)."""
        return self.secondary is not None

    def primary_namespace_name(self) -> str:
        """The primary's namespace name used in backlog queue names (SPEC B1)."""
        return self.primary.effective_namespace_name()

    def backlog_queue_names(self, primary_namespace_name: str | None = None) -> list[str]:
        """``<ns>/x-servicebus-transfer/<i>`` for i in [0, backlog_queue_count) (SPEC B1)."""
        ns = primary_namespace_name or self.primary_namespace_name()
        return backlog_queue_names(ns, self.backlog_queue_count)

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for SDK clients (``NamespaceConfig.client(**cfg.client_kwargs())``): the retry
        settings, and ``try_timeout = send_timeout`` so that every attempt, including AMQP link acquisition, is
        bounded (without it the SDK waits forever on a namespace that accepts TCP but never opens the link,
        and a stalled primary would never start the failover timer, SPEC B3)."""
        return {**self.retry.client_kwargs(), "try_timeout": self.send_timeout}

    def with_overrides(self, **changes: Any) -> ServiceBusConfig:
        """A validated copy with ``changes`` applied (dataclass field names)."""
        return replace(self, **changes)

    # ----------------------------------------------------------------- loading
    @classmethod
    def from_yaml(
        cls, path: str | Path, *, env: Mapping[str, str] | None = None, dbutils: Any = None
    ) -> ServiceBusConfig:
        """Load a YAML file (nested or flat dotted keys). Secret references are resolved now."""
        import yaml

        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config file {str(p)!r}: {exc.strerror}") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"{str(p)!r} is not valid YAML{where}") from None
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(f"{str(p)!r}: the top level must be a mapping of settings")
        return cls.from_dict(data, env=env, dbutils=dbutils)

    @classmethod
    def from_dict(
        cls, d: Mapping[str, Any], *, env: Mapping[str, str] | None = None, dbutils: Any = None
    ) -> ServiceBusConfig:
        """Build from a nested dict, a flat dotted dict, or a mix. Secret references are resolved now."""
        flat: dict[str, Any] = {}
        _flatten(d, "", flat)
        return _build(flat, Resolver(env if env is not None else os.environ, dbutils))

    @classmethod
    def from_options(
        cls, flat: Mapping[str, str], *, env: Mapping[str, str] | None = None, dbutils: Any = None
    ) -> ServiceBusConfig:
        """Build from flat Spark options (keys case-insensitive, values strings)."""
        lowered: dict[str, Any] = {}
        for k, v in flat.items():
            key = str(k).strip().lower()
            if key in lowered:
                raise _err(key, "given twice (option keys are case-insensitive)")
            lowered[key] = v
        return _build(lowered, Resolver(env if env is not None else os.environ, dbutils))

    def to_options(self, include_secrets: bool = False) -> dict[str, str]:
        """Flat Spark-options form; ``from_options(cfg.to_options())`` equals ``cfg``.

        Secrets loaded from references are written as their references. A literal secret (no reference) is
        written only with ``include_secrets=True``; otherwise :class:`ConfigError` names its key.
        """
        out: dict[str, str] = {}

        def secret(key: str, s: Secret) -> str:
            if s.reference is not None:
                return s.reference
            if include_secrets:
                return s.reveal()
            raise _err(
                key, "is a literal secret: pass include_secrets=True or load it from a ${env:...} reference"
            )

        for prefix, ns in (("primary", self.primary), ("secondary", self.secondary)):
            if ns is None:
                continue
            if ns.connection_string is not None:
                out[f"{prefix}.connection_string"] = secret(
                    f"{prefix}.connection_string", ns.connection_string
                )
            elif ns.fully_qualified_namespace is not None:
                out[f"{prefix}.fully_qualified_namespace"] = ns.fully_qualified_namespace
            if ns.credential is not None:
                c = ns.credential
                out[f"{prefix}.credential.kind"] = c.kind
                if c.tenant_id is not None:
                    out[f"{prefix}.credential.tenant_id"] = c.tenant_id
                if c.client_id is not None:
                    out[f"{prefix}.credential.client_id"] = c.client_id
                if c.client_secret is not None:
                    out[f"{prefix}.credential.client_secret"] = secret(
                        f"{prefix}.credential.client_secret", c.client_secret
                    )
            if ns.namespace_name is not None:
                out[f"{prefix}.namespace_name"] = ns.namespace_name
            if ns.use_development_emulator:
                out[f"{prefix}.use_development_emulator"] = "true"
        for f in fields(self):
            setting = _BY_FIELD.get(f.name)
            v = getattr(self, f.name)
            if setting is not None and v is not None:
                out[setting.key] = _fmt(v)
        for s in _RETRY_SETTINGS:
            out[s.key] = _fmt(getattr(self.retry, s.attr))
        for logical, actual in self.columns.items():
            if logical != actual:
                out[f"columns.{logical}"] = actual
        out.update(self.extra)
        return out


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_extra_key(key: str) -> bool:
    return key.split(".", 1)[0].startswith("x-")


def _did_you_mean(key: str, candidates: tuple[str, ...] | list[str]) -> str:
    match = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


# --------------------------------------------------------------------------------------- building
def _flatten(d: Mapping[str, Any], prefix: str, out: dict[str, Any]) -> None:
    for k, v in d.items():
        key = f"{prefix}{k}"
        if not isinstance(k, str):
            raise _err(key, "keys must be strings")
        if isinstance(v, Mapping):
            if not v:
                continue
            _flatten(v, f"{key}.", out)
        else:
            if key in out:
                raise _err(key, "given twice (nested and dotted)")
            out[key] = v


def _build(flat: Mapping[str, Any], resolver: Resolver) -> ServiceBusConfig:
    errors: list[tuple[str, str]] = []
    values: dict[str, Any] = {}
    extra: dict[str, str] = {}
    references: dict[str, str] = {}

    for key, raw in flat.items():
        if _is_extra_key(key):
            extra[key] = "" if raw is None else str(raw)
            continue
        if key not in KNOWN_KEYS:
            if key.startswith("columns."):
                logical = key[len("columns.") :]
                msg = (
                    f"unknown column {logical!r}{_did_you_mean(logical, LOGICAL_COLUMNS)}; "
                    f"valid: {', '.join(LOGICAL_COLUMNS)}"
                )
            else:
                msg = f"unknown key{_did_you_mean(key, list(KNOWN_KEYS))}"
            errors.append((key, msg))
            continue
        if raw is None:
            continue
        try:
            if isinstance(raw, str):
                resolved, had_ref = resolver.resolve(key, raw)
                if had_ref:
                    references[key] = raw
                raw = resolved
            values[key] = _convert(key, raw)
        except ConfigError as exc:
            errors.extend(exc.errors or [(key, str(exc))])

    def namespace(prefix: str) -> NamespaceConfig | None:
        keys = {k[len(prefix) + 1 :]: v for k, v in values.items() if k.startswith(prefix + ".")}
        if not keys:
            return None
        secret_cs = None
        if "connection_string" in keys:
            secret_cs = Secret(keys["connection_string"], references.get(f"{prefix}.connection_string"))
        cred = None
        if any(k.startswith("credential.") for k in keys):
            cs = keys.get("credential.client_secret")
            cred = CredentialConfig(
                kind=keys.get("credential.kind", "default"),
                tenant_id=keys.get("credential.tenant_id"),
                client_id=keys.get("credential.client_id"),
                client_secret=(
                    Secret(cs, references.get(f"{prefix}.credential.client_secret"))
                    if cs is not None
                    else None
                ),
            )
        return NamespaceConfig(
            connection_string=secret_cs,
            fully_qualified_namespace=keys.get("fully_qualified_namespace"),
            credential=cred,
            namespace_name=keys.get("namespace_name"),
            use_development_emulator=bool(keys.get("use_development_emulator", False)),
        )

    primary = namespace("primary")
    if primary is None and not any(k == "primary" or k.startswith("primary.") for k, _ in errors):
        errors.append(
            ("primary", "required (primary.connection_string or primary.fully_qualified_namespace)")
        )
    if errors:
        raise ConfigError("; ".join(f"{k}: {m}" for k, m in errors), errors)
    assert primary is not None

    kwargs: dict[str, Any] = {}
    retry_kwargs: dict[str, Any] = {}
    for s in SETTINGS:
        if s.key in values:
            (retry_kwargs if s.owner == "retry" else kwargs)[s.attr] = values[s.key]
    columns = {k[len("columns.") :]: v for k, v in values.items() if k.startswith("columns.")}
    return ServiceBusConfig(
        primary=primary,
        secondary=namespace("secondary"),
        retry=RetryConfig(**retry_kwargs),
        columns=columns,
        extra=extra,
        **kwargs,
    )


def _convert(key: str, raw: Any) -> Any:
    return _READERS[key](raw, key)


def load_config(
    source: str | Path | Mapping[str, Any], *, env: Mapping[str, str] | None = None, dbutils: Any = None
) -> ServiceBusConfig:
    """A path (str or Path) -> YAML file; a mapping -> nested or flat settings (Spark options included)."""
    if isinstance(source, Mapping):
        if all(isinstance(v, str) for v in source.values()) and any("." in str(k) for k in source):
            return ServiceBusConfig.from_options(source, env=env, dbutils=dbutils)
        return ServiceBusConfig.from_dict(source, env=env, dbutils=dbutils)
    return ServiceBusConfig.from_yaml(source, env=env, dbutils=dbutils)
