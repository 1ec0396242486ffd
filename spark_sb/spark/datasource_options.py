"""The ``servicebus`` data source's options (driver machine, pure): :func:`parse_options` checks the flat
configuration keys and the source's own (``config_path``, ``job_id``, ``state_spool``) before anything is sent, each
error naming its option; :func:`check_write` checks a write's schema and mode; :func:`spool_location` is where
catalog tables' rows are recorded first; :func:`new_job_id` names a batch write. :class:`SourceOptions` is picklable.
"""

from __future__ import annotations

import importlib.util
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from spark_sb.config.service_bus import ServiceBusConfig
from spark_sb.config.settings import KNOWN_KEYS
from spark_sb.core.errors import ConfigError
from spark_sb.spark.partition import ordering_needs_path_tables, ordering_needs_tables
from spark_sb.spark.schema import validate_schema

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql.types import StructType

#: Options of the data source itself (beside the configuration keys).
SOURCE_OPTIONS = ("config_path", "job_id", "state_spool")
#: Options Spark or a pipeline engine hands a writer beside the user's, as they arrive (Spark's options map is
#: case-insensitive: lower-cased keys). Accepted and ignored; ``checkpointlocation`` only places the default spool.
SPARK_OPTIONS = frozenset(
    {
        # DataStreamWriter.option("checkpointLocation", ...); a pipeline's sink flow (spark-pipelines, pyspark 4.1+)
        # sets it to <storage>/_checkpoints/<sink>/<flow>/<n>
        "checkpointlocation",
        # DataStreamWriter.queryName(...) keeps the name as this option (classic and Spark Connect); a pipeline
        # names the query after its flow
        "queryname",
        # DataStreamWriter.start(path) and DataFrameWriter.save(path)
        "path",
        # Spark's MicroBatchExecution reads these from the writer's options (it refuses 'true' for this sink)
        "asyncprogresstrackingenabled",
        "asyncprogresstrackingcheckpointintervalms",
    }
)
#: Why a batch write refuses ``ordering`` (its held sessions would be recorded under its own sink id).
BATCH_ORDERING = (
    "applies to streams (writeStream) with format('servicebus'): a batch write (df.write) records under a sink "
    "id of its own (<sink_id>/<job_id>), so a later write would not know the sessions it left in the backlog; "
    "use ordering none for batch writes"
)
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,99}")


@dataclass(frozen=True)
class SourceOptions:
    """The checked options: the configuration and the batch write's ``job_id`` (None: one is generated)."""

    config: ServiceBusConfig
    job_id: str | None = None
    #: With ``state_table_prefix``: the path tables the source records into (``state_spool``, else
    #: ``<checkpointLocation>/servicebus_state`` for a stream); :class:`~spark_sb.spark.relay.StateRelay` copies them
    #: into the catalog tables. None: no spool (no catalog tables, or a batch write that gave none).
    state_spool: str | None = None

    @property
    def store_location(self) -> str | None:
        """The path tables this source writes with deltalake: the spool, or ``state_location``."""
        return self.state_spool if self.config.state_table_prefix else self.config.state_location

    def require_store(self, *, streaming: bool) -> None:
        """Catalog tables need a spool (driver machine): raises :class:`ConfigError` naming ``state_spool``."""
        if self.config.state_table_prefix and self.state_spool is None:
            where = (
                "set it (or checkpointLocation)" if streaming else "a batch write has no checkpoint: set it"
            )
            raise option_error(
                [
                    (
                        "state_spool",
                        "required with state_table_prefix: the path where format('servicebus') records its "
                        "state tables with deltalake, for spark_sb.relay_state(spark, options) to copy into the "
                        f"catalog tables (Spark runs a data source's commit without a session); {where}",
                    )
                ]
            )


SPOOL_FOLDER = "servicebus_state"  # the default spool of a stream: <checkpointLocation>/servicebus_state


def spool_location(spool: str | None, checkpoint: str | None) -> str | None:
    """The spool: ``state_spool`` (``spool``), else ``<checkpointLocation>/servicebus_state``, else None. Pure."""
    spool = (spool or "").strip()
    if spool:
        return spool.rstrip("/") or "/"
    checkpoint = (checkpoint or "").strip()
    return f"{checkpoint.rstrip('/')}/{SPOOL_FOLDER}" if checkpoint else None


def option_error(errors: Sequence[tuple[str, str]]) -> ConfigError:
    """One error naming every bad option (``errors``: (option, message) pairs)."""
    return ConfigError(
        "format('servicebus'): " + "; ".join(f"option {k!r}: {m}" for k, m in errors), list(errors)
    )


def _valid_key(key: str) -> bool:
    return key in KNOWN_KEYS or key in SOURCE_OPTIONS or key.split(".", 1)[0].startswith("x-")


