"""The failover records (spark_sb.failover.records): the entity states as text, pickling of the records, and the
default listeners :func:`log_transition` (one line per change, its level by direction) and :func:`log_transitions`
(one line per kind of change, bounded by the kinds, not the entities), both redacting secrets."""

from __future__ import annotations

import logging
import pickle
from datetime import datetime, timezone

import pytest

from servicebus_local.clock import FakeClock
from spark_sb.core.errors import CONNECTION
from spark_sb.failover.records import (
    BacklogPull,
    EntityState,
    EntityStatus,
    StateTransition,
    log_transition,
    log_transitions,
    redacted,
)
from tests.unit.failover.test_machine import machine
from tests.unit.sender.rig import SECRET, make_config

H, F, FO = EntityState.HEALTHY, EntityState.FAILING, EntityState.FAILED_OVER
T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)
LOGGER = "spark_sb.failover.records"


def test_records_are_picklable() -> None:
    clock = FakeClock()
    m = machine(clock, interval=0.0)
    t = m.record_failure(CONNECTION, "x")
    assert pickle.loads(pickle.dumps(t)) == t
    assert pickle.loads(pickle.dumps(m.status())) == m.status()


def test_a_backlog_pull_and_a_status_survive_pickling_whole() -> None:
    pull = BacklogPull("sec", "q0", T0, T0, "timeout", "slow")
    status = EntityStatus("ns", "orders", FO, T0, T0, "timeout", accepted=False)
    assert pickle.loads(pickle.dumps(pull)) == pull
    assert pickle.loads(pickle.dumps(status)) == status


def test_an_entity_state_reads_as_its_table_value() -> None:
    assert [str(s) for s in EntityState] == ["healthy", "failing", "failed_over"]
    assert f"{FO}" == "failed_over"
    assert EntityState("failed_over") is FO and FO == "failed_over"


@pytest.mark.parametrize(
    ("to_state", "level"),
    [(H, logging.INFO), (F, logging.WARNING), (FO, logging.WARNING)],
)
def test_a_transition_is_logged_as_a_warning_unless_it_is_back_to_healthy(
    to_state: EntityState, level: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    log_transition(StateTransition("orders", F, to_state, T0, "timeout", "no answer"))
    (record,) = caplog.records
    assert record.levelno == level
    assert record.getMessage() == f"entity 'orders': failing -> {to_state.value} (timeout: no answer)"


def test_a_transition_without_an_error_or_detail_says_ok(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    log_transition(StateTransition("orders", FO, H, T0))
    assert [r.getMessage() for r in caplog.records] == ["entity 'orders': failed_over -> healthy (ok)"]


def test_a_secret_in_a_transition_detail_is_never_logged(caplog: pytest.LogCaptureFixture) -> None:
    make_config()  # registers the config's secrets with the redaction
    caplog.set_level(logging.INFO, logger=LOGGER)
    detail = f"SharedAccessKey={SECRET} refused"
    log_transition(StateTransition("orders", H, F, T0, "unauthorized", detail))
    log_transitions([StateTransition(e, H, F, T0, "unauthorized", detail) for e in ("a", "b")])
    assert len(caplog.records) == 2
    assert all(SECRET not in r.getMessage() and "refused" in r.getMessage() for r in caplog.records)
    assert SECRET not in redacted(detail) and "refused" in redacted(detail)


def test_transitions_of_one_kind_are_one_line_naming_the_first_entities(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    outage = [StateTransition(f"e{i}", H, F, T0, "connection", "refused") for i in range(1000)]
    back = [StateTransition(e, FO, H, T0) for e in ("x", "y")]
    log_transitions([*outage, *back], named=3)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            logging.WARNING,
            "1000 entities ('e0', 'e1', 'e2' and 997 more): healthy -> failing (connection: refused)",
        ),
        (logging.INFO, "2 entities ('x', 'y'): failed_over -> healthy (ok)"),
    ]


def test_a_kind_of_change_that_one_entity_made_is_logged_as_that_entitys_transition(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    log_transitions(
        [
            StateTransition("orders", H, F, T0, "timeout", "slow"),
            StateTransition("audit", H, F, T0, "timeout", "other detail"),  # another kind: the detail differs
        ]
    )
    assert [r.getMessage() for r in caplog.records] == [
        "entity 'orders': healthy -> failing (timeout: slow)",
        "entity 'audit': healthy -> failing (timeout: other detail)",
    ]
    caplog.clear()
    log_transitions([])
    assert caplog.records == []
