"""The syphon job: moves backlog messages back to their primary entities as a Structured Streaming query.

    spark-submit jobs/syphon.py --config conf/prod.yaml [--trigger 10s | --once | --available-now]
                                [--checkpoint PATH]
    python jobs/syphon.py --config conf/local.yaml            # local[2] unless --master / --remote

Wiring only (the library is :mod:`spark_sb.spark.syphon_job`): builds the session (``build_spark_session``; under
spark-submit the master comes from spark-submit), starts the query, and waits. SIGTERM or SIGINT stops it
cleanly: the running micro-batch finishes (every message it holds is completed or abandoned), no new one starts,
then the query and the session stop; exit status 0. The checkpoint defaults to ``<state_location>/_syphon``.
``--available-now`` (``Trigger.AvailableNow``, what serverless jobs accept) drains what the backlog queues hold
at the start and exits; ``--once`` runs one micro-batch (``Trigger.Once``) and exits. With ``ordering``, a job
started while another drains the same backlog queues (another checkpoint) is refused: one line naming the first
on stderr, exit status 3 (SPEC O5).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from types import FrameType

from spark_sb.config.service_bus import load_config
from spark_sb.core.durations import parse_duration
from spark_sb.core.errors import ConfigError
from spark_sb.spark.syphon_job import run_syphon, stop_gracefully
from spark_sb.spark.syphon_lease import SyphonRefused
from spark_sb.spark.syphon_ledger import SyphonBatchWriter


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--config", required=True, help="YAML configuration (conf/<env>.yaml)")
    p.add_argument("--trigger", default="10s", help="processing-time trigger (default 10s)")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--once", action="store_true", help="one micro-batch (Trigger.Once), then stop")
    when.add_argument(
        "--available-now",
        action="store_true",
        help="drain what the backlog holds now, then stop (Trigger.AvailableNow; for serverless jobs)",
    )
    p.add_argument(
        "--checkpoint", default=None, help="checkpoint location (default <state_location>/_syphon)"
    )
    p.add_argument(
        "--master", default=None, help="Spark master when run with plain python (default local[2])"
    )
    p.add_argument(
        "--remote", default=None, help="a Spark Connect URL (sc://host:port) instead of a local session"
    )
    p.add_argument(
        "-v", "--verbose", action="store_true", help="INFO lines: the syphon's and Spark's (off by default)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = load_config(args.config)
        trigger_seconds = parse_duration(args.trigger, "--trigger")
    except ConfigError as exc:
        print(f"syphon: {exc}", file=sys.stderr)
        return 2
    checkpoint = args.checkpoint
    if checkpoint is None:
        if not config.state_location:
            print("syphon: give --checkpoint (or state_location in the configuration)", file=sys.stderr)
            return 2
        checkpoint = f"{config.state_location.rstrip('/')}/_syphon"

    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    if args.remote:
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.remote(args.remote).getOrCreate()
    else:
        from spark_sb.spark.session import build_spark_session

        under_submit = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit launched this Python
        master = None if under_submit and not args.master else (args.master or "local[2]")
        # Spark's own INFO lines off (under spark-submit its default is INFO: ~940 lines for one micro-batch), as
        # the syphon's: --verbose turns both on
        quiet = {} if args.verbose else {"spark.log.level": "WARN"}
        spark = build_spark_session("spark-servicebus-syphon", master, quiet, local_defaults=not under_submit)
    stop_file = str(Path(tempfile.gettempdir()) / f"spark-sb-syphon-{uuid.uuid4().hex}.stop")
    writer = SyphonBatchWriter(config)
    try:
        query = run_syphon(
            spark,
            config,
            checkpoint=checkpoint,
            trigger=f"{trigger_seconds} seconds",
            once=args.once,
            available_now=args.available_now,
            stop_file=stop_file,
            writer=writer,
        )
    except SyphonRefused as exc:  # ordering: another job drains this backlog (SPEC O5)
        spark.stop()
        print(f"syphon: refused: {exc}", file=sys.stderr)
        return 3
    print(f"syphon: started (query {query.id}, checkpoint {checkpoint})", flush=True)
    graceful = True
    try:
        while query.isActive and not stopping.wait(0.5):
            pass
        if stopping.is_set():
            print("syphon: stopping after the current micro-batch", flush=True)
        budget = float(config.syphon_batch_duration) + 3 * float(config.send_timeout) + 10
        graceful = stop_gracefully(query, stop_file, timeout=budget)
        error = query.exception()
    finally:
        if query.isActive:
            query.stop()
        Path(stop_file).unlink(missing_ok=True)
        spark.stop()
    total = writer.total
    per_entity = ", ".join(f"{e}={n}" for e, n in sorted(total.by_entity.items())) or "none"
    others = ", ".join(f"{k}={n}" for k, n in sorted(total.by_kind.items()) if k != "moved") or "none"
    print(
        f"syphon: stopped ({'between micro-batches' if graceful else 'mid-batch'}); "
        f"moved {total.moved} ({per_entity}); other: {others}; micro-batches {total.batches}",
        flush=True,
    )
    if error is not None:
        print(f"syphon: the query failed: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
