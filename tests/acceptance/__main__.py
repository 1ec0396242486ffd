"""``make test-azure``: the acceptance scenario against your own two Service Bus namespaces.

    SB_PRIMARY_CONNECTION_STRING=... SB_SECONDARY_CONNECTION_STRING=... python -m tests.acceptance [--keep]
    SB_PRIMARY_FQDN=a.servicebus.windows.net SB_SECONDARY_FQDN=b.servicebus.windows.net python -m tests.acceptance

Runs on this machine (the driver) with a local Spark session (``local[2]``, Delta). Without the variables it says
what to set and exits 2. A failure is one line saying what to fix (exit 1), never a traceback or a secret.
Exit 0 when every check of the report table passed. Everything created is deleted at the end, also after a
failure or Ctrl-C (exit 130), unless ``--keep``.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.errors import ConfigError
from spark_sb.core.redact import register_secret
from tests.acceptance.backends import MISSING_HELP, Backend, MissingSettings, azure_backend
from tests.acceptance.failures import AcceptanceFailure, explain, preflight, secrets_of
from tests.acceptance.scenario import Settings, run_scenario

PROG = "test-azure"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=(__doc__ or "").splitlines()[0])
    p.add_argument(
        "--keep", action="store_true", help="leave the created entities and the Delta tables for inspection"
    )
    p.add_argument("--rows", type=int, default=100, help="rows per micro-batch (default 100)")
    p.add_argument("--fan-out", type=int, default=10, help="queues of the fan-out step (default 10)")
    p.add_argument("--failover-interval", type=float, default=5.0, help="seconds (default 5)")
    p.add_argument("--ping-interval", type=float, default=2.0, help="probe interval, seconds (default 2)")
    p.add_argument(
        "--slack", type=float, default=10.0, help="allowed seconds on top of an interval (default 10)"
    )
    p.add_argument(
        "--workdir", type=Path, default=None, help="checkpoints and Delta tables (kept when given)"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log the product's warnings")
    return p


def _say(text: str) -> None:
    print(text, flush=True)


def _fail(text: str) -> None:
    print(f"{PROG}: {text}", file=sys.stderr, flush=True)


def _settings(args: argparse.Namespace) -> Settings:
    for name in ("rows", "fan_out"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}")
    for name in ("failover_interval", "ping_interval", "slack"):
        if getattr(args, name) < 0:
            raise ConfigError(f"--{name.replace('_', '-')} must not be negative, not {getattr(args, name)}")
    return Settings(
        rows=args.rows,
        fan_out=args.fan_out,
        failover_interval=args.failover_interval,
        ping_interval=args.ping_interval,
        slack=args.slack,
        send_timeout=max(30.0, 2 * args.failover_interval),
        keep=args.keep,
    )


def check_backend(backend: Backend) -> ServiceBusConfig:
    """The two namespaces as the product's configuration (validated), and both answering a Manage request;
    raises ConfigError or AcceptanceFailure."""
    config = ServiceBusConfig.from_dict(
        {
            "primary": {**backend.primary, "namespace_name": "sbacc-preflight"},
            "secondary": dict(backend.secondary),
            "entity": "sbacc-preflight",
        }
    )
    for value in secrets_of(config):
        register_secret(value)
    preflight(config, {"primary": backend.primary_admin_kwargs, "secondary": backend.secondary_admin_kwargs})
    return config


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None, spark: Any = None) -> int:
    """The command; ``spark`` to reuse a session (tests), else one is built and stopped here."""
    args = _parser().parse_args(argv)
    env = os.environ if environ is None else environ
    logging.basicConfig(level=logging.WARNING if args.verbose else logging.CRITICAL)
    try:
        backend = azure_backend(env)
    except MissingSettings as exc:
        _fail(f"{exc}. {MISSING_HELP}")
        return 2
    try:
        settings = _settings(args)
        config = check_backend(backend)
    except ConfigError as exc:
        _fail(explain(exc, "configuration"))
        return 2
    except AcceptanceFailure as exc:
        _fail(str(exc))
        return 1
    secrets = secrets_of(config)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="spark-sb-acceptance-"))
    own_session = spark is None
    _say(f"{PROG}: primary {config.primary.endpoint_host()}, secondary {config.secondary.endpoint_host()}")
    try:
        if own_session:
            from spark_sb.spark.session import build_spark_session

            spark = build_spark_session("spark-servicebus-acceptance", "local[2]")
            spark.sparkContext.setLogLevel("ERROR")
        report = run_scenario(spark, backend, workdir, settings, say=lambda t: _say(f"  {t}"))
    except KeyboardInterrupt:
        _fail("interrupted; what the run had created was deleted" + (" (--keep: left)" if args.keep else ""))
        return 130
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback
        _fail(explain(exc, "the run", secrets))
        return 1
    finally:
        previous = signal.signal(
            signal.SIGINT, signal.SIG_IGN
        )  # a second Ctrl-C must not cut the clean-up short
        try:
            if own_session and spark is not None:
                spark.stop()
            if args.workdir is None and not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
            elif args.keep:
                _say(f"{PROG}: --keep: checkpoints and Delta state tables in {workdir}")
        finally:
            signal.signal(signal.SIGINT, previous)
    _say(report.format_table())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