def parse_options(
    options: Mapping[str, Any], *, env: Mapping[str, str] | None = None, dbutils: Any = None
) -> SourceOptions:
    """Check the data source's options and build the configuration (pure apart from reading ``config_path``
    and resolving secret references; driver machine). Keys are case-insensitive; Spark's own (:data:`SPARK_OPTIONS`:
    ``checkpointLocation``, ``queryName``, ``path``, ...) are accepted and ignored. Raises :class:`ConfigError`
    naming the option and, where there is a set, the valid values: an unknown key, a value of the wrong type,
    ``state_location`` or ``state_table_prefix`` without ``deltalake``, ``state_spool`` without
    ``state_table_prefix``."""
    lowered: dict[str, str] = {}
    spark_options: dict[str, str] = {}  # Spark's own (SPARK_OPTIONS): only the default spool reads one
    for k, v in options.items():
        key = str(k).strip().lower()
        if key in SPARK_OPTIONS:
            spark_options[key] = str(v)
            continue
        if key in lowered:
            raise option_error([(key, "given twice (option keys are case-insensitive)")])
        lowered[key] = v if isinstance(v, str) else str(v)
    unknown = [k for k in lowered if not _valid_key(k)]
    if unknown:
        import difflib

        valid = sorted({*KNOWN_KEYS, *SOURCE_OPTIONS})
        errors = []
        for key in unknown:  # a near-miss of Spark's own (checkpointLocaton) is suggested too
            match = difflib.get_close_matches(key, [*valid, *sorted(SPARK_OPTIONS)], n=1, cutoff=0.6)
            hint = f" (did you mean {match[0]!r}?)" if match else ""
            errors.append((key, f"unknown option{hint}; valid options: {', '.join(valid)}, x-*"))
        raise option_error(errors)
    config_path = lowered.pop("config_path", None)
    job_id = lowered.pop("job_id", None)
    spool_given = lowered.pop("state_spool", None)
    flat: dict[str, str] = {}
    if config_path is not None:
        if not config_path.strip():
            raise option_error([("config_path", "expected the path of a YAML configuration file, found ''")])
        base = ServiceBusConfig.from_yaml(config_path.strip(), env=env, dbutils=dbutils)
        flat = base.to_options(include_secrets=True)  # references stay references (resolved again below)
    flat.update(lowered)
    try:
        config = ServiceBusConfig.from_options(flat, env=env, dbutils=dbutils)
    except ConfigError as exc:
        raise option_error(exc.errors or [("options", str(exc))]) from None
    # before any row is read: order through failover (issue 31) needs path tables (spark_sb.state.sessions)
    ordering_needs_path_tables(config, "format('servicebus')")
    try:
        ordering_needs_tables(config, "format('servicebus')")
    except ConfigError as exc:
        raise option_error(exc.errors) from None
    if spool_given is not None and not spool_given.strip():
        raise option_error([("state_spool", "expected a path (the spool's Delta tables), found ''")])
    if spool_given is not None and not config.state_table_prefix:
        raise option_error(
            [("state_spool", "applies with state_table_prefix only (state_location is written directly)")]
        )
    for key in ("state_location", "state_table_prefix"):
        if getattr(config, key) and importlib.util.find_spec("deltalake") is None:
            raise option_error(
                [(key, "format('servicebus') writes its state tables with deltalake: pip install deltalake")]
            )
    if job_id is not None and not _JOB_ID.fullmatch(job_id):
        raise option_error(
            [("job_id", f"expected letters, digits, '.', '_', ':' or '-' (at most 100), found {job_id!r}")]
        )
    spool = (
        spool_location(spool_given, spark_options.get("checkpointlocation"))
        if config.state_table_prefix
        else None
    )
    return SourceOptions(config, job_id, spool)


def check_write(config: ServiceBusConfig, schema: StructType, overwrite: bool, *, streaming: bool) -> None:
    """What must hold before a write starts (driver machine): append only, the schema (:class:`SchemaError`
    names the column), an entity for every row (the ``entity`` option or an entity column)."""
    if overwrite:
        if streaming:
            raise option_error([("outputMode", "'complete' is not supported; valid: append, update")])
        raise option_error([("mode", "'overwrite' is not supported; valid: append")])
    validate_schema(schema, config.columns)
    entity_column = config.columns.get("entity", "entity")
    if config.entity is None and entity_column not in schema.fieldNames():
        raise option_error(
            [
                (
                    "entity",
                    f"required: the queue or topic to send to (or a column {entity_column!r} naming one per row, "
                    "see columns.entity)",
                )
            ]
        )


def new_job_id(now: datetime | None = None) -> str:
    """``write-<UTC time>-<8 hex>``: the job id of a batch write that was given none."""
    at = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    return f"write-{at}-{uuid.uuid4().hex[:8]}"
