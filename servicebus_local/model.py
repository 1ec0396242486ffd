"""Entity model shared by the local namespace's AMQP broker and its HTTPS administration endpoint.

The broker (``servicebus_local.broker``) owns the entities and implements :class:`AdminStore`; the admin
endpoint (``servicebus_local.admin``) serves the SDK's ``ServiceBusAdministrationClient`` from it. Property
names follow the SDK's ``QueueProperties`` / ``TopicProperties`` / ``SubscriptionProperties`` (snake case)
so that what a test sets through the SDK reads back unchanged.

Everything here is plain data; it runs inside the local namespace process (tests, the demo, the CLI).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Protocol

from servicebus_local.durations import MAX_DURATION

if TYPE_CHECKING:
    from servicebus_local.rules import Rule


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


#: The longest lock duration the service accepts on a queue or a subscription (its documented maximum).
MAX_LOCK_DURATION = timedelta(minutes=5)


@dataclass
class QueueSettings:
    """Settable properties of a queue (defaults are the service's)."""

    lock_duration: timedelta = timedelta(minutes=1)
    max_size_in_megabytes: int = 1024
    requires_duplicate_detection: bool = False
    requires_session: bool = False
    default_message_time_to_live: timedelta = MAX_DURATION
    dead_lettering_on_message_expiration: bool = False
    duplicate_detection_history_time_window: timedelta = timedelta(minutes=10)
    max_delivery_count: int = 10
    enable_batched_operations: bool = True
    status: str = "Active"  # Active | Disabled | SendDisabled | ReceiveDisabled
    auto_delete_on_idle: timedelta = MAX_DURATION
    enable_partitioning: bool = False
    enable_express: bool = False
    forward_to: str | None = None
    forward_dead_lettered_messages_to: str | None = None
    user_metadata: str | None = None
    #: None: the namespace tier's default (256 Standard, 1,024 Premium: servicebus_local.tiers); the broker
    #: stores the value it settled on, so an entity's settings always carry a number.
    max_message_size_in_kilobytes: int | None = None


@dataclass
class TopicSettings:
    """Settable properties of a topic."""

    max_size_in_megabytes: int = 1024
    requires_duplicate_detection: bool = False
    default_message_time_to_live: timedelta = MAX_DURATION
    duplicate_detection_history_time_window: timedelta = timedelta(minutes=10)
    enable_batched_operations: bool = True
    status: str = "Active"
    support_ordering: bool = True
    auto_delete_on_idle: timedelta = MAX_DURATION
    enable_partitioning: bool = False
    enable_express: bool = False
    user_metadata: str | None = None
    #: None: the namespace tier's default (256 Standard, 1,024 Premium: servicebus_local.tiers); the broker
    #: stores the value it settled on, so an entity's settings always carry a number.
    max_message_size_in_kilobytes: int | None = None


@dataclass
class SubscriptionSettings:
    """Settable properties of a subscription."""

    lock_duration: timedelta = timedelta(minutes=1)
    requires_session: bool = False
    default_message_time_to_live: timedelta = MAX_DURATION
    dead_lettering_on_message_expiration: bool = False
    dead_lettering_on_filter_evaluation_exceptions: bool = True
    max_delivery_count: int = 10
    enable_batched_operations: bool = True
    status: str = "Active"
    auto_delete_on_idle: timedelta = MAX_DURATION
    forward_to: str | None = None
    forward_dead_lettered_messages_to: str | None = None
    user_metadata: str | None = None


@dataclass
class RuntimeCounts:
    """Runtime properties (message counts, size, times) of a queue, topic or subscription."""

    active_message_count: int = 0
    dead_letter_message_count: int = 0
    scheduled_message_count: int = 0
    transfer_message_count: int = 0
    transfer_dead_letter_message_count: int = 0
    size_in_bytes: int = 0
    subscription_count: int = 0  # topics only
    created_at: datetime = field(default_factory=utcnow)
    updated_at: datetime = field(default_factory=utcnow)
    accessed_at: datetime = field(default_factory=utcnow)

    @property
    def total_message_count(self) -> int:
        return (
            self.active_message_count
            + self.dead_letter_message_count
            + self.scheduled_message_count
            + self.transfer_message_count
            + self.transfer_dead_letter_message_count
        )


@dataclass
class QueueInfo:
    name: str
    settings: QueueSettings
    runtime: RuntimeCounts


@dataclass
class TopicInfo:
    name: str
    settings: TopicSettings
    runtime: RuntimeCounts


@dataclass
class SubscriptionInfo:
    topic_name: str
    name: str
    settings: SubscriptionSettings
    runtime: RuntimeCounts


@dataclass(frozen=True)
class AdminFault:
    """An injected failure of an administration request: the HTTP status and the service's error text."""

    status: int
    code: str = ""
    detail: str = "injected fault"


class EntityNotFound(KeyError):
    """No entity with that name."""


class EntityExists(ValueError):
    """An entity with that name exists already."""


class InvalidSettings(ValueError):
    """Entity settings the service refuses at create and update (HTTP 400); the text goes to the client."""


def check_lock_duration(lock_duration: timedelta) -> None:
    """Refuse a lock duration above :data:`MAX_LOCK_DURATION` (5 minutes), as the service does, in its words
    (learn.microsoft.com/azure/service-bus-messaging/service-bus-resource-manager-exceptions, Bad Request 40000)."""
    if lock_duration > MAX_LOCK_DURATION:
        raise InvalidSettings(
            "SubCode=40000. The supplied lock time exceeds the allowed maximum of '5' minutes.\r\n"
            f"Parameter name: LockDuration\r\nActual value was {timespan_text(lock_duration)}."
        )


def timespan_text(value: timedelta) -> str:
    """``value`` as .NET writes a TimeSpan (``[d.]hh:mm:ss[.fffffff]``), as the service's error texts show it."""
    ticks = (value.days * 86_400 + value.seconds) * 10_000_000 + value.microseconds * 10
    sign = "-" if ticks < 0 else ""
    ticks = abs(ticks)
    seconds, fraction = divmod(ticks, 10_000_000)
    days, seconds = divmod(seconds, 86_400)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    text = f"{hours:02d}:{minutes:02d}:{seconds:02d}"
    if days:
        text = f"{days}.{text}"
    if fraction:
        text = f"{text}.{fraction:07d}"
    return sign + text


class AdminStore(Protocol):
    """What the HTTPS administration endpoint needs from the broker. Implementations are thread-safe."""

    @property
    def namespace_name(self) -> str: ...

    @property
    def created_at(self) -> datetime: ...

    @property
    def messaging_sku(self) -> str:
        """``Standard`` or ``Premium`` (``$namespaceinfo``'s ``MessagingSKU``)."""
        ...

    def admin_fault(self, method: str, path: str) -> AdminFault | None:
        """An injected fault for this request (method ``GET``/``PUT``/``DELETE``, path without query), if any.

        Consumes one use of a counted fault."""
        ...

    def create_queue(self, name: str, settings: QueueSettings) -> QueueInfo: ...  # EntityExists
    def update_queue(self, name: str, settings: QueueSettings) -> QueueInfo: ...  # EntityNotFound
    def get_queue(self, name: str) -> QueueInfo: ...  # EntityNotFound
    def delete_queue(self, name: str) -> None: ...  # EntityNotFound
    def list_queues(self) -> list[QueueInfo]: ...

    def create_topic(self, name: str, settings: TopicSettings) -> TopicInfo: ...
    def update_topic(self, name: str, settings: TopicSettings) -> TopicInfo: ...
    def get_topic(self, name: str) -> TopicInfo: ...
    def delete_topic(self, name: str) -> None: ...
    def list_topics(self) -> list[TopicInfo]: ...

    def create_subscription(
        self, topic: str, name: str, settings: SubscriptionSettings
    ) -> SubscriptionInfo: ...
    def update_subscription(
        self, topic: str, name: str, settings: SubscriptionSettings
    ) -> SubscriptionInfo: ...
    def get_subscription(self, topic: str, name: str) -> SubscriptionInfo: ...
    def delete_subscription(self, topic: str, name: str) -> None: ...
    def list_subscriptions(self, topic: str) -> list[SubscriptionInfo]: ...

    def create_rule(self, topic: str, subscription: str, rule: Rule) -> Rule: ...  # EntityExists
    def update_rule(self, topic: str, subscription: str, rule: Rule) -> Rule: ...  # EntityNotFound
    def get_rule(self, topic: str, subscription: str, name: str) -> Rule: ...
    def delete_rule(self, topic: str, subscription: str, name: str) -> None: ...
    def list_rules(self, topic: str, subscription: str) -> list[Rule]: ...
