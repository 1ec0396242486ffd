"""Adding a message to the SDK's ``ServiceBusMessageBatch`` with one AMQP encoding instead of two.

``ServiceBusMessageBatch.add_message`` (azure-servicebus 7.x, pyamqp transport) encodes every message twice: once
to measure it (``get_message_encoded_size``) and once more to append it (``add_batch``). Encoding is most of
the CPU a sender spends per message, on the healthy path (packing primary batches) and on the failed-over one
(packing backlog batches). :func:`add_to_batch` does what ``add_message`` does, step for step - the same
outgoing message, the same tracing, the same size rule and envelope - but keeps the bytes of the one encoding it
measured. ``tests/unit/message/test_packing.py`` holds it to the SDK's own result (the batch's bytes, size and count) for
every message shape the product sends.

It reaches into the batch's private state, so it is used only where that state is what it expects (the pyamqp
transport, the attributes present, a version of the SDK in :data:`TRIED`); anywhere else it calls the public
``add_message``. Runs where batches are packed (executors; the driver's syphon); pure CPU, no I/O, no state.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from spark_sb.core.sdk_types import sdk_properties

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Mapping

    from azure.servicebus import ServiceBusMessage, ServiceBusMessageBatch

    from spark_sb.message.outbound import OutboundMessage

_LOGGER = logging.getLogger(__name__)

#: The azure-servicebus releases whose ``ServiceBusMessageBatch._add`` this module follows (major.minor).
TRIED = ("7.14", "7.15")


def _fast_path() -> Any:
    """The SDK pieces of the one-encoding path, or None when this SDK is not one it follows."""
    try:
        from azure.servicebus import ServiceBusMessageBatch
        from azure.servicebus._common.constants import _BATCH_MESSAGE_OVERHEAD_COST
        from azure.servicebus._common.tracing import trace_message
        from azure.servicebus._pyamqp._encode import encode_payload
        from azure.servicebus._transport._pyamqp_transport import PyamqpTransport
        from azure.servicebus._version import VERSION
    except ImportError:  # pragma: no cover - a layout this module does not know
        return None
    if ".".join(VERSION.split(".")[:2]) not in TRIED:
        _LOGGER.info("azure-servicebus %s: batches are packed with the SDK's add_message", VERSION)
        return None
    probe = ServiceBusMessageBatch()
    needed = ("_amqp_transport", "_tracing_attributes", "_message", "_size", "_count", "_messages")
    if not all(hasattr(probe, name) for name in needed):  # pragma: no cover - an SDK that changed inside
        return None
    return PyamqpTransport, _BATCH_MESSAGE_OVERHEAD_COST, trace_message, encode_payload


def _direct_parts() -> Any:
    """The pyamqp pieces :func:`add_outbound` builds an outgoing message from, or None."""
    try:
        from azure.core.settings import settings
        from azure.servicebus._common.constants import _X_OPT_PARTITION_KEY, MESSAGE_PROPERTY_MAX_LENGTH
        from azure.servicebus._pyamqp.message import Message, Properties
    except ImportError:  # pragma: no cover - a layout this module does not know
        return None
    return Message, Properties, settings, MESSAGE_PROPERTY_MAX_LENGTH, _X_OPT_PARTITION_KEY


_FAST: Any = None
_DIRECT: Any = None
_LOOKED = False


def fast_path_available() -> bool:
    """True when :func:`add_to_batch` encodes once (this SDK is one it follows)."""
    global _FAST, _DIRECT, _LOOKED
    if not _LOOKED:
        _FAST = _fast_path()
        _DIRECT = _direct_parts() if _FAST is not None else None
        _LOOKED = True
    return _FAST is not None


class Encoded:
    """A message encoded ahead of its batch (:func:`encode`): the SDK message and its AMQP bytes, for
    :func:`add_encoded`. ``data`` is None when this SDK gets the public ``add_message`` (the message is encoded
    when it is added). Not picklable (SDK objects); lives within one send call."""

    __slots__ = ("data", "message")

    def __init__(self, message: ServiceBusMessage, data: bytearray | None) -> None:
        self.message = message
        self.data = data


def encode(message: ServiceBusMessage) -> Encoded:
    """Encode ``message`` for a batch of the product's (pyamqp transport, no tracing attributes of its own) as
    the batch's add would, so that adding it later costs no encoding (used while a sender waits anyway)."""
    if not fast_path_available():
        return Encoded(message, None)
    return Encoded(message, _encode(message, {}))


