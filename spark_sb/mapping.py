"""Rows -> project messages -> SDK messages, and the backlog translation (SPEC S2, B6, B7).

Pure functions and small picklable dataclasses; they run on executors (per row, on the hot path) and in the
syphon. No I/O.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusMessage, ServiceBusReceivedMessage

Scalar = Union[str, int, float, bool, bytes, datetime, uuid.UUID, None]

BACKLOG_PATH = "x-ms-path"
BACKLOG_SESSION_ID = "x-ms-sessionid"
BACKLOG_TTL = "x-ms-timetolive"
BACKLOG_SCHEDULED = "x-ms-scheduledenqueuetimeutc"
BACKLOG_PARTITION_KEY = "x-ms-partitionkey"
BACKLOG_ENQUEUED = "x-ms-backlog-enqueued-utc"


class RejectError(ValueError):
    """A row or message that cannot be sent; ``field`` names the offending field (or None)."""

    def __init__(self, reason: str, field: str | None = None) -> None:
        self.reason = reason
        self.field = field
        super().__init__(f"{field}: {reason}" if field else reason)


@dataclass(frozen=True)
class Reject:
    reason: str
    field: str | None
    row_json: str
    entity: str | None
    row_index: int | None = None


def _empty() -> Mapping[str, Scalar]:
    return MappingProxyType({})


@dataclass(frozen=True)
class OutboundMessage:
    body: bytes | str
    entity: str | None = None
    message_id: str | None = None
    session_id: str | None = None
    partition_key: str | None = None
    correlation_id: str | None = None
    content_type: str | None = None
    subject: str | None = None
    to: str | None = None
    reply_to: str | None = None
    reply_to_session_id: str | None = None
    time_to_live: timedelta | None = None
    scheduled_enqueue_time: datetime | None = None
    properties: Mapping[str, Scalar] = field(default_factory=_empty)

    def to_sdk(self) -> ServiceBusMessage:
        raise NotImplementedError

    @classmethod
    def from_received(cls, msg: ServiceBusReceivedMessage, entity: str | None = None) -> OutboundMessage:
        raise NotImplementedError

    def validate(self, max_message_size: int) -> None:
        raise NotImplementedError


def row_to_message(
    row: Any, columns: Mapping[str, str], default_entity: str | None, max_message_size: int
) -> OutboundMessage:
    raise NotImplementedError


def to_backlog(msg: OutboundMessage, entity: str, now: datetime) -> OutboundMessage:
    raise NotImplementedError


def from_backlog(msg: OutboundMessage) -> tuple[OutboundMessage, datetime]:
    raise NotImplementedError


def is_backlog_message(msg: Any) -> bool:
    raise NotImplementedError


def encoded_size(msg: OutboundMessage) -> int:
    raise NotImplementedError


def message_id_from_content(msg: OutboundMessage) -> str:
    raise NotImplementedError
