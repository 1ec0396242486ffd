"""Where the acceptance scenario runs: two namespaces, as configuration sections plus admin-client options.

Runs on the driver only. A :class:`Backend` holds configuration (connection strings are wrapped by the product's
config as secrets and never printed); the scenario builds every client from it.

* :func:`local_backend` - two local namespaces (``servicebus_local``), as CI runs it.
* :func:`azure_backend` - the user's namespaces from ``SB_PRIMARY_CONNECTION_STRING`` /
  ``SB_SECONDARY_CONNECTION_STRING``, or ``SB_PRIMARY_FQDN`` / ``SB_SECONDARY_FQDN`` with Azure AD
  (``credential.kind: default``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The environment variables of ``make test-azure``, per side: a connection string, or an FQDN for Azure AD.
ENV_VARIABLES: dict[str, tuple[str, str]] = {
    "primary": ("SB_PRIMARY_CONNECTION_STRING", "SB_PRIMARY_FQDN"),
    "secondary": ("SB_SECONDARY_CONNECTION_STRING", "SB_SECONDARY_FQDN"),
}

#: What a dry run prints when the variables are missing.
MISSING_HELP = (
    "set SB_PRIMARY_CONNECTION_STRING and SB_SECONDARY_CONNECTION_STRING to two Service Bus namespaces "
    "(SAS policies with the Manage right, e.g. RootManageSharedAccessKey), or SB_PRIMARY_FQDN and "
    "SB_SECONDARY_FQDN (e.g. contoso.servicebus.windows.net) to use Azure AD (DefaultAzureCredential, role "
    "'Azure Service Bus Data Owner'); the run creates uniquely named entities and deletes them afterwards"
)


class MissingSettings(ValueError):
    """The environment names no namespace for one side or both."""


@dataclass(frozen=True)
class Backend:
    """Two namespaces for the scenario: config sections for ``primary`` / ``secondary`` and the keyword
    arguments their admin clients need (``connection_verify`` for a local namespace's development CA)."""

    name: str
    primary: Mapping[str, Any]
    secondary: Mapping[str, Any]
    primary_admin_kwargs: Mapping[str, Any] = field(default_factory=dict)
    secondary_admin_kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: The namespaces as ``format("servicebus")`` options: secrets by reference (``${env:NAME}``) where the
    #: values come from the environment, so no key is put in a query plan.
    options: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:  # never shows a connection string
        return f"Backend({self.name!r})"


def _side(environ: Mapping[str, str], side: str) -> dict[str, Any] | None:
    conn_var, fqdn_var = ENV_VARIABLES[side]
    fqdn = environ.get(fqdn_var, "").strip()
    if fqdn:
        return {"fully_qualified_namespace": fqdn, "credential": {"kind": "default"}}
    conn = environ.get(conn_var, "").strip()
    if conn:
        return {"connection_string": conn}
    return None


def _options(environ: Mapping[str, str], side: str) -> dict[str, str]:
    conn_var, fqdn_var = ENV_VARIABLES[side]
    if environ.get(fqdn_var, "").strip():
        return {
            f"{side}.fully_qualified_namespace": environ[fqdn_var].strip(),
            f"{side}.credential.kind": "default",
        }
    return {f"{side}.connection_string": f"${{env:{conn_var}}}"}


def azure_backend(environ: Mapping[str, str]) -> Backend:
    """The user's two namespaces from the environment; :class:`MissingSettings` names what is missing."""
    primary, secondary = _side(environ, "primary"), _side(environ, "secondary")
    missing = [
        f"{ENV_VARIABLES[side][0]} (or {ENV_VARIABLES[side][1]})"
        for side, section in (("primary", primary), ("secondary", secondary))
        if section is None
    ]
    if missing or primary is None or secondary is None:
        raise MissingSettings("not set: " + ", ".join(missing))
    return Backend(
        "azure",
        primary,
        secondary,
        options={**_options(environ, "primary"), **_options(environ, "secondary")},
    )


def local_backend(primary: Any, secondary: Any) -> Backend:
    """Two started ``servicebus_local`` namespaces (``LocalNamespace``): what CI runs the scenario against."""
    return Backend(
        "local",
        {"connection_string": primary.connection_string},
        {"connection_string": secondary.connection_string},
        {"connection_verify": primary.ca_file},
        {"connection_verify": secondary.ca_file},
        # The local namespaces' key is a fixed development value, not a secret: given literally.
        {
            "primary.connection_string": primary.connection_string,
            "secondary.connection_string": secondary.connection_string,
        },
    )
