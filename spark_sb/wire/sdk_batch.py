"""The SDK-backed batch (:class:`SdkBatch`): size-packed messages for one target, or one message larger than a batch.

Premium entities take messages up to 100 MB but batches of at most 1 MB (SPEC B13): a message over the link's
batch limit and within its message limit goes alone, as a plain AMQP message - the way the SDK sends a single
``ServiceBusMessage`` - never as a batch of one, which the service refuses over the batch limit. Runs where batches
are packed (executors; the syphon's process); not picklable (SDK objects); lives within one send call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from spark_sb.message.backlog import backlog_additions, to_backlog, to_backlog_sdk
from spark_sb.message.outbound import OutboundMessage
from spark_sb.message.packing import Encoded, add_encoded, add_outbound, add_to_batch, application_section
from spark_sb.message.wire_size import body_size, encoded_size
from spark_sb.wire.transport import Target

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusMessage, ServiceBusMessageBatch

__all__ = ["UNKNOWN_LINK_BATCH", "SdkBatch"]

#: The batch limit before a target's link is open and says its own: the service's largest (Premium's 1 MB), so
#: that ``max_message_size`` over it never makes a first batch the service refuses.
UNKNOWN_LINK_BATCH = 1024 * 1024


class SdkBatch:
    """A :class:`~spark_sb.wire.transport.Batch` backed by the SDK's ``ServiceBusMessageBatch``: each message
    encoded once, both to size it and to send it (:mod:`spark_sb.message.packing`). ``single_limit``: the most one
    message may weigh on the link (its ``max-message-size``, at most ``max_message_size``); an empty batch takes one
    message up to it that does not fit a batch, and then nothing more (:attr:`single`)."""

    def __init__(self, target: Target, sdk_batch: ServiceBusMessageBatch, single_limit: int = 0) -> None:
        self.target = target
        self.sdk_batch = sdk_batch
        self._single_limit = single_limit
        #: The one message this batch sends alone, as the SDK sends a single message (None: a batch).
        self.single: ServiceBusMessage | None = None
        self._single_size = 0
        self._messages: list[OutboundMessage] = []
        self._count = 0
        # (entity, enqueue time) -> the backlog form's application-properties section, encoded once (add_outbound's
        # ``section``; None where batches are packed the SDK's way); bounded by the entities whose messages this
        # batch holds (a backlog batch has one enqueue time)
        self._sections: dict[tuple[str, datetime], bytes | None] = {}

    @property
    def messages(self) -> list[OutboundMessage]:
        return self._messages

    @property
    def payload(self) -> Any:
        """What the SDK's ``send_messages`` is given: the single message, or the batch."""
        return self.single if self.single is not None else self.sdk_batch

    def _alone(self, form: OutboundMessage, make: Callable[[], ServiceBusMessage]) -> bool:
        """Take the message whose wire form is ``form`` (it does not fit an empty batch) alone if it is within the
        single limit; sized arithmetically (:func:`~spark_sb.message.wire_size.encoded_size`, what the SDK's
        encoder counts), so that it is encoded once, by the send."""
        if self._count or self.single is not None or self._single_limit <= self.sdk_batch.max_size_in_bytes:
            return False
        size = encoded_size(form)
        if size > self._single_limit:
            return False
        self.single = make()
        self._single_size = size
        return True

    def _too_big(self, message: OutboundMessage) -> bool:
        """Its body alone is over the batch limit (no encoding spent to learn it does not fit)."""
        return (
            self._single_limit > self.sdk_batch.max_size_in_bytes
            and body_size(message) > self.sdk_batch.max_size_in_bytes
        )

    def try_add(self, message: OutboundMessage) -> bool:
        if self.single is not None:
            return False
        fits = not self._too_big(message) and add_outbound(self.sdk_batch, message)
        if not fits and not self._alone(message, message.to_sdk):
            return False
        self._count += 1
        self._messages.append(message)
        return True

    def try_add_backlog(
        self,
        original: OutboundMessage,
        entity: str,
        enqueued: datetime,
        prepared: object | None = None,
        ambiguous: datetime | None = None,
    ) -> bool:
        if self.single is not None:
            return False
        if self._too_big(original):
            added = False
        elif isinstance(prepared, Encoded):
            added = add_encoded(self.sdk_batch, prepared)
        else:
            additions = backlog_additions(original, entity, enqueued, ambiguous)
            if additions is not None:  # the common case: the original's fields and two properties more
                section = None
                if not original.properties and ambiguous is None:  # only the two: encoded once per entity
                    key = (entity, enqueued)
                    if key in self._sections:
                        section = self._sections[key]
                    else:
                        section = self._sections[key] = application_section(additions)
                added = add_outbound(self.sdk_batch, original, additions, section)
            else:
                added = add_to_batch(self.sdk_batch, to_backlog_sdk(original, entity, enqueued, ambiguous))
        if not added:

            def make() -> ServiceBusMessage:
                if isinstance(prepared, Encoded):
                    return prepared.message
                return to_backlog_sdk(original, entity, enqueued, ambiguous)

            # sized as its backlog form (a prepared one's own enqueue time encodes to the same 8 bytes)
            if not self._alone(to_backlog(original, entity, enqueued, ambiguous), make):
                return False
        self._count += 1
        return True

    @property
    def size_in_bytes(self) -> int:
        return self._single_size if self.single is not None else int(self.sdk_batch.size_in_bytes)

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[OutboundMessage]:
        return iter(self._messages)
