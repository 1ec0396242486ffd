"""One namespace's shared AMQP connection and its links, kept alive between calls (SPEC F1-F3, L1-L3).

Runs on executors (Python workers), inside a :class:`~spark_sb.wire.lane.Lane` of
:class:`~spark_sb.wire.transport.SdkTransport`: a :class:`SharedConnection` is the lane's context, built and used on
the lane's worker thread, or on a caller's thread by a direct call (:meth:`~spark_sb.wire.lane.Lane.direct`) while it
holds the lane's ``use`` lock - never by two threads at once. Only the lane's unblock (:meth:`SharedConnection.
unblock`, :func:`shut_down_socket`) runs on another thread (the lane's watchdog or the caller): it shuts a socket
down and touches nothing else. Nothing here is picklable or pickled: it is built on the executor from a live
``ServiceBusClient``.

What it does: opens ONE pyamqp connection per namespace with an idle timeout (:data:`HEARTBEAT`: the namespace's
heartbeats tell a silent namespace from a stalled entity), opens every entity's link (an SDK
``ServiceBusSender`` whose handler is opened on that connection) concurrently (:meth:`SharedConnection.open_links`,
in waves of :data:`OPENING_AT_ONCE`), and between calls tends it (:meth:`SharedConnection.tend`: reads heartbeats
and detaches, renews link tokens, drops a connection that went silent or was closed). A call on a link the service
ended for its lifecycle (idle, an expired token: :data:`RENEWABLE`) is made once more on a fresh link. A send
whose connection died silently while it waited (a ping not answered: :class:`Liveness`) is made once more on a
fresh connection within about a second and a half (SPEC L1; :meth:`SharedConnection.on_link`).

Bounds: ``SharedConnection.senders`` holds one link per entity this process sends to on the namespace (links that
fail or are detached are removed); the links being opened at once are at most :data:`OPENING_AT_ONCE`; one
connection and no SDK keep-alive thread per namespace, whatever the number of entities. Every step of opening a
connection has a deadline, TLS and SASL included (which the SDK runs on a blocking socket without one), and a lane
abandoning or closing its worker aborts an opening at once (:func:`open_connection`, :class:`Opening`); a dropped
connection's socket is closed at once (:func:`close_connection`): an outage of any shape and length costs a
constant number of threads and sockets (SPEC F8).

Reads SDK internals (pyamqp's ``Connection``, a handler's ``open(connection=...)``, ``_running`` and the link's
size limits), all pinned by ``constraints-dev.txt`` and exercised by the integration tests against the unmodified
SDK.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from spark_sb.core.errors import classify, condition_of, token_expired
from spark_sb.wire.lane import _WATCHDOG, abort_when_abandoned
from spark_sb.wire.parking import Parked, last_heard
from spark_sb.wire.timing import (
    ABORT_RETRIES,
    ABORT_RETRY,
    CONNECT_TIMEOUT,
    HEARTBEAT,
    PING_ANSWER,
    PUMP_READ_TIMEOUT,
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
    "RENEWABLE",
    "ConnectionSilent",
    "FoundDead",
    "Liveness",
    "NeedsWorker",
    "Opening",
    "SharedConnection",
    "Spare",
    "close_connection",
    "open_connection",
    "renewable",
    "shut_down_socket",
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
            with _listening(self._opening):
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
        if self.connection is None:
            return
        if self.broken or self.silent():
            self.discard("closed" if self.broken else f"silent for more than {SILENT_AFTER:.3g} s")
            return
        try:
            with short_reads(self.connection):
                self.connection.listen(batch=64)
        except Exception as exc:
            self.discard(f"reading it failed: {type(exc).__name__}")
            return
        if self.broken:
            self.discard("closed by the namespace")
            return
        if self.liveness is not None:
            self.liveness.settle()
        for entity, sender in list(self.senders.items()):
            if not _attached(sender):
                self.detached += 1
                self.drop(entity)
                continue
            cbs = getattr(sender._handler, "_cbs_authenticator", None)
            if cbs is None:
                continue
            try:
                cbs.handle_token()
            except (
                Exception
            ) as exc:  # the renewal failed: the link is reopened (with a new token) on next use
                _LOGGER.info(
                    "renewing the token of a link failed (%s): reopened on next use", type(exc).__name__
                )
                self.drop(entity)

    def sender(self, entity: str, timeout: float, may_connect: bool = True) -> ServiceBusSender:
        """The open link to ``entity``, opened now if needed (within ``timeout``, on a new connection if the one
        there was is closed or silent); raises what opening raised (``may_connect``: see :meth:`ensure`)."""
        self.ensure(timeout, may_connect)
        found = self.senders.get(entity)
        if found is not None and getattr(found, "_running", False) and _attached(found):
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
        link = getattr(getattr(sender, "_handler", None), "_link", None)
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
            ended = _ended_by_service(link, self.connection)
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
                if getattr(old, "_running", False) and _attached(old):
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
                        ready = self._ready(sender)
                    except Exception as exc:
                        if self.broken:
                            raise
                        errors[entity] = exc
                        self._quiet_close_handler(pending.pop(entity))
                        continue
                    if ready:
                        self._finish(sender)
                        self.senders[entity] = pending.pop(entity)
        finally:
            for sender in pending.values():
                if not getattr(sender, "_running", False):
                    self._quiet_close_handler(sender)

    def _begin(self, entity: str) -> ServiceBusSender:
        from azure.servicebus._common.utils import create_authentication

        # Topics take the same link. keep_alive 0: no SDK keep-alive thread (threads must not grow with entities).
        sender = self.client.get_queue_sender(entity, keep_alive=0, socket_timeout=SDK_SLICE)
        sender._create_handler(create_authentication(sender))
        _keep_link_on_refusal(sender)
        handler: Any = sender._handler
        handler.open(connection=self.connection)  # a session and CBS links on the shared connection
        session = handler._session
        session.end = functools.partial(end_session_after_links, session, session.end)
        return sender

    @staticmethod
    def _ready(sender: ServiceBusSender) -> bool:
        handler: Any = sender._handler
        cbs = handler._cbs_authenticator
        if cbs is not None and not cbs.handle_token():
            return False
        return bool(handler._client_ready())

    @staticmethod
    def _finish(sender: ServiceBusSender) -> None:
        """What ``ServiceBusSender._open`` does once its link is ready (the link's size limits)."""
        from azure.servicebus._common.constants import (
            MAX_BATCH_SIZE_PREMIUM,
            MAX_BATCH_SIZE_STANDARD,
            MAX_MESSAGE_LENGTH_BYTES,
        )

        s: Any = sender
        transport = s._amqp_transport
        s._running = True
        s._max_message_size_on_link = (
            transport.get_remote_max_message_size(s._handler) or MAX_MESSAGE_LENGTH_BYTES
        )
        vendor = getattr(transport, "get_remote_max_message_batch_size", lambda _h: None)(s._handler)
        if vendor is not None:
            s._max_batch_size_on_link = vendor
        elif s._max_message_size_on_link >= MAX_BATCH_SIZE_PREMIUM:
            s._max_batch_size_on_link = MAX_BATCH_SIZE_PREMIUM
        else:
            s._max_batch_size_on_link = MAX_BATCH_SIZE_STANDARD

    def drop(self, entity: str) -> None:
        """Close the link to ``entity`` (a failure on it); the connection stays; reopened on next use."""
        sender = self.senders.pop(entity, None)
        if sender is not None:
            self._quiet_close_handler(sender)

    @staticmethod
    def _quiet_close_handler(sender: ServiceBusSender) -> None:
        s: Any = sender
        s._running = False
        handler = getattr(s, "_handler", None)
        if handler is not None and not getattr(handler, "_shutdown", True):
            try:
                handler.close()  # its link, session and CBS links; the shared connection stays
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


class ConnectionSilent(TimeoutError):
    """Raised from a read of a connection found dead while a call waited on it (:class:`Liveness`): nothing heard
    for :data:`QUIET` seconds and a ping not answered within :data:`PING_ANSWER`. Cuts the SDK's wait short; the
    call is made once more on a fresh connection (:meth:`SharedConnection.on_link`)."""


class Liveness:
    """Is a shared connection alive while a call waits on it? (SPEC L1; issue 29 item 4.) Used on the thread that
    uses the connection (the lane's worker, or a direct call), never by two at once; no thread of its own.

    While :meth:`watching`, each read of the connection (pyamqp's ``listen``, which the SDK's wait loops on in
    slices of :data:`SDK_SLICE`) is followed by :meth:`check`: nothing heard for :data:`QUIET` seconds (since the
    call began or the last frame) sends a ping (an AMQP session begun: the namespace answers it at once, whatever
    an entity does); anything heard after the ping proves the connection alive (the wait goes on); nothing heard
    within :data:`PING_ANSWER` opens a fresh connection alongside (:class:`Spare`), and once that one is open (or
    refused) marks this one :attr:`dead` and raises :class:`ConnectionSilent`, which ends the call.
    :meth:`verify` does the same after a call that ended (an SDK timeout shorter than :data:`QUIET`) with nothing
    heard since it began. The ping's session is ended once answered (:meth:`settle`), so sessions do not pile up:
    one ping at a time per connection. Reads SDK internals (pyamqp's ``Connection.listen``, ``create_session``,
    ``_last_frame_received_time``), pinned by ``constraints-dev.txt``."""

    __slots__ = ("connection", "dead", "open_spare", "ping_at", "quiet", "session", "since", "spare")

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.since = 0.0  # time.time() the watched call began
        self.quiet = QUIET  # the watched call's silence before a ping
        self.ping_at: float | None = None  # time.time() the ping in flight was sent
        self.session: Any = None  # the ping's session, until answered and ended
        self.dead = False
        self.open_spare: Callable[[], Spare] | None = None
        self.spare: Spare | None = None  # a fresh connection being opened while the watched call waits

    @contextlib.contextmanager
    def watching(
        self, since: float, open_spare: Callable[[], Spare] | None = None, quiet: float = QUIET
    ) -> Iterator[None]:
        """While the block runs, every read of the connection is followed by :meth:`check` (``since``: when the
        call began, ``time.time()``; ``open_spare``: starts opening a fresh connection alongside, see
        :meth:`check`; ``quiet``: the silence before a ping, :data:`QUIET` unless the call asks sooner)."""
        connection = self.connection
        self.since = since
        self.quiet = quiet
        self.open_spare = open_spare
        self.spare = None
        listen = getattr(connection, "listen", None)
        if connection is None or listen is None:
            yield
            return

        def watched(*args: Any, **kwargs: Any) -> Any:
            out = listen(*args, **kwargs)
            self.check()
            return out

        connection.listen = watched
        try:
            yield
        finally:
            with contextlib.suppress(AttributeError):
                del connection.listen  # pyamqp's own again

    def _heard_since(self, at: float) -> bool:
        heard = last_heard(self.connection)
        return heard is not None and heard > at

    def check(self) -> None:
        """After a read while a call waits: ping after :data:`QUIET` seconds of silence. A ping that has gone
        :data:`PING_ANSWER` seconds without anything heard starts a fresh connection opening alongside (a
        :class:`Spare`: the waiting call goes on meanwhile); :class:`ConnectionSilent` ends the call once that
        fresh connection is open (the namespace answers new connections, not this one: this one is dead) or was
        refused (the namespace's evidence). A fresh connection that does not open in time either (a namespace
        that is slow or stalled for everyone: a latency of seconds) leaves the call waiting to its own deadline -
        a slow answer on the old connection is still an answer."""
        now = time.time()
        if self.ping_at is not None:
            if self._heard_since(self.ping_at):
                self.ping_at = None
                self.settle()
                self.drop_spare()
            elif now - self.ping_at > PING_ANSWER:
                spare = self.spare
                if spare is None:
                    if self.open_spare is not None:
                        self.spare = self.open_spare()
                elif spare.done.is_set() and (spare.connection is not None or spare.refused()):
                    self.dead = True
                    raise ConnectionSilent(
                        f"the connection was silent for {now - self.ping_at + self.quiet:.3g} s while a call waited, "
                        "and did not answer a ping"
                    )
            return
        self.settle()
        heard = last_heard(self.connection) or 0.0
        if now - max(heard, self.since) > self.quiet:
            self._ping(now)

    def verify(self, wait: float) -> bool:
        """After a call that ended with a timeout: True if the connection was heard since the call began, or
        answers a ping within ``wait`` seconds (reading it meanwhile); False (and :attr:`dead`) otherwise."""
        if self.dead:
            return False
        if self._heard_since(self.since):
            return True
        if self.ping_at is None:
            self._ping(time.time())
        assert self.ping_at is not None
        end = time.monotonic() + max(0.0, wait)
        try:
            with short_reads(self.connection):
                while True:
                    if self._heard_since(self.ping_at):
                        self.ping_at = None
                        self.settle()
                        return True
                    if time.monotonic() >= end or connection_broken(self.connection):
                        break
                    self.connection.listen(batch=16)
        except Exception as exc:  # a read that fails: the connection is no better than silent
            _LOGGER.info("reading a connection for a ping's answer failed: %s", type(exc).__name__)
        self.dead = True
        return False

    def take_spare(self) -> Spare | None:
        """The fresh connection opened while the call waited (if any), now the caller's."""
        spare, self.spare = self.spare, None
        return spare

    def drop_spare(self) -> None:
        """Close the fresh connection opened alongside, if any (at once, or when its opening ends)."""
        spare, self.spare = self.spare, None
        if spare is not None:
            spare.cancel()

    def _ping(self, now: float) -> None:
        from azure.servicebus._pyamqp.constants import SessionState

        self.ping_at = now
        if self.session is not None and self.session.state == SessionState.BEGIN_SENT:
            return  # a ping of an earlier call still unanswered: its answer counts
        try:
            session = self.connection.create_session(allow_pipelined_open=True)
            session.begin()
        except Exception as exc:  # no ping possible (no channel left, a closed connection): silence decides
            _LOGGER.info("a ping could not be sent: %s", type(exc).__name__)
            return
        self.session = session

    def settle(self) -> None:
        """End the ping's session once the namespace answered it (it stays at most until then). No wait."""
        from azure.servicebus._pyamqp.constants import SessionState

        session = self.session
        if session is None or session.state != SessionState.MAPPED:
            return
        self.session = None
        with contextlib.suppress(Exception):
            session.end()


class Spare:
    """A fresh connection opened on a helper thread of its own (``opener(timeout)``, bounded by the opening's own
    deadline, SPEC F8) while a call keeps waiting on a connection that did not answer a ping (:class:`Liveness`):
    whichever comes first decides - an answer on the old connection (the spare is closed), or the spare open (the
    call moves to it). One at a time per connection; the thread ends with the opening. Thread-safe: the helper
    thread sets the result, the connection's user claims or cancels it."""

    __slots__ = ("_lock", "cancelled", "claimed", "connection", "done", "error")

    def __init__(self, opener: Callable[[float], Any], timeout: float) -> None:
        self._lock = threading.Lock()
        self.done = threading.Event()
        self.connection: Any = None
        self.error: BaseException | None = None
        self.claimed = False
        self.cancelled = False
        threading.Thread(
            target=self._open, args=(opener, max(0.05, timeout)), name="spark-sb-spare", daemon=True
        ).start()

    def _open(self, opener: Callable[[float], Any], timeout: float) -> None:
        try:
            connection = opener(timeout)
        except BaseException as exc:  # handed to the user (refused: the namespace's evidence)
            self.error = exc
            self.done.set()
            return
        with self._lock:
            unwanted = self.cancelled
            if not unwanted:
                self.connection = connection
        if unwanted:
            close_connection(connection)
        self.done.set()

    def refused(self) -> bool:
        """The opening failed with other than a timeout (refused, reset, TLS/SASL refused). No I/O."""
        return self.error is not None and classify(self.error).name != "timeout"

    def claim(self) -> Any:
        """The open fresh connection, now the caller's; None if it is not open (yet, or at all)."""
        with self._lock:
            if self.cancelled or self.connection is None:
                return None
            self.claimed = True
            return self.connection

    def cancel(self) -> None:
        """Not wanted: closed now if open, else when its opening ends. Never blocks on the opening."""
        with self._lock:
            self.cancelled = True
            connection = None if self.claimed else self.connection
            self.connection = None
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
#: tenth of a core). A link the service detached is reopened as before (:func:`_attached`).
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
    return (
        _refusal(exc)
        and bool(getattr(s, "_running", False))
        and getattr(s, "_handler", None) is not None
        and _attached(sender)
    )


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
        if refusal[0] and _attached(sender):
            return
        close_handler()

    s._handle_exception = handle
    s._close_handler = close


def _attached(sender: ServiceBusSender) -> bool:
    """The sender's link is still attached (the service did not detach it: idle, an expired token, a forced
    detach). Reads pyamqp's link state; no I/O."""
    from azure.servicebus._pyamqp.constants import LinkState

    link = getattr(getattr(sender, "_handler", None), "_link", None)
    return link is None or link.state == LinkState.ATTACHED


def _condition_text(error: Any) -> str | None:
    condition = getattr(error, "condition", None)
    if condition is None:
        return None
    condition = getattr(condition, "value", condition)
    return condition.decode("utf-8", "replace") if isinstance(condition, bytes) else str(condition)


def _ended_by_service(link: Any, connection: Any) -> str | None:
    """The error condition with which the service detached ``link`` or closed ``connection``, if it did (pyamqp
    keeps it on the link and the connection); None otherwise. No I/O."""
    return _condition_text(getattr(link, "_error", None)) or _condition_text(
        getattr(connection, "_error", None)
    )


def renewable(exc: BaseException) -> bool:
    """The service ended the link or connection for its lifecycle (:data:`RENEWABLE`), not for an outage, or the
    SDK itself refused the call because the link's token expired before it was renewed (pyamqp's ``TokenExpired``
    "CBS Authentication Expired": a token whose refresh window is shorter than the time between calls). A fresh
    link puts a fresh token. Pure."""
    return (condition_of(exc) or "") in RENEWABLE or token_expired(exc)


@contextlib.contextmanager
def short_reads(connection: Any) -> Iterator[None]:
    sock = getattr(getattr(connection, "_transport", None), "sock", None)
    previous = sock.gettimeout() if sock is not None else None
    if sock is not None:
        sock.settimeout(PUMP_READ_TIMEOUT)
    try:
        yield
    finally:
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.settimeout(previous)


def connection_broken(connection: Any) -> bool:
    """A pyamqp connection that is no longer open (closed by the service, a socket error). No I/O."""
    from azure.servicebus._pyamqp.constants import ConnectionState

    return bool(connection.state != ConnectionState.OPENED)


def connection_silent(connection: Any) -> bool:
    """Nothing heard on a pyamqp connection for :data:`SILENT_AFTER` seconds: it is dead. No I/O."""
    heard = last_heard(connection)
    return heard is not None and time.time() - heard > SILENT_AFTER


def open_connection(client: ServiceBusClient, timeout: float) -> Any:
    """Open one AMQP connection to ``client``'s namespace, built as the SDK builds a sender's own (same host, TLS,
    proxy, custom endpoint, container and properties), plus an idle timeout (:data:`HEARTBEAT`). Runs on a lane's
    worker (or any thread that may block for ``timeout``).

    Bounded whatever the namespace does (SPEC F8): every step has a deadline, ``timeout`` seconds from now. The
    TCP connect has its own (:data:`CONNECT_TIMEOUT`, per address, never past the deadline); TLS, SASL and the
    AMQP open - TLS and SASL run on a blocking socket without any timeout in the SDK - end at the deadline, when
    the process's watchdog shuts the socket down (:class:`Opening`; ``TimeoutError``). The opening can be aborted
    sooner from another thread: by the lane abandoning or closing the worker it runs on
    (:func:`~spark_sb.wire.lane.abort_when_abandoned`: it then raises the lane's error), and by a
    :meth:`SharedConnection.unblock` of the shared connection it is opened for. A connection that failed to open
    is closed (its socket too) before the error is raised."""
    from azure.servicebus._common.utils import create_authentication
    from azure.servicebus._pyamqp._connection import Connection
    from azure.servicebus._pyamqp.constants import ConnectionState

    timeout = max(0.0, timeout)
    deadline = time.monotonic() + timeout
    template: Any = client.get_queue_sender("$connection", keep_alive=0)  # no I/O: a handler's settings
    template._create_handler(create_authentication(template))
    h = template._handler
    connection = Connection(
        ("amqps://" if h._use_tls else "amqp://") + h._hostname,
        sasl_credential=h._auth.sasl,
        ssl_opts=h._ssl_opts,
        container_id=f"SBSender-{uuid.uuid4()}",
        max_frame_size=h._max_frame_size,
        channel_max=h._channel_max,
        idle_timeout=HEARTBEAT,
        properties=h._properties,
        network_trace=False,
        transport_type=h._transport_type,
        http_proxy=h._http_proxy,
        custom_endpoint_address=h._custom_endpoint_address,
        socket_timeout=SDK_SLICE,  # the reads of every call on it (see SDK_SLICE)
        connect_timeout=max(0.01, min(CONNECT_TIMEOUT, timeout)),  # the TCP connect's, per address
        use_tls=h._use_tls,
    )
    opening = Opening(connection, deadline)
    watch = _WATCHDOG.watch(
        deadline,
        lambda: opening.expire(
            TimeoutError(
                f"the namespace did not open the connection within {timeout:.3g} s "
                f"(stalled in {opening.phase()})"
            )
        ),
    )
    try:
        with abort_when_abandoned(opening.expire), _announced(opening):
            try:
                connection.open()
                while connection.state != ConnectionState.OPENED:
                    if connection.state in (
                        ConnectionState.END,
                        ConnectionState.CLOSE_RCVD,
                        ConnectionState.DISCARDING,
                    ):
                        from azure.servicebus._pyamqp.error import AMQPConnectionError, ErrorCondition

                        error = getattr(connection, "_error", None)
                        if error is not None:
                            raise error
                        raise AMQPConnectionError(
                            ErrorCondition.SocketError, description="the connection was closed"
                        )
                    if opening.error is not None or time.monotonic() > deadline:
                        raise TimeoutError("the namespace did not open the connection in time")
                    connection.listen(wait=0.05)
            except BaseException as exc:
                opening.finish()
                _close_quietly(connection)
                if opening.error is not None:  # aborted: what the abort says, not the socket error it caused
                    raise opening.error from exc
                raise
    finally:
        watch.cancel()
        opening.finish()
    if opening.error is not None:  # aborted as it opened: its socket may be shut down already
        _close_quietly(connection)
        raise opening.error
    # The idle timeout went out in the open frame (the namespace sends heartbeats); pyamqp would also close the
    # connection itself after that long without a frame, on its next read. Not that: the lane's deadlines and the
    # namespace-wide evidence decide what a silence means.
    connection._idle_timeout = None
    return connection


class Opening:
    """A connection being opened by :func:`open_connection`, and the means to abort it from another thread (the
    watchdog at the opening's deadline, a lane abandoning or closing the worker, :meth:`SharedConnection.unblock`).

    Aborting shuts the socket down, so that a read blocked in TLS or SASL (no timeout in the SDK) returns at once
    with an error, and records the error the opening then raises. TLS replaces the connected socket with an SSL
    one and detaches the first before its handshake; so that the handshake can be aborted too, a duplicate of the
    connected socket (one file descriptor, for the opening's duration only) is taken just before TLS starts
    (pyamqp's ``_setup_transport``) and shut down instead. An abort before the socket exists (in the TCP connect,
    bounded by :data:`CONNECT_TIMEOUT`) is tried again every :data:`ABORT_RETRY` seconds, and a socket that appears
    after an abort is refused before TLS. Thread-safe; the aborting side never blocks (a shutdown, a flag)."""

    __slots__ = ("_handle", "_lock", "connection", "deadline", "done", "error", "retries")

    def __init__(self, connection: Any, deadline: float) -> None:
        self.connection = connection
        self.deadline = deadline  # monotonic
        self.error: BaseException | None = None  # set by the first abort: what the opening raises
        self.done = False
        self.retries = 0
        self._handle: Any = None  # a duplicate of the connected socket, while the opening lasts
        self._lock = threading.Lock()
        transport = getattr(connection, "_transport", None)
        setup = getattr(transport, "_setup_transport", None)
        if transport is not None and setup is not None:

            def setup_transport() -> None:  # on the opening thread, the socket connected, before TLS
                self._take_handle(transport.sock)
                setup()

            transport._setup_transport = setup_transport

    def _take_handle(self, sock: Any) -> None:
        with self._lock:
            if self.error is not None:
                raise OSError("the opening was aborted")  # the SDK closes the socket and raises
            if sock is not None:
                with contextlib.suppress(OSError):
                    self._handle = sock.dup()

    def phase(self) -> str:
        """Where the opening is (for the error's text): TCP connect or TLS, SASL, the AMQP open. No I/O."""
        state = getattr(self.connection, "state", None)
        name = getattr(state, "name", None)
        if name is None:
            return "TCP connect or TLS"
        if name == "START":
            return "SASL"
        return "the AMQP open"

    def abort(self, error: BaseException) -> bool:
        """Record ``error`` (the first one wins) and shut the socket down; False if there was no socket to shut
        down yet (and the opening is still under way). Any thread; never blocks, never raises."""
        with self._lock:
            if self.done:
                return True
            if self.error is None:
                self.error = error
            handle = self._handle
            if handle is not None:
                with contextlib.suppress(OSError):
                    handle.shutdown(socket.SHUT_RDWR)
                return True
            sock = getattr(getattr(self.connection, "_transport", None), "sock", None)
            if sock is None:
                return False
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                return sock.fileno() >= 0  # a detached socket (in TLS): not shut down, try again
            except Exception:  # a transport of another kind (websocket): its own timeouts bound it
                return True
            return True

    def expire(self, error: BaseException) -> None:
        """:meth:`abort`, tried again every :data:`ABORT_RETRY` seconds (on the watchdog) while the socket does not
        exist yet. Any thread; never blocks."""
        if self.abort(error) or self.retries >= ABORT_RETRIES:
            return
        self.retries += 1
        _WATCHDOG.watch(time.monotonic() + ABORT_RETRY, lambda: self.expire(error))

    def finish(self) -> None:
        """The opening returned (opened or failed): later aborts do nothing; the duplicate socket is closed. On
        the opening thread."""
        with self._lock:
            self.done = True
            handle, self._handle = self._handle, None
            self.connection = None  # an armed watch may keep this object a while: not the connection
        if handle is not None:
            with contextlib.suppress(OSError):
                handle.close()


#: Per thread: who wants to know of a connection being opened on it (:meth:`SharedConnection.ensure`).
_LISTENERS = threading.local()


@contextlib.contextmanager
def _listening(listener: Callable[[Opening | None], None]) -> Iterator[None]:
    """While the block runs, ``listener`` is told of each :class:`Opening` begun on this thread (and of its end,
    with None)."""
    listeners: list[Callable[[Opening | None], None]] = _LISTENERS.__dict__.setdefault("stack", [])
    listeners.append(listener)
    try:
        yield
    finally:
        listeners.remove(listener)


@contextlib.contextmanager
def _announced(opening: Opening) -> Iterator[None]:
    listeners = list(getattr(_LISTENERS, "stack", ()))
    for listener in listeners:
        listener(opening)
    try:
        yield
    finally:
        for listener in listeners:
            listener(None)


def _close_quietly(connection: Any) -> None:
    """Close a connection that failed to open, its socket with it (no frame is sent: it may be half open).
    Never raises, never blocks."""
    shut_down_connection(connection)
    with contextlib.suppress(Exception):
        connection._disconnect()  # state END, the transport (and its socket) closed
    _close_transport(connection)


def close_connection(connection: Any) -> None:
    """Close a pyamqp connection (a close frame if it is still open) and, whatever happened, its socket: pyamqp's
    ``close`` leaves the socket open when the close frame cannot be sent (a connection reset, a socket shut
    down): it then sets the state to END, and its disconnect does nothing in that state - the file descriptor
    stayed open until the garbage collector found the connection (one per dropped connection; an exception's
    traceback keeps it referenced). Runs on the thread that owns the connection. Never raises; bounded by the
    socket's timeout (:data:`SDK_SLICE`) when the peer is silent."""
    try:
        connection.close()
    except Exception as exc:  # a broken connection may fail to close; it is being dropped anyway
        _LOGGER.info("closing a connection failed: %s", type(exc).__name__)
    _close_transport(connection)


def _close_transport(connection: Any) -> None:
    """Close the connection's transport (its socket; nothing if closed already). Never raises."""
    transport = getattr(connection, "_transport", None)
    if transport is not None and getattr(transport, "sock", None) is not None:
        with contextlib.suppress(Exception):
            transport.close()


def end_session_after_links(
    session: Any, end: Callable[..., None], error: Any = None, wait: bool = False
) -> None:
    """End a session on a shared connection after detaching its links: pyamqp's ``Session.end`` sends the end
    first and then detaches the links still attached (a management link's, say), and the service closes the whole
    connection - every other entity's link with it - for a frame on a channel that has ended ("no such
    channel"). Installed on each session the transport opens (``session.end``), whoever ends it: the SDK ends it
    itself when a call on the link fails."""
    for link in list(getattr(session, "links", {}).values()):
        with contextlib.suppress(Exception):
            link.detach(close=True)
    end(error=error, wait=wait)


def shut_down_socket(handler_owner: Any) -> None:
    """Shut down the socket of an SDK sender or receiver so that a call stuck in it (e.g. the SDK's SASL
    negotiation, which has no timeout) returns with an error. Reads SDK internals; best effort, never raises.
    Called from a thread other than the stuck one (a lane's unblock)."""
    handler = getattr(handler_owner, "_handler", None)
    shut_down_connection(getattr(handler, "_connection", None))


def shut_down_connection(connection: Any) -> None:
    import socket

    transport = getattr(connection, "_transport", None)
    sock = getattr(transport, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def abort_connection(connection: Any) -> None:
    """Reset a connection given up as dead (TCP RST: linger 0, then close): what was written on it and not yet read
    by the namespace is dropped with it, so a stalled namespace that recovers does not act on a call the sender
    gave up on and diverted (no duplicate of it on the primary; at-least-once still holds when the namespace had
    read it already). Runs on any thread; pyamqp's later use of the closed socket raises and is suppressed. Never
    raises."""
    import socket
    import struct

    transport = getattr(connection, "_transport", None)
    sock = getattr(transport, "sock", None)
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()
