"""What the Spark tests share to drive a stream through two local namespaces - in the test session and in the child
scripts that run a Connect server or a local cluster (``connect_*.py``, ``cluster_*.py``): rows written into a
stream's source folder as whole files, queues drained, the sink's config and the data source's options for a
namespace pair, a stream run file by file, the two micro-batches of the outage tests, and the syphon job's backlog
queues, config and backlog messages (``test_syphon_job*.py``). Helpers, not tests: the test files import them from
here rather than from each other."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness.queues import take
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.message.outbound import OutboundMessage

#: The foreachBatch sink's test rows (``test_sink*.py``).
SINK_SCHEMA = "body STRING, message_id STRING, session_id STRING, properties MAP<STRING, STRING>"
#: The ``servicebus`` data source's test rows (``test_datasource*.py``).
SOURCE_SCHEMA = "body STRING, message_id STRING, session_id STRING"


def write_rows(folder: Path, name: str, rows: list[dict[str, Any]]) -> None:
    """``rows`` as JSON lines in ``folder/name``, whole at once (renamed into place: a stream never reads half)."""
    tmp = folder / f".{name}"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.rename(folder / name)


def _receive_all(connection_string: str, entity: str) -> list[Any]:
    return take(connection_string, entity, batch=200)


def drain_messages(ns: Any, entity: str) -> list[Any]:
    """Every message of queue ``entity`` in the local namespace ``ns``, received and deleted."""
    return _receive_all(ns.connection_string, entity)


def drain_ids(connection_string: str, entity: str) -> list[str]:
    """The message ids of every message of queue ``entity``, received and deleted."""
    return [str(m.message_id) for m in _receive_all(connection_string, entity)]


def sink_config(pair: Any, **overrides: Any) -> ServiceBusConfig:
    """The sink's config for a namespace pair: entity ``orders``, two backlog queues, fail over at the first
    failure, no probe within the test, no retries."""
    settings: dict[str, Any] = {
        "primary": {"connection_string": pair.primary.connection_string, "namespace_name": "primary"},
        "secondary": {"connection_string": pair.secondary.connection_string},
        "entity": "orders",
        "backlog_queue_count": 2,
        "failover_interval": 0,
        "ping_primary_interval": "1h",
        "send_timeout": "5s",
        "retry": {"total": 0, "backoff_factor": 0.05, "backoff_max": 0.2},
    }
    settings.update(overrides)
    return ServiceBusConfig.from_dict(settings)


def run_sink_stream(spark: Any, sb_sink: Any, folder: Path, ckpt: Path, files: list[Any]) -> None:
    """A ``foreachBatch(sb_sink)`` stream of ``folder``: each of ``files`` (a callable that writes one) then a
    micro-batch; the query stopped after, and its error, if any, fails the test."""
    query = (
        spark.readStream.schema(SINK_SCHEMA)
        .json(str(folder))
        .writeStream.foreachBatch(sb_sink)
        .option("checkpointLocation", str(ckpt))
        .start()
    )
    try:
        for write in files:
            write()
            query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None


def source_options(pair: Any, state: Path | None = None, **extra: str) -> dict[str, str]:
    """``format("servicebus")``'s options for a namespace pair (sink id ``ds``), the same settings as
    :func:`sink_config`; ``state``: its ``state_location``."""
    opts = {
        "primary.connection_string": pair.primary.connection_string,
        "primary.namespace_name": "primary",
        "secondary.connection_string": pair.secondary.connection_string,
        "entity": "orders",
        "backlog_queue_count": "2",
        "failover_interval": "0",
        "ping_primary_interval": "1h",
        "send_timeout": "5s",
        "retry.total": "0",
        "retry.backoff_factor": "0.05",
        "retry.backoff_max": "0.2",
        "sink_id": "ds",
    }
    if state is not None:
        opts["state_location"] = str(state)
    opts.update(extra)
    return opts


def start_source(spark: Any, folder: Path, ckpt: Path, opts: dict[str, str]) -> Any:
    """A started stream of ``folder`` into ``format("servicebus")`` with ``opts``."""
    return (
        spark.readStream.schema(SOURCE_SCHEMA)
        .json(str(folder))
        .writeStream.format("servicebus")
        .options(**opts)
        .option("checkpointLocation", str(ckpt))
        .start()
    )


def healthy_then_outage(
    query: Any,
    folder: Path,
    primary: Any,
    first: list[dict[str, Any]],
    outage: list[dict[str, Any]],
    between: Callable[[], None] = lambda: None,
) -> None:
    """The two micro-batches of the outage tests: ``first`` with the primary healthy, then ``outage`` with the
    primary's ``orders`` refusing sends as full (``amqp:resource-limit-exceeded``). ``between`` runs after the
    first. The caller stops the query."""
    write_rows(folder, "0.json", first)
    query.processAllAvailable()
    between()
    primary.faults.fail_sends("orders", "amqp:resource-limit-exceeded")
    write_rows(folder, "1.json", outage)
    query.processAllAvailable()


#: The syphon job tests' backlog queues on the secondary (``backlog_queue_count`` 2).
BACKLOG = [f"primary/x-servicebus-transfer/{i}" for i in range(2)]


def syphon_config(pair: Any, state: Path, **settings: Any) -> ServiceBusConfig:
    """The syphon job's config for a namespace pair: the two :data:`BACKLOG` queues, state tables at ``state``, a
    20 s micro-batch budget; ``settings`` replace top-level keys (``syphon``, ``ordering``, ...)."""
    return ServiceBusConfig.from_dict(
        {
            "primary": {"connection_string": pair.primary.connection_string, "namespace_name": "primary"},
            "secondary": {"connection_string": pair.secondary.connection_string},
            "backlog_queue_count": len(BACKLOG),
            "send_timeout": "5s",
            "ping_primary_interval": "60s",
            "state_location": str(state),
            "syphon": {"batch_duration": "20s"},
            **settings,
        }
    )


def messages(
    prefix: str, n: int, entity: str = "orders", session: str | None = None
) -> list[OutboundMessage]:
    """``n`` messages for ``entity`` with ids and bodies ``<prefix>0``, ``<prefix>1``, ..."""
    return [
        OutboundMessage(body=f"{prefix}{i}", message_id=f"{prefix}{i}", entity=entity, session_id=session)
        for i in range(n)
    ]


def put_backlog(ns: Any, queue: str, outbound: list[OutboundMessage]) -> None:
    """``outbound`` in their backlog form (each for its own entity, ``orders`` if none) sent to backlog queue
    ``queue`` of the local namespace ``ns``, as the sink diverts them."""
    from azure.servicebus import ServiceBusClient

    from spark_sb.message.backlog import to_backlog

    now = datetime.now(timezone.utc)
    with (
        ServiceBusClient.from_connection_string(ns.connection_string) as client,
        client.get_queue_sender(queue) as sender,
    ):
        sender.send_messages([to_backlog(m, m.entity or "orders", now).to_sdk() for m in outbound])