def add_encoded(batch: ServiceBusMessageBatch, encoded: Encoded) -> bool:
    """Add a message :func:`encode` made to ``batch``, as its ``add_message`` would; False when it does not fit."""
    if (
        encoded.data is None
        or getattr(batch, "_amqp_transport", None) is not _FAST[0]
        or getattr(batch, "_tracing_attributes", None)
    ):
        return add_to_batch(batch, encoded.message)
    return _append(batch, encoded.message, encoded.data)


def add_outbound(
    batch: ServiceBusMessageBatch,
    message: OutboundMessage,
    added: Mapping[str | bytes, Any] | None = None,
    section: bytes | None = None,
) -> bool:
    """Add ``message`` to ``batch`` as ``batch.add_message(message.to_sdk())`` would, with the same bytes; False
    when it does not fit. ``added``: application properties set on top of the message's own (already in the SDK's
    encoding: the backlog form's destination and time, :func:`~spark_sb.message.backlog.backlog_additions`). The messages the product sends most (no time to live, no scheduled time, every id
    within the service's 128 characters, no tracing configured) are built straight into the pyamqp message the
    SDK would make of them (:func:`_outgoing`), without the SDK's ``ServiceBusMessage`` and
    ``AmqpAnnotatedMessage`` in between (half the CPU of a message). Any other message, or an SDK this module does
    not follow, goes the SDK's way and meets its checks (``ValueError`` / ``TypeError``).

    ``section``: :func:`application_section` of ``added``, encoded once for every message of a batch that has no
    properties of its own (a failed-over entity's messages share the backlog form's two properties): the message
    is encoded without them and the section spliced in where the SDK puts it, between the properties and the body
    - the same bytes, without encoding the same map again for every message (a fifth of a divert's CPU)."""
    if fast_path_available() and _DIRECT is not None and getattr(batch, "_amqp_transport", None) is _FAST[0]:
        spliced = section is not None and not message.properties
        outgoing = _outgoing(message, None if spliced else added)
        if outgoing is not None:
            data = bytearray()
            if spliced:
                assert section is not None
                body = outgoing.data
                _FAST[3](data, outgoing._replace(data=None))
                data += section
                _FAST[3](data, _DIRECT[0](data=body))
            else:
                _FAST[3](data, outgoing)
            return _append_fields(
                batch,
                message,
                data,
                outgoing.properties.message_id,
                message.session_id,
                message.partition_key,
            )
    return add_to_batch(batch, message.to_sdk(added))


def application_section(added: Mapping[str | bytes, Any]) -> bytes | None:
    """The application-properties section of a message whose only application properties are ``added``, as the
    SDK encodes it (for :func:`add_outbound`'s ``section``), or None when batches are packed the SDK's way."""
    if not fast_path_available() or _DIRECT is None:
        return None
    data = bytearray()
    _FAST[3](data, _DIRECT[0](application_properties=dict(added)))
    return bytes(data)


