"""One rule for the primary's namespace name (SPEC B1) in provisioning, the paired sender and the syphon."""

from __future__ import annotations

from typing import Any

import pytest

from spark_sb.config import ServiceBusConfig
from spark_sb.provisioning import provision_backlog_queues
from spark_sb.sender import PairedSender
from spark_sb.syphon import Syphon

pytestmark = pytest.mark.local


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
