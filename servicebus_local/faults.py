"""Fault injection for the local Service Bus namespace (SPEC E4).

A :class:`FaultController` belongs to one namespace (``LocalNamespace.faults`` / ``Broker.faults``). Tests
call it in-process; ``servicebus_local.control`` exposes the same calls over HTTP for other processes.

Network faults (refuse, stall, latency, drop) are applied by the namespace's server thread: the controller
records the wish, wakes the server and, for refuse/accept/drop, waits until the server has applied it, so
that a test can ``refuse_connections()`` and connect on the next line. Send and admin faults are consulted
by the broker / server / admin endpoint on each operation. Everything here is thread-safe.
"""

from __future__ import annotations

import fnmatch
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from servicebus_local.model import AdminFault

__all__ = ["DEFAULT_DETACH_DESCRIPTION", "DetachRequest", "FaultController", "SendFault"]

#: The description of a link detached by :meth:`FaultController.detach` when none is given.
DEFAULT_DETACH_DESCRIPTION = "The link was force detached by the local namespace (injected fault)."


@dataclass
class SendFault:
    """Transfers to ``entity`` are rejected with ``condition`` (``remaining`` None = forever; ``seconds``: for that
    long from the first transfer it rejects - a blip that starts when someone sends; ``began``: that moment)."""

    entity: str
    condition: str
    description: str
    remaining: int | None
    seconds: float | None = None
    began: float | None = None


@dataclass(frozen=True)
class DetachRequest:
    """Detach the links of ``entity`` (None: every entity link) with ``condition`` and ``description``."""

    entity: str | None
    condition: str
    description: str


@dataclass
class _AdminRule:
    method: str
    path: str
    fault: AdminFault
    remaining: int | None


def _norm(entity: str) -> str:
    return entity.strip("/").lower()


