"""One clear line for each way the acceptance run can fail before or during the scenario (driver only).

:func:`explain` turns an exception into a line that says what to fix: missing Manage rights, a wrong key, a
namespace that does not exist or cannot be reached, throttling, an untrusted certificate. The line never holds a
secret (:func:`spark_sb.core.redact.redact` with the connection strings of the run) and never a traceback.
:func:`preflight` asks both namespaces for their properties (a Manage operation) before anything is created or
Spark is started, so the common mistakes cost a second, not a Spark start-up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.errors import SERVER_BUSY, UNAUTHORIZED, ConfigError, classify
from spark_sb.core.redact import redact
from spark_sb.wire.admin_api import CERTIFICATE_HINT, is_certificate_error

#: Deadlines of every admin call of the run (seconds): connect, then each read.
ADMIN_TIMEOUTS: Mapping[str, Any] = {"connection_timeout": 10, "read_timeout": 30}


class AcceptanceFailure(RuntimeError):
    """A failure already explained in one line (its ``str``), to be printed as it is."""


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        inner = getattr(current, "inner_exception", None)
        current = inner if isinstance(inner, BaseException) else (current.__cause__ or current.__context__)


def _status(exc: BaseException) -> int | None:
    code = getattr(exc, "status_code", None)
    if isinstance(code, int):
        return code
    code = getattr(getattr(exc, "response", None), "status_code", None)
    return code if isinstance(code, int) else None


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "message", None) or exc).strip()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("Content:"):
            return f"{type(exc).__name__}: {line[:300]}"
    return type(exc).__name__


def explain(exc: BaseException, where: str, secrets: Iterable[str] = ()) -> str:
    """What went wrong talking to ``where`` (e.g. ``the primary namespace (contoso.servicebus.windows.net)``)
    and what to fix, in one line without secrets."""
    chain = list(_chain(exc))
    text = " | ".join(str(e) for e in chain).lower()
    status = next((s for s in (_status(e) for e in chain) if s is not None), None)
    said = _first_line(exc)
    if isinstance(exc, AcceptanceFailure):
        line = str(exc)
    elif isinstance(exc, ConfigError):
        line = f"bad setting: {exc}"
    elif "claim" in text or status == 403:
        line = (
            f"{where}: the credential lacks the Manage right, which the run needs to create and delete its "
            "entities: use a SAS policy with Manage (e.g. RootManageSharedAccessKey) or, with Azure AD, the role "
            f"'Azure Service Bus Data Owner' ({said})"
        )
    elif "signature" in text or "invalidsignature" in text:
        line = (
            f"{where}: the key was rejected (wrong SharedAccessKey or SharedAccessKeyName): copy the connection "
            "string again from the portal (Shared access policies)"
        )
    elif classify(exc) is UNAUTHORIZED or "credential" in text and "unavailable" in text:
        line = (
            f"{where}: not authorized: check the key of the connection string, or for Azure AD that "
            f"DefaultAzureCredential finds a login (az login) with the role 'Azure Service Bus Data Owner' ({said})"
        )
    elif is_certificate_error(exc):
        line = f"{where}: the TLS certificate is not trusted: {CERTIFICATE_HINT}"
    elif (
        any(
            s in text
            for s in (
                "failed to resolve",
                "name or service not known",
                "getaddrinfo",
                "nodename nor servname",
            )
        )
        or "no address associated" in text
    ):
        line = (
            f"{where}: the namespace does not exist (its host name does not resolve): check the Endpoint "
            "(sb://<namespace>.servicebus.windows.net/) or the FQDN"
        )
    elif "connection refused" in text or "errno 111" in text:
        line = f"{where}: connection refused: check the Endpoint's host and port, and any firewall in between"
    elif status == 429 or classify(exc) is SERVER_BUSY or "throttl" in text or "server-busy" in text:
        line = (
            f"{where}: the namespace is throttling requests (server busy / HTTP 429): wait a minute and run "
            "again, or use a namespace with less traffic or a higher tier"
        )
    elif "basic tier" in text or ("not supported" in text and "tier" in text):
        line = (
            f"{where}: the namespace's tier does not support what the run creates (topics, duplicate "
            f"detection): use a Standard or Premium namespace ({said})"
        )
    elif "timed out" in text or "timeout" in text:
        line = (
            f"{where}: no answer in time: check the network path to the namespace (proxy, firewall) ({said})"
        )
    else:
        line = f"{where}: {said}"
    return redact(line, secrets)


def describe_side(config: ServiceBusConfig, side: str) -> str:
    """``the primary namespace (host)``: names the namespace without any secret."""
    ns = config.primary if side == "primary" else config.secondary
    return f"the {side} namespace ({ns.endpoint_host()})"


def preflight(config: ServiceBusConfig, admin_kwargs: Mapping[str, Mapping[str, Any]]) -> None:
    """Ask each namespace for its properties with its admin client (needs Manage); raise
    :class:`AcceptanceFailure` with one line on the first failure. Driver only; each call has a deadline."""
    secrets = secrets_of(config)
    for side in ("primary", "secondary"):
        ns = config.primary if side == "primary" else config.secondary
        try:
            admin = ns.admin_client(retry_total=0, **ADMIN_TIMEOUTS, **admin_kwargs.get(side, {}))
            with admin:
                admin.get_namespace_properties()
        except Exception as exc:  # noqa: BLE001 - every failure becomes one line
            raise AcceptanceFailure(explain(exc, describe_side(config, side), secrets)) from None


def secrets_of(config: ServiceBusConfig) -> list[str]:
    """The connection strings and their keys (not the key names: they are not secret, and a registered value is
    redacted process-wide), for :func:`explain` to redact."""
    out: list[str] = []
    for ns in (config.primary, config.secondary):
        if ns.connection_string is not None:
            conn = ns.connection_string.reveal()
            out.append(conn)
            out.extend(
                p.split("=", 1)[1]
                for p in conn.split(";")
                if p.split("=", 1)[0].strip().lower() in ("sharedaccesskey", "sharedaccesssignature")
                and "=" in p
            )
    return out
