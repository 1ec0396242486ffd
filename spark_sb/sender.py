"""The paired sender: send to the primary namespace, divert to backlog queues in the secondary when a primary
entity is down, probe the primary and come back (SPEC B2-B5, B7, B8, B10, S3).

Delivery guarantee: at-least-once. :meth:`PairedSender.send` returns only when every message it was given is
either accepted by the primary entity, accepted by a backlog queue (translated per B6, the syphon moves it on),
or recorded as rejected (B7). Anything else raises a :class:`~spark_sb.errors.SendError` (the Spark task fails
and Spark retries it; with deterministic message ids and duplicate detection on the primary, the retry does not
duplicate). The exception's ``outcome`` counts what was confirmed before the failure, and only that.

Where it runs: on executors, inside a Python worker, one sender per partition task, reused across micro-batches
(the Spark sink keeps it in a process-level cache). It is not thread-safe and not picklable; it is built there
from the picklable :class:`~spark_sb.config.ServiceBusConfig`. Failover state and the backlog rotation are
shared with every other sender of the process through a :class:`~spark_sb.failover.FailoverRegistry`.
"""

from __future__ import annotations

import logging
import random
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta, timezone
from typing import Any

from azure.servicebus.exceptions import MessageNotFoundError

from spark_sb.clock import Clock, SystemClock
from spark_sb.errors import (
    ErrorClass,
    MessageRejectedError,
    NoBacklogAvailableError,
    SendError,
    ServerBusyError,
    ServiceBusConfigError,
    classify,
)
from spark_sb.failover import (
    BacklogChooser,
    BacklogPull,
    EntityFailover,
    EntityState,
    FailoverRegistry,
    Listener,
    StateTransition,
    backoff_delay,
    log_transition,
    process_registry,
)
from spark_sb.mapping import OutboundMessage, Reject, RejectError, row_to_json, to_backlog
from spark_sb.transport import PRIMARY, SECONDARY, Batch, SdkTransport, Target, Transport

_LOGGER = logging.getLogger(__name__)

PING_CONTENT_TYPE = "application/vnd.ms-servicebus-ping"
PROBE_PROPERTY = "x-spark-sb-probe"
PROBE_TTL = timedelta(seconds=1)
PROBE_SCHEDULE_AHEAD = timedelta(days=30)
PROBE_MODES = ("schedule-cancel", "ping")


# ---------------------------------------------------------------------------------------------------------
# Probe messages


def probe_message(entity: str, mode: str = "schedule-cancel") -> OutboundMessage:
    """The probe message of ``mode`` for ``entity``: empty, ping content type, probe property, TTL 1 s.

    In ``schedule-cancel`` mode it is scheduled far ahead and cancelled at once; the marks make
    :func:`is_probe` catch it should a cancel ever fail and it be delivered.
    """
    if mode not in PROBE_MODES:
        raise ValueError(f"probe_mode must be one of {', '.join(PROBE_MODES)}, not {mode!r}")
    return OutboundMessage(
        body=b"",
        entity=entity,
        message_id=f"spark-sb-probe-{uuid.uuid4()}",
        content_type=PING_CONTENT_TYPE,
        time_to_live=PROBE_TTL,
        properties={PROBE_PROPERTY: mode},
    )


def is_probe(message: Any) -> bool:
    """True for a probe message (either mode, or the seed's ping): receivers drop these.

    Works on ``ServiceBusReceivedMessage`` / ``ServiceBusMessage`` and :class:`OutboundMessage`.
    """
    content_type = getattr(message, "content_type", None)
    if isinstance(content_type, bytes):
        content_type = content_type.decode("utf-8", "replace")
    if content_type == PING_CONTENT_TYPE:
        return True
    props = message.properties if isinstance(message, OutboundMessage) else None
    if props is None:
        props = getattr(message, "application_properties", None)
    if not props:
        return False
    return PROBE_PROPERTY in props or PROBE_PROPERTY.encode() in props


# ---------------------------------------------------------------------------------------------------------
# Outcome


