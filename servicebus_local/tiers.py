"""A namespace's tier (Standard or Premium) and the message and batch limits it sets, as the service sets them.

Chosen per namespace (``LocalNamespace(tier=...)``, ``python -m servicebus_local --tier``); Standard by default.
Pure data and decisions, used by the broker (entity settings), the AMQP server (what a sender link advertises,
what a transfer may weigh) and the admin endpoint (``MessagingSKU``). The service's documentation for each limit
is in the README's tier table.

* **Standard**: messages up to 256 KB; an entity's ``max_message_size_in_kilobytes`` is 256 and cannot be set to
  anything else (a create or update with another value is refused, 400 SubCode=40000); a batch up to 256 KB.
* **Premium**: an entity's ``max_message_size_in_kilobytes`` from 1,024 (the default) to 102,400 (100 MB); a
  batch up to 1 MB whatever the entity takes, so a sender link advertises ``max-message-size`` = the entity's
  limit and ``com.microsoft:max-message-batch-size`` = 1 MB (at most the entity's limit).

A transfer over the link's ``max-message-size`` (one message, or a whole batch) is rejected with
``amqp:link:message-size-exceeded``. A batched transfer within it but over the batch limit (Premium, entities
above 1 MB) makes the service force-detach the sender link with ``amqp:not-allowed`` ("... received a batch
message with no data in it"), which is what :func:`batch_refusal` answers.
"""

from __future__ import annotations

from dataclasses import dataclass

from servicebus_local.model import InvalidSettings

__all__ = [
    "BATCH_TOO_LARGE",
    "MESSAGE_SIZE_EXCEEDED",
    "PREMIUM",
    "STANDARD",
    "TIERS",
    "Refusal",
    "Tier",
    "batch_refusal",
    "message_size_exceeded",
    "tier_named",
]

MESSAGE_SIZE_EXCEEDED = "amqp:link:message-size-exceeded"
#: The condition of the service's detach for a batch over the batch limit (the SDKs raise it as an invalid
#: operation: .NET ``InvalidOperationException``, JavaScript ``InvalidOperationError``).
BATCH_TOO_LARGE = "amqp:not-allowed"


@dataclass(frozen=True)
class Tier:
    """One tier's limits. ``min_message_kb``..``max_message_kb``: what an entity's ``max_message_size_in_kilobytes``
    may be; ``default_message_kb``: what it is when a create does not say; ``batch_bytes``: the most a batched
    transfer may weigh (never more than the entity's own message limit)."""

    name: str
    sku: str  # the admin endpoint's MessagingSKU
    default_message_kb: int
    min_message_kb: int
    max_message_kb: int
    batch_bytes: int

    def message_kb(self, value: int | None, entity: str) -> int:
        """The entity's message limit in KB: ``value``, or the tier's default for ``None``; a value the tier does
        not allow -> :class:`InvalidSettings`, in the service's words."""
        if value is None:
            return self.default_message_kb
        if self.min_message_kb <= value <= self.max_message_kb:
            return value
        if self.min_message_kb == self.max_message_kb:
            # The service answers "SubCode=40000. Bad Request." only (the README's tier table): say why.
            raise InvalidSettings(
                f"SubCode=40000. Bad Request. MaxMessageSizeInKilobytes ({value}) of '{entity}' can only be set "
                f"on a namespace of the Premium tier; this namespace is {self.sku}.\r\n"
                "Parameter name: MaxMessageSizeInKilobytes"
            )
        raise InvalidSettings(
            "SubCode=40000. The property value for 'MaxMessageSizeInKilobytes' must be between "
            f"{self.min_message_kb} and {self.max_message_kb} when the namespace is using '{self.sku}' tier.\r\n"
            f"Parameter name: MaxMessageSizeInKilobytes\r\nActual value was {value}."
        )

    def batch_limit(self, message_limit: int) -> int:
        """What a sender link advertises as ``com.microsoft:max-message-batch-size`` for an entity taking
        messages up to ``message_limit`` bytes."""
        return min(self.batch_bytes, message_limit)


STANDARD = Tier("standard", "Standard", 256, 256, 256, 256 * 1024)
PREMIUM = Tier("premium", "Premium", 1024, 1024, 102_400, 1024 * 1024)
TIERS = {tier.name: tier for tier in (STANDARD, PREMIUM)}


def tier_named(name: str | Tier) -> Tier:
    """The tier called ``name`` (``standard`` / ``premium``, any case); anything else -> ``ValueError``."""
    if isinstance(name, Tier):
        return name
    try:
        return TIERS[str(name).strip().lower()]
    except KeyError:
        raise ValueError(f"tier must be one of {', '.join(TIERS)}, not {name!r}") from None


def message_size_exceeded(size: int, limit: int) -> str:
    """The service's text for a transfer over the link's ``max-message-size``."""
    return f"The received message (size {size} bytes) exceeds the limit ({limit} bytes) currently allowed on the link."


@dataclass(frozen=True)
class Refusal:
    """How a transfer is refused: ``detach`` the link with the condition, or reject the delivery."""

    condition: str
    description: str
    detach: bool


def batch_refusal(size: int, message_limit: int, batch_limit: int, link_name: str) -> Refusal | None:
    """How the service refuses a batched transfer of ``size`` bytes on a link to an entity taking messages up to
    ``message_limit`` bytes and batches up to ``batch_limit`` bytes; ``None``: it does not."""
    if size > message_limit:
        return Refusal(MESSAGE_SIZE_EXCEEDED, message_size_exceeded(size, message_limit), detach=False)
    if size > batch_limit:
        return Refusal(
            BATCH_TOO_LARGE,
            f"The link '{link_name}' is force detached by the broker because publisher({link_name}) received a "
            f"batch message with no data in it. Detach origin: Publisher. (A batch of {size} bytes is over the "
            f"batch limit of {batch_limit} bytes.)",
            detach=True,
        )
    return None
