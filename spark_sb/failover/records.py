"""The failover records: the entity states, transitions, statuses and backlog pulls, and the default listener
(SPEC B3, S4). Small, frozen and picklable: they travel from executors back to the driver in the send outcome.
Pure data; runs anywhere."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from spark_sb.core.redact import redact

_LOGGER = logging.getLogger(__name__)


class EntityState(str, Enum):
    """Failover state of one primary entity."""

    HEALTHY = "healthy"
    FAILING = "failing"
    FAILED_OVER = "failed_over"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class StateTransition:
    """One state change of a primary entity; goes to the listener, the send outcome and the Delta event log."""

    entity: str
    from_state: EntityState
    to_state: EntityState
    at: datetime
    error_class: str | None = None
    detail: str = ""
    namespace: str | None = None


@dataclass(frozen=True)
class EntityStatus:
    """The current state of one entity (for the Delta current-state table, SPEC S4)."""

    namespace: str
    entity: str
    state: EntityState
    since: datetime
    first_failure: datetime | None = None
    last_error_class: str | None = None
    #: The entity accepted a message (or a probe) for this sink, here or - through the state table - elsewhere:
    #: a not-found answer from it now is an outage, not a typo (SPEC F9).
    accepted: bool = True


@dataclass(frozen=True)
class BacklogPull:
    """A backlog queue pulled from the rotation until ``until`` (UTC)."""

    namespace: str
    queue: str
    at: datetime
    until: datetime
    error_class: str | None = None
    detail: str = ""


Listener = Callable[[StateTransition], None]


def log_transition(transition: StateTransition) -> None:
    """The default listener: WARNING when an entity leaves HEALTHY, INFO when it comes back."""
    level = logging.INFO if transition.to_state is EntityState.HEALTHY else logging.WARNING
    _LOGGER.log(
        level,
        "entity %r: %s -> %s (%s%s)",
        transition.entity,
        transition.from_state.value,
        transition.to_state.value,
        transition.error_class or "ok",
        f": {redacted(transition.detail)}" if transition.detail else "",
    )


def log_transitions(transitions: Sequence[StateTransition], *, named: int = 5) -> None:
    """The default listener for the transitions of one send call: one line per kind of change (from, to, error
    class, detail) however many entities made it - a namespace outage over a thousand entities logs two lines,
    not two thousand - naming the first ``named`` entities. A kind that one entity made is logged as
    :func:`log_transition` logs it. Bounded by the kinds of change, not by the entities."""
    groups: dict[tuple[EntityState, EntityState, str | None, str], list[StateTransition]] = {}
    for t in transitions:
        groups.setdefault((t.from_state, t.to_state, t.error_class, t.detail), []).append(t)
    for (from_state, to_state, error_class, detail), group in groups.items():
        if len(group) == 1:
            log_transition(group[0])
            continue
        names = ", ".join(repr(t.entity) for t in group[:named])
        more = f" and {len(group) - named} more" if len(group) > named else ""
        _LOGGER.log(
            logging.INFO if to_state is EntityState.HEALTHY else logging.WARNING,
            "%d entities (%s%s): %s -> %s (%s%s)",
            len(group),
            names,
            more,
            from_state.value,
            to_state.value,
            error_class or "ok",
            f": {redacted(detail)}" if detail else "",
        )


def redacted(text: str) -> str:
    """Redact secrets from free text before it is logged or recorded."""
    return redact(text)
