"""The namespace's tier (SPEC E9, issue 50), with the unmodified SDK over real TCP: Standard (256 KB messages and
batches, an entity's message size not settable) and Premium (entity limits of 1 to 100 MB, batches of at most
1 MB on the link). The README's tier table cites the service for each behaviour."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.core.exceptions import HttpResponseError
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusMessageBatch
from azure.servicebus.exceptions import MessageSizeExceededError, ServiceBusConnectionError

from servicebus_local.model import InvalidSettings, QueueSettings, TopicSettings
from servicebus_local.server import LocalNamespace
from servicebus_local.tiers import PREMIUM, STANDARD, batch_refusal, tier_named
from servicebus_local.topology import TopologyError

from .conftest import run_cli

KB = 1024
MB = 1024 * KB


@pytest.fixture
def premium() -> Iterator[LocalNamespace]:
    with LocalNamespace("premium", tier="premium") as ns:
        yield ns


@pytest.fixture
def standard() -> Iterator[LocalNamespace]:
    with LocalNamespace("standard", queues=["q"], tier="standard") as ns:  # also the default
        yield ns


def _client(ns: LocalNamespace) -> ServiceBusClient:
    return ServiceBusClient.from_connection_string(ns.connection_string, retry_total=0)


def _received_sizes(client: ServiceBusClient, queue: str, n: int) -> list[int]:
    out: list[int] = []
    with client.get_queue_receiver(queue, max_wait_time=2) as receiver:
        while len(out) < n:
            got = receiver.receive_messages(max_message_count=n - len(out), max_wait_time=2)
            if not got:
                break
            for m in got:
                out.append(len(b"".join(m.body)))
                receiver.complete_message(m)
    return out


# ------------------------------------------------------------------------------------------------ Premium


def test_premium_100_mb_queue_takes_a_5_mb_message_but_batches_of_1_mb(premium: LocalNamespace) -> None:
    """The issue's case: a 100 MB Premium queue advertises its message limit, and a batch limit of 1 MB (it was
    104,857,600 bytes); a 1.5 MB message does not fit a batch but goes alone, and so does a 5 MB one."""
    with premium.admin_client() as admin:
        admin.create_queue("big", max_message_size_in_kilobytes=102_400)
        assert admin.get_queue("big").max_message_size_in_kilobytes == 102_400
    with _client(premium) as client, client.get_queue_sender("big") as sender:
        batch = sender.create_message_batch()
        assert batch.max_size_in_bytes == 1 * MB
        with pytest.raises(MessageSizeExceededError):
            batch.add_message(ServiceBusMessage(b"x" * (1536 * KB)))
        with pytest.raises(ValueError, match="too large"):
            sender.create_message_batch(max_size_in_bytes=2 * MB)
        sender.send_messages(ServiceBusMessage(b"x" * (1536 * KB)))
        sender.send_messages(ServiceBusMessage(b"y" * (5 * MB)))
        batch.add_message(ServiceBusMessage(b"z" * (600 * KB)))
        sender.send_messages(batch)
        sizes = _received_sizes(client, "big", 3)
    assert sizes == [1536 * KB, 5 * MB, 600 * KB]


def test_premium_entities_default_to_1_mb_and_take_1_to_100_mb(premium: LocalNamespace) -> None:
    with premium.admin_client() as admin:
        assert admin.create_queue("plain").max_message_size_in_kilobytes == 1024
        assert admin.create_topic("events").max_message_size_in_kilobytes == 1024
        for refused in (1023, 102_401, 256):
            with pytest.raises(HttpResponseError) as caught:
                admin.create_queue("bad", max_message_size_in_kilobytes=refused)
            assert caught.value.status_code == 400
            assert "must be between 1024 and 102400" in str(caught.value)
        queue = admin.get_queue("plain")
        queue.max_message_size_in_kilobytes = 54_321
        admin.update_queue(queue)
        assert admin.get_queue("plain").max_message_size_in_kilobytes == 54_321
        topic = admin.get_topic("events")
        topic.max_message_size_in_kilobytes = 99
        with pytest.raises(HttpResponseError):
            admin.update_topic(topic)
        assert admin.get_namespace_properties().messaging_sku == "Premium"
    with _client(premium) as client, client.get_queue_sender("plain") as sender:
        sender.send_messages(ServiceBusMessage(b"x" * (900 * KB)))  # above Standard's 256 KB
        with pytest.raises(MessageSizeExceededError, match="exceeds the limit"):
            sender.send_messages(ServiceBusMessage(b"x" * (60 * MB)))


def test_premium_batch_over_1_mb_detaches_the_link_as_the_service_does(premium: LocalNamespace) -> None:
    """An SDK that takes the link's max-message-size for its batch limit (older ones, others) sends a batch
    over 1 MB to a large-message entity: the service force-detaches the sender link (amqp:not-allowed) and keeps
    nothing of it; the next send, on a new link, goes."""
    premium.broker.create_queue("big", QueueSettings(max_message_size_in_kilobytes=10_240))
    with _client(premium) as client, client.get_queue_sender("big") as sender:
        batch = ServiceBusMessageBatch(max_size_in_bytes=10 * MB)  # what the link's max-message-size allows
        for _ in range(2):
            batch.add_message(ServiceBusMessage(b"x" * (700 * KB)))
        # The SDK reads the detach as the transfer's failure (as for every detach while it sends: the README).
        with pytest.raises(ServiceBusConnectionError):
            sender.send_messages(batch)
        assert premium.broker.get_queue("big").runtime.active_message_count == 0
        assert premium.counters()["batches_over_limit"] == 1
        sender.send_messages(ServiceBusMessage(b"after"))
    assert premium.broker.get_queue("big").runtime.active_message_count == 1


def test_premium_topic_and_its_subscription_carry_large_messages(premium: LocalNamespace) -> None:
    premium.broker.create_topic("events", TopicSettings(max_message_size_in_kilobytes=4096))
    premium.broker.create_subscription("events", "all")
    with _client(premium) as client:
        with client.get_topic_sender("events") as sender:
            assert sender.create_message_batch().max_size_in_bytes == 1 * MB
            sender.send_messages(ServiceBusMessage(b"x" * (3 * MB)))
        with client.get_subscription_receiver("events", "all", max_wait_time=2) as receiver:
            (got,) = receiver.receive_messages(max_wait_time=2)
            assert len(b"".join(got.body)) == 3 * MB


# ------------------------------------------------------------------------------------------------ Standard


def test_standard_refuses_a_300_kb_message_with_the_services_error(standard: LocalNamespace) -> None:
    with _client(standard) as client, client.get_queue_sender("q") as sender:
        assert sender.create_message_batch().max_size_in_bytes == 256 * KB
        with pytest.raises(MessageSizeExceededError, match=r"exceeds the limit \(262144 bytes\)"):
            sender.send_messages(ServiceBusMessage(b"x" * (300 * KB)))
    assert standard.broker.get_queue("q").runtime.active_message_count == 0


def test_standard_batch_over_256_kb_is_refused_even_when_each_message_fits(standard: LocalNamespace) -> None:
    """The batch limit is the message limit (256 KB): a batch of two 200 KB messages, built by hand beyond what
    the SDK's own batch allows, is refused whole with amqp:link:message-size-exceeded."""
    with _client(standard) as client, client.get_queue_sender("q") as sender:
        batch = ServiceBusMessageBatch(max_size_in_bytes=1 * MB)
        for _ in range(2):
            batch.add_message(ServiceBusMessage(b"x" * (200 * KB)))
        with pytest.raises(MessageSizeExceededError):
            sender.send_messages(batch)
    assert standard.broker.get_queue("q").runtime.active_message_count == 0
    assert standard.counters()["batches_over_limit"] == 1


