"""The planner's received messages without the SDK's ``ServiceBusReceivedMessage`` (driver: the planner process's
receive lane; nothing here is picklable).

The planner needs five things of a message it receives: its sequence number, size and delivery count, and what its
link's dispositions and renewals read (the transfer's delivery id and tag, the lock token). The executors read the
message itself, by peek. The SDK builds a full ``ServiceBusReceivedMessage`` (its annotated message, properties,
timestamps) for each received message: measured, 13% of the planner's receive CPU (20,000 1 KB messages in
receives of 500). :func:`install` makes one receiver build a :class:`LightMessage` from the transfer frame and the
decoded AMQP message instead (the receiver's own ``_build_received_message`` hook, an instance attribute the SDK
sets in its constructor); :meth:`LightMessage.sdk` builds the SDK's message on demand (the one-by-one settle
fallback). Only on the pyamqp transport (the SDK's default); elsewhere the receiver keeps its own builder.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

__all__ = ["LightMessage", "estimate_size", "install"]

#: The message annotations the planner reads (the SDK's ``_X_OPT_SEQUENCE_NUMBER`` and ``_X_OPT_LOCKED_UNTIL``).
_SEQUENCE_NUMBER = b"x-opt-sequence-number"
_LOCKED_UNTIL = b"x-opt-locked-until"
#: Bytes counted for the headers and annotations (:func:`estimate_size`).
_HEADERS = 64


class LightMessage:
    """A peek-lock message as received: ``sequence_number``, ``size`` (:func:`estimate_size`), ``delivery_count``, the lock token, and the frame fields the link's
    range dispositions use (``_delivery_id``, ``_delivery_tag``, ``_settled``: the SDK message's own names)."""

    __slots__ = (
        "_delivery_id",
        "_delivery_tag",
        "_frame",
        "_message",
        "_receiver",
        "_settled",
        "delivery_count",
        "sequence_number",
        "size",
    )

    def __init__(self, receiver: Any, received: tuple[Any, Any]) -> None:
        frame, message = received
        self._receiver = receiver
        self._frame = frame
        self._message = message
        self._delivery_id = frame[1]
        self._delivery_tag = frame[2]
        self._settled = False
        annotations = message.message_annotations or {}
        self.sequence_number = int(annotations.get(_SEQUENCE_NUMBER) or 0)
        header = message.header
        self.delivery_count = int(header.delivery_count or 0) if header is not None else 0
        self.size = _size(message)

    @property
    def lock_token(self) -> uuid.UUID | None:
        """The lock's token (the delivery tag, as the SDK reads it); None once settled here."""
        if self._settled or not self._delivery_tag:
            return None
        return uuid.UUID(bytes_le=bytes(self._delivery_tag))

    @property
    def locked_until_utc(self) -> datetime | None:
        """When the lock ends, as the service stamped it (None without the annotation)."""
        until = (self._message.message_annotations or {}).get(_LOCKED_UNTIL)
        if until is None:
            return None
        if isinstance(until, datetime):
            return until if until.tzinfo else until.replace(tzinfo=timezone.utc)
        return datetime.fromtimestamp(int(until) / 1000, timezone.utc)

    def sdk(self) -> Any:
        """The SDK's ``ServiceBusReceivedMessage`` for this delivery (built now, settled as this one is)."""
        from azure.servicebus import ServiceBusReceivedMessage  # noqa: PLC0415 - the SDK's, only when used

        r: Any = self._receiver
        built = r._amqp_transport.build_received_message(  # noqa: SLF001 - the builder the hook replaced
            r, ServiceBusReceivedMessage, (self._frame, self._message)
        )
        built._settled = self._settled  # noqa: SLF001
        return built


def install(receiver: Any) -> None:
    """Make ``receiver`` (a peek-lock ``ServiceBusReceiver``) build :class:`LightMessage` objects from now on. Once
    per receiver (a rebuilt connection's receiver is a new one). Not where its transport is not pyamqp (it keeps
    the SDK's messages; the planner reads both)."""
    r: Any = receiver
    if (
        getattr(r, "_spark_sb_light", False)
        or getattr(getattr(r, "_amqp_transport", None), "KIND", None) != "pyamqp"
    ):
        return
    r._build_received_message = lambda received: LightMessage(r, received)  # noqa: SLF001 - the SDK's hook
    r._spark_sb_light = True  # noqa: SLF001


def estimate_size(body: int, application_properties: Any) -> int:
    """A message's size in bytes, estimated without encoding it again: ``body`` bytes, its application properties'
    text (8 bytes for a value that is not text) and a fixed :data:`_HEADERS` for the headers and annotations."""
    n = body
    if application_properties:
        for k, v in application_properties.items():
            n += len(k) + (len(v) if isinstance(v, (bytes, str)) else 8)
    return n + _HEADERS


def _size(message: Any) -> int:
    data = message.data
    if data is not None:
        body = sum(len(part) for part in data)
    elif isinstance(message.value, (bytes, str)):
        body = len(message.value)
    else:
        body = 0
    return estimate_size(body, message.application_properties)