def _outgoing(message: OutboundMessage, added: Mapping[str | bytes, Any] | None = None) -> Any:
    """The pyamqp message the SDK makes of ``message`` (``ServiceBusMessage`` -> ``to_outgoing_amqp_message``),
    or None when ``message`` is not of the shape built here (the SDK's way then applies)."""
    msg_type, props_type, settings, longest, partition_annotation = _DIRECT
    if message.time_to_live is not None or message.scheduled_enqueue_time is not None:
        return None  # the SDK stamps these with the local clock: its own way keeps them exact
    if settings.tracing_implementation() is not None:
        return None  # the SDK adds a tracing context per message
    body = message.body
    if isinstance(body, str):
        body = body.encode("utf-8")
    elif not isinstance(body, bytes):
        return None
    message_id, session_id, partition_key = message.message_id, message.session_id, message.partition_key
    if (
        (message_id and len(str(message_id)) > longest)
        or (session_id and len(session_id) > longest)
        or (partition_key and len(partition_key) > longest)
        or (partition_key and session_id is not None and partition_key != session_id)
    ):
        return None  # the SDK refuses it, with its own error
    if not message_id:
        message_id = str(uuid.uuid4())  # as the SDK does for every message without one
    properties = message.properties
    app = sdk_properties(properties) if properties else None
    if app:
        for key, value in app.items():
            if isinstance(value, bytes):
                app[key] = value.decode("utf-8")
    if added:
        app = {**app, **added} if app else dict(added)
    return msg_type(
        properties=props_type(
            message_id=message_id,
            to=message.to,
            subject=message.subject,
            reply_to=message.reply_to,
            correlation_id=message.correlation_id,
            content_type=message.content_type,
            group_id=session_id,
            reply_to_group_id=message.reply_to_session_id,
        ),
        application_properties=app,
        message_annotations={partition_annotation: partition_key} if partition_key else None,
        data=[body],
    )


def add_to_batch(batch: ServiceBusMessageBatch, message: ServiceBusMessage) -> bool:
    """Add ``message`` to ``batch`` as ``batch.add_message(message)`` would; False (the batch unchanged) when it
    does not fit, where ``add_message`` raises ``MessageSizeExceededError``."""
    if not fast_path_available() or getattr(batch, "_amqp_transport", None) is not _FAST[0]:
        from azure.servicebus.exceptions import MessageSizeExceededError

        try:
            batch.add_message(message)
        except MessageSizeExceededError:
            return False
        return True
    return _append(batch, message, _encode(message, batch._tracing_attributes))


def _encode(message: ServiceBusMessage, tracing: Any) -> bytearray:
    """What ``ServiceBusMessageBatch._add`` does before it measures a message - the outgoing AMQP message, its
    tracing - with the one encoding kept."""
    transport, _, trace_message, encode_payload = _FAST
    outgoing = transport.to_outgoing_amqp_message(message.raw_amqp_message)
    outgoing = trace_message(outgoing, amqp_transport=transport, additional_attributes=tracing)
    message._message = outgoing
    data = bytearray()
    encode_payload(data, outgoing)
    return data


def _append(batch: ServiceBusMessageBatch, message: ServiceBusMessage, data: bytearray) -> bool:
    """The rest of ``ServiceBusMessageBatch._add`` once the message is encoded: the size rule, the bytes, the
    bookkeeping and, for the first message, the batch envelope."""
    return _append_fields(batch, message, data, message.message_id, message.session_id, message.partition_key)


def _append_fields(
    batch: ServiceBusMessageBatch,
    message: object,
    data: bytearray,
    message_id: Any,
    session_id: str | None,
    partition_key: str | None,
) -> bool:
    """:func:`_append` with the envelope's fields given. ``message`` goes to the batch's ``_messages``, which the
    SDK reads only to trace a send or to repack the batch for another transport (neither happens on this
    path)."""
    transport, overhead, _, _ = _FAST
    size = len(data)
    after = batch._size + size + overhead[0 if size < 256 else 1]
    if after > batch.max_size_in_bytes:
        return False
    batch._message[5].append(data)
    batch._size = after
    batch._count += 1
    batch._messages.append(message)  # type: ignore[arg-type]  # see the docstring
    if batch._count == 1:  # the batch envelope takes its properties from the first message
        transport.set_batch_envelope_properties(batch._message, message_id, session_id, partition_key)
    return True
