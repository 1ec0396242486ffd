"""Deferral as the ``servicebus`` source of spark-servicebus builds on it (its design's R31), with the unmodified
SDK over real TCP: peek shows deferred messages with their state; receive by sequence number in
receive-and-delete mode removes them, and a list naming one number that is not deferred fails whole and removes
nothing; range dispositions (one frame, first..last) are applied to every delivery of the range, ``modified``
included; deferred messages outlive their link and connection; a defer keeps the delivery count."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from azure.servicebus import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusMessageState,
    ServiceBusReceivedMessage,
    ServiceBusReceiveMode,
    ServiceBusReceiver,
    ServiceBusSubQueue,
)
from azure.servicebus._pyamqp.error import AMQPError
from azure.servicebus._pyamqp.outcomes import Accepted, Modified, Rejected, Released
from azure.servicebus.exceptions import MessageNotFoundError

from servicebus_local.clock import FakeClock
from servicebus_local.model import QueueSettings
from servicebus_local.server import LocalNamespace

#: The SDK's defer on the link: modified, delivery-failed, undeliverable-here.
DEFER = Modified(delivery_failed=True, undeliverable_here=True, message_annotations=None)


def _send(ns: LocalNamespace, n: int, queue: str = "q") -> None:
    with (
        ServiceBusClient.from_connection_string(ns.connection_string) as c,
        c.get_queue_sender(queue) as s,
    ):
        s.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(n)])


def _receive(receiver: ServiceBusReceiver, n: int) -> list[ServiceBusReceivedMessage]:
    out: list[ServiceBusReceivedMessage] = []
    deadline = time.monotonic() + 5
    while len(out) < n and time.monotonic() < deadline:
        out += receiver.receive_messages(max_message_count=n - len(out), max_wait_time=0.5)
    assert len(out) == n
    return out


def _peek(client: ServiceBusClient, queue: str = "q") -> dict[int, tuple[ServiceBusMessageState, int]]:
    with client.get_queue_receiver(queue) as r:
        return {
            int(m.sequence_number or 0): (m.state, int(m.delivery_count or 0))
            for m in r.peek_messages(max_message_count=100, sequence_number=1)
        }


def _range(
    receiver: ServiceBusReceiver, messages: list[ServiceBusReceivedMessage], outcome: Any
) -> dict[int, Any]:
    """One disposition frame for ``messages`` (consecutive delivery ids, first..last), unsettled, and wait for the
    namespace's answer to each - the SDK's own pyamqp link machinery, as ``settle_messages`` uses it per message.
    Returns the answer per delivery id."""
    link: Any = receiver._handler._link  # noqa: SLF001
    ids = sorted(int(m._delivery_id) for m in messages)  # noqa: SLF001
    assert ids == list(range(ids[0], ids[0] + len(ids)))
    pending = link._pending_dispositions  # noqa: SLF001
    for d in ids:
        pending[d] = {"settled": False, "outcome": None}
    first = min(messages, key=lambda m: m._delivery_id)  # noqa: SLF001
    link._outgoing_disposition(ids[0], ids[-1], first._delivery_tag, False, outcome, None)  # noqa: SLF001
    deadline = time.monotonic() + 5
    while any(not pending[d]["settled"] for d in ids):
        assert time.monotonic() < deadline, "the namespace did not answer every delivery of the range"
        link._session._connection.listen(wait=False)  # noqa: SLF001
    return {d: pending.pop(d)["outcome"] for d in ids}


def _applied(answers: dict[int, Any]) -> None:
    """Each delivery's answer is its outcome, not a refusal (a ``rejected`` carrying an error, as the SDK reads it)."""
    for outcome in answers.values():
        assert outcome is not None and not _refusal(outcome), outcome


def _refusal(outcome: Any) -> Any:
    """The error of a ``rejected`` answer (None: applied)."""
    fields = outcome.get("rejected") if isinstance(outcome, dict) else None
    return fields[0] if fields else None


