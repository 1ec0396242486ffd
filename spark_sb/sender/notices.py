"""What the paired sender tells its user beyond the outcome (SPEC F9): a primary namespace never reached, an entity
that does not exist (a wrong destination, rejected - not diverted), throttling that was no outage. Runs on the
sender's thread; logs under the sender's name (``spark_sb.sender.paired``, what users configure).
"""

from __future__ import annotations

import logging

from spark_sb.config.namespace import NamespaceConfig
from spark_sb.core.errors import describe_error
from spark_sb.failover.decisions import WRONG_DESTINATION
from spark_sb.failover.outcome import Tally, namespace_description, namespace_key
from spark_sb.failover.registry import FailoverRegistry
from spark_sb.message.outbound import RejectError
from spark_sb.sender.diverter import Rejects
from spark_sb.wire.transport import Batch

_LOGGER = logging.getLogger("spark_sb.sender.paired")


def never_reached(registry: FailoverRegistry, primary: NamespaceConfig) -> None:
    """A call diverted messages and the primary namespace never answered this sink (here, or as the state table
    says): more likely a wrong endpoint than an outage. Said at every such call (SPEC F9); nothing is lost, the
    messages are in the backlog."""
    health = registry.namespace(namespace_key(primary))
    if health is not None and health.reached:
        return
    _LOGGER.error(
        "the primary namespace %s was never reached by this sink; check the endpoint (messages are diverted "
        "to the backlog meanwhile, nothing is lost)",
        namespace_description(primary),
    )


def wrong_destination(
    rejects: Rejects, batch: Batch, tally: Tally, error: BaseException | None, primary: NamespaceConfig
) -> None:
    """The primary entity answered not-found and never accepted a message for this sink: a wrong destination
    (a typo in the ``entity`` column or option), not an outage (SPEC F9). Its messages are rejected with reason
    ``entity_not_found`` (``on_reject: fail`` fails the call), with one WARNING per entity and call."""
    entity = batch.target.entity
    where = f"the primary namespace {namespace_description(primary)}"
    if entity not in tally.warned:
        tally.warned.add(entity)
        _LOGGER.warning(
            "entity %r does not exist in %s and never accepted a message for this sink: its %d message(s) are "
            "rejected (entity_not_found), not diverted; check the entity column or option (%s)",
            entity,
            where,
            len(batch),
            describe_error(error) if error is not None else "not found",
        )
    reason = (
        f"{WRONG_DESTINATION}: entity {entity!r} does not exist in {where} (it never accepted a message for this "
        "sink: a configuration error, not an outage)"
    )
    for m in batch.messages:
        rejects.reject(tally, m, RejectError(reason, "entity"), entity, None)


def warn_throttled(tally: Tally) -> None:
    """One WARNING per call that the primary throttled (server busy): how long it backed off; nothing diverted."""
    throttled = sorted(tally.throttled.items(), key=lambda kv: -kv[1])
    _LOGGER.warning(
        "%s throttled by the primary namespace (server busy): backed off %s in this call; not an "
        "outage, nothing diverted",
        f"entity {throttled[0][0]!r} was"
        if len(throttled) == 1
        else f"{len(throttled)} entities (most: {throttled[0][0]!r}) were",
        f"{throttled[0][1]:.1f} s"
        if len(throttled) == 1
        else f"{sum(tally.throttled.values()):.1f} s in all",
    )
