"""``ordering: session`` with the Spark sink and the syphon job (issue 31, setting a) on local Spark against two local
namespaces: the sink's stream and the syphon job run as two queries of one session (local[2]), coordinating only
through the namespaces and the Delta state tables (spark_sb/state/sessions.py).

20 session ids over two session-enabled primary queues with duplicate detection, rows repartitioned by session id
(the user's job), 12 micro-batches: the primary refuses connections over batches 3-6, one entity is stalled over
batches 8-9; the syphon job starts with the recovery (before batch 7), is stopped (its tasks killed) mid-drain
after batch 8 and started again from its checkpoint. Session receivers on the primary get, for every session, exactly the produced sequence. The same shape
with ``ordering: none`` and the syphon job held back until the primary is back shows sessions out of order.

What ``local-cluster[2,1,1024]`` would add: sink and syphon tasks in two executor JVMs. Their Python workers are
distinct processes here too (the handoff, not a shared registry, carries the held sessions either way), and the
Spark-free test of the handoff (tests/unit/spark/test_ordering.py) puts consecutive batches' tasks in two
"processes" on purpose. Slow: 217 s for the ordered run and 42 s for the control on a loaded 2-core machine (load 6; local[2] is shared by
the two queries, and each ordered micro-batch adds a Delta read of the acknowledgements and a write of the
sessions table while sessions are held).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusReceiveMode

from servicebus_local.model import QueueSettings
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.spark.sink import ServiceBusSink
from spark_sb.spark.syphon_job import run_syphon, stop_gracefully

pytestmark = pytest.mark.slow

ENTITIES = ("orders", "invoices")
QUEUES = [f"primary/x-servicebus-transfer/{i}" for i in range(3)]
SESSIONS = [f"s{i:02d}" for i in range(20)]
SCHEMA = "body STRING, message_id STRING, session_id STRING, entity STRING, seq BIGINT"
LOCK = 4  # the backlog queues' lock duration (s): the restarted syphon job waits it + 5 s


def entity_of(session: str) -> str:
    return ENTITIES[int(session[1:]) % 2]


@pytest.fixture
def pair(namespace_pair: Any) -> Any:
    for entity in ENTITIES:
        namespace_pair.primary.broker.create_queue(
            entity, QueueSettings(requires_session=True, requires_duplicate_detection=True)
        )
    for q in QUEUES:
        namespace_pair.secondary.broker.create_queue(
            q, QueueSettings(max_delivery_count=2147483647, lock_duration=timedelta(seconds=LOCK))
        )
    return namespace_pair


def config_for(pair: Any, ordering: str, state: Path) -> ServiceBusConfig:
    return ServiceBusConfig.from_dict(
        {
            "primary": {"connection_string": pair.primary.connection_string, "namespace_name": "primary"},
            "secondary": {"connection_string": pair.secondary.connection_string},
            "backlog_queue_count": len(QUEUES),
            "failover_interval": 0,
            "ping_primary_interval": "1s",
            "send_timeout": "2s",
            "retry": {"total": 0, "backoff_factor": 0.05, "backoff_max": 0.2},
            "ordering": ordering,
            "state_location": str(state),
            "syphon": {"batch_duration": "2s", "batch_size": 20},
        }
    )


class Stream:
    """The sink's stream (one JSON file a micro-batch, repartitioned by session id, row order kept by ``seq``) and
    the syphon job, both on ``spark``."""

    def __init__(self, spark: Any, pair: Any, ordering: str, tmp: Path) -> None:
        self.spark, self.pair = spark, pair
        self.config = config_for(pair, ordering, tmp / "state")
        self.folder = tmp / "in"
        self.folder.mkdir()
        self.syphon_checkpoint = str(tmp / "syphon-chk")
        self.syphon_stop = tmp / "syphon-stop"
        self.sink = ServiceBusSink(self.config)
        self.produced: dict[str, list[str]] = {s: [] for s in SESSIONS}
        self.seq = 0
        self.files = 0
        sink = self.sink

        def by_session(df: Any, batch_id: int) -> None:  # the user's code: partitioned by session id
            sink(df.repartition(2, "session_id").sortWithinPartitions("seq").drop("seq"), batch_id)

        self.query = (
            spark.readStream.schema(SCHEMA)
            .json(str(self.folder))
            .writeStream.foreachBatch(by_session)
            .option("checkpointLocation", str(tmp / "sink-chk"))
            .start()
        )
        self.syphon: Any = None

    def start_syphon(self) -> None:
        self.syphon_stop.unlink(missing_ok=True)
        self.syphon = run_syphon(
            self.spark,
            self.config,
            checkpoint=self.syphon_checkpoint,
            trigger="1 second",
            admin_kwargs={"connection_verify": self.pair.secondary.ca_file},
            stop_file=str(self.syphon_stop),
            query_name=None,
        )

    def batch(self, per_session: int = 2) -> None:
        rows = []
        for _ in range(per_session):
            for s in SESSIONS:
                mid = f"{s}-{self.seq:04d}"
                rows.append(
                    {"body": mid, "message_id": mid, "session_id": s, "entity": entity_of(s), "seq": self.seq}
                )
                self.produced[s].append(mid)
                self.seq += 1
        tmp = self.folder / f".{self.files}.json"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.rename(self.folder / f"{self.files:03d}.json")
        self.files += 1
        self.query.processAllAvailable()

    def backlog(self) -> int:
        return sum(self.pair.secondary.broker.counts(q).active_message_count for q in QUEUES)

    def wait_drained(self, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while self.backlog() > 0:
            assert time.monotonic() < deadline, f"the backlog still holds {self.backlog()} messages"
            assert self.syphon.exception() is None, self.syphon.exception()
            time.sleep(0.5)  # the syphon job's own pace: nothing in this process to await

    def stop(self) -> None:
        """The sink's query, then the syphon job between micro-batches (as ``jobs/syphon.py`` stops on SIGTERM): the
        micro-batch that moved the last messages writes its events (the ``acknowledged`` ones among them) before the
        query stops. A plain ``stop()`` there interrupts that batch's write, and its markers' acknowledgements are
        lost (the lines stay held until a newer marker is acknowledged; the kill after batch 8 is that shape)."""
        self.query.stop()
        if self.syphon is not None:
            stop_gracefully(self.syphon, str(self.syphon_stop), timeout=60)
        self.sink.flush()
        assert self.query.exception() is None


def received(ns: Any) -> dict[str, list[str]]:
    """Each session's message ids as a session receiver on the primary gets them (five sessions at a time)."""

    def one(s: str) -> list[str]:
        out: list[str] = []
        with (
            ServiceBusClient.from_connection_string(ns.connection_string) as client,
            client.get_queue_receiver(
                entity_of(s), session_id=s, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
            ) as receiver,
        ):
            while batch := receiver.receive_messages(max_message_count=200, max_wait_time=0.3):
                out.extend(str(m.message_id) for m in batch)
        return out

    with ThreadPoolExecutor(5) as pool:
        return dict(zip(SESSIONS, pool.map(one, SESSIONS), strict=True))


