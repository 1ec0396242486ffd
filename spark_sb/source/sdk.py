"""The source's transport on the unmodified azure-servicebus SDK (:mod:`~spark_sb.source.transport`).

* :class:`SdkEntityLink` - the driver's link on one entity: a peek-lock receiver (prefetch 0 by default) on the
  primary, on one connection in a :class:`~spark_sb.wire.lane.Lane` (:func:`~spark_sb.wire.receivers.
  receivers_lane`, as the syphon's receivers): every call has a deadline, and a connection that stalls is
  abandoned (closed in the background) and rebuilt on the next call. Defers and completions are range
  dispositions on the receiving link with one wait (:func:`~spark_sb.wire.receivers.dispose_on_link`); renewals
  are one batched ``renew-lock`` (bisected when a lock in it was lost); deletes are one receive-by-sequence-number
  in receive-and-delete mode with no retry; counts come from the admin client on a lane of their own.
* :class:`SdkPeeker` - the executors' peeks through a process-level cache (:func:`peeker`, built by a picklable
  :class:`PeekerFactory`): one connection per namespace per process (SPEC F2), every call with a deadline.

Where it runs: :class:`SdkEntityLink` on the driver (the planner process), :class:`SdkPeeker` in executors' Python
workers. Neither is picklable; :class:`PeekerFactory` is. Reads SDK internals as the syphon's receivers do
(the receiver's ``_renew_locks``; for a delete, its management call with the request ``receive_deferred_messages``
makes), pinned by ``constraints-dev.txt``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypeVar

from spark_sb.config.namespace import NamespaceConfig
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.errors import condition_of
from spark_sb.source import light
from spark_sb.source.transport import ACTIVE, EntityCounts, NotFound, Peeked, Received
from spark_sb.wire.lane import Lane
from spark_sb.wire.receivers import SharedReceivers, dispose_on_link, receivers_lane
from spark_sb.wire.timing import sdk_timeout

if TYPE_CHECKING:  # pragma: no cover
    from azure.servicebus import ServiceBusReceiver
    from azure.servicebus.management import ServiceBusAdministrationClient

__all__ = [
    "EntityInfo",
    "Handle",
    "PeekerFactory",
    "SdkEntityLink",
    "SdkPeeker",
    "close_peekers",
    "peeker",
    "size_of",
]

log = logging.getLogger(__name__)
R = TypeVar("R")

#: ``com.microsoft:message-not-found``: a receive by sequence number named a number that is not deferred there.
_NOT_FOUND = "com.microsoft:message-not-found"
#: A lock the service no longer knows (expired, settled, another link's).
_LOCK_LOST = ("com.microsoft:message-lock-lost", "com.microsoft:session-lock-lost")
#: How many locks one ``renew-lock`` request carries at most (the service's management requests are bounded).
RENEW_BATCH = 500


@dataclass(frozen=True)
class Handle:
    """What :attr:`Received.handle` holds: the SDK message and the lane generation (connection) that received it;
    a settle or renew from an older generation is a lost lock (its link is gone)."""

    message: Any
    generation: int


def size_of(message: Any) -> int:
    """A received message's size in bytes (:func:`~spark_sb.source.light.estimate_size`: its body, its application
    properties' text and a fixed allowance for the headers and annotations). Cheap (driver, per message: the body
    and its type read once)."""
    raw = message.raw_amqp_message
    body_type = raw.body_type
    body = raw.body
    if isinstance(body, (bytes, str)):
        n = len(body)
    elif body is None or getattr(body_type, "value", None) != "data":
        n = 0
    else:
        try:
            n = sum(len(part) for part in body)
        except TypeError:
            n = 0
    return light.estimate_size(n, raw.application_properties)


def delivery_count_of(message: Any) -> int:
    """The message's delivery count (0 without a header): the header read as the SDK's ``delivery_count`` does,
    without its test of the header's truth (which lists the header's attributes)."""
    header = message.raw_amqp_message.header
    return int(header.delivery_count or 0) if header is not None else 0


@dataclass(frozen=True)
class EntityInfo:
    """What the planner checks at start (admin properties): the lock duration (seconds), whether the entity
    requires sessions (refused in part 1), and its ``MaxDeliveryCount`` (for the near-dead-letter WARN, §9)."""

    lock_duration: float
    requires_session: bool
    max_delivery_count: int


class SdkEntityLink:
    """:class:`~spark_sb.source.transport.EntityLink` on the SDK: the driver's peek-lock link on ``path`` (``queue``
    or ``topic/subscriptions/name``) in the primary namespace of ``config``. ``lock_duration``: the entity's, in
    seconds (None: read once from the admin endpoint at the first receive that got messages). ``admin_kwargs`` go
    to the admin client (``connection_verify=<ca.pem>`` for a local namespace). ``monotonic``: the planner's clock
    for ``locked_until``. Thread-safe: calls from the planner and the lock keeper run one at a time on the lane's
    thread, which does the I/O."""

    def __init__(
        self,
        config: ServiceBusConfig,
        path: str,
        *,
        prefetch: int = 0,
        lock_duration: float | None = None,
        admin_kwargs: Mapping[str, Any] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.lock_duration = lock_duration
        self._monotonic = monotonic
        self._lane: Lane[SharedReceivers] = receivers_lane(config, "primary", prefetch, name="source-link")
        self._admin: Lane[_Admin] = Lane(
            "source-admin",
            functools.partial(_Admin, config.primary, dict(admin_kwargs or {}), path),
            _Admin.close,
        )

    # -- the EntityLink protocol ------------------------------------------------------------------------------
    def receive(self, max_count: int, wait: float, timeout: float) -> list[Received]:
        """Up to ``max_count`` messages, waiting at most ``wait`` (within ``timeout``) for the first."""
        started = self._monotonic()
        deadline = time.monotonic() + timeout

        def run(receiver: ServiceBusReceiver) -> list[Any]:
            left = sdk_timeout(deadline - time.monotonic())
            light.install(receiver)  # LightMessage, not ServiceBusReceivedMessage (pyamqp; else the SDK's)
            try:
                return receiver.receive_messages(
                    max_message_count=max_count, max_wait_time=max(0.01, min(wait, left))
                )
            finally:
                _revoke_credit(receiver)

        messages = self._on_receiver(run, timeout)
        if not messages:
            return []
        generation = self._lane.generation
        lock = self._lock_seconds(messages[0], deadline)
        return [
            Received(*_numbers_of(m), handle=Handle(m, generation), locked_until=started + lock)
            for m in messages
        ]

    def renew(self, held: Sequence[Received], timeout: float) -> dict[int, float]:
        """Renew the locks of ``held``: one ``renew-lock`` per :data:`RENEW_BATCH` locks; a request refused for a
        lost lock is bisected, so each lost lock costs a few requests and the others are still renewed. Measured on
        the local namespace, 500 locks: 17 ms in one request, 1.8 s renewed one by one (the SDK's own way)."""
        live = self._live(held)
        if not live:
            return {}
        started = self._monotonic()
        deadline = time.monotonic() + timeout

        # settled here already (the SDK then gives no lock token): no lock to renew
        live = [h for h in live if h.handle.message.lock_token is not None]

        def run(receiver: ServiceBusReceiver) -> list[Received]:
            renewed: list[Received] = []
            for i in range(0, len(live), RENEW_BATCH):
                _renew(receiver, live[i : i + RENEW_BATCH], deadline, renewed)
            return renewed

        renewed = self._on_receiver(run, timeout)
        if not renewed:
            return {}
        lock = self._lock_seconds(renewed[0].handle.message, deadline)
        return {r.seq: started + lock for r in renewed}

    def defer(self, held: Sequence[Received], timeout: float) -> set[int]:
        """Defer ``held`` on their link (``modified``: delivery-failed, undeliverable-here, as the SDK's defer), in
        range dispositions with one wait; a lost lock (or an older link's message) is left out."""
        from azure.servicebus._pyamqp.outcomes import Modified  # noqa: PLC0415 - the SDK's, only when used

        return self._dispose(
            held,
            timeout,
            Modified(delivery_failed=True, undeliverable_here=True, message_annotations=None),
            "defer",
        )

    def complete(self, held: Sequence[Received], timeout: float) -> set[int]:
        """Complete ``held`` on their link (range dispositions, one wait): the numbers completed."""
        return self._dispose(held, timeout, None, "complete")

    def delete(self, seqs: Sequence[int], timeout: float) -> None:
        """Delete deferred messages by number: one receive-by-sequence-number in receive-and-delete mode, no
        retry. :class:`NotFound` if a number is not deferred there (the service then deleted none of them)."""
        if not seqs:
            return
        numbers = [int(s) for s in seqs]
        deadline = time.monotonic() + timeout

        def run(receiver: ServiceBusReceiver) -> None:
            _delete_by_number(receiver, numbers, sdk_timeout(deadline - time.monotonic()))

        try:
            self._on_receiver(run, timeout)
        except Exception as exc:
            if condition_of(exc) == _NOT_FOUND or type(exc).__name__ == "MessageNotFoundError":
                raise NotFound(
                    f"{self.path}: not all of {len(numbers)} numbers are deferred messages"
                ) from exc
            raise

    def peek(self, from_seq: int, count: int, timeout: float) -> list[Peeked]:
        """Up to ``count`` messages from ``from_seq`` in sequence order, any state (one ``peek-message``)."""
        return self._on_receiver(
            functools.partial(_peek, from_seq, count, time.monotonic() + timeout), timeout
        )

    def info(self, timeout: float) -> EntityInfo:
        """The entity's lock duration, sessions and max delivery count (admin properties); remembers the lock
        duration for ``locked_until``."""
        deadline = time.monotonic() + timeout
        found = self._admin.call(lambda admin: admin.info(deadline), timeout)
        self.lock_duration = found.lock_duration
        return found

    def counts(self, timeout: float) -> EntityCounts:
        """The entity's admin runtime counts and its creation time (ISO-8601 UTC)."""
        deadline = time.monotonic() + timeout
        return self._admin.call(lambda admin: admin.counts(deadline), timeout)

    def close(self) -> None:
        """Close both lanes (their connections are closed in the background; nothing waits)."""
        self._lane.close()
        self._admin.close()

    # -- helpers ----------------------------------------------------------------------------------------------
    @property
    def generation(self) -> int:
        """The receiving connection's generation: the live worker's, or (none live) that of the next one."""
        lane = self._lane
        return lane.generation if lane.live else lane.generation + 1

    def _on_receiver(self, fn: Callable[[ServiceBusReceiver], R], timeout: float) -> R:
        deadline = time.monotonic() + timeout
        path = self.path

        def run(ctx: SharedReceivers) -> R:
            receiver = ctx.receiver(path, False, max(0.0, deadline - time.monotonic()))
            return fn(receiver)

        return self._lane.call(run, timeout)

    def _live(self, held: Sequence[Received]) -> list[Received]:
        generation = self.generation
        return [h for h in held if isinstance(h.handle, Handle) and h.handle.generation == generation]

    def _dispose(self, held: Sequence[Received], timeout: float, outcome: Any, what: str) -> set[int]:
        live = self._live(held)
        if not live:
            return set()
        deadline = time.monotonic() + timeout

        def run(receiver: ServiceBusReceiver) -> list[Received]:
            # the outcomes are awaited until shortly before the lane's deadline
            not_done = dispose_on_link(receiver, live, deadline - sdk_margin(timeout), outcome, _message_of)
            if not_done is not None:
                return not_done
            failed = []  # this SDK's link has no such way: one by one, as the SDK settles
            for r in live:
                try:
                    act = receiver.complete_message if outcome is None else receiver.defer_message
                    m = r.handle.message
                    act(m.sdk() if isinstance(m, light.LightMessage) else m)
                except Exception as exc:  # noqa: BLE001 - a lost lock: left out, never raised
                    log.debug("source: %s failed (%s)", what, type(exc).__name__)
                    failed.append(r)
            return failed

        try:
            not_done = self._on_receiver(run, timeout)
        except Exception as exc:  # noqa: BLE001 - the connection failed: nothing confirmed
            log.info("source: %s of %d messages failed (%s)", what, len(live), type(exc).__name__)
            return set()
        failed = {r.seq for r in not_done}
        return {r.seq for r in live if r.seq not in failed}

    def _lock_seconds(self, message: Any, deadline: float) -> float:
        """The entity's lock duration (read once); without the admin endpoint, what the first message's lock says
        against this machine's clock."""
        if self.lock_duration is None:
            try:
                return self.info(max(0.05, deadline - time.monotonic())).lock_duration
            except Exception as exc:  # noqa: BLE001 - measured from the message instead (clock skew included)
                log.info("source: the lock duration of %s was not read (%s)", self.path, type(exc).__name__)
                until = getattr(message, "locked_until_utc", None)
                if until is None:
                    return 0.0
                return max(0.0, (until - datetime.now(timezone.utc)).total_seconds())
        return float(self.lock_duration)


def sdk_margin(timeout: float) -> float:
    """How much earlier than a call's deadline its SDK work should end (see :func:`~spark_sb.wire.timing.
    sdk_timeout`)."""
    return timeout - sdk_timeout(timeout)


def _revoke_credit(receiver: ServiceBusReceiver) -> None:
    """Take back the credit a receive left on the link (it asked for ``max_count`` and got fewer): otherwise each
    message sent between receives is delivered, locked, and released by the SDK (no receive call is waiting) -
    as often as credit was left (measured: 10 deliveries and 10 releases for 3 messages after an empty receive of
    10). Never raises."""
    link: Any = getattr(getattr(receiver, "_handler", None), "_link", None)
    if link is None or getattr(link, "current_link_credit", 0) <= 0:
        return
    try:
        link.flow(link_credit=0)
    except Exception as exc:  # noqa: BLE001 - a broken link: the next call meets it
        log.debug("source: taking back the link credit failed (%s)", type(exc).__name__)


def _numbers_of(m: Any) -> tuple[int, int, int]:
    """(sequence number, size, delivery count) of a received message: a light one's, or read off the SDK's."""
    if isinstance(m, light.LightMessage):
        return m.sequence_number, m.size, m.delivery_count
    return int(m.sequence_number or 0), size_of(m), delivery_count_of(m)


def _message_of(r: Received) -> Any:
    return r.handle.message


def _renew(
    receiver: ServiceBusReceiver, held: list[Received], deadline: float, renewed: list[Received]
) -> None:
    """Renew ``held`` in one request; a refusal for a lost lock splits it in two (each lost lock is isolated in
    about log2(n) requests). Other failures are raised (the connection's)."""
    if not held or time.monotonic() >= deadline:
        return
    r: Any = receiver
    try:
        r._renew_locks(  # noqa: SLF001 - batched renew-lock, the SDK's own
            *[h.handle.message.lock_token for h in held], timeout=sdk_timeout(deadline - time.monotonic())
        )
    except Exception as exc:
        if condition_of(exc) not in _LOCK_LOST and type(exc).__name__ not in (
            "MessageLockLostError",
            "SessionLockLostError",
        ):
            raise
        if len(held) == 1:
            return
        half = len(held) // 2
        _renew(receiver, held[:half], deadline, renewed)
        _renew(receiver, held[half:], deadline, renewed)
        return
    renewed.extend(held)


def _delete_by_number(receiver: ServiceBusReceiver, numbers: list[int], timeout: float) -> int:
    """One receive-by-sequence-number in receive-and-delete mode: the request ``receive_deferred_messages`` makes
    (the SDK's own constants, its message properties, its management call and retry policy), whose reply's
    messages are counted and not built into SDK messages - a delete has no use for their bodies, and building
    them cost more client CPU than the rest of the settle. Raises the SDK's error for a refusal (not-found)."""
    from azure.servicebus import ServiceBusReceiveMode  # noqa: PLC0415
    from azure.servicebus._common import constants as c  # noqa: PLC0415

    r: Any = receiver
    transport = r._amqp_transport  # noqa: SLF001
    mode = transport.ServiceBusToAMQPReceiveModeMap[ServiceBusReceiveMode.RECEIVE_AND_DELETE]
    request = {
        c.MGMT_REQUEST_SEQUENCE_NUMBERS: transport.AMQP_ARRAY_VALUE(
            [transport.AMQP_LONG_VALUE(s) for s in numbers]
        ),
        c.MGMT_REQUEST_RECEIVER_SETTLE_MODE: transport.AMQP_UINT_VALUE(int(getattr(mode, "value", mode))),
    }
    r._populate_message_properties(request)  # noqa: SLF001

    def counted(status: int, message: Any, description: Any, amqp_transport: Any = transport) -> int:
        if status == 200:
            return len((message.value or {}).get(b"messages", ()))
        if status in (202, 204):
            return 0
        condition = message.application_properties.get(c.MGMT_RESPONSE_MESSAGE_ERROR_CONDITION)
        amqp_transport.handle_amqp_mgmt_error(
            log, "Deleting deferred messages failed.", condition, description, status
        )
        return 0

    return int(
        r._mgmt_request_response_with_retry(  # noqa: SLF001
            c.REQUEST_RESPONSE_RECEIVE_BY_SEQUENCE_NUMBER, request, counted, timeout=timeout
        )
    )


def _peek(from_seq: int, count: int, deadline: float, receiver: ServiceBusReceiver) -> list[Peeked]:
    """One ``peek-message`` from ``from_seq`` (the SDK reads 0 as 'after the last received': 1 instead)."""
    if count <= 0:
        return []
    messages = receiver.peek_messages(
        max_message_count=count,
        sequence_number=max(1, int(from_seq)),
        timeout=sdk_timeout(deadline - time.monotonic()),
    )
    return [Peeked(int(m.sequence_number or 0), _state_of(m), m) for m in messages]


def _state_of(message: Any) -> int:
    state = getattr(message, "state", ACTIVE)
    return int(getattr(state, "value", state) or ACTIVE)


class _Admin:
    """The admin lane's context: one ``ServiceBusAdministrationClient`` of the primary (HTTPS, azure-core retries
    off), asked about one entity. Built on the lane's thread."""

    def __init__(self, primary: NamespaceConfig, admin_kwargs: dict[str, Any], path: str) -> None:
        self.client: ServiceBusAdministrationClient = primary.admin_client(
            **{"retry_total": 0, **admin_kwargs}
        )
        topic, _, subscription = path.partition("/subscriptions/")
        self.topic = topic
        self.subscription = subscription or None

    def _kw(self, deadline: float) -> dict[str, Any]:
        left = max(0.05, deadline - time.monotonic())
        return {"connection_timeout": left, "read_timeout": left}

    def counts(self, deadline: float) -> EntityCounts:
        if self.subscription:
            p: Any = self.client.get_subscription_runtime_properties(
                self.topic, self.subscription, **self._kw(deadline)
            )
        else:
            p = self.client.get_queue_runtime_properties(self.topic, **self._kw(deadline))
        created = p.created_at_utc
        created_text = (
            created.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
            if isinstance(created, datetime)
            else str(created or "")
        )
        return EntityCounts(
            active=int(p.active_message_count or 0),
            dead_letter=int(p.dead_letter_message_count or 0),
            scheduled=int(getattr(p, "scheduled_message_count", 0) or 0),
            transfer=int(p.transfer_message_count or 0),
            transfer_dead_letter=int(p.transfer_dead_letter_message_count or 0),
            total=int(p.total_message_count or 0),
            created_at=created_text,
        )

    def info(self, deadline: float) -> EntityInfo:
        if self.subscription:
            p: Any = self.client.get_subscription(self.topic, self.subscription, **self._kw(deadline))
        else:
            p = self.client.get_queue(self.topic, **self._kw(deadline))
        return EntityInfo(
            lock_duration=float(p.lock_duration.total_seconds()),
            requires_session=bool(p.requires_session),
            max_delivery_count=int(p.max_delivery_count or 10),
        )

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()


# -- executors: peeks through a process-level cache (one connection per namespace, SPEC F2) ----------------------
class SdkPeeker:
    """:class:`~spark_sb.source.transport.Peeker` on the SDK: peeks of any entity of one namespace on one connection
    (a receiver link per entity, prefetch 0, never receiving: no message is ever locked), in a lane (deadlines;
    a stalled connection abandoned and rebuilt). Thread-safe (the lane serialises calls). Executors."""

    def __init__(self, config: ServiceBusConfig) -> None:
        # Bounded by the entities peeked in this process: one receiver link each on the one connection.
        self._lane: Lane[SharedReceivers] = receivers_lane(config, "primary", 0, name="source-peeks")

    def peek(self, entity: str, from_seq: int, count: int, timeout: float) -> list[Peeked]:
        deadline = time.monotonic() + timeout

        def run(ctx: SharedReceivers) -> list[Peeked]:
            receiver = ctx.receiver(entity, False, max(0.0, deadline - time.monotonic()))
            return _peek(from_seq, count, deadline, receiver)

        return self._lane.call(run, timeout)

    @property
    def lane(self) -> Lane[SharedReceivers]:
        """The lane (tests count its connections)."""
        return self._lane

    def close(self) -> None:
        self._lane.close()


#: The process's peekers, one per primary namespace (keyed by its frozen config): bounded by the namespaces read.
_PEEKERS: dict[NamespaceConfig, SdkPeeker] = {}
_PEEKERS_LOCK = threading.Lock()


def peeker(config: ServiceBusConfig) -> SdkPeeker:
    """The process's :class:`SdkPeeker` of ``config``'s primary namespace (built at first use). Executors."""
    key = config.primary
    with _PEEKERS_LOCK:
        found = _PEEKERS.get(key)
        if found is None:
            found = _PEEKERS[key] = SdkPeeker(config)
        return found


def close_peekers() -> None:
    """Close and forget every cached peeker (tests; a process that is done reading)."""
    with _PEEKERS_LOCK:
        peekers = list(_PEEKERS.values())
        _PEEKERS.clear()
    for p in peekers:
        p.close()


def _forget_after_fork() -> None:
    """In a forked child (a Python worker forked by Spark's daemon): the parent's lanes and sockets are not ours."""
    global _PEEKERS_LOCK
    _PEEKERS.clear()
    _PEEKERS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


@dataclass(frozen=True)
class PeekerFactory:
    """Picklable: built on the driver, shipped in the reader, called on executors for the process's cached
    :class:`SdkPeeker` (:func:`peeker`)."""

    config: ServiceBusConfig

    def __call__(self) -> SdkPeeker:
        return peeker(self.config)
