"""The HTTPS administration endpoint (SPEC E3) against the unmodified SDK ``ServiceBusAdministrationClient``.

A small harness serves :class:`servicebus_local.admin.AdminEndpoint` on a listening socket of its own (real TCP,
real TLS, the SDK's own HTTP stack) over an in-memory :class:`~servicebus_local.model.AdminStore`, so these tests
do not depend on the AMQP broker.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import errno
import hashlib
import hmac
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus, urlencode
from xml.etree import ElementTree

import pytest
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
    ServiceRequestError,
)
from azure.servicebus.management import ServiceBusAdministrationClient, TrueRuleFilter

from servicebus_local.admin import (
    QUEUE_FIELDS,
    SUBSCRIPTION_FIELDS,
    TOPIC_FIELDS,
    AdminEndpoint,
    BadRequest,
    format_duration,
    parse_duration,
    route,
    verify_sas,
)
from servicebus_local.durations import MAX_DURATION, MAX_DURATION_ISO
from servicebus_local.model import (
    AdminFault,
    EntityExists,
    EntityNotFound,
    QueueInfo,
    QueueSettings,
    RuntimeCounts,
    SubscriptionInfo,
    SubscriptionSettings,
    TopicInfo,
    TopicSettings,
)
from servicebus_local.rules import Rule, default_rule
from servicebus_local.tls import LocalTls

KEY_NAME = "RootManageSharedAccessKey"
KEY = "bG9jYWwtdGVzdC1rZXk="  # a made-up key for the harness
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
#: what the SDK reads back for the service's maximum duration (isodate rounds .4775807 s up)
SDK_MAX = timedelta(days=10675199, hours=2, minutes=48, seconds=5, microseconds=477581)


# ------------------------------------------------------------------------------------------------------------
# An in-memory AdminStore and the harness
# ------------------------------------------------------------------------------------------------------------


class MemoryStore:
    """A thread-safe AdminStore over dicts, with counted fault rules like the broker's."""

    def __init__(self, namespace_name: str = "harness-ns") -> None:
        self._lock = threading.Lock()
        self._namespace_name = namespace_name
        self.queues: dict[str, QueueInfo] = {}
        self.topics: dict[str, TopicInfo] = {}
        self.subscriptions: dict[tuple[str, str], SubscriptionInfo] = {}
        self.faults: list[list[Any]] = []  # [method, path, fault, remaining uses]
        self.requests: list[tuple[str, str]] = []
        self.rules: dict[tuple[str, str], dict[str, Rule]] = {}

    @property
    def namespace_name(self) -> str:
        return self._namespace_name

    @property
    def created_at(self) -> datetime:
        return T0

    @property
    def messaging_sku(self) -> str:
        return "Standard"

    def inject(self, method: str, path: str, fault: AdminFault, times: int = 1) -> None:
        with self._lock:
            self.faults.append([method, path, fault, times])

    def admin_fault(self, method: str, path: str) -> AdminFault | None:
        with self._lock:
            self.requests.append((method, path))
            for rule in self.faults:
                if rule[0] == method and rule[1] == path and rule[3] > 0:
                    rule[3] -= 1
                    return rule[2]
        return None

    def _runtime(self) -> RuntimeCounts:
        return RuntimeCounts(created_at=T0, updated_at=T0, accessed_at=T0)

    def create_queue(self, name: str, settings: QueueSettings) -> QueueInfo:
        with self._lock:
            if name in self.queues:
                raise EntityExists(name)
            info = self.queues[name] = QueueInfo(name, settings, self._runtime())
            return info

    def update_queue(self, name: str, settings: QueueSettings) -> QueueInfo:
        with self._lock:
            info = self._get(self.queues, name)
            info.settings = settings
            return info

    def get_queue(self, name: str) -> QueueInfo:
        with self._lock:
            return self._get(self.queues, name)

    def delete_queue(self, name: str) -> None:
        with self._lock:
            self._get(self.queues, name)
            del self.queues[name]

    def list_queues(self) -> list[QueueInfo]:
        with self._lock:
            return list(self.queues.values())

    def create_topic(self, name: str, settings: TopicSettings) -> TopicInfo:
        with self._lock:
            if name in self.topics:
                raise EntityExists(name)
            info = self.topics[name] = TopicInfo(name, settings, self._runtime())
            return info

    def update_topic(self, name: str, settings: TopicSettings) -> TopicInfo:
        with self._lock:
            info = self._get(self.topics, name)
            info.settings = settings
            return info

    def get_topic(self, name: str) -> TopicInfo:
        with self._lock:
            return self._get(self.topics, name)

    def delete_topic(self, name: str) -> None:
        with self._lock:
            self._get(self.topics, name)
            del self.topics[name]
            for key in [key for key in self.subscriptions if key[0] == name]:
                del self.subscriptions[key]

    def list_topics(self) -> list[TopicInfo]:
        with self._lock:
            return list(self.topics.values())

    def create_subscription(self, topic: str, name: str, settings: SubscriptionSettings) -> SubscriptionInfo:
        with self._lock:
            self._get(self.topics, topic)
            if (topic, name) in self.subscriptions:
                raise EntityExists(f"{topic}/Subscriptions/{name}")
            info = SubscriptionInfo(topic, name, settings, self._runtime())
            self.subscriptions[(topic, name)] = info
            self.topics[topic].runtime.subscription_count += 1
            return info

    def update_subscription(self, topic: str, name: str, settings: SubscriptionSettings) -> SubscriptionInfo:
        with self._lock:
            info = self._get(self.subscriptions, (topic, name))
            info.settings = settings
            return info

    def get_subscription(self, topic: str, name: str) -> SubscriptionInfo:
        with self._lock:
            return self._get(self.subscriptions, (topic, name))

    def delete_subscription(self, topic: str, name: str) -> None:
        with self._lock:
            self._get(self.subscriptions, (topic, name))
            del self.subscriptions[(topic, name)]
            self.topics[topic].runtime.subscription_count -= 1

    def list_subscriptions(self, topic: str) -> list[SubscriptionInfo]:
        with self._lock:
            self._get(self.topics, topic)
            return [info for key, info in self.subscriptions.items() if key[0] == topic]

    def _rules(self, topic: str, subscription: str) -> dict[str, Rule]:
        self._get(self.subscriptions, (topic, subscription))
        return self.rules.setdefault((topic, subscription), {"$Default": default_rule(T0)})

    def create_rule(self, topic: str, subscription: str, rule: Rule) -> Rule:
        with self._lock:
            rules = self._rules(topic, subscription)
            if rule.name in rules:
                raise EntityExists(rule.name)
            rules[rule.name] = rule
            return rule

    def update_rule(self, topic: str, subscription: str, rule: Rule) -> Rule:
        with self._lock:
            self._get(self._rules(topic, subscription), rule.name)
            self._rules(topic, subscription)[rule.name] = rule
            return rule

    def get_rule(self, topic: str, subscription: str, name: str) -> Rule:
        with self._lock:
            return self._get(self._rules(topic, subscription), name)  # type: ignore[no-any-return]

    def delete_rule(self, topic: str, subscription: str, name: str) -> None:
        with self._lock:
            self._get(self._rules(topic, subscription), name)
            del self._rules(topic, subscription)[name]

    def list_rules(self, topic: str, subscription: str) -> list[Rule]:
        with self._lock:
            return list(self._rules(topic, subscription).values())

    @staticmethod
    def _get(table: dict[Any, Any], key: Any) -> Any:
        try:
            return table[key]
        except KeyError:
            raise EntityNotFound(str(key)) from None