def test_with_ordering_session_every_session_reaches_the_primary_in_order(
    spark: Any, pair: Any, tmp_path: Path
) -> None:
    primary = pair.primary
    run = Stream(spark, pair, "session", tmp_path)
    try:
        for b in range(12):
            if b == 3:
                primary.faults.refuse_connections()
                primary.faults.drop_connections()
            if b == 7:
                primary.faults.accept_connections()
                run.start_syphon()  # started with the recovery: it does not take local[2]'s slots while it cannot move
            if b == 8:
                primary.faults.stall_entity("invoices")
            if b == 10:
                primary.faults.stall_entity("invoices", False)
            run.batch()
            if b == 8:  # mid-drain: the job's tasks are killed, what they held comes back after its lock
                held = run.backlog()
                run.syphon.stop()
                assert held > 0
                run.start_syphon()
        run.wait_drained()
    finally:
        run.stop()
    got = received(primary)
    for s in SESSIONS:
        assert got[s] == run.produced[s], f"session {s}: {got[s]}"  # in order, none lost, none twice
    diverted = run.sink.total.total_diverted
    assert diverted >= 4 * 2 * len(SESSIONS)  # the outage's four batches at least
    events = spark.read.format("delta").load(str(tmp_path / "state" / "events"))
    kinds = {
        r["event"]: r["n"] for r in events.groupBy("event").count().withColumnRenamed("count", "n").collect()
    }
    assert kinds.get("session_held", 0) >= len(SESSIONS) and kinds.get("acknowledged", 0) > 0


def test_with_ordering_none_sessions_come_out_of_order(spark: Any, pair: Any, tmp_path: Path) -> None:
    """The control (the test above can fail): a batch healthy, one diverted, one sent after recovery while the
    syphon job has not started yet: the diverted batch reaches the primary after the later one."""
    primary = pair.primary
    run = Stream(spark, pair, "none", tmp_path)
    try:
        run.batch(1)
        primary.faults.refuse_connections()
        primary.faults.drop_connections()
        run.batch(1)
        primary.faults.accept_connections()
        time.sleep(1.1)  # ping_primary_interval: the senders probe the primary again
        run.batch(1)
        run.start_syphon()
        run.wait_drained()
    finally:
        run.stop()
    got = received(primary)
    assert all(sorted(got[s]) == run.produced[s] for s in SESSIONS)  # nothing lost
    assert sum(got[s] != run.produced[s] for s in SESSIONS) >= 1
