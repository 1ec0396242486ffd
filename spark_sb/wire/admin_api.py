"""Admin (HTTPS) calls that the send path needs, and how their errors read (SPEC B1, S8).

The send path asks the admin endpoint one thing: the primary's namespace name, for backlog queue names, when its
endpoint is an IP address or ``localhost`` (:func:`primary_namespace_name`, once per process and endpoint;
:func:`with_namespace_name` asks it on the driver and ships it in the configuration, so executors never ask).
The error helpers (:func:`describe_admin_error`, :func:`is_retryable`, :func:`is_certificate_error`) are shared
with provisioning (:mod:`spark_sb.admin.provisioning`), which makes every other admin call.

Where it runs: the driver, a paired sender or syphon at start (any process). Every call is made with azure-core's
retries off (the caller's rounds are the one retry layer). Nothing here logs or formats a connection string or
key: namespaces are shown by their host and service texts pass through :func:`spark_sb.core.redact.redact`.
"""

from __future__ import annotations

import logging
import ssl
import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from spark_sb.core.errors import INVALID_REQUEST, UNAUTHORIZED, ProvisioningError, classify
from spark_sb.core.redact import redact

if TYPE_CHECKING:
    from azure.servicebus.management import ServiceBusAdministrationClient

    from spark_sb.config.namespace import NamespaceConfig

_LOG = logging.getLogger(__name__)


def _status_code(exc: BaseException) -> int | None:
    code = getattr(exc, "status_code", None)
    if isinstance(code, int):
        return code
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    return code if isinstance(code, int) else None


def is_unauthorized(exc: BaseException) -> bool:
    """401/403 or ``ClientAuthenticationError``: :data:`spark_sb.core.errors.UNAUTHORIZED`."""
    return classify(exc) is UNAUTHORIZED


def is_certificate_error(exc: BaseException) -> bool:
    """The TLS certificate of the endpoint is not trusted (``CERTIFICATE_VERIFY_FAILED``), anywhere in the chain
    of causes (azure-core wraps the ``ssl`` error in a ``ServiceRequestError``)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(current):
            return True
        inner = getattr(current, "inner_exception", None)
        current = inner if isinstance(inner, BaseException) else (current.__cause__ or current.__context__)
    return False


def is_retryable(exc: BaseException) -> bool:
    """Whether trying the same admin call again may help: not when :func:`spark_sb.core.errors.classify` says the
    request itself is at fault (unauthorized: 401/403; invalid request: 400 and the like) or the certificate is
    untrusted; yes for the rest (5xx, 429, timeouts, connection errors)."""
    return classify(exc) not in (UNAUTHORIZED, INVALID_REQUEST) and not is_certificate_error(exc)


#: What to do about an untrusted certificate; a local namespace (development emulator) has its own CA.
CERTIFICATE_HINT = (
    "set REQUESTS_CA_BUNDLE to the PEM file of the CA that signed it; for a local namespace "
    "(UseDevelopmentEmulator=true) that is the ca_file printed by `python -m servicebus_local` "
    "(export REQUESTS_CA_BUNDLE=<ca_file>; with --tls-dir DIR: DIR/ca.pem)"
)


def describe_admin_error(exc: BaseException, namespace: str) -> str:
    """One line, free of secrets, saying what went wrong; for 401/403 which right is missing."""
    message = str(getattr(exc, "message", None) or exc).strip().splitlines()
    first = message[0].strip() if message else ""
    status = _status_code(exc)
    status_text = f" (HTTP {status})" if status is not None else ""
    text = f"{type(exc).__name__}{status_text}: {first}" if first else f"{type(exc).__name__}{status_text}"
    if is_unauthorized(exc):
        text = (
            f"not authorized to manage queues in {namespace}: the 'Manage' right is required (a SAS policy "
            "with Manage such as RootManageSharedAccessKey - Send/Listen are not enough - or, with Azure AD, "
            "the role 'Azure Service Bus Data Owner'), or the key/token was rejected; service said: " + text
        )
    elif is_certificate_error(exc):
        text = f"the TLS certificate of {namespace} is not trusted ({text}): {CERTIFICATE_HINT}"
    return redact(text)


# Our own rounds of tries are the only retry layer (predictable timing on an injected clock): every admin call is
# made with azure-core's retries off.
NO_SDK_RETRY: Mapping[str, Any] = {"retry_total": 0}


# ---------------------------------------------------------------------- the primary's namespace name (B1)
# Its one home: the rule (NamespaceConfig.effective_namespace_name), the question to the namespace
# (resolve_primary_namespace_name) and the per-process answer cache used by senders and sinks.
#: Endpoint (host[:port], no secret) -> the name the namespace reported; bounded by the primaries a process uses.
_resolved_names: dict[str, str] = {}


_resolved_lock = threading.Lock()


def primary_namespace_name(ns: Any) -> str:
    """The primary's namespace name for backlog queue names (SPEC B1), by the same rule as provisioning:
    ``namespace_name``, else the first label of its host (``contoso`` for ``contoso.servicebus.windows.net``),
    else (an IP or ``localhost`` endpoint) the name the namespace reports about itself, asked once per process
    and endpoint through :func:`resolve_primary_namespace_name`."""
    key = str(ns.endpoint_host())  # the secret-free identity of the namespace (sender.namespace_key)

    def lookup() -> str:
        with _resolved_lock:
            known = _resolved_names.get(key)
        if known is None:
            known = resolve_primary_namespace_name(ns)
            with _resolved_lock:
                _resolved_names[key] = known
        return known

    return str(ns.effective_namespace_name(lookup=lookup))


def with_namespace_name(config: Any) -> Any:
    """``config`` with ``primary.namespace_name`` filled in (driver side, once).

    For an IP or ``localhost`` primary endpoint the namespace name (used in backlog queue names) has to be asked
    of the namespace's admin endpoint; doing that on the driver, once, and shipping the name inside the
    configuration means executors never call the admin API - in particular a new Python worker started while
    the primary is down can still divert to the backlog. Without a secondary, or when the name is already known
    (set, or the first label of an FQDN), the config is returned unchanged. Runs on the driver; may do I/O.
    """
    if config.secondary is None or config.primary.namespace_name:
        return config
    name = primary_namespace_name(config.primary)
    return config.with_overrides(primary=replace(config.primary, namespace_name=name))


def resolve_primary_namespace_name(
    primary: NamespaceConfig,
    *,
    admin_client: ServiceBusAdministrationClient | None = None,
) -> str:
    """The primary's namespace name from its config: ``namespace_name``, else the FQDN's first label, else (IP /
    localhost) what the namespace reports about itself (``admin_client`` or one built from ``primary``)."""

    def lookup() -> str:
        if admin_client is not None:
            return namespace_properties_name(admin_client, primary.endpoint_host())
        client = primary.admin_client()
        try:
            return namespace_properties_name(client, primary.endpoint_host())
        finally:
            close_quietly(client)

    return primary.effective_namespace_name(lookup=lookup)


def namespace_properties_name(admin: ServiceBusAdministrationClient, shown: str) -> str:
    try:
        name = admin.get_namespace_properties(**NO_SDK_RETRY).name
    except Exception as exc:
        raise ProvisioningError(
            shown,
            [],
            "could not ask the primary namespace for its name (set primary.namespace_name to skip this): "
            + describe_admin_error(exc, shown),
            unauthorized=is_unauthorized(exc),
        ) from None
    return str(name or "")


def close_quietly(client: Any) -> None:
    try:
        client.close()
    except Exception:  # closing is best effort; the report is what matters
        _LOG.debug("closing an admin client failed", exc_info=True)
