"""A credential whose tokens live a short time, for bench/bench_soak.py (the namespaces enforce token expiry).

Imported by name wherever the sink's configuration is unpickled: the driver and Spark's Python workers. The
bench puts this directory on ``PYTHONPATH`` before the session starts, so the workers import it as
``soak_credential``. The configuration object (:class:`ShortTokens`) is picklable; the live credential
(:class:`ShortLivedTokens`) is built where the client is built (executor or driver) and never pickled.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from azure.core.credentials import AccessToken

from spark_sb.config.namespace import CredentialConfig


@dataclass(frozen=True)
class ShortTokens(CredentialConfig):
    """Credential settings: tokens valid for ``lifetime`` seconds (Azure AD tokens live about an hour).

    Picklable (a frozen dataclass of plain values); :meth:`build` runs where the client is built."""

    lifetime: float = 60.0

    def build(self) -> Any:
        return ShortLivedTokens(self.lifetime)


class ShortLivedTokens:
    """A ``TokenCredential``: every ``get_token`` issues a fresh opaque token expiring ``lifetime`` s from now.

    The local namespace accepts any token (it runs without ``--key``) and enforces its expiry."""

    def __init__(self, lifetime: float) -> None:
        self.lifetime = lifetime
        self.issued = 0

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.issued += 1
        return AccessToken(f"soak-{uuid.uuid4()}", int(time.time() + self.lifetime))

    def close(self) -> None:
        return None

    def __enter__(self) -> ShortLivedTokens:
        return self

    def __exit__(self, *exc: object) -> None:
        return None