@dataclass(frozen=True)
class ProbeRecord:
    """One probe of a failed-over primary entity (B8)."""

    entity: str
    mode: str
    at: datetime
    ok: bool
    error_class: str | None = None
    detail: str = ""
    sequence_number: int | None = None
    cancel_attempts: int = 0
    cancel_ok: bool | None = None


@dataclass(frozen=True)
class SendOutcome:
    """What one :meth:`PairedSender.send` call did; small and picklable (returned from executors to the driver).

    ``sent``: messages accepted by the primary, per entity. ``diverted``: per backlog queue;
    ``diverted_by_entity``: the same messages per original entity. ``rejects``: messages not sent (B7/S6).
    """

    sent: Mapping[str, int] = field(default_factory=dict)
    diverted: Mapping[str, int] = field(default_factory=dict)
    diverted_by_entity: Mapping[str, int] = field(default_factory=dict)
    rejects: tuple[Reject, ...] = ()
    transitions: tuple[StateTransition, ...] = ()
    probes: tuple[ProbeRecord, ...] = ()
    pulls: tuple[BacklogPull, ...] = ()
    retries: int = 0
    elapsed: float = 0.0

    @property
    def total_sent(self) -> int:
        return sum(self.sent.values())

    @property
    def total_diverted(self) -> int:
        return sum(self.diverted.values())

    @property
    def total_rejected(self) -> int:
        return len(self.rejects)

    def merge(self, other: SendOutcome) -> SendOutcome:
        """The sum of two outcomes (counts added, records concatenated)."""
        return SendOutcome(
            sent=_add(self.sent, other.sent),
            diverted=_add(self.diverted, other.diverted),
            diverted_by_entity=_add(self.diverted_by_entity, other.diverted_by_entity),
            rejects=self.rejects + other.rejects,
            transitions=self.transitions + other.transitions,
            probes=self.probes + other.probes,
            pulls=self.pulls + other.pulls,
            retries=self.retries + other.retries,
            elapsed=self.elapsed + other.elapsed,
        )