def test_standard_entities_are_256_kb_and_not_settable(standard: LocalNamespace) -> None:
    """The SDK's live-recorded tests: a Standard namespace refuses max_message_size_in_kilobytes=1024 (400)."""
    with standard.admin_client() as admin:
        assert admin.get_queue("q").max_message_size_in_kilobytes == 256
        for create in (admin.create_queue, admin.create_topic):
            with pytest.raises(HttpResponseError) as caught:
                create("big", max_message_size_in_kilobytes=1024)
            assert caught.value.status_code == 400
            assert "Premium tier" in str(caught.value)
        queue = admin.get_queue("q")  # an update sends back the 256 it read: accepted
        queue.max_delivery_count = 3
        admin.update_queue(queue)
        assert admin.get_queue("q").max_message_size_in_kilobytes == 256
        assert admin.get_namespace_properties().messaging_sku == "Standard"
    with pytest.raises(InvalidSettings):
        standard.broker.create_queue("big", QueueSettings(max_message_size_in_kilobytes=102_400))


def test_a_topology_entity_the_tier_does_not_allow_is_one_line_exit_2(tmp_path: Path) -> None:
    topology = tmp_path / "topology.yaml"
    topology.write_text("queues:\n  - {name: big, max_message_size_in_kilobytes: 102400}\n")
    with pytest.raises(TopologyError, match="queue 'big': SubCode=40000"):
        LocalNamespace("t", topology=topology)
    with LocalNamespace("t", topology=topology, tier="premium") as ns:
        assert ns.broker.get_queue("big").settings.max_message_size_in_kilobytes == 102_400
    result = run_cli("--topology", str(topology))
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "queue 'big': SubCode=40000" in result.stderr, result.stderr
    result = run_cli("--tier", "gold")
    assert result.returncode == 2 and "--tier" in result.stderr, result.stderr


