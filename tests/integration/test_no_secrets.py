"""R3: no secret in any log line, exception text, repr or outcome, through a whole failover cycle.

Both namespaces check SAS tokens against a configured key, so the connection strings carry real keys. Logging is
captured at DEBUG for every logger (ours and the SDK's).
"""

from __future__ import annotations

import logging
import pickle

import pytest

from servicebus_local.server import LocalNamespace
from spark_sb.admin.provisioning import provision_backlog_queues
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.errors import ServiceBusConfigError
from spark_sb.failover.registry import FailoverRegistry
from spark_sb.message.outbound import OutboundMessage
from spark_sb.sender.paired import PairedSender
from spark_sb.syphon.mover import Syphon

pytestmark = pytest.mark.slow

KEY_P = "cHJpbWFyeS1zZWNyZXQta2V5LXZhbHVlLTEyMzQ1Ng=="
KEY_S = "c2Vjb25kYXJ5LXNlY3JldC1rZXktdmFsdWUtNjU0MzI="
WRONG = "d3Jvbmcta2V5LXRoYXQtbXVzdC1ub3QtbGVhay0wMDA="


def _assert_clean(text: str) -> None:
    for secret in (KEY_P, KEY_S, WRONG):
        assert secret not in text
    assert "SharedAccessKey=" not in text
    assert "sig=" not in text


def test_failover_cycle_leaks_no_secret(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with (
        LocalNamespace("primary", queues=["orders"], key=KEY_P) as primary,
        LocalNamespace("secondary", key=KEY_S) as secondary,
    ):
        config = ServiceBusConfig.from_dict(
            {
                "primary": {"connection_string": primary.connection_string, "namespace_name": "primary"},
                "secondary": {"connection_string": secondary.connection_string},
                "entity": "orders",
                "backlog_queue_count": 2,
                "failover_interval": 0,
                "ping_primary_interval": "1h",
                "send_timeout": "5s",
                "retry": {"total": 0, "backoff_factor": 0.05, "backoff_max": 0.1},
            }
        )
        assert KEY_P in primary.connection_string  # the test is only meaningful with real keys
        texts: list[str] = [repr(config), str(config), repr(config.primary), config.primary.redacted()]
        report = provision_backlog_queues(config, admin_client=secondary.admin_client(), retry_pause=0)
        texts += [report.format_table(), repr(report.to_dict())]
        primary.faults.fail_sends("orders", "amqp:resource-limit-exceeded")
        with PairedSender(config, registry=FailoverRegistry()) as sender:
            outcome = sender.send([OutboundMessage(body=f"m{i}", message_id=f"m{i}") for i in range(5)])
            texts += [repr(sender), repr(outcome), pickle.dumps(outcome).decode("latin-1")]
        assert outcome.total_diverted == 5
        primary.faults.clear()
        with Syphon(config) as syphon:
            moved = syphon.drain_all(max_wait=0.5)
            texts += [repr(syphon), repr(moved)]
        assert moved.forwarded_total == 5

        # a wrong key: the error must explain, without echoing either key
        wrong = ServiceBusConfig.from_dict(
            {
                "primary": {
                    "connection_string": primary.connection_string.replace(KEY_P, WRONG),
                    "namespace_name": "primary",
                },
                "entity": "orders",
                "send_timeout": "5s",
                "retry": {"total": 0},
            }
        )
        with (
            pytest.raises(ServiceBusConfigError) as info,
            PairedSender(wrong, registry=FailoverRegistry()) as sender,
        ):
            sender.send([OutboundMessage(body="x")])
        texts += [str(info.value), repr(info.value)]
    texts.append(caplog.text)
    texts += [str(r.args) for r in caplog.records]
    for text in texts:
        _assert_clean(text)
