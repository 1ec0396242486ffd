"""The driver process's hooks that write what the sinks still hold (``state_writes: async``): an ``atexit``
flush, SIGTERM as an ordinary exit (so that flush runs), and a ``StreamingQueryListener`` that flushes when a
query terminates.

Where it runs: on the driver only (the ``foreachBatch`` sink registers a sink at its first background write);
nothing here is picklable or shipped to executors. It knows a sink only as a :class:`FlushingSink` (what
:class:`~spark_sb.spark.sink.ServiceBusSink` offers), so this module does not import the sink.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from typing import Any, Protocol

log = logging.getLogger(__name__)


class FlushingSink(Protocol):
    """What the hooks need of a sink (:class:`~spark_sb.spark.sink.ServiceBusSink`)."""

    sink_id: str
    _force_sync: bool  # set at exit: a batch that ends from then on writes before it returns

    def flush(self, timeout: float | None = None) -> None: ...

    def close(self, timeout: float | None = None) -> None: ...


_live_sinks: weakref.WeakSet[FlushingSink] = weakref.WeakSet()
_exit_hook_lock = threading.Lock()
_exit_hook_registered = False


def _flush_at_exit() -> None:
    """``atexit``: write what the sinks of this process still hold (driver). A failure is logged (an exit
    handler cannot fail a query); call :meth:`~spark_sb.spark.sink.ServiceBusSink.flush` to see it raised. Works after
    ``spark.stop()`` too: the state writer finishes path tables through ``deltalake`` once the Spark session is
    gone."""
    sinks = list(_live_sinks)
    for sb in sinks:  # a batch that ends from now on (its query still runs) writes before it returns
        sb._force_sync = True
    for sb in sinks:
        try:
            sb.close(timeout=120)
        except BaseException as exc:
            log.error("sink %s: state writes at exit failed: %s: %s", sb.sink_id, type(exc).__name__, exc)


def _flush_live_sinks(why: str) -> None:
    """Write what every sink of this process holds now (driver; a query listener's thread). Logged, not
    raised: the batch that follows (or :meth:`~spark_sb.spark.sink.ServiceBusSink.flush`) raises a failed write."""
    for sb in list(_live_sinks):
        try:
            sb.flush(timeout=120)
        except BaseException as exc:
            log.error("sink %s: state writes (%s) failed: %s: %s", sb.sink_id, why, type(exc).__name__, exc)


_watched_sessions: set[int] = set()


def _watch_queries() -> None:
    """Flush the sinks when a streaming query of this driver terminates (stopped, failed, a notebook detached):
    a ``StreamingQueryListener`` on the session that runs the queries, registered once per session. Classic
    Spark only (under Spark Connect the sink writes synchronously). The ``foreachBatch`` DataFrame belongs to a
    clone of that session, whose listeners hear nothing of the query, hence the active (default) session."""
    try:
        from pyspark.sql import SparkSession
        from pyspark.sql.streaming import StreamingQueryListener
    except ImportError:  # a store without Spark (tests, tools)
        return
    session = SparkSession.getActiveSession()
    if session is None or is_connect(session) or id(session) in _watched_sessions:
        return

    class FlushOnTermination(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - the listener API's names
            pass

        def onQueryProgress(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryIdle(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
            # in a thread of its own: the listener bus (every query's events) never waits for a Delta commit
            why = f"query {getattr(event, 'id', '?')} terminated"
            threading.Thread(
                target=_flush_live_sinks, args=(why,), name="spark-sb-flush", daemon=True
            ).start()

    try:
        session.streams.addListener(FlushOnTermination())
        _watched_sessions.add(id(session))
    except Exception as exc:  # noqa: BLE001 - the atexit flush still covers an exit
        log.warning(
            "sink: no query listener (%s: %s); state rows are flushed at exit", type(exc).__name__, exc
        )


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM as an ordinary exit: ``SystemExit`` in the main thread, so ``finally`` blocks and the
    ``atexit`` flush run (the default action ends the process with no handler at all). A second SIGTERM ends
    it at once."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise SystemExit(128 + signum)


def install_sigterm_handler() -> None:
    """Make SIGTERM run the exit flush, when nobody else handles it (driver's main thread only; a program or a
    platform with its own SIGTERM handler keeps it)."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):  # no signals here (an embedded interpreter)
        pass


def register_exit_hook(sb: FlushingSink) -> None:
    """Flush ``sb`` at exit and when a query of this driver terminates (driver)."""
    # Registered at the first background write, after the Spark session exists: atexit runs handlers last
    # registered first, so this flush runs before the session's own exit handlers.
    global _exit_hook_registered
    with _exit_hook_lock:
        _live_sinks.add(sb)
        if not _exit_hook_registered:
            atexit.register(_flush_at_exit)
            _exit_hook_registered = True
        _watch_queries()


def is_connect(spark: Any) -> bool:
    """True for a Spark Connect session (its ``foreachBatch`` function runs beside the server)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")
