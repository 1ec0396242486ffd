"""One namespace's shared AMQP connection and a link per entity on it, kept alive between calls (SPEC F1-F3, L1-L3).

A :class:`SharedConnection` is the context of a :class:`~spark_sb.wire.lane.Lane` of
:class:`~spark_sb.wire.sdk_transport.SdkTransport`: it opens the connection (:mod:`~spark_sb.wire.opening`), opens links
concurrently, makes each call on its link within its deadline - once more on a fresh link when the service ended
the old one for its lifecycle (:data:`RENEWABLE`), once more on a fresh connection when its own was found dead while
it waited (:mod:`~spark_sb.wire.liveness`) - and between calls tends it. Used on the lane's worker, or by a direct
call holding the lane's ``use`` lock; never by two threads at once; only :meth:`SharedConnection.unblock` runs on
another thread. Runs on executors; nothing here is picklable. Why it is built so: ``docs/design/wire.md``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from spark_sb.core.errors import classify, condition_of, token_expired
from spark_sb.wire.closing import close_connection, end_session_after_links, shut_down_connection
from spark_sb.wire.liveness import Liveness, Spare, connection_silent, renew_tokens, tend
from spark_sb.wire.opening import Opening, listening
from spark_sb.wire.parking import Parked
from spark_sb.wire.pyamqp_state import (
    connection_broken,
    create_handler,
    ended_by_service,
    finish_open,
    handler_of,
    handler_open,
    last_heard,
    link_attached,
    link_of,
    link_ready,
    open_on,
    running,
    set_running,
    short_reads,
)
from spark_sb.wire.timing import (
    QUIET,
    RENEW_AT_LEAST,
    SDK_SLICE,
    SILENT_AFTER,
    VERIFY_WAIT,
    sdk_timeout,
)

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusClient, ServiceBusSender

__all__ = [
    "OPENING_AT_ONCE",
    "RENEWABLE",
    "FoundDead",
    "NeedsWorker",
    "SharedConnection",
    "kept_on_refusal",
    "renewable",
]

_LOGGER = logging.getLogger(__name__)

#: Links being opened at once on one connection (a wave): bounds the handlers polled per round of answers.
OPENING_AT_ONCE = 128

#: Error conditions with which the service ends a link or connection for its lifecycle, not for an outage: a link
#: idle for 10 minutes (``detach-forced``, "IdleTimerExpired"), a token that expired (``unauthorized-access`` on a
#: link that was authorized), a connection without links for a minute (``connection:forced``). A send that meets
#: one is made once more on a fresh link or connection, within its own deadline, and never counts as a failure.
RENEWABLE = frozenset({"amqp:link:detach-forced", "amqp:unauthorized-access", "amqp:connection:forced"})


class SharedConnection:
    """A lane's context: ONE AMQP connection to a namespace and one link (an SDK ``ServiceBusSender``) per entity
    on it (SPEC F2), as the SDK's own connection sharing intends. Used by the lane's thread, or by a direct call
    while it holds the lane's ``use`` lock; never by two threads at once.

    The connection lives for weeks (SPEC L1-L3): between calls :meth:`tend` reads its frames (the namespace's
    heartbeats, a detach or close the service sends) and sends ours when due, renews the links' tokens, and drops
    a connection that went silent or was closed; :meth:`ensure` opens a new one when the next call needs it.

    ``senders`` is bounded by the entities this process sends to on the namespace; a link that failed or that the
    service detached is dropped (closed) and reopened on next use, the connection stays.
    """

    __slots__ = (
        "client",
        "connection",
        "detached",
        "dropped",
        "liveness",
        "opener",
        "opening",
        "renewed",
        "rescued",
        "senders",
    )

    def __init__(self, client: ServiceBusClient, opener: Callable[[float], Any]) -> None:
        self.client = client
        self.opener = opener  # opens a new pyamqp connection within a timeout (and counts it)
        self.connection: Any = None
        # the connection being opened by ensure (until it is open or failed): unblock reaches it (SPEC F8)
        self.opening: Opening | None = None
        self.senders: dict[str, ServiceBusSender] = {}
        self.dropped = 0  # connections found dead (silent or closed) and dropped before a call needed them
        # calls made once more because the service had ended their link or connection (RENEWABLE)
        self.renewed = 0
        self.detached = (
            0  # links found detached by the service between calls (idle, an expired token), dropped
        )
        # calls moved to a fresh connection because theirs was found dead while they waited (:meth:`on_link`)
        self.rescued = 0
        self.liveness: Liveness | None = None  # the connection's ping state (the ping in flight, if any)

    @property
    def broken(self) -> bool:
        """The connection is no longer open (closed by the service, a socket error, an idle timeout)."""
        return self.connection is None or connection_broken(self.connection)

    def heard(self) -> float | None:
        """When the connection last received a frame (``time.time()``), None if never."""
        return last_heard(self.connection)

    def silent(self) -> bool:
        """Nothing heard for :data:`SILENT_AFTER` seconds: the connection is dead (no I/O)."""
        return connection_silent(self.connection)

    def ensure(self, timeout: float, may_connect: bool = True) -> Any:
        """The open connection; a new one (within ``timeout``) if there is none, or the one there was is closed or
        silent. Raises what opening raised; :class:`NeedsWorker` instead of connecting when not ``may_connect``
        (a direct call: TCP and SASL run on the lane's worker only, see :meth:`~spark_sb.wire.lane.Lane.direct`)."""
        if self.connection is not None and (self.broken or self.silent()):
            self.discard("closed" if self.broken else f"silent for more than {SILENT_AFTER:.3g} s")
        if self.connection is None:
            if not may_connect:
                raise NeedsWorker("a new connection is needed")
            with listening(self._opening):
                self.connection = self.opener(timeout)
        return self.connection

    def _opening(self, opening: Opening | None) -> None:
        self.opening = opening

    def discard(self, why: str) -> None:
        """Drop the connection and every link on it (closed without waiting: a dead socket is shut down first, so
        nothing blocks); the next call opens a new one."""
        connection, self.connection = self.connection, None
        self.senders.clear()
        if connection is None:
            return
        self.dropped += 1
        _LOGGER.info("a connection was dropped (%s); a new one is opened on next use", why)
        shut_down_connection(connection)
        close_connection(connection)

    def tend(self) -> None:
        """Between calls (a lane's idle tick, on its worker): read what came (heartbeats, detaches, a close) and
        send our empty frame when the namespace's idle timeout wants one (pyamqp's ``listen`` does both), drop the
        connection if it went silent or was closed, drop links the service detached, and renew each link's token
        when its refresh window opens (the SDK renews only inside its own calls). Cost: one short read plus a
        look at each link - bounded by the entities of this namespace."""
        if self.connection is None or not tend(self.connection, self.discard):
            return
        if self.liveness is not None:
            self.liveness.settle()
        for entity, sender in list(self.senders.items()):
            if not link_attached(sender):
                self.detached += 1
                self.drop(entity)
        renew_tokens(
            self.senders, self.drop, _LOGGER, "renewing the token of a link failed (%s): reopened on next use"
        )

    def sender(self, entity: str, timeout: float, may_connect: bool = True) -> ServiceBusSender:
        """The open link to ``entity``, opened now if needed (within ``timeout``, on a new connection if the one
        there was is closed or silent); raises what opening raised (``may_connect``: see :meth:`ensure`)."""
        self.ensure(timeout, may_connect)
        found = self.senders.get(entity)
        if found is not None and running(found) and link_attached(found):
            return found
        errors = self.open_links([entity], timeout)
        if entity in errors:
            raise errors[entity]
        return self.senders[entity]

    def on_link(
        self,
        entity: str,
        fn: Callable[[ServiceBusSender, float], Any],
        timeout: float,
        may_connect: bool = True,
        rescue: float = 0.0,
        quiet: float = QUIET,
    ) -> Any:
        """``fn(sender, seconds_left)`` on the open link to ``entity``. If the service had ended that link or its
        connection for its lifecycle (:func:`renewable`: idle, an expired token), the call is made once more on a
        fresh link - on a fresh connection if the old one closed - within the same ``timeout``. A link that failed
        is dropped either way (reopened on next use).

        Liveness (SPEC L1; issue 29 item 4): while ``fn`` waits, the connection is watched (:class:`Liveness`):
        nothing heard on it for :data:`QUIET` seconds -> a ping; the ping not answered within
        :data:`PING_ANSWER` -> a fresh connection opened alongside (:class:`Spare`); once it is open (or was
        refused) the silent connection is dead and ``fn`` is cut short. A call that timed out with nothing heard
        since it began (shorter than :data:`QUIET`) is verified the same way (a ping, answered within
        :data:`VERIFY_WAIT`). A connection found dead is dropped and the call is made once more on the fresh
        connection, within ``timeout + rescue`` (the caller's deadline must allow for ``rescue``:
        :data:`RESCUE_ROOM`): a silently dropped connection then costs about a second and a half, not the call's
        whole budget, and is no failure at all - not even at ``failover_interval`` 0. If the fresh connection
        fails too (refused, stalled), that failure is raised: the namespace's evidence (connection-class, or a
        timeout with nothing heard), as it would have been. On a direct call (``may_connect`` False) the dead
        connection is dropped and :class:`NeedsWorker` raised: the caller makes the call again on the lane's
        worker, within what is left of the same ``timeout + rescue``.

        The cost: the first send may have reached the namespace before the connection died (its answer lost on
        the way), so the message may be enqueued twice - at-least-once, as for any retry after a timeout;
        exactly-once with duplicate detection on the entity (the message id is the same).

        ``quiet``: the silence after which the watch pings (:data:`QUIET`; a parkable send asks sooner, so that a
        stalled entity on an otherwise idle connection is told from a silent namespace by the time it may park:
        :mod:`~spark_sb.wire.parking`). A :class:`~spark_sb.wire.parking.Parked` send keeps its link."""
        deadline = time.monotonic() + timeout
        # A link that does not attach (an entity that stalls) gives up before the lane's deadline: it costs the
        # link, never the connection the other entities use (SPEC F6).
        sender = self.sender(entity, sdk_timeout(timeout), may_connect)
        # the link now: the SDK replaces the handler on errors
        link = link_of(sender)
        watch = self._liveness() if rescue > 0.0 else None
        opener = self.opener

        def open_spare() -> Spare:
            return Spare(opener, deadline + rescue - time.monotonic())

        try:
            if watch is None:
                return fn(sender, deadline - time.monotonic())
            with watch.watching(time.time(), open_spare, quiet):
                return fn(sender, deadline - time.monotonic())
        except Parked:
            raise
        except Exception as exc:
            # The SDK reports a detach met during a send as an unknown error; the link keeps what the service said.
            ended = ended_by_service(link, self.connection)
            if not kept_on_refusal(sender, exc):
                self.drop(entity)
            room = deadline + rescue - time.monotonic()
            if watch is not None and (
                watch.dead
                or (classify(exc).name == "timeout" and not watch.verify(min(VERIFY_WAIT, room / 2)))
            ):
                return self._rescue(
                    entity, fn, deadline + rescue, may_connect, exc, watch.take_spare(), spare_by=deadline
                )
            left = deadline - time.monotonic()
            if not (renewable(exc) or ended in RENEWABLE) or left <= RENEW_AT_LEAST:
                raise
            _LOGGER.info(
                "the service ended a link (%s): the call is made once more on a fresh one", condition_of(exc)
            )
            self.renewed += 1
        finally:
            if watch is not None:
                watch.drop_spare()  # a fresh connection opened for nothing (the old one answered): closed
        sender = self.sender(entity, left, may_connect)
        return self._on(entity, fn, sender, deadline)

    def _on(
        self,
        entity: str,
        fn: Callable[[ServiceBusSender, float], Any],
        sender: ServiceBusSender,
        until: float,
    ) -> Any:
        """``fn`` once more on a fresh link; a link that fails is dropped (a parked send keeps it)."""
        try:
            return fn(sender, until - time.monotonic())
        except Parked:
            raise
        except Exception as exc:
            if not kept_on_refusal(sender, exc):
                self.drop(entity)
            raise

    def _liveness(self) -> Liveness:
        watch = self.liveness
        if watch is None or watch.connection is not self.connection:
            watch = self.liveness = Liveness(self.connection)
        return watch

    def _rescue(
        self,
        entity: str,
        fn: Callable[[ServiceBusSender, float], Any],
        until: float,
        may_connect: bool,
        exc: BaseException,
        spare: Spare | None,
        spare_by: float,
    ) -> Any:
        """The connection was found dead while a call waited on it (:meth:`on_link`): drop it and make the call
        once more on a fresh connection - ``spare`` if one was opened meanwhile - by ``until`` (monotonic). A spare
        whose opening failed (refused: the namespace's evidence) has its error raised, and so has one not open by
        ``spare_by`` (the call's own deadline): the namespace does not serve a fresh connection either (a stall
        before or after SASL), so the rescue room is not spent waiting for it - the call fails at its deadline and
        failover keeps to the interval + grace (B3; bench_fanout, E=100, stalled: 2.57 s with the whole room
        spent at interval 2 s)."""
        self.discard("found dead while a call waited: nothing heard, a ping not answered")
        self.rescued += 1
        if spare is not None:
            by = min(until, max(spare_by, time.monotonic()))
            spare.done.wait(max(0.0, by - time.monotonic()))  # bounded by the opening's own deadline too
            fresh = spare.claim()
            if fresh is None:
                spare.cancel()
                raise (spare.error or exc) from exc
            self.connection = fresh
        left = until - time.monotonic()
        if not may_connect:
            raise FoundDead("the connection was found dead: the call is made on a fresh one") from exc
        if left <= RENEW_AT_LEAST:
            raise exc
        sender = self.sender(entity, sdk_timeout(left), may_connect)
        return self._on(entity, fn, sender, until)

    def open_links(
        self, entities: list[str], timeout: float, silence: float | None = None
    ) -> dict[str, BaseException]:
        """Open links to ``entities`` concurrently on the shared connection: every handler's begin, CBS put-token
        and attach go out together and the answers are read as they come (SPEC F3). Returns the per-entity errors
        (an entity that does not exist, a refused token, an attach not answered by the deadline); a connection
        error raises (every entity has it), and so does a namespace that said nothing for ``silence`` seconds
        while links were waiting (a ``TimeoutError``: the namespace stalled, SPEC F1)."""
        deadline = time.monotonic() + max(0.0, timeout)
        self.ensure(timeout)
        errors: dict[str, BaseException] = {}
        waiting: list[str] = []
        for entity in dict.fromkeys(entities):
            old = self.senders.get(entity)
            if old is not None:
                if running(old) and link_attached(old):
                    continue
                self.drop(entity)
            waiting.append(entity)
        if waiting:
            with short_reads(self.connection):
                self._pump(waiting, deadline, silence, errors)
        return errors

    def _pump(
        self, waiting: list[str], deadline: float, silence: float | None, errors: dict[str, BaseException]
    ) -> None:
        """Begin links in waves of at most :data:`OPENING_AT_ONCE` (the answers are read between waves: a long
        silence of the reader would look like a dead connection) and finish them as their answers come."""
        pending: dict[str, ServiceBusSender] = {}  # bounded by OPENING_AT_ONCE
        todo = iter(waiting)
        left_to_begin = len(waiting)
        began = time.time()
        try:
            while pending or left_to_begin:
                while left_to_begin and len(pending) < OPENING_AT_ONCE:
                    entity = next(todo)
                    left_to_begin -= 1
                    try:
                        pending[entity] = self._begin(entity)
                    except Exception as exc:
                        if self.broken:
                            raise
                        errors[entity] = exc
                if silence is not None and time.time() - max(began, self.heard() or 0.0) > silence:
                    raise TimeoutError(
                        f"the namespace answered nothing for {silence:.3g} s while links were opened"
                    )
                if time.monotonic() >= deadline:
                    for entity in [*pending, *todo]:
                        errors[entity] = TimeoutError(f"the link to {entity!r} was not attached in time")
                    break
                self.connection.listen(batch=256)
                for entity, sender in list(pending.items()):
                    try:
                        ready = link_ready(sender)
                    except Exception as exc:
                        if self.broken:
                            raise
                        errors[entity] = exc
                        self._quiet_close_handler(pending.pop(entity))
                        continue
                    if ready:
                        finish_open(sender)
                        self.senders[entity] = pending.pop(entity)
        finally:
            for sender in pending.values():
                if not running(sender):
                    self._quiet_close_handler(sender)

    def _begin(self, entity: str) -> ServiceBusSender:
        # Topics take the same link. keep_alive 0: no SDK keep-alive thread (threads must not grow with entities).
        sender = self.client.get_queue_sender(entity, keep_alive=0, socket_timeout=SDK_SLICE)
        create_handler(sender)
        _keep_link_on_refusal(sender)
        # a session and CBS links on the shared connection
        open_on(sender, self.connection, end_session_after_links)
        return sender

    def drop(self, entity: str) -> None:
        """Close the link to ``entity`` (a failure on it); the connection stays; reopened on next use."""
        sender = self.senders.pop(entity, None)
        if sender is not None:
            self._quiet_close_handler(sender)

    @staticmethod
    def _quiet_close_handler(sender: ServiceBusSender) -> None:
        set_running(sender, False)
        if handler_open(sender):
            try:
                handler_of(sender).close()  # its link, session and CBS links; the shared connection stays
            except Exception as exc:  # closing a failed link may fail; it is being dropped anyway
                _LOGGER.debug("closing a link failed: %s", type(exc).__name__)

    def unblock(self) -> None:
        """Shut the connection's socket down so that a call stuck in it returns with an error, and abort a
        connection still being opened (in TCP connect, TLS, SASL or the AMQP open: :class:`Opening`; it raises a
        ``TimeoutError``). The lane's unblock: runs on another thread than the stuck call's; touches nothing but
        sockets. Never raises, never blocks."""
        opening = self.opening
        if opening is not None:
            opening.expire(TimeoutError("the connection being opened was abandoned"))
        if self.connection is not None:
            shut_down_connection(self.connection)

    def close(self) -> None:
        """Close the connection and every link on it (the lane's close, on its worker)."""
        self.senders.clear()
        connection, self.connection = self.connection, None
        if connection is not None:
            close_connection(connection)


class NeedsWorker(Exception):
    """A direct call (on the caller's thread) found that it needs a new connection: it is made on the lane's
    worker instead, within what is left of the same deadline."""


class FoundDead(NeedsWorker):
    """A direct call found its connection dead while it waited (:meth:`SharedConnection.on_link`; the connection
    was dropped): it is made once more on the lane's worker, on a fresh connection, within what is left of its
    deadline and rescue room."""


#: Refusals of one delivery or request by an entity whose link stays attached (a full, disabled or missing entity,
#: throttling, a message too large): the link is kept for the next send or probe. Reopening it cost each probe of a
#: failed-over entity a session, two CBS links, a put-token, the entity's link and the management pair - about 23
#: frames each way and 10 ms of the process's CPU (issue 29: ten disabled entities probed every second took about a
#: tenth of a core). A link the service detached is reopened as before
#: (:func:`~spark_sb.wire.pyamqp_state.link_attached`).
KEPT_ON_REFUSAL = frozenset(
    {"quota_exceeded", "entity_disabled", "entity_not_found", "server_busy", "message_too_large"}
)


def _refusal(exc: BaseException) -> bool:
    """``exc`` is one of :data:`KEPT_ON_REFUSAL`."""
    return classify(exc).name in KEPT_ON_REFUSAL


def kept_on_refusal(sender: ServiceBusSender, exc: BaseException) -> bool:
    """``exc`` refused one delivery or request (:data:`KEPT_ON_REFUSAL`) and the sender's link is still open and
    attached: it is kept rather than dropped. Reads the SDK's handler state; no I/O."""
    s: Any = sender
    return _refusal(exc) and running(s) and handler_of(s) is not None and link_attached(sender)


def _keep_link_on_refusal(sender: ServiceBusSender) -> None:
    """The SDK closes a sender's handler - its session, CBS links and link - on a disabled or missing entity
    (``shutdown_handler`` of those errors), although the service refused one delivery and the link stays attached.
    On this sender (one of a shared connection's) the handler is kept while such a refusal is handled, if its link
    is still attached: the next send or probe uses it (:data:`KEPT_ON_REFUSAL`). Any other error, and every
    ``close()``, closes it as before. Replaces two of the sender's methods on the instance (``_handle_exception``,
    ``_close_handler``: SDK internals pinned by ``constraints-dev.txt``, exercised by the integration tests)."""
    s: Any = sender
    handle_exception = s._handle_exception
    close_handler = s._close_handler
    refusal: list[bool] = [False]  # set while the SDK handles a refusal that leaves the link attached

    def handle(exception: BaseException) -> Any:
        refusal[0] = _refusal(exception)
        try:
            return handle_exception(exception)
        finally:
            refusal[0] = False

    def close() -> None:
        if refusal[0] and link_attached(sender):
            return
        close_handler()

    s._handle_exception = handle
    s._close_handler = close


def renewable(exc: BaseException) -> bool:
    """The service ended the link or connection for its lifecycle (:data:`RENEWABLE`), not for an outage, or the
    SDK itself refused the call because the link's token expired before it was renewed (pyamqp's ``TokenExpired``
    "CBS Authentication Expired": a token whose refresh window is shorter than the time between calls). A fresh
    link puts a fresh token. Pure."""
    return (condition_of(exc) or "") in RENEWABLE or token_expired(exc)
