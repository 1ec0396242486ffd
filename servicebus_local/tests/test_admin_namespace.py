"""The administration endpoint behind the real :class:`~servicebus_local.server.LocalNamespace` (SPEC E3).

Same port as AMQP: the namespace server peeks at the first byte and hands TLS connections to the endpoint. These
tests check that what the SDK's admin client does is what the AMQP side sees, and the other way round.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from azure.core.exceptions import ClientAuthenticationError, HttpResponseError, ResourceNotFoundError
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.exceptions import ServiceBusError
from azure.servicebus.management import ServiceBusAdministrationClient

from servicebus_local.server import LocalNamespace

NS_KEY = "bmFtZXNwYWNlLXRlc3Qta2V5"  # made up for these tests
BACKLOG = "contoso/x-servicebus-transfer/3"

pytestmark = pytest.mark.timeout(60)  # an AMQP hang must fail fast, not after the 300 s default


@pytest.fixture
def keyed_ns() -> Iterator[LocalNamespace]:
    namespace = LocalNamespace("admin-ns", key=NS_KEY).start()
    try:
        yield namespace
    finally:
        namespace.stop()


@pytest.fixture
def admin(keyed_ns: LocalNamespace) -> Iterator[ServiceBusAdministrationClient]:
    with keyed_ns.admin_client() as client:
        yield client


@pytest.fixture
def sb(keyed_ns: LocalNamespace) -> Iterator[ServiceBusClient]:
    with ServiceBusClient.from_connection_string(keyed_ns.connection_string, retry_total=0) as client:
        yield client


def test_namespace_name_and_same_port(
    keyed_ns: LocalNamespace, admin: ServiceBusAdministrationClient
) -> None:
    assert admin.get_namespace_properties().name == "admin-ns"
    assert admin.fully_qualified_namespace == f"127.0.0.1:{keyed_ns.port}"


def test_queue_created_through_admin_carries_messages(
    keyed_ns: LocalNamespace, admin: ServiceBusAdministrationClient, sb: ServiceBusClient
) -> None:
    admin.create_queue(BACKLOG, max_delivery_count=2147483647, lock_duration=timedelta(seconds=30))
    assert keyed_ns.broker.get_queue(BACKLOG).settings.lock_duration == timedelta(seconds=30)
    with sb.get_queue_sender(BACKLOG) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"id-{i}") for i in range(3)])
    assert admin.get_queue_runtime_properties(BACKLOG).active_message_count == 3
    with sb.get_queue_receiver(BACKLOG, max_wait_time=5) as receiver:
        received = receiver.receive_messages(max_message_count=3, max_wait_time=5)
        assert sorted(str(m) for m in received) == ["m0", "m1", "m2"]
        for message in received:
            receiver.complete_message(message)
    assert admin.get_queue_runtime_properties(BACKLOG).active_message_count == 0
    assert [q.name for q in admin.list_queues()] == [BACKLOG]


def test_runtime_counts_follow_the_broker(
    admin: ServiceBusAdministrationClient, sb: ServiceBusClient
) -> None:
    admin.create_queue("counted")
    with sb.get_queue_sender("counted") as sender:
        sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b"), ServiceBusMessage("dead")])
        sender.schedule_messages(ServiceBusMessage("later"), datetime.now(timezone.utc) + timedelta(hours=1))
    with sb.get_queue_receiver("counted", max_wait_time=5) as receiver:
        for message in receiver.receive_messages(max_message_count=3, max_wait_time=5):
            if str(message) == "dead":
                receiver.dead_letter_message(message, reason="test")
            else:
                receiver.abandon_message(message)
    runtime = admin.get_queue_runtime_properties("counted")
    assert runtime.active_message_count == 2
    assert runtime.dead_letter_message_count == 1
    assert runtime.scheduled_message_count == 1
    assert runtime.total_message_count == 4
    assert runtime.size_in_bytes > 0
    with sb.get_queue_receiver("counted", sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=5) as dlq:
        dead = dlq.receive_messages(max_wait_time=5)
        assert [str(m) for m in dead] == ["dead"]
        dlq.complete_message(dead[0])
    assert admin.get_queue_runtime_properties("counted").dead_letter_message_count == 0


def test_topic_and_subscriptions_created_through_admin_fan_out(
    admin: ServiceBusAdministrationClient, sb: ServiceBusClient
) -> None:
    admin.create_topic("events")
    admin.create_subscription("events", "audit")
    admin.create_subscription("events", "billing", max_delivery_count=3)
    assert admin.get_topic_runtime_properties("events").subscription_count == 2
    with sb.get_topic_sender("events") as sender:
        sender.send_messages(ServiceBusMessage("hello"))
    for name in ("audit", "billing"):
        assert admin.get_subscription_runtime_properties("events", name).active_message_count == 1
        with sb.get_subscription_receiver("events", name, max_wait_time=5) as receiver:
            assert [str(m) for m in receiver.receive_messages(max_wait_time=5)] == ["hello"]
    assert [s.name for s in admin.list_subscriptions("events")] == ["audit", "billing"]
    assert admin.get_subscription("events", "billing").max_delivery_count == 3
    assert [r.name for r in admin.list_rules("events", "audit")] == ["$Default"]
    admin.delete_subscription("events", "audit")
    with pytest.raises(ResourceNotFoundError):
        admin.get_subscription("events", "audit")


def test_disabling_through_admin_stops_sends(
    admin: ServiceBusAdministrationClient, sb: ServiceBusClient
) -> None:
    admin.create_queue("switchable")
    queue = admin.get_queue("switchable")
    queue.status = "Disabled"
    admin.update_queue(queue)
    with sb.get_queue_sender("switchable") as sender, pytest.raises(ServiceBusError):
        sender.send_messages(ServiceBusMessage("refused"))
    queue.status = "Active"
    admin.update_queue(queue)
    with sb.get_queue_sender("switchable") as sender:
        sender.send_messages(ServiceBusMessage("accepted"))
    assert admin.get_queue_runtime_properties("switchable").active_message_count == 1


def test_entities_made_by_the_broker_are_listed(keyed_ns: LocalNamespace) -> None:
    with LocalNamespace("seeded", queues=["b", "a"], topics={"t": ["s1"]}) as ns, ns.admin_client() as client:
        assert [q.name for q in client.list_queues()] == ["a", "b"]
        assert [t.name for t in client.list_topics()] == ["t"]
        assert [s.name for s in client.list_subscriptions("t")] == ["s1"]
        assert client.get_namespace_properties().name == "seeded"


def test_injected_admin_fault(keyed_ns: LocalNamespace, admin: ServiceBusAdministrationClient) -> None:
    keyed_ns.faults.fail_admin("PUT", f"/{BACKLOG}", 403, count=1, detail="no Manage claim")
    with pytest.raises(HttpResponseError) as caught:
        admin.create_queue(BACKLOG)
    assert caught.value.status_code == 403
    assert "no Manage claim" in str(caught.value)
    admin.create_queue(BACKLOG)
    assert keyed_ns.broker.get_queue(BACKLOG).name == BACKLOG


def test_wrong_key_is_refused(keyed_ns: LocalNamespace) -> None:
    wrong = keyed_ns.connection_string.replace(NS_KEY, "d3Jvbmc=")
    with (
        ServiceBusAdministrationClient.from_connection_string(
            wrong, connection_verify=keyed_ns.ca_file
        ) as client,
        pytest.raises(ClientAuthenticationError),
    ):
        client.create_queue("nope")
    assert [q.name for q in keyed_ns.broker.list_queues()] == []


def test_admin_and_amqp_share_the_port_with_several_namespaces() -> None:
    with LocalNamespace("primary") as primary, LocalNamespace("secondary") as secondary:
        with primary.admin_client() as p, secondary.admin_client() as s:
            p.create_queue("orders")
            s.create_queue(f"primary/x-servicebus-transfer/{0}")
            assert p.get_namespace_properties().name == "primary"
            assert s.get_namespace_properties().name == "secondary"
            assert [q.name for q in s.list_queues()] == ["primary/x-servicebus-transfer/0"]
        assert [q.name for q in primary.broker.list_queues()] == ["orders"]
