"""What one send call did (:mod:`spark_sb.failover.outcome`): the tally built during the call, the frozen outcome it
becomes, how outcomes add up, and the secret-free naming of namespaces and rejected messages (SPEC B3, B7, B8, S6)."""

from __future__ import annotations

import dataclasses
import json
import pickle
from datetime import datetime, timedelta, timezone

import pytest

from spark_sb.config.namespace import CredentialConfig, NamespaceConfig
from spark_sb.config.secret import Secret
from spark_sb.failover.outcome import (
    ProbeRecord,
    SendOutcome,
    Tally,
    message_row,
    namespace_description,
    namespace_key,
)
from spark_sb.failover.records import BacklogPull, EntityState, StateTransition
from spark_sb.message.outbound import OutboundMessage, Reject
from spark_sb.message.rows import row_to_json

T0 = datetime(2026, 5, 1, 9, 30, tzinfo=timezone.utc)
KEY = "OutcomeTestKey0123456789abcdefXYZ="
SIG = "OutcomeTestSignature0123456789abc"
CLIENT_SECRET = "Outcome~Client~Secret~42"


def _transition(entity: str, to: EntityState = EntityState.FAILING) -> StateTransition:
    return StateTransition(entity, EntityState.HEALTHY, to, T0, "timeout", "no answer", "ns.example")


def _probe(entity: str, ok: bool = True) -> ProbeRecord:
    return ProbeRecord(
        entity, "schedule-cancel", T0, ok, sequence_number=7, cancel_attempts=1, cancel_ok=True
    )


def _pull(queue: str) -> BacklogPull:
    return BacklogPull("ns", queue, T0, T0 + timedelta(minutes=2), "quota_exceeded", "full")


def _reject(entity: str) -> Reject:
    return Reject("message too large", None, '{"body": "x"}', entity, 3)


# --------------------------------------------------------------------------------------------------- Tally
def test_a_tally_adds_up_what_each_entity_sent_over_the_call() -> None:
    tally = Tally()
    tally.count_sent("orders", 3)
    tally.count_sent("invoices", 1)
    tally.count_sent("orders", 2)
    outcome = tally.build(elapsed=1.5)
    assert outcome.sent == {"orders": 5, "invoices": 1}
    assert outcome.total_sent == 6
    assert outcome.elapsed == 1.5


def test_diverted_messages_are_counted_per_backlog_queue_and_per_original_entity() -> None:
    tally = Tally()
    tally.count_diverted("ns/x-servicebus-transfer/0", 3, ["orders", "orders", "invoices"])
    tally.count_diverted("ns/x-servicebus-transfer/1", 1, ["invoices"])
    tally.count_diverted("ns/x-servicebus-transfer/0", 2, ["refunds", "orders"])
    outcome = tally.build(0.0)
    assert outcome.diverted == {"ns/x-servicebus-transfer/0": 5, "ns/x-servicebus-transfer/1": 1}
    assert outcome.diverted_by_entity == {"orders": 3, "invoices": 2, "refunds": 1}
    # the two views count the same messages
    assert outcome.total_diverted == sum(outcome.diverted_by_entity.values()) == 6
    assert outcome.sent == {}


def test_the_built_outcome_holds_every_record_of_the_tally_in_order() -> None:
    tally = Tally()
    tally.rejects += [_reject("a"), _reject("b")]
    tally.transitions += [_transition("a"), _transition("b", EntityState.FAILED_OVER)]
    tally.probes.append(_probe("a"))
    tally.pulls.append(_pull("q0"))
    tally.retries = 4
    tally.throttled["a"] = 0.75
    outcome = tally.build(2.0)
    assert [r.entity for r in outcome.rejects] == ["a", "b"]
    assert outcome.total_rejected == 2
    assert [(t.entity, t.to_state) for t in outcome.transitions] == [
        ("a", EntityState.FAILING),
        ("b", EntityState.FAILED_OVER),
    ]
    assert outcome.probes == (_probe("a"),)
    assert outcome.pulls == (_pull("q0"),)
    assert (outcome.retries, outcome.throttled) == (4, {"a": 0.75})
    # records become tuples: the outcome is immutable and hashable in its records
    assert isinstance(outcome.rejects, tuple) and isinstance(outcome.transitions, tuple)


