"""``python -m servicebus_local``: run a local Service Bus namespace until SIGINT/SIGTERM.

    python -m servicebus_local --name contoso --port 5672 [--control-port 5673] [--queue q1]... \
        [--topic events:audit,billing]... [--topology topology.yaml] [--key-name K --key V] [--tls-dir DIR] \
        [--max-connections N] [--link-idle-timeout 10m] [--connection-idle-timeout 60s] [--throttle N] \
        [--lenient-settlement] [--tier standard|premium]

Prints ``connection_string=<...>`` (one line), ``control_url=<...>`` when a control port is given and
``ca_file=<...>`` (the CA the admin client must trust: ``connection_verify=`` or ``REQUESTS_CA_BUNDLE``; with
``--tls-dir DIR`` it is ``DIR/ca.pem``, the same for every namespace started with that directory), then
serves in this process until SIGINT or SIGTERM, and exits 0 after a clean stop. User errors (port in use, a missing or invalid topology file) are reported in
one line on stderr, exit status 2, no traceback. ``--port 0`` / ``--control-port
0`` pick free ports (the printed lines tell which). The connection string carries the key given with ``--key``
(or a dummy when the namespace checks no key); it is printed because starting the namespace is asking for it.
``--max-connections N`` sets the quota of concurrent AMQP connections (default 5,000, the service's): the
connection after the N-th open one is answered and closed with ``amqp:resource-limit-exceeded``.
``--link-idle-timeout`` (default 10m) and ``--connection-idle-timeout`` (default 60s) are the service's lifecycle
timers (durations: ``20s``, ``10m``, ``1h`` or plain seconds); ``--throttle N`` grants N messages per second to the
namespace and answers ``com.microsoft:server-busy`` beyond (0, the default, is off). A lock is settled over
``$management`` only for a message received by sequence number (strict, SPEC E8, the default);
``--lenient-settlement`` also settles there by lock token what a receiver link holds, as the service accepts today
for an entity without sessions (see the README's settlement table; ``--strict-settlement`` says the default).
``--tier`` is the namespace's tier: ``standard`` (the default; 256 KB messages and batches) or ``premium``
(``max_message_size_in_kilobytes`` 1,024 to 102,400 per entity, batches of at most 1 MB).
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
import threading
from types import FrameType

import yaml

from servicebus_local.collector import CollectorPolicy
from servicebus_local.durations import parse_seconds
from servicebus_local.server import (
    DEFAULT_CONNECTION_IDLE_TIMEOUT,
    DEFAULT_LINK_IDLE_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    LocalNamespace,
)
from servicebus_local.tiers import STANDARD, TIERS
from servicebus_local.tls import TLS_DIR_ENV
from servicebus_local.topology import TopologyError, load_topology


def _parse_topic(text: str) -> tuple[str, list[str]]:
    name, _, subs = text.partition(":")
    if not name:
        raise argparse.ArgumentTypeError(f"--topic {text!r}: expected <topic>:<sub>,<sub>")
    return name, [s for s in subs.split(",") if s]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _duration(text: str) -> float:
    try:
        value = parse_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"cannot be negative, not {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m servicebus_local", description="Run a local Service Bus namespace."
    )
    p.add_argument("--name", default="local", help="namespace name (default: local)")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=5672, help="AMQP + HTTPS admin port (0 = any free port)")
    p.add_argument("--control-port", type=int, default=None, help="HTTP control API port (0 = any free port)")
    p.add_argument("--queue", action="append", default=[], help="create a queue (repeatable)")
    p.add_argument(
        "--topic",
        action="append",
        default=[],
        type=_parse_topic,
        help="create <topic>:<sub>,<sub> (repeatable)",
    )
    p.add_argument("--topology", default=None, help="YAML file of queues/topics/subscriptions with settings")
    p.add_argument("--key-name", default="RootManageSharedAccessKey", help="shared access key name")
    p.add_argument(
        "--key", default=None, help="shared access key to check SAS tokens against (default: none)"
    )
    p.add_argument(
        "--tls-dir",
        default=None,
        help=(
            "keep the admin endpoint's CA and certificate in this directory and reuse them, so namespaces "
            "started as separate processes share one CA: REQUESTS_CA_BUNDLE=<dir>/ca.pem trusts them all "
            "(default: a CA made for this process; also $SPARK_SB_LOCAL_TLS_DIR)"
        ),
    )
    p.add_argument(
        "--max-connections",
        type=_positive_int,
        default=DEFAULT_MAX_CONNECTIONS,
        metavar="N",
        help=(
            "quota of concurrent AMQP connections: the next one is answered and closed with "
            f"amqp:resource-limit-exceeded, as by the service (default: {DEFAULT_MAX_CONNECTIONS})"
        ),
    )
    p.add_argument(
        "--link-idle-timeout",
        type=_duration,
        default=DEFAULT_LINK_IDLE_TIMEOUT,
        metavar="DURATION",
        help=(
            "a sender or receiver link with no transfer for this long is detached with amqp:link:detach-forced "
            "(IdleTimerExpired), as by the service (20s, 10m, 1h or seconds; default: 10m)"
        ),
    )
    p.add_argument(
        "--connection-idle-timeout",
        type=_duration,
        default=DEFAULT_CONNECTION_IDLE_TIMEOUT,
        metavar="DURATION",
        help=(
            "a connection holding no link for this long is closed with amqp:connection:forced (default: 60s)"
        ),
    )
    p.add_argument(
        "--throttle",
        type=_non_negative_int,
        default=0,
        metavar="N",
        help=(
            "credits (messages) per second for the whole namespace; sends beyond are answered "
            "com.microsoft:server-busy, as the Standard tier does (default: 0 = off)"
        ),
    )
    p.add_argument(
        "--tier",
        choices=sorted(TIERS),
        default=STANDARD.name,
        help=(
            "the namespace's tier: standard (256 KB messages and batches; the default) or premium (entity "
            "max_message_size_in_kilobytes 1024..102400, default 1024; batches of at most 1 MB)"
        ),
    )
    settlement = p.add_mutually_exclusive_group()
    settlement.add_argument(
        "--strict-settlement",
        dest="strict_settlement",
        action="store_const",
        const=True,
        default=None,
        help=(
            "settle a lock over $management (update-disposition) only for a message received by sequence number "
            "(deferred): a lock a receiver link holds is settled on that link only, else "
            "com.microsoft:message-lock-lost (the default, unless $SERVICEBUS_LOCAL_STRICT_SETTLEMENT=0)"
        ),
    )
    settlement.add_argument(
        "--lenient-settlement",
        dest="strict_settlement",
        action="store_const",
        const=False,
        help=(
            "also settle by lock token over $management a lock that a receiver link of an entity without sessions "
            "holds, as the service accepts today (the SDKs' cross-receiver settlement; see the README's table)"
        ),
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.tls_dir:
        os.environ[TLS_DIR_ENV] = args.tls_dir  # read when the admin endpoint first needs its certificate
    topics: dict[str, list[str]] = {}
    for name, subs in args.topic:
        topics.setdefault(name, []).extend(subs)
    try:
        ns = _start(args, topics)
    except UserError as exc:
        print(f"python -m servicebus_local: error: {exc}", file=sys.stderr, flush=True)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        print(f"connection_string={ns.connection_string}", flush=True)
        if ns.control_url is not None:
            print(f"control_url={ns.control_url}", flush=True)
        # The CA the admin client (HTTPS on the same port) must trust: connection_verify=... or
        # REQUESTS_CA_BUNDLE=...
        print(f"ca_file={ns.ca_file}", flush=True)
        # This process is the namespace's own: its held messages leave the collector's scans (see collector.py)
        collector = CollectorPolicy(ns.broker.held_messages)
        collector.start()
        while not stop.wait(0.5):
            collector.step()
    finally:
        ns.stop()
    _say("stopped")
    return 0


def _say(line: str) -> None:
    """Print one line for the parent that reads this process's stdout. A parent that is gone (killed, or done
    reading) is no error of the namespace's: the line is dropped, and stdout is pointed at the null device so that
    the interpreter's flush at exit does not fail on the broken pipe either."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


