"""The syphon job's planner (SPEC S7, B11, O5): which backlog queues a micro-batch drains, from runtime counts read
through the secondary's administration endpoint (management reads, not billable receives). Nothing to do: no
micro-batch. Also: ``Trigger.AvailableNow``'s end, the wait of an ordered run for a killed run's locks, the entity
states read as hints.

Where it runs: in the data source's planner process on the driver machine (``latestOffset`` of
:func:`~spark_sb.spark.syphon_job.syphon_source`); a :class:`BacklogWatcher` holds an admin client: built there,
not picklable. Why and how each trigger goes: docs/design/syphon-job.md.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.clock import Clock, SystemClock
from spark_sb.failover.outcome import namespace_key
from spark_sb.syphon.lines import RECEIVE_FAILURE_PAUSE

#: The syphon job logs under one name (what users configure): ``spark_sb.spark.syphon_job``.
log = logging.getLogger("spark_sb.spark.syphon_job")


#: Ordering: added to the backlog queues' longest lock duration before a run's first drain (seconds).
LOCK_MARGIN = 5.0
#: The MaxDeliveryCount ``spark-sb provision`` gives the backlog queues (never dead-lettered by deliveries).
BOUNDLESS = 2147483647


@dataclass
class BacklogWatcher:
    """Decides which backlog queues a micro-batch drains, from runtime counts (management reads). Runs in the
    data source's planner process on the driver machine; not picklable (holds an admin client), built there.

    ``admin``: a ``ServiceBusAdministrationClient`` of the secondary (built from the config when None).
    """

    config: ServiceBusConfig
    queues: Sequence[str]
    admin: Any = None
    admin_kwargs: Mapping[str, Any] = field(default_factory=dict)
    parked: dict[str, int] = field(default_factory=dict)  # dead-letter count a pass left behind
    _dlq_pass: set[str] = field(default_factory=set)
    reads: int = 0
    failures: int = 0
    #: ``Trigger.AvailableNow``: each queue's active count when the query started (None: another trigger). Bounded,
    #: like the two maps below, by the backlog queues.
    at_start: dict[str, int] | None = None
    _drained: dict[str, int] = field(
        default_factory=dict
    )  # messages gone from a queue since the start, at least
    _seen: dict[str, int] = field(default_factory=dict)  # its active count when it was last offered
    _blind: int = 0  # passes over every queue made without counts (AvailableNow: one at most)
    #: ordering: seconds the first drain waits after the watcher's first look (None: the backlog queues' longest
    #: lock duration + :data:`LOCK_MARGIN`, read from the admin endpoint; :data:`RECEIVE_FAILURE_PAUSE` unread)
    lock_wait: float | None = None
    clock: Clock = field(default_factory=SystemClock)
    _not_before: float | None = None
    _locks: dict[str, float] | None = None  # :meth:`lock_durations`, once read

    def _ordered_start(self) -> bool:
        """Ordering: True once the locks a killed run of the job may have held ran out (then its messages are back
        in their queues, before anything behind them); until then no queue is drained."""
        if self.config.ordering == "none":
            return True
        if self._not_before is None:
            wait = self.lock_wait if self.lock_wait is not None else self._longest_lock()
            self._not_before = self.clock.monotonic() + wait
            if wait > 0:
                log.info(
                    "syphon: ordering: the first drain waits %.0f s for a killed run's locks to run out", wait
                )
        return self.clock.monotonic() >= self._not_before

    def _longest_lock(self) -> float:
        locks = self.lock_durations()
        if not locks:
            log.info("syphon: lock durations unavailable: waiting %.0f s", RECEIVE_FAILURE_PAUSE)
            return RECEIVE_FAILURE_PAUSE
        return max(locks.values()) + LOCK_MARGIN

    def lock_durations(self) -> dict[str, float]:
        """Each backlog queue's lock duration (seconds), read once from the admin endpoint (empty when it cannot be
        read: the drains assume the provisioned lock, :data:`~spark_sb.syphon.rules.LOCK_DURATION`). The ordered
        drain measures every lock it holds with it (a queue created by hand may lock for less than the provisioned
        60 s). Bounded by the backlog queues."""
        if self._locks is None:
            try:
                admin = self._admin()
                props = {q: admin.get_queue(q) for q in self.queues}
            except Exception as exc:  # noqa: BLE001 - read again at the next look
                log.info("syphon: lock durations unavailable (%s)", type(exc).__name__)
                return {}
            self._locks = {q: float(p.lock_duration.total_seconds()) for q, p in props.items()}
            bounded = sorted(
                q
                for q, p in props.items()
                if (getattr(p, "max_delivery_count", None) or BOUNDLESS) < BOUNDLESS
            )
            if bounded and self.config.ordering != "none":
                log.warning(
                    "syphon: ordering: backlog queues %s dead-letter a message after MaxDeliveryCount deliveries: "
                    "a held line's head whose locks keep running out (syphon workers killed, settles lost) can "
                    "lose its place - create them with `spark-sb provision` (MaxDeliveryCount %d)",
                    ", ".join(bounded),
                    BOUNDLESS,
                )
        return self._locks

    def prepare_available_now(self) -> None:
        """``Trigger.AvailableNow`` starts: remember what each queue holds now. From here a queue is offered while
        the messages it held at the start have not all left it (however many micro-batches that takes) and each
        pass over it made progress. Messages gone are told by the counts, which new arrivals hide: a run may move
        some that came after the start (harmless for a syphon), and ends when the counts say that at least as many
        as were there have left, or when a pass moved nothing. Without counts, every queue is drained once."""
        try:
            counts = self.counts()
        except Exception as exc:  # noqa: BLE001 - the run still drains: every queue, once
            log.warning("syphon: backlog counts unavailable at start (%s); draining every queue once", exc)
            self.at_start = {}
            return
        self.at_start = {queue: active for queue, (active, _) in counts.items()}

    def _admin(self) -> Any:
        if self.admin is None:
            assert self.config.secondary is not None
            timeout = float(self.config.send_timeout)
            self.admin = self.config.secondary.admin_client(
                **{
                    "retry_total": 0,
                    "connection_timeout": timeout,
                    "read_timeout": timeout,
                    **self.admin_kwargs,
                }
            )
        return self.admin

    def counts(self) -> dict[str, tuple[int, int]]:
        """(active, dead-lettered) per backlog queue; raises when the admin endpoint does not answer."""
        admin = self._admin()
        wanted = set(self.queues)
        out: dict[str, tuple[int, int]] = {}
        self.reads += 1
        try:
            for props in admin.list_queues_runtime_properties():
                if props.name in wanted:
                    out[props.name] = (
                        int(props.active_message_count or 0),
                        int(props.dead_letter_message_count or 0),
                    )
        except Exception:  # noqa: BLE001 - a listing is an optimisation: ask queue by queue
            out = {}
        for queue in self.queues:
            if queue not in out:
                props = admin.get_queue_runtime_properties(queue)
                out[queue] = (int(props.active_message_count or 0), int(props.dead_letter_message_count or 0))
        return out

    def work(self) -> list[tuple[str, bool]]:
        """(queue, dead_letter) pairs to drain now; every queue when the counts cannot be read. With ordering,
        nothing until one lock duration after the first look (:meth:`_ordered_start`); under ``Trigger.AvailableNow``
        this call waits that long instead (an empty offer would end the run before its first drain)."""
        if not self._ordered_start():
            if self.at_start is None:
                return []
            assert self._not_before is not None
            self.clock.sleep(self._not_before - self.clock.monotonic())
        try:
            counts = self.counts()
        except Exception as exc:  # noqa: BLE001 - the loop never dies: drain blind instead
            self.failures += 1
            self.admin = None
            if self.at_start is not None:  # AvailableNow: one blind pass, then the run ends
                self._blind += 1
                if self._blind > 1:
                    return []
            log.warning("syphon: backlog counts unavailable (%s); draining every queue", type(exc).__name__)
            return [(q, False) for q in self.queues]
        if self.at_start == {}:  # AvailableNow without counts at the start: the first counts stand for it
            self.at_start = {queue: active for queue, (active, _) in counts.items()}
        work: list[tuple[str, bool]] = []
        for queue in self.queues:
            active, dead = counts.get(queue, (0, 0))
            if queue in self._dlq_pass:  # a pass ran since: what is left there is parked
                self._dlq_pass.discard(queue)
                self.parked[queue] = dead
            if active > 0 and self._still_due(queue, active):
                work.append((queue, False))
            if dead > self.parked.get(queue, 0):
                work.append((queue, True))
                self._dlq_pass.add(queue)
            elif dead < self.parked.get(queue, 0):
                self.parked[queue] = dead
        return work

    def _still_due(self, queue: str, active: int) -> bool:
        """Whether ``queue`` (``active`` messages now) is drained in this micro-batch: always, but under
        ``Trigger.AvailableNow`` only while messages it held at the start may still be there - fewer have left it
        than it held, and its last pass made progress (a pass that moved nothing: its entities are down, or new
        messages arrive as fast as they leave; the next run goes on)."""
        if self.at_start is None:
            return True
        held = self.at_start.get(queue, 0)
        last = self._seen.get(queue)
        if last is not None:
            if active >= last:
                return False
            self._drained[queue] = self._drained.get(queue, 0) + (last - active)
        if self._drained.get(queue, 0) >= held:
            return False
        self._seen[queue] = active
        return True


def read_entity_hints(config: ServiceBusConfig) -> dict[str, str]:
    """entity -> state from the ``entities`` path table (``deltalake``, no Spark); {} when unavailable."""
    if not config.state_location:
        return {}
    try:
        from spark_sb.state.deltars import DeltaRsStateStore

        primary = namespace_key(config.primary)
        table = DeltaRsStateStore(config.state_location).snapshot("entities")
        rows = [] if table is None else table.to_pylist()
        return {str(r["entity"]): str(r["state"]) for r in rows if r.get("namespace") == primary}
    except Exception as exc:  # noqa: BLE001 - hints only: without them every entity is probed first
        log.info("syphon: entity states unavailable (%s); entities are probed", type(exc).__name__)
        return {}
