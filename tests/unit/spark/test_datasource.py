"""The ``servicebus`` data source's options and driver-side decisions, without Spark: option parsing (flat keys,
``config_path``, errors naming the option and the valid values), the write checks (mode, schema, entity), the
replay decision of the tasks and the commit's recording (on a deltalake store in a temporary folder)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from spark_sb.config.settings import KNOWN_KEYS
from spark_sb.core.errors import ConfigError
from spark_sb.failover.outcome import SendOutcome
from spark_sb.spark import datasource
from spark_sb.spark.datasource import TaskReport, WritePlan, commit_write
from spark_sb.spark.datasource_options import (
    SOURCE_OPTIONS,
    SPARK_OPTIONS,
    check_write,
    new_job_id,
    parse_options,
)
from spark_sb.spark.schema import SchemaError
from spark_sb.spark.sink import SinkIdConflictError
from spark_sb.state.records import BATCH_COMMITTED, REPLAY_SKIPPED, PartitionResult

PRIMARY = "Endpoint=sb://primary.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=p-secret"
SECONDARY = "Endpoint=sb://secondary.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=s-secret"


def _opts(**extra: str) -> dict[str, str]:
    return {"primary.connection_string": PRIMARY, "secondary.connection_string": SECONDARY, **extra}


def _schema(ddl: str) -> Any:
    """``"a STRING, b STRING"`` as a StructType of strings (no session needed)."""
    from pyspark.sql.types import StringType, StructField, StructType

    return StructType([StructField(part.split()[0], StringType()) for part in ddl.split(", ")])


def test_flat_options_build_the_configuration_keys_case_insensitive() -> None:
    parsed = parse_options(
        _opts(
            Entity="orders",
            failover_interval="5s",
            **{"retry.backoff_max": "2", "checkpointLocation": "/ckpt"},
        )
    )
    config = parsed.config
    assert (config.entity, config.failover_interval, config.retry.backoff_max) == ("orders", 5.0, 2.0)
    assert config.secondary is not None and parsed.job_id is None


def test_an_unknown_option_is_named_with_a_suggestion_and_the_valid_options() -> None:
    with pytest.raises(ConfigError) as err:
        parse_options(_opts(entity="orders", failover_intervall="5s"))
    text = str(err.value)
    assert "option 'failover_intervall': unknown option (did you mean 'failover_interval'?)" in text
    assert "valid options: " in text and "config_path" in text and "state_location" in text
    assert err.value.errors[0][0] == "failover_intervall"


# What Spark 4.2 handed a Python data source's writer in a real run (keys as they arrived, lower-cased by pyspark's
# CaseInsensitiveDict): a pipeline's create_sink flow under spark-pipelines, and writeStream/write with a path.
PIPELINE_SINK = {
    "queryname": "to_orders",
    "checkpointlocation": "file:/tmp/pipe/storage/_checkpoints/orders_out/to_orders/0",
}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("checkpointLocation", "/ckpt"),
        ("CHECKPOINTLOCATION", "/ckpt"),
        ("queryName", "orders_out"),
        ("queryname", "orders_out"),
        ("QueryName", "orders_out"),
        ("path", "some/path"),
        ("Path", "some/path"),
        ("asyncProgressTrackingEnabled", "false"),
        ("asyncprogresstrackingcheckpointintervalms", "1000"),
    ],
)
def test_an_option_spark_hands_the_writer_is_accepted_and_ignored_in_any_case(key: str, value: str) -> None:
    parsed = parse_options(_opts(entity="orders", **{key: value}))
    assert parsed == parse_options(_opts(entity="orders"))  # ignored: the same configuration, job id, spool


def test_a_pipeline_sinks_options_build_the_sink_and_place_the_spool_in_its_checkpoint() -> None:
    from pyspark.sql.datasource import CaseInsensitiveDict  # what Spark builds the data source with

    source_class = datasource.__getattr__("ServiceBusDataSource")
    given = _opts(Entity="orders", state_table_prefix="main.sb.sb_")  # create_sink(..., options=given)
    options = CaseInsensitiveDict({**given, **PIPELINE_SINK})
    settings = source_class(options).settings
    assert settings.config.entity == "orders"
    assert settings.state_spool == f"{PIPELINE_SINK['checkpointlocation']}/servicebus_state"


def test_spark_options_are_kept_as_they_arrive_lower_cased() -> None:
    assert {"checkpointlocation", "queryname", "path"} <= SPARK_OPTIONS
    assert all(key == key.lower() for key in SPARK_OPTIONS)  # a capital letter would never match
    assert not SPARK_OPTIONS & {*KNOWN_KEYS, *SOURCE_OPTIONS}  # none of ours is ignored


@pytest.mark.parametrize(
    ("key", "suggested"),
    [("entityy", "entity"), ("failover_intervall", "failover_interval"), ("queryNme", "queryname")],
)
def test_a_typo_beside_sparks_options_is_still_refused_naming_it(key: str, suggested: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_options({**_opts(entity="orders", **{key: "x"}), **PIPELINE_SINK})
    assert [k for k, _ in err.value.errors] == [key.lower()]
    assert f"option {key.lower()!r}: unknown option (did you mean {suggested!r}?)" in str(err.value)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("failover_interval", "soon", "option 'failover_interval'"),
        ("backlog_queue_count", "many", "option 'backlog_queue_count'"),
        ("on_reject", "drop", "option 'on_reject': 'drop' is not one of 'record', 'fail'"),
        ("state_writes", "later", "option 'state_writes'.*'async', 'sync'"),
        ("client_cache", "perhaps", "option 'client_cache'"),
    ],
)
def test_a_value_of_the_wrong_type_names_the_option(key: str, value: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        parse_options(_opts(entity="orders", **{key: value}))


def test_no_primary_is_refused() -> None:
    with pytest.raises(ConfigError, match="option 'primary': required"):
        parse_options({"entity": "orders"})


def test_config_path_is_loaded_and_options_override_it(tmp_path: Path) -> None:
    path = tmp_path / "sb.yaml"
    path.write_text(
        "primary:\n  connection_string: ${env:SB_PRIMARY}\nentity: orders\nfailover_interval: 30s\n"
        "secondary:\n  connection_string: " + SECONDARY + "\n"
    )
    parsed = parse_options({"config_path": str(path), "entity": "payments"}, env={"SB_PRIMARY": PRIMARY})
    config = parsed.config
    assert (config.entity, config.failover_interval) == ("payments", 30.0)
    assert config.primary.connection_string is not None
    assert config.primary.connection_string.reveal() == PRIMARY
    assert config.primary.connection_string.reference == "${env:SB_PRIMARY}"
    assert "p-secret" not in repr(config)


def test_a_missing_config_path_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file .*nowhere.yaml"):
        parse_options({"config_path": str(tmp_path / "nowhere.yaml")})


def test_catalog_state_tables_record_into_a_spool_beside_the_checkpoint_or_where_state_spool_says() -> None:
    prefix = {"entity": "orders", "state_table_prefix": "main.sb.sb_"}
    streamed = parse_options(_opts(**prefix, checkpointLocation="/ckpt/q1/"))
    assert streamed.state_spool == "/ckpt/q1/servicebus_state"
    assert streamed.store_location == "/ckpt/q1/servicebus_state"
    streamed.require_store(streaming=True)
    given = parse_options(_opts(**prefix, STATE_SPOOL="/vol/spool", checkpointLocation="/ckpt/q1"))
    assert given.store_location == "/vol/spool"  # state_spool wins over the checkpoint's default
    paths = parse_options(_opts(entity="orders", state_location="/data/state", checkpointLocation="/ckpt"))
    assert (paths.state_spool, paths.store_location) == (None, "/data/state")  # path tables: written directly


def test_a_databricks_secret_reference_without_dbutils_names_the_option_and_the_way_that_works(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "15.4")  # Databricks, but a process with no dbutils
    with pytest.raises(ConfigError, match="secondary.connection_string") as refused:
        parse_options(_opts(entity="orders", **{"secondary.connection_string": "{{secrets/sb/secondary}}"}))
    message = str(refused.value)
    assert "SB_NAME={{secrets/sb/secondary}}" in message and "${env:SB_NAME}" in message
    assert "foreachBatch(ServiceBusSink(config))" in message
    monkeypatch.setenv("SB_NAME", SECONDARY)  # what the cluster's environment variable gives
    parsed = parse_options(_opts(entity="orders", **{"secondary.connection_string": "${env:SB_NAME}"}))
    assert parsed.config.secondary.connection_string is not None
    assert parsed.config.secondary.connection_string.reveal() == SECONDARY


def test_a_spool_is_required_with_catalog_tables_and_only_with_them() -> None:
    batch = parse_options(_opts(entity="orders", state_table_prefix="main.sb.sb_"))  # no checkpoint
    with pytest.raises(
        ConfigError, match="option 'state_spool': required with state_table_prefix.*batch write"
    ):
        batch.require_store(streaming=False)
    with pytest.raises(ConfigError, match="option 'state_spool': required .*or checkpointLocation"):
        batch.require_store(streaming=True)
    with pytest.raises(ConfigError, match="option 'state_spool': applies with state_table_prefix only"):
        parse_options(_opts(entity="orders", state_location="/data/state", state_spool="/vol/spool"))
    with pytest.raises(ConfigError, match="option 'state_spool': expected a path"):
        parse_options(_opts(entity="orders", state_table_prefix="main.sb.sb_", state_spool=" "))


@pytest.mark.parametrize(
    ("options", "line"),
    [
        (
            {"secondary.connection_string": PRIMARY.replace("sb://primary", "SB://Primary")},
            "option 'secondary.connection_string': names the same namespace as primary.connection_string "
            "(primary.servicebus.windows.net:5671)",
        ),
        (
            {"retry.backoff_factor": "5", "retry.backoff_max": "1"},
            "option 'retry.backoff_max': 1 is below retry.backoff_factor 5 (the first pause)",
        ),
        (
            {"state_location": "/data/state", "state_table_prefix": "main.sb.sb_"},
            "option 'state_table_prefix': give state_location (paths) or state_table_prefix, not both",
        ),
        (
            {"primary.use_development_emulator": "true"},
            "option 'primary.use_development_emulator': applies to fully_qualified_namespace + credential",
        ),
        (
            {"secondary.connection_string": SECONDARY + ";EntityPath=orders"},
            "option 'secondary.connection_string': has EntityPath=orders",
        ),
    ],
    ids=["same-namespace", "back-off", "state-tables", "emulator-flag", "entity-path"],
)
def test_options_that_cannot_work_together_are_refused_before_any_write(
    options: dict[str, str], line: str
) -> None:
    """Issue 32 item 2: checked when Spark builds the source on the driver (``parse_options``), before any row is
    read; one line, naming the option and the key it conflicts with."""
    with pytest.raises(ConfigError) as refused:
        parse_options(_opts(entity="orders", **options))
    text = str(refused.value)
    assert text.startswith("format('servicebus'): ") and line in text, text
    assert len(text.splitlines()) == 1 and "secret" not in text


def test_a_conflict_between_config_path_and_an_option_names_the_option(tmp_path: Path) -> None:
    path = tmp_path / "sb.yaml"
    path.write_text(
        f"primary: {{connection_string: '{PRIMARY}'}}\nentity: orders\nstate_location: /data/state\n"
    )
    with pytest.raises(ConfigError, match="option 'state_table_prefix': give state_location .* not both"):
        parse_options({"config_path": str(path), "state_table_prefix": "main.sb.sb_"})


def test_job_id_is_checked_and_generated_ids_are_distinct() -> None:
    assert parse_options(_opts(entity="orders", job_id="backfill-2026.11")).job_id == "backfill-2026.11"
    with pytest.raises(ConfigError, match="option 'job_id': expected letters"):
        parse_options(_opts(entity="orders", job_id="a b"))
    at = datetime(2026, 11, 23, 22, 0, tzinfo=timezone.utc)
    first, second = new_job_id(at), new_job_id(at)
    assert first.startswith("write-20261123T220000Z-") and first != second


def test_write_checks_mode_schema_and_entity() -> None:
    config = parse_options(_opts()).config  # no entity option
    schema = _schema("body STRING, message_id STRING")
    with pytest.raises(ConfigError, match="option 'mode': 'overwrite' is not supported; valid: append"):
        check_write(config, schema, True, streaming=False)
    with pytest.raises(
        ConfigError, match="option 'outputMode': 'complete' is not supported; valid: append, update"
    ):
        check_write(config, schema, True, streaming=True)
    with pytest.raises(ConfigError, match="option 'entity': required"):
        check_write(config, schema, False, streaming=True)
    check_write(config, _schema("body STRING, entity STRING"), False, streaming=True)  # an entity per row
    with pytest.raises(SchemaError, match="body"):
        check_write(
            parse_options(_opts(entity="orders")).config, _schema("payload STRING"), False, streaming=True
        )


def test_tasks_skip_only_batches_committed_before_the_write_started() -> None:
    config = parse_options(_opts(entity="orders")).config
    assert not WritePlan(config, "s").replayed(0)  # nothing committed
    plan = WritePlan(config, "s", last_committed=4)
    assert plan.replayed(4) and plan.replayed(3) and not plan.replayed(5)
    assert not plan.replayed(None)


def _sent(rows: int) -> TaskReport:
    return TaskReport(7, rows, PartitionResult("h1", rows, SendOutcome(sent={"orders": rows})))


def test_commit_records_the_batch_and_a_replay_is_recorded_as_skipped(tmp_path: Path) -> None:
    pytest.importorskip("deltalake")
    from spark_sb.state.deltars import DeltaRsStateStore

    state = tmp_path / "state"
    config = parse_options(_opts(entity="orders", sink_id="s", state_location=str(state))).config
    outcome = commit_write(WritePlan(config, "s", str(state)), 7, [_sent(3), _sent(2)])
    assert outcome is not None and outcome.total_sent == 5
    store = DeltaRsStateStore(str(state))
    assert [(e.batch_id, e.count) for e in store.read_events("s") if e.event == BATCH_COMMITTED] == [(7, 5)]

    replay = [TaskReport(7, 3, None), TaskReport(7, 2, None)]  # every task found batch 7 committed
    assert commit_write(WritePlan(config, "s", str(state), last_committed=7), 7, replay) is None
    assert [(e.batch_id, e.count) for e in store.read_events("s") if e.event == REPLAY_SKIPPED] == [(7, 5)]

    with pytest.raises(SinkIdConflictError, match="with 5 rows, and now arrives with 4"):
        commit_write(WritePlan(config, "s", str(state), last_committed=7), 7, [TaskReport(7, 4, None)])


def test_rows_of_spark_40s_stream_writer_become_the_dicts_the_arrow_path_gives() -> None:
    from pyspark.sql import Row

    from spark_sb.message.rows import row_to_message
    from spark_sb.spark.datasource import _row_batches
    from spark_sb.spark.partition import arrow_rows

    rows = list(arrow_rows(_row_batches(iter([Row(body="x", message_id="m1", properties={"k": "v"})]))))
    assert rows == [{"body": "x", "message_id": "m1", "properties": {"k": "v"}}]
    config = parse_options(_opts(entity="orders")).config
    message = row_to_message(rows[0], config.columns, "orders", config.max_message_size, "column")
    assert (message.message_id, dict(message.properties)) == ("m1", {"k": "v"})
