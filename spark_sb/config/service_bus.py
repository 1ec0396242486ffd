"""Configuration of the Service Bus sink: one frozen, validated, picklable object (SPEC S8).

Built on the driver (from YAML, a dict or Spark options) and shipped to executors by pickling; nothing here
opens a connection. Live clients are built where they are used (``NamespaceConfig.client()`` on the
executor). Secrets are referenced (``${env:NAME}``, Databricks ``{{secrets/scope/key}}``), resolved once at
load time, and kept only inside :class:`Secret`, whose repr is ``Secret('***')``; every resolved secret is
registered with :mod:`spark_sb.core.redact` so log filters scrub it too.

Keys (nested in YAML/dicts, or flat and dotted as Spark options): ``primary.*`` and ``secondary.*`` (a
``connection_string``, or ``fully_qualified_namespace`` + ``credential.{kind,tenant_id,client_id,client_secret}``;
``namespace_name``), ``columns.<logical>``, ``x-*`` (kept in ``extra``), and one key per row of
:data:`spark_sb.config.settings.SETTINGS`, the table from which reading, checking and :meth:`ServiceBusConfig.to_options`
are derived. :data:`KNOWN_KEYS` lists every key.

This module holds :class:`ServiceBusConfig` and :func:`load_config`; the table is :mod:`spark_sb.config.settings`, the
namespace, credential and retry parts :mod:`spark_sb.config.namespace`, the reading of sources
:mod:`spark_sb.config.loading`. Every name below stays importable from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from spark_sb.config.loading import config_fields, flatten, option_keys, read_yaml, resolver
from spark_sb.config.namespace import NamespaceConfig, RetryConfig
from spark_sb.config.secret import Secret
from spark_sb.config.settings import (
    FIELD_SETTINGS,
    RETRY_SETTINGS,
    SETTINGS,
    format_value,
    is_extra_key,
    unknown_column,
)
from spark_sb.core.errors import ConfigError
from spark_sb.core.redact import redact
from spark_sb.message.backlog import backlog_queue_names
from spark_sb.message.outbound import FrozenMap
from spark_sb.message.rows import LOGICAL_COLUMNS

__all__ = ["ServiceBusConfig", "load_config"]

_err = ConfigError.at


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
    #: ``none``: no order kept through failover; ``session``: a session's messages reach the primary in the order
    #: they were sent, outage or not; ``entity``: the same for every message of an entity
    #: (:mod:`spark_sb.failover.ordering`).
    ordering: str = "none"
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
    #: SPEC B14: the longest primary outage whose ambiguous sends must stay exactly-once. ``provision`` and
    #: ``status`` warn about a primary entity without duplicate detection or with a window shorter than this.
    exactly_once_horizon: float = 3600.0
    columns: Mapping[str, str] = field(default_factory=_default_columns)
    syphon_max_wait: float = 900.0
    syphon_batch_size: int = 100
    syphon_prefetch: int = 0
    #: The syphon job: the longest one micro-batch drains one backlog queue (then the next trigger goes on).
    syphon_batch_duration: float = 60.0
    #: The syphon dead-letters (in the backlog, reason ``DestinationNotFound``) a message whose primary entity does
    #: not exist once this delivery of it is its ``syphon_max_attempts``-th; before that it is abandoned and tried
    #: again. Other failures (an outage) never dead-letter.
    syphon_max_attempts: int = 10
    provision_tries: int = 3
    provision_retry_pause: float = 30.0
    idle_timeout: float = 600.0
    client_cache: bool = True
    extra: Mapping[str, str] = field(default_factory=FrozenMap)

    def __post_init__(self) -> None:
        cols = dict(self.columns or {})
        unknown = [k for k in cols if k not in LOGICAL_COLUMNS]
        if unknown:
            raise _err(f"columns.{unknown[0]}", unknown_column(unknown[0]))
        for k, v in cols.items():
            if not isinstance(v, str) or not v:
                raise _err(f"columns.{k}", f"expected a non-empty column name, found {v!r}")
        object.__setattr__(self, "columns", FrozenMap({c: cols.get(c, c) for c in LOGICAL_COLUMNS}))
        extra = dict(self.extra or {})
        for k, v in extra.items():
            if not is_extra_key(k):
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
            # one namespace however spelled (case, a trailing dot, the default port): its backlog would be the primary
            if self.secondary.identity() == self.primary.identity():
                raise _err(
                    self.secondary.reach_key("secondary"),
                    f"names the same namespace as {self.primary.reach_key('primary')} "
                    f"({self.primary.identity()}): the backlog queues must be in another namespace",
                )
        for setting in SETTINGS:
            owner = self.retry if setting.owner == "retry" else self
            setting.check(getattr(owner, setting.attr), setting.key, owner)
        self.retry.check_together()  # settings valid one by one that cannot work together

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

    # ----------------------------------------------------------------- loading (spark_sb.config.loading)
    @classmethod
    def from_yaml(
        cls, path: str | Path, *, env: Mapping[str, str] | None = None, dbutils: Any = None
    ) -> ServiceBusConfig:
        """Load a YAML file (nested or flat dotted keys). Secret references are resolved now."""
        return cls.from_dict(read_yaml(path), env=env, dbutils=dbutils)

    @classmethod
    def from_dict(
        cls, d: Mapping[str, Any], *, env: Mapping[str, str] | None = None, dbutils: Any = None
    ) -> ServiceBusConfig:
        """Build from a nested dict, a flat dotted dict, or a mix. Secret references are resolved now."""
        return cls(**config_fields(flatten(d), resolver(env, dbutils)))

    @classmethod
    def from_options(
        cls, flat: Mapping[str, str], *, env: Mapping[str, str] | None = None, dbutils: Any = None
    ) -> ServiceBusConfig:
        """Build from flat Spark options (keys case-insensitive, values strings)."""
        return cls(**config_fields(option_keys(flat), resolver(env, dbutils)))

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
            setting = FIELD_SETTINGS.get(f.name)
            v = getattr(self, f.name)
            if setting is not None and v is not None:
                out[setting.key] = format_value(v)
        for s in RETRY_SETTINGS:
            out[s.key] = format_value(getattr(self.retry, s.attr))
        for logical, actual in self.columns.items():
            if logical != actual:
                out[f"columns.{logical}"] = actual
        out.update(self.extra)
        return out


def load_config(
    source: str | Path | Mapping[str, Any], *, env: Mapping[str, str] | None = None, dbutils: Any = None
) -> ServiceBusConfig:
    """A path (str or Path) -> YAML file; a mapping -> nested or flat settings (Spark options included)."""
    if isinstance(source, Mapping):
        if all(isinstance(v, str) for v in source.values()) and any("." in str(k) for k in source):
            return ServiceBusConfig.from_options(source, env=env, dbutils=dbutils)
        return ServiceBusConfig.from_dict(source, env=env, dbutils=dbutils)
    return ServiceBusConfig.from_yaml(source, env=env, dbutils=dbutils)
