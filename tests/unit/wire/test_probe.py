"""One probe of a primary entity, the same for a sender's Prober and the syphon (spark_sb.wire.probe.probe_call)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import datetime, timezone

import pytest
from azure.servicebus import exceptions as sbe

from servicebus_local.clock import FakeClock
from spark_sb.core.errors import ErrorClass
from spark_sb.message.backlog import PROBE_SCHEDULE_AHEAD, is_probe
from spark_sb.wire.probe import probe_call, single_attempt
from spark_sb.wire.transport import PRIMARY, Target
from tests.unit.fakes import FakeTransport

TARGET = Target(PRIMARY, "orders")
AT = datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_a_ping_probe_sends_one_probe_message_within_the_budget() -> None:
    transport = FakeTransport(FakeClock())
    probed = probe_call(transport, TARGET, "ping", 1.5, single_attempt(1.5), AT)
    sent = transport.delivered[TARGET]
    assert len(sent) == 1 and is_probe(sent[0].to_sdk())
    assert probed.sequence_number is None and probed.cancel_ok is None
    assert transport.timeouts == [("send", TARGET, 1.5)]


def test_a_schedule_probe_schedules_far_ahead_on_the_real_clock_and_cancels_it() -> None:
    transport = FakeTransport(FakeClock())
    probed = probe_call(transport, TARGET, "schedule-cancel", 2.0, single_attempt(2.0), AT)
    assert probed.cancel_ok is True and probed.cancel_attempts == 1 and probed.detail == ""
    assert transport.cancelled == [(TARGET, probed.sequence_number)]
    assert transport.scheduled[TARGET] == {}  # nothing stays scheduled
    assert [op for op, _, _ in transport.timeouts] == ["schedule", "cancel"]


def test_a_cancel_that_fails_is_still_an_answer_and_says_why() -> None:
    transport = FakeTransport(FakeClock())
    transport.fail(lambda: sbe.ServiceBusConnectionError(message="dropped"), op="cancel")
    probed = probe_call(transport, TARGET, "schedule-cancel", 2.0, single_attempt(2.0), AT)
    assert probed.cancel_ok is False and probed.cancel_attempts == 1
    assert "cancel failed" in probed.detail
    assert probed.sequence_number in transport.scheduled[TARGET]  # left scheduled (marked, 1 s TTL)


def twice(call: Callable[[float], object], target: Target) -> tuple[ErrorClass | None, BaseException | None]:
    """A retry loop that makes the cancel twice (the first answer was lost) and returns the second's error."""
    with contextlib.suppress(Exception):
        call(1.0)
    return single_attempt(1.0)(call, target)


def test_message_not_found_is_a_cancelled_probe_only_on_a_retried_cancel() -> None:
    transport = FakeTransport(FakeClock())
    transport.fail(lambda: sbe.MessageNotFoundError(message="gone"), op="cancel")
    first = probe_call(transport, TARGET, "schedule-cancel", 2.0, single_attempt(2.0), AT)
    assert first.cancel_ok is False and first.cancel_attempts == 1  # on the first try: not cancelled by us
    transport.rules.clear()
    transport.fail(lambda: sbe.MessageNotFoundError(message="gone"), op="cancel", skip=1)
    retried = probe_call(transport, TARGET, "schedule-cancel", 2.0, twice, AT)
    assert retried.cancel_ok is True and retried.cancel_attempts == 2  # an earlier cancel went through


def test_an_entity_that_does_not_answer_raises_what_the_probe_met() -> None:
    transport = FakeTransport(FakeClock())
    transport.fail(lambda: sbe.ServiceBusConnectionError(message="refused"), op="schedule")
    with pytest.raises(sbe.ServiceBusConnectionError):
        probe_call(transport, TARGET, "schedule-cancel", 2.0, single_attempt(2.0), AT)
    assert transport.cancelled == []


def test_the_schedule_time_is_ahead_of_the_real_clock_whatever_the_injected_time() -> None:
    transport = FakeTransport(FakeClock())
    before = datetime.now(timezone.utc)
    transport.fail(lambda: sbe.ServiceBusConnectionError(message="dropped"), op="cancel")  # so it stays
    probed = probe_call(transport, TARGET, "schedule-cancel", 2.0, single_attempt(2.0), AT)
    _, at = transport.scheduled[TARGET][probed.sequence_number or 0]
    assert at >= before + PROBE_SCHEDULE_AHEAD
