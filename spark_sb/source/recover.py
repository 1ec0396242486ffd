"""``spark-sb source recover``: deferred messages no offset names (a lost or new checkpoint, SOURCE.md §6) made
readable again without Spark.

A deferred message is invisible to receive; only its sequence number fetches it. The recover sweeps the queue by
peek for DEFERRED messages and, per batch of at most :data:`BATCH`, fetches them peek-locked by number, sends each
back to the queue as it was (message id, body, properties, session: the same message, at-least-once for those) and
completes the deferred original. A message whose re-send failed is left deferred (its lock lapses). On a queue with
duplicate detection a message enqueued within the detection window is left deferred and counted (the service would
drop its re-send as a duplicate of itself): run again after the window, or read with ``recoverDeferred``. Queues only:
re-sending a subscription's message to its topic would reach every subscription (use ``recoverDeferred=true`` in
the query there).

Where it runs: a workstation or the driver node (the command line), never on executors. Every call has a deadline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.errors import ConfigError
from spark_sb.message.outbound import OutboundMessage
from spark_sb.source.reader import deferred_numbers
from spark_sb.source.sdk import SdkPeeker

log = logging.getLogger(__name__)

#: Deferred messages fetched, re-sent and completed per round trip.
BATCH = 100
#: The most a run recovers (a sweep by peek costs one page per 250 messages on the queue).
MOST = 1_000_000


@dataclass
class RecoverReport:
    """What a recover found and did (counts and the numbers found; pure data)."""

    entity: str
    found: int = 0
    recovered: int = 0
    failed: int = 0
    #: Left deferred: enqueued within the queue's duplicate-detection window (a re-send would be dropped).
    too_recent: int = 0
    dry_run: bool = False
    errors: list[str] = field(default_factory=list)  # bounded: the first 10

    def line(self) -> str:
        if self.dry_run:
            return f"{self.entity}: {self.found} deferred messages no offset names (dry run: nothing changed)"
        tail = f"; {self.failed} left deferred ({'; '.join(self.errors[:3])})" if self.failed else ""
        if self.too_recent:
            tail += (
                f"; {self.too_recent} left deferred: enqueued within the queue's duplicate-detection window "
                "(run again after it)"
            )
        return f"{self.entity}: {self.found} deferred messages found, {self.recovered} returned to the queue{tail}"


def recover_deferred(
    config: ServiceBusConfig, entity: str, *, dry_run: bool = False, timeout: float = 30.0
) -> RecoverReport:
    """Sweep ``entity`` (a queue of the primary namespace) for deferred messages and return them to the queue
    (see the module docstring). ``dry_run``: count only. Raises :class:`ConfigError` for a subscription."""
    if "/subscriptions/" in entity:
        raise ConfigError(
            f"entity {entity!r}: a subscription's deferred messages cannot be re-sent to it alone (its topic "
            "would fan them out); read it with recoverDeferred=true instead"
        )
    report = RecoverReport(entity, dry_run=dry_run)
    peeker = SdkPeeker(config)
    try:
        ranges = deferred_numbers(lambda seq, n: peeker.peek(entity, seq, n, timeout), MOST).numbers
    finally:
        peeker.close()
    numbers = [n for lo, hi in ranges for n in range(lo, hi + 1)]
    report.found = len(numbers)
    if dry_run or not numbers:
        return report
    window = _detection_window(config, entity, timeout)
    client = config.primary.client(**config.client_kwargs())
    receiving = client.get_queue_receiver(entity, prefetch_count=0)
    with client, receiving as receiver, client.get_queue_sender(entity) as sender:
        for i in range(0, len(numbers), BATCH):
            _move(receiver, sender, numbers[i : i + BATCH], timeout, window, report)
    return report


def _detection_window(config: ServiceBusConfig, entity: str, timeout: float) -> timedelta | None:
    """The queue's duplicate-detection window (None: no detection). Admin endpoint, within ``timeout``."""
    with config.primary.admin_client(**config.client_kwargs()) as admin:
        props = admin.get_queue(entity, timeout=timeout)
    if not props.requires_duplicate_detection:
        return None
    window = props.duplicate_detection_history_time_window
    return window if isinstance(window, timedelta) else timedelta(minutes=10)


def _move(
    receiver: Any,
    sender: Any,
    seqs: Sequence[int],
    timeout: float,
    window: timedelta | None,
    report: RecoverReport,
) -> None:
    """Fetch ``seqs`` peek-locked, re-send them, complete the originals (each step within ``timeout``). Those
    within the duplicate-detection ``window`` are abandoned (deferred again) and counted."""
    deadline = time.monotonic() + timeout
    try:
        got = receiver.receive_deferred_messages(list(seqs), timeout=timeout)
        if window is not None:
            now = datetime.now(timezone.utc)
            recent = [m for m in got if m.enqueued_time_utc is None or m.enqueued_time_utc + window > now]
            for m in recent:
                receiver.abandon_message(m)
            report.too_recent += len(recent)
            got = [m for m in got if m not in recent]
        if not got:
            return
        sender.send_messages(
            [OutboundMessage.from_received(m).to_sdk() for m in got],
            timeout=max(0.5, deadline - time.monotonic()),
        )
    except Exception as exc:  # noqa: BLE001 - counted; the messages stay deferred
        report.failed += len(seqs)
        if len(report.errors) < 10:
            report.errors.append(f"{type(exc).__name__}: {exc}")
        log.warning("recover %s: %d messages left deferred (%s)", report.entity, len(seqs), exc)
        return
    for m in got:
        try:
            receiver.complete_message(m)
            report.recovered += 1
        except Exception as exc:  # noqa: BLE001 - re-sent but not completed: a copy stays deferred
            report.failed += 1
            if len(report.errors) < 10:
                report.errors.append(f"{type(exc).__name__}: {exc}")
