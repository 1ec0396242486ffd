"""Run the azure-servicebus SDK's own samples against local namespaces and print what passed.

    python -m servicebus_local.tools.run_sdk_samples SAMPLES_DIR [--lenient] [--jobs N] [--only NAME ...]

``SAMPLES_DIR`` holds ``sync_samples/`` and ``async_samples/`` as in the SDK's repository
(``sdk/servicebus/azure-servicebus/samples/``) or its source distribution (``pip download azure-servicebus==X
--no-binary :all: --no-deps``, then ``azure_servicebus-X/samples/``). The samples are not part of this repository.

Each sample runs in its own Python process (this interpreter, so the installed SDK) against its own fresh
:class:`~servicebus_local.server.LocalNamespace`, strict by default (SPEC E8; ``--lenient`` for the service's
cross-receiver leniency), holding what the samples name: a queue, a session queue, a topic with a subscription.
The samples read them from ``SERVICEBUS_CONNECTION_STR``, ``SERVICEBUS_FULLY_QUALIFIED_NAMESPACE``,
``SERVICEBUS_QUEUE_NAME``, ``SERVICEBUS_SESSION_QUEUE_NAME``, ``SERVICEBUS_TOPIC_NAME``,
``SERVICEBUS_SUBSCRIPTION_NAME``, ``SERVICEBUS_SESSION_ID``, ``SERVICEBUS_SAS_POLICY`` and ``SERVICEBUS_SAS_KEY``;
``REQUESTS_CA_BUNDLE`` and ``SSL_CERT_FILE`` trust the namespace's CA for the admin client's HTTPS. Most samples
authenticate with ``DefaultAzureCredential`` over a fully qualified namespace: ``_adapter/sitecustomize.py``
(on the sample's ``PYTHONPATH``) gives them a local token and plain AMQP (``use_tls=False``), without changing
the SDK. Samples that need what a local namespace cannot give (Azure AD itself, an HTTP proxy, a custom endpoint)
are skipped with the reason.

Each namespace first gets ``--seed`` messages (10) in the queue, the topic and the session queue, as a run of the
send samples would leave them, so the receive samples settle something. Samples that never end by design (a
receiver iterated without ``max_wait_time``) are stopped after ``--until-stopped`` seconds and pass if they drained
the queue without a traceback.

It prints one row per sample (passed, failed, known, skipped; why; seconds) and exits 1 if a sample that runs
failed, 0 otherwise; ``known`` is a failure of the SDK's own (``KNOWN``), which counts only with
``--strict-known``. ``--logs DIR`` keeps each sample's output (``<dir>/<sample>.log``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from servicebus_local.server import LocalNamespace

QUEUE = "samples-queue"
SESSION_QUEUE = "samples-session-queue"
TOPIC = "samples-topic"
SUBSCRIPTION = "samples-subscription"
SESSION_ID = "samples-session"

#: Samples (file name without ``_async.py`` / ``.py``) that cannot run here, and why.
SKIPPED = {
    "client_identity_authentication": "needs Azure AD (EnvironmentCredential: a service principal or user)",
    "proxy": "needs an HTTP proxy at 127.0.0.1:8899 (AMQP over WebSockets)",
    "connection_to_custom_endpoint_address": "needs a real custom endpoint (its address is a placeholder)",
}

#: Samples that fail here for a reason of the SDK's own, and why: reported as ``known`` (a failure that does not
#: change the exit status), or ``passed`` if they pass. ``--strict-known`` counts them as failures.
KNOWN = {
    "auto_lock_renew": (
        "the SDK's race: AutoLockRenewer renews 10 messages at once on one receiver, whose management requests "
        "are not thread- or task-safe (the namespace closes the connection on out-of-order delivery ids, the "
        "handler shuts down, renewals stop and the 60 s locks expire during the sample's 100 s sleep); "
        "passes with one message"
    ),
}

#: Samples that run longer than ``--timeout`` by design (seconds allowed).
LONG = {"auto_lock_renew": 480.0}

#: Samples that never end by design: they iterate a receiver without ``max_wait_time``. Each is stopped after
#: ``--until-stopped`` seconds and passes if it was still running, printed no traceback and left the queue empty
#: (it received and completed what was there).
UNTIL_STOPPED = {
    "receive_iterator_queue": "iterates the queue without max_wait_time",
    "failure_and_recovery": "iterates the queue without max_wait_time",
}

ADAPTER_DIR = Path(__file__).resolve().parent / "_adapter"

TOPOLOGY = f"""\
queues:
  - {QUEUE}
  - {{name: {SESSION_QUEUE}, requires_session: true}}