def test_peek_shows_deferred_messages_with_their_state(ns: LocalNamespace, client: ServiceBusClient) -> None:
    _send(ns, 3)
    with client.get_queue_receiver("q") as r:
        got = sorted(_receive(r, 3), key=lambda m: m.sequence_number or 0)
        r.defer_message(got[0])
        r.complete_message(got[2])
    peeked = _peek(client)
    assert {s: state for s, (state, _) in peeked.items()} == {
        got[0].sequence_number: ServiceBusMessageState.DEFERRED,
        got[1].sequence_number: ServiceBusMessageState.ACTIVE,  # its lock was released when its link closed
    }


def test_receive_by_sequence_number_in_receive_and_delete_mode_removes_the_deferred_messages(
    ns: LocalNamespace, client: ServiceBusClient
) -> None:
    _send(ns, 3)
    with client.get_queue_receiver("q") as r:
        got = _receive(r, 3)
        for m in got:
            r.defer_message(m)
    seqs = sorted(int(m.sequence_number or 0) for m in got)
    with client.get_queue_receiver("q", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as rd:
        taken = rd.receive_deferred_messages(seqs)
        assert sorted(int(m.sequence_number or 0) for m in taken) == seqs
        assert all(m.lock_token is None for m in taken)  # nothing locked: removed at once
        with pytest.raises(MessageNotFoundError):
            rd.receive_deferred_messages(seqs[:1])
    assert _peek(client) == {}
    assert ns.broker.counts("q").total_message_count == 0


def test_a_receive_and_delete_list_naming_one_number_not_deferred_fails_whole_and_deletes_nothing(
    ns: LocalNamespace, client: ServiceBusClient
) -> None:
    _send(ns, 3)
    with client.get_queue_receiver("q") as r:
        got = sorted(_receive(r, 3), key=lambda m: m.sequence_number or 0)
        r.defer_message(got[0])
        r.defer_message(got[1])
        # got[2] stays locked by this link: not deferred
        with client.get_queue_receiver("q", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as rd:
            with pytest.raises(MessageNotFoundError):
                rd.receive_deferred_messages([int(m.sequence_number or 0) for m in got])
            with pytest.raises(MessageNotFoundError):
                rd.receive_deferred_messages([int(got[0].sequence_number or 0), 10_000])
        r.complete_message(got[2])
    peeked = _peek(client)
    assert {s: state for s, (state, _) in peeked.items()} == {
        got[0].sequence_number: ServiceBusMessageState.DEFERRED,
        got[1].sequence_number: ServiceBusMessageState.DEFERRED,
    }


def test_a_range_disposition_settles_every_delivery_of_the_range(
    ns: LocalNamespace, client: ServiceBusClient
) -> None:
    _send(ns, 15)
    dead = Rejected(
        error=AMQPError(
            condition=b"com.microsoft:dead-letter",
            description=b"d",
            info={b"DeadLetterReason": "why", b"DeadLetterErrorDescription": "d"},  # as the SDK: strings
        )
    )
    abandon = Modified(delivery_failed=True, undeliverable_here=False, message_annotations=None)
    with client.get_queue_receiver("q") as r:
        got = sorted(_receive(r, 15), key=lambda m: m._delivery_id)  # noqa: SLF001
        settlements = ns.counters()["settlements"]
        for i, outcome in enumerate((DEFER, Accepted(), abandon, Released(), dead)):
            _applied(_range(r, got[3 * i : 3 * i + 3], outcome))
        assert ns.counters()["settlements"] - settlements == 15  # one per delivery, from five frames

    def seqs(i: int) -> list[int]:
        return [int(m.sequence_number or 0) for m in got[3 * i : 3 * i + 3]]

    assert _peek(client) == {
        **dict.fromkeys(
            seqs(0), (ServiceBusMessageState.DEFERRED, 0)
        ),  # modified, undeliverable-here: deferred
        **dict.fromkeys(
            seqs(2), (ServiceBusMessageState.ACTIVE, 1)
        ),  # modified: abandoned, delivery count + 1
        **dict.fromkeys(seqs(3), (ServiceBusMessageState.ACTIVE, 0)),  # released: back, no delivery counted
    }  # accepted: gone
    with client.get_queue_receiver("q", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        dead_lettered = dlq.peek_messages(max_message_count=10, sequence_number=1)
    assert sorted(int(m.sequence_number or 0) for m in dead_lettered) == seqs(4)
    assert {m.dead_letter_reason for m in dead_lettered} == {"why"}


def test_deferred_messages_outlive_their_link_and_connection(ns: LocalNamespace) -> None:
    _send(ns, 2)
    with (
        ServiceBusClient.from_connection_string(ns.connection_string) as first,
        first.get_queue_receiver("q") as r,
    ):
        got = _receive(r, 2)
        for m in got:
            r.defer_message(m)
    deadline = time.monotonic() + 5
    while ns.connection_count:  # the first connection is gone
        assert time.monotonic() < deadline
        time.sleep(0.02)
    seqs = sorted(int(m.sequence_number or 0) for m in got)
    with ServiceBusClient.from_connection_string(ns.connection_string) as second:
        assert {s: state for s, (state, _) in _peek(second).items()} == dict.fromkeys(
            seqs, ServiceBusMessageState.DEFERRED
        )
        with second.get_queue_receiver("q") as r2:
            assert r2.receive_messages(max_message_count=10, max_wait_time=0.3) == []  # invisible to receive
            fetched = r2.receive_deferred_messages(seqs)
            assert sorted(str(m) for m in fetched) == ["m0", "m1"]
            for m in fetched:
                r2.complete_message(m)  # settled over $management: received by sequence number
        assert _peek(second) == {}


def test_a_defer_keeps_the_delivery_count(ns: LocalNamespace, client: ServiceBusClient) -> None:
    _send(ns, 1)
    with client.get_queue_receiver("q") as r:
        (m,) = _receive(r, 1)
        r.abandon_message(m)  # delivery count 1
        (m,) = _receive(r, 1)
        assert m.delivery_count == 1
        r.defer_message(m)
    ((state, count),) = _peek(client).values()
    assert (state, count) == (ServiceBusMessageState.DEFERRED, 1)
    with client.get_queue_receiver("q") as r:
        (again,) = r.receive_deferred_messages([int(m.sequence_number or 0)])
        assert again.delivery_count == 1  # receiving it by number is no new delivery
        r.complete_message(again)


def test_the_runtime_counts_count_deferred_messages_as_active(
    ns: LocalNamespace, client: ServiceBusClient
) -> None:
    from azure.servicebus.management import ServiceBusAdministrationClient

    _send(ns, 3)
    with client.get_queue_receiver("q") as r:
        got = _receive(r, 3)
        r.defer_message(got[0])
        r.defer_message(got[1])
        r.complete_message(got[2])
    with ServiceBusAdministrationClient.from_connection_string(
        ns.connection_string, connection_verify=ns.ca_file
    ) as admin:
        p = admin.get_queue_runtime_properties("q")
    assert (p.active_message_count, p.total_message_count, p.dead_letter_message_count) == (2, 2, 0)


def test_a_range_with_one_lost_lock_rejects_that_delivery_and_applies_the_others() -> None:
    clock = FakeClock()
    ns = LocalNamespace("testns", clock=clock).start()
    try:
        ns.broker.create_queue("short", QueueSettings(lock_duration=timedelta(seconds=1)))
        with ServiceBusClient.from_connection_string(ns.connection_string, retry_total=0) as client:
            with client.get_queue_receiver("short") as r:
                _send(ns, 1, "short")
                first = _receive(r, 1)
                clock.advance(0.6)
                _send(ns, 2, "short")
                rest = _receive(r, 2)
                clock.advance(0.6)  # the first lock ended (1.2 s); the others hold until 1.6 s
                answers = _range(r, first + rest, DEFER)
                lost = answers.pop(int(first[0]._delivery_id))  # noqa: SLF001
                error = _refusal(lost)
                assert error is not None and error[0] == b"com.microsoft:message-lock-lost"
                _applied(answers)
            assert {s: state for s, (state, _) in _peek(client, "short").items()} == {
                first[0].sequence_number: ServiceBusMessageState.ACTIVE,
                **dict.fromkeys((m.sequence_number for m in rest), ServiceBusMessageState.DEFERRED),
            }
    finally:
        ns.stop()