class Harness:
    """AdminEndpoint on 127.0.0.1:<ephemeral>, one thread per accepted connection (as the namespace server)."""

    def __init__(self, directory: Path, store: MemoryStore, key: str | None = KEY) -> None:
        self.store = store
        self.tls = LocalTls.create(directory)
        self.endpoint = AdminEndpoint(store, self.tls.server_context, KEY_NAME, key)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.threads: list[threading.Thread] = []
        self._accept_thread = threading.Thread(target=self._accept_loop, name="admin-harness", daemon=True)
        self._accept_thread.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            thread = threading.Thread(target=self.endpoint.serve_connection, args=(connection,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def connection_string(self, key: str = KEY, key_name: str = KEY_NAME) -> str:
        return (
            f"Endpoint=sb://127.0.0.1:{self.port};SharedAccessKeyName={key_name};"
            f"SharedAccessKey={key};UseDevelopmentEmulator=true"
        )

    def client(
        self, key: str = KEY, key_name: str = KEY_NAME, **kwargs: Any
    ) -> ServiceBusAdministrationClient:
        kwargs.setdefault("connection_verify", self.tls.ca_file)
        return ServiceBusAdministrationClient.from_connection_string(
            self.connection_string(key, key_name), **kwargs
        )

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() on Linux
        self.listener.close()
        self.endpoint.close()
        self._accept_thread.join(5)
        for thread in self.threads:
            thread.join(5)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def harness(tmp_path: Path, store: MemoryStore) -> Iterator[Harness]:
    running = Harness(tmp_path, store)
    yield running
    running.close()


@pytest.fixture
def admin(harness: Harness) -> Iterator[ServiceBusAdministrationClient]:
    with harness.client() as client:
        yield client


# ------------------------------------------------------------------------------------------------------------
# Pure pieces
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("PT1M", timedelta(minutes=1)),
        ("PT30.5S", timedelta(seconds=30.5)),
        ("P3DT4H5M6.000007S", timedelta(days=3, hours=4, minutes=5, seconds=6, microseconds=7)),
        ("P2W", timedelta(days=14)),
        ("PT0S", timedelta(0)),
        (MAX_DURATION_ISO, MAX_DURATION),
        ("P10675199DT2H48M5.477581S", MAX_DURATION),  # what isodate makes of the maximum
        ("P10675199DT2H48M5.477539S", MAX_DURATION),  # what the SDK's overflow workaround sends
    ],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "P", "PT", "1M", "P1Y", "P1M", "-PT1M", "P10675200D", "PTxS"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(BadRequest):
        parse_duration(text)


@pytest.mark.parametrize(
    "value",
    [timedelta(0), timedelta(minutes=1), timedelta(seconds=30.25), timedelta(days=400, microseconds=1),
     timedelta(hours=5, seconds=1), MAX_DURATION],
)  # fmt: skip
def test_format_then_parse_is_identity(value: timedelta) -> None:
    assert parse_duration(format_duration(value)) == value


def test_format_duration_texts() -> None:
    assert format_duration(timedelta(minutes=1)) == "PT1M"
    assert format_duration(timedelta(days=1, seconds=1.5)) == "P1DT1.5S"
    assert format_duration(timedelta(0)) == "PT0S"
    assert format_duration(MAX_DURATION) == MAX_DURATION_ISO


@pytest.mark.parametrize(
    ("table", "settings_type"),
    [
        (QUEUE_FIELDS, QueueSettings),
        (TOPIC_FIELDS, TopicSettings),
        (SUBSCRIPTION_FIELDS, SubscriptionSettings),
    ],
)
def test_tables_cover_every_settings_field(table: Any, settings_type: type) -> None:
    assert sorted(spec.attr for spec in table) == sorted(f.name for f in dataclasses.fields(settings_type))
    assert len({spec.xml_name for spec in table}) == len(table)


@pytest.mark.parametrize(
    ("path", "target", "names"),
    [
        ("/q1", "entity", ("q1",)),
        ("/contoso%2Fx-servicebus-transfer%2F3", "entity", ("contoso/x-servicebus-transfer/3",)),
        ("/contoso/x-servicebus-transfer/3", "entity", ("contoso/x-servicebus-transfer/3",)),
        ("/t%2F1/subscriptions/s%2F2", "subscription", ("t/1", "s/2")),
        ("/t/subscriptions", "subscriptions", ("t",)),
        ("/t/Subscriptions/s/rules", "rules", ("t", "s")),
        ("/t/subscriptions/s/rules/%24Default", "rule", ("t", "s", "$Default")),
        ("/$Resources/queues", "list", ("queues",)),
        ("/$Resources/Topics", "list", ("topics",)),
        ("/$namespaceinfo", "namespace", ()),
    ],
)
def test_route(path: str, target: str, names: tuple[str, ...]) -> None:
    assert route(path) == type(route(path))(target, names)


def _sas(uri: str, key_name: str, key: str, expiry: int) -> str:
    signed = f"{quote_plus(uri)}\n{expiry}".encode()
    signature = base64.b64encode(hmac.new(key.encode(), signed, hashlib.sha256).digest())
    return "SharedAccessSignature " + urlencode(
        {"sr": uri, "sig": signature, "se": str(expiry), "skn": key_name}
    )


def test_verify_sas() -> None:
    uri, now = "https://127.0.0.1:5671", 1_000_000.0
    assert verify_sas(_sas(uri, KEY_NAME, KEY, 1_000_060), KEY_NAME, KEY, now) is None
    assert verify_sas(_sas(uri, KEY_NAME, "other", 1_000_060), KEY_NAME, KEY, now) == (
        "invalid SharedAccessSignature signature"
    )
    assert verify_sas(_sas(uri, "other-name", KEY, 1_000_060), KEY_NAME, KEY, now) is not None
    assert (
        verify_sas(_sas(uri, KEY_NAME, KEY, 999_999), KEY_NAME, KEY, now) == "expired SharedAccessSignature"
    )
    assert verify_sas(None, KEY_NAME, KEY, now) is not None
    assert verify_sas("Bearer abc", KEY_NAME, KEY, now) is not None
    for refusal in (verify_sas(_sas(uri, KEY_NAME, "other", 1_000_060), KEY_NAME, KEY, now) or "",):
        assert KEY not in refusal


def test_local_tls_is_cached_and_writes_the_ca(tmp_path: Path) -> None:
    first = LocalTls.create(tmp_path / "a")
    started = time.perf_counter()
    second = LocalTls.create(tmp_path / "b")
    assert time.perf_counter() - started < 0.5
    assert Path(first.ca_file).read_bytes() == Path(second.ca_file).read_bytes()
    assert b"BEGIN CERTIFICATE" in Path(first.ca_file).read_bytes()
    assert b"PRIVATE KEY" not in Path(first.ca_file).read_bytes()
    assert first.server_context.verify_mode == ssl.CERT_NONE  # servers do not ask clients for certificates


# ------------------------------------------------------------------------------------------------------------
# Queues
# ------------------------------------------------------------------------------------------------------------
def test_queue_create_get_update_list_delete(
    admin: ServiceBusAdministrationClient, store: MemoryStore
) -> None:
    created = admin.create_queue("orders", max_delivery_count=7)
    assert created.name == "orders"
    assert created.max_delivery_count == 7
    assert created.lock_duration == timedelta(minutes=1)  # service default
    assert store.queues["orders"].settings.max_delivery_count == 7

    queue = admin.get_queue("orders")
    queue.lock_duration = timedelta(seconds=20)
    queue.user_metadata = "updated"
    admin.update_queue(queue)
    assert store.queues["orders"].settings.lock_duration == timedelta(seconds=20)
    again = admin.get_queue("orders")
    assert (again.lock_duration, again.user_metadata, again.max_delivery_count) == (
        timedelta(seconds=20),
        "updated",
        7,
    )

    admin.update_queue(again, max_size_in_megabytes=2048)  # keyword overrides
    assert admin.get_queue("orders").max_size_in_megabytes == 2048

    assert [q.name for q in admin.list_queues()] == ["orders"]
    admin.delete_queue("orders")
    assert "orders" not in store.queues
    with pytest.raises(ResourceNotFoundError):
        admin.get_queue("orders")
    assert list(admin.list_queues()) == []


def test_queue_defaults_are_the_services(admin: ServiceBusAdministrationClient) -> None:
    queue = admin.create_queue("plain")
    assert queue.default_message_time_to_live == SDK_MAX
    assert queue.auto_delete_on_idle == SDK_MAX
    assert queue.duplicate_detection_history_time_window == timedelta(minutes=10)
    assert queue.max_delivery_count == 10
    assert queue.status == "Active"
    assert queue.availability_status == "Available"
    assert queue.forward_to is None and queue.user_metadata is None
    # a get -> update cycle keeps the maximum durations at the maximum (the SDK nudges them on the way out)
    admin.update_queue(admin.get_queue("plain"))
    again = admin.get_queue("plain")
    assert again.default_message_time_to_live == SDK_MAX
    assert again.auto_delete_on_idle == SDK_MAX


def test_queue_names_with_slashes(admin: ServiceBusAdministrationClient, store: MemoryStore) -> None:
    names = [f"contoso/x-servicebus-transfer/{i}" for i in range(3)]
    for name in names:
        admin.create_queue(name, max_delivery_count=2147483647)
    assert sorted(store.queues) == names
    assert admin.get_queue(names[2]).name == names[2]
    assert admin.get_queue(names[2]).max_delivery_count == 2147483647
    assert admin.get_queue_runtime_properties(names[1]).name == names[1]
    assert [q.name for q in admin.list_queues()] == names
    admin.update_queue(admin.get_queue(names[0]), lock_duration=timedelta(seconds=10))
    assert store.queues[names[0]].settings.lock_duration == timedelta(seconds=10)
    admin.delete_queue(names[0])
    assert sorted(store.queues) == names[1:]
    with pytest.raises(ResourceNotFoundError):
        admin.get_queue(names[0])


def test_list_pages_through_more_than_one_page(
    admin: ServiceBusAdministrationClient, store: MemoryStore
) -> None:
    names = sorted(f"q-{i:03d}" for i in range(230))
    for name in names:
        store.create_queue(name, QueueSettings(max_delivery_count=3))
    store.requests.clear()
    listed = list(admin.list_queues())
    assert [q.name for q in listed] == names
    assert {q.max_delivery_count for q in listed} == {3}
    assert store.requests == [("GET", "/$Resources/queues")] * 3  # 100 + 100 + 30
    runtime = list(admin.list_queues_runtime_properties())
    assert len(runtime) == 230 and runtime[-1].name == names[-1]


def test_list_with_page_size(admin: ServiceBusAdministrationClient, store: MemoryStore) -> None:
    for i in range(7):
        store.create_topic(f"t{i}", TopicSettings())
    pages = [[t.name for t in page] for page in admin.list_topics().by_page()]
    assert sum(pages, []) == [f"t{i}" for i in range(7)]
    store.requests.clear()
    assert [t.name for t in admin.list_topics(max_page_size=3)] == [f"t{i}" for i in range(7)]
    assert len(store.requests) == 3


def _queue_cases() -> list[tuple[str, Any, Any]]:
    """(property, value set, value read back) for every settable QueueProperties property."""
    same = [
        ("lock_duration", timedelta(seconds=45)),
        ("lock_duration", timedelta(minutes=5)),
        ("max_size_in_megabytes", 5120),
        ("requires_duplicate_detection", True),
        ("requires_session", True),
        ("default_message_time_to_live", timedelta(days=3, hours=1, seconds=7, microseconds=500000)),
        ("default_message_time_to_live", SDK_MAX),
        ("dead_lettering_on_message_expiration", True),
        ("duplicate_detection_history_time_window", timedelta(minutes=3)),
        ("max_delivery_count", 2147483647),
        ("max_delivery_count", 1),
        ("enable_batched_operations", False),
        ("status", "Disabled"),
        ("status", "SendDisabled"),
        ("status", "ReceiveDisabled"),
        ("auto_delete_on_idle", timedelta(minutes=5)),
        ("auto_delete_on_idle", SDK_MAX),
        ("enable_partitioning", True),
        ("enable_express", True),
        ("user_metadata", "meta <data> & 'quotes' \u00e9"),
        ("user_metadata", ""),
        ("max_message_size_in_kilobytes", 102400),
    ]
    cases = [(name, value, value) for name, value in same]
    cases += [
        ("default_message_time_to_live", MAX_DURATION_ISO, SDK_MAX),
        ("lock_duration", "PT30S", timedelta(seconds=30)),
        ("auto_delete_on_idle", MAX_DURATION, SDK_MAX),
    ]
    return cases


@pytest.mark.parametrize(("prop", "value", "expected"), _queue_cases())
def test_queue_property_round_trips(
    admin: ServiceBusAdministrationClient, prop: str, value: Any, expected: Any
) -> None:
    created = admin.create_queue("rt-create", **{prop: value})
    assert getattr(created, prop) == expected
    assert getattr(admin.get_queue("rt-create"), prop) == expected
    assert getattr(next(iter(admin.list_queues())), prop) == expected

    admin.create_queue("rt-update")
    queue = admin.get_queue("rt-update")
    setattr(queue, prop, value)
    admin.update_queue(queue)
    assert getattr(admin.get_queue("rt-update"), prop) == expected


@pytest.mark.parametrize("prop", ["forward_to", "forward_dead_lettered_messages_to"])
def test_queue_forwarding_round_trips(
    admin: ServiceBusAdministrationClient, harness: Harness, prop: str
) -> None:
    # The SDK sends a full sb:// address for a bare name (as the service, the endpoint keeps it as sent).
    admin.create_queue("target/with/slash")
    queue = admin.create_queue("source", **{prop: "target/with/slash"})
    expected = f"sb://127.0.0.1:{harness.port}/target/with/slash"
    assert getattr(queue, prop) == expected
    assert getattr(admin.get_queue("source"), prop) == expected
    queue = admin.get_queue("source")
    admin.update_queue(queue, **{prop: "elsewhere"})
    assert getattr(admin.get_queue("source"), prop) == f"sb://127.0.0.1:{harness.port}/elsewhere"
    setattr(queue, prop, None)
    admin.update_queue(queue)  # an update replaces the description: no element, no forwarding
    assert getattr(admin.get_queue("source"), prop) is None


def test_queue_invalid_values_are_400(admin: ServiceBusAdministrationClient, store: MemoryStore) -> None:
    with pytest.raises(HttpResponseError) as caught:
        admin.create_queue("bad", status="Creating")
    assert caught.value.status_code == 400
    assert "status" in str(caught.value)
    with pytest.raises(HttpResponseError) as caught:
        admin.create_queue("bad", lock_duration="P1Y")
    assert caught.value.status_code == 400
    assert store.queues == {}


# ------------------------------------------------------------------------------------------------------------
# Topics and subscriptions
# ------------------------------------------------------------------------------------------------------------


def _topic_cases() -> list[tuple[str, Any]]:
    return [
        ("default_message_time_to_live", timedelta(hours=6)),
        ("default_message_time_to_live", SDK_MAX),
        ("max_size_in_megabytes", 81920),
        ("requires_duplicate_detection", True),
        ("duplicate_detection_history_time_window", timedelta(seconds=90)),
        ("enable_batched_operations", False),
        ("status", "Disabled"),
        ("status", "SendDisabled"),
        ("support_ordering", False),
        ("auto_delete_on_idle", timedelta(days=2)),
        ("enable_partitioning", True),
        ("enable_express", True),
        ("user_metadata", "topic metadata"),
        ("max_message_size_in_kilobytes", 2048),
    ]


@pytest.mark.parametrize(("prop", "value"), _topic_cases())
def test_topic_property_round_trips(admin: ServiceBusAdministrationClient, prop: str, value: Any) -> None:
    created = admin.create_topic("rt-topic", **{prop: value})
    assert getattr(created, prop) == value
    assert getattr(admin.get_topic("rt-topic"), prop) == value
    admin.create_topic("rt-topic-2")
    topic = admin.get_topic("rt-topic-2")
    setattr(topic, prop, value)
    admin.update_topic(topic)
    assert getattr(admin.get_topic("rt-topic-2"), prop) == value
    assert getattr(next(t for t in admin.list_topics() if t.name == "rt-topic-2"), prop) == value


def _subscription_cases() -> list[tuple[str, Any]]:
    return [
        ("lock_duration", timedelta(seconds=15)),
        ("requires_session", True),
        ("default_message_time_to_live", timedelta(minutes=90)),
        ("default_message_time_to_live", SDK_MAX),
        ("dead_lettering_on_message_expiration", True),
        ("dead_lettering_on_filter_evaluation_exceptions", False),
        ("max_delivery_count", 2147483647),
        ("enable_batched_operations", False),
        ("status", "ReceiveDisabled"),
        ("user_metadata", "subscription metadata"),
        ("auto_delete_on_idle", timedelta(minutes=10)),
    ]


@pytest.mark.parametrize(("prop", "value"), _subscription_cases())
def test_subscription_property_round_trips(
    admin: ServiceBusAdministrationClient, prop: str, value: Any
) -> None:
    admin.create_topic("events/all")
    created = admin.create_subscription("events/all", "sub-a", **{prop: value})
    assert getattr(created, prop) == value
    assert getattr(admin.get_subscription("events/all", "sub-a"), prop) == value
    admin.create_subscription("events/all", "sub-b")
    subscription = admin.get_subscription("events/all", "sub-b")
    setattr(subscription, prop, value)
    admin.update_subscription("events/all", subscription)
    assert getattr(admin.get_subscription("events/all", "sub-b"), prop) == value
    listed = {s.name: s for s in admin.list_subscriptions("events/all")}
    assert getattr(listed["sub-b"], prop) == value


def test_subscription_forward_to(admin: ServiceBusAdministrationClient, harness: Harness) -> None:
    admin.create_topic("t")
    admin.create_queue("sink")
    sub = admin.create_subscription("t", "s", forward_to="sink", forward_dead_lettered_messages_to="sink")
    assert sub.forward_to == f"sb://127.0.0.1:{harness.port}/sink"
    assert sub.forward_dead_lettered_messages_to == f"sb://127.0.0.1:{harness.port}/sink"


def test_topic_and_subscription_lifecycle(admin: ServiceBusAdministrationClient, store: MemoryStore) -> None:
    admin.create_topic("orders")
    for name in ("b", "a", "c"):
        admin.create_subscription("orders", name)
    assert [s.name for s in admin.list_subscriptions("orders")] == ["a", "b", "c"]
    assert admin.get_topic_runtime_properties("orders").subscription_count == 3
    assert admin.get_subscription("orders", "b").name == "b"
    admin.delete_subscription("orders", "b")
    assert ("orders", "b") not in store.subscriptions
    with pytest.raises(ResourceNotFoundError):
        admin.get_subscription("orders", "b")
    with pytest.raises(ResourceNotFoundError):
        admin.delete_subscription("orders", "b")
    with pytest.raises(ResourceExistsError):
        admin.create_subscription("orders", "a")
    with pytest.raises(ResourceNotFoundError):
        admin.create_subscription("no-such-topic", "a")
    with pytest.raises(ResourceNotFoundError):
        list(admin.list_subscriptions("no-such-topic"))
    assert [t.name for t in admin.list_topics()] == ["orders"]
    admin.delete_topic("orders")
    assert store.topics == {} and store.subscriptions == {}
    with pytest.raises(ResourceNotFoundError):
        admin.get_topic("orders")


def test_many_subscriptions_page(admin: ServiceBusAdministrationClient, store: MemoryStore) -> None:
    store.create_topic("wide", TopicSettings())
    for i in range(120):
        store.create_subscription("wide", f"s{i:03d}", SubscriptionSettings())
    assert [s.name for s in admin.list_subscriptions("wide")] == [f"s{i:03d}" for i in range(120)]


def test_default_rule(admin: ServiceBusAdministrationClient) -> None:
    admin.create_topic("t")
    admin.create_subscription("t", "s")
    rules = list(admin.list_rules("t", "s"))
    assert [r.name for r in rules] == ["$Default"]
    assert isinstance(rules[0].filter, TrueRuleFilter)
    rule = admin.get_rule("t", "s", "$Default")
    assert rule.name == "$Default" and isinstance(rule.filter, TrueRuleFilter)
    with pytest.raises(ResourceNotFoundError):
        admin.get_rule("t", "s", "other")
    with pytest.raises(ResourceNotFoundError):
        list(admin.list_rules("t", "missing"))
    admin.create_rule("t", "s", "r1")  # a true filter by default
    assert [r.name for r in admin.list_rules("t", "s")] == ["$Default", "r1"]


# ------------------------------------------------------------------------------------------------------------
# Runtime properties and the namespace
# ------------------------------------------------------------------------------------------------------------
def test_runtime_properties_counts(admin: ServiceBusAdministrationClient, store: MemoryStore) -> None:
    info = store.create_queue("busy", QueueSettings())
    info.runtime.active_message_count = 5
    info.runtime.dead_letter_message_count = 2
    info.runtime.scheduled_message_count = 3
    info.runtime.transfer_message_count = 4
    info.runtime.transfer_dead_letter_message_count = 1
    info.runtime.size_in_bytes = 12345
    info.runtime.updated_at = T0 + timedelta(minutes=1)
    runtime = admin.get_queue_runtime_properties("busy")
    assert (
        runtime.active_message_count,
        runtime.dead_letter_message_count,
        runtime.scheduled_message_count,
        runtime.transfer_message_count,
        runtime.transfer_dead_letter_message_count,
        runtime.size_in_bytes,
        runtime.total_message_count,
    ) == (5, 2, 3, 4, 1, 12345, 15)
    assert runtime.created_at_utc == T0
    assert runtime.updated_at_utc == T0 + timedelta(minutes=1)
    assert runtime.accessed_at_utc == T0
    listed = list(admin.list_queues_runtime_properties())
    assert [(r.name, r.active_message_count) for r in listed] == [("busy", 5)]

    topic = store.create_topic("tt", TopicSettings())
    topic.runtime.size_in_bytes = 99
    topic.runtime.scheduled_message_count = 6
    subscription = store.create_subscription("tt", "ss", SubscriptionSettings())
    subscription.runtime.active_message_count = 8
    subscription.runtime.dead_letter_message_count = 1
    topic_runtime = admin.get_topic_runtime_properties("tt")
    assert (topic_runtime.size_in_bytes, topic_runtime.subscription_count) == (99, 1)
    assert topic_runtime.scheduled_message_count == 6
    sub_runtime = admin.get_subscription_runtime_properties("tt", "ss")
    assert (sub_runtime.active_message_count, sub_runtime.dead_letter_message_count) == (8, 1)
    assert sub_runtime.total_message_count == 9
    assert [r.active_message_count for r in admin.list_subscriptions_runtime_properties("tt")] == [8]


def test_namespace_properties(admin: ServiceBusAdministrationClient) -> None:
    properties = admin.get_namespace_properties()
    assert properties.name == "harness-ns"
    assert properties.messaging_sku == "Standard"
    assert properties.created_at_utc == T0


# ------------------------------------------------------------------------------------------------------------
# Errors the user sees
# ------------------------------------------------------------------------------------------------------------
def test_not_found_and_conflict(admin: ServiceBusAdministrationClient) -> None:
    with pytest.raises(ResourceNotFoundError):
        admin.get_queue("missing")
    with pytest.raises(ResourceNotFoundError):
        admin.get_topic("missing")
    with pytest.raises(ResourceNotFoundError):
        admin.delete_queue("missing")
    stale = admin.create_queue("missing")
    admin.delete_queue("missing")
    with pytest.raises(ResourceNotFoundError):
        admin.update_queue(stale)  # update sends If-Match: *, so it never creates
    admin.create_queue("once")
    with pytest.raises(ResourceExistsError):
        admin.create_queue("once")
    with pytest.raises(ResourceExistsError):
        admin.create_topic("once")  # queues and topics share one name space
    admin.create_topic("topic-once")
    with pytest.raises(ResourceExistsError):
        admin.create_topic("topic-once")


def test_bad_key_is_client_authentication_error(harness: Harness, store: MemoryStore) -> None:
    with harness.client(key="d3Jvbmcta2V5") as wrong:
        with pytest.raises(ClientAuthenticationError):
            wrong.get_namespace_properties()
        with pytest.raises(ClientAuthenticationError):
            wrong.create_queue("nope")
    with harness.client(key_name="SomeoneElse") as other_name, pytest.raises(ClientAuthenticationError):
        list(other_name.list_queues())
    assert store.queues == {}
    assert store.requests == []  # refused before anything else happened


def test_without_a_key_anything_is_accepted(tmp_path: Path, store: MemoryStore) -> None:
    running = Harness(tmp_path, store, key=None)
    try:
        with running.client(key="YW55dGhpbmc=", key_name="whoever") as client:
            client.create_queue("open")
        assert "open" in store.queues
    finally:
        running.close()


def test_injected_500_is_retried_by_the_sdk(harness: Harness, store: MemoryStore) -> None:
    store.inject("PUT", "/flaky/q", AdminFault(500, detail="injected server error"), times=2)
    with harness.client(retry_backoff_factor=0.01) as client:
        created = client.create_queue("flaky/q")
    assert created.name == "flaky/q"
    assert "flaky/q" in store.queues
    assert store.requests.count(("PUT", "/flaky/q")) == 3


def test_injected_403_is_an_http_response_error(harness: Harness, store: MemoryStore) -> None:
    store.inject("PUT", "/forbidden", AdminFault(403, code="40301", detail="Manage claim required"))
    with harness.client() as client:
        with pytest.raises(HttpResponseError) as caught:
            client.create_queue("forbidden")
        assert caught.value.status_code == 403
        assert "Manage claim required" in str(caught.value)
        assert store.queues == {}
        client.create_queue("forbidden")  # the fault was used up
    assert "forbidden" in store.queues


def test_injected_404_and_409(harness: Harness, store: MemoryStore) -> None:
    store.create_queue("there", QueueSettings())
    store.inject("GET", "/there", AdminFault(404, detail="gone for a moment"))
    store.inject("PUT", "/new", AdminFault(409, code="Conflict", detail="busy"))
    with harness.client() as client:
        with pytest.raises(ResourceNotFoundError):
            client.get_queue("there")
        assert client.get_queue("there").name == "there"
        with pytest.raises(ResourceExistsError):
            client.create_queue("new")


# ------------------------------------------------------------------------------------------------------------
# Trust
# ------------------------------------------------------------------------------------------------------------
def test_trust_through_requests_ca_bundle(
    harness: Harness, store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", harness.tls.ca_file)
    client = ServiceBusAdministrationClient.from_connection_string(harness.connection_string())
    with client:
        client.create_queue("trusted-by-env")
    assert "trusted-by-env" in store.queues


def test_untrusted_client_fails_verification(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    client = ServiceBusAdministrationClient.from_connection_string(harness.connection_string(), retry_total=0)
    with client, pytest.raises(ServiceRequestError) as caught:
        client.get_namespace_properties()
    assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)


def test_garbage_and_plain_http_do_not_hurt_the_endpoint(
    harness: Harness, admin: ServiceBusAdministrationClient
) -> None:
    for payload in (b"\x16\x03\x01\x00\x05hello", b"GET / HTTP/1.1\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", harness.port), timeout=5) as raw:
            raw.sendall(payload)
            try:
                raw.shutdown(socket.SHUT_WR)
                while raw.recv(4096):
                    pass
            except (ConnectionResetError, OSError) as exc:
                # a reset is a fine answer to garbage (after our shutdown it may surface as ENOTCONN)
                assert isinstance(exc, ConnectionResetError) or exc.errno == errno.ENOTCONN
    assert admin.get_namespace_properties().name == "harness-ns"


def test_keep_alive_and_close(harness: Harness, admin: ServiceBusAdministrationClient) -> None:
    for i in range(5):
        admin.create_queue(f"k{i}")
    assert harness.endpoint.open_connections == 1  # one pooled connection served every request
    harness.endpoint.close()
    for thread in harness.threads:
        thread.join(5)
        assert not thread.is_alive()
    assert harness.endpoint.open_connections == 0


# ------------------------------------------------------------------------------------------------------------
# Malformed requests (straight into AdminEndpoint.handle, and one over the wire)
# ------------------------------------------------------------------------------------------------------------

_QUEUE_BODY = (
    b'<entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml">'
    b'<QueueDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect">'
    b"<MaxDeliveryCount>4</MaxDeliveryCount></QueueDescription></content></entry>"
)


@pytest.mark.parametrize(
    ("method", "target", "body", "status"),
    [
        ("PUT", "/q", b"<not-xml", 400),
        ("PUT", "/q", b"", 400),
        ("PUT", "/q", b'<entry xmlns="http://www.w3.org/2005/Atom"><content/></entry>', 400),
        ("PUT", "/q", _QUEUE_BODY.replace(b"4</Max", b"four</Max"), 400),
        ("PUT", "/t/subscriptions/s", _QUEUE_BODY, 400),
        ("POST", "/q", _QUEUE_BODY, 405),
        ("GET", "/$Resources/queues?$skip=x", b"", 400),
        ("GET", "/q", b"", 404),
        ("PUT", "/q", _QUEUE_BODY, 201),
    ],
)
def test_handle_answers_malformed_requests(
    store: MemoryStore, method: str, target: str, body: bytes, status: int
) -> None:
    endpoint = AdminEndpoint(store, ssl.create_default_context(ssl.Purpose.CLIENT_AUTH), KEY_NAME, None)
    reply = endpoint.handle(method, target, {"Host": "127.0.0.1:1"}, body)
    assert reply.status == status
    assert b"xml" in reply.content_type.encode()
    if status >= 400:
        assert b"<Error><Code>" + str(status).encode() + b"</Code>" in reply.body


def test_handle_turns_store_crashes_into_500(store: MemoryStore) -> None:
    def explode(name: str) -> QueueInfo:
        raise RuntimeError("broker bug")

    store.get_queue = explode  # type: ignore[method-assign]
    endpoint = AdminEndpoint(store, ssl.create_default_context(ssl.Purpose.CLIENT_AUTH), KEY_NAME, None)
    reply = endpoint.handle("GET", "/q", {}, b"")
    assert reply.status == 500
    assert b"broker bug" not in reply.body


def test_chunked_request_body_over_tls(harness: Harness, store: MemoryStore) -> None:
    import http.client

    context = ssl.create_default_context(cafile=harness.tls.ca_file)
    connection = http.client.HTTPSConnection("127.0.0.1", harness.port, context=context, timeout=5)
    expiry = int(time.time()) + 60
    headers = {"Authorization": _sas(f"https://127.0.0.1:{harness.port}", KEY_NAME, KEY, expiry)}
    connection.request("PUT", "/chunky", body=iter([_QUEUE_BODY[:50], _QUEUE_BODY[50:]]), headers=headers,
                       encode_chunked=True)  # fmt: skip
    response = connection.getresponse()
    assert response.status == 201
    assert "xml" in response.getheader("Content-Type", "")
    response.read()
    connection.request("GET", "/chunky", headers=headers)  # same connection: keep-alive
    answer = connection.getresponse()
    assert answer.status == 200
    entry = ElementTree.fromstring(answer.read())
    sb_ns = "{http://schemas.microsoft.com/netservices/2010/10/servicebus/connect}"
    assert entry.findtext(f".//{sb_ns}QueueDescription/{sb_ns}MaxDeliveryCount") == "4"
    connection.close()
    assert store.queues["chunky"].settings.max_delivery_count == 4


# ------------------------------------------------------------------------------------------------------------
# Properties the entity model does not hold (kept by the endpoint, echoed back)
# ------------------------------------------------------------------------------------------------------------
def test_authorization_rules_round_trip(admin: ServiceBusAdministrationClient, store: MemoryStore) -> None:
    from azure.servicebus.management import AccessRights, AuthorizationRule

    rule = AuthorizationRule(
        type="SharedAccessAuthorizationRule",
        key_name="listener",
        primary_key="cHJpbWFyeS1rZXk=",
        secondary_key="c2Vjb25kYXJ5LWtleQ==",
        rights=[AccessRights.listen, AccessRights.send],
        claim_type="SharedAccessKey",
        claim_value="None",
    )
    admin.create_queue("guarded", authorization_rules=[rule])
    read = admin.get_queue("guarded").authorization_rules
    assert read is not None and len(read) == 1
    assert (read[0].key_name, read[0].primary_key, read[0].secondary_key) == (
        "listener",
        "cHJpbWFyeS1rZXk=",
        "c2Vjb25kYXJ5LWtleQ==",
    )
    assert sorted(read[0].rights) == ["Listen", "Send"]
    admin.update_queue(admin.get_queue("guarded"), max_delivery_count=4)  # kept across a get -> update
    assert admin.get_queue("guarded").authorization_rules[0].key_name == "listener"
    admin.update_queue(admin.get_queue("guarded"), authorization_rules=[])  # cleared
    assert admin.get_queue("guarded").authorization_rules is None

    admin.create_topic("guarded-topic", authorization_rules=[rule])
    topic = admin.get_topic("guarded-topic")
    assert topic.authorization_rules[0].key_name == "listener"
    assert topic.filtering_messages_before_publishing is False  # read-only: the SDK never sends it

    admin.delete_queue("guarded")
    store.create_queue("guarded", QueueSettings())  # re-created behind the endpoint's back: no stale rules
    assert admin.get_queue("guarded").authorization_rules is None
