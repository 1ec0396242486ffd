"""What one :meth:`~spark_sb.sender.paired.PairedSender.send` call did (:class:`SendOutcome`, :class:`ProbeRecord`), the
mutable tally that builds it during the call, and the secret-free naming of namespaces and errors used in
records, logs and error texts. The records are small, frozen and picklable: they travel from executors back to
the driver in the partition result. Pure data; runs anywhere."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from spark_sb.core.counts import SentAndDiverted, merge_fields
from spark_sb.failover.ordering import RETURN_WAIT
from spark_sb.failover.records import BacklogPull, StateTransition
from spark_sb.message.outbound import OutboundMessage, Reject

# ---------------------------------------------------------------------------------------------------------
# Outcome


@dataclass(frozen=True)
class ProbeRecord:
    """One probe of a failed-over primary entity (B8)."""

    entity: str
    mode: str
    at: datetime
    ok: bool
    error_class: str | None = None
    detail: str = ""
    sequence_number: int | None = None
    cancel_attempts: int = 0
    cancel_ok: bool | None = None


@dataclass(frozen=True)
class SendOutcome(SentAndDiverted):
    """What one :meth:`PairedSender.send` call did; small and picklable (returned from executors to the driver).

    ``sent``: messages accepted by the primary, per entity. ``diverted``: per backlog queue;
    ``diverted_by_entity``: the same messages per original entity. ``rejects``: messages not sent (B7/S6).
    """

    sent: Mapping[str, int] = field(default_factory=dict)
    diverted: Mapping[str, int] = field(default_factory=dict)
    diverted_by_entity: Mapping[str, int] = field(default_factory=dict)
    rejects: tuple[Reject, ...] = ()
    transitions: tuple[StateTransition, ...] = ()
    probes: tuple[ProbeRecord, ...] = ()
    pulls: tuple[BacklogPull, ...] = ()
    retries: int = 0
    elapsed: float = 0.0
    #: Seconds spent backing off because the primary answered "server busy" (throttled), per entity (SPEC L4).
    throttled: Mapping[str, float] = field(default_factory=dict)

    @property
    def total_rejected(self) -> int:
        return len(self.rejects)

    def merge(self, other: SendOutcome) -> SendOutcome:
        """The sum of two outcomes (counts added, records concatenated)."""
        return merge_fields(self, other)


class Tally:
    """The mutable outcome being built during one send call."""

    def __init__(self) -> None:
        self.sent: dict[str, int] = {}
        self.diverted: dict[str, int] = {}
        self.diverted_by_entity: dict[str, int] = {}
        self.warned: set[str] = set()  # entities warned about in this call (a wrong destination, SPEC F9)
        self.rejects: list[Reject] = []
        self.transitions: list[StateTransition] = []
        self.probes: list[ProbeRecord] = []
        self.pulls: list[BacklogPull] = []
        self.retries = 0
        self.throttled: dict[str, float] = {}  # entity -> seconds backed off on "server busy"
        self.unlogged: list[
            StateTransition
        ] = []  # for the default listener: logged by kind at the call's end
        self.sticky: dict[str, str] = {}  # entity -> its backlog queue, until the next batch boundary
        # ordering (spark_sb.failover.ordering), per (entity, session) line of this call - bounded by the call's lines:
        self.ordered: dict[tuple[str, str], int] = {}  # messages diverted (each closed at the call's end, R2)
        self.direct: set[tuple[str, str]] = set()  # lines this call routed to the primary (they stay there)
        self.stopped: dict[tuple[str, str], str] = {}  # lines whose backlog queue failed (R4): why
        # O8: the pulled queues of held lines this call tried (True: the try is granted or it answered; False: it
        # failed, the lines stop) - bounded by the backlog queues
        self.pinned_tries: dict[str, bool] = {}
        self.return_wait = RETURN_WAIT  # R5: seconds the call may still wait for held lines' acknowledgements

    def count_sent(self, entity: str, count: int) -> None:
        self.sent[entity] = self.sent.get(entity, 0) + count

    def count_diverted(self, queue: str, count: int, entities: list[str]) -> None:
        """``count`` messages accepted by backlog ``queue``; ``entities``: the original entity of each."""
        self.diverted[queue] = self.diverted.get(queue, 0) + count
        for entity in entities:
            self.diverted_by_entity[entity] = self.diverted_by_entity.get(entity, 0) + 1

    def build(self, elapsed: float) -> SendOutcome:
        return SendOutcome(
            sent=dict(self.sent),
            diverted=dict(self.diverted),
            diverted_by_entity=dict(self.diverted_by_entity),
            rejects=tuple(self.rejects),
            transitions=tuple(self.transitions),
            probes=tuple(self.probes),
            pulls=tuple(self.pulls),
            retries=self.retries,
            elapsed=elapsed,
            throttled=dict(self.throttled),
        )


# ---------------------------------------------------------------------------------------------------------
# Namespace naming without secrets


def namespace_key(ns: Any) -> str:
    """A secret-free identity of a namespace (host[:port]) used to key shared state."""
    return str(ns.endpoint_host())


def namespace_description(ns: Any) -> str:
    """The redacted description of a namespace for error texts."""
    return str(ns.redacted())


def message_row(msg: OutboundMessage) -> dict[str, Any]:
    row: dict[str, Any] = {f.name: getattr(msg, f.name) for f in fields(msg)}
    row["properties"] = dict(msg.properties)
    return row
