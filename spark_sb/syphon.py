"""The syphon: moves messages from the backlog queues back to their primary entities (SPEC B9, B11, B12).

A :class:`Syphon` receives from the backlog queues of the *secondary* namespace in peek-lock mode (prefetch 0 by
default), restores each message with :func:`spark_sb.mapping.from_backlog`, sends it to the entity named in
``x-ms-path`` on the *primary*, and completes it in the backlog only after the primary accepted it. On a failed
primary send it abandons the messages and backs off that entity; a settle failure (lock lost, connection lost) is
logged and the loop goes on, expecting redelivery (message ids are preserved, so duplicate detection on the primary
makes the replay harmless). A message whose time to live ran out while it sat in the backlog is dead-lettered in the
backlog with a reason, never forwarded; a scheduled time still in the future is kept; probes are dropped.

Where it runs: in whichever process calls it (the demo's driver; executors in the Spark syphon job). It builds its
own clients lazily from the (picklable) :class:`~spark_sb.config.ServiceBusConfig`; a ``Syphon`` itself is not
picklable and not thread-safe: one per thread.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from spark_sb.clock import Clock, SystemClock
from spark_sb.config import ServiceBusConfig
from spark_sb.mapping import OutboundMessage, from_backlog, is_backlog_message
from spark_sb.transport import PRIMARY, SdkBatch, SdkTransport, Target

if TYPE_CHECKING:  # pragma: no cover
    from azure.servicebus import (
        ServiceBusClient,
        ServiceBusReceivedMessage,
        ServiceBusReceiver,
    )

log = logging.getLogger(__name__)

#: Dead-letter reasons written into the backlog queue's dead-letter sub-queue.
EXPIRED_IN_BACKLOG = "TTLExpiredInBacklog"
NOT_A_BACKLOG_MESSAGE = "NotABacklogMessage"

#: A message whose lock expires within this margin is not forwarded (B12): it would be redelivered anyway.
LOCK_SAFETY_MARGIN = timedelta(seconds=2)


@dataclass
class SyphonOutcome:
    """What one drain did. Small and picklable (the Spark syphon job returns these from executors)."""

    received: int = 0
    forwarded: dict[str, int] = field(default_factory=dict)
    expired: int = 0
    invalid: int = 0
    probes_dropped: int = 0
    abandoned: int = 0
    skipped_lock_expiring: int = 0
    settle_failures: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def forwarded_total(self) -> int:
        return sum(self.forwarded.values())

    def merge(self, other: SyphonOutcome) -> SyphonOutcome:
        out = SyphonOutcome(
            received=self.received + other.received,
            forwarded=dict(self.forwarded),
            expired=self.expired + other.expired,
            invalid=self.invalid + other.invalid,
            probes_dropped=self.probes_dropped + other.probes_dropped,
            abandoned=self.abandoned + other.abandoned,
            skipped_lock_expiring=self.skipped_lock_expiring + other.skipped_lock_expiring,
            settle_failures=self.settle_failures + other.settle_failures,
            errors=self.errors + other.errors,
        )
        for entity, n in other.forwarded.items():
            out.forwarded[entity] = out.forwarded.get(entity, 0) + n
        return out


def restore_for_primary(
    received: OutboundMessage, now: datetime
) -> tuple[OutboundMessage | None, str | None]:
    """Decide what to forward for one backlog message (pure; B9).

    Returns ``(message, None)`` with the message to send to the primary (entity set, remaining TTL, scheduled time
    kept only while still in the future) or ``(None, reason)`` when it must be dead-lettered in the backlog.
    """
    if not is_backlog_message(received):
        return None, NOT_A_BACKLOG_MESSAGE
    restored, entered = from_backlog(received)
    changes: dict[str, Any] = {}
    if restored.time_to_live is not None:
        remaining = restored.time_to_live - max(now - entered, timedelta(0))
        if remaining <= timedelta(0):
            return None, EXPIRED_IN_BACKLOG
        changes["time_to_live"] = remaining
    if restored.scheduled_enqueue_time is not None and restored.scheduled_enqueue_time <= now:
        changes["scheduled_enqueue_time"] = None
    if changes:
        restored = replace(restored, **changes)
    return restored, None


class Syphon:
    """Drains backlog queues into the primary namespace. See the module docstring for the guarantees.

    ``backlog_queues``: the queue names to drain (default: all ``backlog_queue_count`` names derived from
    ``primary_namespace_name``, itself defaulting to the primary's namespace name by the rule of SPEC B1, the same
    as provisioning's and the paired sender's).
    """

    def __init__(
        self,
        config: ServiceBusConfig,
        *,
        backlog_queues: Sequence[str] | None = None,
        primary_namespace_name: str | None = None,
        clock: Clock | None = None,
        entity_backoff: float = 5.0,
    ) -> None:
        if config.secondary is None:
            raise ValueError("the syphon needs a secondary namespace (config key 'secondary')")
        self.config = config
        self.clock = clock or SystemClock()
        if backlog_queues is None:
            from spark_sb.sender import primary_namespace_name as resolve_name

            backlog_queues = config.backlog_queue_names(
                primary_namespace_name or resolve_name(config.primary)
            )
        self.backlog_queues = list(backlog_queues)
        self.entity_backoff = entity_backoff
        # Sends to the primary go through lanes (one per entity): each has a deadline (send_timeout) that holds
        # whatever the SDK does, and a stuck client is abandoned and rebuilt (SPEC B3, R1).
        self._primary = SdkTransport(config)
        self._secondary: ServiceBusClient | None = None
        self._receivers: dict[str, ServiceBusReceiver] = {}
        self._backoff_until: dict[str, float] = {}

    # -- clients -------------------------------------------------------------------------------------------
    def _secondary_client(self) -> ServiceBusClient:
        if self._secondary is None:
            assert self.config.secondary is not None
            self._secondary = self.config.secondary.client(**self.config.client_kwargs())
        return self._secondary

    def _receiver(self, queue: str) -> ServiceBusReceiver:
        """The open peek-lock receiver of ``queue``, kept across drains (opening one costs a few round trips);
        prefetch ``syphon.prefetch`` (0 by default, B12: nothing is buffered, so nothing is locked between drains)."""
        receiver = self._receivers.get(queue)
        if receiver is None:
            from azure.servicebus import ServiceBusReceiveMode

            receiver = self._secondary_client().get_queue_receiver(
                queue,
                receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
                prefetch_count=self.config.syphon_prefetch,
            )
            # Open the link now (the context-manager entry): left to the first receive, the link opening
            # would count against that receive's max_wait_time.
            receiver.__enter__()
            self._receivers[queue] = receiver
        return receiver

    def _drop_receiver(self, queue: str) -> None:
        receiver = self._receivers.pop(queue, None)
        if receiver is not None:
            try:
                receiver.close()
            except Exception:  # noqa: BLE001 - closing a broken receiver must not mask the real error
                log.debug("closing receiver for %s failed", queue, exc_info=True)

    def close(self) -> None:
        """Close every receiver, sender and client (both namespaces)."""
        for queue in list(self._receivers):
            self._drop_receiver(queue)
        self._primary.close()  # in the background: never blocks
        if self._secondary is not None:
            try:
                self._secondary.close()
            except Exception:  # noqa: BLE001
                log.debug("closing client failed", exc_info=True)
        self._secondary = None

    def __enter__(self) -> Syphon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- draining ------------------------------------------------------------------------------------------
    def drain_all(self, *, max_wait: float = 1.0, max_batches_per_queue: int | None = None) -> SyphonOutcome:
        """Drain every backlog queue until a receive comes back empty (or the entity backs off)."""
        total = SyphonOutcome()
        for queue in self.backlog_queues:
            total = total.merge(self.drain_queue(queue, max_wait=max_wait, max_batches=max_batches_per_queue))
        return total

    def drain_queue(
        self, queue: str, *, max_wait: float | None = None, max_batches: int | None = None
    ) -> SyphonOutcome:
        """Move messages from one backlog queue until a receive returns nothing. Never raises on a message or
        settle failure (B11): those are counted in the outcome and logged."""
        outcome = SyphonOutcome()
        wait = self.config.syphon_max_wait if max_wait is None else max_wait
        try:
            receiver = self._receiver(queue)
        except Exception as exc:  # noqa: BLE001 - B11: the loop never dies; report and go on
            outcome.errors.append(f"{queue}: cannot open receiver: {type(exc).__name__}")
            return outcome
        batches = 0
        while max_batches is None or batches < max_batches:
            try:
                messages = receiver.receive_messages(
                    max_message_count=self.config.syphon_batch_size, max_wait_time=wait
                )
            except Exception as exc:  # noqa: BLE001 - a faulted receiver is replaced on the next drain
                outcome.errors.append(f"{queue}: receive failed: {type(exc).__name__}: {exc}")
                self._drop_receiver(queue)
                break
            if not messages:
                break
            batches += 1
            outcome.received += len(messages)
            if not self._move(receiver, messages, outcome):
                break
        return outcome

    def _move(
        self, receiver: ServiceBusReceiver, messages: list[ServiceBusReceivedMessage], outcome: SyphonOutcome
    ) -> bool:
        from spark_sb.sender import is_probe

        now = self.clock.now()
        by_entity: dict[str, list[tuple[ServiceBusReceivedMessage, OutboundMessage]]] = {}
        for msg in messages:
            if is_probe(msg):
                outcome.probes_dropped += 1
                self._settle(receiver.complete_message, msg, outcome)
                continue
            locked_until = getattr(msg, "locked_until_utc", None)
            if locked_until is not None and locked_until.astimezone(timezone.utc) - now < LOCK_SAFETY_MARGIN:
                outcome.skipped_lock_expiring += 1  # B12: it will be redelivered; do not forward it now
                continue
            try:
                restored, reason = restore_for_primary(OutboundMessage.from_received(msg), now)
            except Exception as exc:  # noqa: BLE001 - a malformed message must not stop the syphon
                restored, reason = None, f"{NOT_A_BACKLOG_MESSAGE}: {type(exc).__name__}: {exc}"
            if restored is None:
                assert reason is not None
                if reason == EXPIRED_IN_BACKLOG:
                    outcome.expired += 1
                else:
                    outcome.invalid += 1
                self._settle(
                    lambda m, r=reason: receiver.dead_letter_message(
                        m, reason=r.split(":")[0], error_description=r
                    ),
                    msg,
                    outcome,
                )
                continue
            assert restored.entity is not None
            by_entity.setdefault(restored.entity, []).append((msg, restored))

        progressed = outcome.received > outcome.abandoned
        for entity, pairs in by_entity.items():
            if self._backoff_until.get(entity, 0.0) > self.clock.monotonic():
                self._abandon_all(receiver, pairs, outcome)
                continue
            if not self._forward(receiver, entity, pairs, outcome):
                self._backoff_until[entity] = self.clock.monotonic() + self.entity_backoff
        return progressed and outcome.abandoned < outcome.received

    def _forward(
        self,
        receiver: ServiceBusReceiver,
        entity: str,
        pairs: list[tuple[ServiceBusReceivedMessage, OutboundMessage]],
        outcome: SyphonOutcome,
    ) -> bool:
        """Send to the primary entity in size-packed batches, each within ``send_timeout``; complete each batch's
        messages after the primary accepted it."""
        target = Target(PRIMARY, entity)
        sent = 0
        try:
            batch = self._primary.new_batch(target)
            in_batch: list[tuple[ServiceBusReceivedMessage, OutboundMessage]] = []
            for pair in pairs:
                if not batch.try_add(pair[1]):  # batch full: send it, start anew
                    self._send_and_complete(receiver, batch, in_batch, entity, outcome)
                    sent += len(in_batch)
                    in_batch = []
                    batch = self._primary.new_batch(target)
                    if not batch.try_add(pair[1]):
                        raise ValueError("a message does not fit an empty batch")
                in_batch.append(pair)
            if in_batch:
                self._send_and_complete(receiver, batch, in_batch, entity, outcome)
                sent += len(in_batch)
            return True
        except Exception as exc:  # noqa: BLE001 - B9/B11: abandon, back off, go on
            log.warning(
                "syphon: send to primary entity %s failed (%s); abandoning", entity, type(exc).__name__
            )
            outcome.errors.append(f"{entity}: send failed: {type(exc).__name__}")
            self._abandon_all(receiver, pairs[sent:], outcome)
            return False

    def _send_and_complete(
        self,
        receiver: ServiceBusReceiver,
        batch: SdkBatch,
        pending: list[tuple[ServiceBusReceivedMessage, OutboundMessage]],
        entity: str,
        outcome: SyphonOutcome,
    ) -> None:
        self._primary.send(batch, float(self.config.send_timeout))
        outcome.forwarded[entity] = outcome.forwarded.get(entity, 0) + len(pending)
        for msg, _ in pending:
            self._settle(receiver.complete_message, msg, outcome)

    def _abandon_all(
        self,
        receiver: ServiceBusReceiver,
        pairs: list[tuple[ServiceBusReceivedMessage, OutboundMessage]],
        outcome: SyphonOutcome,
    ) -> None:
        for msg, _ in pairs:
            outcome.abandoned += 1
            self._settle(receiver.abandon_message, msg, outcome)

    @staticmethod
    def _settle(action: Any, msg: ServiceBusReceivedMessage, outcome: SyphonOutcome) -> None:
        try:
            action(msg)
        except Exception as exc:  # noqa: BLE001 - B11: settle failures are logged; redelivery follows
            outcome.settle_failures += 1
            log.info("syphon: settle failed (%s); the message will be redelivered", type(exc).__name__)
