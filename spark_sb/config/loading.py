"""Reading configuration sources into the keyword arguments of a :class:`~spark_sb.config.service_bus.ServiceBusConfig`.

Runs where a configuration is loaded - on the driver (a job's ``main()``, the CLI, the sink's constructor), or on
an executor that rebuilds a config from Spark options; nothing here is pickled or kept. The sources are a YAML file
(:func:`read_yaml`), a nested or dotted dict (:func:`flatten`) and flat Spark options (:func:`option_keys`); each
becomes one flat ``{dotted key: raw value}`` mapping, which :func:`config_fields` reads through the settings
table (:mod:`spark_sb.config.settings`): secret references resolved (the one place they are), every key read and
checked, all errors gathered into one :class:`~spark_sb.core.errors.ConfigError` that names each key. It builds the
namespaces and the retry settings (:mod:`spark_sb.config.namespace`); ``ServiceBusConfig`` validates the whole.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spark_sb.config.namespace import CredentialConfig, NamespaceConfig, RetryConfig
from spark_sb.config.secret import Resolver, Secret
from spark_sb.config.settings import KNOWN_KEYS, READERS, SETTINGS, did_you_mean, is_extra_key, unknown_column
from spark_sb.core.errors import ConfigError

__all__ = ["config_fields", "flatten", "option_keys", "read_yaml", "resolver"]

_err = ConfigError.at


def read_yaml(path: str | Path) -> Mapping[str, Any]:
    """The settings in the YAML file at ``path`` (nested or flat dotted keys; an empty file has none)."""
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
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{str(p)!r}: the top level must be a mapping of settings")
    return data


def flatten(d: Mapping[str, Any]) -> dict[str, Any]:
    """A nested dict, a flat dotted dict, or a mix, as one flat dotted dict (a key given both ways: an error)."""
    out: dict[str, Any] = {}
    _flatten(d, "", out)
    return out


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


def option_keys(flat: Mapping[str, str]) -> dict[str, Any]:
    """Spark options with their keys as the settings spell them (option keys are case-insensitive)."""
    lowered: dict[str, Any] = {}
    for k, v in flat.items():
        key = str(k).strip().lower()
        if key in lowered:
            raise _err(key, "given twice (option keys are case-insensitive)")
        lowered[key] = v
    return lowered


def resolver(env: Mapping[str, str] | None, dbutils: Any) -> Resolver:
    """What resolves secret references: ``env`` (the process environment if None) and Databricks ``dbutils``."""
    return Resolver(env if env is not None else os.environ, dbutils)


def config_fields(flat: Mapping[str, Any], resolver: Resolver) -> dict[str, Any]:
    """The keyword arguments of ``ServiceBusConfig`` for the flat settings ``flat``: every key read through the
    settings table, secret references resolved by ``resolver`` (the references kept beside the secrets), ``x-*``
    keys kept as ``extra``. Raises one :class:`ConfigError` listing every key that is unknown or unreadable."""
    errors: list[tuple[str, str]] = []
    values: dict[str, Any] = {}
    extra: dict[str, str] = {}
    references: dict[str, str] = {}

    for key, raw in flat.items():
        if is_extra_key(key):
            extra[key] = "" if raw is None else str(raw)
            continue
        if key not in KNOWN_KEYS:
            if key.startswith("columns."):
                msg = unknown_column(key[len("columns.") :])
            else:
                msg = f"unknown key{did_you_mean(key, list(KNOWN_KEYS))}"
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
            values[key] = READERS[key](raw, key)
        except ConfigError as exc:
            errors.extend(exc.errors or [(key, str(exc))])

    primary = _namespace("primary", values, references)
    if primary is None and not any(k == "primary" or k.startswith("primary.") for k, _ in errors):
        errors.append(
            ("primary", "required (primary.connection_string or primary.fully_qualified_namespace)")
        )
    if errors:
        raise ConfigError("; ".join(f"{k}: {m}" for k, m in errors), errors)

    kwargs: dict[str, Any] = {}
    retry_kwargs: dict[str, Any] = {}
    for s in SETTINGS:
        if s.key in values:
            (retry_kwargs if s.owner == "retry" else kwargs)[s.attr] = values[s.key]
    return {
        **kwargs,
        "primary": primary,
        "secondary": _namespace("secondary", values, references),
        "retry": RetryConfig(**retry_kwargs),
        "columns": {k[len("columns.") :]: v for k, v in values.items() if k.startswith("columns.")},
        "extra": extra,
    }


def _namespace(
    prefix: str, values: Mapping[str, Any], references: Mapping[str, str]
) -> NamespaceConfig | None:
    """The namespace under ``prefix`` (``primary`` / ``secondary``) from the values read; None if none is given."""
    keys = {k[len(prefix) + 1 :]: v for k, v in values.items() if k.startswith(prefix + ".")}
    if not keys:
        return None

    def secret(part: str) -> Secret | None:
        value = keys.get(part)
        return Secret(value, references.get(f"{prefix}.{part}")) if value is not None else None

    cred = None
    if any(k.startswith("credential.") for k in keys):
        cred = CredentialConfig(
            kind=keys.get("credential.kind", "default"),
            tenant_id=keys.get("credential.tenant_id"),
            client_id=keys.get("credential.client_id"),
            client_secret=secret("credential.client_secret"),
        )
    return NamespaceConfig(
        connection_string=secret("connection_string"),
        fully_qualified_namespace=keys.get("fully_qualified_namespace"),
        credential=cred,
        namespace_name=keys.get("namespace_name"),
        use_development_emulator=bool(keys.get("use_development_emulator", False)),
    )