class FaultController:
    """Switches for the faults of one namespace. Runs in any thread."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic  # the clock of timed faults (fail_sends(seconds=...))
        self._lock = threading.Condition()
        self._refusing = False
        self._stalled = False
        self._stall_answers_sasl = True
        self._latency = 0.0
        self._drop_generation = 0
        self._close_generation = 0
        self._close_error = ("amqp:connection:forced", "closed by the local namespace")
        self._blackhole_generation = 0
        self._detach_requests: list[DetachRequest] = []
        self._throttle = 0
        self._send_faults: dict[str, SendFault] = {}
        self._stalled_entities: set[str] = set()
        self._admin_rules: list[_AdminRule] = []
        # Network changes are applied by the server thread: version requested vs version applied.
        self._requested = 0
        self._applied = 0
        self._server_attached = False
        self._wake: Callable[[], None] | None = None

    # ------------------------------------------------------------------ network faults

    def refuse_connections(self) -> None:
        """Stop listening: new connections are refused (existing ones stay unless dropped)."""
        self._change(lambda: setattr(self, "_refusing", True))

    def accept_connections(self) -> None:
        """Listen again on the same port."""
        self._change(lambda: setattr(self, "_refusing", False))

    def stall(self, on: bool = True, *, answer_sasl: bool = True) -> None:
        """Accept connections and read their bytes but answer nothing (new and existing connections).
        When the stall ends, what was read is processed and answered (like a healed network). Idle-timeout
        heartbeats stop too (a client hears nothing at all) and resume when the stall ends, not replayed.

        With ``answer_sasl`` (the default) the SASL exchange of a new connection is still answered and the
        silence starts at its AMQP header: the unmodified SDK negotiates SASL on a blocking socket without
        any timeout, so total silence (``answer_sasl=False``) hangs it forever instead of timing out."""

        def apply() -> None:
            self._stalled = bool(on)
            self._stall_answers_sasl = bool(answer_sasl)

        self._change(apply)

    def set_latency(self, seconds: float) -> None:
        """Delay every write to every connection by ``seconds`` (0 = none)."""
        if seconds < 0:
            raise ValueError("latency cannot be negative")
        self._change(lambda: setattr(self, "_latency", float(seconds)))

    def drop_connections(self) -> None:
        """Close every live connection abruptly (TCP reset), blackholed ones included."""

        def bump() -> None:
            self._drop_generation += 1

        self._change(bump)

    def close_connections(
        self,
        condition: str = "amqp:connection:forced",
        description: str = "The connection was closed by the local namespace.",
    ) -> None:
        """Close every live connection with an AMQP ``close`` frame carrying the error ``condition``, its
        ``description`` and an info map (the SDK raises its own error class for the condition)."""

        def bump() -> None:
            self._close_error = (condition, description)
            self._close_generation += 1

        self._change(bump)

    def blackhole(self, on: bool = True) -> None:
        """A middlebox's silent drop: every connection open now (AMQP or not yet identified) gets no answer ever
        again: its bytes are read and dropped, nothing is written to it (no heartbeat, no detach, no close, no
        FIN) until its client closes it. New connections are served normally. ``on=False`` changes nothing for
        connections already blackholed (a dropped flow does not come back); it is accepted for symmetry with the
        control API."""
        if not on:
            return

        def bump() -> None:
            self._blackhole_generation += 1

        self._change(bump)

    def detach(
        self,
        entity: str | None = None,
        condition: str = "amqp:link:detach-forced",
        description: str = DEFAULT_DETACH_DESCRIPTION,
    ) -> None:
        """Detach (closed) the sender and receiver links of ``entity`` on every connection with the AMQP error
        ``condition`` / ``description``; None detaches every entity link. ``entity`` is a queue, a topic (its
        senders and the receivers of its subscriptions) or ``topic/subscriptions/name``, case-insensitive. The
        connections, their sessions and their CBS links stay. Returns once the namespace has sent the detaches."""
        if not condition:
            raise ValueError("condition must be a non-empty AMQP error condition")
        request = DetachRequest(None if entity is None else _norm(entity), condition, description)
        self._change(lambda: self._detach_requests.append(request))

    def set_throttle(self, credits_per_second: int) -> None:
        """Grant ``credits_per_second`` messages per second to the whole namespace (a token bucket holding one
        second's worth; a batch costs one credit per message); transfers beyond are rejected with
        ``com.microsoft:server-busy``. 0 turns throttling off."""
        if isinstance(credits_per_second, bool) or int(credits_per_second) != credits_per_second:
            raise ValueError(f"credits_per_second must be a whole number, not {credits_per_second!r}")
        if credits_per_second < 0:
            raise ValueError(f"credits_per_second cannot be negative, not {credits_per_second}")
        with self._lock:
            self._throttle = int(credits_per_second)

    # ------------------------------------------------------------------ entity faults

    def fail_sends(
        self,
        entity: str,
        condition: str,
        description: str = "injected fault",
        count: int | None = None,
        seconds: float | None = None,
    ) -> None:
        """Reject transfers to ``entity`` (queue or topic; ``*`` = every entity) with the AMQP error
        ``condition``, ``count`` times (None = until cleared) - or, with ``seconds``, for that long from the first
        transfer it rejects (a blip met by whoever sends first, whenever that is)."""
        if count is not None and count <= 0:
            raise ValueError("count must be positive or None")
        if seconds is not None and seconds <= 0:
            raise ValueError("seconds must be positive or None")
        with self._lock:
            self._send_faults[_norm(entity)] = SendFault(
                _norm(entity), condition, description, count, seconds
            )

    def stall_entity(self, entity: str, on: bool = True) -> None:
        """Transfers to ``entity`` are never settled while on (held transfers are processed when it ends); its
        connections keep answering everything else, idle-timeout heartbeats included."""
        with self._lock:
            if on:
                self._stalled_entities.add(_norm(entity))
            else:
                self._stalled_entities.discard(_norm(entity))
        self._poke()

    def fail_admin(
        self,
        method: str,
        path: str,
        status: int,
        count: int | None = None,
        code: str = "",
        detail: str = "injected fault",
    ) -> None:
        """Answer admin HTTP requests matching ``method`` (or ``*``) and ``path`` (no query, leading ``/``
        optional, case-insensitive, ``*`` wildcards allowed) with ``status``."""
        with self._lock:
            self._admin_rules.append(
                _AdminRule(
                    method.upper(), _norm(path), AdminFault(status=status, code=code, detail=detail), count
                )
            )

    def clear(self) -> None:
        """Remove every fault: listen, no stall, no latency, no send/admin faults."""

        def reset() -> None:
            self._refusing = False
            self._stalled = False
            self._latency = 0.0
            self._send_faults.clear()
            self._stalled_entities.clear()
            self._admin_rules.clear()

        self._change(reset)

    # ------------------------------------------------------------------ queries (broker / server / admin)

    @property
    def refusing(self) -> bool:
        return self._refusing

    @property
    def stalled(self) -> bool:
        return self._stalled

    @property
    def stall_answers_sasl(self) -> bool:
        return self._stall_answers_sasl

    @property
    def latency(self) -> float:
        return self._latency

    @property
    def drop_generation(self) -> int:
        return self._drop_generation

    @property
    def close_generation(self) -> int:
        return self._close_generation

    @property
    def close_error(self) -> tuple[str, str]:
        """(condition, description) of the latest :meth:`close_connections`."""
        return self._close_error

    @property
    def blackhole_generation(self) -> int:
        return self._blackhole_generation

    @property
    def throttle(self) -> int:
        """Messages per second granted to the namespace (0 = no throttling)."""
        return self._throttle

    def take_detach_requests(self) -> list[DetachRequest]:
        """The detaches asked for since the last call (the server thread applies them)."""
        with self._lock:
            out, self._detach_requests = self._detach_requests, []
            return out

    def send_fault(self, entity: str) -> tuple[str, str] | None:
        """The (condition, description) to reject a transfer to ``entity`` with, consuming one use."""
        if not self._send_faults:
            return None
        with self._lock:
            key = _norm(entity)
            fault = self._send_faults.get(key) or self._send_faults.get("*")
            if fault is None:
                return None
            if fault.seconds is not None:
                now = self._monotonic()
                if fault.began is None:
                    fault.began = now
                elif now - fault.began >= fault.seconds:
                    del self._send_faults[fault.entity]
                    return None
            if fault.remaining is not None:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    del self._send_faults[fault.entity]
            return fault.condition, fault.description

    def entity_stalled(self, entity: str) -> bool:
        if not self._stalled_entities:
            return False
        with self._lock:
            return _norm(entity) in self._stalled_entities or "*" in self._stalled_entities

    def admin_fault(self, method: str, path: str) -> AdminFault | None:
        """The fault for an admin request (``AdminStore.admin_fault``), consuming one use."""
        if not self._admin_rules:
            return None
        method = method.upper()
        path = _norm(path.split("?", 1)[0])
        with self._lock:
            for rule in self._admin_rules:
                if rule.method not in ("*", method):
                    continue
                if not fnmatch.fnmatchcase(path, rule.path):
                    continue
                if rule.remaining is not None:
                    rule.remaining -= 1
                    if rule.remaining <= 0:
                        self._admin_rules.remove(rule)
                return rule.fault
        return None

    def snapshot(self) -> dict[str, object]:
        """The current faults as plain data (for the control API's status)."""
        with self._lock:
            return {
                "refusing": self._refusing,
                "stalled": self._stalled,
                "latency": self._latency,
                "throttle": self._throttle,
                "send_faults": [
                    {"entity": f.entity, "condition": f.condition, "remaining": f.remaining}
                    for f in self._send_faults.values()
                ],
                "stalled_entities": sorted(self._stalled_entities),
                "admin_faults": [
                    {"method": r.method, "path": r.path, "status": r.fault.status, "remaining": r.remaining}
                    for r in self._admin_rules
                ],
            }

    # ------------------------------------------------------------------ server side

    def attach_server(self, wake: Callable[[], None]) -> None:
        """Called by the server thread when it starts: ``wake`` interrupts its select loop."""
        with self._lock:
            self._server_attached = True
            self._wake = wake

    def detach_server(self) -> None:
        with self._lock:
            self._server_attached = False
            self._wake = None
            self._applied = self._requested
            self._lock.notify_all()

    def pending_version(self) -> int:
        return self._requested

    def mark_applied(self, version: int) -> None:
        """The server has applied every change up to ``version``."""
        with self._lock:
            if version > self._applied:
                self._applied = version
                self._lock.notify_all()

    def _poke(self) -> None:
        wake = self._wake
        if wake is not None:
            wake()

    def _change(self, apply: Callable[[], None], timeout: float = 5.0) -> None:
        with self._lock:
            apply()
            self._requested += 1
            version = self._requested
            attached = self._server_attached
            wake = self._wake
        if not attached:
            return
        if wake is not None:
            wake()
        if threading.current_thread().name.startswith("spark-sb-local-"):
            return  # called from the server thread itself (e.g. a control request): no waiting
        with self._lock:
            self._lock.wait_for(lambda: self._applied >= version or not self._server_attached, timeout)