class UserError(Exception):
    """A mistake in the command line or its files: reported in one line, exit status 2."""


def _start(args: argparse.Namespace, topics: dict[str, list[str]]) -> LocalNamespace:
    """Build and start the namespace; user errors (bad topology file, port in use) -> :class:`UserError`."""
    if args.topology is not None:
        try:
            load_topology(args.topology)
        except FileNotFoundError:
            raise UserError(f"topology file not found: {args.topology}") from None
        except IsADirectoryError:
            raise UserError(f"topology file is a directory: {args.topology}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read topology file {args.topology}: {exc}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            problem = getattr(exc, "problem", None) or type(exc).__name__
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            raise UserError(f"topology file {args.topology} is not valid YAML: {problem}{where}") from None
        except TopologyError as exc:
            raise UserError(f"topology file {args.topology}: {exc}") from None
    try:
        ns = LocalNamespace(
            args.name,
            args.host,
            args.port,
            queues=args.queue,
            topics=topics,
            key_name=args.key_name,
            key=args.key,
            control_port=args.control_port,
            topology=args.topology,
            max_connections=args.max_connections,
            link_idle_timeout=args.link_idle_timeout,
            connection_idle_timeout=args.connection_idle_timeout,
            throttle=args.throttle,
            strict_settlement=args.strict_settlement,
            tier=args.tier,
        )
    except TopologyError as exc:  # applying it: a forwarding destination the namespace does not have
        raise UserError(f"topology file {args.topology}: {exc}") from None
    try:
        ns.start()
    except OSError as exc:
        ns.stop()
        if exc.errno == errno.EADDRINUSE:
            raise UserError(f"port {args.port} on {args.host} is already in use (try --port 0)") from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise UserError(f"cannot listen on {args.host}: address not available") from None
        if exc.errno == errno.EACCES:
            raise UserError(
                f"not allowed to listen on port {args.port} (ports below 1024 need privileges)"
            ) from None
        raise UserError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    return ns


if __name__ == "__main__":
    sys.exit(main())