# ------------------------------------------------------------------------------------------------ the choice


def test_cli_tier_premium_serves_a_premium_namespace(tmp_path: Path) -> None:
    topology = tmp_path / "topology.yaml"
    topology.write_text("queues:\n  - {name: big, max_message_size_in_kilobytes: 102400}\n")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "servicebus_local",
            "--port",
            "0",
            "--tier",
            "premium",
            "--topology",
            str(topology),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("connection_string="), line
        conn = line.split("=", 1)[1]
        with (
            ServiceBusClient.from_connection_string(conn, retry_total=0) as client,
            client.get_queue_sender("big") as sender,
        ):
            assert sender.create_message_batch().max_size_in_bytes == 1 * MB
            sender.send_messages(ServiceBusMessage(b"x" * (2 * MB)))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
        if proc.stderr is not None:
            proc.stderr.close()


@pytest.mark.parametrize("local_namespace_tier", ["premium"])
def test_the_fixtures_take_the_tier(local_namespace: LocalNamespace, local_namespace_tier: str) -> None:
    assert local_namespace.broker.tier is PREMIUM
    assert local_namespace.broker.get_queue("q1").settings.max_message_size_in_kilobytes == 1024


def test_the_fixtures_are_standard_by_default(local_namespace: LocalNamespace) -> None:
    assert local_namespace.broker.tier is STANDARD


def test_the_control_api_status_shows_the_tier() -> None:
    for tier in ("standard", "premium"):
        with LocalNamespace("c", tier=tier, control_port=0) as ns:
            assert ns.control_url is not None
            with urllib.request.urlopen(f"{ns.control_url}/status", timeout=10) as reply:
                assert json.load(reply)["tier"] == tier


def test_tier_names_and_the_batch_decision() -> None:
    assert tier_named("Premium") is PREMIUM and tier_named(" standard ") is STANDARD
    with pytest.raises(ValueError, match="standard, premium"):
        tier_named("basic")
    with pytest.raises(ValueError, match="standard, premium"):
        LocalNamespace("x", tier="gold")
    assert PREMIUM.batch_limit(100 * MB) == 1 * MB and PREMIUM.batch_limit(1 * MB) == 1 * MB
    assert STANDARD.batch_limit(256 * KB) == 256 * KB
    assert batch_refusal(MB, 100 * MB, MB, "l") is None
    over = batch_refusal(MB + 1, 100 * MB, MB, "l")
    assert over is not None and over.detach and over.condition == "amqp:not-allowed"
    too_big = batch_refusal(300 * KB, 256 * KB, 256 * KB, "l")
    assert too_big is not None and not too_big.detach
    assert too_big.condition == "amqp:link:message-size-exceeded"