topics:
  - name: {TOPIC}
    subscriptions:
      - {SUBSCRIPTION}
"""


@dataclass
class Result:
    sample: str
    outcome: str  # "passed", "failed", "known" (a known failure, see KNOWN), "skipped"
    why: str
    seconds: float


def base_name(path: Path) -> str:
    name = path.stem
    return name[: -len("_async")] if name.endswith("_async") else name


def find_samples(samples_dir: Path, only: Sequence[str] = ()) -> list[Path]:
    found = []
    for sub in ("sync_samples", "async_samples"):
        for path in sorted((samples_dir / sub).glob("*.py")):
            if path.name.startswith(("test_", "_")):
                continue
            if only and not any(o in (path.stem, base_name(path), f"{sub}/{path.name}") for o in only):
                continue
            found.append(path)
    return found


def last_error(text: str) -> str:
    """The exception line of a traceback (the last line that names an error), else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    tb = max((i for i, line in enumerate(lines) if line.startswith("Traceback")), default=None)
    if tb is not None:
        for line in reversed(lines[tb:]):
            if not line.startswith(("File ", "^", "~")) and (":" in line or "Error" in line):
                return line[:300]
    return lines[-1][:300] if lines else ""


def seed(ns: LocalNamespace, count: int) -> None:
    """What the samples expect a previous run of the send samples to have left: ``count`` messages in the queue,
    the topic (so the subscription) and the session queue (in session ``SESSION_ID``)."""
    if count <= 0:
        return
    from azure.servicebus import ServiceBusClient, ServiceBusMessage

    with ServiceBusClient.from_connection_string(ns.connection_string) as client:
        with client.get_queue_sender(QUEUE) as sender:
            sender.send_messages([ServiceBusMessage(f"seeded {i}") for i in range(count)])
        with client.get_topic_sender(TOPIC) as sender:
            sender.send_messages([ServiceBusMessage(f"seeded {i}") for i in range(count)])
        with client.get_queue_sender(SESSION_QUEUE) as sender:
            sender.send_messages(
                [ServiceBusMessage(f"seeded {i}", session_id=SESSION_ID) for i in range(count)]
            )


