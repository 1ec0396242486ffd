"""Probes of failed-over primary entities (SPEC B8, F4): one probe of an entity per ``ping_primary_interval``,
one of the whole namespace while it does not answer, on a helper thread (or inline with an injected clock).

Probes run on the transport's isolated connections (:meth:`~spark_sb.wire.transport.Transport.isolated`, SPEC F6): a
probe of an entity that stalls holds a connection of its own, never the one healthy sends use. The failed-over
entities are probed in turn, the one probed longest ago first (:meth:`Prober.rotation`, F7), and a probe cut short
by the sender's close records nothing (closing is no evidence).

A probe's calls are bounded by ``min(send_timeout, ping_primary_interval)`` (at least ``MIN_ATTEMPT_BUDGET``),
so a probe is over before the next is due. Its record and the transitions it causes wait in a queue until the
sender's thread collects them (:meth:`Prober.collect`), so that they reach the send outcome and the listener on
the sender's thread only.

Where it runs: beside its :class:`~spark_sb.sender.paired.PairedSender`, in an executor's Python worker (or the driver).
Not picklable (threads, locks). What bounds it: one probe thread per sender while one of its primary's entities is
failed over (the thread ends when none is), claimed probes are the process's failed-over entities, and the
queue of finished probes is emptied by every send.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from spark_sb.core.errors import CLIENT_CLOSED, ErrorClass, classify, describe_error
from spark_sb.failover.machine import EntityFailover
from spark_sb.failover.outcome import ProbeRecord
from spark_sb.failover.records import EntityState, StateTransition
from spark_sb.sender.attempts import AttemptLoop, WireEvidence
from spark_sb.sender.context import SendContext
from spark_sb.wire.probe import probe_call
from spark_sb.wire.transport import PRIMARY, Target, Transport

_LOGGER = logging.getLogger(__name__)


@dataclass(eq=False, kw_only=True)
class Prober:
    """Probes the failed-over entities of one primary namespace for one sender.

    Args:
        ctx: the sender's context (registry, clock, transport, the primary's key, ``probe_mode``, the deadline of
            each probe call).
        loop: the sender's attempt loop (a probe's cancel is retried by :data:`Where.PROBE`'s rules).
        background: probe on helper threads (False: inline, deterministic under a fake clock).
    """

    ctx: SendContext
    loop: AttemptLoop
    background: bool
    _finished: list[tuple[ProbeRecord, list[StateTransition]]] = field(default_factory=list, init=False)
    _finished_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    _thread_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _stopping: threading.Event = field(default_factory=threading.Event, init=False)

    # -- the sender's side
    def ensure_running(self) -> None:
        """With background probes: make sure a thread probes the failed-over entities every
        ``ping_primary_interval``, sends or no sends, so that the primary is used again as soon as it answers (not
        only once the next batch arrives). The thread ends when no entity is failed over any more."""
        if not self.background or self._stopping.is_set():
            return
        with self._thread_lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(target=self._loop, name="spark-sb-prober", daemon=True)
            self._thread.start()

    def start(self, entity: str, state: EntityFailover) -> None:
        """Probe ``entity`` (its probe was claimed by the caller): on a helper thread, or inline."""
        if not self.background:
            self.probe(entity, state)
            return
        threading.Thread(
            target=self.probe, args=(entity, state), name=f"spark-sb-probe-{entity}", daemon=True
        ).start()

    def probe_due(self) -> None:
        """Claim and probe every failed-over entity whose probe is due (for callers that idle between sends)."""
        claimed = [state for state in self.rotation() if state.claim_probe()]
        if claimed and self.background:
            threading.Thread(
                target=self.probe_all, args=(claimed,), name="spark-sb-probes", daemon=True
            ).start()
        else:
            self.probe_all(claimed)

    def collect(self) -> list[tuple[ProbeRecord, list[StateTransition]]]:
        """The probes finished since the last call, with the transitions they caused."""
        with self._finished_lock:
            finished, self._finished = self._finished, []
        return finished

    def stop(self) -> None:
        """No more probes start; a running one ends at its deadline."""
        self._stopping.set()

    # -- probing
    def _loop(self) -> None:
        while not self._stopping.is_set():
            waits: list[float] = []
            claimed = [state for state in self.rotation() if state.claim_probe()]
            self.probe_all(claimed)
            for state in self.failed_over():
                wait = state.next_probe_in()
                if wait is not None:
                    waits.append(wait)
            if not waits:
                return
            self._stopping.wait(max(0.05, min(waits)))

    def probe_all(self, claimed: list[EntityFailover]) -> None:
        """Probe the claimed entities: their links are opened together first (F4: once the namespace answers,
        a thousand failed-over entities come back in one round of link openings, not one per entity)."""
        if len(claimed) > 1:
            try:
                self.ctx.transport().isolated().prepare(
                    [Target(PRIMARY, s.entity) for s in claimed], self.ctx.probe_budget
                )
            except Exception as exc:  # each probe meets (and records) the failure itself
                _LOGGER.info("opening the links of %d probes failed: %s", len(claimed), describe_error(exc))
        for state in claimed:
            # closing is no evidence (SPEC F7): the claim given back, as probe() does
            if self._stopping.is_set():
                state.release_probe()
                continue
            self.probe(state.entity, state)

    def rotation(self) -> list[EntityFailover]:
        """The failed-over entities, the one probed longest ago first (SPEC F7): while the namespace has an open
        fault one probe per interval speaks for all of them, and the entity that claims it changes every interval,
        so a permanently sick entity never keeps the namespace's fault - and the others - in the backlog."""
        return sorted(self.failed_over(), key=lambda state: state.probed_at)

    def failed_over(self) -> list[EntityFailover]:
        """The primary's entities that are failed over now (in this process)."""
        return [
            self.ctx.entity(s.entity)
            for s in self.ctx.registry.statuses()
            if s.namespace == self.ctx.primary_key and s.state is EntityState.FAILED_OVER
        ]

    def probe(self, entity: str, state: EntityFailover) -> None:
        """Probe ``entity`` once (:func:`probe_call`); the record and the transitions it causes wait for
        :meth:`collect`."""
        if self._stopping.is_set():  # the sender closed: no probe, nothing recorded (closing is no evidence)
            state.release_probe()
            return
        mode = self.ctx.config.probe_mode
        target = Target(PRIMARY, entity)
        at = self.ctx.clock.now()
        began = self.ctx.clock.monotonic()
        transport: Transport | None = None
        try:
            # Probes run on connections of their own (SPEC F6): a probe of an entity that stalls holds its own
            # connection, never the one healthy sends use. After close() nothing is built: LaneClosed.
            transport = self.ctx.transport().isolated()
            probed = probe_call(transport, target, mode, self.ctx.probe_budget, self.loop.retry_probe, at)
        except Exception as exc:
            cls: ErrorClass = classify(exc)
            if self._stopping.is_set() or cls is CLIENT_CLOSED:
                # Closing is never evidence (SPEC F7): the claim is given back, the state left as it was.
                state.release_probe()
                return
            if transport is None:  # the isolated transport could not be had: nothing was probed
                state.release_probe()
                _LOGGER.info("probe of primary entity %r not made: %s", entity, describe_error(exc))
                return
            if cls.rebuild_client:
                transport.fault(target)
            detail = describe_error(exc)
            if cls.fail_batch:
                # No retry changes this (a refusal: invalid_request, unauthorized): say so, once per probe
                # (at most once per ping_primary_interval); never a silent forever-failover.
                _LOGGER.error(
                    "probe of primary entity %r refused (%s: %s): it stays failed over until this is fixed",
                    entity,
                    cls.name,
                    detail,
                )
            record = ProbeRecord(entity, mode, at, False, cls.name, detail, None, 0)
            evidence = WireEvidence(cls, target, began, state, transport, self.ctx.clock)
            self._finish(record, state.probe_failed(cls, detail, evidence))
            return
        except BaseException:
            state.record_probe(False, "unexpected", "the probe thread was interrupted")
            raise
        record = ProbeRecord(
            entity,
            mode,
            at,
            True,
            None,
            probed.detail,
            probed.sequence_number,
            probed.cancel_attempts,
            probed.cancel_ok,
        )
        self._finish(record, state.record_probe(True, None, f"{mode} probe succeeded"))

    def _finish(self, record: ProbeRecord, transitions: list[StateTransition]) -> None:
        with self._finished_lock:
            self._finished.append((record, transitions))