def _add(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


class _Tally:
    """The mutable outcome being built during one send call."""

    def __init__(self) -> None:
        self.sent: dict[str, int] = {}
        self.diverted: dict[str, int] = {}
        self.diverted_by_entity: dict[str, int] = {}
        self.rejects: list[Reject] = []
        self.transitions: list[StateTransition] = []
        self.probes: list[ProbeRecord] = []
        self.pulls: list[BacklogPull] = []
        self.retries = 0

    def build(self, elapsed: float) -> SendOutcome:
        return SendOutcome(
            sent=dict(self.sent),
            diverted=dict(self.diverted),
            diverted_by_entity=dict(self.diverted_by_entity),
            rejects=tuple(self.rejects),
            transitions=tuple(self.transitions),
            probes=tuple(self.probes),
            pulls=tuple(self.pulls),
            retries=self.retries,
            elapsed=elapsed,
        )


# ---------------------------------------------------------------------------------------------------------
# Namespace naming without secrets


def namespace_key(ns: Any) -> str:
    """A secret-free identity of a namespace (host[:port]) used to key shared state."""
    return str(ns.endpoint_host())


def namespace_description(ns: Any) -> str:
    """The redacted description of a namespace for error texts."""
    try:
        return str(ns.redacted())
    except (NotImplementedError, AttributeError):
        return namespace_key(ns)


_resolved_names: dict[str, str] = {}
_resolved_lock = threading.Lock()


def primary_namespace_name(ns: Any) -> str:
    """The primary's namespace name for backlog queue names (SPEC B1), by the same rule as provisioning:
    ``namespace_name``, else the first label of its host (``contoso`` for ``contoso.servicebus.windows.net``),
    else (an IP or ``localhost`` endpoint) the name the namespace reports about itself, asked once per process
    and endpoint through :func:`spark_sb.provisioning.resolve_primary_namespace_name`."""
    key = namespace_key(ns)

    def lookup() -> str:
        with _resolved_lock:
            known = _resolved_names.get(key)
        if known is None:
            from spark_sb.provisioning import resolve_primary_namespace_name

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
    from dataclasses import replace

    if config.secondary is None or config.primary.namespace_name:
        return config
    name = primary_namespace_name(config.primary)
    return config.with_overrides(primary=replace(config.primary, namespace_name=name))


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    try:
        from spark_sb.redact import redact

        text = redact(text)
    except NotImplementedError:  # pragma: no cover
        pass
    return text if len(text) <= 300 else text[:297] + "..."


def _message_row(msg: OutboundMessage) -> dict[str, Any]:
    row: dict[str, Any] = {f.name: getattr(msg, f.name) for f in fields(msg)}
    row["properties"] = dict(msg.properties)
    return row


# ---------------------------------------------------------------------------------------------------------
# The sender


class PairedSender:
    """Sends :class:`OutboundMessage` streams to the primary namespace with failover to backlog queues.

    Args:
        config: the frozen configuration (primary, optional secondary, intervals, limits).
        transport: the Service Bus seam; default :class:`SdkTransport` built lazily on first use.
        clock: injected time (default the system clock; a fake clock makes the sender never really sleep).
        listener: called with every :class:`StateTransition` (default: log it).
        registry: the shared failover state (default: the process registry, or a private one when a
            non-system clock is injected).
        backlog_queues: override the backlog queue names (default ``config.backlog_queue_names(...)``).
        rng: randomness for the backlog choice.
        max_busy_retries / max_busy_wait: the "server busy" budget per batch; beyond it
            :class:`ServerBusyError` is raised (never a failover).
        backlog_attempts: tries of a retryable error on one backlog queue before it is pulled.
        cancel_attempts: tries of a probe's cancel before it is recorded as failed.
    """

    def __init__(
        self,
        config: Any,
        *,
        transport: Transport | None = None,
        clock: Clock | None = None,
        listener: Listener | None = None,
        registry: FailoverRegistry | None = None,
        backlog_queues: Sequence[str] | None = None,
        rng: random.Random | None = None,
        max_busy_retries: int = 10,
        max_busy_wait: float = 120.0,
        backlog_attempts: int = 2,
        cancel_attempts: int = 3,
    ) -> None:
        if config.probe_mode not in PROBE_MODES:
            raise ValueError(f"probe_mode must be one of {', '.join(PROBE_MODES)}, not {config.probe_mode!r}")
        self._config = config
        if clock is None:
            clock = registry.clock if registry is not None else SystemClock()
        self._clock: Clock = clock
        if registry is None:
            registry = process_registry() if isinstance(clock, SystemClock) else FailoverRegistry(clock)
        self._registry = registry
        self._transport: Transport | None = transport
        self._listener: Listener = listener or log_transition
        self._primary_key = namespace_key(config.primary)
        self._secondary_key = namespace_key(config.secondary) if config.secondary is not None else ""
        if backlog_queues is None:
            backlog_queues = (
                config.backlog_queue_names(primary_namespace_name(config.primary))
                if config.secondary is not None
                else []
            )
        self._chooser = BacklogChooser(
            list(backlog_queues),
            registry.rotation,
            self._secondary_key,
            selection=config.backlog_selection,
            rng=rng,
        )
        self._max_busy_retries = max_busy_retries
        self._max_busy_wait = max_busy_wait
        self._backlog_attempts = max(1, backlog_attempts)
        self._cancel_attempts = max(1, cancel_attempts)
        self._backoff_base = max(0.01, float(config.retry.backoff_factor))
        self._backoff_cap = max(self._backoff_base, float(config.retry.backoff_max))
        self._closed = False

    # -- properties
    @property
    def registry(self) -> FailoverRegistry:
        return self._registry

    @property
    def transport(self) -> Transport:
        if self._transport is None:
            self._transport = SdkTransport(self._config)
        return self._transport

    @property
    def backlog_queues(self) -> list[str]:
        return list(self._chooser.queues)

    def entity_state(self, entity: str) -> EntityState:
        return self._entity(entity).state

    def _entity(self, entity: str) -> EntityFailover:
        return self._registry.entity(
            self._primary_key,
            entity,
            failover_interval=float(self._config.failover_interval),
            ping_interval=float(self._config.ping_primary_interval),
        )

    # -- public API
    def send(self, messages: Iterable[OutboundMessage]) -> SendOutcome:
        """Send ``messages`` (streamed: one open size-bounded batch per entity, never the whole iterable).

        Returns the outcome; raises a :class:`SendError` (with ``outcome`` set) when not every message could
        be sent, diverted or rejected.
        """
        if self._closed:
            raise RuntimeError("the paired sender is closed")
        start = self._clock.monotonic()
        tally = _Tally()
        open_batches: dict[str, Batch] = {}
        try:
            for index, msg in enumerate(messages):
                entity = msg.entity or self._config.entity
                if not entity:
                    self._reject(
                        tally,
                        msg,
                        RejectError("no destination entity: set the entity column or option", "entity"),
                        None,
                        index,
                    )
                    continue
                batch = open_batches.get(entity)
                if batch is None:
                    batch = open_batches[entity] = self.transport.new_batch(Target(PRIMARY, entity))
                added = self._try_add(batch, msg, tally, entity, index)
                if added is not False:
                    continue
                if len(batch) > 0:
                    self._deliver(batch, tally)
                    batch = open_batches[entity] = self.transport.new_batch(Target(PRIMARY, entity))
                    if self._try_add(batch, msg, tally, entity, index) is not False:
                        continue
                self._reject_oversize(tally, msg, entity, batch, index, translated=False)
            for entity in list(open_batches):
                batch = open_batches.pop(entity)
                if len(batch) > 0:
                    self._deliver(batch, tally)
        except SendError as err:
            err.outcome = tally.build(self._clock.monotonic() - start)
            raise
        return tally.build(self._clock.monotonic() - start)

    def maintain(self) -> SendOutcome:
        """Probe every failed-over entity whose probe is due (for callers that idle between sends)."""
        start = self._clock.monotonic()
        tally = _Tally()
        for status in self._registry.statuses():
            if status.namespace == self._primary_key and status.state is EntityState.FAILED_OVER:
                state = self._entity(status.entity)
                if state.claim_probe():
                    self._probe(status.entity, state, tally)
        return tally.build(self._clock.monotonic() - start)

    def close(self) -> None:
        """Close both clients (B10). The sender can not be used afterwards."""
        self._closed = True
        if self._transport is not None:
            self._transport.close()

    def __enter__(self) -> PairedSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PairedSender(primary={self._primary_key!r}, backlog_queues={len(self._chooser.queues)})"

    # -- packing
    def _try_add(
        self, batch: Batch, msg: OutboundMessage, tally: _Tally, entity: str, index: int | None
    ) -> bool | None:
        """True added, False does not fit, None rejected (cannot become an SDK message)."""
        try:
            return batch.try_add(msg)
        except RejectError as err:
            self._reject(tally, msg, err, entity, index)
        except (ValueError, TypeError) as err:
            self._reject(
                tally, msg, RejectError(f"cannot build the message: {_describe(err)}"), entity, index
            )
        return None

    def _reject_oversize(
        self,
        tally: _Tally,
        msg: OutboundMessage,
        entity: str,
        batch: Batch,
        index: int | None,
        translated: bool,
    ) -> None:
        limit = self.transport.max_batch_size(batch.target)
        when = "after backlog translation (B6 adds properties)" if translated else "encoded"
        reason = f"message too large {when}: it does not fit a batch of {limit} bytes (max_message_size)"
        self._reject(tally, msg, RejectError(reason), entity, index)

    def _reject(
        self, tally: _Tally, msg: OutboundMessage, err: RejectError, entity: str | None, index: int | None
    ) -> None:
        reject = Reject(
            reason=err.reason,
            field=err.field,
            row_json=row_to_json(_message_row(msg)),
            entity=entity,
            row_index=index,
        )
        if self._config.on_reject == "fail":
            raise MessageRejectedError(f"message rejected (on_reject = 'fail'): {err}", reject=reject)
        tally.rejects.append(reject)

    # -- delivery of one full batch
    def _deliver(self, batch: Batch, tally: _Tally) -> None:
        entity = batch.target.entity
        state = self._entity(entity)
        self._emit(tally, state.check())
        if state.state is EntityState.FAILED_OVER:
            if state.claim_probe():
                self._probe(entity, state, tally)
            if state.state is EntityState.FAILED_OVER:
                self._divert(list(batch.messages), entity, tally)
                return
        self._send_primary(batch, state, tally)

    def _send_primary(self, batch: Batch, state: EntityFailover, tally: _Tally) -> None:
        entity = batch.target.entity
        outage_attempts = 0
        busy_attempts = 0
        busy_waited = 0.0
        while True:
            try:
                self.transport.send(batch)
            except Exception as exc:
                cls = classify(exc)
                self._after_error(PRIMARY, cls)
                if cls.fail_batch:
                    raise self._config_error(cls, exc, PRIMARY, entity) from None
                if cls.reject_message:
                    self._split(batch, tally, lambda b: self._send_primary(b, state, tally))
                    return
                if cls.fail_over:
                    self._emit(tally, state.record_failure(cls, _describe(exc)))
                    if state.state is EntityState.FAILED_OVER:
                        self._divert(list(batch.messages), entity, tally)
                        return
                    outage_attempts += 1
                    delay = backoff_delay(outage_attempts, self._backoff_base, self._backoff_cap)
                    remaining = state.time_until_failover()
                    if remaining is not None:
                        delay = min(delay, remaining)
                    self._clock.sleep(delay)
                    tally.retries += 1
                    self._emit(tally, state.check())
                    if state.state is EntityState.FAILED_OVER:
                        self._divert(list(batch.messages), entity, tally)
                        return
                    continue
                if cls.retry:  # server busy (or a client closed under us): never an outage
                    busy_attempts += 1
                    if busy_attempts > self._max_busy_retries or busy_waited >= self._max_busy_wait:
                        raise ServerBusyError(
                            f"the {PRIMARY} namespace {namespace_description(self._config.primary)} kept "
                            f"answering {cls.name} for entity {entity!r} after {busy_attempts - 1} retries "
                            f"({busy_waited:.1f} s); not failing over (throttling is not an outage); "
                            "the task fails so that Spark retries it",
                            error_class=cls,
                        ) from None
                    delay = backoff_delay(busy_attempts, self._backoff_base, self._backoff_cap)
                    self._clock.sleep(delay)
                    busy_waited += delay
                    tally.retries += 1
                    continue
                raise SendError(
                    f"unexpected {cls.name} error sending to entity {entity!r}: {_describe(exc)}",
                    error_class=cls,
                ) from None
            else:
                self._emit(tally, state.record_success())
                tally.sent[entity] = tally.sent.get(entity, 0) + len(batch)
                return

    def _split(self, batch: Batch, tally: _Tally, send: Callable[[Batch], None]) -> None:
        """The service refused the batch as too large: halve it; a single message is rejected (B7)."""
        msgs = list(batch.messages)
        entity = batch.target.entity
        if len(msgs) <= 1:
            for m in msgs:
                self._reject(
                    tally,
                    m,
                    RejectError("message too large: refused by the service (message size exceeded)"),
                    entity,
                    None,
                )
            return
        half = len(msgs) // 2
        for part in (msgs[:half], msgs[half:]):
            sub = self.transport.new_batch(batch.target)
            for m in part:
                if not sub.try_add(m):  # pragma: no cover - a half always fits where the whole did
                    raise SendError("internal error: a split batch does not fit")
            send(sub)

    # -- diverting to the backlog
    def _divert(self, messages: list[OutboundMessage], entity: str, tally: _Tally) -> None:
        """Send ``messages`` (originals, destined for ``entity``) translated to backlog queues; on a queue's
        failure it is pulled and the same messages go to another (B5)."""
        now = self._clock.now()
        pending = messages
        while pending:
            groups: dict[str, list[OutboundMessage]] = {}
            for m in pending:
                queue = self._chooser.choose(entity, m.session_id)
                if queue is None:
                    raise self._no_backlog(entity)
                groups.setdefault(queue, []).append(m)
            pending = []
            for queue, msgs in groups.items():
                pending.extend(self._send_backlog(queue, entity, msgs, now, tally))

    def _no_backlog(self, entity: str) -> NoBacklogAvailableError:
        if self._config.secondary is None or not self._chooser.queues:
            why = "no secondary namespace / backlog queues are configured"
        else:
            pulled = ", ".join(p.queue for p in self._registry.rotation.pulled(self._secondary_key))
            why = f"every backlog queue is pulled from the rotation ({pulled})"
        return NoBacklogAvailableError(
            f"entity {entity!r} is failed over on the primary namespace "
            f"{namespace_description(self._config.primary)} and {why}; the task fails so that Spark retries "
            "the batch (messages not counted as sent were not sent)"
        )

    def _send_backlog(
        self, queue: str, entity: str, msgs: list[OutboundMessage], now: datetime, tally: _Tally
    ) -> list[OutboundMessage]:
        """Send ``msgs`` to ``queue``; returns the originals NOT sent because the queue was pulled."""
        target = Target(SECONDARY, queue)
        batch = self.transport.new_batch(target)
        originals: list[OutboundMessage] = []
        for i, m in enumerate(msgs):
            translated = to_backlog(m, entity, now)
            fits = self._try_add(batch, translated, tally, entity, None)
            if fits is None:
                continue
            if fits is False and len(batch) > 0:
                unsent = self._send_backlog_batch(batch, originals, queue, entity, now, tally)
                if unsent:
                    return unsent + msgs[i:]
                batch = self.transport.new_batch(target)
                originals = []
                fits = self._try_add(batch, translated, tally, entity, None)
                if fits is None:
                    continue
            if fits is False:
                self._reject_oversize(tally, m, entity, batch, None, translated=True)
                continue
            originals.append(m)
        if len(batch) > 0:
            return self._send_backlog_batch(batch, originals, queue, entity, now, tally)
        return []

    def _send_backlog_batch(
        self,
        batch: Batch,
        originals: list[OutboundMessage],
        queue: str,
        entity: str,
        now: datetime,
        tally: _Tally,
    ) -> list[OutboundMessage]:
        """Send one translated batch; returns the originals not sent (the queue was pulled), else []."""
        attempt = 0
        while True:
            attempt += 1
            try:
                self.transport.send(batch)
            except Exception as exc:
                cls = classify(exc)
                self._after_error(SECONDARY, cls)
                if cls.fail_batch:
                    raise self._config_error(cls, exc, SECONDARY, queue) from None
                if cls.reject_message and len(originals) > 1:
                    half = len(originals) // 2
                    unsent = self._send_backlog(queue, entity, originals[:half], now, tally)
                    if unsent:
                        return unsent + originals[half:]
                    return self._send_backlog(queue, entity, originals[half:], now, tally)
                if cls.reject_message:
                    self._reject(
                        tally,
                        originals[0],
                        RejectError("message too large after backlog translation: refused by the service"),
                        entity,
                        None,
                    )
                    return []
                if cls.retry and attempt < self._backlog_attempts:
                    self._clock.sleep(backoff_delay(attempt, self._backoff_base, self._backoff_cap))
                    tally.retries += 1
                    continue
                until = self._clock.monotonic() + float(self._config.backlog_retry_interval)
                tally.pulls.append(
                    self._registry.rotation.pull(self._secondary_key, queue, until, cls.name, _describe(exc))
                )
                return list(originals)
            else:
                n = len(originals)
                tally.diverted[queue] = tally.diverted.get(queue, 0) + n
                tally.diverted_by_entity[entity] = tally.diverted_by_entity.get(entity, 0) + n
                return []

    # -- probing
    def _probe(self, entity: str, state: EntityFailover, tally: _Tally) -> bool:
        mode = self._config.probe_mode
        target = Target(PRIMARY, entity)
        msg = probe_message(entity, mode)
        at = self._clock.now()
        sequence_number: int | None = None
        cancel_attempts = 0
        cancel_ok: bool | None = None
        detail = ""
        try:
            if mode == "ping":
                batch = self.transport.new_batch(target)
                batch.try_add(msg)
                self.transport.send(batch)
            else:
                # The service's clock is real: the wire time comes from the real UTC clock (an injected test
                # clock may be anywhere), so the probe is always scheduled far in the service's future.
                wire_at = max(at, datetime.now(timezone.utc)) + PROBE_SCHEDULE_AHEAD
                sequence_number = self.transport.schedule(target, msg, wire_at)
                cancel_ok = False
                while cancel_attempts < self._cancel_attempts and not cancel_ok:
                    cancel_attempts += 1
                    try:
                        self.transport.cancel_scheduled(target, sequence_number)
                        cancel_ok = True
                    except MessageNotFoundError as exc:
                        # Nothing scheduled under that number any more: an earlier cancel went through but its
                        # answer was lost (a retry), or - on the first try - it is gone already. Retrying
                        # cannot help either way.
                        cancel_ok = cancel_attempts > 1
                        detail = "" if cancel_ok else f"cancel failed: {_describe(exc)}"
                        break
                    except Exception as exc:
                        detail = f"cancel failed: {_describe(exc)}"
                        self._after_error(PRIMARY, classify(exc))
                        if cancel_attempts < self._cancel_attempts:
                            self._clock.sleep(
                                backoff_delay(cancel_attempts, self._backoff_base, self._backoff_cap)
                            )
                if not cancel_ok:
                    _LOGGER.warning(
                        "probe of entity %r: the scheduled probe message %s could not be cancelled; it is marked "
                        "as a probe (is_probe) with a 1 s TTL",
                        entity,
                        sequence_number,
                    )
        except Exception as exc:
            cls: ErrorClass = classify(exc)
            self._after_error(PRIMARY, cls)
            tally.probes.append(
                ProbeRecord(
                    entity, mode, at, False, cls.name, _describe(exc), sequence_number, cancel_attempts
                )
            )
            self._emit(tally, state.record_probe(False, cls.name, _describe(exc)))
            return False
        tally.probes.append(
            ProbeRecord(entity, mode, at, True, None, detail, sequence_number, cancel_attempts, cancel_ok)
        )
        self._emit(tally, state.record_probe(True, None, f"{mode} probe succeeded"))
        return True

    # -- helpers
    def _after_error(self, namespace: str, cls: ErrorClass) -> None:
        if cls.rebuild_client and self._transport is not None:
            self._transport.fault(namespace)

    def _config_error(self, cls: ErrorClass, exc: BaseException, namespace: str, entity: str) -> SendError:
        ns = self._config.primary if namespace == PRIMARY else self._config.secondary
        where = f"entity {entity!r} in the {namespace} namespace {namespace_description(ns)}"
        if cls.name == "unauthorized":
            text = (
                f"Service Bus refused the send to {where}: unauthorized ({type(exc).__name__}). The SAS policy "
                "or Azure AD identity needs the 'Send' right on it. This is a configuration error: nothing was "
                "diverted to the backlog."
            )
            return ServiceBusConfigError(text, error_class=cls)
        text = (
            f"Service Bus refused the send to {where}: {cls.name} ({_describe(exc)}). Nothing was diverted."
        )
        return ServiceBusConfigError(text, error_class=cls)

    def _emit(self, tally: _Tally, transitions: list[StateTransition]) -> None:
        for t in transitions:
            tally.transitions.append(t)
            try:
                self._listener(t)
            except Exception as exc:  # the listener is observability only; its failure must not fail the send
                _LOGGER.error("state transition listener failed: %s", _describe(exc))
