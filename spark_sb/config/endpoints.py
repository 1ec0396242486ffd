"""Connection strings and endpoint hosts (SPEC S8, B1): parsing a Service Bus connection string without ever
echoing it, telling an address host (IP, ``localhost``) from a namespace host, and the primary's namespace name
derived from its host. Pure (apart from the ``lookup`` callback of :func:`derive_namespace_name`); runs anywhere.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass

from spark_sb.core.errors import ConfigError

__all__ = [
    "ConnectionStringInfo",
    "derive_namespace_name",
    "is_address_host",
    "parse_connection_string",
]

_err = ConfigError.at


@dataclass(frozen=True)
class ConnectionStringInfo:
    """The non-secret parts of a Service Bus connection string."""

    endpoint: str  # e.g. "sb://contoso.servicebus.windows.net/"
    host: str  # host[:port]
    shared_access_key_name: str | None
    has_shared_access_key: bool
    has_shared_access_signature: bool
    entity_path: str | None
    use_development_emulator: bool


_CS_KEYS = {
    "endpoint": "Endpoint",
    "sharedaccesskeyname": "SharedAccessKeyName",
    "sharedaccesskey": "SharedAccessKey",
    "sharedaccesssignature": "SharedAccessSignature",
    "entitypath": "EntityPath",
    "usedevelopmentemulator": "UseDevelopmentEmulator",
}


def parse_connection_string(conn: str, key: str = "connection_string") -> ConnectionStringInfo:
    """Parse ``conn`` (Endpoint, SharedAccessKeyName, SharedAccessKey, SharedAccessSignature, EntityPath,
    UseDevelopmentEmulator). Raises :class:`ConfigError` naming ``key``; never echoes the string."""
    parts: dict[str, str] = {}
    emulator_raw = "false"
    # Split as the SDK splits when a client is built (the whole string stripped, trailing ';' dropped, nothing
    # else): an empty part or a space around a name, which it refuses or misses then, is refused here, now.
    text = conn.strip().rstrip(";")
    for segment in text.split(";") if text else ():
        if not segment.strip():
            raise _err(key, "malformed connection string: an empty part (';;' or a leading ';')")
        name, sep, value = segment.partition("=")
        if not sep or not name.strip():
            raise _err(key, "malformed connection string: every part must look like Name=value")
        if name != name.strip():
            raise _err(key, "malformed connection string: a part's name has spaces around it")
        canon = _CS_KEYS.get(name.lower())
        if canon is None:
            # a key pasted without its 'SharedAccessKey=' is a part's name: shown only if it looks like one
            shown = repr(name) if re.fullmatch(r"[A-Za-z]{1,24}", name) else "(not shown)"
            raise _err(
                key,
                f"malformed connection string: unknown part {shown} (valid: {', '.join(_CS_KEYS.values())})",
            )
        if canon in parts:
            raise _err(key, f"malformed connection string: {canon} given twice")
        parts[canon] = value.strip()
        if canon == "UseDevelopmentEmulator":
            emulator_raw = value
    endpoint = parts.get("Endpoint")
    if not endpoint:
        raise _err(key, "malformed connection string: Endpoint is missing")
    # the scheme in any case, as the SDK reads it (``SB://`` too: urlparse lowers it)
    m = re.fullmatch(r"(?:(sb|amqps?|https?)://)?([^/\s]+?)/?", endpoint, flags=re.IGNORECASE)
    if not m:
        raise _err(key, "malformed connection string: Endpoint must look like sb://<host>[:port]/")
    if m.group(1) is None:  # the SDK refuses it only when a client is built, as a bare ValueError
        raise _err(
            key,
            "malformed connection string: Endpoint needs its scheme: sb://<host>[:port]/ (e.g. sb://127.0.0.1:5682)",
        )
    host = m.group(2)
    key_name = parts.get("SharedAccessKeyName")
    has_key = bool(parts.get("SharedAccessKey"))
    has_sas = bool(parts.get("SharedAccessSignature"))
    if has_sas and (key_name or has_key):
        raise _err(
            key, "malformed connection string: give SharedAccessSignature or a key name and key, not both"
        )
    if not has_sas and not (key_name and has_key):
        raise _err(
            key,
            "malformed connection string: needs SharedAccessKeyName and SharedAccessKey, or SharedAccessSignature",
        )
    # The SDK's test is ``== "true"``: 'True' would be TLS on port 5671, not the emulator's plain AMQP
    if emulator_raw != "true" and emulator_raw.strip().lower() != "false":
        raise _err(
            key,
            "malformed connection string: UseDevelopmentEmulator must be true or false "
            "('true' in lower case: the SDK reads any other spelling as false)",
        )
    return ConnectionStringInfo(
        endpoint=f"sb://{host}/",
        host=host,
        shared_access_key_name=key_name,
        has_shared_access_key=has_key,
        has_shared_access_signature=has_sas,
        entity_path=parts.get("EntityPath") or None,
        use_development_emulator=emulator_raw == "true",
    )


def _split_host_port(endpoint_host: str) -> str:
    """The host of ``host[:port]`` / ``[v6]:port`` / ``sb://host:port/`` (pure)."""
    host = endpoint_host.strip()
    host = re.sub(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", "", host)  # sb://, amqps://, https://
    host = host.split("/", 1)[0]
    if host.startswith("["):  # [::1]:5671
        return host[1 : host.index("]")] if "]" in host else host[1:]
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host


def is_address_host(endpoint_host: str) -> bool:
    """True for an IP literal or ``localhost`` (a name that says nothing about the namespace)."""
    host = _split_host_port(endpoint_host).rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def derive_namespace_name(
    endpoint_host: str,
    *,
    override: str | None = None,
    lookup: Callable[[], str] | None = None,
    key: str = "primary.namespace_name",
) -> str:
    """The primary's namespace name, as used in backlog queue names (pure apart from ``lookup``).

    * ``override`` (config key ``primary.namespace_name``) wins;
    * an FQDN gives its first label (``contoso`` for ``contoso.servicebus.windows.net``);
    * an IP literal or ``localhost`` asks the namespace itself: ``lookup()`` (normally
      ``admin_client.get_namespace_properties().name``).

    Errors name ``key``, the setting that would have given the name.
    """
    if override is not None and override.strip():
        return override.strip()
    host = _split_host_port(endpoint_host).rstrip(".")
    if not host:
        raise _err(key, "cannot derive a namespace name from an empty endpoint host")
    if is_address_host(host):
        if lookup is None:
            raise _err(
                key,
                f"the endpoint {endpoint_host.strip()} is an address, not a namespace host name; "
                f"set {key} or ask the namespace "
                "(spark_sb.wire.admin_api.resolve_primary_namespace_name, get_namespace_properties)",
            )
        name = lookup()
        if not name:
            raise _err(key, f"the namespace at {host!r} did not report its name; set it")
        return name
    return host.split(".", 1)[0]