def test_a_built_outcome_does_not_change_when_the_tally_goes_on() -> None:
    tally = Tally()
    tally.count_sent("orders", 1)
    tally.count_diverted("q0", 1, ["orders"])
    tally.rejects.append(_reject("orders"))
    tally.throttled["orders"] = 1.0
    first = tally.build(1.0)
    tally.count_sent("orders", 10)
    tally.count_diverted("q0", 1, ["orders"])
    tally.rejects.append(_reject("orders"))
    tally.throttled["orders"] = 9.0
    assert (first.sent, first.diverted, first.diverted_by_entity) == ({"orders": 1}, {"q0": 1}, {"orders": 1})
    assert (first.total_rejected, first.throttled) == (1, {"orders": 1.0})


def test_an_empty_tally_builds_an_empty_outcome() -> None:
    assert Tally().build(0.0) == SendOutcome()
    empty = SendOutcome()
    assert (empty.total_sent, empty.total_diverted, empty.total_rejected) == (0, 0, 0)


# ----------------------------------------------------------------------------------------------- SendOutcome
def test_merging_outcomes_adds_counts_per_key_and_concatenates_records() -> None:
    a = SendOutcome(
        sent={"orders": 2},
        diverted={"q0": 1},
        diverted_by_entity={"orders": 1},
        rejects=(_reject("orders"),),
        transitions=(_transition("orders"),),
        probes=(_probe("orders"),),
        pulls=(_pull("q0"),),
        retries=1,
        elapsed=0.5,
        throttled={"orders": 0.25},
    )
    b = SendOutcome(
        sent={"orders": 3, "invoices": 4},
        diverted={"q1": 2},
        diverted_by_entity={"orders": 1, "invoices": 1},
        rejects=(_reject("invoices"),),
        transitions=(_transition("invoices"),),
        probes=(_probe("invoices", ok=False),),
        pulls=(_pull("q1"),),
        retries=2,
        elapsed=1.25,
        throttled={"orders": 0.5, "invoices": 1.0},
    )
    m = a.merge(b)
    assert m.sent == {"orders": 5, "invoices": 4}
    assert m.diverted == {"q0": 1, "q1": 2}
    assert m.diverted_by_entity == {"orders": 2, "invoices": 1}
    assert [r.entity for r in m.rejects] == ["orders", "invoices"]
    assert [t.entity for t in m.transitions] == ["orders", "invoices"]
    assert [(p.entity, p.ok) for p in m.probes] == [("orders", True), ("invoices", False)]
    assert [p.queue for p in m.pulls] == ["q0", "q1"]
    assert (m.retries, m.elapsed) == (3, 1.75)
    assert m.throttled == {"orders": 0.75, "invoices": 1.0}
    assert (m.total_sent, m.total_diverted, m.total_rejected) == (9, 3, 2)
    # the operands are left alone
    assert a.sent == {"orders": 2} and b.sent == {"orders": 3, "invoices": 4}


def test_merging_with_an_empty_outcome_changes_nothing() -> None:
    a = SendOutcome(sent={"orders": 2}, rejects=(_reject("orders"),), retries=1, elapsed=0.5)
    assert a.merge(SendOutcome()) == a
    assert SendOutcome().merge(a) == a


def test_an_outcome_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        SendOutcome().retries = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        _probe("a").ok = False  # type: ignore[misc]


def test_outcomes_and_their_records_survive_pickling() -> None:
    """They travel from executors to the driver in the partition result."""
    outcome = SendOutcome(
        sent={"orders": 2},
        diverted={"q0": 1},
        diverted_by_entity={"orders": 1},
        rejects=(_reject("orders"),),
        transitions=(_transition("orders", EntityState.FAILED_OVER),),
        probes=(_probe("orders"), ProbeRecord("orders", "ping", T0, False, "timeout", "no answer")),
        pulls=(_pull("q0"),),
        retries=2,
        elapsed=3.5,
        throttled={"orders": 0.5},
    )
    back = pickle.loads(pickle.dumps(outcome))
    assert back == outcome
    assert back.transitions[0].to_state is EntityState.FAILED_OVER
    assert back.probes[1].error_class == "timeout" and back.probes[1].at == T0


def test_a_probe_record_without_a_cancel_says_so() -> None:
    record = ProbeRecord("orders", "ping", T0, True)
    assert (record.error_class, record.detail, record.sequence_number) == (None, "", None)
    assert (record.cancel_attempts, record.cancel_ok) == (0, None)


