"""One rule for the primary's namespace name (SPEC B1) in provisioning, the paired sender and the syphon."""

from __future__ import annotations

from typing import Any

import pytest

from spark_sb.admin.provisioning import provision_backlog_queues
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.sender.paired import PairedSender
from spark_sb.syphon.mover import Syphon


def test_address_endpoint_uses_the_name_the_namespace_reports(
    namespace_pair: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", namespace_pair.primary.ca_file)  # trust the local CA
    config = ServiceBusConfig.from_dict(
        {
            "primary": {"connection_string": namespace_pair.primary.connection_string},  # no namespace_name
            "secondary": {"connection_string": namespace_pair.secondary.connection_string},
            "backlog_queue_count": 2,
        }
    )
    report = provision_backlog_queues(config, retry_pause=0)
    expected = ["primary/x-servicebus-transfer/0", "primary/x-servicebus-transfer/1"]
    assert report.usable_queues == expected
    with PairedSender(config) as sender:
        assert sender.backlog_queues == expected
    with Syphon(config) as syphon:
        assert syphon.backlog_queues == expected


def test_the_driver_resolves_the_name_once_and_executors_never_ask(
    namespace_pair: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sink built on the driver ships the primary's name in its config: a sender built later (a new Python
    worker) while the primary is down starts, and diverts to the backlog, without asking the primary."""
    import pickle

    from spark_sb.failover.registry import FailoverRegistry
    from spark_sb.message.outbound import OutboundMessage
    from spark_sb.spark.sink import ServiceBusSink
    from spark_sb.wire import admin_api as names_module

    monkeypatch.setenv("REQUESTS_CA_BUNDLE", namespace_pair.primary.ca_file)
    namespace_pair.primary.broker.create_queue("orders")
    for i in range(2):
        namespace_pair.secondary.broker.create_queue(f"primary/x-servicebus-transfer/{i}")
    config = ServiceBusConfig.from_dict(
        {
            "primary": {"connection_string": namespace_pair.primary.connection_string},  # no namespace_name
            "secondary": {"connection_string": namespace_pair.secondary.connection_string},
            "entity": "orders",
            "backlog_queue_count": 2,
            "failover_interval": "0s",
            "send_timeout": "2s",
            "retry": {"total": 0},
        }
    )
    sink = ServiceBusSink(config)  # driver: asks the namespace once
    assert sink.config.primary.namespace_name == "primary"
    shipped = pickle.loads(pickle.dumps(sink)).config  # what an executor receives

    names_module._resolved_names.clear()  # a fresh Python worker knows nothing
    namespace_pair.primary.faults.refuse_connections()
    with PairedSender(shipped, registry=FailoverRegistry()) as sender:
        outcome = sender.send([OutboundMessage(body=b"x", message_id="m1")])
    assert outcome.total_diverted == 1
    assert names_module._resolved_names == {}  # the executor never asked
