"""Two local Service Bus namespaces in the background, for the README's examples: ``make local-namespaces``.

    python jobs/local_namespaces.py start [--dir /tmp/spark-sb-local] [--tls-dir ~/.cache/spark-sb-tls]
                                          [--ports 5672 5682] [--config conf/local.yaml]
    python jobs/local_namespaces.py stop [--dir /tmp/spark-sb-local]

``start`` runs ``python -m servicebus_local --name primary --port 5672 --queue orders --tls-dir <tls-dir>`` and
the same for ``secondary`` on 5682 (no entities), each detached from this process and the terminal (its output
in ``<dir>/<name>.log``, its pid in ``<dir>/<name>.pid``); waits until both serve (each has printed its
``ca_file=`` line); provisions the backlog queues that ``--config`` asks for (``spark-sb provision``, its table on
stderr); and prints on stdout the three variables the examples read, as ``export`` lines:
``eval "$(make -s local-namespaces)"`` sets them in your shell. Namespaces already running from ``<dir>`` are
reused. Both share the CA in ``<tls-dir>`` (``REQUESTS_CA_BUNDLE=<tls-dir>/ca.pem``). Exit status 1 when a
namespace does not start (its log on stderr, e.g. the port is in use) or provisioning fails.

``stop`` sends SIGTERM to the namespaces whose pid files are in ``<dir>`` (SIGKILL after 15 s), only to a process
that is a ``servicebus_local``, and removes the pid files.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("primary", "secondary")
ENTITIES = {"primary": ["orders"], "secondary": []}  # conf/local.yaml's entity; the secondary gets backlogs
START_TIMEOUT = 60.0  # seconds for a namespace to print its lines on a loaded machine
STOP_TIMEOUT = 15.0


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs and is a local namespace (a pid file outliving its process names no stranger)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # someone else's process: not ours
    proc = Path(f"/proc/{pid}/cmdline")
    if proc.exists():
        command = proc.read_bytes().replace(b"\0", b" ").decode(errors="replace")
    else:  # no /proc (macOS)
        done = subprocess.run(["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True)
        command = done.stdout
    return "servicebus_local" in command


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _printed(log: Path) -> dict[str, str]:
    """The ``key=value`` lines a namespace printed at its start (connection_string, ca_file)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return {}
    return dict(
        line.split("=", 1) for line in text.splitlines() if "=" in line and " " not in line.split("=")[0]
    )


def _start_one(name: str, port: int, workdir: Path, tls_dir: Path) -> subprocess.Popen[bytes] | None:
    """Start ``name`` unless it runs already from ``workdir`` (then ``None``)."""
    pid_file = workdir / f"{name}.pid"
    pid = _read_pid(pid_file)
    if pid is not None and _alive(pid) and "ca_file" in _printed(workdir / f"{name}.log"):
        _say(f"{name}: already running (pid {pid})")
        return None
    command = [sys.executable, "-m", "servicebus_local", "--name", name, "--port", str(port)]
    command += [arg for queue in ENTITIES[name] for arg in ("--queue", queue)]
    command += ["--tls-dir", str(tls_dir)]
    with open(workdir / f"{name}.log", "wb") as log:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            cwd=ROOT,
            start_new_session=True,  # outlives make and the terminal's Ctrl-C
        )
    pid_file.write_text(f"{proc.pid}\n")
    return proc


def _wait_ready(
    started: dict[str, subprocess.Popen[bytes] | None], workdir: Path
) -> dict[str, dict[str, str]]:
    deadline = time.monotonic() + START_TIMEOUT
    printed: dict[str, dict[str, str]] = {}
    while len(printed) < len(started):
        for name, proc in started.items():
            if name in printed:
                continue
            lines = _printed(workdir / f"{name}.log")
            if "ca_file" in lines:
                printed[name] = lines
            elif proc is not None and proc.poll() is not None:
                log = (workdir / f"{name}.log").read_text(errors="replace").strip()
                raise SystemExit(f"{name} did not start (exit status {proc.returncode}): {log}")
        if time.monotonic() > deadline:
            missing = sorted(set(started) - set(printed))
            raise SystemExit(
                f"{', '.join(missing)} did not start within {START_TIMEOUT:.0f} s (logs in {workdir})"
            )
        time.sleep(0.1)
    return printed


def start(workdir: Path, tls_dir: Path, ports: list[int], config: str) -> int:
    workdir.mkdir(parents=True, exist_ok=True)
    started = {
        name: _start_one(name, port, workdir, tls_dir) for name, port in zip(NAMES, ports, strict=True)
    }
    try:
        printed = _wait_ready(started, workdir)
    except SystemExit as exc:
        _say(f"local namespaces: {exc}")
        stop(workdir, names=[name for name, proc in started.items() if proc is not None], quiet=True)
        return 1
    exports = {
        "REQUESTS_CA_BUNDLE": printed["primary"]["ca_file"],  # the same file for both: --tls-dir
        "SB_PRIMARY_CONNECTION_STRING": printed["primary"]["connection_string"],
        "SB_SECONDARY_CONNECTION_STRING": printed["secondary"]["connection_string"],
    }
    for name in NAMES:
        endpoint = printed[name]["connection_string"].split(";", 1)[0].removeprefix("Endpoint=")
        _say(f"{name}: {endpoint} (pid {_read_pid(workdir / f'{name}.pid')}, log {workdir / f'{name}.log'})")
    done = subprocess.run(
        [sys.executable, "-m", "spark_sb", "provision", "--config", config],
        env={**os.environ, **exports},
        stdout=sys.stderr,  # stdout is for the exports alone
    )
    if done.returncode != 0:
        _say(f"local namespaces: provisioning failed (exit status {done.returncode}); still running")
        return 1
    _say("stop them with: make local-namespaces-stop")
    for key, value in exports.items():
        print(f"export {key}={shlex.quote(value)}", flush=True)
    return 0


def stop(workdir: Path, *, names: list[str] | None = None, quiet: bool = False) -> int:
    stopped = 0
    for name in NAMES if names is None else names:
        pid_file = workdir / f"{name}.pid"
        pid = _read_pid(pid_file)
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
            stopped += 1
            if not quiet:
                _say(f"{name}: stopped (pid {pid})")
        pid_file.unlink(missing_ok=True)
    if not stopped and not quiet:
        _say(f"no local namespace was running from {workdir}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("action", choices=["start", "stop"])
    p.add_argument("--dir", type=Path, default=Path("/tmp/spark-sb-local"), help="logs and pid files")
    p.add_argument(
        "--tls-dir", type=Path, default=Path("~/.cache/spark-sb-tls"), help="the CA both namespaces share"
    )
    p.add_argument("--ports", type=int, nargs=2, default=[5672, 5682], metavar=("PRIMARY", "SECONDARY"))
    p.add_argument("--config", default="conf/local.yaml", help="what to provision (default conf/local.yaml)")
    args = p.parse_args(argv)
    workdir = args.dir.expanduser().absolute()
    if args.action == "stop":
        return stop(workdir)
    return start(workdir, args.tls_dir.expanduser().absolute(), args.ports, args.config)


if __name__ == "__main__":
    sys.exit(main())
