"""The exactly-once horizon in ``spark-sb provision`` and ``spark-sb status`` (SPEC B14): per primary entity, whether
duplicate detection is on and its window, and a warning when it is off, shorter than ``exactly_once_horizon`` or
could not be read (:class:`~spark_sb.wire.duplicate_detection.DuplicateDetection`).

Which entities: the configuration's ``entity``, the ones named with ``--entity``, and (``status``) those of the
primary namespace in the ``entities`` state table - each once, in that order. Their answers come from the primary's
admin endpoint (the ``Manage`` right; for a local namespace ``REQUESTS_CA_BUNDLE``), each call within
``send_timeout``. Runs where the commands run (a workstation, the driver node), never on executors.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.failover.outcome import namespace_key
from spark_sb.wire.admin_api import close_quietly, describe_admin_error
from spark_sb.wire.duplicate_detection import DuplicateDetection, read_duplicate_detection, span

__all__ = ["Horizon", "check_horizon", "primary_entities"]

_LOG = logging.getLogger("spark_sb")


def primary_entities(
    config: ServiceBusConfig, named: Iterable[str] = (), state_rows: Iterable[dict[str, Any]] = ()
) -> list[str]:
    """The primary entities to report: ``config.entity``, ``named``, then the entities of the primary namespace in
    the ``entities`` table rows ``state_rows``; each once, in that order (pure)."""
    try:
        primary = namespace_key(config.primary)
    except Exception:  # noqa: BLE001 - a namespace without a host to compare: every row is the primary's
        primary = None
    found = [config.entity or "", *named]
    found += [r.get("entity") or "" for r in state_rows if primary is None or r.get("namespace") == primary]
    return list(dict.fromkeys(e for e in found if e))


@dataclass(frozen=True)
class Horizon:
    """What the commands show: ``exactly_once_horizon`` (seconds) and each entity's duplicate detection."""

    horizon: float
    entities: tuple[DuplicateDetection, ...]

    @property
    def warnings(self) -> list[str]:
        return [w for w in (e.warning(self.horizon) for e in self.entities) if w]

    def lines(self) -> list[str]:
        """The text report: a heading, one line per entity, its warning under it."""
        head = f"duplicate detection of the primary entities (exactly_once_horizon {span(self.horizon)}):"
        if not self.entities:
            return [head, "  (no primary entity named: set entity, or give --entity)"]
        out = [head]
        for e in self.entities:
            out.append(f"  {e.entity:<30} {(e.kind or '-'):<6} {e.describe()}")
            warning = e.warning(self.horizon)
            if warning:
                out.append(f"    WARNING: {warning}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "exactly_once_horizon_seconds": self.horizon,
            "entities": [e.to_json(self.horizon) for e in self.entities],
        }

    def log(self) -> None:
        """Each warning as a WARNING log line (stderr on the command line)."""
        for warning in self.warnings:
            _LOG.warning("exactly-once horizon: %s", warning)


def check_horizon(config: ServiceBusConfig, entities: Sequence[str], *, admin_client: Any = None) -> Horizon:
    """Ask the primary's admin endpoint (``admin_client``, or one built from ``config.primary`` and closed) about
    each of ``entities``. Never raises: what could not be read is shown as such."""
    horizon = float(config.exactly_once_horizon)
    if not entities:
        return Horizon(horizon, ())
    try:
        shown = str(config.primary.endpoint_host())
    except Exception:  # noqa: BLE001 - named as the primary, never by its connection string
        shown = "the primary namespace"
    admin = admin_client
    try:
        if admin is None:
            admin = config.primary.admin_client()
    except Exception as exc:  # noqa: BLE001 - shown per entity
        error = describe_admin_error(exc, shown)
        return Horizon(horizon, tuple(DuplicateDetection(e, error=error) for e in entities))
    try:
        timeout = float(config.send_timeout)
        found = tuple(read_duplicate_detection(admin, e, timeout=timeout, shown=shown) for e in entities)
    finally:
        if admin_client is None:
            close_quietly(admin)
    return Horizon(horizon, found)
