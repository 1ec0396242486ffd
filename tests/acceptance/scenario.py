"""The acceptance scenario: one piece of code, the backend a parameter (two local namespaces in CI, the user's
Azure namespaces with ``make test-azure``).

Runs on the driver (the test process, or ``python -m tests.acceptance``) with a local Spark session; the sink's
partition tasks run in that session's Python workers as in production. Steps:

1. create uniquely named entities under a fresh prefix ``sbacc-<hex>`` in the primary (a queue with duplicate
   detection, a topic with a subscription, N fan-out queues) and provision backlog queues in the secondary under
   that prefix as primary-namespace name, so nothing of the user's is touched;
2. a Structured Streaming query (file source -> ``foreachBatch(ServiceBusSink)``, Delta state tables) sends a
   healthy batch: every row to the primary;
3. the queue's status is set to ``SendDisabled`` (the admin API; the service answers ``entity-disabled``): the
   next batch is diverted, and its wall time is the diversion time (expected: ``failover_interval`` + slack);
4. status back to ``Active``: after the probe new rows go to the primary again;
5. fan-out: rows over the N queues, all ``SendDisabled`` at once: the outage batch should cost about one
   ``failover_interval``, not N of them; then they are restored;
6. a healthy and a ``SendDisabled`` batch through ``format("servicebus")`` (a second query, its own sink id and
   state tables; skipped with a note where ``spark_sb.spark.datasource`` is missing);
7. the syphon job's query (:func:`spark_sb.spark.syphon_job.run_syphon` with ``once``, what ``jobs/syphon.py --once``
   runs) moves every backlog back, pass after pass until the backlog is empty (at most ``syphon_passes``);
8. every produced id is compared, as sets, with what the primary entities hold: 0 lost, 0 duplicates; the Delta
   events table records the diversions and state changes;
9. everything created is deleted in a ``finally`` (also after a failure or Ctrl-C) unless ``keep``.

Only configuration crosses to the executors (the sink pickles its config); every client is built where it is
used. Secrets never reach the report: entities are named by their prefix, namespaces by host.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from spark_sb.admin.provisioning import provision_backlog_queues
from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.core.clock import Clock, SystemClock
from spark_sb.failover.outcome import SendOutcome
from spark_sb.spark.sink import ServiceBusSink
from spark_sb.spark.syphon_job import run_syphon
from spark_sb.spark.syphon_ledger import SyphonBatchWriter
from tests.acceptance.backends import Backend
from tests.acceptance.failures import ADMIN_TIMEOUTS

SUBSCRIPTION = "all"
SEND_DISABLED = "SendDisabled"
ACTIVE = "Active"


@dataclass(frozen=True)
class Settings:
    """The knobs of a run. CI uses short intervals and few rows; ``make test-azure`` longer ones."""

    rows: int = 40
    fan_out: int = 8
    failover_interval: float = 2.0
    ping_interval: float = 1.0
    send_timeout: float = 10.0
    backlog_queues: int = 2
    slack: float = 5.0  # "a few seconds" on top of an interval (Spark's own batch overhead included)
    keep: bool = False
    syphon_passes: int = 3
    syphon_batch_duration: float = 30.0  # a syphon task drains its queue at most this long
    settle_wait: float = 3.0  # after the expected count, how long a receive waits for a duplicate to show up


@dataclass(frozen=True)
class Check:
    """One line of the report table."""

    step: str
    measured: str
    expected: str
    ok: bool


@dataclass
class Report:
    """What the run measured; ``numbers`` for tests, ``checks`` for people."""

    backend: str
    prefix: str
    checks: list[Check] = field(default_factory=list)
    numbers: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def check(self, step: str, measured: str, expected: str, ok: bool) -> bool:
        self.checks.append(Check(step, measured, expected, ok))
        return ok

    def format_table(self) -> str:
        head = ("step", "measured", "expected", "")
        rows = [head] + [(c.step, c.measured, c.expected, "ok" if c.ok else "FAIL") for c in self.checks]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]

        def line(r: Sequence[str]) -> str:
            return "| " + " | ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) + " |"

        out = [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
        out += [line(r) for r in rows[1:]]
        verdict = "PASSED" if self.ok else "FAILED"
        out.append(f"acceptance ({self.backend}, prefix {self.prefix}): {verdict}")
        out.extend(f"note: {n}" for n in self.notes)
        return "\n".join(out)


def _seconds(value: float) -> str:
    return f"{value:.1f} s"


class Scenario:
    """One acceptance run against ``backend``. Driver only; not picklable (it holds admin clients)."""

    def __init__(
        self,
        spark: Any,
        backend: Backend,
        workdir: Path,
        settings: Settings | None = None,
        *,
        say: Callable[[str], None] = print,
        clock: Clock | None = None,
    ) -> None:
        self.spark = spark
        self.backend = backend
        self.workdir = Path(workdir)
        self.settings = settings or Settings()
        self._say = say
        self.clock = clock or SystemClock()
        self._began = self.clock.monotonic()
        self.prefix = f"sbacc-{uuid.uuid4().hex[:10]}"
        self.queue = f"{self.prefix}-orders"
        self.topic = f"{self.prefix}-events"
        self.fan_queues = [f"{self.prefix}-fan-{i:03d}" for i in range(self.settings.fan_out)]
        self.report = Report(backend.name, self.prefix)
        self.produced: dict[str, list[str]] = {}
        self._created_primary: list[tuple[str, str]] = []  # (kind, name), deleted in reverse order
        self._created_backlog: list[str] = []
        self._primary_admin: Any = None
        self._secondary_admin: Any = None
        self._batch = 0
        self.config = self._config()

    def say(self, text: str) -> None:
        self._say(f"[{self.clock.monotonic() - self._began:6.1f} s] {text}")

    # ------------------------------------------------------------------------------------------- wiring
    def _config(self) -> ServiceBusConfig:
        s = self.settings
        return ServiceBusConfig.from_dict(
            {
                "primary": {**self.backend.primary, "namespace_name": self.prefix},
                "secondary": dict(self.backend.secondary),
                "entity": self.queue,
                "backlog_queue_count": s.backlog_queues,
                "failover_interval": s.failover_interval,
                "ping_primary_interval": s.ping_interval,
                "send_timeout": s.send_timeout,
                "retry": {"total": 0, "backoff_factor": 0.2, "backoff_max": 1},
                "state_location": str(self.workdir / "state"),
                "sink_id": self.prefix,
                "syphon": {"batch_duration": s.syphon_batch_duration, "max_wait": 1},
            }
        )

    def _admins(self) -> tuple[Any, Any]:
        if self._primary_admin is None:
            self._primary_admin = self.config.primary.admin_client(
                **ADMIN_TIMEOUTS, **self.backend.primary_admin_kwargs
            )
            self._secondary_admin = self.config.secondary.admin_client(
                **ADMIN_TIMEOUTS, **self.backend.secondary_admin_kwargs
            )
        return self._primary_admin, self._secondary_admin

    # ------------------------------------------------------------------------------------------- entities
    def create_entities(self) -> None:
        """The run's own entities in the primary and its backlog queues in the secondary."""
        primary, secondary = self._admins()
        dedup = {
            "requires_duplicate_detection": True,
            "duplicate_detection_history_time_window": timedelta(minutes=10),
        }
        for name in [self.queue, *self.fan_queues]:
            primary.create_queue(name, **dedup)
            self._created_primary.append(("queue", name))
        primary.create_topic(self.topic, **dedup)
        self._created_primary.append(("topic", self.topic))
        primary.create_subscription(self.topic, SUBSCRIPTION)
        report = provision_backlog_queues(
            self.config, admin_client=secondary, clock=self.clock, retry_pause=2
        )
        self._created_backlog.extend(report.created)
        self.say(
            f"created {len(self._created_primary)} entities under prefix {self.prefix} and "
            f"{len(report.created)} backlog queues ({report.summary()})"
        )

    def set_status(self, names: Iterable[str], status: str) -> None:
        primary, _ = self._admins()
        for name in names:
            props = primary.get_queue(name)
            props.status = status
            primary.update_queue(props)

    def cleanup(self) -> None:
        """Delete what the run created (never anything else); best effort, each failure noted. Runs in the
        ``finally`` of :meth:`run`."""
        if self._primary_admin is None:
            return
        primary, secondary = self._admins()
        if self.settings.keep:
            self.report.notes.append(
                f"--keep: left {len(self._created_primary)} entities with prefix {self.prefix} in the primary and "
                f"{len(self._created_backlog)} backlog queues in the secondary"
            )
        else:
            failed: list[str] = []
            for kind, name in reversed(self._created_primary):
                try:
                    (primary.delete_topic if kind == "topic" else primary.delete_queue)(name)
                except Exception as exc:  # noqa: BLE001 - clean-up goes on; the note names what is left
                    failed.append(f"{name} ({type(exc).__name__})")
            for name in self._created_backlog:
                try:
                    secondary.delete_queue(name)
                except Exception as exc:  # noqa: BLE001
                    failed.append(f"{name} ({type(exc).__name__})")
            if failed:
                self.report.notes.append("could not delete: " + ", ".join(failed))
            else:
                self.report.notes.append(
                    f"deleted {len(self._created_primary)} entities and {len(self._created_backlog)} backlog queues"
                )
        for admin in (primary, secondary):
            with contextlib.suppress(Exception):
                admin.close()

    # ------------------------------------------------------------------------------------------- stream
    def _write_batch(self, input_dir: Path, rows: Sequence[tuple[str, str]]) -> None:
        """Rows (entity, message id) as one JSON file, written atomically for the file source."""
        self._batch += 1
        for entity, mid in rows:
            self.produced.setdefault(entity, []).append(mid)
        lines = [
            json.dumps({"body": json.dumps({"id": mid}), "message_id": mid, "entity": e}) for e, mid in rows
        ]
        tmp = input_dir / f".batch-{self._batch:03d}.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(input_dir / f"batch-{self._batch:03d}.json")

    def _rows(self, phase: str, entities: Sequence[str], count: int) -> list[tuple[str, str]]:
        return [(entities[i % len(entities)], f"{phase}-{i:05d}") for i in range(count)]

    def _timed_batch(self, query: Any, input_dir: Path, rows: Sequence[tuple[str, str]]) -> float:
        start = self.clock.monotonic()
        self._write_batch(input_dir, rows)
        query.processAllAvailable()
        return self.clock.monotonic() - start

    @contextlib.contextmanager
    def _stream(self, sink: ServiceBusSink) -> Iterator[tuple[Any, Path]]:
        input_dir = self.workdir / "input"
        input_dir.mkdir(parents=True, exist_ok=True)
        stream = self.spark.readStream.schema("body STRING, message_id STRING, entity STRING").json(
            str(input_dir)
        )
        query = (
            stream.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(self.workdir / "checkpoint"))
            .queryName(self.prefix.replace("-", "_"))
            .start()
        )
        try:
            yield query, input_dir
        finally:
            try:
                query.stop()
            finally:
                sink.close(timeout=120)

    def _syphon(self) -> int:
        """Syphon passes (the query of ``jobs/syphon.py --once``) until the backlog is empty; messages moved."""
        import inspect

        # jobs/syphon.py --available-now where this tree has it (Trigger.AvailableNow), else --once.
        available_now = "available_now" in inspect.signature(run_syphon).parameters
        trigger: dict[str, bool] = {"available_now": True} if available_now else {"once": True}
        moved = 0
        for _ in range(self.settings.syphon_passes):
            writer = SyphonBatchWriter(self.config)
            query = run_syphon(
                self.spark,
                self.config,
                checkpoint=str(self.workdir / "syphon-checkpoint"),
                **trigger,  # type: ignore[arg-type]
                admin_kwargs={**ADMIN_TIMEOUTS, **self.backend.secondary_admin_kwargs},
                writer=writer,
                query_name=None,
            )
            query.awaitTermination()
            moved += writer.total.moved
            depth = self.backlog_depth()
            mode = "available-now" if available_now else "once"
            self.say(f"syphon pass ({mode}): moved {writer.total.moved}, backlog left {depth}")
            if depth == 0:
                break
        return moved

    def backlog_depth(self) -> int:
        _, secondary = self._admins()
        depth = 0
        for name in self._created_backlog or self.config.backlog_queue_names():
            runtime = secondary.get_queue_runtime_properties(name)
            depth += runtime.active_message_count + runtime.scheduled_message_count
        return depth

    # ------------------------------------------------------------------------------------------- checks
    def _receive(self, entity: str, expected: int, subscription: str | None = None) -> list[str]:
        from azure.servicebus import ServiceBusReceiveMode

        ids: list[str] = []
        with self.config.primary.client() as client:
            if subscription is None:
                receiver = client.get_queue_receiver(
                    entity, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
                )
            else:
                receiver = client.get_subscription_receiver(
                    entity, subscription, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
                )
            with receiver:
                # Past the expected count, one more short wait: a duplicate would show up there.
                while True:
                    wait = self.settings.settle_wait if len(ids) >= expected else 10
                    batch = receiver.receive_messages(max_message_count=200, max_wait_time=wait)
                    if not batch:
                        return ids
                    ids.extend(str(m.message_id) for m in batch)

    def _read_with_source(self, entity: str) -> list[str]:
        """``entity``'s messages read by the ``servicebus`` source (Trigger.AvailableNow) into a Delta table, as
        a user reads them: the ids of the table's rows; the entity is left empty."""
        import spark_sb

        spark_sb.register(self.spark)
        out = self.workdir / "source-read"
        options = {k: v for k, v in self.backend.options.items() if k.startswith("primary.")}
        query = (
            self.spark.readStream.format("servicebus")
            .options(**options)
            .option("entity", entity)
            .option("receiveWaitTime", "2s")
            .load()
            .writeStream.format("delta")
            .option("checkpointLocation", str(self.workdir / "checkpoint-source-read"))
            .trigger(availableNow=True)
            .start(str(out))
        )
        query.awaitTermination(600)
        if query.isActive:
            query.stop()
        if query.exception() is not None:
            raise RuntimeError(f"the source's query failed: {query.exception()}")
        rows = self.spark.read.format("delta").load(str(out)).select("message_id").collect()
        return [str(r["message_id"]) for r in rows]

    def _compare(
        self, step: str, entities: Sequence[str], subscription: str | None = None, *, source: bool = False
    ) -> tuple[int, int]:
        lost = duplicates = 0
        total = 0
        for entity in entities:
            produced = self.produced.get(entity, [])
            received = (
                self._read_with_source(entity)
                if source
                else self._receive(entity, len(produced), subscription)
            )
            lost += len(set(produced) - set(received))
            duplicates += len(received) - len(set(received))
            duplicates += len(set(received) - set(produced))  # never produced: counted against us too
            total += len(produced)
        self.report.check(
            step, f"{total} produced, lost {lost}, duplicates {duplicates}", "lost 0, duplicates 0",
            lost == 0 and duplicates == 0,
        )  # fmt: skip
        return lost, duplicates

    def _delta_checks(self, outage_diverted: int, fan_diverted: int) -> None:
        state = self.workdir / "state"
        events = self.spark.read.format("delta").load(str(state / "events"))
        rows = events.where(events.event.isin("diverted", "state_change")).collect()
        diverted_main = sum(
            r["count"] or 0 for r in rows if r["event"] == "diverted" and r["entity"] == self.queue
        )
        diverted_fan = sum(
            r["count"] or 0 for r in rows if r["event"] == "diverted" and r["entity"] in self.fan_queues
        )
        failed_over = {
            r["entity"] for r in rows if r["event"] == "state_change" and r["to_state"] == "failed_over"
        }
        expected_over = {self.queue, *self.fan_queues}
        self.report.check(
            "Delta events table",
            f"diverted {diverted_main} + {diverted_fan} (fan-out); failed_over for "
            f"{len(failed_over & expected_over)} of {len(expected_over)} entities",
            f"diverted {outage_diverted} + {fan_diverted}; all {len(expected_over)}",
            diverted_main == outage_diverted
            and diverted_fan == fan_diverted
            and expected_over <= failed_over,
        )
        self.report.numbers["delta_failed_over_entities"] = len(failed_over & expected_over)

    def _datasource_options(self) -> dict[str, str]:
        s = self.settings
        return {
            **self.backend.options,
            "primary.namespace_name": self.prefix,
            "entity": self.queue,
            "backlog_queue_count": str(s.backlog_queues),
            "failover_interval": f"{round(s.failover_interval * 1000)}ms",
            "ping_primary_interval": f"{round(s.ping_interval * 1000)}ms",
            "send_timeout": f"{round(s.send_timeout * 1000)}ms",
            "retry.total": "0",
            "state_location": str(self.workdir / "state-datasource"),
            "sink_id": f"{self.prefix}-datasource",
        }

    def _datasource_step(self) -> int:
        """A healthy batch and a ``SendDisabled`` outage batch through ``format("servicebus")`` (a second
        streaming query, its own sink id and state tables); returns the rows it diverted. Skipped (with a note)
        when the tree has no ``spark_sb.spark.datasource``."""
        import importlib.util

        if importlib.util.find_spec("spark_sb.spark.datasource") is None:
            self.report.notes.append(
                'format("servicebus") step skipped: spark_sb.spark.datasource is not there'
            )
            return 0
        import spark_sb

        s = self.settings
        spark_sb.register(self.spark)
        input_dir = self.workdir / "input-datasource"
        input_dir.mkdir(parents=True, exist_ok=True)
        query = (
            self.spark.readStream.schema("body STRING, message_id STRING, entity STRING")
            .json(str(input_dir))
            .writeStream.format("servicebus")
            .options(**self._datasource_options())
            .option("checkpointLocation", str(self.workdir / "checkpoint-datasource"))
            .start()
        )
        try:
            self.say('format("servicebus") query started')
            rows = self._rows("ds-healthy", [self.queue], s.rows)
            took = self._timed_batch(query, input_dir, rows)
            sent, diverted = self._datasource_counts()
            self.report.check(
                'format("servicebus"): healthy batch',
                f"{sent} of {len(rows)} sent, {diverted} diverted in {_seconds(took)}",
                f"{len(rows)} sent, 0 diverted",
                sent == len(rows) and diverted == 0,
            )
            self.set_status([self.queue], SEND_DISABLED)
            rows = self._rows("ds-outage", [self.queue], s.rows)
            took = self._timed_batch(query, input_dir, rows)
            sent2, diverted2 = self._datasource_counts()
            self.report.numbers["datasource_outage_batch_s"] = took
            self.say(f'format("servicebus") outage batch: {diverted2 - diverted} diverted in {took:.1f} s')
            self.report.check(
                'format("servicebus"): outage batch diverted',
                f"{diverted2 - diverted} of {len(rows)} diverted in {_seconds(took)}",
                f"all, within {_seconds(s.failover_interval)} + {_seconds(s.slack)}",
                diverted2 - diverted == len(rows) and sent2 == sent and took <= s.failover_interval + s.slack,
            )
            return diverted2 - diverted
        finally:
            try:
                query.stop()
            finally:
                self.set_status([self.queue], ACTIVE)

    def _datasource_counts(self) -> tuple[int, int]:
        """Rows sent and diverted so far by the data source query, from its events table (written before Spark
        commits each micro-batch)."""
        events = self.spark.read.format("delta").load(str(self.workdir / "state-datasource" / "events"))
        rows = events.where(events.event.isin("sent", "diverted")).groupBy("event").sum("count").collect()
        counts = {r["event"]: int(r[1] or 0) for r in rows}
        return counts.get("sent", 0), counts.get("diverted", 0)

    # ------------------------------------------------------------------------------------------- the run
    def run(self) -> Report:
        """The whole scenario; cleans up in a ``finally`` (also on KeyboardInterrupt). Returns the report."""
        try:
            self._run()
        finally:
            self.cleanup()
        return self.report

    def _run(self) -> None:
        s = self.settings
        r = self.report
        fi = s.failover_interval
        self.create_entities()
        sink = ServiceBusSink(self.config)
        with self._stream(sink) as (query, input_dir):
            self.say("streaming query started")
            # 1. healthy
            rows = self._rows("healthy", [self.queue], s.rows) + self._rows(
                "topic", [self.topic], max(1, s.rows // 4)
            )
            took = self._timed_batch(query, input_dir, rows)
            out = sink.last_outcome or SendOutcome()
            self.say(f"healthy batch: {out.total_sent} sent, {out.total_diverted} diverted in {took:.1f} s")
            r.check(
                "healthy: rows to the primary (queue + topic)",
                f"{out.total_sent} of {len(rows)} sent, {out.total_diverted} diverted",
                f"{len(rows)} sent, 0 diverted",
                out.total_sent == len(rows) and out.total_diverted == 0,
            )

            # 2. outage: SendDisabled
            self.set_status([self.queue], SEND_DISABLED)
            rows = self._rows("outage", [self.queue], s.rows)
            took = self._timed_batch(query, input_dir, rows)
            out = sink.last_outcome or SendOutcome()
            outage_diverted = out.total_diverted
            r.numbers["outage_batch_s"] = took
            self.say(f"outage batch: {out.total_sent} sent, {out.total_diverted} diverted in {took:.1f} s")
            r.check(
                "outage (SendDisabled): batch diverted",
                f"{out.total_diverted} of {len(rows)} diverted in {_seconds(took)}",
                f"all, within {_seconds(fi)} + {_seconds(s.slack)}",
                out.total_diverted == len(rows) and took <= fi + s.slack,
            )

            # 3. recovery: Active, the probe, new rows to the primary
            self.set_status([self.queue], ACTIVE)
            healed = self.clock.monotonic()
            # The probe's interval, a failover interval's worth of a worker that has not heard yet, and Spark's
            # own overhead for up to two batches (the slack, twice).
            recovery_bound = 2 * s.ping_interval + fi + 2 * s.slack
            returned_after: float | None = None
            attempt = 0
            recovery_diverted = 0  # a recovery batch before the probe saw the primary back is diverted too
            while returned_after is None and self.clock.monotonic() - healed <= recovery_bound:
                self.clock.sleep(s.ping_interval)  # the probe interval is real time on the executors
                attempt += 1
                rows = self._rows(f"recovered{attempt}", [self.queue], max(1, s.rows // 4))
                self._timed_batch(query, input_dir, rows)
                out = sink.last_outcome or SendOutcome()
                recovery_diverted += out.total_diverted
                if out.total_sent == len(rows):
                    returned_after = self.clock.monotonic() - healed
            self.say(f"recovery: {attempt} batch(es), new rows to the primary: {returned_after is not None}")
            r.numbers["recovery_s"] = returned_after if returned_after is not None else -1.0
            bound = recovery_bound
            r.check(
                "recovery (Active): new rows to the primary",
                "never"
                if returned_after is None
                else f"after {_seconds(returned_after)} ({attempt} batch(es))",
                f"after the probe, within {_seconds(bound)}",
                returned_after is not None and returned_after <= bound,
            )

            # 4. fan-out: N entities disabled at once
            n = len(self.fan_queues)
            rows = self._rows("fanwarm", self.fan_queues, max(n, s.rows))
            took = self._timed_batch(query, input_dir, rows)
            out = sink.last_outcome or SendOutcome()
            r.check(
                f"fan-out healthy: {n} queues",
                f"{out.total_sent} of {len(rows)} sent in {_seconds(took)}",
                f"{len(rows)} sent",
                out.total_sent == len(rows),
            )
            self.set_status(self.fan_queues, SEND_DISABLED)
            rows = self._rows("fanout", self.fan_queues, max(n, s.rows))
            took = self._timed_batch(query, input_dir, rows)
            out = sink.last_outcome or SendOutcome()
            fan_diverted = out.total_diverted
            r.numbers["fanout_outage_batch_s"] = took
            r.numbers["fanout_entities"] = n
            self.say(f"fan-out outage batch: {out.total_diverted} of {len(rows)} diverted in {took:.1f} s")
            r.check(
                f"fan-out outage: {n} queues SendDisabled at once",
                f"{out.total_diverted} of {len(rows)} diverted in {_seconds(took)}",
                f"all, within {_seconds(fi)} + {_seconds(s.slack)} (not {n} x {_seconds(fi)})",
                out.total_diverted == len(rows) and took <= fi + s.slack,
            )
            self.set_status(self.fan_queues, ACTIVE)
            if fi + s.slack >= n * fi:
                r.notes.append(
                    f"the fan-out check cannot tell one failover_interval from {n}: use more queues (--fan-out) "
                    "or a smaller --slack"
                )

        # 5. the same through format("servicebus"), when this tree has it
        ds_diverted = self._datasource_step()

        # 6. the syphon job's query moves every backlog back (one pass or a few, however much there is)
        expected_moved = outage_diverted + recovery_diverted + fan_diverted + ds_diverted
        moved = self._syphon()
        depth = self.backlog_depth()
        r.numbers["syphon_moved"] = moved
        r.check(
            "syphon moved the backlog back",
            f"moved {moved}, backlog left {depth}",
            f">= {expected_moved} moved, 0 left",
            moved >= expected_moved and depth == 0,
        )

        # 7. the books
        self.say("comparing produced ids with the primary entities' contents")
        lost, dups = self._compare(
            'queue, read by format("servicebus") into Delta: ids as sets', [self.queue], source=True
        )
        lost2, dups2 = self._compare("topic subscription: ids as sets", [self.topic], SUBSCRIPTION)
        lost3, dups3 = self._compare(f"fan-out {len(self.fan_queues)} queues: ids as sets", self.fan_queues)
        r.numbers["lost"] = lost + lost2 + lost3
        r.numbers["duplicates"] = dups + dups2 + dups3
        r.numbers["produced"] = sum(len(v) for v in self.produced.values())
        self._delta_checks(outage_diverted + recovery_diverted, fan_diverted)


def run_scenario(
    spark: Any,
    backend: Backend,
    workdir: Path,
    settings: Settings | None = None,
    *,
    say: Callable[[str], None] = print,
    clock: Clock | None = None,
) -> Report:
    """Run the scenario against ``backend`` and return its report (driver)."""
    return Scenario(spark, backend, workdir, settings, say=say, clock=clock).run()
