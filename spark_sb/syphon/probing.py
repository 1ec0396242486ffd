"""May the syphon move to an entity now (SPEC B9, F9): the entity gate asked, a probe made when it says so, the
failure of a call to the primary told as the namespace's or the entity's.

Part of :class:`~spark_sb.syphon.mover.Syphon` (:mod:`spark_sb.syphon.base` lists the parts); the gate's rules on plain
data are :class:`~spark_sb.syphon.rules.EntityGate`, the probe the sender's own (:mod:`spark_sb.wire.probe`). Why:
docs/design/syphon.md. Where it runs: in the syphon's process, on the thread that drains.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from spark_sb.syphon.base import SyphonBase, log
from spark_sb.syphon.receivers import Pairs
from spark_sb.syphon.rules import ENTITY_NOT_FOUND, SyphonOutcome, due_for_verdict
from spark_sb.wire.probe import probe_call, single_attempt
from spark_sb.wire.sdk_transport import SdkTransport
from spark_sb.wire.transport import PRIMARY, Target


class Probing(SyphonBase):
    """The syphon's part that asks the entity gate and probes the primary entities."""

    @staticmethod
    def _redelivered(pairs: Pairs) -> bool:
        """O7: was one of ``pairs`` delivered before and not moved (an earlier attempt failed, here or in another
        worker)? Then a worker that did not send to its entity recently probes before it tries again."""
        return any((getattr(h.msg, "delivery_count", None) or 0) > 1 for h in pairs)

    def _allowed(self, entity: str, outcome: SyphonOutcome, *, proven: bool = False) -> bool:
        """B9: may the syphon move to ``entity`` now? Probes it when the gate says so - and, with ``proven``,
        unless this process sent to it recently (a hint of the state table may be stale: a worker new to the
        entity would make a delivery, and fail, where a probe costs none)."""
        decision = self.gate.decide(entity)
        if decision == "send" and (not proven or self.gate.known_good(entity)):
            return True
        if decision == "wait":
            return False
        outcome.probes += 1
        started = time.monotonic()
        try:
            self._probe(entity)
        except Exception as exc:  # noqa: BLE001 - the entity does not answer: back off
            outcome.errors.append(f"{entity}: probe failed: {type(exc).__name__}")
            from spark_sb.core.errors import classify, describe_error

            if classify(exc).fail_batch:  # a refusal no retry changes: said loudly, never a silent backlog
                log.error(
                    "syphon: probe of primary entity %s refused (%s: %s); its messages stay in the backlog "
                    "until this is fixed",
                    entity,
                    classify(exc).name,
                    describe_error(exc),
                )
            else:
                log.info(
                    "syphon: probe of primary entity %s failed (%s); backing off", entity, type(exc).__name__
                )
            self._missing[entity] = classify(exc).name == ENTITY_NOT_FOUND
            self.gate.failed(
                entity, namespace_wide=self._namespace_wide(entity, exc, started, self._primary.isolated())
            )
            return False
        self._missing.pop(entity, None)
        self.gate.succeeded(entity)
        return True

    def _namespace_wide(
        self, entity: str, exc: BaseException, started: float, transport: SdkTransport | None = None
    ) -> bool:
        """Is this failure of a call to ``entity`` that started at ``started`` (real monotonic time: it is set
        against the connection's real heartbeats) the primary namespace's (F1)?"""
        from spark_sb.core.errors import classify
        from spark_sb.failover.decisions import namespace_wide
        from spark_sb.wire.timing import NAMESPACE_SILENCE

        # Namespace facts (SPEC F7): its connection silent past the heartbeat, not one entity's slow answer.
        answered = (transport or self._primary).answered_within(Target(PRIMARY, entity), NAMESPACE_SILENCE)
        return namespace_wide(classify(exc), connection_answered=answered)

    def _probe(self, entity: str) -> None:
        """One probe of the primary entity (``probe_mode``), the sender's own (:func:`~spark_sb.wire.probe.probe_call`),
        each call within ``send_timeout``; the cancel of a scheduled probe is tried once."""
        timeout = float(self.config.send_timeout)
        target = Target(PRIMARY, entity)
        probe_call(
            self._primary.isolated(),  # its own connection: a stalled entity's probe never holds the forwards (F6)
            target,
            self.config.probe_mode,
            timeout,
            single_attempt(timeout),
            datetime.now(timezone.utc),
        )

    def _last_attempt(self, entity: str, pairs: Pairs) -> bool:
        """F9: instead of a probe, send ``pairs`` themselves when the gate would probe ``entity`` and one of them
        is due for a verdict (a not-found answer to this delivery dead-letters it, :func:`due_for_verdict`). A
        probe answers only whether the entity takes messages; the verdict needs the answer to the send itself."""
        limit = int(self.config.syphon_max_attempts)
        if not any(due_for_verdict(getattr(h.msg, "delivery_count", None), limit) for h in pairs):
            return False
        return self.gate.decide(entity) == "probe"

    def _isolated(self) -> SdkTransport | None:
        """The primary's isolated transport (a sick entity's sends never hold the healthy forwards, F6), or None
        once closed (the forward then fails as any call after close does)."""
        try:
            return self._primary.isolated()
        except Exception:  # noqa: BLE001 - closed: the main transport raises the same when used
            return None
