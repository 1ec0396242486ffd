"""Backlog-queue provisioning in the secondary namespace (SPEC B1).

For ``i`` in ``[0, backlog_queue_count)`` the queue ``<primary-namespace>/x-servicebus-transfer/<i>`` must exist in
the *secondary* namespace. A missing queue is created with :data:`BACKLOG_QUEUE_SPEC`; an existing queue is never
modified or deleted (a queue whose properties differ is used and reported as *drifted*); queues with an index
``>= count`` are left alone and reported as *extra*. Creation is retried in rounds (``tries``, ``retry_pause`` on
an injected :class:`~spark_sb.core.clock.Clock`); a queue that cannot be created is reported and left out, and if no
backlog queue is usable :class:`ProvisioningError` names the namespace, the queues tried and the last error.

Where it runs: on the driver, in the ``python -m spark_sb provision`` command, or in the paired sender at start
(which reads :attr:`ProvisioningReport.usable_queues`). It only talks HTTPS to the namespaces through the SDK's
``ServiceBusAdministrationClient``; it never runs on Spark executors and never opens an AMQP connection.

Nothing here logs or formats a connection string or key: namespaces are shown by their host (or
``NamespaceConfig.redacted()``) and service error texts pass through :func:`spark_sb.core.redact.redact`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spark_sb.admin.report import (
    BACKLOG_QUEUE_SPEC,
    BacklogQueueSpec,
    ProvisioningReport,
    QueueOutcome,
    QueueStatus,
)
from spark_sb.core.clock import Clock, SystemClock
from spark_sb.core.errors import ProvisioningError
from spark_sb.message.backlog import backlog_queue_names, parse_backlog_queue_name
from spark_sb.wire.admin_api import (
    NO_SDK_RETRY,
    close_quietly,
    describe_admin_error,
    is_retryable,
    is_unauthorized,
    namespace_properties_name,
    resolve_primary_namespace_name,
)

if TYPE_CHECKING:
    from azure.servicebus.management import ServiceBusAdministrationClient

    from spark_sb.config.service_bus import ServiceBusConfig

_LOG = logging.getLogger(__name__)

DEFAULT_TRIES = 3
DEFAULT_RETRY_PAUSE = 30.0


# --------------------------------------------------------------------------------------------------------------
# Error classification (pure)
# --------------------------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------------------------
# Provisioning
# --------------------------------------------------------------------------------------------------------------


@dataclass
class _Attempt:
    index: int
    name: str
    attempts: int = 0
    error: str | None = None
    outcome: QueueOutcome | None = None
    retry: bool = True
    unauthorized: bool = False


@dataclass
class _Resolved:
    admin: ServiceBusAdministrationClient
    namespace: str
    primary_name: str
    owned: list[Any] = field(default_factory=list)


def provision_backlog_queues(
    config: ServiceBusConfig | None = None,
    *,
    admin_client: ServiceBusAdministrationClient | None = None,
    primary_namespace_name: str | None = None,
    primary_admin_client: ServiceBusAdministrationClient | None = None,
    count: int | None = None,
    tries: int = DEFAULT_TRIES,
    retry_pause: float = DEFAULT_RETRY_PAUSE,
    clock: Clock | None = None,
    dry_run: bool = False,
    check: bool = True,
    spec: BacklogQueueSpec = BACKLOG_QUEUE_SPEC,
) -> ProvisioningReport:
    """Make sure the backlog queues exist in the secondary namespace; return what was found and done.

    Runs on the driver (or in the CLI / the paired sender at start), never on executors.

    :param config: the connector config; gives the secondary namespace (admin client), the primary's namespace
        name (``primary.namespace_name`` or derived from its endpoint) and ``backlog_queue_count``.
    :param admin_client: an already built admin client for the *secondary* namespace (dependency injection;
        not closed here). Required without ``config``.
    :param primary_namespace_name: the primary's namespace name; overrides ``config``.
    :param primary_admin_client: admin client of the primary, used only when its endpoint is an IP or
        ``localhost`` and no name is configured (``get_namespace_properties().name``).
    :param count: number of backlog queues; default ``config.backlog_queue_count`` (10 without config).
    :param tries: rounds of creation attempts per missing queue (>= 1); the pause between rounds is
        ``retry_pause`` seconds on ``clock``.
    :param dry_run: change nothing; missing queues are reported as ``missing``.
    :param check: raise :class:`ProvisioningError` when no backlog queue is usable (else just return the report).
    """
    if tries < 1:
        raise ValueError("tries must be >= 1")
    if retry_pause < 0:
        raise ValueError("retry_pause must be >= 0")
    if count is None:
        count = config.backlog_queue_count if config is not None else 10
    if count < 1:
        raise ValueError("backlog_queue_count must be > 0")
    clock = clock or SystemClock()

    resolved = _resolve(config, admin_client, primary_namespace_name, primary_admin_client)
    try:
        report = _provision(
            resolved.admin,
            resolved.namespace,
            resolved.primary_name,
            count,
            tries,
            retry_pause,
            clock,
            dry_run,
            spec,
        )
    finally:
        for client in resolved.owned:
            close_quietly(client)
    _log_report(report)
    if check:
        report.raise_if_unusable()
    return report


def _resolve(
    config: ServiceBusConfig | None,
    admin_client: ServiceBusAdministrationClient | None,
    primary_namespace_name: str | None,
    primary_admin_client: ServiceBusAdministrationClient | None,
) -> _Resolved:
    owned: list[Any] = []
    if primary_namespace_name is None and config is None and primary_admin_client is not None:
        primary_namespace_name = namespace_properties_name(
            primary_admin_client, _admin_host(primary_admin_client)
        )
    if primary_namespace_name is None:
        if config is None:
            raise ValueError(
                "provision_backlog_queues needs a config, primary_namespace_name or primary_admin_client"
            )
        primary_namespace_name = resolve_primary_namespace_name(
            config.primary, admin_client=primary_admin_client
        )
    if admin_client is None:
        if config is None or config.secondary is None:
            raise ValueError(
                "backlog queues live in the secondary namespace: configure secondary.connection_string or "
                "secondary.fully_qualified_namespace (or pass admin_client)"
            )
        admin_client = config.secondary.admin_client()
        owned.append(admin_client)
        namespace = config.secondary.redacted()
    elif config is not None and config.secondary is not None:
        namespace = config.secondary.redacted()
    else:
        namespace = _admin_host(admin_client)
    return _Resolved(admin_client, namespace, primary_namespace_name, owned)


def _admin_host(admin: Any) -> str:
    return str(getattr(admin, "fully_qualified_namespace", None) or "the secondary namespace")


def _list_backlog_like(
    admin: ServiceBusAdministrationClient,
    namespace: str,
    primary_name: str,
    tries: int,
    retry_pause: float,
    clock: Clock,
) -> dict[str, Any]:
    """All queues whose name starts with ``<primary>/x-servicebus-transfer/``, keyed by casefolded name."""
    last: str = ""
    unauthorized = False
    for attempt in range(1, tries + 1):
        try:
            found: dict[str, Any] = {}
            for q in admin.list_queues(**NO_SDK_RETRY):
                if parse_backlog_queue_name(q.name, primary_name) is not None:
                    found[q.name.casefold()] = q
            return found
        except Exception as exc:
            last = describe_admin_error(exc, namespace)
            unauthorized = is_unauthorized(exc)
            if not is_retryable(exc) or attempt == tries:
                break
            _LOG.warning("listing queues in %s failed (try %d of %d): %s", namespace, attempt, tries, last)
            clock.sleep(retry_pause)
    raise ProvisioningError(
        namespace,
        backlog_queue_names(primary_name, 0),
        f"could not list the queues of the namespace ({attempt} tr{'y' if attempt == 1 else 'ies'}): {last}",
        unauthorized=unauthorized,
    )


def _provision(
    admin: ServiceBusAdministrationClient,
    namespace: str,
    primary_name: str,
    count: int,
    tries: int,
    retry_pause: float,
    clock: Clock,
    dry_run: bool,
    spec: BacklogQueueSpec,
) -> ProvisioningReport:
    names = backlog_queue_names(primary_name, count)
    try:
        existing = _list_backlog_like(admin, namespace, primary_name, tries, retry_pause, clock)
    except ProvisioningError as exc:
        raise ProvisioningError(namespace, names, exc.last_error, unauthorized=exc.unauthorized) from None

    rows: dict[int, QueueOutcome] = {}
    todo: list[_Attempt] = []
    for i, name in enumerate(names):
        props = existing.pop(name.casefold(), None)
        if props is not None:
            rows[i] = _existing_outcome(name, i, props, spec)
        elif dry_run:
            rows[i] = QueueOutcome(name, QueueStatus.MISSING, i)
        else:
            todo.append(_Attempt(i, name))

    last_error: str | None = None
    unauthorized = False
    for round_no in range(1, tries + 1):
        pending = [a for a in todo if a.outcome is None and a.retry]
        if not pending:
            break
        if round_no > 1:
            _LOG.warning(
                "creating %d backlog queue(s) in %s failed; trying again in %.0f s (try %d of %d)",
                len(pending),
                namespace,
                retry_pause,
                round_no,
                tries,
            )
            clock.sleep(retry_pause)
        for a in pending:
            a.attempts += 1
            a.outcome, a.error, a.retry, a.unauthorized = _create_one(admin, namespace, a, spec)
            if a.error is not None:
                last_error = a.error
                unauthorized = a.unauthorized
    for a in todo:
        rows[a.index] = a.outcome or QueueOutcome(
            a.name, QueueStatus.FAILED, a.index, attempts=a.attempts, error=a.error
        )

    extras = sorted(existing.values(), key=lambda q: _extra_sort_key(q.name, primary_name))
    outcomes = [rows[i] for i in range(count)]
    for q in extras:
        suffix = parse_backlog_queue_name(q.name, primary_name) or ""
        outcomes.append(QueueOutcome(q.name, QueueStatus.EXTRA, int(suffix) if suffix.isdigit() else None))
    return ProvisioningReport(
        namespace=namespace,
        primary_namespace_name=primary_name,
        count=count,
        queues=tuple(outcomes),
        dry_run=dry_run,
        last_error=last_error,
        unauthorized=unauthorized,
    )


def _extra_sort_key(name: str, primary_name: str) -> tuple[int, str]:
    suffix = parse_backlog_queue_name(name, primary_name) or ""
    return (int(suffix) if suffix.isdigit() else 1 << 62, name)


def _existing_outcome(name: str, index: int, props: Any, spec: BacklogQueueSpec) -> QueueOutcome:
    diffs = spec.differences(props)
    if diffs:
        return QueueOutcome(name, QueueStatus.DRIFTED, index, differences=diffs)
    return QueueOutcome(name, QueueStatus.PRESENT, index)


def _create_one(
    admin: ServiceBusAdministrationClient, namespace: str, a: _Attempt, spec: BacklogQueueSpec
) -> tuple[QueueOutcome | None, str | None, bool, bool]:
    """One creation attempt: (outcome or None, error or None, worth retrying, unauthorized)."""
    from azure.core.exceptions import ResourceExistsError

    try:
        admin.create_queue(a.name, **spec.create_kwargs(), **NO_SDK_RETRY)
    except ResourceExistsError:
        # Created meanwhile by someone else (another provisioning run): use it as found.
        try:
            props = admin.get_queue(a.name, **NO_SDK_RETRY)
        except Exception as exc:
            return None, describe_admin_error(exc, namespace), is_retryable(exc), is_unauthorized(exc)
        return _existing_outcome(a.name, a.index, props, spec), None, False, False
    except Exception as exc:
        return None, describe_admin_error(exc, namespace), is_retryable(exc), is_unauthorized(exc)
    return QueueOutcome(a.name, QueueStatus.CREATED, a.index, attempts=a.attempts), None, False, False


def _log_report(report: ProvisioningReport) -> None:
    for q in report.queues:
        if q.status is QueueStatus.DRIFTED:
            _LOG.warning(
                "backlog queue %s in %s differs from the backlog spec (used anyway): %s",
                q.name,
                report.namespace,
                q.detail,
            )
        elif q.status is QueueStatus.FAILED:
            _LOG.warning("backlog queue %s in %s is left out: %s", q.name, report.namespace, q.detail)
        elif q.status is QueueStatus.CREATED:
            _LOG.info("created backlog queue %s in %s", q.name, report.namespace)
    _LOG.info("backlog queues in %s: %s", report.namespace, report.summary())


__all__ = [
    "DEFAULT_RETRY_PAUSE",
    "DEFAULT_TRIES",
    "provision_backlog_queues",
]
