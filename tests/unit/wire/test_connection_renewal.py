"""Which failures a shared connection answers with a fresh link (the service ended the link for its lifecycle, or
the SDK refused a call because the link's token expired) rather than passing them to the failover decision."""

from __future__ import annotations

from azure.servicebus.exceptions import ServiceBusAuthenticationError, ServiceBusConnectionError

from spark_sb.core.errors import classify
from spark_sb.wire.connection import renewable


class TokenExpired(
    Exception
):  # pyamqp's, by name: raised when the client's token expired before it was renewed
    pass


def sdk_token_expired() -> ServiceBusAuthenticationError:
    """What the SDK raises from a send whose link's token expired on the client side (seen with 4 s tokens)."""
    exc = ServiceBusAuthenticationError(
        message="CBS Authentication Expired. Error condition: amqp:internal-error."
    )
    exc.__cause__ = TokenExpired("CBS Authentication Expired.")
    return exc


def test_a_token_the_sdk_found_expired_is_renewed_on_a_fresh_link_not_called_a_configuration_error() -> None:
    exc = sdk_token_expired()
    assert classify(exc).name == "unauthorized"  # on its own it would fail the batch as a configuration error
    assert renewable(exc)


def test_a_refused_token_and_an_outage_are_not_renewed() -> None:
    assert not renewable(
        ServiceBusAuthenticationError(message="InvalidSignature: the token has an invalid signature")
    )
    assert not renewable(ServiceBusConnectionError(message="connection refused"))
