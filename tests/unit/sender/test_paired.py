"""PairedSender with a fake transport and a fake clock: no network, no sleeping (SPEC B2-B8, S3)."""

from __future__ import annotations

import pickle
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus import exceptions as sbe

from servicebus_local.clock import FakeClock
from spark_sb.config.namespace import NamespaceConfig
from spark_sb.config.secret import Secret
from spark_sb.core.errors import (
    ServerBusyError,
    ServiceBusConfigError,
)
from spark_sb.failover.records import EntityState
from spark_sb.failover.registry import FailoverRegistry
from spark_sb.message.backlog import (
    BACKLOG_PATH,
    BACKLOG_SESSION_ID,
    BACKLOG_TTL,
    PING_CONTENT_TYPE,
    from_backlog,
    is_probe,
    probe_message,
)
from spark_sb.message.outbound import OutboundMessage
from spark_sb.wire.admin_api import primary_namespace_name
from spark_sb.wire.transport import PRIMARY, SECONDARY, Target
from tests.unit.fakes import FakeTransport
from tests.unit.sender.rig import QUEUES, SECRET, Rig, conn_error, msgs

H, F, FO = EntityState.HEALTHY, EntityState.FAILING, EntityState.FAILED_OVER


# ---------------------------------------------------------------------------------------------------------
# Healthy path, streaming, packing


