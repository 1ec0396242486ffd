"""Every timing of the wire in one place: the seconds that its deadlines, heartbeats, pings and waits are made of.

Each constant says what it bounds and why it has its value (what was measured, what was tried); the modules that
use one import it from here, so a change of one is a change of this file alone. Pure: no I/O, nothing runs at
import.
"""

from __future__ import annotations

# -- the shared connection: reads, heartbeats, silence ------------------------------------------------------------

#: The SDK's own timeout of a call on an open link ends this much before the lane's deadline (the SDK reads
#: the socket in slices of its ``socket_timeout``, 0.2 s), so that a stalled entity costs its link, not the
#: connection that the namespace's other entities share.
SDK_MARGIN = 0.3

#: How long the SDK's reads wait at most on a link of the shared connection (its ``socket_timeout``; the SDK's
#: default is 0.2 s): a call checks its own timeout between reads, so it overshoots that timeout by up to this much.
#: Short, so that the SDK gives up before the lane's deadline even on the shortest budget (``failover_interval`` 0:
#: 0.25 s), and a stalled entity costs its link, never the connection the namespace's other entities use (SPEC F6).
#: Cost: a waiting call wakes 20 times a second instead of 5.
SDK_SLICE = 0.05

#: The idle timeout the shared connection asks of the namespace (seconds). The namespace then sends an empty
#: frame when it has had nothing else to send for half of it, so a live connection is heard from at least every
#: ``HEARTBEAT / 2`` s even while one entity stalls; a silent connection is the namespace's fault (SPEC F1). pyamqp's
#: own close after this long without a frame is switched off (:func:`~spark_sb.wire.opening.open_connection`): the
#: lane's deadlines and the namespace-wide evidence decide what a silence means. A connection silent past one beat
#: and a margin (2.5 s, :data:`NAMESPACE_SILENCE`) tells a namespace fault from one entity's
#: stall (SPEC F7); shorter silences are told by several entities timing out together. 2 s was tried (a 1.5 s
#: verdict): the syphon's lost-locks test (tests/integration/test_syphon_reliability.py) then saw a message whose lock
#: ran out mid-forward twice in the next drain, in most runs; at 4 s, 6 of 6 runs passed. Left for the syphon's
#: receive credit.
HEARTBEAT = 4.0

#: A connection that said nothing (no frame, not even a heartbeat) for this long is dead: silently dropped on the
#: way (a middlebox forgot the flow), or the namespace stopped answering. Half a :data:`HEARTBEAT` is the
#: namespace's beat, so this is six missed beats: well above a live connection's jitter and a latency spike of a few
#: seconds (a 3.5 s one must not drop a connection whose calls are still answered). Dropping a connection between
#: calls needs this certainty; a call that times out meanwhile is judged on the shorter
#: :data:`NAMESPACE_SILENCE`, and a send that waits on a silent connection asks it for a
#: sign of life after :data:`QUIET` (:class:`~spark_sb.wire.liveness.Liveness`).
SILENT_AFTER = 6.0

#: How often a lane with nothing to do looks after its connection (the tending of
#: :mod:`~spark_sb.wire.liveness`).
TEND_EVERY = 0.5

#: While links are opened, a read with nothing to read waits this long (the SDK's socket timeout is 0.2 s: one such
#: wait per round of answers would cost tenths of a second per link).
PUMP_READ_TIMEOUT = 0.005

#: A timeout is the namespace's fault (SPEC F7) only when its connection has said nothing - no answer, no heartbeat
#: - for this long when the attempt fails: the namespace sends an empty frame at least every ``HEARTBEAT / 2``
#: seconds (:data:`HEARTBEAT`), so a connection silent past one beat and a margin is dead or
#: its namespace stopped answering; a connection heard within it is alive and only the entity stalled, however short
#: the attempt was (``failover_interval`` 0 and values below the heartbeat period included).
NAMESPACE_SILENCE = HEARTBEAT / 2 + 0.5

# -- liveness while a call waits (SPEC L1) -------------------------------------------------------------------------

#: Liveness while a call waits (SPEC L1, issue 29 item 4): a call on the shared connection that has heard nothing
#: on it (no answer, no heartbeat, no frame of any link) for this long asks the connection for a sign of life - a
#: *ping*: an AMQP session begun (and ended once answered). Every AMQP peer answers a begin at once, and the
#: namespace answers it itself, whatever an entity does: a ping tells a dead connection (silently dropped on the
#: way: nothing ever comes back) from a stalled entity on a live one (the ping is answered, the call keeps waiting)
#: within about a second, where the heartbeats (every ``HEARTBEAT / 2`` s) would take several. Cost on a live
#: connection: one begin and one end per second of silence while a call waits - none while answers come.
QUIET = 1.0

#: A ping not answered within this long (nothing at all heard on the connection since it was sent): the connection
#: may be dead, and a fresh one is opened alongside while the call keeps waiting (:class:`~spark_sb.wire.liveness.
#: Spare`); once the fresh one is open, the silent one is dead for us and the call moves. A namespace slow for
#: everyone (a latency of seconds) does not open the fresh one in time either, and the call's late answer on its
#: own connection counts.
PING_ANSWER = 0.5

