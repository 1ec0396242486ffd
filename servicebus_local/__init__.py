"""servicebus-local: a local Azure Service Bus namespace for the unmodified azure-servicebus SDK.

An AMQP 1.0 server (queues, topics, subscriptions with rules, sessions, locks, TTL, dead-lettering, duplicate
detection), the HTTPS admin endpoint the SDK's ``ServiceBusAdministrationClient`` speaks, CBS tokens, the
service's limits and error conditions, and fault injection (refuse, drop, stall, blackhole, entity faults) through
``ns.faults`` or an HTTP control API. It runs in the calling process (``LocalNamespace(...).start()``) or as a
program (``python -m servicebus_local``); the SDK reaches it over real TCP.

* :class:`~servicebus_local.server.LocalNamespace` - one namespace (``start()`` / ``stop()``).
* the pytest plugin ``servicebus_local.fixtures`` (registered through the ``pytest11`` entry point) provides the
  fixtures ``local_namespace`` and ``namespace_pair``.

It depends on nothing of ``spark_sb`` (the Spark sink that it was built for); ``spark-servicebus[local]`` brings
it as an extra.
"""

__version__ = "0.1.0"
