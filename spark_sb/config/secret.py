"""Secrets of the configuration: :class:`Secret` (a string whose repr never shows it) and the resolution of
references - ``${env:NAME}`` and, on Databricks, ``{{secrets/<scope>/<key>}}`` - done once, on the driver, when
a configuration is loaded. Every resolved secret is registered with :mod:`spark_sb.core.redact`, so that log filters
and error messages scrub it. Picklable values only; no I/O except reading ``dbutils.secrets`` on Databricks.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spark_sb.core.errors import ConfigError
from spark_sb.core.redact import register_secret

__all__ = ["Resolver", "Secret"]

_err = ConfigError.at


@dataclass(frozen=True)
class Secret:
    """A secret string. ``repr``/``str`` give ``Secret('***')``; :meth:`reveal` returns the value.

    ``reference`` is the text it was resolved from (e.g. ``${env:SB_PRIMARY_CONNECTION_STRING}``), or ``None``
    for a literal.
    Picklable (the value travels to executors); on creation and unpickling the value is registered with
    :func:`spark_sb.core.redact.register_secret`.
    """

    value: str = field(repr=False)
    reference: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.value, str):
            raise TypeError("Secret value must be a str")
        register_secret(self.value)
        for part in re.findall(r"(?:SharedAccessKey|SharedAccessSignature)=([^;]+)", self.value):
            register_secret(part)

    def reveal(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __reduce__(self) -> tuple[Any, ...]:
        return (Secret, (self.value, self.reference))


_ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")
_DBX_REF = re.compile(r"\{\{secrets/([^/{}]+)/([^/{}]+)\}\}")


def _find_dbutils() -> Any:
    """``dbutils`` on a Databricks runtime, else ``None``. Runs on the driver."""
    if not os.environ.get("DATABRICKS_RUNTIME_VERSION"):
        return None
    try:  # notebooks
        import IPython  # type: ignore[import-not-found]

        ip = IPython.get_ipython()
        if ip is not None and "dbutils" in ip.user_ns:
            return ip.user_ns["dbutils"]
    except Exception:  # noqa: BLE001 - fall through to the job path
        pass
    try:  # jobs
        from pyspark.dbutils import DBUtils  # type: ignore[import-not-found]
        from pyspark.sql import SparkSession

        return DBUtils(SparkSession.getActiveSession())
    except Exception:  # noqa: BLE001
        return None


@dataclass
class Resolver:
    """Substitutes secret references in configuration values (driver side, at load time). Its repr shows neither
    the environment (``os.environ``: connection strings among it) nor ``dbutils``: a traceback with locals or a
    log of the resolver must not carry a secret."""

    env: Mapping[str, str] = field(repr=False)
    dbutils: Any = field(default=None, repr=False)
    _dbutils_looked: bool = False

    def resolve(self, key: str, raw: str) -> tuple[str, bool]:
        """Substitute references in ``raw``; returns (value, had_reference)."""
        had = False

        def env_sub(m: re.Match[str]) -> str:
            nonlocal had
            had = True
            name = m.group(1)
            if name not in self.env:
                raise _err(key, f"environment variable {name!r} (referenced as ${{env:{name}}}) is not set")
            return self.env[name]

        def dbx_sub(m: re.Match[str]) -> str:
            nonlocal had
            had = True
            if self.dbutils is None and not self._dbutils_looked:
                self.dbutils = _find_dbutils()
                self._dbutils_looked = True
            if self.dbutils is None:
                if os.environ.get("DATABRICKS_RUNTIME_VERSION"):  # Databricks, a process without dbutils
                    raise _err(
                        key,
                        f"secret reference {m.group(0)} needs dbutils.secrets, which this process has not (Spark "
                        "runs format('servicebus')'s driver-side code in a Python process of its own): set a "
                        f"cluster environment variable to it (SB_NAME={m.group(0)}) and give ${{env:SB_NAME}}, "
                        "or use foreachBatch(ServiceBusSink(config))",
                    )
                raise _err(
                    key,
                    f"secret reference {m.group(0)} needs Databricks (dbutils.secrets) and this is not a "
                    "Databricks runtime; use ${env:NAME} instead",
                )
            try:
                return str(self.dbutils.secrets.get(scope=m.group(1), key=m.group(2)))
            except Exception as exc:  # noqa: BLE001 - report, never with the value
                raise _err(key, f"cannot read Databricks secret {m.group(0)}: {type(exc).__name__}") from None

        value = _ENV_REF.sub(env_sub, raw)
        value = _DBX_REF.sub(dbx_sub, value)
        return value, had
