"""Adapts the azure-servicebus SDK's samples to a local namespace; loaded by ``run_sdk_samples`` only.

The samples build their clients from a fully qualified namespace and ``DefaultAzureCredential``. A local namespace
serves AMQP without TLS on one port and accepts any token (no ``--key``), so in the sample's process, and only
when ``SERVICEBUS_SAMPLES_ADAPTER=1``:

* ``azure.identity.DefaultAzureCredential`` (sync and aio) gives a fixed local token instead of asking Azure AD;
* ``ServiceBusClient``, ``ServiceBusSender`` and ``ServiceBusReceiver`` (sync and aio) built without ``use_tls``
  get ``use_tls=False``, which keeps the port, as ``from_connection_string`` does for ``UseDevelopmentEmulator``;
* without ``aiohttp`` (not installed by this project), the async ``ServiceBusAdministrationClient``'s default
  transport is azure-core's ``AsyncioRequestsTransport`` instead of ``AioHttpTransport``.

The SDK's code is not changed: only the arguments the samples pass are.
"""

from __future__ import annotations

import os
import time
from typing import Any


def _install() -> None:
    from azure.core.credentials import AccessToken

    token = "local-namespace-token"

    class LocalCredential:
        """What ``DefaultAzureCredential`` gives a sample: a token the local namespace accepts."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
            return AccessToken(token, int(time.time()) + 3600)

        def close(self) -> None:
            pass

        def __enter__(self) -> LocalCredential:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    class AsyncLocalCredential:
        """The async ``DefaultAzureCredential``'s stand-in."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        async def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
            return AccessToken(token, int(time.time()) + 3600)

        async def close(self) -> None:
            pass

        async def __aenter__(self) -> AsyncLocalCredential:
            return self

        async def __aexit__(self, *exc: object) -> None:
            pass

    import azure.identity
    import azure.identity.aio

    azure.identity.DefaultAzureCredential = LocalCredential  # type: ignore[misc, assignment]
    azure.identity.aio.DefaultAzureCredential = AsyncLocalCredential  # type: ignore[misc, assignment]

    import azure.servicebus
    import azure.servicebus.aio

    def plain_amqp(cls: Any) -> None:
        init = cls.__init__

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("use_tls", False)
            init(self, *args, **kwargs)

        cls.__init__ = __init__

    for module in (azure.servicebus, azure.servicebus.aio):
        for name in ("ServiceBusClient", "ServiceBusSender", "ServiceBusReceiver"):
            plain_amqp(getattr(module, name))

    try:
        import aiohttp  # noqa: F401 - the async admin client's default transport
    except ImportError:
        # Its module imports AioHttpTransport by name: it gets azure-core's requests-based asyncio transport.
        import azure.core.pipeline.transport as transports

        vars(transports)["AioHttpTransport"] = transports.AsyncioRequestsTransport


if os.environ.get("SERVICEBUS_SAMPLES_ADAPTER") == "1":
    _install()