# -------------------------------------------------------------------------------------- naming namespaces
def _cs(host: str, extra: str = "") -> Secret:
    return Secret(
        f"Endpoint=sb://{host}/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={KEY}{extra}"
    )


def test_a_namespace_is_keyed_by_its_host_and_port_whatever_the_auth() -> None:
    by_key = NamespaceConfig(connection_string=_cs("contoso.servicebus.windows.net"))
    by_credential = NamespaceConfig(
        fully_qualified_namespace="sb://contoso.servicebus.windows.net/", credential=CredentialConfig()
    )
    assert namespace_key(by_key) == namespace_key(by_credential) == "contoso.servicebus.windows.net"
    local = NamespaceConfig(connection_string=_cs("127.0.0.1:5671"))
    other_port = NamespaceConfig(connection_string=_cs("127.0.0.1:5682"))
    assert namespace_key(local) == "127.0.0.1:5671"
    assert namespace_key(local) != namespace_key(other_port)
    assert KEY not in namespace_key(local)


def test_a_namespace_description_names_the_host_and_key_name_never_the_key() -> None:
    ns = NamespaceConfig(connection_string=_cs("127.0.0.1:5671", ";UseDevelopmentEmulator=true"))
    text = namespace_description(ns)
    assert text == "sb://127.0.0.1:5671 (SAS key name RootManageSharedAccessKey, development emulator)"
    assert KEY not in text


def test_a_namespace_description_with_a_sas_token_never_shows_the_token() -> None:
    sas = f"Endpoint=sb://ns.servicebus.windows.net/;SharedAccessSignature=SharedAccessSignature sr=a&sig={SIG}&se=1"
    text = namespace_description(NamespaceConfig(connection_string=Secret(sas)))
    assert text == "sb://ns.servicebus.windows.net (SAS token)"
    assert SIG not in text


def test_a_namespace_description_with_a_credential_names_the_client_never_its_secret() -> None:
    credential = CredentialConfig("client_secret", "tenant-1", "client-1", Secret(CLIENT_SECRET))
    ns = NamespaceConfig(fully_qualified_namespace="contoso.servicebus.windows.net", credential=credential)
    text = namespace_description(ns)
    assert text == "sb://contoso.servicebus.windows.net (credential client_secret, client id client-1)"
    assert CLIENT_SECRET not in text


def test_a_namespace_with_an_invalid_connection_string_is_described_without_its_secret() -> None:
    """Error texts name the namespace; a connection string that does not parse must not turn the description
    itself into an error (nor show the key)."""
    broken = NamespaceConfig(connection_string=Secret(f"Endpoint=sb://broken.example/;SharedAccessKey={KEY}"))
    text = namespace_description(broken)
    assert "invalid connection string" in text
    assert KEY not in text


# ------------------------------------------------------------------------------------------- message_row
def test_a_message_row_has_every_field_of_the_message() -> None:
    msg = OutboundMessage(
        body=b"\x00payload",
        entity="orders",
        message_id="m-1",
        session_id="s-1",
        subject="created",
        time_to_live=timedelta(seconds=30),
        scheduled_enqueue_time=T0,
        properties={"tenant": "t1", "attempt": 2},
    )
    row = message_row(msg)
    assert set(row) == {f.name for f in dataclasses.fields(OutboundMessage)}
    assert (row["body"], row["entity"], row["message_id"], row["session_id"]) == (
        b"\x00payload",
        "orders",
        "m-1",
        "s-1",
    )
    assert (row["time_to_live"], row["scheduled_enqueue_time"]) == (timedelta(seconds=30), T0)
    assert row["correlation_id"] is None


def test_a_message_rows_properties_are_a_plain_dict_so_the_rejects_table_gets_them_as_json() -> None:
    msg = OutboundMessage(body="x", entity="orders", properties={"tenant": "t1", "attempt": 2})
    row = message_row(msg)
    assert type(row["properties"]) is dict
    row["properties"]["tenant"] = "changed"
    assert msg.properties["tenant"] == "t1"  # the message is not touched through its row
    as_json = json.loads(row_to_json(message_row(msg)))  # what a Reject's row_json holds
    assert as_json["properties"] == {"tenant": "t1", "attempt": 2}
    assert (as_json["body"], as_json["entity"]) == ("x", "orders")
