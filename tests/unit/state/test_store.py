"""The in-memory state store, and the Delta store's table names, conflicts and retries, without Spark (SPEC S4-S6).

:class:`StoreContract` is the one test mixin every :class:`~spark_sb.state.store.StateStore` runs (STYLE item 4):
here against :class:`MemoryStateStore`, in ``tests/spark/test_state_delta.py`` against the Delta store. Planning,
records and the state writer are tested in ``test_planning.py``, ``test_records.py`` and ``test_writer.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from spark_sb.state.delta import StateTables, is_conflict
from spark_sb.state.store import MemoryStateStore
from tests.unit.state.store_contract import StoreContract


class TestMemoryStore(StoreContract):
    @pytest.fixture(autouse=True)
    def _store(self) -> None:
        self.store = MemoryStateStore()


def test_state_tables_names_and_conflicts() -> None:
    assert StateTables(location="/x/state/").sql_name("events") == "delta.`/x/state/events`"
    assert StateTables(prefix="main.ops.sb_").sql_name("entities") == "main.ops.sb_entities"
    with pytest.raises(ValueError, match="exactly one"):
        StateTables()
    assert is_conflict(RuntimeError("[DELTA_CONCURRENT_APPEND] ConcurrentAppendException: files were added"))
    assert not is_conflict(RuntimeError("[PATH_NOT_FOUND] no such path"))
    # another query's half-made table: retried while creating tables, an error for an append
    race = RuntimeError("[DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION] Cannot create table ... is not empty")
    assert is_conflict(race, creating=True)
    assert not is_conflict(race)


def test_delta_writes_retry_conflicts_with_other_writers_and_nothing_else() -> None:
    from spark_sb.state.delta import DeltaStateStore

    waits: list[float] = []
    store = DeltaStateStore(None, StateTables(location="/x"), attempts=4, backoff=0.1, sleep=waits.append)  # type: ignore[arg-type]
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("[DELTA_CONCURRENT_APPEND] ConcurrentAppendException: Files were added")
        return "done"

    assert store._retry("events", flaky) == "done"
    assert len(calls) == 3 and waits == [0.1, 0.2]

    def always() -> None:
        raise RuntimeError("ConcurrentTransactionException")

    with pytest.raises(RuntimeError, match="ConcurrentTransaction"):
        store._retry("events", always)
    assert len(waits) == 2 + 3  # gave up after `attempts`

    def broken() -> None:
        calls.append(1)
        raise RuntimeError("[PATH_NOT_FOUND] gone")

    before = len(calls)
    with pytest.raises(RuntimeError, match="PATH_NOT_FOUND"):
        store._retry("events", broken)
    assert len(calls) == before + 1  # not a conflict: not retried


def test_creating_the_tables_waits_out_another_writer_creating_them() -> None:
    """Two queries sharing a state location start together: one finds the other's table folder without its first
    commit yet. ensure() retries that; an append never does."""
    from spark_sb.state.delta import DeltaStateStore

    statements: list[str] = []

    class Result:
        def collect(self) -> list[Any]:
            return []

    class Spark:
        def sql(self, sql: str) -> Result:
            statements.append(sql)
            if len(statements) < 3:
                raise RuntimeError("[DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION] location is not empty")
            return Result()

    waits: list[float] = []
    store = DeltaStateStore(Spark(), StateTables(location="/x"), backoff=0.1, sleep=waits.append)  # type: ignore[arg-type]
    store.ensure()
    assert waits == [0.1, 0.2]
    assert len(statements) == 2 + 3 and all("CREATE TABLE IF NOT EXISTS" in s for s in statements)
