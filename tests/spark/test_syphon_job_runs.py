"""Every run of the syphon job records its events (SPEC O5, issue 47 item 1): a run on a fresh checkpoint, the
notebook after the job, and two jobs side by side each write every ``moved`` and ``acknowledged`` row, because
the Delta transaction id of a run's appends is the run's (``syphon/<name>/<run id>``), not the namespace's; and
``jobs/syphon.py --available-now`` (its own Spark driver) moves the backlog and exits by itself.
Local Spark against two local namespaces.

The runs without ordering are shared (CI time): one scenario (:func:`unordered`: the job, two queries side by
side on fresh checkpoints, the notebook) in a module-scoped fixture that records what every step did; its tests
assert on their step (this file's tests run in one pytest-xdist worker, ``--dist loadfile``: the scenario runs
once). The ordered tests keep runs of their own: the acknowledgement's test needs two runs of the same shape (their
batch ids meet), which the refusal's job does not give."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from servicebus_local.fixtures import NamespacePair
from servicebus_local.model import QueueSettings
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.failover.ordering import return_marker
from spark_sb.spark.syphon_job import run_syphon, stop_gracefully

from ..unit.test_notebooks import cells
from .cluster_harness import two_namespaces
from .streams import BACKLOG, drain_ids, messages, put_backlog, syphon_config

#: The first test of each scenario also waits for its runs (a minute or two alone, several at load).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
LOCK = 2  # the backlog queues' lock duration (s): an ordered run starts draining one lock duration after it starts


def _config(pair: Any, state: Path, **extra: Any) -> ServiceBusConfig:
    return syphon_config(pair, state, syphon={"batch_duration": "10s", "prefetch": 0}, **extra)


def _events(spark: Any, state: Path) -> list[Any]:
    return spark.read.format("delta").load(str(state / "events")).collect()


def _moved(events: list[Any]) -> int:
    return sum(e["count"] for e in events if e.event == "moved")


def _moved_by_queue(events: list[Any]) -> dict[str, int]:
    return {
        q: sum(e["count"] for e in events if e.event == "moved" and e.backlog_queue == q) for q in BACKLOG
    }


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


@contextmanager
def _namespaces() -> Iterator[NamespacePair]:
    """A started primary and secondary local namespace (no entities), stopped on leaving."""
    with two_namespaces() as (primary, secondary):
        yield NamespacePair(primary, secondary)


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


@dataclass
class Unordered:
    """What each step of the scenario without ordering did: the job's run, the events after each step (``job``,
    ``side_by_side``, ``notebook``) and the ids each step's messages reached the primary with."""

    pair: Any
    state: Path
    job: subprocess.CompletedProcess[str]
    events: dict[str, list[Any]] = field(default_factory=dict)
    on_primary: dict[str, list[str]] = field(default_factory=dict)


@pytest.fixture(scope="module")
def unordered(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Unordered]:
    """``ordering: none`` on one state location: ``jobs/syphon.py --available-now`` on its default checkpoint
    (``<state_location>/_syphon``: 5 messages), then two queries side by side on fresh checkpoints, one queue each
    (6 and 7), then the syphon notebook's default run on its own checkpoint (3). Each step's batch ids start at 0;
    before the fix Delta skipped every append whose batch id an earlier run of the namespace had committed."""
    with _namespaces() as pair:
        yield _run_unordered(spark, pair, tmp_path_factory.mktemp("unordered"))


def _run_unordered(spark: Any, pair: NamespacePair, work: Path) -> Unordered:
    pair.primary.broker.create_queue("orders", QueueSettings(requires_duplicate_detection=True))
    for name in BACKLOG:
        pair.secondary.broker.create_queue(name)
    state = work / "state"
    config = _config(pair, state)

    put_backlog(pair.secondary, BACKLOG[0], messages("a", 5))
    runs = Unordered(pair, state, _job(pair, state, "--available-now"))
    runs.events["job"] = _events(spark, state)
    runs.on_primary["job"] = drain_ids(pair.primary.connection_string, "orders")

    put_backlog(pair.secondary, BACKLOG[0], messages("b", 6))
    put_backlog(pair.secondary, BACKLOG[1], messages("c", 7))
    admin = {"connection_verify": pair.secondary.ca_file}
    stops = [str(work / "stop-0"), str(work / "stop-1")]
    queries = [
        run_syphon(
            spark,
            config,
            checkpoint=str(work / f"chk-{i}"),
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
    runs.events["side_by_side"] = _events(spark, state)
    runs.on_primary["side_by_side"] = drain_ids(pair.primary.connection_string, "orders")

    put_backlog(pair.secondary, BACKLOG[0], messages("d", 3))
    with pytest.MonkeyPatch.context() as monkeypatch:
        _run_notebook(spark, pair, state, work / "chk-notebook", monkeypatch)  # its own default checkpoint
    runs.events["notebook"] = _events(spark, state)
    runs.on_primary["notebook"] = drain_ids(pair.primary.connection_string, "orders")
    return runs


def test_a_run_on_a_fresh_checkpoint_and_the_notebook_after_the_job_record_every_message_they_move(
    unordered: Unordered,
) -> None:
    """Before the fix the runs on fresh checkpoints after the job and the notebook's were skipped by Delta (the job
    had committed batch 0 under the same transaction id): their ``moved`` rows were lost."""
    events = unordered.events
    assert _moved(events["job"]) == 5
    assert _moved(events["side_by_side"]) == 5 + 13  # two runs on fresh checkpoints: their batch ids from 0
    assert _moved(events["notebook"]) == 5 + 13 + 3
    assert sorted(unordered.on_primary["job"]) == [f"a{i}" for i in range(5)]
    assert sorted(unordered.on_primary["side_by_side"]) == sorted(
        [f"b{i}" for i in range(6)] + [f"c{i}" for i in range(7)]
    )
    assert sorted(unordered.on_primary["notebook"]) == [f"d{i}" for i in range(3)]
    assert {e.sink_id for e in events["notebook"]} == {
        "syphon/primary"
    }  # what status, the dashboard and the sink read


def test_two_jobs_side_by_side_each_record_every_message_they_move(unordered: Unordered) -> None:
    """Two queries at once on their own checkpoints (one queue each, so each has work): both count micro-batches
    from 0; before the fix the later writer of each batch id lost its rows."""
    before, after = (_moved_by_queue(unordered.events[step]) for step in ("job", "side_by_side"))
    assert {q: after[q] - before[q] for q in BACKLOG} == {BACKLOG[0]: 6, BACKLOG[1]: 7}
    assert len(unordered.on_primary["side_by_side"]) == 13


def test_the_job_with_available_now_moves_the_backlog_and_exits_by_itself(unordered: Unordered) -> None:
    """``python jobs/syphon.py --available-now``: no signal needed, exit 0, what it moved printed; ``--once`` with
    it is refused (moved here from test_syphon_job_available_now.py: the job's run is the scenario's first step)."""
    done = unordered.job
    assert done.returncode == 0, done.stderr[-3000:]
    assert "moved 5 (orders=5)" in done.stdout
    assert sorted(unordered.on_primary["job"]) == [f"a{i}" for i in range(5)]
    refused = _job(unordered.pair, unordered.state, "--once", "--available-now")
    assert refused.returncode == 2 and "not allowed with argument" in refused.stderr


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
        put_backlog(
            pair.secondary,
            BACKLOG[0],
            [*messages(f"r{run}-", 2, session="s1"), return_marker("orders", "s1", marker)],
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
    from spark_sb.spark.syphon_lease import SyphonRefused

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
