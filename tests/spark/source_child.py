"""A ``format("servicebus")`` stream into Delta, run by ``tests/spark/test_source_kills.py``,
``tests/spark/test_source_connect.py`` in a child process (a session of its own)
that the source's fault hook (:mod:`spark_sb.source.faults`) may SIGKILL, driver and all.

The namespace lives in the parent; the child reads its entity with a ``foreachBatch`` that appends each batch to
a Delta table with ``txnAppId``/``txnVersion`` (a replayed batch is skipped), then calls the hook's point ``sink``
(A1's point 5: after the sink commit, before the commit log). It streams (``processingTime`` 0 s: 4.0/4.1 have no
AvailableNow) until the entity is empty - every message read and settled - or ``timeout`` s pass, then stops the
query and prints a JSON report on its last line. Killed, it prints nothing. Below :func:`main`: the parent's side
(the entity, :func:`run_child`, the numbers checked after), for those tests.

Usage: ``python tests/spark/source_child.py '<json>'`` with keys ``cs``, ``entity``, ``work`` (the Delta table is
``work/out``, the checkpoint ``work/ckpt``), ``options`` (more reader options), ``master`` (classic, default
``local[2]``) or ``connect: true`` (``remote("local[2]")``), ``timeout``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any


def _classic(master: str) -> Any:
    from spark_sb.spark.session import build_spark_session

    spark = build_spark_session("source-kills", master, {"spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _connect() -> Any:
    from tests.spark.connect_stream import _session

    return _session()


def _entity_empty(cs: str, entity: str) -> bool:
    """Nothing on the entity (peek shows active, locked, deferred and scheduled messages)."""
    from azure.servicebus import ServiceBusClient

    with ServiceBusClient.from_connection_string(cs) as client, client.get_queue_receiver(entity) as receiver:
        return not receiver.peek_messages(max_message_count=1, sequence_number=0, timeout=10)


def main(spec: dict[str, Any]) -> dict[str, Any]:
    if os.environ.get("SPARK_SB_SOURCE_FAULT") and "SPARK_SB_SOURCE_FAULT_GROUP" not in os.environ:
        assert os.getsid(0) == os.getpid(), (
            "the fault hook kills this group: start this in a session of its own"
        )
        os.environ["SPARK_SB_SOURCE_FAULT_GROUP"] = str(os.getpgid(0))  # inherited by the JVM and its Pythons
    from spark_sb import register
    from spark_sb.source.faults import fault

    started = time.monotonic()
    spark = _connect() if spec.get("connect") else _classic(spec.get("master", "local[2]"))
    register(spark)
    out, ckpt = str(Path(spec["work"]) / "out"), str(Path(spec["work"]) / "ckpt")
    app = spec.get("app", "source-kills")  # txnAppId: a new checkpoint needs a new one
    reader = (
        spark.readStream.format("servicebus")
        .option("primary.connection_string", spec["cs"])
        .option("entity", spec["entity"])
    )
    for key, value in spec.get("options", {}).items():
        reader = reader.option(key, value)

    def each_batch(batch_df: Any, batch_id: int) -> None:
        (
            batch_df.write.format("delta")
            .mode("append")
            .option("txnAppId", app)
            .option("txnVersion", batch_id)
            .save(out)
        )
        fault("sink")

    query = (
        reader.load()
        .writeStream.foreachBatch(each_batch)
        .option("checkpointLocation", ckpt)
        .trigger(processingTime="0 seconds")
        .start()
    )
    ready = time.monotonic()
    deadline = started + float(spec.get("timeout", 300))
    empty = False
    while time.monotonic() < deadline:
        if query.awaitTermination(1.0):  # the wait: the query ended (an error) or 1 s passed
            break
        if _entity_empty(spec["cs"], spec["entity"]):
            empty = True
            break
    query.stop()
    error = query.exception()
    report = {
        "empty": empty,
        "error": None if error is None else str(error)[:3000],
        "start_seconds": round(ready - started, 1),
        "seconds": round(time.monotonic() - started, 1),
    }
    spark.stop()
    return report


# -- the parent's side: in the test (or bench) process, which holds the local namespace -------------------------
CHILD = Path(__file__)
ROOT = CHILD.resolve().parents[2]
#: The entities' lock duration: a lock left by a killed driver lapses within this (SOURCE.md §13 says 30 s for
#: the full matrix; the bench uses that).
LOCK = timedelta(seconds=5)


def make_entity(ns: Any, entity: str, n: int, lock: timedelta = LOCK) -> None:
    """Queue ``entity`` on the local namespace ``ns`` (lock ``lock``) with ``n`` messages, ids ``m0`` ..."""
    from servicebus_local.model import QueueSettings

    ns.broker.create_queue(entity, QueueSettings(lock_duration=lock))
    send(ns, entity, 0, n)


def send(ns: Any, entity: str, first: int, n: int) -> None:
    """``n`` messages to ``entity``, ids ``m{first}`` ... (unique), 500 a call."""
    from azure.servicebus import ServiceBusClient, ServiceBusMessage

    with (
        ServiceBusClient.from_connection_string(ns.connection_string) as client,
        client.get_queue_sender(entity) as sender,
    ):
        for lo in range(first, first + n, 500):
            batch = [
                ServiceBusMessage(f"b{i}", message_id=f"m{i}") for i in range(lo, min(first + n, lo + 500))
            ]
            sender.send_messages(batch, timeout=30)


@dataclass
class Run:
    """One child run: its exit code (``-9``: killed), its report (None when killed), its stderr."""

    returncode: int
    report: dict[str, Any] | None
    stderr: str
    kills: list[str]

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL


def run_child(
    spec: dict[str, Any], work: Path, fault: str | None = None, *, group: bool = True, timeout: float = 600
) -> Run:
    """``source_child.py`` with ``spec`` in a session of its own, the fault hook set to ``fault`` (killing the
    child's process group, or with ``group=False`` only the process that reaches the point), its kills recorded
    in a file of its own in ``work``. The group is killed after, whatever happened (nothing of a killed run
    outlives it)."""
    work.mkdir(parents=True, exist_ok=True)
    mark = work / f"kills-{len(list(work.glob('kills-*')))}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "PYTHONFAULTHANDLER": "1",
    }
    for key in ("SPARK_SB_SOURCE_FAULT", "SPARK_SB_SOURCE_FAULT_GROUP", "SPARK_SB_SOURCE_FAULT_MARK"):
        env.pop(key, None)
    if fault:
        env.update({"SPARK_SB_SOURCE_FAULT": fault, "SPARK_SB_SOURCE_FAULT_MARK": str(mark)})
        if not group:
            env["SPARK_SB_SOURCE_FAULT_GROUP"] = ""  # the child sets none: each point kills its own process
    child = subprocess.Popen(
        [sys.executable, str(CHILD), json.dumps(spec)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGABRT)  # Python's fault handler prints the stacks
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.communicate(timeout=30)
        raise AssertionError(f"the child ran past {timeout:.0f} s") from None
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
        if child.poll() is None:
            child.wait()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    kills = mark.read_text().split() if mark.exists() else []
    return Run(child.returncode, json.loads(lines[-1]) if lines else None, err, kills)


def entity_left(ns: Any, entity: str) -> dict[str, int]:
    """What is on ``entity``: active (locked included), deferred and dead-lettered messages, by peek and the
    admin counts."""
    from azure.servicebus import ServiceBusClient, ServiceBusMessageState

    states = {"active": 0, "deferred": 0}
    with (
        ServiceBusClient.from_connection_string(ns.connection_string) as client,
        client.get_queue_receiver(entity) as receiver,
    ):
        seq = 0
        while got := receiver.peek_messages(max_message_count=250, sequence_number=seq, timeout=10):
            for m in got:
                states["deferred" if m.state == ServiceBusMessageState.DEFERRED else "active"] += 1
            seq = int(got[-1].sequence_number or 0) + 1
    states["dead_lettered"] = ns.broker.counts(entity).dead_letter_message_count
    return states


def delta_numbers(out: Path) -> dict[str, int]:
    """The Delta table's rows, distinct message ids and highest delivery count."""
    from deltalake import DeltaTable

    if not (out / "_delta_log").exists():
        return {"rows": 0, "distinct": 0, "max_delivery_count": 0}
    table = DeltaTable(str(out)).to_pyarrow_table(columns=["message_id", "delivery_count"]).to_pydict()
    ids, counts = table["message_id"], table["delivery_count"]
    return {"rows": len(ids), "distinct": len(set(ids)), "max_delivery_count": max(counts, default=0)}


def drain(spec: dict[str, Any], work: Path, runs: int = 3, timeout: float = 600) -> list[Run]:
    """Restart ``spec`` on its checkpoint, no fault, until a run reports the entity empty (at most ``runs``)."""
    done: list[Run] = []
    for _ in range(runs):
        run = run_child(spec, work, timeout=timeout)
        done.append(run)
        assert run.report is not None, f"the draining run failed ({run.returncode}):\n{run.stderr[-4000:]}"
        assert run.report["error"] is None, run.report["error"]
        if run.report["empty"]:
            break
    return done


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
