"""A test hook, off by default: SIGKILL at a named point of the source, for the kill acceptance tests (SOURCE.md
§13 A1, A2, A7, A9: ``tests/spark/test_source_kills.py``, ``bench/bench_source_kills.py``). Never set in production.

``SPARK_SB_SOURCE_FAULT=<point>[:<n>[:<times>]]``, read once per process: the ``n``-th time (default 1) this process
reaches ``point``, it sends SIGKILL to the process group ``SPARK_SB_SOURCE_FAULT_GROUP`` (the test's child program,
a session of its own: the whole driver) or, unset, to itself alone (an executor's Python worker, A2). With
``SPARK_SB_SOURCE_FAULT_MARK=<file>`` each kill is a line in that file first, and there are at most ``times``
(default 1) of them across processes (a retried task or a restarted worker does not kill again). Points: see
:data:`POINTS`. Runs wherever its point is (the planner process, executors, a ``foreachBatch``); holds no state
worth pickling.
"""

from __future__ import annotations

import fcntl
import os
import signal

ENV, GROUP_ENV, MARK_ENV = (
    "SPARK_SB_SOURCE_FAULT",
    "SPARK_SB_SOURCE_FAULT_GROUP",
    "SPARK_SB_SOURCE_FAULT_MARK",
)
#: SOURCE.md §13 A1's six points: 1 mid-receive, 2 after latestOffset before the WAL, 3 after the WAL before the
#: defer, 4 mid-read (after a page is yielded), 5 after the sink commit (the test's foreachBatch), 6 after the
#: commit log before settle.
POINTS = ("receive", "offset", "defer", "read", "sink", "settle")

_spec: tuple[str, int, int] | None = None
_read = False
_hits: dict[str, int] = {}  # bounded by POINTS


def fault(point: str) -> None:
    """The hook: nothing unless ``SPARK_SB_SOURCE_FAULT`` names ``point`` (see the module docstring)."""
    global _spec, _read
    if not _read:
        raw, _read = os.environ.get(ENV, "").split(":"), True
        if raw[0]:
            _spec = (raw[0], int(raw[1]) if len(raw) > 1 else 1, int(raw[2]) if len(raw) > 2 else 1)
    if _spec is None or _spec[0] != point:
        return
    _hits[point] = _hits.get(point, 0) + 1
    if _hits[point] != _spec[1]:
        return
    mark = os.environ.get(MARK_ENV)
    if mark:
        with open(mark, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # released when this process dies
            f.seek(0)
            if len(f.read().split()) >= _spec[2]:
                return
            f.write(f"{point}:{os.getpid()}\n")
            f.flush()
            os.fsync(f.fileno())
    group = os.environ.get(GROUP_ENV)
    if group:
        os.killpg(int(group), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)  # a worker in a group of its own (pyspark's daemon) dies too
