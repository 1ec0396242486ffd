"""HTTP control API of a local namespace: drive its faults and read its state from another process (SPEC E4).

Started by ``LocalNamespace(control_port=...)`` (``0`` = a free port; ``ns.control_url`` tells which) and by
``python -m servicebus_local --control-port``. Plain HTTP on the namespace's host, JSON in and out, one thread
(``http.server.ThreadingHTTPServer``). It changes nothing but faults; it never shows keys.

Routes (POST bodies are JSON objects; a missing body is ``{}``)::

    GET  /status                      namespace name, port, connection string-free summary: entities with
                                      active / dead-letter / scheduled counts, current faults, operation
                                      counters ("counters": connections, sends, receive calls, management
                                      operations, admin requests; see servicebus_local.counters) with the
                                      gauges "connections_open" and "connections_peak" (AMQP connections
                                      open now / most at once) and "connections_refused" (over the quota);
                                      "max_connections" is the connection quota; "lifecycle": the timers
                                      ("link_idle_timeout", "connection_idle_timeout", seconds), "throttle"
                                      (credits per second, 0 = off) and the counters "links_detached_idle",
                                      "connections_closed_idle", "links_detached_token_expired",
                                      "links_detached_fault", "connections_blackholed", "messages_throttled";
                                      "strict_settlement" (see LocalNamespace); "tier" (standard or
                                      premium: servicebus_local.tiers)
    POST /counters/reset              set every operation counter to 0 (the peak to the connections open now)
    POST /faults/refuse               stop listening (connections refused)
    POST /faults/accept               listen again
    POST /faults/stall                {"on": true|false, "answer_sasl": true}   accept and read, answer
                                      nothing (new connections still get their SASL answer unless
                                      "answer_sasl" is false: the SDK would then hang without timeout)
    POST /faults/latency              {"seconds": 0.002}   delay every write
    POST /faults/drop                 close every live connection abruptly
    POST /faults/close                {"condition": "amqp:connection:forced", "description": "..."}   close
                                      every live connection with an AMQP error (description + info map)
    POST /faults/send-error           {"entity": "q1", "condition": "com.microsoft:server-busy",
                                       "description": "...", "count": 3}   (count null/absent = until cleared)
    POST /faults/stall-entity         {"entity": "q1", "on": true|false}
    POST /faults/admin-error          {"method": "PUT", "path": "q1", "status": 500, "count": 1,
                                       "code": "", "detail": "..."}
    POST /faults/blackhole            {"on": true}   connections open now get no answer ever again (their
                                      bytes are read and dropped); new connections are served normally
    POST /faults/detach               {"entity": "q1" or null, "condition": "amqp:link:detach-forced",
                                       "description": "..."}   detach the links of an entity (null: all)
    POST /throttle                    {"credits_per_second": 1000}   messages per second for the namespace
                                      beyond which sends get com.microsoft:server-busy (0 = off)
    POST /faults/clear                remove every fault (the throttle is a setting: it stays)

Answers ``{"ok": true}`` (or the status document); 400 with ``{"error": ...}`` for a bad body, 404 for an
unknown route.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from servicebus_local.broker import Broker
    from servicebus_local.faults import FaultController


class Controlled(Protocol):
    """What the control API reads and drives of a namespace (:class:`~servicebus_local.server.LocalNamespace` is
    one). A protocol, so that this module needs nothing of the server: the server starts the control API, not the
    other way round."""

    name: str
    broker: Broker
    faults: FaultController

    @property
    def port(self) -> int: ...

    @property
    def connection_count(self) -> int: ...

    @property
    def max_connections(self) -> int: ...

    def counters(self) -> dict[str, Any]: ...

    def lifecycle(self) -> dict[str, Any]: ...

    def reset_counters(self) -> None: ...


__all__ = ["ControlServer"]


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, not {value!r}")
    return value


class _Handler(BaseHTTPRequestHandler):
    server: _HttpServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        return

    def _reply(self, status: int, doc: Any) -> None:
        body = json.dumps(doc, default=str).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        path = self.path.split("?", 1)[0].rstrip("/")
        if path in ("/status", ""):
            self._reply(200, self.server.control.status())
        else:
            self._reply(404, {"error": f"unknown route {path}"})

    def do_POST(self) -> None:  # noqa: N802 - http.server naming
        path = self.path.split("?", 1)[0].rstrip("/")
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}") if length else {}
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            found = self.server.control.apply(path, body)
        except (ValueError, TypeError, KeyError) as exc:
            self._reply(400, {"error": str(exc)})
            return
        if not found:
            self._reply(404, {"error": f"unknown route {path}"})
        else:
            self._reply(200, {"ok": True})


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    control: ControlServer


class ControlServer:
    """The control API of one namespace (a thread serving HTTP)."""

    def __init__(self, namespace: Controlled, host: str = "127.0.0.1", port: int = 0) -> None:
        self.namespace = namespace
        self._httpd = _HttpServer((host, port), _Handler)
        self._httpd.control = self
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        host = self._httpd.server_address[0]
        return f"http://{host.decode() if isinstance(host, bytes) else host}:{self.port}"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"sb-control-{self.namespace.name}",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def status(self) -> dict[str, Any]:
        ns = self.namespace
        doc = ns.broker.status()
        doc["port"] = ns.port
        doc["faults"] = ns.faults.snapshot()
        doc["connections"] = ns.connection_count
        doc["max_connections"] = ns.max_connections
        doc["strict_settlement"] = ns.broker.strict_settlement
        doc["tier"] = ns.broker.tier.name
        doc["counters"] = ns.counters()
        doc["lifecycle"] = ns.lifecycle()
        return doc

    def apply(self, path: str, body: dict[str, Any]) -> bool:
        f = self.namespace.faults
        if path == "/faults/refuse":
            f.refuse_connections()
        elif path == "/faults/accept":
            f.accept_connections()
        elif path == "/faults/stall":
            f.stall(bool(body.get("on", True)), answer_sasl=bool(body.get("answer_sasl", True)))
        elif path == "/faults/latency":
            f.set_latency(float(body["seconds"]))
        elif path == "/faults/drop":
            f.drop_connections()
        elif path == "/faults/close":
            f.close_connections(
                str(body.get("condition") or "amqp:connection:forced"),
                str(body.get("description") or "The connection was closed by the local namespace."),
            )
        elif path == "/faults/send-error":
            count = body.get("count")
            f.fail_sends(
                str(body["entity"]),
                str(body["condition"]),
                str(body.get("description") or "injected fault"),
                None if count is None else int(count),
            )
        elif path == "/faults/stall-entity":
            f.stall_entity(str(body["entity"]), bool(body.get("on", True)))
        elif path == "/faults/admin-error":
            count = body.get("count")
            f.fail_admin(
                str(body.get("method") or "*"),
                str(body["path"]),
                int(body["status"]),
                None if count is None else int(count),
                str(body.get("code") or ""),
                str(body.get("detail") or "injected fault"),
            )
        elif path == "/faults/blackhole":
            f.blackhole(_flag(body, "on", True))
        elif path == "/faults/detach":
            entity = body.get("entity")
            if entity is not None and not isinstance(entity, str):
                raise ValueError(f"entity must be a string or null, not {entity!r}")
            kwargs = {k: str(body[k]) for k in ("condition", "description") if body.get(k) is not None}
            f.detach(entity, **kwargs)
        elif path == "/throttle":
            if "credits_per_second" not in body:
                raise ValueError("credits_per_second is required")
            value = body["credits_per_second"]
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"credits_per_second must be a whole number, not {value!r}")
            f.set_throttle(value)
        elif path == "/faults/clear":
            f.clear()
        elif path == "/counters/reset":
            self.namespace.reset_counters()
        else:
            return False
        return True
