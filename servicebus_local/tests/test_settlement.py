"""Who may settle a lock, as on the service (SPEC E8), with the unmodified SDK over real TCP.

* Strict settlement (the default, SPEC E8): a lock a receiver link holds is settled on that link only;
  ``$management`` (update-disposition) settles only messages received by sequence number, so every cross-link
  settlement (complete, abandon, defer, dead-letter) and update-disposition by the token of a message a link
  received is refused with ``MessageLockLostError``; the refused message comes back when its lock expires.
* Lenient (``strict_settlement=False``, ``--lenient-settlement``): an entity without sessions also settles a lock
  token from any receiver of the entity over ``$management``, as the service accepts today: the SDK's own fallback
  after a reconnect and the .NET SDK's cross-receiver settlement sample rely on it. The lock outlives the receiving
  link.
* An entity with sessions: a session's messages are settled (on a link or over ``$management``) only by the
  session's current owner; anyone else gets ``com.microsoft:session-lock-lost`` and the message stays locked until
  the session lock expires, then comes back with delivery count + 1.
* Deferred messages (received by sequence number) are settled over ``$management``.
* A lock is its entity path's: a dead-letter queue's lock is not settled through its queue's ``$management``.
* Lock duration: at most 5 minutes, at create and update, refused in the service's words; a topic message without
  a session id is dead-lettered by each subscription that requires sessions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone

import pytest
from azure.core.exceptions import HttpResponseError
from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceivedMessage,
    ServiceBusReceiver,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import MessageLockLostError, MessageNotFoundError, SessionLockLostError

from servicebus_local.__main__ import build_parser
from servicebus_local.model import InvalidSettings, QueueSettings, SubscriptionSettings
from servicebus_local.server import STRICT_SETTLEMENT_ENV, LocalNamespace
from servicebus_local.topology import TopologyError, parse_topology

FIVE_MINUTES = timedelta(minutes=5)
#: Session locks: long enough to outlast opening two receivers (about a second each with this SDK), and short
#: ones (queue ``short``) for a refused message to come back fast.
LOCK = timedelta(seconds=5)
SHORT_LOCK = timedelta(seconds=2)


def _receive(receiver: ServiceBusReceiver, n: int, timeout: float = 5.0) -> list[ServiceBusReceivedMessage]:
    out: list[ServiceBusReceivedMessage] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out += receiver.receive_messages(max_message_count=n - len(out), max_wait_time=0.5)
    return out


Settle = Callable[[ServiceBusReceiver, ServiceBusReceivedMessage], None]

SETTLE: dict[str, Settle] = {
    "complete": lambda r, m: r.complete_message(m),
    "abandon": lambda r, m: r.abandon_message(m),
    "defer": lambda r, m: r.defer_message(m),
    "dead-letter": lambda r, m: r.dead_letter_message(m, reason="r", error_description="d"),
}


def _counts(ns: LocalNamespace, queue: str) -> tuple[int, int]:
    """(messages in the queue, messages in its dead-letter queue)."""
    runtime = ns.broker.get_queue(queue).runtime
    return runtime.active_message_count, runtime.dead_letter_message_count


def _expected_after(outcome: str) -> tuple[int, int]:
    return {"complete": (0, 0), "abandon": (1, 0), "defer": (1, 0), "dead-letter": (0, 1)}[outcome]


@pytest.fixture
def sns() -> Iterator[LocalNamespace]:
    """A namespace with the session queues ``sq`` (locks of :data:`LOCK`) and ``short`` (:data:`SHORT_LOCK`)."""
    with LocalNamespace("settle") as ns:
        ns.broker.create_queue("sq", QueueSettings(requires_session=True, lock_duration=LOCK))
        ns.broker.create_queue("short", QueueSettings(requires_session=True, lock_duration=SHORT_LOCK))
        yield ns


def wait_until_session_lock_expired(receiver: ServiceBusReceiver) -> None:
    """Sleep until the session lock ``receiver`` holds has expired (it neither settles nor renews)."""
    until = receiver.session.locked_until_utc
    assert until is not None
    time.sleep(max(0.0, (until - datetime.now(timezone.utc)).total_seconds()) + 0.2)


def _token(msg: ServiceBusReceivedMessage) -> str:
    assert msg.lock_token is not None
    return str(msg.lock_token)


def _seq(msg: ServiceBusReceivedMessage) -> int:
    assert msg.sequence_number is not None
    return msg.sequence_number


def two_sessions() -> list[ServiceBusMessage]:
    """One message for session A, one for session B."""
    return [ServiceBusMessage("a", session_id="A"), ServiceBusMessage("b", session_id="B")]


def _client(ns: LocalNamespace) -> ServiceBusClient:
    return ServiceBusClient.from_connection_string(ns.connection_string, retry_total=0)


# -- lenient: entities without sessions, the service's cross-receiver settlement --------------------------------


@pytest.fixture
def lenient() -> Iterator[LocalNamespace]:
    """A lenient namespace (``strict_settlement=False``) with queue ``q``."""
    with LocalNamespace("lenient", queues=["q"], strict_settlement=False) as ns:
        yield ns


@pytest.mark.parametrize("outcome", list(SETTLE))
def test_lenient_another_receiver_settles_a_lock_over_management_as_the_service_allows(
    lenient: LocalNamespace, outcome: str
) -> None:
    """Receiver B (another connection) settles what A received and still holds: the SDK finds no delivery of that
    tag on B's link and settles over B's ``$management`` link (update-disposition), which the service accepts for
    an entity without sessions."""
    with _client(lenient) as a_client, _client(lenient) as b_client:
        with a_client.get_queue_sender("q") as sender:
            sender.send_messages(ServiceBusMessage("x"))
        with a_client.get_queue_receiver("q") as a, b_client.get_queue_receiver("q") as b:
            (msg,) = _receive(a, 1)
            before = lenient.counters().get("management:update-disposition", 0)
            SETTLE[outcome](b, msg)
            assert lenient.counters()["management:update-disposition"] == before + 1
            assert _counts(lenient, "q") == _expected_after(outcome)


def test_lenient_a_lock_outlives_its_receivers_connection_and_is_settled_by_token(
    lenient: LocalNamespace,
) -> None:
    """A's connection closes while it holds a lock (the SDK releases only what it buffered, not what it handed
    out): the message stays locked, and B completes it by lock token over ``$management``."""
    with _client(lenient) as b_client:
        with _client(lenient) as a_client:
            with a_client.get_queue_sender("q") as sender:
                sender.send_messages(ServiceBusMessage("x"))
            with a_client.get_queue_receiver("q") as a:
                (msg,) = _receive(a, 1)
        with b_client.get_queue_receiver("q") as b:
            assert b.receive_messages(max_message_count=1, max_wait_time=0.3) == []  # still locked
            b._settle_message_via_mgmt_link("completed", [_token(msg)])  # noqa: SLF001 - update-disposition
    assert _counts(lenient, "q") == (0, 0)


def test_a_deferred_message_is_settled_over_management_by_any_receiver(ns: LocalNamespace) -> None:
    with _client(ns) as a_client, _client(ns) as b_client:
        with a_client.get_queue_sender("q") as sender:
            sender.send_messages(ServiceBusMessage("later"))
        with a_client.get_queue_receiver("q") as a, b_client.get_queue_receiver("q") as b:
            (msg,) = _receive(a, 1)
            a.defer_message(msg)
            (deferred,) = a.receive_deferred_messages([_seq(msg)])
            b.complete_message(deferred)  # a deferred message: the SDK settles it over $management
    assert _counts(ns, "q") == (0, 0)


def test_a_receive_by_sequence_numbers_naming_one_missing_number_gets_nothing(ns: LocalNamespace) -> None:
    """Not documented: the emulator answers the whole request ``com.microsoft:message-not-found`` and locks none
    of the numbers (the deferred one stays deferred, received whole by the next request)."""
    with _client(ns) as client:
        with client.get_queue_sender("q") as sender:
            sender.send_messages(ServiceBusMessage("later"))
        with client.get_queue_receiver("q") as receiver:
            (msg,) = _receive(receiver, 1)
            receiver.defer_message(msg)
            with pytest.raises(MessageNotFoundError):
                receiver.receive_deferred_messages([_seq(msg), _seq(msg) + 1000])
            (deferred,) = receiver.receive_deferred_messages([_seq(msg)])  # not locked by the failed request
            receiver.complete_message(deferred)
    assert _counts(ns, "q") == (0, 0)


def test_a_dead_letter_queues_lock_is_not_settled_through_its_queue(ns: LocalNamespace) -> None:
    """The dead-letter queue is its own entity path: its receiver's lock token means nothing to the queue's
    ``$management`` (settle or renew: lock lost), and its own receiver still renews and settles it."""
    with _client(ns) as client:
        with client.get_queue_sender("q") as sender:
            sender.send_messages(ServiceBusMessage("x"))
        with (
            client.get_queue_receiver("q") as main,
            client.get_queue_receiver("q", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq,
        ):
            (msg,) = _receive(main, 1)
            main.dead_letter_message(msg, reason="r")
            (dead,) = _receive(dlq, 1)
            with pytest.raises(MessageLockLostError):
                main._settle_message_via_mgmt_link("completed", [_token(dead)])  # noqa: SLF001
            with pytest.raises(MessageLockLostError):
                main.renew_message_lock(dead)  # renew-lock over the queue's $management
            assert _counts(ns, "q") == (0, 1)
            dlq.renew_message_lock(dead)
            dlq.complete_message(dead)
    assert _counts(ns, "q") == (0, 0)


# -- strict settlement: a link's lock is settled on that link only ---------------------------------------------


@pytest.fixture
def strict() -> Iterator[LocalNamespace]:
    """A strict namespace with queue ``q`` (1-minute locks) and ``short`` (locks of :data:`SHORT_LOCK`)."""
    with LocalNamespace("strict", queues=["q"], strict_settlement=True) as ns:
        ns.broker.create_queue("short", QueueSettings(lock_duration=SHORT_LOCK))
        yield ns


@pytest.mark.parametrize("outcome", list(SETTLE))
def test_strict_a_message_handed_to_another_receiver_is_not_settled_there(
    strict: LocalNamespace, outcome: str
) -> None:
    """B (another connection) is handed what A received: B's link has no such delivery, the SDK asks B's
    ``$management`` (update-disposition), and the strict namespace refuses (``MessageLockLostError``). A still
    settles it on its link."""
    with _client(strict) as a_client, _client(strict) as b_client:
        with a_client.get_queue_sender("q") as sender:
            sender.send_messages(ServiceBusMessage("x"))
        with a_client.get_queue_receiver("q") as a, b_client.get_queue_receiver("q") as b:
            (msg,) = _receive(a, 1)
            before = strict.counters().get("management:update-disposition", 0)
            with pytest.raises(MessageLockLostError):
                SETTLE[outcome](b, msg)
            assert (
                strict.counters()["management:update-disposition"] == before + 1
            )  # it was asked, and refused
            assert _counts(strict, "q") == (1, 0)
            assert b.receive_messages(max_message_count=1, max_wait_time=0.3) == []  # still A's lock
            msg._settled = False  # noqa: SLF001 - the SDK marks nothing settled after a failure; be sure
            SETTLE[outcome](a, msg)
            assert _counts(strict, "q") == _expected_after(outcome)


def test_strict_update_disposition_by_the_token_of_a_received_message_is_refused(
    strict: LocalNamespace,
) -> None:
    """Over the receiving connection's own ``$management`` too: update-disposition is for messages received by
    sequence number; the link settles what it received."""
    with _client(strict) as client:
        with client.get_queue_sender("q") as sender:
            sender.send_messages(ServiceBusMessage("x"))
        with client.get_queue_receiver("q") as a:
            (msg,) = _receive(a, 1)
            for status in ("completed", "abandoned", "defered", "suspended"):
                with pytest.raises(MessageLockLostError):
                    a._settle_message_via_mgmt_link(status, [_token(msg)])  # noqa: SLF001
            assert _counts(strict, "q") == (1, 0)
            a.complete_message(msg)
    assert _counts(strict, "q") == (0, 0)


def test_strict_a_deferred_message_is_still_settled_over_management(strict: LocalNamespace) -> None:
    with _client(strict) as a_client, _client(strict) as b_client:
        with a_client.get_queue_sender("q") as sender:
            sender.send_messages([ServiceBusMessage("one"), ServiceBusMessage("two")])
        with a_client.get_queue_receiver("q") as a, b_client.get_queue_receiver("q") as b:
            first, second = _receive(a, 2)
            a.defer_message(first)
            a.defer_message(second)
            deferred = a.receive_deferred_messages([_seq(first), _seq(second)])
            assert len(deferred) == 2
            a.complete_message(deferred[0])  # a deferred message: the SDK settles it over $management
            b.dead_letter_message(deferred[1], reason="r")  # by any receiver of the entity
    assert _counts(strict, "q") == (0, 1)


def test_strict_a_refused_message_comes_back_when_its_lock_expires(strict: LocalNamespace) -> None:
    with _client(strict) as a_client, _client(strict) as b_client:
        with a_client.get_queue_sender("short") as sender:
            sender.send_messages(ServiceBusMessage("x"))
        with a_client.get_queue_receiver("short") as a, b_client.get_queue_receiver("short") as b:
            (msg,) = _receive(a, 1)
            with pytest.raises(MessageLockLostError):
                b.complete_message(msg)
            deadline = time.monotonic() + SHORT_LOCK.total_seconds() + 5.0
            again: list[ServiceBusReceivedMessage] = []
            while not again and time.monotonic() < deadline:  # A neither settles nor renews
                again = b.receive_messages(max_message_count=1, max_wait_time=0.5)
            assert [(m.sequence_number, m.delivery_count) for m in again] == [(msg.sequence_number, 1)]
            with pytest.raises(MessageLockLostError):
                a.complete_message(msg)  # A's lock is gone
            b.complete_message(again[0])  # on the link that received it
    assert _counts(strict, "short") == (0, 0)


def test_strict_settlement_is_on_by_default_and_turned_off_by_argument_flag_or_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(STRICT_SETTLEMENT_ENV, raising=False)
    assert LocalNamespace("a").broker.strict_settlement is True
    assert LocalNamespace("a", strict_settlement=False).broker.strict_settlement is False
    assert build_parser().parse_args([]).strict_settlement is None
    assert build_parser().parse_args(["--strict-settlement"]).strict_settlement is True
    assert build_parser().parse_args(["--lenient-settlement"]).strict_settlement is False
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--strict-settlement", "--lenient-settlement"])
    for off in ("0", "false", "off"):
        monkeypatch.setenv(STRICT_SETTLEMENT_ENV, off)
        assert LocalNamespace("a").broker.strict_settlement is False
        assert LocalNamespace("a", strict_settlement=True).broker.strict_settlement is True
    monkeypatch.setenv(STRICT_SETTLEMENT_ENV, "1")
    assert LocalNamespace("a").broker.strict_settlement is True


# -- session entities: only the session's owner settles ---------------------------------------------------------


@pytest.mark.parametrize("outcome", list(SETTLE))
def test_a_session_message_is_settled_only_by_the_sessions_owner(sns: LocalNamespace, outcome: str) -> None:
    """B holds another session: settling A's message fails (on B's link the SDK finds no such delivery; over B's
    ``$management`` link the namespace refuses), and A still settles it."""
    with _client(sns) as a_client, _client(sns) as b_client:
        with a_client.get_queue_sender("sq") as sender:
            sender.send_messages(two_sessions())
        with (
            a_client.get_queue_receiver("sq", session_id="A") as a,
            b_client.get_queue_receiver("sq", session_id="B") as b,
        ):
            (msg,) = _receive(a, 1)
            with pytest.raises(SessionLockLostError):
                SETTLE[outcome](b, msg)
            with pytest.raises(SessionLockLostError):
                b._settle_message_via_mgmt_link("completed", [_token(msg)])  # noqa: SLF001
            assert _counts(sns, "sq") == (2, 0)
            SETTLE[outcome](a, msg)
            assert _counts(sns, "sq")[1] == _expected_after(outcome)[1]


def test_a_refused_session_message_comes_back_when_the_session_lock_expires(sns: LocalNamespace) -> None:
    with _client(sns) as a_client, _client(sns) as b_client:
        with a_client.get_queue_sender("short") as sender:
            sender.send_messages(two_sessions())
        a = a_client.get_queue_receiver("short", session_id="A")
        with a, b_client.get_queue_receiver("short", session_id="B") as b:
            (msg,) = _receive(a, 1)
            with pytest.raises(SessionLockLostError):
                b.complete_message(msg)
            wait_until_session_lock_expired(a)  # A neither settles nor renews: its session lock expires
            with b_client.get_queue_receiver(
                "short", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=2
            ) as c:
                assert c.session.session_id == "A"
                (again,) = _receive(c, 1)
                assert (again.sequence_number, again.delivery_count) == (msg.sequence_number, 1)
                with pytest.raises(SessionLockLostError):
                    a.complete_message(msg)  # A's lock went with its session
                c.complete_message(again)
    assert _counts(sns, "short") == (1, 0)


def test_a_deferred_session_message_is_received_and_settled_over_management_by_the_owner_only(
    sns: LocalNamespace,
) -> None:
    with _client(sns) as a_client, _client(sns) as b_client:
        with a_client.get_queue_sender("sq") as sender:
            sender.send_messages(two_sessions())
        with (
            a_client.get_queue_receiver("sq", session_id="A") as a,
            b_client.get_queue_receiver("sq", session_id="B") as b,
        ):
            (msg,) = _receive(a, 1)
            a.defer_message(msg)
            with pytest.raises(MessageNotFoundError):
                b.receive_deferred_messages([_seq(msg)])  # B's request names its session: not A's
            b._session_id = "A"  # noqa: SLF001 - B's next request names session A, which B does not hold
            with pytest.raises(SessionLockLostError):
                b.receive_deferred_messages([_seq(msg)])
            b._session_id = "B"  # noqa: SLF001
            (deferred,) = a.receive_deferred_messages([_seq(msg)])
            with pytest.raises(SessionLockLostError):
                b.complete_message(deferred)
            a.complete_message(deferred)
    assert _counts(sns, "sq") == (1, 0)


# -- lock duration: at most five minutes ------------------------------------------------------------------------


def test_lock_duration_of_five_minutes_is_accepted_and_one_second_more_is_refused(ns: LocalNamespace) -> None:
    too_long = FIVE_MINUTES + timedelta(seconds=1)
    with ns.admin_client() as admin:
        assert admin.create_queue("five", lock_duration=FIVE_MINUTES).lock_duration == FIVE_MINUTES
        with pytest.raises(HttpResponseError) as refused:
            admin.create_queue("longer", lock_duration=too_long)
        assert refused.value.status_code == 400
        assert "The supplied lock time exceeds the allowed maximum of '5' minutes." in str(refused.value)
        assert "Actual value was 00:05:01." in str(refused.value)
        queue = admin.get_queue("five")
        queue.lock_duration = too_long
        with pytest.raises(HttpResponseError):
            admin.update_queue(queue)
        assert admin.get_queue("five").lock_duration == FIVE_MINUTES

        assert (
            admin.create_subscription("t", "five", lock_duration=FIVE_MINUTES).lock_duration == FIVE_MINUTES
        )
        with pytest.raises(HttpResponseError):
            admin.create_subscription("t", "longer", lock_duration=too_long)
        sub = admin.get_subscription("t", "five")
        sub.lock_duration = too_long
        with pytest.raises(HttpResponseError):
            admin.update_subscription("t", sub)
    names = [q.name for q in ns.broker.list_queues()]
    assert "longer" not in names
    with pytest.raises(InvalidSettings):
        ns.broker.create_queue("direct", QueueSettings(lock_duration=too_long))
    with pytest.raises(InvalidSettings):
        ns.broker.create_subscription("t", "direct", SubscriptionSettings(lock_duration=too_long))
    with pytest.raises(TopologyError, match="lock_duration"):
        parse_topology({"queues": [{"name": "x", "lock_duration": "301s"}]})
    (five,) = parse_topology({"queues": [{"name": "x", "lock_duration": "5m"}]}).queues
    assert five.settings.lock_duration == FIVE_MINUTES


# -- a topic message without a session id, and subscriptions that require sessions ------------------------------


def test_a_session_subscription_dead_letters_a_topic_message_without_session_id(ns: LocalNamespace) -> None:
    ns.broker.create_subscription("t", "sess", SubscriptionSettings(requires_session=True))
    with _client(ns) as client:
        with client.get_topic_sender("t") as sender:
            sender.send_messages(ServiceBusMessage("no session", message_id="m1"))  # the topic accepts it
            sender.send_messages(ServiceBusMessage("with session", session_id="S"))
        with client.get_subscription_receiver("t", "a") as plain:
            assert sorted(str(m) for m in _receive(plain, 2)) == ["no session", "with session"]
        with client.get_subscription_receiver("t", "sess", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            (dead,) = _receive(dlq, 1)
            assert (str(dead), dead.message_id) == ("no session", "m1")
            assert dead.dead_letter_reason == "Session id is null."
            assert dead.dead_letter_error_description == (
                "Session enabled entity doesn't allow a message whose session identifier is null."
            )
            dlq.complete_message(dead)
        with client.get_subscription_receiver("t", "sess", session_id="S") as session_receiver:
            (kept,) = _receive(session_receiver, 1)
            assert str(kept) == "with session"
