"""Two executor JVMs (``local-cluster[2,1,1024]``), in a child process (``cluster_runs.py``: this process already
holds the test session's SparkContext) that runs every scenario in one cluster:

* after tasks on one executor fail over, the next batch's task on the other executor starts failed over through
  the entity table; 0 lost (``cluster_handoff.py``);
* a stream to 200 entities through a primary outage (``cluster_fanout.py``);
* ``ordering: session`` with the sink and the syphon job as two queries, through an outage, a stalled entity and
  a syphon job killed mid-drain: every session in order on the primary, and the control with ``ordering: none``
  out of order (``cluster_ordering.py``; issue 31: it replaced tests/spark/test_ordering.py's local[2] run).
"""

from __future__ import annotations

from typing import Any

import pytest

from .child_report import child_report

#: The tests of this file share one child process (one cluster; the Spark tiers' ``--dist loadfile`` gives them to
#: one pytest-xdist worker). The first test also waits for the child (a cluster's start and every scenario).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1260)]


@pytest.fixture(scope="module")
def cluster_reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("cluster")
    return child_report(["-m", "tests.spark.cluster_runs", str(work)], "cluster runs", timeout=1200)


def _scenario(reports: dict[str, Any], name: str) -> dict[str, Any]:
    report: dict[str, Any] = reports[name]
    assert "crashed" not in report, f"the cluster scenario {name!r} crashed:\n{report['crashed']}"
    return report


def test_next_batch_on_the_other_executor_starts_failed_over(cluster_reports: dict[str, Any]) -> None:
    report = _scenario(cluster_reports, "handoff")
    assert report["error"] is None
    first, second = report["batches"]
    interval = report["interval"]
    assert len(first) == 1 and first[0]["elapsed"] >= interval and first[0]["failing"] == 1
    assert len(second) == 2 and {r["pid"] for r in second} - {first[0]["pid"]}, (
        "batch 1 ran only where batch 0 did"
    )
    for r in second:
        assert r["elapsed"] < interval / 2 and r["failing"] == 0 and r["sent"] == 0 and r["diverted"] == 10
    assert report["backlog"] == report["expected"]  # 0 lost, 0 duplicated


def test_a_stream_to_200_entities_through_a_primary_outage(cluster_reports: dict[str, Any]) -> None:
    """Rows name 200 entities; the primary namespace goes down between batches: each task of the outage batch
    costs about failover_interval (not 200 times it), every row reaches the backlog, 0 lost, and the healthy
    batch used one connection per executor process."""
    report = _scenario(cluster_reports, "fanout")
    assert report["error"] is None
    healthy, outage = report["batches"]
    interval = report["interval"]
    assert sum(r["sent"] for r in healthy) == report["expected_primary"]
    assert report["connections_peak_before_outage"] <= 2 * 2  # two executor processes, at most two each
    assert len(outage) == 2
    for r in outage:
        assert r["sent"] == 0 and r["rejected"] == 0 and r["diverted"] == 400
        assert r["elapsed"] <= interval + 4.0, f"an outage task took {r['elapsed']:.1f} s for 200 entities"
    assert report["on_primary"] == report["expected_primary"]
    assert report["backlog"] == report["expected_backlog"]  # 0 lost, 0 duplicated


def test_with_ordering_session_every_session_reaches_the_primary_in_order(
    cluster_reports: dict[str, Any],
) -> None:
    """``ordering: session`` (``cluster_ordering.py``): 20 sessions, rows partitioned by session id, 12
    micro-batches through a primary outage (batches 3-6), a backlog queue's 5 s blip (batch 5), a stalled entity
    (8-9) and the syphon job killed mid-drain and restarted: every session's receiver on the primary gets exactly the produced sequence - in order,
    none lost, none twice (duplicate detection on) -, and the sink's and the syphon job's tasks ran on both
    executors."""
    report = _scenario(cluster_reports, "ordering")
    got, produced = report["received"], report["produced"]
    assert len(produced) == 20
    for s, sequence in produced.items():
        assert got[s] == sequence, f"session {s}: {got[s]}"  # in order, none lost, none twice
    assert report["held_at_kill"] > 0  # the syphon job was killed mid-drain
    # the backlog queue's 5 s blip failed a task attempt at least, and the query went on (O8; it stopped before)
    assert report["sink_failed_tasks"] >= 1
    assert report["diverted"] >= 4 * 2 * len(produced)  # the outage's four batches at least
    kinds = report["events"]
    assert kinds.get("session_held", 0) >= len(produced) and kinds.get("acknowledged", 0) > 0
    executors = report["executors"]
    assert len(executors["sink"]) == 2 and len(executors["syphon"]) == 2, f"tasks ran on {executors}"
    assert len({pid for pids in report["sink_pids"] for pid in pids}) >= 2


def test_with_ordering_none_sessions_come_out_of_order(cluster_reports: dict[str, Any]) -> None:
    """The control (the test above can fail): ``ordering: none``, a batch healthy, one diverted, one sent after
    recovery while the syphon job has not started yet: the diverted batch reaches the primary after the later one."""
    report = _scenario(cluster_reports, "ordering_none")
    got, produced = report["received"], report["produced"]
    assert all(sorted(got[s]) == sequence for s, sequence in produced.items())  # nothing lost
    assert sum(got[s] != sequence for s, sequence in produced.items()) >= 1
