"""Per-namespace operation counters of the local namespace: what clients asked of it, as the service would
bill or meter it (connections, sends, receive calls, management operations, admin requests).

``LocalNamespace.counters()`` returns a snapshot in-process; the control API's ``GET /status`` carries the same
under ``"counters"``. Counting is thread-safe (the server thread and the admin endpoint's threads increment).
A receive call of the SDK shows as one or more flow frames granting credit on a receiver link
(``receive_flows``); a receiver that is idle between calls sends none, so ``receive_flows`` measures polling.

Two gauges ride along: ``connections_open`` (AMQP connections admitted under the namespace's connection quota
and not closed yet) and ``connections_peak`` (the most open at once since start or the last reset; a reset
sets it to the number open now, which a reset never changes).
"""

from __future__ import annotations

import threading
from collections import Counter

__all__ = ["COUNTERS", "OperationCounters"]

#: Every counter, always present in a snapshot (0 until something happens).
COUNTERS = (
    "connections_opened",  # AMQP connections accepted (the admin endpoint's TLS connections are apart)
    "connections_open",  # gauge: AMQP connections open now (admitted under the quota, not closed yet)
    "connections_peak",  # gauge: the most AMQP connections open at once (since start or the last reset)
    "connections_refused",  # AMQP connections refused for the namespace's connection quota
    "admin_connections_opened",  # HTTPS connections of the administration client
    "cbs_put_tokens",  # CBS put-token requests
    "sender_links_opened",  # links attached to send to a queue or topic
    "receiver_links_opened",  # links attached to receive from a queue, subscription or dead-letter queue
    "transfers_received",  # transfers on sender links (a batched send is one transfer)
    "messages_received",  # messages in those transfers
    "receive_flows",  # flow frames granting credit on receiver links (receive calls)
    "messages_delivered",  # messages transferred to receivers
    "settlements",  # dispositions of delivered messages (complete, abandon, dead-letter, defer, release)
    "management_operations",  # requests on $management nodes (see also management:<operation>)
    "admin_requests",  # HTTPS administration requests
    "links_detached_idle",  # sender/receiver links detached for the link idle timeout (IdleTimerExpired)
    "connections_closed_idle",  # connections closed for holding no link for the connection idle timeout
    "links_detached_token_expired",  # links detached because their CBS token expired and was not renewed
    "links_detached_fault",  # links detached by FaultController.detach
    "connections_blackholed",  # connections silenced by FaultController.blackhole
    "messages_throttled",  # messages refused with com.microsoft:server-busy by the namespace's throttle
    "batches_over_limit",  # batched transfers refused for their size (servicebus_local.tiers: rejected or detached)
)


class OperationCounters:
    """Named integer counters; ``management:<operation>`` keys count each management operation."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._open = 0
        self._peak = 0

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def admit_connection(self, limit: int) -> bool:
        """Count one more open AMQP connection if fewer than ``limit`` are open (True), else count a refusal
        (False)."""
        with self._lock:
            if self._open >= limit:
                self._counts["connections_refused"] += 1
                return False
            self._open += 1
            self._peak = max(self._peak, self._open)
            return True

    def release_connection(self) -> None:
        """One admitted AMQP connection closed."""
        with self._lock:
            self._open = max(0, self._open - 1)

    @property
    def connections_open(self) -> int:
        with self._lock:
            return self._open

    def snapshot(self) -> dict[str, int]:
        """Every counter of :data:`COUNTERS` plus the per-operation management counts, as plain data."""
        with self._lock:
            out = {name: self._counts.get(name, 0) for name in COUNTERS}
            out["connections_open"] = self._open
            out["connections_peak"] = self._peak
            out.update({k: v for k, v in sorted(self._counts.items()) if k not in out})
            return out

    def reset(self) -> None:
        """Zero every counter; the peak restarts from the connections open now."""
        with self._lock:
            self._counts.clear()
            self._peak = self._open
