"""The model of a backlog-queue provisioning (SPEC B1): the properties a backlog queue is expected to have and the
drift check (:data:`BACKLOG_QUEUE_SPEC`, :class:`PropertyDifference`), each queue's outcome
(:class:`QueueOutcome`, :class:`QueueStatus`), the report of a run (:class:`ProvisioningReport`: a table, JSON,
the usable queues) and :class:`ProvisioningError`. Pure values; runs anywhere (the driver, the CLI). The I/O that
fills them is in :mod:`spark_sb.admin.provisioning`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import timedelta
from enum import Enum
from typing import Any

from spark_sb.core.durations import MAX_DURATION, format_iso_duration
from spark_sb.core.errors import ProvisioningError

#: A duration at least this large counts as "the maximum" when an existing queue is checked (the service may
#: answer ``...5.4775807S``, which Python reads as ``...5.477581``, or round otherwise).
_MAX_DURATION_TOLERANCE = timedelta(seconds=1)

# --------------------------------------------------------------------------------------------------------------
# The expected properties and the drift check (pure)
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PropertyDifference:
    """One property of an existing backlog queue that differs from :data:`BACKLOG_QUEUE_SPEC`."""

    name: str
    expected: object
    actual: object
    #: the expected value is a floor (a larger one does too): a backlog queue's message size limit
    at_least: bool = False

    def describe(self) -> str:
        floor = "at least " if self.at_least else ""
        return (
            f"{self.name}: expected {floor}{format_value(self.expected)}, actual {format_value(self.actual)}"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "property": self.name,
            "expected": _json_value(self.expected),
            "actual": _json_value(self.actual),
            **({"at_least": True} if self.at_least else {}),
        }


@dataclass(frozen=True)
class BacklogQueueSpec:
    """The properties a backlog queue is created with (SPEC B1; the seed's ``QueueDescription``).

    ``default_message_time_to_live`` and ``auto_delete_on_idle`` are "the maximum the service accepts".
    """

    max_size_in_megabytes: int = 5120
    max_delivery_count: int = 2147483647
    default_message_time_to_live: timedelta = MAX_DURATION
    auto_delete_on_idle: timedelta = MAX_DURATION
    lock_duration: timedelta = timedelta(minutes=1)
    dead_lettering_on_message_expiration: bool = True
    enable_batched_operations: bool = True
    #: SPEC B13: the largest message the queue takes (KB; a Premium entity's setting), at least what the primaries
    #: take (:func:`backlog_spec_for`); None: the namespace's default, neither set nor checked.
    max_message_size_in_kilobytes: int | None = None

    def create_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``ServiceBusAdministrationClient.create_queue``."""
        kwargs: dict[str, Any] = {
            "max_size_in_megabytes": self.max_size_in_megabytes,
            "max_delivery_count": self.max_delivery_count,
            "default_message_time_to_live": self.default_message_time_to_live,
            "auto_delete_on_idle": self.auto_delete_on_idle,
            "lock_duration": self.lock_duration,
            "dead_lettering_on_message_expiration": self.dead_lettering_on_message_expiration,
            "enable_batched_operations": self.enable_batched_operations,
        }
        if self.max_message_size_in_kilobytes is not None:
            kwargs["max_message_size_in_kilobytes"] = self.max_message_size_in_kilobytes
        return kwargs

    def differences(self, queue: Any) -> tuple[PropertyDifference, ...]:
        """How ``queue`` (a ``QueueProperties`` or anything with the same attributes) differs from this spec.

        A maximum duration matches any duration within a second of it (the service's and Python's rounding of
        ``TimeSpan.MaxValue`` differ); a property the service did not report counts as a difference.
        """
        diffs: list[PropertyDifference] = []
        for prop, expected in self.create_kwargs().items():
            actual = getattr(queue, prop, None)
            if (
                prop == "max_message_size_in_kilobytes"
            ):  # a floor: a queue that takes larger messages does too
                if not isinstance(actual, int) or actual < expected:
                    diffs.append(PropertyDifference(prop, expected, actual, at_least=True))
            elif not _matches(expected, actual):
                diffs.append(PropertyDifference(prop, expected, actual))
        return tuple(diffs)


def _matches(expected: object, actual: object) -> bool:
    if actual is None:
        return False
    if isinstance(expected, timedelta):
        if not isinstance(actual, timedelta):
            return False
        if expected >= MAX_DURATION - _MAX_DURATION_TOLERANCE:
            return actual >= MAX_DURATION - _MAX_DURATION_TOLERANCE
        return actual == expected
    if isinstance(expected, bool) or isinstance(actual, bool):
        return isinstance(actual, bool) and actual is expected
    return actual == expected


#: What provisioning creates (SPEC B1).
BACKLOG_QUEUE_SPEC = BacklogQueueSpec()

#: SPEC B13: a Standard entity's message size limit (KB) - its only one; a Premium entity's is 1,024 to 102,400.
STANDARD_MESSAGE_KB = 256
PREMIUM_MAX_MESSAGE_KB = 102_400
#: What the backlog form (SPEC B6) adds to a message, at most: its destination, times and ids as application
#: properties (a few hundred bytes) - a backlog queue takes this much more than its largest primary.
BACKLOG_FORM_KB = 64


def backlog_spec_for(
    primary_kb: Iterable[int | None], base: BacklogQueueSpec = BACKLOG_QUEUE_SPEC
) -> BacklogQueueSpec:
    """SPEC B13: the backlog queues' spec for primaries whose message size limits are ``primary_kb`` (None: not
    read): they take what the largest takes, in its backlog form (:data:`BACKLOG_FORM_KB` more, at most the
    service's 100 MB); ``base`` as it is when every primary is a Standard one (256 KB, the namespace's default).
    Pure."""
    largest = max((kb for kb in primary_kb if kb is not None), default=None)
    if largest is None or largest <= STANDARD_MESSAGE_KB:
        return base
    return replace(base, max_message_size_in_kilobytes=min(PREMIUM_MAX_MESSAGE_KB, largest + BACKLOG_FORM_KB))


def format_duration(value: timedelta) -> str:
    """ISO-8601 duration (``PT1M``, ``P14D``); "max" for the maximum."""
    if value >= MAX_DURATION - _MAX_DURATION_TOLERANCE:
        return "max"
    return format_iso_duration(value)


def format_value(value: object) -> str:
    if value is None:
        return "(not reported)"
    if isinstance(value, timedelta):
        return format_duration(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _json_value(value: object) -> object:
    if isinstance(value, timedelta):
        return format_duration(value)
    return value


# --------------------------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------------------------


class QueueStatus(str, Enum):
    """What provisioning found or did for one queue."""

    CREATED = "created"  # did not exist; created with the spec
    PRESENT = "present"  # existed with the spec's properties
    DRIFTED = "drifted"  # existed with other properties: used, reported
    EXTRA = "extra"  # index >= count (or not an index): left alone, unused
    FAILED = "failed"  # could not be created (or read): left out
    MISSING = "missing"  # dry run: would be created

    def __str__(self) -> str:
        return self.value


_USABLE = frozenset({QueueStatus.CREATED, QueueStatus.PRESENT, QueueStatus.DRIFTED})


@dataclass(frozen=True)
class QueueOutcome:
    """One row of the report."""

    name: str
    status: QueueStatus
    index: int | None = None
    differences: tuple[PropertyDifference, ...] = ()
    attempts: int = 0
    error: str | None = None

    @property
    def usable(self) -> bool:
        return self.status in _USABLE

    @property
    def detail(self) -> str:
        if self.status is QueueStatus.DRIFTED:
            return "; ".join(d.describe() for d in self.differences)
        if self.status is QueueStatus.FAILED:
            tries = (
                f" after {self.attempts} tr{'y' if self.attempts == 1 else 'ies'}" if self.attempts else ""
            )
            return f"not created{tries}: {self.error}"
        if self.status is QueueStatus.EXTRA:
            return "index outside [0, count): left alone, not used"
        if self.status is QueueStatus.MISSING:
            return "would be created (dry run)"
        if self.status is QueueStatus.CREATED and self.attempts > 1:
            return f"created on try {self.attempts}"
        return ""

    def to_dict(self) -> dict[str, object]:
        return {
            "queue": self.name,
            "index": self.index,
            "status": self.status.value,
            "usable": self.usable,
            "detail": self.detail,
            "differences": [d.to_dict() for d in self.differences],
            "attempts": self.attempts,
            "error": self.error,
        }


@dataclass(frozen=True)
class ProvisioningReport:
    """What :func:`provision_backlog_queues` found and did; ``queues`` holds the backlog queues by index, then
    the extras."""

    namespace: str  # the secondary namespace, redacted (host, key name at most)
    primary_namespace_name: str
    count: int
    queues: tuple[QueueOutcome, ...]
    dry_run: bool = False
    last_error: str | None = None
    unauthorized: bool = False  # the last error was a missing right (401/403)

    @property
    def backlog(self) -> tuple[QueueOutcome, ...]:
        """The rows for indexes ``0 .. count-1``, in order."""
        return tuple(q for q in self.queues if q.index is not None and q.status is not QueueStatus.EXTRA)

    def by_status(self, status: QueueStatus) -> list[str]:
        return [q.name for q in self.queues if q.status is status]

    @property
    def usable_queues(self) -> list[str]:
        """Names of the backlog queues a sender may use (created, present or drifted), by index."""
        return [q.name for q in self.backlog if q.usable]

    @property
    def created(self) -> list[str]:
        return self.by_status(QueueStatus.CREATED)

    @property
    def present(self) -> list[str]:
        return self.by_status(QueueStatus.PRESENT)

    @property
    def drifted(self) -> list[str]:
        return self.by_status(QueueStatus.DRIFTED)

    @property
    def extras(self) -> list[str]:
        return self.by_status(QueueStatus.EXTRA)

    @property
    def failed(self) -> list[str]:
        return self.by_status(QueueStatus.FAILED)

    @property
    def missing(self) -> list[str]:
        return self.by_status(QueueStatus.MISSING)

    @property
    def ok(self) -> bool:
        """At least one backlog queue is usable (a dry run: the plan could be read)."""
        if self.dry_run:
            return any(q.usable or q.status is QueueStatus.MISSING for q in self.backlog)
        return bool(self.usable_queues)

    def summary(self) -> str:
        n = self.count
        if len(self.present) == n and not self.failed:
            text = f"all {n} present"
        else:
            parts = []
            for label, names in (
                ("created", self.created),
                ("present", self.present),
                ("drifted", self.drifted),
                ("failed", self.failed),
                ("to create", self.missing),
            ):
                if names:
                    parts.append(f"{len(names)} {label}")
            usable = len(self.usable_queues)
            head = f"dry run: {usable}/{n} present" if self.dry_run else f"{usable}/{n} usable"
            text = f"{head} ({', '.join(parts)})" if parts else head
        if self.extras:
            text += f"; {len(self.extras)} extra left alone"
        return text

    def format_table(self) -> str:
        """A plain-text table: queue, status, detail, then a summary line."""
        rows = [(q.name, q.status.value, q.detail) for q in self.queues]
        w_name = max([len("QUEUE")] + [len(r[0]) for r in rows])
        w_status = max([len("STATUS")] + [len(r[1]) for r in rows])
        lines = [
            f"Backlog queues in {self.namespace} for primary namespace '{self.primary_namespace_name}' "
            f"(count {self.count}){' - DRY RUN, nothing changed' if self.dry_run else ''}",
            f"{'QUEUE':<{w_name}}  {'STATUS':<{w_status}}  DETAIL",
        ]
        lines += [f"{n:<{w_name}}  {s:<{w_status}}  {d}".rstrip() for n, s, d in rows]
        lines.append(self.summary())
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        return {
            "namespace": self.namespace,
            "primary_namespace_name": self.primary_namespace_name,
            "count": self.count,
            "dry_run": self.dry_run,
            "ok": self.ok,
            "summary": self.summary(),
            "usable_queues": self.usable_queues,
            "queues": [q.to_dict() for q in self.queues],
            "last_error": self.last_error,
            "unauthorized": self.unauthorized,
        }

    def raise_if_unusable(self) -> None:
        """Raise :class:`ProvisioningError` when no backlog queue is usable."""
        if not self.ok:
            raise ProvisioningError(
                self.namespace,
                [q.name for q in self.backlog],
                self.last_error or "no backlog queue is usable",
                report=self,
                unauthorized=self.unauthorized,
            )
