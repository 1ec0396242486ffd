"""Every run of the syphon job records its events (SPEC O5, issue 47 item 1): a run on a fresh checkpoint, the
notebook after the job, and two jobs side by side each write every ``moved`` and ``acknowledged`` row, because
the Delta transaction id of a run's appends is the run's (``syphon/<name>/<run id>``), not the namespace's.
Local Spark against two local namespaces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient

from servicebus_local.model import QueueSettings
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.failover.ordering import return_marker
from spark_sb.message.backlog import to_backlog
from spark_sb.message.outbound import OutboundMessage
from spark_sb.spark.syphon_job import run_syphon, stop_gracefully

from ..unit.test_notebooks import cells
from .streams import drain_ids

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BACKLOG = [f"primary/x-servicebus-transfer/{i}" for i in range(2)]
LOCK = 2  # the backlog queues' lock duration (s): an ordered run starts draining one lock duration after it starts


def _config(pair: Any, state: Path, **extra: Any) -> ServiceBusConfig:
    return ServiceBusConfig.from_dict(
        {
            "primary": {"connection_string": pair.primary.connection_string, "namespace_name": "primary"},
            "secondary": {"connection_string": pair.secondary.connection_string},
            "backlog_queue_count": len(BACKLOG),
            "send_timeout": "5s",
            "ping_primary_interval": "60s",
            "state_location": str(state),
            "syphon": {"batch_duration": "10s", "prefetch": 0},
            **extra,
        }
    )


def _put(ns: Any, queue: str, messages: list[OutboundMessage]) -> None:
    now = datetime.now(timezone.utc)
    with (
        ServiceBusClient.from_connection_string(ns.connection_string) as client,
        client.get_queue_sender(queue) as sender,
    ):
        sender.send_messages([to_backlog(m, m.entity or "orders", now).to_sdk() for m in messages])


def _messages(prefix: str, n: int, session: str | None = None) -> list[OutboundMessage]:
    return [
        OutboundMessage(body=f"{prefix}{i}", message_id=f"{prefix}{i}", entity="orders", session_id=session)
        for i in range(n)
    ]


def _events(spark: Any, state: Path) -> list[Any]:
    return spark.read.format("delta").load(str(state / "events")).collect()


def _moved(events: list[Any]) -> int:
    return sum(e["count"] for e in events if e.event == "moved")


def _drain_now(spark: Any, config: ServiceBusConfig, checkpoint: Path, pair: Any, **kw: Any) -> None:
    query = run_syphon(
        spark,
        config,
        checkpoint=str(checkpoint),
        available_now=True,
        admin_kwargs={"connection_verify": pair.secondary.ca_file},
        **kw,
    )
    query.awaitTermination(120)
    assert not query.isActive and query.exception() is None


def _job(pair: Any, state: Path, *args: str, ordering: str = "none") -> subprocess.CompletedProcess[str]:
    """``python jobs/syphon.py --config ... <args>`` (its own Spark driver) on the local namespaces."""
    conf = state.parent / f"syphon-{ordering}.yaml"
    conf.write_text(
        "primary: {connection_string: '${env:SB_PRIMARY_CONNECTION_STRING}', namespace_name: primary}\n"
        "secondary: {connection_string: '${env:SB_SECONDARY_CONNECTION_STRING}'}\n"
        f"backlog_queue_count: {len(BACKLOG)}\n"
        f"state_location: {state}\n"
        f"ordering: {ordering}\n"
        "syphon: {batch_duration: 10s, prefetch: 0}\n"
    )
    env = {
        **os.environ,
        "SB_PRIMARY_CONNECTION_STRING": pair.primary.connection_string,
        "SB_SECONDARY_CONNECTION_STRING": pair.secondary.connection_string,
        "REQUESTS_CA_BUNDLE": pair.secondary.ca_file,
    }
    return subprocess.run(
        [sys.executable, str(ROOT / "jobs/syphon.py"), "--config", str(conf), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture
def pair(namespace_pair: Any) -> Any:
    namespace_pair.primary.broker.create_queue("orders", QueueSettings(requires_duplicate_detection=True))
    for name in BACKLOG:
        namespace_pair.secondary.broker.create_queue(name)
    return namespace_pair


class _Widgets:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def text(self, name: str, default: str) -> None:
        self.values.setdefault(name, default)

    def dropdown(self, name: str, default: str, choices: list[str]) -> None:
        self.values.setdefault(name, default)

    def get(self, name: str) -> str:
        return self.values[name]


class _Secrets:
    def __init__(self, values: dict[tuple[str, str], str]) -> None:
        self.values = values

    def get(self, scope: str, key: str) -> str:
        return self.values[(scope, key)]


class _DbUtils:
    """What the syphon notebook uses of ``dbutils`` (widgets, secrets, the restart after the install)."""

    def __init__(self, widgets: dict[str, str], secrets: dict[tuple[str, str], str]) -> None:
        self.widgets = _Widgets(widgets)
        self.secrets = _Secrets(secrets)
        self.library = self

    def restartPython(self) -> None:  # noqa: N802 - the dbutils name
        pass


def _run_notebook(
    spark: Any, pair: Any, state: Path, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The syphon notebook's Python cells with stand-ins (magic cells skipped): its default run, available now."""
    from spark_sb.config import secret

    dbutils = _DbUtils(
        {
            "state_location": str(state),
            "checkpoint": str(checkpoint),
            "backlog_queue_count": str(len(BACKLOG)),
        },
        {
            ("servicebus", "primary-connection-string"): pair.primary.connection_string,
            ("servicebus", "secondary-connection-string"): pair.secondary.connection_string,
        },
    )
    monkeypatch.setattr(secret, "_find_dbutils", lambda: dbutils)  # what a Databricks notebook finds
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", pair.secondary.ca_file)  # both local namespaces share one CA
    scope: dict[str, Any] = {"spark": spark, "dbutils": dbutils, "__name__": "__notebook__"}
    for kind, source in cells(ROOT / "notebooks" / "syphon.py")[:-1]:  # the last cell stops a continuous run
        if kind == "python":
            exec(compile(source, "syphon.py", "exec"), scope)  # noqa: S102 - the notebook under test
    assert not scope["query"].isActive and scope["query"].exception() is None