def test_healthy_all_to_primary_packed_by_size() -> None:
    rig = Rig()
    out = rig.sender.send(msgs(50))
    assert rig.transport.ids(PRIMARY, "orders") == [f"m{i}" for i in range(50)]
    assert out.sent == {"orders": 50} and out.total_diverted == 0 and not out.rejects
    assert out.transitions == () and rig.transitions == []
    sends = rig.transport.sends(PRIMARY)
    assert len(sends) > 1  # several size-bounded batches, not one per message
    assert all(n <= 1000 // 72 for _, _, n, _ in sends)
    assert rig.backlog() == []


def test_streams_without_collecting_everything() -> None:
    rig = Rig()
    pulled_before_first_send: list[int] = []

    def gen() -> Iterator[OutboundMessage]:
        for i, m in enumerate(msgs(100)):
            if not rig.transport.sends() and i > 0:
                pulled_before_first_send.append(i)
            yield m

    rig.sender.send(gen())
    assert len(rig.transport.ids(PRIMARY, "orders")) == 100
    assert 0 < len(pulled_before_first_send) < 20  # sent after the first batch filled, not at the end


def test_per_message_entities_and_default() -> None:
    rig = Rig()
    batch = msgs(3, "a", entity="alpha") + msgs(2, "d") + msgs(3, "b", entity="beta")
    out = rig.sender.send(batch)
    assert out.sent == {"alpha": 3, "orders": 2, "beta": 3}
    assert rig.transport.ids(PRIMARY, "beta") == ["b0", "b1", "b2"]


def test_no_entity_is_rejected() -> None:
    rig = Rig(entity=None)
    out = rig.sender.send(msgs(2) + msgs(1, "e", entity="x"))
    assert out.sent == {"x": 1}
    assert [(r.field, r.row_index) for r in out.rejects] == [("entity", 0), ("entity", 1)]


# ---------------------------------------------------------------------------------------------------------
# B3: failure detection, blips, timer


def test_blip_shorter_than_failover_interval_loses_nothing_and_never_diverts() -> None:
    rig = Rig()
    rig.transport.fail(conn_error, namespace=PRIMARY, count=3)
    out = rig.sender.send(msgs(30))
    assert rig.transport.ids(PRIMARY, "orders") == [f"m{i}" for i in range(30)]
    assert rig.backlog() == [] and out.total_diverted == 0
    assert rig.moves() == [(H, F), (F, H)]
    assert out.retries == 3 and rig.clock.sleeps and sum(rig.clock.sleeps) < 60
    assert rig.sender.entity_state("orders") is H
    assert PRIMARY in rig.transport.faults  # connection-class error: the client pair is rebuilt (B10)


def test_outage_longer_than_interval_fails_over_just_at_the_interval() -> None:
    rig = Rig(failover_interval=10.0)
    rig.transport.fail(conn_error, namespace=PRIMARY)
    start = rig.clock.monotonic()
    out = rig.sender.send(msgs(5))
    assert rig.moves() == [(H, F), (F, FO)]
    failing, failed_over = rig.transitions
    assert (failed_over.at - failing.at).total_seconds() == pytest.approx(10.0)
    # the timer starts when the first failing send started (SPEC B3): failover exactly 10 s after it, then one
    # backlog send (1 s): no oversleeping
    assert failing.at == rig.clock.now() - timedelta(seconds=11)
    assert rig.clock.monotonic() - start == pytest.approx(11.0)
    assert out.sent == {} and out.diverted_by_entity == {"orders": 5}
    assert sorted(m.message_id or "" for m in rig.backlog()) == sorted(f"m{i}" for i in range(5))


def test_failing_primary_keeps_retrying_until_interval_then_diverts_the_same_messages() -> None:
    rig = Rig(failover_interval=10.0)
    rig.transport.fail(lambda: sbe.ServiceBusQuotaExceededError(), namespace=PRIMARY)
    rig.sender.send(msgs(5))
    primary_attempts = rig.transport.sends(PRIMARY)
    assert len(primary_attempts) >= 3 and all(n == 5 for _, _, n, _ in primary_attempts)
    assert rig.transitions[0].error_class == "quota_exceeded"


def test_interval_zero_fails_over_on_first_failure_without_waiting() -> None:
    rig = Rig(failover_interval=0.0)
    rig.transport.fail(conn_error, namespace=PRIMARY)
    out = rig.sender.send(msgs(4))
    assert rig.moves() == [(H, F), (F, FO)]
    assert rig.clock.sleeps == [] and out.retries == 0
    assert len(rig.transport.sends(PRIMARY)) == 1
    assert out.diverted_by_entity == {"orders": 4}


@pytest.mark.parametrize(
    "make",
    [
        lambda: sbe.MessagingEntityDisabledError(),
        lambda: sbe.MessagingEntityNotFoundError(),
        lambda: sbe.OperationTimeoutError(),
        lambda: ConnectionRefusedError(111, "refused"),
    ],
    ids=["disabled", "not-found", "timeout", "refused"],
)
def test_outage_errors_fail_over(make: Any) -> None:
    rig = Rig(failover_interval=0.0)
    assert (
        rig.sender.send(msgs(1, "w")).total_sent == 1
    )  # the entity exists (SPEC F9: a typo is another story)
    rig.transport.fail(make, namespace=PRIMARY)
    out = rig.sender.send(msgs(3))
    assert out.diverted_by_entity == {"orders": 3}
    assert rig.sender.entity_state("orders") is FO


def test_translation_applied_on_divert_and_reversible() -> None:
    rig = Rig(failover_interval=0.0)
    rig.transport.fail(conn_error, namespace=PRIMARY)
    original = OutboundMessage(
        body=b"payload",
        message_id="id-1",
        session_id="s-1",
        partition_key="s-1",
        time_to_live=timedelta(seconds=90),
        scheduled_enqueue_time=datetime(2030, 1, 1, tzinfo=timezone.utc),
        properties={"k": "v", "n": 3},
        correlation_id="c",
    )
    rig.sender.send([original])
    (backlog,) = rig.backlog()
    assert backlog.entity is None and backlog.session_id is None and backlog.time_to_live is None
    assert backlog.scheduled_enqueue_time is None and backlog.partition_key is None
    assert backlog.properties[BACKLOG_PATH] == "orders"
    assert backlog.properties[BACKLOG_SESSION_ID] == "s-1"
    assert backlog.properties[BACKLOG_TTL] == 90_000
    assert backlog.body == b"payload" and backlog.message_id == "id-1" and backlog.correlation_id == "c"
    restored, entered = from_backlog(backlog)
    assert restored == replace(original, entity="orders")
    assert entered == rig.clock.now() - timedelta(seconds=1)  # when diverted, before the 1 s send


# ---------------------------------------------------------------------------------------------------------
# B4/B8: failed over, probes (the prober's scheduling, rotation and recovery: test_prober.py)


def test_probe_schedule_cancel_marks_message_and_retries_cancel() -> None:
    rig = Rig(failover_interval=0.0, ping_primary_interval=5.0)
    rig.transport.fail(conn_error, namespace=PRIMARY, op="send", count=1)
    rig.sender.send(msgs(1))
    rig.transport.fail(conn_error, op="cancel", namespace=PRIMARY, count=1)
    rig.clock.advance(5.0)
    out = rig.sender.send(msgs(1, "z"))
    (probe,) = out.probes
    assert probe.ok and probe.cancel_ok and probe.cancel_attempts == 2
    target = Target(PRIMARY, "orders")
    assert rig.transport.scheduled[target] == {}
    assert rig.transport.cancelled and rig.transport.cancelled[-1][0] == target


def test_probe_cancel_failing_for_good_is_recorded_and_message_is_a_probe() -> None:
    rig = Rig(failover_interval=0.0, ping_primary_interval=5.0)
    rig.transport.fail(conn_error, namespace=PRIMARY, op="send", count=1)
    rig.sender.send(msgs(1))
    rig.transport.fail(conn_error, op="cancel", namespace=PRIMARY)
    rig.clock.advance(5.0)
    out = rig.sender.send(msgs(1, "z"))
    (probe,) = out.probes
    assert (
        probe.ok
        and probe.cancel_ok is False
        and probe.cancel_attempts == 3
        and "cancel failed" in probe.detail
    )
    (left,) = rig.transport.scheduled[Target(PRIMARY, "orders")].values()
    message, at = left
    assert is_probe(message) and message.time_to_live == timedelta(seconds=1) and message.body == b""
    assert at > rig.clock.now() + timedelta(days=1)


def test_probe_cancel_not_found_after_a_lost_answer_counts_as_cancelled() -> None:
    from azure.servicebus.exceptions import MessageNotFoundError

    rig = Rig(failover_interval=0.0, ping_primary_interval=5.0)
    rig.transport.fail(conn_error, namespace=PRIMARY, op="send", count=1)
    rig.sender.send(msgs(1))
    # the first cancel times out (its answer lost), the retry finds nothing scheduled any more
    rig.transport.fail(conn_error, op="cancel", namespace=PRIMARY, count=1)
    rig.transport.fail(
        lambda: MessageNotFoundError(message="not found"), op="cancel", namespace=PRIMARY, count=1
    )
    rig.clock.advance(5.0)
    (probe,) = rig.sender.send(msgs(1, "z")).probes
    assert probe.ok and probe.cancel_ok and probe.cancel_attempts == 2 and probe.detail == ""


def test_probe_cancel_not_found_at_first_try_is_recorded_without_retrying() -> None:
    from azure.servicebus.exceptions import MessageNotFoundError

    rig = Rig(failover_interval=0.0, ping_primary_interval=5.0)
    rig.transport.fail(conn_error, namespace=PRIMARY, op="send", count=1)
    rig.sender.send(msgs(1))
    rig.transport.fail(lambda: MessageNotFoundError(message="not found"), op="cancel", namespace=PRIMARY)
    rig.clock.advance(5.0)
    (probe,) = rig.sender.send(msgs(1, "z")).probes
    assert probe.ok and probe.cancel_ok is False and probe.cancel_attempts == 1
    assert "MessageNotFoundError" in probe.detail


def test_probe_is_scheduled_in_the_real_future_whatever_the_injected_clock() -> None:
    from datetime import datetime, timezone

    rig = Rig(failover_interval=0.0, ping_primary_interval=5.0)  # its FakeClock starts in the past
    rig.transport.fail(conn_error, namespace=PRIMARY, op="send", count=1)
    rig.sender.send(msgs(1))
    rig.transport.fail(conn_error, op="cancel", namespace=PRIMARY)
    rig.clock.advance(5.0)
    rig.sender.send(msgs(1, "z"))
    ((_, at),) = rig.transport.scheduled[Target(PRIMARY, "orders")].values()
    assert at > datetime.now(timezone.utc) + timedelta(days=1)


def test_ping_probe_mode() -> None:
    rig = Rig(failover_interval=0.0, ping_primary_interval=5.0, probe_mode="ping")
    rig.transport.fail(conn_error, namespace=PRIMARY, count=1)
    rig.sender.send(msgs(1))
    rig.clock.advance(5.0)
    out = rig.sender.send(msgs(1, "z"))
    assert [(p.mode, p.ok) for p in out.probes] == [("ping", True)]
    ping, real = rig.transport.at(PRIMARY, "orders")
    assert (
        ping.content_type == PING_CONTENT_TYPE
        and ping.time_to_live == timedelta(seconds=1)
        and ping.body == b""
    )
    assert is_probe(ping) and not is_probe(real) and real.message_id == "z0"


def test_is_probe_on_sdk_messages() -> None:
    assert is_probe(ServiceBusMessage(b"", content_type=PING_CONTENT_TYPE))
    assert is_probe(ServiceBusMessage(b"", application_properties={"x-spark-sb-probe": "schedule-cancel"}))
    assert not is_probe(ServiceBusMessage(b"hello", content_type="text/plain"))
    assert is_probe(probe_message("q", "ping"))
    with pytest.raises(ValueError, match="probe_mode"):
        probe_message("q", "shout")


# ---------------------------------------------------------------------------------------------------------
# Throttling and configuration errors never fail over


def test_server_busy_backs_off_and_never_fails_over() -> None:
    rig = Rig(failover_interval=0.0)
    rig.transport.fail(lambda: sbe.ServiceBusServerBusyError(), namespace=PRIMARY, count=5)
    out = rig.sender.send(msgs(5))
    assert out.sent == {"orders": 5} and rig.backlog() == []
    assert rig.transitions == [] and out.retries == 5 and len(rig.clock.sleeps) == 5
    assert rig.sender.entity_state("orders") is H
    # short back-offs, capped at a quarter of the credit window, and the time spent is in the outcome
    assert rig.clock.sleeps == pytest.approx([0.05, 0.1, 0.2, 0.25, 0.25])
    assert out.throttled == {"orders": pytest.approx(0.85)}


def test_server_busy_forever_raises_for_a_spark_retry_and_diverts_nothing() -> None:
    rig = Rig(failover_interval=0.0)
    rig.transport.fail(lambda: sbe.ServiceBusServerBusyError(), namespace=PRIMARY)
    with pytest.raises(ServerBusyError, match="not failing over") as info:
        rig.sender.send(msgs(5))
    assert info.value.outcome is not None and info.value.outcome.total_sent == 0
    assert rig.backlog() == [] and rig.transitions == []
    assert rig.sender.entity_state("orders") is H


@pytest.mark.parametrize("make", [sbe.ServiceBusAuthorizationError, sbe.ServiceBusAuthenticationError])
def test_unauthorized_raises_clear_error_and_diverts_nothing(make: Any) -> None:
    rig = Rig(failover_interval=0.0)
    rig.transport.fail(lambda: make(message=f"SharedAccessKey={SECRET} refused"), namespace=PRIMARY)
    with pytest.raises(ServiceBusConfigError) as info:
        rig.sender.send(msgs(3))
    text = str(info.value)
    assert "unauthorized" in text and "'Send'" in text and "orders" in text and "primary" in text
    assert SECRET not in text and SECRET not in repr(info.value)
    assert rig.backlog() == [] and rig.transitions == []
    assert rig.sender.entity_state("orders") is H


# ---------------------------------------------------------------------------------------------------------
# B5: rotation shared by the senders of a process (the diverter's pulls: test_diverter.py)


def test_rotation_and_failover_state_shared_by_senders_of_one_process() -> None:
    clock = FakeClock()
    registry = FailoverRegistry(clock)
    transport_a = FakeTransport(clock, op_seconds=1.0)
    transport_b = FakeTransport(clock, op_seconds=1.0)
    a = Rig(registry=registry, transport=transport_a, failover_interval=0.0)
    b = Rig(registry=registry, transport=transport_b, failover_interval=0.0)
    transport_a.fail(conn_error, namespace=PRIMARY)
    for q in QUEUES[:2]:
        transport_a.fail(conn_error, namespace=SECONDARY, entity=q)
    a.sender.send(msgs(5, "a"))
    assert {p.queue for p in registry.rotation.pulled()} <= set(QUEUES[:2])
    assert len(a.transport.at(SECONDARY, QUEUES[2])) == 5
    pulled = {p.queue for p in registry.rotation.pulled()}
    # b learns at once: the entity is failed over (no primary send) and pulled queues are avoided
    out = b.sender.send(msgs(5, "b"))
    assert transport_b.sends(PRIMARY) == []
    assert set(out.diverted) == {QUEUES[2]} and not any(transport_b.at(SECONDARY, q) for q in pulled)


# ---------------------------------------------------------------------------------------------------------
# Partial failures, sizes


def test_partial_batch_failure_does_not_duplicate_sent_chunks() -> None:
    rig = Rig(failover_interval=60.0)
    rig.transport.fail(conn_error, namespace=PRIMARY, skip=2, count=2)  # the 3rd batch fails twice
    rig.sender.send(msgs(60))
    ids = rig.transport.ids(PRIMARY, "orders")
    assert ids == [f"m{i}" for i in range(60)]  # each once, in order


def test_partial_batch_failure_then_failover_splits_without_duplicates() -> None:
    rig = Rig(failover_interval=0.0)
    rig.transport.fail(conn_error, namespace=PRIMARY, skip=2)
    rig.sender.send(msgs(60))
    primary = rig.transport.ids(PRIMARY, "orders")
    backlog = [m.message_id for m in rig.backlog()]
    assert primary and backlog
    assert Counter(primary + backlog) == Counter(f"m{i}" for i in range(60))


def test_service_refusing_batch_as_too_large_splits_it() -> None:
    rig = Rig()
    rig.transport.fail(lambda: sbe.MessageSizeExceededError(), namespace=PRIMARY, count=1)
    out = rig.sender.send(msgs(8))
    assert sorted(rig.transport.ids(PRIMARY, "orders")) == sorted(f"m{i}" for i in range(8))
    assert out.rejects == ()


def test_single_message_refused_as_too_large_is_rejected() -> None:
    rig = Rig()
    rig.transport.fail(lambda: sbe.MessageSizeExceededError(), namespace=PRIMARY, count=1)
    out = rig.sender.send(msgs(1))
    assert [r.reason for r in out.rejects] == [
        "message too large: refused by the service (message size exceeded)"
    ]


def premium_mix() -> list[OutboundMessage]:
    """SPEC B13 in small: batches up to 1,000 bytes, one message up to 10,000 - small ones and ones over a batch."""
    out = msgs(5, "a")
    out += msgs(1, "big", size=3000) + msgs(3, "b") + msgs(2, "huge", size=6000) + msgs(4, "c")
    return out


def premium_rig(**cfg: Any) -> Rig:
    clock = FakeClock()
    return Rig(
        FailoverRegistry(clock),
        FakeTransport(clock, max_batch=1000, op_seconds=1.0, max_message=10_000),
        **cfg,
    )


def test_a_message_over_the_batch_limit_goes_alone_to_a_healthy_primary_in_its_place() -> None:
    rig = premium_rig()
    out = rig.sender.send(premium_mix())
    assert out.rejects == ()
    assert rig.transport.ids(PRIMARY, "orders") == [m.message_id for m in premium_mix()]  # in order
    sizes = [n for _, _, n, _ in rig.transport.sends(PRIMARY)]
    assert sizes == [5, 1, 3, 1, 1, 4]  # big0, huge0 and huge1 each in a send of its own


def test_a_message_over_the_batch_limit_is_diverted_alone_and_lost_by_nothing() -> None:
    rig = premium_rig(failover_interval=0.0)
    rig.transport.fail(conn_error, namespace=PRIMARY)
    out = rig.sender.send(premium_mix())
    assert out.rejects == () and out.diverted_by_entity == {"orders": 15}
    assert Counter(m.message_id for m in rig.backlog()) == Counter(m.message_id for m in premium_mix())
    assert {len(m.body) for m in rig.backlog() if m.message_id and m.message_id.startswith("huge")} == {6000}


def test_a_message_over_the_single_limit_is_rejected_naming_that_limit() -> None:
    rig = premium_rig()
    out = rig.sender.send(msgs(2, "a") + msgs(1, "over", size=12_000))
    assert rig.transport.ids(PRIMARY, "orders") == ["a0", "a1"]
    assert [r.reason for r in out.rejects] == [
        "message too large encoded: over the limit of 10000 bytes for one message (max_message_size)"
    ]


# ---------------------------------------------------------------------------------------------------------
# Outcome, lifecycle, naming


def test_outcome_merge_and_pickle() -> None:
    rig = Rig(failover_interval=0.0)
    first = rig.sender.send(msgs(3))
    rig.transport.fail(conn_error, namespace=PRIMARY)
    second = rig.sender.send(msgs(2, "x") + [OutboundMessage(body=b"q" * 5000)])
    merged = first.merge(second)
    assert merged.sent == {"orders": 3} and merged.diverted_by_entity == {"orders": 2}
    assert merged.total_rejected == 1 and len(merged.transitions) == 2
    assert pickle.loads(pickle.dumps(merged)) == merged


def test_close_closes_the_transport_and_the_sender() -> None:
    rig = Rig()
    with rig.sender as s:
        s.send(msgs(1))
    assert rig.transport.closed == 1
    with pytest.raises(RuntimeError, match="closed"):
        rig.sender.send(msgs(1))


def test_backlog_queue_names_from_primary_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig()
    assert rig.sender.backlog_queues == QUEUES
    assert primary_namespace_name(rig.config.primary) == "primary"
    local = NamespaceConfig(
        connection_string=Secret("Endpoint=sb://127.0.0.1:5671;SharedAccessKeyName=k;SharedAccessKey=v")
    )
    asked: list[str] = []

    def fake_resolve(ns: NamespaceConfig) -> str:  # what the namespace reports about itself (SPEC B1)
        asked.append(ns.endpoint_host())
        return "reported"

    monkeypatch.setattr("spark_sb.wire.admin_api.resolve_primary_namespace_name", fake_resolve)
    assert primary_namespace_name(local) == "reported"
    assert primary_namespace_name(local) == "reported"
    assert asked == ["127.0.0.1:5671"]  # asked once per process and endpoint
    assert primary_namespace_name(replace(local, namespace_name="primary")) == "primary"
    assert "SharedAccessKey" not in repr(rig.sender)


# ---------------------------------------------------------------------------------------------------------
# Deadlines: a stalled primary fails over on time whatever send_timeout is (B3)


@pytest.mark.parametrize("send_timeout", [1.0, 30.0, 300.0])
@pytest.mark.parametrize("interval", [0.0, 2.0, 60.0])
def test_a_stalled_primary_fails_over_within_the_interval_plus_grace(
    send_timeout: float, interval: float
) -> None:
    from spark_sb.failover.decisions import FAILOVER_GRACE, MIN_ATTEMPT_BUDGET

    rig = Rig(failover_interval=interval, send_timeout=send_timeout)
    rig.transport.op_seconds = 0.0
    rig.transport.stall(namespace=PRIMARY)
    start = rig.clock.monotonic()
    out = rig.sender.send(msgs(5))
    assert out.diverted_by_entity == {"orders": 5} and out.sent == {}
    failed_over = rig.transitions[-1]
    assert failed_over.to_state is FO
    took = (failed_over.at - rig.transitions[0].at).total_seconds()
    assert took <= max(interval + FAILOVER_GRACE, min(send_timeout, MIN_ATTEMPT_BUDGET)) + 1e-6
    assert rig.clock.monotonic() - start == pytest.approx(took)  # and the batch was diverted at once
    primary_deadlines = [t for op, target, t in rig.transport.timeouts if target.namespace == PRIMARY]
    assert all(0 < t <= send_timeout for t in primary_deadlines)


@pytest.mark.parametrize("interval", [0.0, 0.5, 1.0])
def test_a_connected_primary_that_stalls_fails_over_within_the_grace_even_below_the_connect_floor(
    interval: float,
) -> None:
    """MIN_ATTEMPT_BUDGET allows for a new connection; a link that answered recently needs none, so a stall on it
    is a failure after interval + grace (the sender was sending when the primary stalled)."""
    from spark_sb.failover.decisions import FAILOVER_GRACE, MIN_SEND_BUDGET

    rig = Rig(failover_interval=interval)
    rig.transport.op_seconds = 0.0
    rig.transport.connected_targets.add(Target(PRIMARY, "orders"))
    rig.transport.stall(namespace=PRIMARY)
    start = rig.clock.monotonic()
    out = rig.sender.send(msgs(5))
    assert out.diverted_by_entity == {"orders": 5} and rig.transitions[-1].to_state is FO
    assert rig.clock.monotonic() - start == pytest.approx(max(interval + FAILOVER_GRACE, MIN_SEND_BUDGET))


def test_a_per_entity_stall_fails_over_that_entity_only() -> None:
    rig = Rig(failover_interval=2.0)
    rig.transport.op_seconds = 0.0
    rig.transport.stall(namespace=PRIMARY, entity="orders")
    out = rig.sender.send(msgs(3) + msgs(3, "b", entity="billing"))
    assert out.diverted_by_entity == {"orders": 3} and out.sent == {"billing": 3}
    assert rig.sender.entity_state("orders") is FO and rig.sender.entity_state("billing") is H


def test_a_failing_entity_opens_its_backlog_link_ahead_of_the_failover() -> None:
    rig = Rig(failover_interval=10.0)
    rig.transport.fail(conn_error, namespace=PRIMARY)
    rig.sender.send(msgs(2))
    assert len(rig.transport.warmed) == 1 and rig.transport.warmed[0].namespace == SECONDARY
    used = {target.entity for _, target, _, _ in rig.transport.sends(SECONDARY)}
    assert used == {rig.transport.warmed[0].entity}  # the queue the divert then used


def test_a_stalled_primary_has_the_backlog_link_opened_before_its_deadline() -> None:
    from spark_sb.wire.timing import SLOW_MARGIN

    rig = Rig(failover_interval=5.0)
    rig.transport.op_seconds = 0.0
    rig.transport.stall(namespace=PRIMARY)
    warmed_at: list[float] = []
    warm = rig.transport.warm

    def record(target: Target) -> None:
        warmed_at.append(rig.clock.monotonic())
        warm(target)

    rig.transport.warm = record  # type: ignore[method-assign]
    start = rig.clock.monotonic()
    out = rig.sender.send(msgs(4))
    assert out.diverted_by_entity == {"orders": 4}
    budget = rig.transport.timeouts[0][2]
    # opened SLOW_MARGIN before the stalled attempt's deadline: ready when the failover diverts
    assert warmed_at and warmed_at[0] == pytest.approx(start + budget - SLOW_MARGIN)
    assert rig.transport.warmed[0] == Target(SECONDARY, next(iter(out.diverted)))


# ---------------------------------------------------------------------------------------------------------
# One batch at a time (sends are synchronous: bench/bench_overlap.py measured no gain in overlapping them)


class _Logged(FakeTransport):
    """Logs every send next to the packing log."""

    def __init__(self, log: list[tuple[str, str]], **kw: Any) -> None:
        super().__init__(**kw)
        self.log = log

    def send(self, batch: Any, timeout: float, on_slow: Any = None, park_after: float | None = None) -> None:  # type: ignore[override]
        self.log.append(("send", batch.messages[0].message_id or ""))
        super().send(batch, timeout, on_slow, park_after)


def test_a_batch_is_sent_and_settled_before_the_next_is_packed() -> None:
    from tests.unit.fakes import BATCH_BASE, fake_size

    log: list[tuple[str, str]] = []
    limit = BATCH_BASE + 5 * max(fake_size(m) for m in msgs(12))
    rig = Rig(failover_interval=0.0, transport=_Logged(log, clock=FakeClock(), max_batch=limit))

    def streamed() -> Iterator[OutboundMessage]:
        for m in msgs(12):
            log.append(("pack", m.message_id or ""))
            yield m

    assert rig.sender.send(streamed()).total_sent == 12
    sends = [i for i, e in enumerate(log) if e[0] == "send"]
    assert [log[i][1] for i in sends] == ["m0", "m5", "m10"]  # 5 + 5 + 2
    # m5 did not fit the first batch: the first batch went out (and was settled) before m6 was packed
    assert sends[0] < log.index(("pack", "m6")) and sends[1] < log.index(("pack", "m11"))
    assert rig.transport.ids(PRIMARY, "orders") == [f"m{i}" for i in range(12)]


def test_many_disabled_entities_in_one_call_cost_one_failover_interval_not_one_each() -> None:
    """Eight entities, all disabled at once (an entity fault each: no namespace-wide evidence): their last batches
    are retried together, each on its own timer, so the call diverts everything after about one
    failover_interval, not eight of them; the healthy entity's batch goes to the primary meanwhile."""
    rig = Rig(failover_interval=10.0)
    rig.transport.op_seconds = 0.01
    disabled = [f"e{i}" for i in range(8)]
    for entity in disabled:
        rig.transport.fail(lambda: sbe.MessagingEntityDisabledError(), namespace=PRIMARY, entity=entity)
    batch = [m for e in [*disabled, "ok"] for m in msgs(3, prefix=f"{e}-", entity=e)]
    start = rig.clock.monotonic()
    out = rig.sender.send(batch)
    took = rig.clock.monotonic() - start
    assert out.sent == {"ok": 3}
    assert out.diverted_by_entity == {e: 3 for e in disabled}
    assert 10.0 <= took < 11.0, took  # one interval (and a few calls), not 8 x 10 s
    assert all(rig.sender.entity_state(e) is EntityState.FAILED_OVER for e in disabled)
    assert rig.sender.entity_state("ok") is H


def test_a_namespace_down_is_not_tried_once_per_entity_while_the_batches_wait() -> None:
    """The primary namespace refuses (namespace-wide evidence): the call's last batches wait together for its
    failover, and the dead namespace is tried by one entity at a time, not by each of 50 (SPEC F4)."""
    rig = Rig(failover_interval=10.0)
    rig.transport.op_seconds = 0.01
    rig.transport.fail(conn_error, namespace=PRIMARY)
    entities = [f"e{i}" for i in range(50)]
    out = rig.sender.send([m for e in entities for m in msgs(2, prefix=f"{e}-", entity=e)])
    assert out.diverted_by_entity == {e: 2 for e in entities} and out.total_sent == 0
    tries = [t for op, t, _ in rig.transport.timeouts if op == "send" and t.namespace == PRIMARY]
    assert len(tries) <= 10, f"{len(tries)} sends to a dead namespace for 50 entities"