#: What a call on the shared connection may take past its attempt's budget to recover from a connection found dead
#: while it waited (:meth:`~spark_sb.wire.connection.SharedConnection.on_link`): the ping after an SDK timeout on a
#: connection heard nothing since the call began (an attempt shorter than :data:`QUIET`: ``failover_interval`` 0),
#: then a fresh connection, a fresh link and the call made once more on them. The SDK's own wait stays the attempt's
#: budget; only this recovery runs into the room. On loopback a fresh connection takes tens of milliseconds; against
#: the service a few round trips (TLS, SASL, open, CBS, attach). A namespace that stalls altogether (fresh
#: connections too) is failed over this much later than the attempt's budget alone would (``failover_interval`` 0:
#: ~0.75 s instead of 0.25 s): the price of not failing over when only the connection died.
RESCUE_ROOM = 0.5

#: After an SDK timeout on a connection heard nothing since the call began, the ping waits at most this long for an
#: answer (inside :data:`RESCUE_ROOM`; shorter than :data:`PING_ANSWER` so that a fresh connection still fits).
VERIFY_WAIT = 0.2

#: A renewed call needs at least this much of its deadline left (a fresh link on a live connection: a few round trips).
RENEW_AT_LEAST = 0.05

# -- opening a connection (SPEC F8) --------------------------------------------------------------------------------

#: The TCP connect's own timeout, per address the host name resolves to (pyamqp's default, 1 s): a connect that
#: is not answered (SYN dropped) ends there; a shorter ``timeout`` of the opening is used instead.
CONNECT_TIMEOUT = 1.0

#: An opening aborted before its socket exists (in the TCP connect) is looked at again this often, until the
#: socket exists (then it is shut down) or the opening ends; :data:`ABORT_RETRIES` times at most.
ABORT_RETRY = 0.05
ABORT_RETRIES = 200

# -- the transport's calls -----------------------------------------------------------------------------------------

#: How long before its deadline a call still unanswered counts as slow: enough to open a new connection with
#: the SDK (about 0.5 s), so that a link opened then is ready when the call fails.
SLOW_MARGIN = 1.0

#: A call made with the transport's ``_call`` (a probe's schedule or cancel) that gets its turn on the lane with
#: less of its deadline left than this is not started (:class:`~spark_sb.wire.lane.Withdrawn`): the SDK cannot
#: answer within less (its timeout is cut :func:`sdk_timeout`'s margin shorter and a read waits up to
#: :data:`SDK_SLICE`), so the call would overrun the lane's deadline and cost the connection. Measured: ten probes
#: of stalled entities queued on the isolated connection at 0/1/5 s (E = 20, bench_isolation.py) built a new
#: connection every 1.5 s without it, none with it.
MIN_CALL_LEFT = 3 * SDK_SLICE

#: How recent a link's last answer must be for the link to count as connected (``Transport.connected``):
#: well under the service's idle-connection timeout, after which a send would reconnect first.
CONNECTED_FRESH = 60.0

#: Links opened concurrently on a connection cost about this much each (CPU and frames), on top of a fixed part:
#: the deadline of ``SdkTransport.prepare`` is ``PREPARE_BASE + PREPARE_PER_LINK * n`` (SPEC F3).
PREPARE_BASE = 1.5
PREPARE_PER_LINK = 0.02

# -- parked sends (SPEC F6) ----------------------------------------------------------------------------------------

#: A send not answered for this long on a connection that answers is parked (seconds). A healthy send of a batch
#: takes milliseconds on loopback and a round trip or two against the service; parking a slow healthy one only
#: defers reading its answer. The price of a stalled entity to the call's other entities is this much per stalled
#: entity (the goal: at most 0.5 s, SPEC F6), instead of its whole budget. Measured (bench_isolation.py, E = 100,
#: 10 stalled, 0 ms): at 0.2 s they failed over in 2.32 s at interval 0 and 11.92 s at 10 s; at 0.1 s in 1.33 s
#: and 11.02 s; before parking, 98.4 s at 10 s.
PARK_AFTER = 0.1

#: Once a send of the call has parked (the connection answers: the entity stalls, not the namespace), the call's next
#: sends park after this long (seconds): 10 entities stalling at once then delay the others by 0.1 + 9 x 0.03 s,
#: within the 0.5 s of SPEC F6. A healthy send parked this early is answered while the call sends on, and finished
#: at once when the call comes back to it.
PARK_SOON = 0.03

#: A parked send resumed at or past its deadline still gets this long (seconds) to read an answer that came
#: meanwhile, or to find its delivery timed out by its link.
RESUME_AT_LEAST = 0.05

#: How long reading what already came on a parked send's connection waits on a socket with nothing to read
#: (seconds; :mod:`~spark_sb.wire.parking`).
READ_ARRIVED_WAIT = 0.005


def sdk_timeout(left: float) -> float:
    """The SDK's own timeout for a call with ``left`` seconds to its deadline: :data:`SDK_MARGIN` earlier (a
    quarter of ``left`` when that is less, but never less than three :data:`SDK_SLICE`: measured, a
    send on a stalled link with the SDK's timeout 0.18 s returned after 0.25 s with slices of 0.05 s, 0.40 s with
    the default 0.2 s), so that the SDK gives up first and a stalled entity costs its
    link, not the shared connection. Pure."""
    return max(0.02, left - min(SDK_MARGIN, max(0.25 * left, 3 * SDK_SLICE)))