def run_one(
    path: Path,
    root: Path,
    topology: Path,
    *,
    strict: bool,
    timeout: float,
    until_stopped: float,
    seeded: int,
    logs: Path | None,
) -> Result:
    rel = str(path.relative_to(root))
    name = base_name(path)
    if name in SKIPPED:
        return Result(rel, "skipped", SKIPPED[name], 0.0)
    ns = LocalNamespace(f"samples-{name}", topology=topology, strict_settlement=strict).start()
    try:
        seed(ns, seeded)
        env = dict(os.environ)
        env.update(
            SERVICEBUS_CONNECTION_STR=ns.connection_string,
            SERVICEBUS_FULLY_QUALIFIED_NAMESPACE=ns.fully_qualified_namespace,
            SERVICEBUS_QUEUE_NAME=QUEUE,
            SERVICEBUS_SESSION_QUEUE_NAME=SESSION_QUEUE,
            SERVICEBUS_TOPIC_NAME=TOPIC,
            SERVICEBUS_SUBSCRIPTION_NAME=SUBSCRIPTION,
            SERVICEBUS_SESSION_ID=SESSION_ID,
            SERVICEBUS_SAS_POLICY=ns.key_name,
            SERVICEBUS_SAS_KEY=ns.key,
            REQUESTS_CA_BUNDLE=ns.ca_file,
            SSL_CERT_FILE=ns.ca_file,
            SERVICEBUS_SAMPLES_ADAPTER="1",
            PYTHONPATH=os.pathsep.join(p for p in (str(ADAPTER_DIR), env.get("PYTHONPATH", "")) if p),
            PYTHONUNBUFFERED="1",
        )
        started = time.monotonic()
        with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as out:
            proc = subprocess.Popen(
                [sys.executable, path.name],
                cwd=path.parent,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
            allowed = until_stopped if name in UNTIL_STOPPED else LONG.get(name, timeout)
            try:
                code: int | None = proc.wait(timeout=allowed)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                code = None
            seconds = time.monotonic() - started
            out.seek(0)
            text = out.read()
        if logs is not None:
            (logs / (rel.replace("/", "__") + ".log")).write_text(text, encoding="utf-8")
        if code is None and name in UNTIL_STOPPED:
            left = ns.broker.get_queue(QUEUE).runtime.active_message_count
            if "Traceback" in text or left:
                why = f"stopped after {allowed:.0f} s ({UNTIL_STOPPED[name]}): {left} messages left"
                return Result(
                    rel, "failed", why + (f", {last_error(text)}" if "Traceback" in text else ""), seconds
                )
            why = f"stopped after {allowed:.0f} s as it never ends ({UNTIL_STOPPED[name]}); queue drained"
            return Result(rel, "passed", why, seconds)
        if code is None:
            return Result(rel, "failed", f"timed out after {allowed:.0f} s", seconds)
        if code != 0:
            if name in KNOWN:
                return Result(rel, "known", f"{KNOWN[name]}; exit {code}: {last_error(text)}", seconds)
            return Result(rel, "failed", f"exit {code}: {last_error(text)}", seconds)
        return Result(rel, "passed", "", seconds)
    finally:
        ns.stop()


def table(results: Sequence[Result]) -> str:
    width = max((len(r.sample) for r in results), default=6)
    lines = [
        f"| {'sample':<{width}} | result  | seconds | why",
        f"|{'-' * (width + 2)}|---------|---------|----",
    ]
    for r in results:
        seconds = f"{r.seconds:7.1f}" if r.outcome != "skipped" else " " * 7
        lines.append(f"| {r.sample:<{width}} | {r.outcome:<7} | {seconds} | {r.why}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "samples_dir", type=Path, help="the SDK's samples/ (holding sync_samples/, async_samples/)"
    )
    parser.add_argument(
        "--lenient", action="store_true", help="lenient settlement (strict_settlement=False), not strict"
    )
    parser.add_argument("--jobs", type=int, default=4, help="samples run at once (each on its own namespace)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a sample may run (default 120)")
    parser.add_argument(
        "--until-stopped",
        type=float,
        default=30.0,
        help="seconds before a sample that never ends (a receiver iterated without max_wait_time) is stopped",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=10,
        help="messages put in the queue, topic and session queue before each sample",
    )
    parser.add_argument(
        "--strict-known", action="store_true", help="exit 1 on a known failure too (see KNOWN in the source)"
    )
    parser.add_argument("--only", nargs="*", default=(), help="run these samples only (name, or dir/file.py)")
    parser.add_argument("--logs", type=Path, default=None, help="keep each sample's output in this folder")
    args = parser.parse_args(argv)

    root = args.samples_dir.expanduser().resolve()
    samples = find_samples(root, args.only)
    if not samples:
        parser.error(f"no samples under {root}/sync_samples or {root}/async_samples")
    if args.logs is not None:
        args.logs.mkdir(parents=True, exist_ok=True)
    strict = not args.lenient
    print(f"{len(samples)} samples from {root}, {'strict' if strict else 'lenient'} settlement", flush=True)

    lock = threading.Lock()
    with tempfile.TemporaryDirectory(prefix="sdk-samples-") as tmp:
        topology = Path(tmp) / "topology.yaml"
        topology.write_text(TOPOLOGY, encoding="utf-8")

        def job(path: Path) -> Result:
            result = run_one(
                path,
                root,
                topology,
                strict=strict,
                timeout=args.timeout,
                until_stopped=args.until_stopped,
                seeded=args.seed,
                logs=args.logs,
            )
            with lock:
                print(
                    f"  {result.outcome:<7} {result.sample} ({result.seconds:.1f} s)",
                    file=sys.stderr,
                    flush=True,
                )
            return result

        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            results = list(pool.map(job, samples))

    print(table(results))
    counts = {k: sum(r.outcome == k for r in results) for k in ("passed", "failed", "known", "skipped")}
    ran = counts["passed"] + counts["failed"] + counts["known"]
    print(
        f"{'strict' if strict else 'lenient'}: {counts['passed']}/{ran} passed, {counts['failed']} failed, "
        f"{counts['known']} known failures (the SDK's), {counts['skipped']} skipped"
    )
    return 1 if counts["failed"] or (args.strict_known and counts["known"]) else 0


if __name__ == "__main__":
    sys.exit(main())
