"""``spark-sb <command>`` (the same as ``python -m spark_sb <command>``): the command-line tools of
spark-servicebus. ``--version`` prints the version; ``-v`` / ``-vv`` (more log output) go before or after the
command.

Runs on a workstation, a CI runner or the Spark driver node, never on executors. Commands:

* ``provision --config conf/<env>.yaml [--dry-run] [--json] [--tries N] [--retry-pause SECONDS] [--entity E]``:
  make sure the backlog queues exist in the secondary namespace and print a table (queue, status, detail), then
  the primary entities' duplicate detection against ``exactly_once_horizon`` (:mod:`spark_sb.admin.horizon`).
  Exit 0 when at least one backlog queue is usable, 1 otherwise, 2 on a bad configuration or bad arguments.
* ``status --config conf/<env>.yaml [--json] [--events N] [--no-depths] [--entity E]``: each entity's failover
  state, pulled backlog queues, the newest events and backlog depths, from the state tables, and the primary
  entities' duplicate detection (no Spark; :mod:`spark_sb.admin.status`).
* ``maintain --config conf/<env>.yaml [--retention D] [--no-optimize] [--no-vacuum] [--json]``: keep the state
  tables small (retention delete, OPTIMIZE, VACUUM: :func:`spark_sb.state.maintenance.maintain`); starts a Spark session.
* ``source recover --config conf/<env>.yaml --entity E [--dry-run] [--json]``: return deferred messages no
  offset names to their queue (:mod:`spark_sb.source.recover`; no Spark).

More commands (``demo``, ``syphon``, ...) plug in by adding a ``_add_<name>(subparsers, common)`` function to
:data:`COMMANDS`; each passes ``parents=[common]`` and sets ``func`` (``(args) -> int``) as the parser default.

Output never contains a secret: namespaces are shown by host and SAS key name only, and log records pass
through :class:`spark_sb.core.redact.RedactingFilter`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO, TypeVar

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_CONFIG = 2

_LOG = logging.getLogger("spark_sb")

N = TypeVar("N", int, float)


def _at_least(parse: Callable[[str], N], what: str, least: int) -> Callable[[str], N]:
    """An argparse ``type``: ``parse(text)``, refused unless it is ``what`` and at least ``least``."""

    def check(text: str) -> N:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be >= {least}: {text!r}")
        return value

    return check


_non_negative_float = _at_least(float, "a number", 0)
_positive_int = _at_least(int, "an integer", 1)


# --------------------------------------------------------------------------------------------------------------
# provision
# --------------------------------------------------------------------------------------------------------------


def _add_provision(subparsers: Any, common: argparse.ArgumentParser) -> None:
    from spark_sb.admin.provisioning import DEFAULT_RETRY_PAUSE, DEFAULT_TRIES

    p = subparsers.add_parser(
        "provision",
        parents=[common],
        help="create the backlog queues in the secondary namespace (never modifies or deletes a queue)",
        description=(
            "Make sure the backlog queues <primary-namespace>/x-servicebus-transfer/<i>, i in "
            "[0, backlog_queue_count), exist in the secondary namespace. Missing queues are created; existing "
            "queues are never modified (differences are reported as 'drifted'); queues with a higher index are "
            "left alone ('extra'). Then the duplicate detection of the primary entities (entity, --entity) is "
            "shown, with a warning where it is off or shorter than exactly_once_horizon. Exit 0 if at least one "
            "backlog queue is usable, 1 if none is, 2 on a bad configuration. For a local namespace with a "
            "self-signed certificate set REQUESTS_CA_BUNDLE."
        ),
    )
    p.add_argument("--config", required=True, help="YAML configuration file (conf/<env>.yaml)")
    p.add_argument("--dry-run", action="store_true", help="change nothing; print the plan")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.add_argument(
        "--tries",
        type=_positive_int,
        default=None,
        help=f"creation attempts per missing queue (default: config key provision.tries, else {DEFAULT_TRIES})",
    )
    p.add_argument(
        "--retry-pause",
        type=_non_negative_float,
        default=None,
        metavar="SECONDS",
        help=(
            "pause between attempts (default: config key provision.retry_pause, "
            f"else {DEFAULT_RETRY_PAUSE:g})"
        ),
    )
    p.add_argument(
        "--entity",
        action="append",
        default=[],
        metavar="ENTITY",
        help="a primary entity whose duplicate detection to report and whose largest message the backlog queues "
        "must take, besides `entity` (repeatable)",
    )
    p.add_argument(
        "--no-duplicate-detection",
        action="store_true",
        help="do not ask the primary about its entities (duplicate detection against exactly_once_horizon, and "
        "their message size limits: the backlog queues are then created at the namespace's default size)",
    )
    p.set_defaults(func=run_provision)


def run_provision(
    args: argparse.Namespace,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    **provision_kwargs: Any,
) -> int:
    """The ``provision`` command. ``provision_kwargs`` go to
    :func:`spark_sb.admin.provisioning.provision_backlog_queues` (tests inject a clock or admin clients)."""
    from spark_sb.admin.provisioning import provision_backlog_queues
    from spark_sb.admin.report import backlog_spec_for
    from spark_sb.config.service_bus import load_config
    from spark_sb.core.errors import ConfigError, ProvisioningError

    out = out or sys.stdout
    err = err or sys.stderr
    try:
        config = load_config(args.config)
    except (ConfigError, OSError) as exc:
        return _bad_config(err, args, f"bad configuration {args.config}: {exc}")
    if config.secondary is None and "admin_client" not in provision_kwargs:
        return _bad_config(
            err,
            args,
            f"bad configuration {args.config}: backlog queues live in the secondary namespace; set "
            "secondary.connection_string or secondary.fully_qualified_namespace",
        )
    horizon = _horizon(args, config, provision_kwargs.get("primary_admin_client"), log=False)
    if horizon is not None and "spec" not in provision_kwargs:
        # SPEC B13: the backlog queues take what the primaries take (their limits read with their windows)
        provision_kwargs["spec"] = backlog_spec_for(e.max_message_kb for e in horizon.entities)
    try:
        report = provision_backlog_queues(
            config,
            tries=args.tries if args.tries is not None else config.provision_tries,
            retry_pause=args.retry_pause if args.retry_pause is not None else config.provision_retry_pause,
            dry_run=args.dry_run,
            check=False,
            **provision_kwargs,
        )
    except ConfigError as exc:
        return _bad_config(err, args, f"bad configuration {args.config}: {exc}")
    except ProvisioningError as exc:
        if args.json:
            _print_json(out, {"ok": False, "namespace": exc.namespace, "tried": exc.tried, "error": str(exc)})
        print(f"error: {exc}", file=err)
        return EXIT_FAILED

    if horizon is not None:
        horizon.log()  # after the provisioning, as its warnings have always come
    if args.json:
        payload = report.to_dict()
        if not report.ok:
            payload["error"] = _unusable_message(report)
        if horizon is not None:
            payload["duplicate_detection"] = horizon.to_json()
        _print_json(out, payload)
    else:
        print(report.format_table(), file=out)
        if horizon is not None and horizon.entities:
            print("\n".join(horizon.lines()), file=out)
    if not report.ok:
        print(f"error: {_unusable_message(report)}", file=err)
        return EXIT_FAILED
    return EXIT_OK


def _horizon(args: argparse.Namespace, config: Any, admin_client: Any, *, log: bool = True) -> Any:
    """SPEC B14: the duplicate detection of the primary entities (``entity``, ``--entity``), their warnings logged
    (with ``log``); None with ``--no-duplicate-detection``."""
    from spark_sb.admin.horizon import check_horizon, primary_entities

    if getattr(args, "no_duplicate_detection", False):
        return None
    horizon = check_horizon(
        config, primary_entities(config, getattr(args, "entity", ())), admin_client=admin_client
    )
    if log:
        horizon.log()
    return horizon


def _unusable_message(report: Any) -> str:
    from spark_sb.core.errors import ProvisioningError

    try:
        report.raise_if_unusable()
    except ProvisioningError as exc:
        return str(exc)
    return ""


def _bad_config(err: TextIO, args: argparse.Namespace, message: str) -> int:
    print(f"error: {message}", file=err)
    return EXIT_BAD_CONFIG


def _print_json(out: TextIO, payload: Any) -> None:
    json.dump(payload, out, indent=2, default=str)
    out.write("\n")


# --------------------------------------------------------------------------------------------------------------
# wiring
# --------------------------------------------------------------------------------------------------------------


#: Subcommand registrars, in the order ``--help`` lists them. Each gets the subparsers action and the parent
#: parser with the options every command accepts after its name (``-v``).
def _add_status(subparsers: Any, common: argparse.ArgumentParser) -> None:
    from spark_sb.admin.status import add_status_command, run_status

    add_status_command(subparsers, common, lambda args: run_status(args, sys.stdout, sys.stderr))


# --------------------------------------------------------------------------------------------------------------
# maintain
# --------------------------------------------------------------------------------------------------------------


def _add_maintain(subparsers: Any, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        "maintain",
        parents=[common],
        help="keep the Delta state tables small: retention delete, OPTIMIZE, VACUUM (starts Spark)",
        description=(
            "Delete events and rejects older than state_retention (never the entities table, never the rows a "
            "running sink reads for replay skipping), OPTIMIZE and VACUUM the three state tables, and set their "
            "table properties. Safe while sinks and the syphon run. Starts a local Spark session with Delta "
            "(--master); on Databricks call spark_sb.state.maintain(spark, tables) from a job instead."
        ),
    )
    p.add_argument("--config", required=True, help="the YAML configuration (conf/<env>.yaml)")
    p.add_argument(
        "--retention", default=None, help="override state_retention (a duration: '30d', '12h', 'P7D')"
    )
    p.add_argument("--no-optimize", action="store_true", help="skip OPTIMIZE")
    p.add_argument("--no-vacuum", action="store_true", help="skip VACUUM")
    p.add_argument("--master", default="local[2]", help="Spark master of the session (default local[2])")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run_maintain)


def run_maintain(
    args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None, spark: Any = None
) -> int:
    """The ``maintain`` command: 0 done, 1 failed, 2 bad configuration. ``spark``: a session to use (tests);
    otherwise one is built and stopped."""
    from spark_sb.config.service_bus import load_config
    from spark_sb.core.durations import parse_duration
    from spark_sb.core.errors import ConfigError
    from spark_sb.core.redact import redact
    from spark_sb.state.delta import StateTables
    from spark_sb.state.maintenance import maintain

    out = out or sys.stdout
    err = err or sys.stderr
    try:
        config = load_config(args.config)
        retention = (
            parse_duration(args.retention, "--retention")
            if args.retention is not None
            else config.state_retention
        )
        if retention <= 0:
            raise ConfigError(f"--retention: must be > 0 seconds, found {args.retention!r}")
        tables = StateTables.from_config(config)
        if tables is None:
            raise ConfigError("state_location or state_table_prefix: required (the state tables to maintain)")
    except (ConfigError, OSError) as exc:
        return _bad_config(err, args, f"bad configuration {args.config}: {exc}")
    own = spark is None
    try:
        if own:
            from spark_sb.spark.session import build_spark_session

            spark = build_spark_session("spark-sb-maintain", args.master)
        report = maintain(
            spark, tables, retention=retention, optimize=not args.no_optimize, vacuum=not args.no_vacuum
        )
    except Exception as exc:  # noqa: BLE001 - one clear line, secrets redacted
        print(redact(f"error: {type(exc).__name__}: {exc}"), file=err)
        return EXIT_FAILED
    finally:
        if own and spark is not None:
            spark.stop()
    if args.json:
        _print_json(out, report.to_json())
    else:
        print(f"retention cutoff {report.cutoff.isoformat()}", file=out)
        for t in report.tables:
            print(
                f"{t.table:<9} {t.deleted_rows:>10} rows deleted  files {t.files_before} -> {t.files_after}  "
                f"bytes {t.bytes_before} -> {t.bytes_after}  {t.seconds:.1f} s",
                file=out,
            )
    return EXIT_OK


# --------------------------------------------------------------------------------------------------------------
# source
# --------------------------------------------------------------------------------------------------------------


def _add_source(subparsers: Any, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        "source",
        parents=[common],
        help="tools of the servicebus source (format('servicebus') reads)",
        description="Tools of the servicebus source: `recover` returns orphan deferred messages to their queue.",
    )
    tools = p.add_subparsers(dest="tool", metavar="TOOL")
    tools.required = True
    r = tools.add_parser(
        "recover",
        parents=[common],
        help="return deferred messages no offset names (a lost checkpoint) to their queue",
        description=(
            "Sweep a queue of the primary namespace for deferred messages (a query's checkpoint was lost after "
            "it deferred them: no offset names them, and no receive sees them) and send each back to the queue "
            "as it was, completing the deferred original: the next query reads them (at-least-once for those). "
            "On a queue with duplicate detection, messages enqueued within its window stay deferred (their "
            "re-send would be dropped): run again later. Queues only (a subscription: recoverDeferred=true in "
            "the query). Exit 0 when every one found was returned, 1 otherwise, 2 on a bad configuration. For a "
            "local namespace set REQUESTS_CA_BUNDLE."
        ),
    )
    r.add_argument("--config", required=True, help="YAML configuration file (conf/<env>.yaml)")
    r.add_argument("--entity", required=True, help="the queue (of the primary namespace)")
    r.add_argument("--dry-run", action="store_true", help="count them; change nothing")
    r.add_argument("--json", action="store_true", help="print the report as JSON")
    r.set_defaults(func=run_source_recover)


def run_source_recover(
    args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """The ``source recover`` command: 0 all found returned (or a dry run), 1 some left, 2 bad configuration."""
    from dataclasses import asdict

    from spark_sb.config.service_bus import load_config
    from spark_sb.core.errors import ConfigError
    from spark_sb.source.recover import recover_deferred

    out = out or sys.stdout
    err = err or sys.stderr
    try:
        config = load_config(args.config)
        report = recover_deferred(config, args.entity, dry_run=args.dry_run)
    except (ConfigError, OSError) as exc:
        return _bad_config(err, args, f"bad configuration {args.config}: {exc}")
    if args.json:
        _print_json(out, asdict(report))
    else:
        print(report.line(), file=out)
    return EXIT_OK if report.dry_run or report.recovered == report.found else EXIT_FAILED


COMMANDS: list[Callable[[Any, argparse.ArgumentParser], None]] = [
    _add_provision,
    _add_status,
    _add_maintain,
    _add_source,
]

_VERBOSE_HELP = "more log output (-v info, -vv debug); before or after the command"


def build_parser(prog: str = "python -m spark_sb") -> argparse.ArgumentParser:
    from spark_sb import __version__

    parser = argparse.ArgumentParser(
        prog=prog,
        description="spark-servicebus tools (Azure Service Bus sink with paired-namespace failover)",
    )
    parser.add_argument("--version", action="version", version=f"spark-servicebus {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help=_VERBOSE_HELP)
    # `-v` after the command counts into its own destination (a subparser's defaults would overwrite the
    # main parser's count); main() adds the two.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v", "--verbose", dest="verbose_after", action="count", default=0, help=_VERBOSE_HELP
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for register in COMMANDS:
        register(subparsers, common)
    return parser


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    from spark_sb.core.redact import RedactingFilter

    handler.addFilter(RedactingFilter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_spark_sb_cli", False)]:
        root.removeHandler(old)  # main() called again in the same process (tests)
    handler._spark_sb_cli = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    _LOG.setLevel(level)
    # azure-core logs every HTTP request at INFO; keep it out unless asked for debug.
    logging.getLogger("azure").setLevel(logging.DEBUG if verbose >= 3 else logging.WARNING)


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m spark_sb") -> int:
    """Entry point of ``python -m spark_sb``; returns the exit code."""
    parser = build_parser(prog)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: 2 on bad usage, 0 on --help / --version
        return int(exc.code) if isinstance(exc.code, int) else EXIT_BAD_CONFIG
    args.verbose += getattr(args, "verbose_after", 0)
    _setup_logging(args.verbose)
    try:
        result: int = args.func(args)
        sys.stdout.flush()  # a reader that went away (`| head`) shows here, not at exit
    except BrokenPipeError:
        return _stdout_closed()
    except KeyboardInterrupt:
        return 130
    except (
        Exception
    ) as exc:  # a command's own errors are lines already; this is the last net: never a traceback
        from spark_sb.core.errors import ConfigError, describe_error

        if args.verbose >= 2:
            _LOG.exception("%s failed", getattr(args, "command", "the command"))
        bad = isinstance(exc, (ConfigError, ValueError))  # what the user gave was refused
        hint = "" if args.verbose >= 2 else " (-vv shows the traceback)"
        print(f"error: {describe_error(exc)}{hint}", file=sys.stderr)
        return EXIT_BAD_CONFIG if bad else EXIT_FAILED
    return result


def _stdout_closed() -> int:
    """The reader of standard output went away (``spark-sb status --json | head``): say nothing more and exit 1, as
    Python's documentation advises (signal module, "Note on SIGPIPE"). What is left in stdout's buffer goes to
    /dev/null, so the flush at exit raises no second BrokenPipeError ("Exception ignored ...")."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (pytest's capture): nothing to flush at exit
        return EXIT_FAILED
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
    return EXIT_FAILED


def console_main() -> None:
    """Entry point of the ``spark-sb`` console script (``[project.scripts]``)."""
    sys.exit(main(prog="spark-sb"))


if __name__ == "__main__":
    sys.exit(main())
