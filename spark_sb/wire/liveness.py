"""Is a shared connection alive? Between calls, :func:`tend` reads it, drops it once silent or closed and renews
its links' tokens (one loop for the senders' and the receivers' connections); while a call waits, :class:`Liveness`
pings a connection that went quiet and opens a :class:`Spare` alongside one that does not answer (SPEC L1).

Runs on the thread that uses the connection (a lane's worker, or a direct call), never two at once; a spare opens
on a helper thread of its own. Nothing here is picklable.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from spark_sb.core.errors import classify
from spark_sb.wire.closing import close_connection
from spark_sb.wire.pyamqp_state import connection_broken, last_heard, renew_token, short_reads
from spark_sb.wire.timing import PING_ANSWER, QUIET, SILENT_AFTER

__all__ = ["ConnectionSilent", "Liveness", "Spare", "connection_silent", "renew_tokens", "tend"]

_LOGGER = logging.getLogger(__name__)
K = TypeVar("K")


def tend(connection: Any, discard: Callable[[str], None]) -> bool:
    """Between calls (a lane's idle tick, on its worker): read what came (heartbeats, detaches, a close) and send our
    empty frame when the namespace's idle timeout wants one (pyamqp's ``listen`` does both, in one short read);
    ``discard(why)`` the connection if it went silent (:data:`~spark_sb.wire.timing.SILENT_AFTER`) or was closed,
    or its read failed. True when it is still open: its links may then be looked at (:func:`renew_tokens`)."""
    if connection_broken(connection) or connection_silent(connection):
        discard("closed" if connection_broken(connection) else f"silent for more than {SILENT_AFTER:.3g} s")
        return False
    try:
        with short_reads(connection):
            connection.listen(batch=64)
    except Exception as exc:  # noqa: BLE001 - a dead connection: replaced on next use
        discard(f"reading it failed: {type(exc).__name__}")
        return False
    if connection_broken(connection):
        discard("closed by the namespace")
        return False
    return True


def renew_tokens(
    links: Mapping[K, Any], drop: Callable[[K], None], logger: logging.Logger, failed: str
) -> None:
    """Renew each link's token when its refresh window opens (the SDK renews only inside its own calls); a link
    whose renewal fails is dropped (reopened, with a new token, on next use) and ``failed`` logged (``%s``: the
    error's class)."""
    for key, owner in list(links.items()):
        try:
            renew_token(owner)
        except Exception as exc:  # noqa: BLE001 - reopened, with a new token, on next use
            logger.info(failed, type(exc).__name__)
            drop(key)


def connection_silent(connection: Any) -> bool:
    """Nothing heard on a pyamqp connection for :data:`~spark_sb.wire.timing.SILENT_AFTER` seconds: it is dead.
    No I/O."""
    heard = last_heard(connection)
    return heard is not None and time.time() - heard > SILENT_AFTER


class ConnectionSilent(TimeoutError):
    """Raised from a read of a connection found dead while a call waited on it (:class:`Liveness`): nothing heard
    for :data:`QUIET` seconds and a ping not answered within :data:`PING_ANSWER`. Cuts the SDK's wait short; the
    call is made once more on a fresh connection (:meth:`~spark_sb.wire.connection.SharedConnection.on_link`)."""


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