def test_a_run_on_a_fresh_checkpoint_and_the_notebook_after_the_job_record_every_message_they_move(
    spark: Any, pair: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the fix the second run's micro-batch 0 and the notebook's were skipped by Delta (the first run had
    committed batch 0 under the same transaction id): their ``moved`` rows were lost."""
    state = tmp_path / "state"
    config = _config(pair, state)
    _put(pair.secondary, BACKLOG[0], _messages("a", 5))
    done = _job(pair, state, "--available-now")  # its default checkpoint, <state_location>/_syphon
    assert done.returncode == 0, done.stderr[-3000:]
    assert _moved(_events(spark, state)) == 5

    _put(pair.secondary, BACKLOG[1], _messages("b", 4))
    _drain_now(spark, config, tmp_path / "chk-fresh", pair)  # a fresh checkpoint: its batch ids start at 0
    assert _moved(_events(spark, state)) == 9

    _put(pair.secondary, BACKLOG[0], _messages("c", 3))
    _run_notebook(spark, pair, state, tmp_path / "chk-notebook", monkeypatch)  # its own default checkpoint
    events = _events(spark, state)
    assert _moved(events) == 12
    assert sorted(drain_ids(pair.primary.connection_string, "orders")) == sorted(
        [f"a{i}" for i in range(5)] + [f"b{i}" for i in range(4)] + [f"c{i}" for i in range(3)]
    )
    assert {e.sink_id for e in events} == {"syphon/primary"}  # what status, the dashboard and the sink read


def test_two_jobs_side_by_side_each_record_every_message_they_move(
    spark: Any, pair: Any, tmp_path: Path
) -> None:
    """Two queries at once on their own checkpoints (one queue each, so each has work): both count micro-batches
    from 0; before the fix the later writer of each batch id lost its rows."""
    state = tmp_path / "state"
    config = _config(pair, state)
    _put(pair.secondary, BACKLOG[0], _messages("a", 6))
    _put(pair.secondary, BACKLOG[1], _messages("b", 7))
    admin = {"connection_verify": pair.secondary.ca_file}
    stops = [str(tmp_path / "stop-0"), str(tmp_path / "stop-1")]
    queries = [
        run_syphon(
            spark,
            config,
            checkpoint=str(tmp_path / f"chk-{i}"),
            trigger="1 second",
            queues=[BACKLOG[i]],
            admin_kwargs=admin,
            stop_file=stops[i],
            query_name=None,
        )
        for i in range(2)
    ]
    try:
        for query in queries:
            query.processAllAvailable()
    finally:
        for query, stop in zip(queries, stops, strict=True):
            stop_gracefully(query, stop, timeout=30)
    events = _events(spark, state)
    by_queue = {
        q: sum(e["count"] for e in events if e.event == "moved" and e.backlog_queue == q) for q in BACKLOG
    }
    assert by_queue == {BACKLOG[0]: 6, BACKLOG[1]: 7}
    assert len(drain_ids(pair.primary.connection_string, "orders")) == 13


def test_an_ordered_run_on_a_fresh_checkpoint_records_the_acknowledgement_the_sink_reads(
    spark: Any, namespace_pair: Any, tmp_path: Path
) -> None:
    """``ordering: session``: the marker the second run passes is an ``acknowledged`` row that the sink's read
    (``read_acknowledgements``) finds; before the fix it was dropped and the session stayed held for ever."""
    from spark_sb.failover.outcome import namespace_key
    from spark_sb.state.maintenance import store_for

    pair = namespace_pair
    pair.primary.broker.create_queue(
        "orders", QueueSettings(requires_session=True, requires_duplicate_detection=True)
    )
    for name in BACKLOG:
        pair.secondary.broker.create_queue(
            name, QueueSettings(max_delivery_count=2147483647, lock_duration=timedelta(seconds=LOCK))
        )
    state = tmp_path / "state"
    config = _config(pair, state, ordering="session")
    since = datetime.now(timezone.utc) - timedelta(minutes=1)
    for run, marker in enumerate(["m-first", "m-second"]):
        _put(
            pair.secondary,
            BACKLOG[0],
            [*_messages(f"r{run}-", 2, session="s1"), return_marker("orders", "s1", marker)],
        )
        _drain_now(spark, config, tmp_path / f"chk-{run}", pair)
    acknowledged = [e.detail for e in _events(spark, state) if e.event == "acknowledged"]
    assert sorted(acknowledged) == ["m-first", "m-second"]
    store = store_for(spark, config)
    assert store.read_acknowledgements(namespace_key(config.primary), ["m-first", "m-second"], since) == {
        "m-first",
        "m-second",
    }
    assert _moved(_events(spark, state)) == 4


def test_a_second_ordered_job_on_the_backlog_is_refused_in_one_line_naming_the_first(
    spark: Any, namespace_pair: Any, tmp_path: Path
) -> None:
    """Two ordered syphons on one backlog queue break O1; the second is refused before it drains anything, and
    starts once the first stopped (its lease released)."""
    from spark_sb.spark.syphon_job import SyphonRefused

    pair = namespace_pair
    for name in BACKLOG:
        pair.secondary.broker.create_queue(name, QueueSettings(lock_duration=timedelta(seconds=LOCK)))
    config = _config(pair, tmp_path / "state", ordering="session")
    admin = {"connection_verify": pair.secondary.ca_file}
    stop = str(tmp_path / "stop")
    first = run_syphon(
        spark,
        config,
        checkpoint=str(tmp_path / "chk-job"),
        trigger="1 second",
        admin_kwargs=admin,
        stop_file=stop,
    )
    try:
        with pytest.raises(SyphonRefused) as refused:
            run_syphon(
                spark, config, checkpoint=str(tmp_path / "chk-notebook"), available_now=True, query_name=None
            )
        job = _job(pair, tmp_path / "state", "--available-now", ordering="session")  # the other entry point
    finally:
        stop_gracefully(first, stop, timeout=30)
    message = str(refused.value)
    assert "\n" not in message and f"checkpoint {tmp_path / 'chk-job'}" in message
    leases = [json.loads(e.detail) for e in _events(spark, tmp_path / "state") if e.event == "syphon_running"]
    first_run = next(d["run"] for d in leases if d["checkpoint"] == str(tmp_path / "chk-job"))
    assert f"run {first_run} on " in message
    assert job.returncode == 3, job.stderr[-3000:]
    line = [x for x in job.stderr.splitlines() if x.startswith("syphon: refused: ")]
    assert len(line) == 1 and f"run {first_run} on " in line[0] and str(tmp_path / "chk-job") in line[0]
    second = run_syphon(
        spark, config, checkpoint=str(tmp_path / "chk-notebook"), available_now=True, admin_kwargs=admin
    )
    second.awaitTermination(120)
    assert second.exception() is None
