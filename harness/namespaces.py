"""Local namespaces for the benchmarks: one launcher, the namespace in a child process or in this one.

A benchmark runs its namespaces in child processes (``python -m servicebus_local --port 0 --control-port 0``), so
that the broker does not share this process's GIL with the code being measured and the sockets this process
counts are the sender's alone; ``inproc=True`` runs a :class:`~servicebus_local.server.LocalNamespace` in this
process instead, with its control API started all the same. Either way a :class:`Namespace` is driven through
the control API (``POST /faults/...``, ``GET /status``), so a benchmark has one code path for both.

    with namespaces({"primary": ["orders"], "secondary": backlog}) as ns:
        ns["primary"].post("/faults/refuse")
        ns["primary"].connection_string ...

:func:`namespaces` starts every child first and then waits for each (they start side by side); the children are
stopped (SIGTERM, then SIGKILL after 15 s) when the block ends, whatever happened in it. Loopback only.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Seconds a control API call may take (a loaded 2-core machine answers within a few).
CONTROL_TIMEOUT = 30.0


class Namespace:
    """One local namespace: its connection string, its control API and, in a child process, its pid."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.connection_string = ""
        self.control_url = ""
        self._ca_file = ""
        self._proc: subprocess.Popen[str] | None = None
        self.local: Any = None  # the in-process LocalNamespace (inproc only)

    # -- starting and stopping
    @classmethod
    def child(cls, name: str, queues: Sequence[str] = (), args: Sequence[str] = ()) -> Namespace:
        """Start ``python -m servicebus_local`` with ``queues`` and the extra command-line ``args`` (not waited
        for: :meth:`ready` reads what it prints)."""
        ns = cls(name)
        ns._proc = subprocess.Popen(
            [sys.executable, "-m", "servicebus_local", "--name", name, "--port", "0", "--control-port", "0"]
            + [arg for q in queues for arg in ("--queue", q)]
            + list(args),
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            cwd=ROOT,
        )
        return ns

    @classmethod
    def inproc(cls, name: str, queues: Sequence[str] = (), **settings: Any) -> Namespace:
        """A :class:`~servicebus_local.server.LocalNamespace` in this process (``settings``: its keyword
        arguments), its control API on a free port."""
        from servicebus_local.server import LocalNamespace

        ns = cls(name)
        ns.local = LocalNamespace(name, queues=list(queues), control_port=0, **settings).start()
        ns.connection_string = ns.local.connection_string
        ns.control_url = str(ns.local.control_url)
        return ns

    def ready(self) -> Namespace:
        """Wait until the child printed its connection string, control URL and CA file; its further output is
        read (and dropped) on a daemon thread so that it never blocks on a full pipe."""
        proc = self._proc
        if proc is None:
            return self
        out = proc.stdout
        assert out is not None
        found: dict[str, str] = {}
        while not {"connection_string", "control_url", "ca_file"} <= found.keys():
            line = out.readline()
            if not line:
                raise RuntimeError(
                    f"the namespace {self.name!r} exited with {proc.wait()} before it was ready"
                )
            key, _, value = line.strip().partition("=")
            found[key] = value
        self.connection_string = found["connection_string"]
        self.control_url = found["control_url"]
        self._ca_file = found["ca_file"]
        threading.Thread(target=lambda: [None for _ in out], name="bench-drain", daemon=True).start()
        return self

    def stop(self) -> None:
        if self.local is not None:
            self.local.stop()
            self.local = None
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    # -- what it is
    @property
    def pid(self) -> int | None:
        """The child's process id (None in this process)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def port(self) -> int:
        """The AMQP (and HTTPS admin) port, from the connection string."""
        endpoint = self.connection_string.split("sb://", 1)[1].split(";", 1)[0].rstrip("/")
        return int(endpoint.rsplit(":", 1)[1])

    @property
    def ca_file(self) -> str:
        """The CA the admin client must trust (``connection_verify=``)."""
        if self.local is not None:
            return str(self.local.ca_file)
        return self._ca_file

    # -- the control API
    def post(self, path: str, body: Mapping[str, Any] | None = None) -> None:
        """``POST`` to the control API (``/faults/refuse``, ``/faults/latency`` with ``{"seconds": s}``, ...)."""
        req = urllib.request.Request(
            f"{self.control_url}{path}",
            data=json.dumps(dict(body or {})).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=CONTROL_TIMEOUT) as reply:
            reply.read()

    def status(self) -> dict[str, Any]:
        """``GET /status``: entities, faults, connections, counters, lifecycle."""
        with urllib.request.urlopen(f"{self.control_url}/status", timeout=CONTROL_TIMEOUT) as reply:
            return dict(json.loads(reply.read()))

    def set_latency(self, seconds: float) -> None:
        self.post("/faults/latency", {"seconds": seconds})

    def peak_connections(self) -> int | None:
        """The namespace's gauge of the most AMQP connections open at once (None if it has none)."""
        peak = self.status().get("counters", {}).get("connections_peak")
        return None if peak is None else int(peak)

    def __repr__(self) -> str:
        where = f"pid {self.pid}" if self.pid is not None else "in process"
        return f"Namespace({self.name!r}, {where}, control {self.control_url or '-'})"


@contextlib.contextmanager
def namespaces(
    specs: Mapping[str, Sequence[str]], *, inproc: bool = False, args: Sequence[str] = ()
) -> Iterator[dict[str, Namespace]]:
    """Namespaces by name, each with its queues (``{"primary": ["orders"], ...}``): children started side by side
    and waited for, or in this process with ``inproc``; all stopped at the end. ``args``: extra command-line
    arguments of every child (``--link-idle-timeout 20s``...; children only)."""
    if inproc and args:
        raise ValueError("command-line arguments are for namespaces in child processes")
    started: dict[str, Namespace] = {}
    try:
        for name, queues in specs.items():
            started[name] = Namespace.inproc(name, queues) if inproc else Namespace.child(name, queues, args)
        for ns in started.values():
            ns.ready()
        yield started
    finally:
        for ns in started.values():
            ns.stop()


@contextlib.contextmanager
def namespace(
    name: str, queues: Sequence[str] = (), *, inproc: bool = False, args: Sequence[str] = ()
) -> Iterator[Namespace]:
    """One namespace (see :func:`namespaces`)."""
    with namespaces({name: queues}, inproc=inproc, args=args) as started:
        yield started[name]
