"""What the two ordering scenarios share: ``tests/spark/test_datasource_ordering.py`` (``format("servicebus")`` on
local[2]) and ``tests/spark/cluster_ordering.py`` (the foreachBatch sink on a local cluster). Test code, in the
test session's process or the cluster child's.

* :class:`Feed`: the stream's input, one JSON file a micro-batch, each session's message ids as produced;
* :func:`wait_drained`: waiting for the syphon job to move the backlog queues' messages
  (:func:`harness.outages.backlog_count` counts them);
* :func:`received`: each session's message ids as a session receiver on the primary gets them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harness.outages import backlog_count
from harness.queues import take_ids

#: The two session-enabled primary queues; a session's entity is fixed by its number.
ENTITIES = ("orders", "invoices")
SCHEMA = "body STRING, message_id STRING, session_id STRING, entity STRING, seq BIGINT"


def entity_of(session: str) -> str:
    """``s07`` -> ``invoices``: the entity of a session id ``s<number>``."""
    return ENTITIES[int(session[1:]) % 2]


class Feed:
    """The stream's input folder: :meth:`write` adds one micro-batch's file (written aside, then renamed: the file
    source never reads half a file), ``per_session`` rows for each session, numbered by ``seq`` in the order
    produced; :attr:`produced` holds each session's message ids in that order."""

    def __init__(self, folder: Path, sessions: Sequence[str]) -> None:
        self.folder, self.sessions = folder, list(sessions)
        folder.mkdir(parents=True)
        self.produced: dict[str, list[str]] = {s: [] for s in self.sessions}
        self.seq = 0
        self.files = 0

    def write(self, per_session: int = 1) -> None:
        rows = []
        for _ in range(per_session):
            for s in self.sessions:
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


def wait_drained(secondary: Any, queues: Sequence[str], syphon: Any, seconds: float = 60) -> None:
    """Until the backlog queues are empty (at most ``seconds``); fails at once if the syphon job's query failed."""
    deadline = time.monotonic() + seconds
    while (left := backlog_count(secondary, queues)) > 0:
        assert time.monotonic() < deadline, f"the backlog still holds {left} messages"
        assert syphon.exception() is None, syphon.exception()
        time.sleep(0.5)  # the syphon job's own pace: nothing in this process to await


def received(connection_string: str, sessions: Sequence[str], at_once: int = 4) -> dict[str, list[str]]:
    """Each session's message ids as a session receiver on the primary gets them (``at_once`` sessions at a time;
    receive-and-delete)."""

    def one(s: str) -> list[str]:
        return take_ids(connection_string, entity_of(s), session_id=s, batch=200, wait=0.3)

    with ThreadPoolExecutor(at_once) as pool:
        return dict(zip(sessions, pool.map(one, sessions), strict=True))
