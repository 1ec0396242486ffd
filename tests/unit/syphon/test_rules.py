"""The syphon's per-message decision (B9): remaining TTL, scheduled time, expiry, non-backlog messages."""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from spark_sb.message.backlog import to_backlog
from spark_sb.message.outbound import OutboundMessage
from spark_sb.syphon.rules import (
    EXPIRED_IN_BACKLOG,
    NOT_A_BACKLOG_MESSAGE,
    SyphonOutcome,
    restore_for_primary,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def _backlogged(msg: OutboundMessage, entity: str = "orders", at: datetime = T0) -> OutboundMessage:
    return to_backlog(msg, entity, at)


def test_restores_entity_and_properties() -> None:
    original = OutboundMessage(
        body=b"x", message_id="m1", session_id="s1", partition_key="s1", properties={"k": 1}, subject="sub"
    )
    restored, reason = restore_for_primary(_backlogged(original), T0 + timedelta(seconds=5))
    assert reason is None and restored is not None
    assert restored.entity == "orders"
    assert (restored.session_id, restored.partition_key, restored.message_id) == ("s1", "s1", "m1")
    assert dict(restored.properties) == {"k": 1}


def test_remaining_ttl_is_original_minus_time_in_backlog() -> None:
    original = OutboundMessage(body="x", time_to_live=timedelta(minutes=10))
    restored, _ = restore_for_primary(_backlogged(original), T0 + timedelta(minutes=4))
    assert restored is not None and restored.time_to_live == timedelta(minutes=6)


@pytest.mark.parametrize("spent", [timedelta(minutes=10), timedelta(minutes=11)])
def test_expired_in_backlog_is_dead_lettered_not_forwarded(spent: timedelta) -> None:
    original = OutboundMessage(body="x", time_to_live=timedelta(minutes=10))
    restored, reason = restore_for_primary(_backlogged(original), T0 + spent)
    assert restored is None and reason == EXPIRED_IN_BACKLOG


def test_future_schedule_kept_past_schedule_cleared() -> None:
    future = OutboundMessage(body="x", scheduled_enqueue_time=T0 + timedelta(hours=1))
    restored, _ = restore_for_primary(_backlogged(future), T0 + timedelta(minutes=1))
    assert restored is not None and restored.scheduled_enqueue_time == T0 + timedelta(hours=1)
    restored, _ = restore_for_primary(_backlogged(future), T0 + timedelta(hours=2))
    assert restored is not None and restored.scheduled_enqueue_time is None


def test_message_without_backlog_path_is_rejected() -> None:
    restored, reason = restore_for_primary(OutboundMessage(body="stray"), T0)
    assert restored is None and reason == NOT_A_BACKLOG_MESSAGE


def test_outcome_merge_adds_counts_per_entity() -> None:
    a = SyphonOutcome(received=3, forwarded={"a": 2}, expired=1)
    b = SyphonOutcome(received=2, forwarded={"a": 1, "b": 1}, abandoned=1, errors=["e"])
    m = a.merge(b)
    assert (m.received, m.forwarded, m.expired, m.abandoned, m.errors) == (5, {"a": 3, "b": 1}, 1, 1, ["e"])
    assert m.forwarded_total == 4


def test_outcome_merge_merges_every_field_and_is_cancelled_if_either_was() -> None:
    ones: dict[str, Any] = {f.name: 1 for f in fields(SyphonOutcome) if f.type in ("int", int)}  # the counts
    a = SyphonOutcome(
        **ones, forwarded={"a": 1}, expired_by_entity={"a": 1}, abandoned_by_entity={"b": 1}, errors=["x"]
    )
    a.moved_ids.append(("a", "1"))
    b = SyphonOutcome(
        **ones, forwarded={"a": 1, "c": 1}, cancelled=True, errors=["y"], moved_ids=[("a", "2")]
    )
    m = a.merge(b)
    assert {name: getattr(m, name) for name in ones} == {name: 2 for name in ones} and len(ones) >= 11
    assert (m.forwarded, m.expired_by_entity, m.abandoned_by_entity) == ({"a": 2, "c": 1}, {"a": 1}, {"b": 1})
    assert (m.errors, m.moved_ids, m.cancelled) == (["x", "y"], [("a", "1"), ("a", "2")], True)
    assert not a.merge(SyphonOutcome()).cancelled


def test_token_expired_tells_an_expired_token_from_other_refusals() -> None:
    from azure.servicebus.exceptions import ServiceBusAuthenticationError, ServiceBusConnectionError

    from spark_sb.core.errors import token_expired

    class TokenExpired(Exception):  # pyamqp's, by name
        pass

    wrapped = ServiceBusAuthenticationError(message="CBS Authentication Expired.")
    wrapped.__cause__ = TokenExpired("CBS Authentication Expired.")
    assert token_expired(wrapped)
    assert token_expired(
        ServiceBusConnectionError(message="amqp:unauthorized-access: ExpiredToken: the token is expired")
    )
    assert not token_expired(
        ServiceBusAuthenticationError(message="InvalidSignature: the token has an invalid signature")
    )
    assert not token_expired(ServiceBusConnectionError(message="connection refused"))
