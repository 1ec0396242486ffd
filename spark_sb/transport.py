"""The seam between the paired sender and the azure-servicebus SDK.

:class:`Transport` is what :class:`spark_sb.sender.PairedSender` needs: size-bounded batches for a target
(namespace + entity), sending one batch, scheduling/cancelling a probe message, and closing. Every method may
raise the SDK's exceptions; :func:`spark_sb.errors.classify` says what they mean. Unit tests use a fake
transport behind this interface (``tests/unit/fakes.py``).

:class:`SdkTransport` is the real one. It runs on executors (Python workers), is built lazily there from the
picklable :class:`~spark_sb.config.ServiceBusConfig`, and is itself neither picklable nor thread-safe: it
belongs to the thread that first used it (checked). It owns one ``ServiceBusClient`` per namespace (primary,
secondary), built on first use with the configured retry settings, and one ``ServiceBusSender`` per entity.
SPEC B10: the two clients are a pair - closing or faulting one closes both, and the pair is rebuilt on the next
use.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from spark_sb.errors import classify
from spark_sb.mapping import OutboundMessage

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusClient, ServiceBusMessageBatch, ServiceBusSender

    from spark_sb.config import NamespaceConfig, ServiceBusConfig

_LOGGER = logging.getLogger(__name__)

PRIMARY = "primary"
SECONDARY = "secondary"


@dataclass(frozen=True)
class Target:
    """Where a batch goes: ``namespace`` is ``"primary"`` or ``"secondary"``; ``entity`` a queue or topic."""

    namespace: str
    entity: str

    def __str__(self) -> str:
        return f"{self.namespace}:{self.entity}"


class Batch(Protocol):
    """A size-bounded batch of messages for one target, built by :meth:`Transport.new_batch`."""

    target: Target

    @property
    def messages(self) -> list[OutboundMessage]:
        """The project-level messages in the batch, in order (to re-send or divert them on failure)."""

    def try_add(self, message: OutboundMessage) -> bool:
        """Add ``message`` if it fits; False if it does not (the batch is unchanged). May raise
        ``spark_sb.mapping.RejectError`` / ``ValueError`` / ``TypeError`` when it cannot become an SDK message."""

    def __len__(self) -> int: ...


class Transport(Protocol):
    """The paired sender's view of Service Bus. Not thread-safe; one per sender."""

    def max_batch_size(self, target: Target) -> int:
        """The size limit in bytes of a batch for ``target`` (no I/O)."""

    def new_batch(self, target: Target) -> Batch:
        """An empty batch for ``target`` (no I/O)."""

    def send(self, batch: Batch) -> None:
        """Send one batch; returns when the service accepted it; raises SDK exceptions."""

    def schedule(self, target: Target, message: OutboundMessage, at: datetime) -> int:
        """Schedule ``message`` on ``target`` for ``at``; returns its sequence number."""

    def cancel_scheduled(self, target: Target, sequence_number: int) -> None:
        """Cancel a scheduled message."""

    def fault(self, namespace: str) -> None:
        """A client faulted (connection-class error): close it and its partner; rebuilt on next use (B10)."""

    def close(self) -> None:
        """Close both clients."""


# ---------------------------------------------------------------------------------------------------------


class SdkBatch:
    """A :class:`Batch` backed by the SDK's ``ServiceBusMessageBatch`` (each message encoded once to size it)."""

    def __init__(self, target: Target, sdk_batch: ServiceBusMessageBatch) -> None:
        self.target = target
        self.sdk_batch = sdk_batch
        self._messages: list[OutboundMessage] = []

    @property
    def messages(self) -> list[OutboundMessage]:
        return self._messages

    def try_add(self, message: OutboundMessage) -> bool:
        from azure.servicebus.exceptions import MessageSizeExceededError

        sdk_message = message.to_sdk()
        try:
            self.sdk_batch.add_message(sdk_message)
        except MessageSizeExceededError:
            return False
        self._messages.append(message)
        return True

    @property
    def size_in_bytes(self) -> int:
        return int(self.sdk_batch.size_in_bytes)

    def __len__(self) -> int:
        return len(self._messages)

    def __iter__(self) -> Iterator[OutboundMessage]:
        return iter(self._messages)


