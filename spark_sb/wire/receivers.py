"""The syphon's receivers on one AMQP connection (SPEC F2, F6: the same connection model everywhere).

A :class:`~spark_sb.syphon.mover.Syphon` drains its backlog queues one after another; each queue (and its dead-letter
queue) needs a peek-lock receiver. Built as the SDK builds them, every receiver would hold a connection of its
own: ``2 x backlog_queue_count`` connections to the secondary per draining process. Here they are links on one
connection, opened the way the paired sender's transport opens its own (:func:`~spark_sb.wire.opening.
open_connection`: the SDK's settings, an idle timeout the namespace answers with heartbeats), in one
:class:`~spark_sb.wire.lane.Lane`: every receive and settle runs on its thread within the call's deadline, and a
connection that stalls or faults is abandoned by resetting the lane (closed in the background), every receiver
rebuilt on next use. Draining is sequential, so one thread serves every receiver without waiting on another.

Where it runs: in the process of the Syphon (executors' Python workers in the Spark syphon job; the driver in tests
and tools), on the lane's thread. Not picklable. What bounds it: one connection and one thread per Syphon, and at
most one receiver link per (backlog queue, sub-queue) it drains - ``2 x backlog_queue_count``.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.wire import closing, liveness, opening, pyamqp_state, timing
from spark_sb.wire.lane import Lane

if TYPE_CHECKING:  # pragma: no cover
    from azure.servicebus import ServiceBusClient, ServiceBusReceiver

log = logging.getLogger(__name__)
R = TypeVar("R")


class Receiving:
    """What a receive or settle runs with: the client and the receiver of one (queue, sub-queue)."""

    __slots__ = ("client", "receiver")

    def __init__(self, client: ServiceBusClient, receiver: ServiceBusReceiver) -> None:
        self.client = client
        self.receiver = receiver


class SharedReceivers:
    """The receiver lane's context: one connection to the secondary (the syphon; ``namespace="primary"``: the
    source) and a receiver link per (queue, sub-queue) on it, each opened at its first use, with ``prefetch``
    (the syphon's setting when None). Used by the lane's thread only (``unblock`` excepted)."""

    def __init__(
        self, config: ServiceBusConfig, namespace: str = "secondary", prefetch: int | None = None
    ) -> None:
        ns = config.secondary if namespace == "secondary" else config.primary
        assert ns is not None
        self.client: ServiceBusClient = ns.client(**{**config.client_kwargs(), "retry_total": 0})
        self.prefetch = config.syphon_prefetch if prefetch is None else prefetch
        self.connection: Any = None
        # Bounded by the (backlog queue, sub-queue) pairs drained: 2 x backlog_queue_count.
        self.receivers: dict[tuple[str, bool], ServiceBusReceiver] = {}
        self.opened = 0  # connections opened (tests count them)

    def receiver(self, queue: str, dead_letter: bool, timeout: float) -> ServiceBusReceiver:
        """The open receiver of ``queue`` (its dead-letter queue with ``dead_letter``), opened now if needed
        within ``timeout`` - on a new connection if there is none."""
        deadline = time.monotonic() + timeout
        if self.connection is not None and (
            pyamqp_state.connection_broken(self.connection) or liveness.connection_silent(self.connection)
        ):
            self.discard(
                "closed"
                if pyamqp_state.connection_broken(self.connection)
                else f"silent for more than {timing.SILENT_AFTER:.3g} s"
            )
        if self.connection is None:
            self.connection = opening.open_connection(self.client, timeout)
            self.opened += 1
        key = (queue, dead_letter)
        found = self.receivers.get(key)
        if found is not None:
            if pyamqp_state.running(found) and pyamqp_state.handler_open(found):
                return found
            self.drop(queue, dead_letter)
        receiver = self._begin(queue, dead_letter)
        try:
            handler = pyamqp_state.handler_of(receiver)
            while not handler.client_ready():  # pumps the shared connection: CBS, session, attach
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the receiver of {queue!r} was not attached in time")
        except BaseException:
            _quiet_close(receiver)
            raise
        pyamqp_state.set_running(receiver, True)
        self.receivers[key] = receiver
        return receiver

    def _begin(self, queue: str, dead_letter: bool) -> ServiceBusReceiver:
        from azure.servicebus import ServiceBusReceiveMode, ServiceBusSubQueue

        receiver: Any = self.client.get_queue_receiver(
            queue,
            sub_queue=ServiceBusSubQueue.DEAD_LETTER if dead_letter else None,
            receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
            prefetch_count=self.prefetch,
        )
        pyamqp_state.create_handler(receiver)
        # No keep-alive thread: the SDK starts one per receiver (every 5 s with no prefetch) that reads the
        # connection from its own thread - on a shared connection, a second reader (it re-attached links it saw
        # half-open: "link name already attached"). The lane's idle tend reads and answers heartbeats instead.
        pyamqp_state.without_keep_alive(receiver)
        # a session and CBS links on the shared connection
        pyamqp_state.open_on(receiver, self.connection, closing.end_session_after_links)
        return receiver  # type: ignore[no-any-return]

    def drop(self, queue: str, dead_letter: bool) -> None:
        """Close one receiver link (its unsettled messages are released); the connection stays."""
        receiver = self.receivers.pop((queue, dead_letter), None)
        if receiver is not None:
            _quiet_close(receiver)

    def tend(self) -> None:
        """Between calls (the lane's idle tick): read what came (heartbeats, a close; pyamqp's ``listen`` also
        sends our empty frame when the namespace's idle timeout wants one), drop a connection that went silent or
        was closed, and renew each receiver's token in its refresh window (the SDK renews only inside its calls).
        Cost: one short read and a look at each receiver, bounded by the receivers."""
        connection = self.connection
        if connection is None or not liveness.tend(connection, self.discard):
            return
        liveness.renew_tokens(
            self.receivers,
            lambda key: self.drop(*key),
            log,
            "renewing a receiver's token failed (%s): reopened on next use",
        )

    def discard(self, why: str) -> None:
        """Drop the connection and every receiver on it (nothing blocks: the socket is shut down first); the next
        call opens a new one. Unsettled messages are redelivered when their locks run out."""
        connection, self.connection = self.connection, None
        receivers = list(self.receivers.values())
        self.receivers.clear()
        if connection is None:
            return
        log.info("a receiver connection was dropped (%s); a new one is opened on next use", why)
        closing.shut_down_connection(connection)
        for receiver in receivers:
            _quiet_close(receiver)
        closing.close_connection(
            connection
        )  # its socket too, whatever the close frame did (no fd left behind)

    def unblock(self) -> None:
        """Shut the connection's socket down so a call stuck in it returns (from another thread). Never raises."""
        if self.connection is not None:
            closing.shut_down_connection(self.connection)

    def close(self) -> None:
        """Close every receiver (what they hold is released), the connection and the client (the lane's close)."""
        for receiver in list(self.receivers.values()):
            _quiet_close(receiver)
        self.receivers.clear()
        connection, self.connection = self.connection, None
        if connection is not None:
            closing.close_connection(connection)  # its socket too, whatever the close frame did
        with contextlib.suppress(Exception):
            self.client.close()


def _quiet_close(receiver: ServiceBusReceiver) -> None:
    """Close one receiver link as the SDK closes a receiver: what its link buffered or still had in flight is
    released (not left locked until its lock expires), then its link, session and CBS links close; the shared
    connection stays. Never raises."""
    if pyamqp_state.handler_of(receiver) is None:
        return
    try:
        pyamqp_state.close_handler(
            receiver
        )  # drains the link and releases what it held (bounded by the SDK's own cap)
    except Exception as exc:  # noqa: BLE001 - closing a failed link may fail; it is dropped anyway
        log.debug("closing a receiver link failed: %s", type(exc).__name__)
        pyamqp_state.set_running(receiver, False)


class ReceiverLane:
    """One (queue, sub-queue) receiver as the syphon's drain loop uses it: calls run on the shared receiver lane
    with that receiver; its generation is the lane's (a reset of the connection makes every held message stale:
    their locks run out and they are redelivered); replacing it resets the connection (draining is sequential,
    so no other queue's messages are held at that moment)."""

    def __init__(self, shared: Lane[SharedReceivers], queue: str, dead_letter: bool) -> None:
        self._shared = shared
        self.queue = queue
        self.dead_letter = dead_letter

    @property
    def generation(self) -> int:
        """The connection's generation: that of the live worker, or - none live (reset, abandoned at a deadline,
        not started) - that of the next one, which no held message has. The lane itself bumps it only when the
        next call builds a worker: read alone, a settle just after a reset took the old connection's messages
        for live and sent their delivery ids down the new connection's links."""
        shared = self._shared
        return shared.generation if shared.live else shared.generation + 1

    def call(self, fn: Callable[[Receiving], R], timeout: float) -> R:
        deadline = time.monotonic() + timeout
        queue, dead_letter = self.queue, self.dead_letter

        def run(ctx: SharedReceivers) -> R:
            receiver = ctx.receiver(queue, dead_letter, max(0.0, deadline - time.monotonic()))
            return fn(Receiving(ctx.client, receiver))

        return self._shared.call(run, timeout)

    def reset(self, why: str) -> None:
        self._shared.reset(why)


def receivers_lane(
    config: ServiceBusConfig,
    namespace: str = "secondary",
    prefetch: int | None = None,
    name: str = "syphon-receivers",
) -> Lane[SharedReceivers]:
    """A receiver lane (the syphon's one, on the secondary; the source's on the primary): its context (the
    connection) is built at the first call, on its thread."""
    return Lane(
        name,
        functools.partial(SharedReceivers, config, namespace, prefetch),
        SharedReceivers.close,
        SharedReceivers.unblock,
        idle=SharedReceivers.tend,
        idle_every=timing.TEND_EVERY,
    )


# -- range dispositions on a receiving link (the syphon's completions, the source's defers and completions) ----------
T = TypeVar("T")


def dispose_on_link(
    receiver: ServiceBusReceiver,
    items: Sequence[T],
    deadline: float,
    outcome: Any = None,
    message_of: Callable[[T], Any] = lambda item: item,
) -> list[T] | None:
    """Settle ``items`` (``message_of(item)``: the SDK message) on the receiver link that received them with
    ``outcome`` (a pyamqp outcome; None: ``Accepted``), in one round trip: dispositions (unsettled; one frame per
    run of consecutive delivery ids, first..last), then one wait, until ``deadline`` (``time.monotonic()``), for the
    service's outcomes, where the SDK waits for each in turn. Returns the items whose settlement was not confirmed
    (refused, lock lost, no answer in time, link gone: their locks run out), or None when this SDK's link offers no
    such way (the caller settles one by one, as the SDK does). Runs on the receiver lane's thread.

    The link's own machinery (the SDK's pyamqp receiver link, private: the same calls its ``send_disposition``
    makes) is used, never ``$management``: update-disposition is for messages received by sequence number."""
    link = _receive_link(receiver)
    if link is None:
        return None
    from azure.servicebus._pyamqp.constants import LinkState  # noqa: PLC0415 - the SDK's, only when used
    from azure.servicebus._pyamqp.outcomes import Accepted  # noqa: PLC0415
    from azure.servicebus._pyamqp.receiver import check_disposition_outcome  # noqa: PLC0415

    _index_dispositions(link)
    state_out = Accepted() if outcome is None else outcome
    expected = type(
        state_out
    ).__name__.lower()  # the outcome the service echoes when it applied it: "modified"
    pending: dict[int, dict[str, Any]] = link._pending_dispositions  # noqa: SLF001
    tags: set[bytes] | None = getattr(link, "_received_delivery_tags", None)
    sent: list[tuple[T, int]] = []
    not_done: list[T] = []
    try:
        for run in _runs(items, message_of, pending, tags, not_done):
            ids = [delivery_id for _, delivery_id in run]
            for delivery_id in ids:
                pending[delivery_id] = {"settled": False, "outcome": None}
            first_tag = message_of(run[0][0])._delivery_tag  # noqa: SLF001
            try:  # one disposition frame for the run (first..last), as AMQP allows
                link._outgoing_disposition(  # noqa: SLF001
                    ids[0], ids[-1] if len(ids) > 1 else None, first_tag, False, state_out, None
                )
            except Exception as exc:  # noqa: BLE001 - not this link's delivery (e.g. the SDK reattached): counted
                for delivery_id in ids:
                    pending.pop(delivery_id, None)
                log.debug("no disposition for %d held messages (%s)", len(ids), type(exc).__name__)
                not_done.extend(item for item, _ in run)
                continue
            if tags is not None:
                for item, _ in run[1:]:
                    tags.discard(message_of(item)._delivery_tag)  # noqa: SLF001 - settled by the run's frame
            sent.extend(run)
        connection = link._session._connection  # noqa: SLF001
        # the outcomes still awaited, in delivery-id order (the order they come back in): the front is dropped as
        # it is answered, so a wait for n outcomes costs O(n), not a scan of all n per frame read (O(n^2): a
        # 5,000-message defer took 9 s); one frame per read: a read that asks for more than arrive sits out the
        # socket's timeout for each missing one (the service may answer a whole range in one frame)
        waiting = collections.deque(sorted(d for _, d in sent))
        while waiting:
            while waiting and pending[waiting[0]]["settled"]:
                waiting.popleft()
            if not waiting:
                break
            if time.monotonic() >= deadline or link.state in (LinkState.DETACHED, LinkState.ERROR):
                break
            connection.listen(wait=False)
    except Exception as exc:  # noqa: BLE001 - the connection failed while waiting: what is not confirmed is counted
        log.debug("awaiting the dispositions' outcomes failed (%s)", type(exc).__name__)
    finally:
        for item, delivery_id in sent:
            state = pending.pop(delivery_id, None) or {}
            try:
                if not state.get("settled"):
                    raise TimeoutError("no outcome")
                check_disposition_outcome(delivery_id, state.get("outcome"), expected)
            except Exception:  # noqa: BLE001 - refused (lock lost), or no answer: its lock runs out
                not_done.append(item)
                continue
            with contextlib.suppress(AttributeError):
                message_of(item)._settled = True  # noqa: SLF001 - the SDK's own flag: settled, never settle again
    return not_done


def _index_dispositions(link: Any) -> None:
    """Make the link find an incoming disposition's awaited deliveries by id, not by walking every awaited one:
    pyamqp's ``ReceiverLink._incoming_disposition`` scans all pending dispositions for each frame, and the namespace
    answers a range delivery by delivery - O(n^2) for n awaited outcomes (measured: 5,000 defers awaited 13 s, 11 s
    of it in that scan). Same rule (a settled answer from the sender sets outcome and settled for the ids in
    first..last); a range wider than what is awaited is still walked the SDK's way. Installed once per link
    (instance attribute); the link's own method is kept for that case."""
    original = getattr(link, "_incoming_disposition", None)
    if original is None or getattr(link, "_spark_sb_indexed", False):
        return  # not pyamqp's link (a test's), or indexed already
    from azure.servicebus._pyamqp.constants import Role  # noqa: PLC0415 - the SDK's, only when used

    def incoming_disposition(frame: Any) -> None:
        pending: dict[int, dict[str, Any]] = link._pending_dispositions  # noqa: SLF001
        if not pending or frame[0] != Role.Sender or not frame[3]:
            return
        first = frame[1]
        last = frame[2] if frame[2] is not None else first
        if not 0 <= last - first < len(pending):
            original(frame)
            return
        for delivery_id in range(first, last + 1):
            found = pending.get(delivery_id)
            if found is not None:
                found["outcome"] = frame[4]
                found["settled"] = True

    link._incoming_disposition = incoming_disposition  # noqa: SLF001
    link._spark_sb_indexed = True  # noqa: SLF001


def _runs(
    items: Sequence[T],
    message_of: Callable[[T], Any],
    pending: dict[int, Any],
    tags: set[bytes] | None,
    not_done: list[T],
) -> list[list[tuple[T, int]]]:
    """``items`` by delivery id in runs of consecutive ids, each a delivery this link carried (its tag among the
    link's ``tags``; unknown: a run of its own, which the link refuses); without a delivery id, or already awaited,
    into ``not_done``."""
    ordered: list[tuple[T, int]] = []
    for item in items:
        delivery_id = message_of(item)._delivery_id  # noqa: SLF001
        if delivery_id is None or delivery_id in pending:
            not_done.append(item)
        else:
            ordered.append((item, delivery_id))
    ordered.sort(key=lambda pair: pair[1])
    runs: list[list[tuple[T, int]]] = []
    extendable = False  # the last run's deliveries are all the link's
    for item, delivery_id in ordered:
        known = tags is not None and message_of(item)._delivery_tag in tags  # noqa: SLF001
        if extendable and known and delivery_id == runs[-1][-1][1] + 1:
            runs[-1].append((item, delivery_id))
        else:
            runs.append([(item, delivery_id)])
            extendable = known
    return runs


def _receive_link(receiver: ServiceBusReceiver) -> Any:
    """The receiver's open pyamqp receive link when it has what :func:`dispose_on_link` uses, else None."""
    handler = getattr(receiver, "_handler", None)
    link = getattr(handler, "_link", None)
    needed = ("_pending_dispositions", "_outgoing_disposition", "_session", "state")
    if link is None or getattr(link, "_is_closed", True) or not all(hasattr(link, a) for a in needed):
        return None
    return link
