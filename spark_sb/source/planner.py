"""The driver's side of the source (SOURCE.md §3-§6, R13-R16, R18, R23, R24): settle, receive, keep locks, defer,
read ahead. :class:`SourcePlanner` runs in the planner process (one per query run; not picklable), speaks
:class:`~spark_sb.source.transport.EntityLink` only, on an injected clock; the Spark adapter calls it from
``initialOffset``, ``latestOffset``, ``partitions``, ``commit``, ``reportLatestOffset`` and
``prepareForTriggerAvailableNow``. The lock keeper is :meth:`keep_locks`: a daemon thread calls it in production
(``keeper_thread=True``), tests and the simulation on their clock.
No call raises on a namespace fault (a fault means "no new data this trigger"); a re-created entity raises
:class:`~spark_sb.source.reader.DataLossError` with ``fail_on_data_loss``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from spark_sb.core.clock import Clock
from spark_sb.core.errors import ConfigError
from spark_sb.source.batch import BatchStats, Pending, PlannerLimits, backlog_report
from spark_sb.source.faults import fault
from spark_sb.source.locks import Held, KeeperThread, WakeThread, renew_due
from spark_sb.source.manifest import (
    Manifest,
    PartitionSpec,
    Ranges,
    channel_of,
    contains,
    count,
    cut,
    minus,
    ranges_of,
    split,
    union,
)
from spark_sb.source.orphans import ADOPT_MAX, OrphanCount
from spark_sb.source.reader import DataLossError, deferred_numbers, highest
from spark_sb.source.settle import Settler
from spark_sb.source.transport import EntityLink, Peeked, Received

log = logging.getLogger(__name__)


class SourcePlanner:
    """One entity's planner (driver; one per query run; not picklable). See the module docstring."""

    def __init__(
        self,
        entity: str,
        link: EntityLink | Callable[[], EntityLink],
        clock: Clock,
        limits: PlannerLimits | None = None,
        *,
        on_batch: Callable[[BatchStats], None] | None = None,
        max_delivery_count: int | None = None,
        keeper_thread: bool = False,
        defer_later: bool = False,
        defer_thread: bool = False,
        read_ahead: bool = False,
    ) -> None:
        self.entity = entity
        self.channel = channel_of(entity)
        self.clock = clock
        self.limits = limits or PlannerLimits()
        self.on_batch = on_batch
        self.max_delivery_count = max_delivery_count
        self._factory: Callable[[], EntityLink] | None = None
        self._link: EntityLink | None = None
        if callable(link) and not hasattr(link, "receive"):
            self._factory = link
        else:
            self._link = link  # type: ignore[assignment]
        lim = self.limits
        self._settler = Settler(
            self.channel, clock, timeout=lim.settle_timeout, call_timeout=lim.call_timeout
        )
        self._mutex = threading.RLock()
        # received, in no manifest yet: bounded by max_messages + receive_batch
        self._held: dict[int, Held] = {}
        self._pending: Pending | None = None
        self._known: Manifest | None = None  # the last offset Spark showed or planned (4.0/4.1: no start)
        # owed after settling one start, less what was completed since; and whether that settle tried everything
        self._owed_now: tuple[str, Ranges] | None = None
        self._settle_complete = True
        self._epoch: str | None = None
        self._watermark: int | None = None
        self._drained = False
        self._adopt: Ranges = ()  # recoverDeferred: deferred numbers no manifest names (bounded: ADOPT_MAX)
        self._sweep_pending = False
        self._swept = False  # this planner's sweep succeeded
        self._orphans = OrphanCount(entity, self.limits.recover_deferred)  # a new checkpoint's WARN
        self._last_batch_at = clock.monotonic()
        self._checked = False  # the entity's properties were read (sessions refused)
        self._next_due: float | None = None  # no held lock is due before it (keep_locks)
        # the planned batch whose defer has not run yet (defer_later): one batch at most
        self._to_defer: Pending | None = None
        self._defer_due: float | None = None  # the planned batch is deferred then, unless committed first
        self._defer_later = defer_later or defer_thread
        # read-ahead: the last receive filled its batch (a backlog); the last defer took every message; row limit
        self._read_ahead, self._full, self._defer_clean = read_ahead, False, False
        self._max_rows: int | None = None
        self._spark_waits = threading.Event()  # a Spark call waits for the mutex: a read-ahead stops
        self._keeper: KeeperThread | None = None
        if keeper_thread:
            self._keeper = KeeperThread(self.keep_locks, clock, f"sb-lock-keeper-{entity}")
        self._deferrer = WakeThread(self.read_ahead, f"sb-read-ahead-{entity}") if defer_thread else None

    # -- the link ----------------------------------------------------------------------------------------------
    def link(self) -> EntityLink:
        if self._link is None:
            assert self._factory is not None
            self._link = self._factory()
        return self._link

    def _peek(self, from_seq: int, count: int) -> list[Peeked]:
        return self.link().peek(from_seq, count, self.limits.call_timeout)

    def _drop_link(self, why: Exception) -> None:
        """After a namespace fault: a factory opens a new link next time; the carried locks are lost with it."""
        log.info("source %s: link fault (%s)", self.entity, why)
        if self._factory is None or self._link is None:
            return
        link, self._link = self._link, None
        self._held.clear()
        try:
            link.close()
        except Exception:  # noqa: BLE001
            log.debug("closing the link of %s failed", self.entity, exc_info=True)

    def _check_entity(self) -> None:
        """Before anything is received: a session entity is refused in one line (part 1 reads non-session
        entities), and its MaxDeliveryCount is learned for the near-dead-letter WARN. A link without ``info`` is
        not checked; a failed ``info`` is logged and tried again at the next call."""
        if self._checked:
            return
        try:
            info_of = getattr(self.link(), "info", None)
            if info_of is None:
                self._checked = True
                return
            info = info_of(self.limits.call_timeout)
        except Exception as exc:  # noqa: BLE001 - a fault: no new data this trigger, checked next time
            log.info("source %s: the entity's properties were not read (%s)", self.entity, exc)
            return
        if info.requires_session:
            raise self._session_refused()
        if self.max_delivery_count is None:
            self.max_delivery_count = info.max_delivery_count
        self._checked = True

    def _session_refused(self) -> ConfigError:
        return ConfigError(
            f"format('servicebus') read: option 'entity': {self.entity} is session-enabled (requiresSession): "
            "this source reads non-session queues and subscriptions only"
        )

    @contextmanager
    def _spark_call(self) -> Iterator[None]:
        """The mutex, for one of Spark's calls: a read-ahead holding it stops before its next receive."""
        self._spark_waits.set()
        with self._mutex:
            self._spark_waits.clear()
            yield

    # -- Spark's calls -----------------------------------------------------------------------------------------
    def initial_offset(self) -> dict[str, Any]:
        """Batch 0 (no data). With ``recover_deferred``: a sweep adopts the deferred messages no manifest names (up
        to :data:`ADOPT_MAX`, WARNing their count) into the first batch, at once (``initialOffset`` is not called
        again). Without it, the WARN waits until the backlog present now was received (:class:`OrphanCount`: then
        only orphans are left to peek); here only the highest number present is pinned (a galloping peek)."""
        with self._spark_call():
            self._check_entity()
            epoch = self._read_epoch()
            start = Manifest(b=0, epoch={self.channel: epoch} if epoch else {})
            self._orphans.forget()
            if not self._entity_empty():
                if self.limits.recover_deferred:
                    self._sweep_pending = True
                    self._sweep()
                else:
                    self._orphans.pin(self._peek)
            self._known = start
            return start.to_dict()

    def latest_offset(self, start: dict[str, Any] | None, max_rows: int | None = None) -> dict[str, Any]:
        """Settle ``start`` (the last committed end), receive up to the limits, return the new manifest - or
        ``start`` unchanged if nothing is held. ``start=None`` (4.0/4.1): the last offset seen."""
        with self._spark_call():
            self._check_entity()
            if start is None and self._known is None:
                log.warning(
                    "source %s: latestOffset() without a start, and neither initialOffset nor "
                    "setLatestSeenOffset came first: reading from batch 0",
                    self.entity,
                )
            s = Manifest.from_dict(start) if start is not None else (self._known or Manifest(b=0))
            pending = self._pending
            if pending is not None:
                if pending.start == s:
                    return pending.end.to_dict()  # asked again before planning it: the same answer
                log.warning(
                    "source %s: batch %d was never planned; its messages join the next",
                    self.entity,
                    pending.end.b,
                )
                self._held.update(pending.held)
                self._pending = None
            s = self._check_epoch(s)
            self._named(s)
            stats = BatchStats(b=s.b + 1)
            fault("settle")  # a test hook (faults.py), off by default
            owed = self._settle_start(s, stats)
            if s.sweep and not self._swept:
                self._sweep_pending = True  # a dead driver's sweep never succeeded: this one sweeps
            if self._sweep_pending:
                self._sweep()
                self._named(s)
            self._orphans.count(self._peek, owed)
            w = self._watermark
            if self._drained and (w is None or w < 0 or not any(seq <= w for seq in self._held)):
                # (what is still held up to the watermark - a read-ahead's - belongs to the run)
                return s.to_dict()
            self._max_rows, stats.read_ahead = max_rows, len(self._held)
            # drained with messages held (a read-ahead, the range cut): they are named, nothing more received
            if not self._drained:
                t0 = self.clock.monotonic()
                owed = self._receive(owed, max_rows, stats)
                stats.receive_seconds = self.clock.monotonic() - t0
            self._owed_now = (s.to_json(), owed)
            waiting = (
                self.limits.min_messages
                and self._watermark is None
                and len(self._held) < self.limits.min_messages
                and self.clock.monotonic() - self._last_batch_at < self.limits.max_trigger_delay
            )
            if (not self._held and not self._adopt) or waiting:
                return s.to_dict()
            return self._emit(s, owed, stats).to_dict()

    def partitions(self, start: dict[str, Any] | None, end: dict[str, Any]) -> list[PartitionSpec]:
        """The batch's partitions. Its held messages are deferred at once, or with ``defer_later`` left locked: the
        keeper defers them after ``defer_after``, a commit before that completes them (a peek reads a locked message
        as a deferred one). Pure in (start, end). ``partitions(o, o)`` (4.0/4.1 setLatestSeenOffset) learns ``o``."""
        with self._spark_call():
            e = Manifest.from_dict(end)
            self._known = e
            self._named(e)
            if start is not None and Manifest.from_dict(start).b == e.b:
                return []
            pending = self._pending
            if pending is not None and pending.end == e:
                self._pending, self._to_defer = None, pending
                # a test hook (faults.py), off by default: in the WAL, neither deferred nor settled
                fault("defer")
                if not self._defer_later or self.limits.defer_after <= 0:
                    self.run_defer()
                else:  # the keeper defers it once due; a commit before that completes it
                    self._defer_due = self.clock.monotonic() + self.limits.defer_after
                if self._deferrer is not None:
                    self._deferrer.wake()
            return split(e, self.limits.min_partitions, self.limits.max_per_partition)

    def read_ahead(self) -> int:
        """Receive the next batch while the executors read this one (driver: the read-ahead thread). Held as
        ``latest_offset`` holds them (locked, in no manifest yet): a crash meanwhile is a crash mid-receive. Stops
        before a receive when a Spark call waits. Runs only where no number the offset log names can be held for
        the next batch - the planned batch still held (a lapsed one received again goes back to it) or deferred
        whole, nothing owed, the last settle complete -, on a backlog (the last receive filled its batch), not
        once AvailableNow is drained nor before recoverDeferred's sweep. Returns how many it received."""
        with self._mutex:
            if not (
                self._read_ahead
                and self._full
                and (self._to_defer is not None or self._defer_clean)
                and self._pending is None
                and self._settle_complete
                and self._owed_now is not None
                and not self._owed_now[1]
                and not self._drained
                and not self._adopt
                and not self._sweep_pending
                and not self._spark_waits.is_set()
            ):
                return 0
            before = len(self._held)
            self._receive((), self._max_rows, BatchStats(b=-1), stop=self._spark_waits.is_set)
            got = len(self._held) - before
            log.debug("source %s: read ahead %d messages", self.entity, got)
            return got

    def run_defer(self) -> None:
        """Defer the planned batch's held messages if still to do (driver: the keeper once due, a settle of another
        batch, stop). Until then the keeper renews their locks."""
        with self._mutex:
            job, self._to_defer, self._defer_due = self._to_defer, None, None
            if job is not None:
                self._defer(job)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark committed the batch ending at ``end``: settle it (the same step ``latest_offset(end)`` skips)."""
        with self._spark_call():
            e = Manifest.from_dict(end)
            if self._known is None or e.b >= self._known.b:
                self._known = e
            if self._epoch is None or e.epoch.get(self.channel, self._epoch) == self._epoch:
                self._settle_start(e, BatchStats(b=e.b + 1))

    def report_latest(self) -> dict[str, Any]:
        """``reportLatestOffset``: the entity's backlog from its admin counts (``deferredOnEntity``: what this query
        deferred and has not deleted yet); ``None`` where a call failed."""
        with self._spark_call():
            return backlog_report(
                self.link, self._known, self._owed_now, self.channel, self.clock, self.limits.call_timeout
            )

    def prepare_available_now(self) -> int:
        """Pin the watermark W (the highest number present, by galloping peek; -1 if none): batches stop when a
        receive is empty, yields only numbers above W, or yields W itself."""
        with self._spark_call():
            self._check_entity()
            try:
                self._watermark = highest(self._peek)
            except Exception as exc:  # noqa: BLE001 - one batch, as on 4.0/4.1
                log.warning("source %s: no watermark (%s): AvailableNow runs one batch", self.entity, exc)
                self._watermark = -1
            self._drained = False
            log.info("source %s: AvailableNow up to sequence number %d", self.entity, self._watermark)
            return self._watermark

    def stop(self) -> None:
        """Stop the keeper and the read-ahead thread, defer a planned batch, close the link (held locks lapse)."""
        self._spark_waits.set()  # a read-ahead stops before its next receive
        if self._keeper is not None:
            self._keeper.stop(self.limits.call_timeout)
        if self._deferrer is not None:
            self._deferrer.stop(self.limits.call_timeout)
        with self._spark_call():
            self.run_defer()
            if self._link is not None:
                link, self._link = self._link, None
                try:
                    link.close()
                except Exception:  # noqa: BLE001
                    log.debug("closing the link of %s failed", self.entity, exc_info=True)

    # -- the lock keeper ---------------------------------------------------------------------------------------
    def keep_locks(self) -> float | None:
        """The lock keeper's tick: the planned batch's defer once due; renew the held locks past half their lock,
        forget the lost ones (left to the settle: owed). Returns the next due time on the clock (None: nothing)."""
        with self._mutex:
            now = self.clock.monotonic()
            if self._defer_due is not None and now >= self._defer_due:
                self.run_defer()  # the planned batch outlived deferAfter: deferred, its locks end
            if self._next_due is None or now >= self._next_due:
                # else nothing is due before it: a message held later is due later (one lock duration for all), a
                # renewed or forgotten one only later or never - so the books are not walked before each receive
                books = (
                    self._held,
                    self._pending.held if self._pending else {},
                    self._to_defer.held if self._to_defer else {},
                )
                self._next_due = renew_due(self.link, books, now, self.limits.call_timeout)
            due, defer = self._next_due, self._defer_due  # the defer's due is not cached: not a lock's
            return defer if due is None else due if defer is None else min(due, defer)

    # -- steps ---------------------------------------------------------------------------------------------------
    def _read_epoch(self) -> str | None:
        if self._epoch is None:
            try:
                self._epoch = self.link().counts(self.limits.call_timeout).created_at
            except Exception as exc:  # noqa: BLE001
                log.info("source %s: no creation time (%s)", self.entity, exc)
        return self._epoch

    def _check_epoch(self, s: Manifest) -> Manifest:
        """A start from an entity since re-created names other messages: fail, or (failOnDataLoss=false) reset."""
        epoch = self._read_epoch()
        was = s.epoch.get(self.channel)
        if epoch is None or was is None or was == epoch:
            return s
        msg = (
            f"entity {self.entity} was re-created ({was} -> {epoch}): the checkpoint's offsets name messages of the "
            "old entity"
        )
        if self.limits.fail_on_data_loss:
            raise DataLossError(msg + "; set failOnDataLoss=false to start over from the new entity")
        log.warning("%s; starting over (failOnDataLoss=false)", msg)
        self._owed_now = None
        return Manifest(b=s.b, epoch={**s.epoch, self.channel: epoch})

    def _entity_empty(self) -> bool:
        try:
            return self.link().counts(self.limits.call_timeout).total == 0
        except Exception as exc:  # noqa: BLE001 - not known to be empty
            log.info("source %s: no counts at start (%s)", self.entity, exc)
            return False

    def _sweep(self) -> None:
        """recoverDeferred: adopt the DEFERRED numbers on the entity (and WARN their count); a failed sweep is tried
        again by the next ``latest_offset`` (after its settle, so only orphans and numbers of ``start`` are
        deferred then)."""
        try:
            found = deferred_numbers(self._peek, ADOPT_MAX)
        except Exception as exc:  # noqa: BLE001
            log.warning("source %s: the sweep for deferred messages failed (%s)", self.entity, exc)
            return
        self._adopt, self._sweep_pending, self._swept = found.numbers, False, True
        self._orphans.warn(count(found.numbers), found.complete)

    def _named(self, m: Manifest) -> None:
        """``m`` is in the offset log: its numbers are no orphans (a replayed batch 0 calls ``initialOffset``
        again, so its sweep finds the dead driver's deferred batch; found by the simulation)."""
        if self._adopt:
            self._adopt = minus(self._adopt, union(m.ranges(self.channel), m.owed_ranges(self.channel)))

    def _settle_start(self, s: Manifest, stats: BatchStats) -> Ranges:
        """Settle ``s`` once; after an incomplete settle (a fault, the deadline) settle what is still owed again:
        what was not tried is owed, and an idle query (``start`` unchanged) would otherwise never delete it."""
        key = s.to_json()
        target = s
        job = self._to_defer
        if job is not None and job.end == s:  # committed before its defer: completed with the locks held
            self._to_defer = self._defer_due = None
            done = self._complete_planned(job, stats)
            self._defer_clean = True  # what was not completed is settled below: gone, or owed
            target = Manifest(b=s.b, m={self.channel: minus(s.ranges(self.channel), done)}, owed=s.owed)
        elif job is not None:
            self.run_defer()
        if self._owed_now is not None and self._owed_now[0] == key:
            if self._settle_complete:
                return self._owed_now[1]
            target = Manifest(b=s.b, owed={self.channel: self._owed_now[1]})
        t0 = self.clock.monotonic()
        owed: Ranges = ()
        self._settle_complete = True
        if target.ranges(self.channel) or target.owed_ranges(self.channel):
            try:
                link = self.link()
            except Exception as exc:  # noqa: BLE001 - no link: everything stays owed, settled next time
                log.info("source %s: no link to settle on (%s)", self.entity, exc)
                self._settle_complete = False
                owed = union(target.ranges(self.channel), target.owed_ranges(self.channel))
            else:
                result = self._settler.settle(link, target)
                owed, self._settle_complete = result.owed, result.complete
                stats.settled, stats.dropped = stats.settled + result.settled, result.dropped
        stats.settle_seconds = self.clock.monotonic() - t0
        self._owed_now = (key, owed)
        return owed

    def _receive(
        self,
        owed: Ranges,
        max_rows: int | None,
        stats: BatchStats,
        stop: Callable[[], bool] | None = None,
    ) -> Ranges:
        """Receive into ``self._held`` until a limit (or ``stop()``, before a receive); complete owed numbers at
        once. Returns the owed left; ``self._full`` says whether it stopped at the count or size limit."""
        lim = self.limits
        limit = self._limit(max_rows)
        size = sum(h.received.size for h in self._held.values())
        spans = len(ranges_of(self._held))  # kept up to date as numbers are held (not recounted per receive)
        t0 = self.clock.monotonic()
        self._full = False
        while True:
            if len(self._held) >= limit or (lim.max_bytes is not None and size >= lim.max_bytes):
                self._full = True
                break
            if self.clock.monotonic() - t0 >= lim.max_receive_time:
                break
            if spans >= lim.max_offset_ranges:
                break
            if stop is not None and stop():
                break
            self.keep_locks()
            inflight = self._to_defer  # planned, neither deferred nor completed (the keeper may defer it)
            planned = inflight.end.ranges(self.channel) if inflight is not None else ()
            want = min(lim.receive_batch, limit - len(self._held))
            try:
                got = self.link().receive(want, lim.receive_wait, lim.receive_wait + lim.call_timeout)
            except Exception as exc:  # noqa: BLE001 - no new data this trigger
                if "entity that requires sessions" in str(exc):  # the service's refusal (info() not read)
                    raise self._session_refused() from exc
                self._drop_link(exc)
                break
            now = self.clock.monotonic()
            owed_got = [r for r in got if contains(owed, r.seq)]
            for r in got:
                if inflight is not None and contains(planned, r.seq):
                    inflight.held[r.seq] = Held(r, now)  # a planned message's lapsed lock: held again for it
                elif not contains(owed, r.seq):
                    held = self._held
                    # held again (its lock was lost and it came back): the new lock is kept, counted once
                    if r.seq not in held:
                        spans += 1 - (r.seq - 1 in held) - (r.seq + 1 in held)
                        size += r.size
                    held[r.seq] = Held(r, now)
            if owed_got:
                owed = self._complete_owed(owed, owed_got, stats)
            fault("receive")  # a test hook (faults.py), off by default
            self._orphans.received(got)
            w = self._watermark
            if w is not None and (not got or all(r.seq > w for r in got) or max(r.seq for r in got) >= w):
                # W itself received: the run is drained without the empty receive (receiveWaitTime) it would wait
                self._drained = True
                break
            if not got:
                break
        return owed

    def _limit(self, max_rows: int | None) -> int:
        lim = self.limits.max_messages
        return min(lim, max_rows) if max_rows is not None else lim

    def _complete_owed(self, owed: Ranges, got: list[Received], stats: BatchStats) -> Ranges:
        done = self._complete(got, "owed messages")  # a lost reply: still owed, found gone at the next settle
        stats.owed_completed += len(done)
        return minus(owed, ranges_of(done))

    def _complete(self, got: list[Received], what: str) -> set[int]:
        try:
            return self.link().complete(got, self.limits.call_timeout) if got else set()
        except Exception as exc:  # noqa: BLE001
            log.info("source %s: completing %d %s failed (%s)", self.entity, len(got), what, exc)
            return set()

    def _emit(self, s: Manifest, owed: Ranges, stats: BatchStats) -> Manifest:
        kept, _rest = cut(self._held, self.limits.max_offset_ranges)  # the rest is carried to the next batch
        # a read-ahead under a higher row limit may hold more than this trigger admits: the lowest numbers go
        kept = kept[: self._limit(self._max_rows)]
        held = {seq: self._held.pop(seq) for seq in kept}
        counts = [h.received.delivery_count for h in held.values()]  # wherever received (a read-ahead too)
        stats.max_delivery_count = max(counts, default=0)
        if self.max_delivery_count:
            stats.near_dead_letter = sum(c >= self.max_delivery_count - 1 for c in counts)
        if stats.near_dead_letter:
            log.warning(
                "source %s: %d messages near MaxDeliveryCount (%s)",
                self.entity,
                stats.near_dead_letter,
                self.max_delivery_count,
            )
        ranges = union(ranges_of(kept), self._adopt)
        self._adopt = ()
        size = sum(h.received.size for h in held.values())
        epoch = {**s.epoch, self.channel: self._epoch} if self._epoch else dict(s.epoch)
        end = Manifest(
            b=s.b + 1,
            m={self.channel: ranges},
            owed={self.channel: owed} if owed else {},
            epoch=epoch,
            n=count(ranges),
            bytes=size,
            sweep=self._sweep_pending,
        )
        stats.received, stats.bytes, stats.owed = len(held), size, count(owed)
        stats.read_ahead = min(stats.read_ahead, len(held))
        self._pending = Pending(start=s, end=end, held=held, stats=stats)
        if self._watermark is not None and self._watermark < 0:
            self._drained = True  # AvailableNow without a watermark (none found, or empty): one batch
        fault("offset")  # a test hook (faults.py), off by default
        return end

    def _complete_planned(self, job: Pending, stats: BatchStats) -> Ranges:
        """Complete a committed batch's messages with the locks still held (one range disposition); the numbers
        done. One whose lock was lost is left to the settle step (gone, or owed: completed when received again)."""
        done = self._complete([h.received for h in job.held.values()], f"of batch {job.end.b}")
        job.stats.completed, stats.settled = len(done), stats.settled + len(done)
        self._report(job.stats)
        return ranges_of(done)

    def _defer(self, pending: Pending) -> None:
        stats = pending.stats
        handles = [h.received for h in pending.held.values()]
        t0 = self.clock.monotonic()
        done: set[int] = set()
        if handles:
            try:
                done = self.link().defer(handles, self.limits.call_timeout)
            except Exception as exc:  # noqa: BLE001 - read by peek all the same; owed at settle
                log.info("source %s: defer of batch %d failed (%s)", self.entity, pending.end.b, exc)
        stats.defer_seconds = self.clock.monotonic() - t0
        stats.deferred = len(done)
        stats.defer_failed = stats.received - len(done)
        # every message the manifest received was deferred (the keeper drops a planned message whose lock was lost
        # from ``held``: counted by ``received``, not by the handles; found by the simulation)
        self._defer_clean = stats.defer_failed == 0
        self._report(stats)

    def _report(self, stats: BatchStats) -> None:
        self._last_batch_at = self.clock.monotonic()
        # the INFO line is the adapter's on_batch (spark_sb.spark.reader.BatchRecorder)
        log.debug("source %s: %s", self.entity, stats)
        if self.on_batch is not None:
            try:
                self.on_batch(stats)
            except Exception:  # noqa: BLE001 - metrics never fail a batch
                log.warning("source %s: on_batch failed", self.entity, exc_info=True)
