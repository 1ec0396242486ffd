"""spark-servicebus: a Structured Streaming sink for Azure Service Bus with paired-namespace failover.

The public API is small; names are imported lazily so that ``import spark_sb`` stays cheap on executors:

* :func:`load_config` / :class:`ServiceBusConfig` - the one frozen, validated, picklable configuration (driver).
* :class:`ServiceBusSink` / :func:`sink` - the ``foreachBatch`` function (driver; sends from executors).
* :func:`register` - registers the ``servicebus`` data source: ``format("servicebus")`` (driver).
* :func:`relay_state` / :class:`StateRelay` - copies that source's spool into catalog state tables
  (``state_table_prefix``; driver, the user's process).
* :class:`PairedSender` - the failover-aware sender, usable without Spark (any process; one per thread).
* :class:`Syphon` - moves backlog messages back to the primary (any process; one per thread).
* :func:`provision_backlog_queues` - creates/checks the backlog queues (driver / CLI).
* :func:`is_probe` - for receivers: True for the sender's probe messages, which must be dropped.
* :class:`OutboundMessage` - the project's message value type.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "load_config": "spark_sb.config.service_bus",
    "ServiceBusConfig": "spark_sb.config.service_bus",
    "ConfigError": "spark_sb.core.errors",
    "OutboundMessage": "spark_sb.message.outbound",
    "PairedSender": "spark_sb.sender.paired",
    "SendOutcome": "spark_sb.failover.outcome",
    "is_probe": "spark_sb.message.backlog",
    "ServiceBusSink": "spark_sb.spark.sink",
    "sink": "spark_sb.spark.sink",
    "register": "spark_sb.spark.datasource",
    "relay_state": "spark_sb.spark.relay",
    "StateRelay": "spark_sb.spark.relay",
    "Syphon": "spark_sb.syphon.mover",
    "provision_backlog_queues": "spark_sb.admin.provisioning",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'spark_sb' has no attribute {name!r}")
    return getattr(import_module(module), name)
