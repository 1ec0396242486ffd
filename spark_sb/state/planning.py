"""Planning one batch's state writes (SPEC S4-S6): :func:`plan_batch` turns a batch's outcomes into events, entity
records and rejects; :func:`apply_handoff` gives executors the failover state recorded by others. Pure apart
from the registry they are given; runs on the driver.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from spark_sb.state.records import (
    BACKLOG_PULLED,
    BACKLOG_RETURNED,
    BATCH_COMMITTED,
    DIVERTED,
    PROBE,
    REJECTED,
    SENT,
    STATE_CHANGE,
    THROTTLED,
    BatchWrites,
    EntityRecord,
    Event,
    PartitionResult,
    PulledQueue,
    RejectRecord,
    _utc,
)

if TYPE_CHECKING:  # pragma: no cover
    from spark_sb.failover.records import StateTransition
    from spark_sb.failover.registry import FailoverRegistry
    from spark_sb.message.outbound import Reject

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------ pure planning
def reject_records(
    rejects: Iterable[Reject], sink_id: str, batch_id: int | None, now: datetime
) -> list[RejectRecord]:
    """Rejects (from the send outcomes) as rows of the rejects table."""
    return [RejectRecord(now, sink_id, batch_id, r.entity, r.field, r.reason, r.row_json) for r in rejects]


def throttled_millis(seconds: float) -> int:
    """The ``count`` of a ``throttled`` event: whole milliseconds backed off, at least 1 for any wait."""
    return max(1, round(seconds * 1000))


def _state_value(state: Any) -> str:
    return str(getattr(state, "value", state))


def plan_batch(
    *,
    sink_id: str,
    batch_id: int,
    namespace: str,
    backlog_namespace: str | None,
    results: Sequence[PartitionResult],
    previous: Sequence[EntityRecord],
    now: datetime,
    updated_by: str = "",
) -> BatchWrites:
    """The events, entity records and rejects one batch produces (pure; driver).

    ``namespace`` is the primary's secret-free key, ``previous`` the entity records read at batch start.
    Entity records are written only where something changed: a state newer than the recorded one, or a different
    set of pulled backlog queues. The last event is ``batch_committed`` (count = rows read): its presence marks
    the batch as done for replay skipping.
    """
    now = _utc(now)
    events: list[Event] = []
    rejects: list[RejectRecord] = []
    rows = 0

    def ev(kind: str, host: str | None, **kw: Any) -> None:
        events.append(Event(kw.pop("time", now), sink_id, batch_id, kind, executor_host=host, **kw))

    for r in results:
        o = r.outcome
        rows += r.rows
        for entity, n in sorted(o.sent.items()):
            ev(SENT, r.host, namespace=namespace, entity=entity, count=n)
        for entity, seconds in sorted(o.throttled.items()):
            if seconds > 0:
                ev(
                    THROTTLED,
                    r.host,
                    namespace=namespace,
                    entity=entity,
                    error_class="server_busy",
                    count=throttled_millis(seconds),
                    detail=f"backed off {seconds:.1f} s on server busy (not an outage, nothing diverted)",
                )
        only = next(iter(o.diverted_by_entity)) if len(o.diverted_by_entity) == 1 else None
        for queue, n in sorted(o.diverted.items()):
            ev(DIVERTED, r.host, namespace=namespace, entity=only, backlog_queue=queue, count=n)
        if only is None:
            for entity, n in sorted(o.diverted_by_entity.items()):
                ev(DIVERTED, r.host, namespace=namespace, entity=entity, count=n)
        by_entity: dict[str | None, int] = {}
        for rej in o.rejects:
            by_entity[rej.entity] = by_entity.get(rej.entity, 0) + 1
        for rej_entity, n in sorted(by_entity.items(), key=lambda kv: kv[0] or ""):
            ev(REJECTED, r.host, namespace=namespace, entity=rej_entity, count=n)
        rejects.extend(reject_records(o.rejects, sink_id, batch_id, now))
        for t in o.transitions:
            ev(
                STATE_CHANGE,
                r.host,
                time=t.at,
                namespace=t.namespace or namespace,
                entity=t.entity,
                from_state=_state_value(t.from_state),
                to_state=_state_value(t.to_state),
                error_class=t.error_class,
                detail=t.detail,
            )
        for p in o.probes:
            ev(
                PROBE,
                r.host,
                time=p.at,
                namespace=namespace,
                entity=p.entity,
                error_class=p.error_class,
                detail=f"{p.mode} {'ok' if p.ok else 'failed'}{': ' + p.detail if p.detail else ''}",
            )
        for pull in o.pulls:
            ev(
                BACKLOG_PULLED,
                r.host,
                time=pull.at,
                namespace=namespace,
                backlog_queue=pull.queue,
                error_class=pull.error_class,
                detail=f"until {pull.until.isoformat()}: {pull.detail}",
            )

    # -- entity state: the newest transition of each entity across the tasks, against what the table says.
    # Only real transitions count (not a worker's restore from the table, which would date old news as new).
    latest: dict[str, StateTransition] = {}
    for r in results:
        for tr in r.outcome.transitions:
            if (tr.namespace or namespace) != namespace:
                continue
            known = latest.get(tr.entity)
            if known is None or _utc(tr.at) >= _utc(known.at):
                latest[tr.entity] = tr
    recorded = {p.entity: p for p in previous if p.namespace == namespace}
    before = active_pulls(previous, namespace, now)
    pulls: dict[str, PulledQueue] = dict(before)
    for r in results:
        for pull in (*r.pulled, *r.outcome.pulls):
            if backlog_namespace is not None and pull.namespace != backlog_namespace:
                continue
            until = _utc(pull.until)
            if until <= now:
                continue
            known_pull = pulls.get(pull.queue)
            if known_pull is None or until > known_pull.until:
                pulls[pull.queue] = PulledQueue(pull.queue, until, pull.error_class)
    for queue in sorted(set(_recorded_pull_names(previous, namespace)) - set(pulls)):
        ev(BACKLOG_RETURNED, None, namespace=namespace, backlog_queue=queue, detail="pull expired")
    pulls_changed = set(pulls) != set(_recorded_pull_names(previous, namespace)) or any(
        pulls[q].until != before[q].until for q in pulls if q in before
    )
    pulled = tuple(sorted(pulls.values(), key=lambda p: p.queue))
    entities: list[EntityRecord] = []
    for entity in sorted(set(latest) | (set(recorded) if pulls_changed else set())):
        rec = recorded.get(entity)
        last = latest.get(entity)
        if last is not None and (
            rec is None or (_state_value(last.to_state) != rec.state and _utc(last.at) > rec.since)
        ):
            error_class = last.error_class or (rec.last_error_class if rec is not None else None)
            state, since = _state_value(last.to_state), last.at
        elif rec is not None and pulls_changed:
            entities.append(
                replace(rec, pulled_backlog_queues=pulled, updated_at=now, updated_by=updated_by or None)
            )
            continue
        else:
            continue
        entities.append(
            EntityRecord(
                namespace,
                entity,
                state,
                since,
                error_class,
                backlog_namespace,
                pulled,
                now,
                updated_by or None,
            )
        )
    ev(BATCH_COMMITTED, None, namespace=namespace, count=rows)
    return BatchWrites(tuple(events), tuple(entities), tuple(rejects))


def _recorded_pull_names(records: Sequence[EntityRecord], namespace: str) -> list[str]:
    return sorted({p.queue for r in records if r.namespace == namespace for p in r.pulled_backlog_queues})


def active_pulls(records: Sequence[EntityRecord], namespace: str, now: datetime) -> dict[str, PulledQueue]:
    """The backlog queues recorded as pulled (for the primary ``namespace``) still in force at ``now``."""
    out: dict[str, PulledQueue] = {}
    for r in records:
        if r.namespace != namespace:
            continue
        for p in r.pulled_backlog_queues:
            if p.until > now and (p.queue not in out or p.until > out[p.queue].until):
                out[p.queue] = p
    return out


def apply_handoff(
    registry: FailoverRegistry,
    records: Sequence[EntityRecord],
    *,
    namespace: str,
    backlog_namespace: str | None,
    failover_interval: float,
    ping_interval: float,
) -> list[StateTransition]:
    """Teach an executor process's registry what the state table says (executor, at task start; SPEC S4).

    An entity the worker has never seen, or whose recorded state is newer than the worker's, starts FAILED_OVER
    (no second ``failover_interval`` wait) or HEALTHY as recorded; FAILING is not copied (the timer is the
    worker's own). Backlog queues recorded as pulled are pulled in the worker's rotation until their ``until``.
    Returns the transitions made.
    """
    from spark_sb.failover.records import EntityState

    clock = registry.clock
    now = clock.now()
    # Every entity the table records exists for this sink (SPEC F9: a not-found from it is an outage, not a typo);
    # a healthy record means the namespace answered this sink before.
    ours = [rec for rec in records if rec.namespace == namespace]
    if ours:
        registry.health(namespace, ping_interval=ping_interval).mark_known(
            (rec.entity for rec in ours), reached=any(rec.state == "healthy" for rec in ours)
        )
    known = {(s.namespace, s.entity) for s in registry.statuses()}
    out: list[StateTransition] = []
    for rec in records:
        if rec.namespace != namespace or rec.state not in (EntityState.FAILED_OVER.value, "healthy"):
            continue
        state = EntityState(rec.state)
        fresh = (rec.namespace, rec.entity) not in known
        if fresh and state is EntityState.HEALTHY:
            continue
        ef = registry.entity(
            rec.namespace, rec.entity, failover_interval=failover_interval, ping_interval=ping_interval
        )
        local = ef.status()
        if local.state is not state and (fresh or rec.since > _utc(local.since)):
            out.extend(ef.restore(state, "learned from the state table"))
    if backlog_namespace is not None:
        for pull in active_pulls(records, namespace, now).values():
            if registry.rotation.is_available(backlog_namespace, pull.queue):
                until = clock.monotonic() + (pull.until - now).total_seconds()
                registry.rotation.pull(
                    backlog_namespace, pull.queue, until, pull.error_class, "learned from the state table"
                )
    return out
