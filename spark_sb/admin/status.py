"""``spark-sb status``: each entity's failover state, the pulled backlog queues, the last events, the backlog
depths, the messages the syphon could not deliver (their entity does not exist: dead-lettered in the backlog,
SPEC F9) and, with ``ordering``, the sessions still draining (held by a sink until the syphon passed their markers,
SPEC O4: :mod:`spark_sb.state.sessions`), read without starting Spark; and per primary entity its duplicate
detection against ``exactly_once_horizon`` (SPEC B14: :mod:`spark_sb.admin.horizon`).

The state tables under ``state_location`` are read with the ``deltalake`` package (delta-rs, no JVM); backlog
depths come from the secondary namespace's admin endpoint (runtime message counts). Runs on a workstation or the
driver node, never on executors. Catalog tables (``state_table_prefix``) need a catalog: query them in SQL.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TextIO

from spark_sb.admin.horizon import Horizon, check_horizon, primary_entities
from spark_sb.core.redact import redact

__all__ = [
    "StateStatus",
    "add_status_command",
    "draining_sessions",
    "format_status",
    "newest_events",
    "read_status",
    "undeliverable",
]

#: How many draining sessions the text report lists (the JSON lists every one).
SESSIONS_SHOWN = 50
#: The events that count a message the syphon dead-lettered because its destination does not exist
#: (:mod:`spark_sb.spark.syphon_job`: event ``dead_lettered``, error class ``entity_not_found``).
UNDELIVERABLE_EVENT = ("dead_lettered", "entity_not_found")
#: SPEC B14: the syphon moved a message after its entity's duplicate detection window since its ambiguous send.
POSSIBLE_DUPLICATE_EVENT = "possible_duplicate"


@dataclass(frozen=True)
class StateStatus:
    """What ``status`` shows: entity rows, the newest events (newest first), backlog depths per queue, and per
    entity the messages the syphon dead-lettered because the entity does not exist (:func:`undeliverable`)."""

    entities: list[dict[str, Any]]
    events: list[dict[str, Any]]
    depths: dict[str, int | str] = field(default_factory=dict)
    undeliverable: list[dict[str, Any]] = field(default_factory=list)
    #: Ordering: the sessions still draining (:func:`draining_sessions`), oldest first.
    sessions: list[dict[str, Any]] = field(default_factory=list)
    #: SPEC B14: each primary entity's duplicate detection against ``exactly_once_horizon`` (None: not asked), and
    #: per entity the messages the syphon moved after its window since their ambiguous send (``possible_duplicate``).
    horizon: Horizon | None = None
    possible_duplicates: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "entities": self.entities,
            "events": self.events,
            "backlog_depths": self.depths,
            "undeliverable": self.undeliverable,
            "sessions_draining": self.sessions,
            "duplicate_detection": self.horizon.to_json() if self.horizon is not None else None,
            "possible_duplicates": self.possible_duplicates,
        }


def _arrow_table(location: str, table: str) -> Any:
    """The table as an Arrow table, or None when it does not exist yet."""
    try:
        from spark_sb.state.deltars import DeltaRsStateStore
    except ImportError:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "status reads the state tables with the deltalake package: pip install deltalake"
        ) from None
    return DeltaRsStateStore(location).snapshot(table)


def _read_table(location: str, table: str) -> list[dict[str, Any]]:
    data = _arrow_table(location, table)
    rows: list[dict[str, Any]] = [] if data is None else data.to_pylist()
    return rows


def newest_events(location: str, n: int) -> list[dict[str, Any]]:
    """The ``n`` newest events, newest first (a batch's ``batch_committed`` before its other events of the same
    time). Sorted in Arrow and only those ``n`` rows converted to Python: the events table holds
    ``state_retention`` of history (hundreds of thousands of rows), which must not make ``status`` slow."""
    return _newest(_arrow_table(location, "events"), n)


def _newest(data: Any, n: int) -> list[dict[str, Any]]:
    import pyarrow.compute as pc

    if data is None or n <= 0 or data.num_rows == 0:
        return []
    if data.num_rows > n:  # only the rows at least as new as the n-th newest can be among the n newest
        top = pc.select_k_unstable(data, k=n, sort_keys=[("time", "descending")])
        data = data.filter(pc.greater_equal(data["time"], pc.min(data["time"].take(top))))
    data = data.append_column("_commit", pc.equal(data["event"], "batch_committed"))
    order = pc.sort_indices(
        data,
        sort_keys=[("time", "descending"), ("batch_id", "descending"), ("_commit", "descending")],
    )  # nulls last (Arrow's default): an event without a batch id after the batch's rows of the same time
    rows: list[dict[str, Any]] = data.take(order[:n]).drop_columns(["_commit"]).to_pylist()
    return rows


def undeliverable(location: str) -> list[dict[str, Any]]:
    """Per (namespace, entity), the messages the syphon dead-lettered in the backlog because the entity does not
    exist (reason ``DestinationNotFound``; over the events the table keeps, ``state_retention``): ``count``, the
    ``last`` time and the backlog ``queues`` whose dead-letter queues hold them; the most recent first."""
    return _undeliverable(_arrow_table(location, "events"))


def _undeliverable(data: Any) -> list[dict[str, Any]]:
    return _summed(data, *UNDELIVERABLE_EVENT)


def _summed(data: Any, event: str, error_class: str | None = None) -> list[dict[str, Any]]:
    """Per (namespace, entity), the events ``event`` (of ``error_class``, when given) summed: ``count``, the ``last``
    time and the backlog ``queues``; the most recent first."""
    import pyarrow.compute as pc

    if data is None or data.num_rows == 0:
        return []
    wanted = pc.equal(data["event"], event)
    if error_class is not None:
        wanted = pc.and_kleene(wanted, pc.equal(data["error_class"], error_class))
    found = data.filter(wanted)
    if found.num_rows == 0:
        return []
    grouped = found.group_by(["namespace", "entity"]).aggregate(
        [("count", "sum"), ("time", "max"), ("backlog_queue", "distinct")]
    )
    rows = [
        {
            "namespace": r["namespace"],
            "entity": r["entity"],
            "count": int(r["count_sum"] or 0),
            "last": r["time_max"],
            "queues": sorted(q for q in r["backlog_queue_distinct"] or [] if q),
        }
        for r in grouped.to_pylist()
    ]
    return sorted(rows, key=lambda r: (r["last"], r["entity"] or ""), reverse=True)


def draining_sessions(location: str) -> list[dict[str, Any]]:
    """Ordering: per (sink, entity, session) held by a sink - its messages in the backlog, or not yet known by the
    sink to be drained -: the backlog ``queue`` it is pinned to, ``since`` when, and how many return markers wait
    for the syphon (``pending``); oldest first. From the ``sessions`` table (one row per held session and pending
    marker, or replaced one: bounded by the held sessions); [] when no sink keeps one."""
    rows = _read_table(location, "sessions")
    grouped: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in rows:
        key = (r["sink_id"], r["entity"], r["session"] or "")
        entry = grouped.setdefault(
            key,
            {
                "sink_id": r["sink_id"],
                "entity": r["entity"],
                "session": r["session"] or "",
                "queue": r["backlog_queue"],
                "since": r["since"],
                "pending": 0,
            },
        )
        entry["pending"] += r["marker"] is not None and r["issued"] is not None  # not a replaced marker
    return sorted(grouped.values(), key=lambda e: (e["since"], e["entity"], e["session"]))


def backlog_depths(config: Any, admin_client: Any = None) -> dict[str, int | str]:
    """Total message count of every backlog queue (an error text where it could not be read)."""
    if config.secondary is None:
        return {}
    admin = admin_client if admin_client is not None else config.secondary.admin_client()
    out: dict[str, int | str] = {}
    for queue in config.backlog_queue_names():
        try:
            out[queue] = int(admin.get_queue_runtime_properties(queue).total_message_count or 0)
        except Exception as exc:  # noqa: BLE001 - shown per queue, the rest still read
            out[queue] = redact(f"unavailable: {type(exc).__name__}")
    return out


def read_status(
    config: Any,
    *,
    last_events: int = 20,
    depths: bool = True,
    admin_client: Any = None,
    duplicate_detection: bool = True,
    entities: Sequence[str] = (),
    primary_admin_client: Any = None,
) -> StateStatus:
    """Read the entities table, the newest ``last_events`` events, (``depths``) the backlog queue depths and
    (``duplicate_detection``) the duplicate detection of the primary entities - ``config.entity``, ``entities`` and
    the entities table's - from the primary's admin endpoint (``primary_admin_client``, or one built)."""
    if not config.state_location:
        raise ValueError(
            "state_location is not set: status reads the Delta path tables under it"
            + (
                " (catalog tables from state_table_prefix: query them in SQL)"
                if config.state_table_prefix
                else ""
            )
        )
    rows = sorted(_read_table(config.state_location, "entities"), key=lambda r: (r["namespace"], r["entity"]))
    events = _arrow_table(
        config.state_location, "events"
    )  # read once: the newest events and the undeliverable
    horizon = None
    if duplicate_detection:
        named = primary_entities(config, entities, rows)
        horizon = check_horizon(config, named, admin_client=primary_admin_client)
    return StateStatus(
        entities=rows,
        events=_newest(events, last_events),
        depths=backlog_depths(config, admin_client) if depths else {},
        undeliverable=_undeliverable(events),
        sessions=draining_sessions(config.state_location),
        horizon=horizon,
        possible_duplicates=_summed(events, POSSIBLE_DUPLICATE_EVENT),
    )


def _ts(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if isinstance(value, datetime) else str(value or "")


def format_status(status: StateStatus, now: datetime | None = None) -> str:
    """The human-readable report (plain text tables)."""
    lines = ["entities:"]
    if not status.entities:
        lines.append("  (none recorded: no entity has changed state)")
    for r in status.entities:
        pulled = [p for p in r.get("pulled_backlog_queues") or [] if now is None or p["until"] > now]
        lines.append(
            f"  {r['entity']:<30} {r['state']:<12} since {_ts(r['since'])}"
            + (f"  last error {r['last_error_class']}" if r.get("last_error_class") else "")
        )
        for p in pulled:
            lines.append(
                f"    backlog queue {p['queue']} pulled until {_ts(p['until'])} ({p.get('error_class') or '-'})"
            )
    if status.depths:
        lines.append("backlog depths:")
        for queue, depth in status.depths.items():
            lines.append(f"  {queue:<50} {depth}")
    if status.undeliverable:
        lines.append(
            "undeliverable (the entity does not exist: dead-lettered in the backlog, DestinationNotFound):"
        )
        for u in status.undeliverable:
            where = f"  in the dead-letter queue of {', '.join(u['queues'])}" if u["queues"] else ""
            lines.append(f"  {u['entity'] or '':<30} count {u['count']}  last {_ts(u['last'])}{where}")
    if status.sessions:
        lines.append(
            f"sessions draining ({len(status.sessions)}; ordering: behind their backlog until the syphon passes):"
        )
        for d in status.sessions[:SESSIONS_SHOWN]:
            queue_depth = status.depths.get(d["queue"])
            lines.append(
                f"  {d['entity'] or '':<20} {d['session'] or '(entity)':<24} since {_ts(d['since'])}  "
                f"queue {d['queue']}"
                + (f" (depth {queue_depth})" if queue_depth is not None else "")
                + f"  markers pending {d['pending']}  sink {d['sink_id']}"
            )
        if len(status.sessions) > SESSIONS_SHOWN:
            lines.append(f"  ... and {len(status.sessions) - SESSIONS_SHOWN} more (--json lists every one)")
    if status.horizon is not None:
        lines += status.horizon.lines()
    if status.possible_duplicates:
        lines.append(
            "possible duplicates (moved by the syphon after the entity's duplicate detection window since their "
            "ambiguous send):"
        )
        for d in status.possible_duplicates:
            lines.append(f"  {d['entity'] or '':<30} count {d['count']}  last {_ts(d['last'])}")
    lines.append(f"last {len(status.events)} events:")
    for e in status.events:
        what = e["event"]
        if e.get("to_state"):
            what += f" {e.get('from_state')}->{e['to_state']}"
        where = e.get("entity") or ""
        if e.get("backlog_queue"):
            where += f" [{e['backlog_queue']}]"
        amount = (
            f"backed off {(e['count'] or 0) / 1000:.1f} s"  # a throttled event counts milliseconds (SPEC L4)
            if e["event"] == "throttled"
            else f"count {e['count']}"
        )
        lines.append(
            f"  {_ts(e['time'])} {e['sink_id']} batch {e['batch_id']} {what:<28} {where} "
            + amount
            + (f" ({e['error_class']})" if e.get("error_class") else "")
        )
    return "\n".join(lines)


def add_status_command(
    subparsers: Any, common: argparse.ArgumentParser, run: Callable[[argparse.Namespace], int]
) -> None:
    """Register ``status`` (the CLI wiring lives in :mod:`spark_sb.admin.cli`)."""
    p = subparsers.add_parser(
        "status",
        parents=[common],
        help="entity failover state, pulled backlog queues, sessions draining, last events, backlog depths and the "
        "primary entities' duplicate detection (no Spark)",
        description="Read the state tables under state_location (deltalake, no Spark) and the backlog depths.",
    )
    p.add_argument("--config", required=True, help="the YAML configuration (conf/<env>.yaml)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--events", type=int, default=20, help="how many of the newest events to show (default 20)"
    )
    p.add_argument("--no-depths", action="store_true", help="do not ask the secondary for backlog depths")
    p.add_argument(
        "--entity",
        action="append",
        default=[],
        metavar="ENTITY",
        help="a primary entity whose duplicate detection to show, besides `entity` and the entities table's "
        "(repeatable)",
    )
    p.add_argument(
        "--no-duplicate-detection",
        action="store_true",
        help="do not ask the primary about its entities' duplicate detection (exactly_once_horizon)",
    )
    p.set_defaults(func=run)


def run_status(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``status``: 0 printed, 1 could not read, 2 bad configuration."""
    import json

    from spark_sb.config.service_bus import load_config
    from spark_sb.core.errors import ConfigError

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=err)
        return 2
    try:
        status = read_status(
            config,
            last_events=args.events,
            depths=not args.no_depths,
            duplicate_detection=not args.no_duplicate_detection,
            entities=args.entity,
        )
    except Exception as exc:  # noqa: BLE001 - one clear line, secrets redacted
        print(redact(f"error: {type(exc).__name__}: {exc}"), file=err)
        return 1
    if status.horizon is not None:
        status.horizon.log()
    if args.json:
        json.dump(status.to_json(), out, indent=2, default=str)
        out.write("\n")
    else:
        from datetime import timezone

        print(format_status(status, datetime.now(timezone.utc)), file=out)
    return 0
