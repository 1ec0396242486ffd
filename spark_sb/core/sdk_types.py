"""The azure-servicebus pieces the per-message hot paths need, looked up once rather than per message.

The SDK is imported on first use, so it loads only where messages are built (executors, the syphon, tests).
Used by :mod:`spark_sb.message.outbound` (``OutboundMessage.to_sdk``) and :mod:`spark_sb.message.backlog` (``to_backlog_sdk``).
Runs anywhere; nothing here is stateful beyond the cached lookups.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from azure.servicebus import ServiceBusMessage

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

_SDK_MESSAGE: Any = None
_AMQP_LONG: Any = None


def sdk_message_type() -> type[ServiceBusMessage]:
    """``azure.servicebus.ServiceBusMessage``, imported on first use and then looked up once."""
    global _SDK_MESSAGE
    if _SDK_MESSAGE is None:
        from azure.servicebus import ServiceBusMessage

        _SDK_MESSAGE = ServiceBusMessage
    return _SDK_MESSAGE  # type: ignore[no-any-return]


def sdk_properties(props: Mapping[str, Any]) -> dict[str | bytes, Any] | None:
    """Application properties as the SDK encodes them: ints outside the 32-bit range wrapped as AMQP ``long``
    (the SDK would send them as ``int`` and fail); None for no properties."""
    if not props:
        return None
    global _AMQP_LONG
    if _AMQP_LONG is None:
        from azure.servicebus._pyamqp.utils import amqp_long_value

        _AMQP_LONG = amqp_long_value
    out: dict[str | bytes, Any] = {}
    for k, v in props.items():
        if isinstance(v, int) and not isinstance(v, bool) and not (INT32_MIN <= v <= INT32_MAX):
            out[k] = _AMQP_LONG(v)
        else:
            out[k] = v
    return out