class SdkTransport:
    """The real :class:`Transport` over azure-servicebus (sync). See the module docstring.

    ``config.send_timeout`` bounds every SDK call (including the SDK's own retries, configured by
    ``config.retry``). Batches are bounded by the link's batch size (known after the first send on a link) and
    by ``config.max_message_size``.
    """

    def __init__(self, config: ServiceBusConfig, **client_kwargs: Any) -> None:
        self._config = config
        self._client_kwargs = dict(client_kwargs)
        self._owner = threading.get_ident()
        self._clients: dict[str, ServiceBusClient] = {}
        self._senders: dict[Target, ServiceBusSender] = {}
        self._link_max: dict[Target, int] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.generation: dict[str, int] = {PRIMARY: 0, SECONDARY: 0}  # bumped each time a client is built

    # -- plumbing
    def _check_thread(self) -> None:
        if threading.get_ident() != self._owner:
            raise RuntimeError(
                "a Service Bus transport is used by a thread other than the one that created it; "
                "clients are not thread-safe: build one sender per thread"
            )

    def _namespace_config(self, namespace: str) -> NamespaceConfig:
        if namespace == PRIMARY:
            return self._config.primary
        if namespace == SECONDARY:
            if self._config.secondary is None:
                raise ValueError("no secondary namespace is configured (key 'secondary')")
            return self._config.secondary
        raise ValueError(f"unknown namespace {namespace!r}; valid: 'primary', 'secondary'")

    def _client(self, namespace: str) -> ServiceBusClient:
        client = self._clients.get(namespace)
        if client is None:
            if self._closed:
                self._closed = False  # a closed pair is rebuilt on next use (B10)
            kwargs: dict[str, Any] = {**self._config.client_kwargs(), **self._client_kwargs}
            client = self._namespace_config(namespace).client(**kwargs)
            self._clients[namespace] = client
            self.generation[namespace] = self.generation.get(namespace, 0) + 1
        return client

    def _sender(self, target: Target) -> ServiceBusSender:
        sender = self._senders.get(target)
        if sender is None:
            sender = self._client(target.namespace).get_queue_sender(target.entity)
            self._senders[target] = sender
        return sender

    def is_open(self, namespace: str) -> bool:
        """True while a client for ``namespace`` exists (built and not closed)."""
        return namespace in self._clients

    # -- Transport
    def max_batch_size(self, target: Target) -> int:
        limit = self._config.max_message_size
        link = self._link_max.get(target)
        return min(limit, link) if link else limit

    def new_batch(self, target: Target) -> SdkBatch:
        from azure.servicebus import ServiceBusMessageBatch

        return SdkBatch(target, ServiceBusMessageBatch(max_size_in_bytes=self.max_batch_size(target)))

    def send(self, batch: Batch) -> None:
        self._check_thread()
        if len(batch) == 0:
            return
        target = batch.target
        try:
            sender = self._sender(target)
            if isinstance(batch, SdkBatch):
                sender.send_messages(batch.sdk_batch, timeout=self._config.send_timeout)
            else:  # a foreign batch: let the SDK pack it (raises if it does not fit one batch)
                sender.send_messages([m.to_sdk() for m in batch.messages], timeout=self._config.send_timeout)
        except Exception as exc:
            self._after_error(target, exc)
            raise
        link_max = getattr(sender, "_max_batch_size_on_link", None)
        if isinstance(link_max, int) and link_max > 0:
            self._link_max[target] = link_max

    def schedule(self, target: Target, message: OutboundMessage, at: datetime) -> int:
        self._check_thread()
        try:
            numbers = self._sender(target).schedule_messages(
                message.to_sdk(), at, timeout=self._config.send_timeout
            )
        except Exception as exc:
            self._after_error(target, exc)
            raise
        return int(numbers[0])

    def cancel_scheduled(self, target: Target, sequence_number: int) -> None:
        self._check_thread()
        try:
            self._sender(target).cancel_scheduled_messages(sequence_number, timeout=self._config.send_timeout)
        except Exception as exc:
            self._after_error(target, exc)
            raise

    def _after_error(self, target: Target, exc: BaseException) -> None:
        if classify(exc).rebuild_client:
            self.fault(target.namespace)

    def fault(self, namespace: str) -> None:
        """Close the faulted client and its partner now (B10: within 5 s); both are rebuilt on next use."""
        if self._clients:
            _LOGGER.info("%s client faulted: closing the client pair; it is rebuilt on next use", namespace)
        self._close_all()

    def close_namespace(self, namespace: str) -> None:
        """Close one client: its partner is closed too (B10)."""
        self._close_all()

    def close(self) -> None:
        self._close_all()
        self._closed = True

    def _close_all(self) -> None:
        with self._lock:
            senders, self._senders = self._senders, {}
            clients, self._clients = self._clients, {}
        for sender in senders.values():
            _quiet_close(sender)
        for client in clients.values():
            _quiet_close(client)

    def __enter__(self) -> SdkTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SdkTransport(clients={sorted(self._clients)}, senders={len(self._senders)})"


def _quiet_close(obj: Any) -> None:
    """Close an SDK object; a failure to close is logged (without secrets), never raised."""
    try:
        obj.close()
    except Exception as exc:  # closing a faulted client may fail; it is being dropped anyway
        _LOGGER.info("closing %s failed: %s", type(obj).__name__, type(exc).__name__)
