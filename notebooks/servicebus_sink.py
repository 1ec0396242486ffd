# Databricks notebook source
# MAGIC %md
# MAGIC # spark-servicebus: stream a table to Azure Service Bus with paired-namespace failover
# MAGIC
# MAGIC 1. Build the wheel (`make wheel` gives `dist/spark_servicebus-<version>-py3-none-any.whl`) and copy it to a
# MAGIC    workspace folder (`/Workspace/Users/<you>/libs/...`) or a Unity Catalog volume (`/Volumes/<catalog>/<schema>/<volume>/...`).
# MAGIC 2. Put its path in the `wheel` widget; the next cells install it for this notebook and restart Python.
# MAGIC 3. Store the two connection strings in a secret scope (`servicebus`: `primary-connection-string`,
# MAGIC    `secondary-connection-string`), then run the cells.
# MAGIC
# MAGIC Secrets are referenced (`{{secrets/<scope>/<key>}}`), never written here, and never logged.

# COMMAND ----------

dbutils.widgets.text("wheel", "/Volumes/main/default/libs/spark_servicebus-0.1.0-py3-none-any.whl")  # noqa: F821
dbutils.widgets.text("source_table", "main.sales.orders_outbox")  # noqa: F821
dbutils.widgets.text("entity", "orders")  # noqa: F821
dbutils.widgets.text("checkpoint", "/Volumes/main/sales/checkpoints/servicebus-orders")  # noqa: F821
wheel = dbutils.widgets.get("wheel")  # noqa: F821

# COMMAND ----------

# MAGIC %pip install $wheel

# COMMAND ----------

dbutils.library.restartPython()  # noqa: F821 - the installed package becomes importable

# COMMAND ----------

from spark_sb import ServiceBusSink, load_config  # noqa: E402
from spark_sb.admin.provisioning import provision_backlog_queues  # noqa: E402

config = load_config(
    {
        "primary": {"connection_string": "{{secrets/servicebus/primary-connection-string}}"},
        "secondary": {"connection_string": "{{secrets/servicebus/secondary-connection-string}}"},
        "entity": dbutils.widgets.get("entity"),  # noqa: F821
        "failover_interval": "60s",
        "ping_primary_interval": "60s",
    }
)
print(config)  # secrets show as Secret('***')

# COMMAND ----------

# MAGIC %md Make sure the backlog queues exist in the secondary namespace (needs the Manage right; idempotent).

# COMMAND ----------

report = provision_backlog_queues(config)
print(report.format_table())

# COMMAND ----------

# MAGIC %md Stream the table: one Service Bus message per row (`body` column; optional `message_id`, `session_id`,
# MAGIC `properties`, ... see the README). `ServiceBusSink` holds only the configuration; clients are built on the
# MAGIC executors.

# COMMAND ----------

sb_sink = ServiceBusSink(config)
query = (
    spark.readStream.table(dbutils.widgets.get("source_table"))  # noqa: F821
    .selectExpr("to_json(struct(*)) AS body", "CAST(order_id AS STRING) AS message_id")
    .writeStream.foreachBatch(sb_sink)
    .option("checkpointLocation", dbutils.widgets.get("checkpoint"))  # noqa: F821
    .start()
)

# COMMAND ----------

# MAGIC %md To stop the stream, run `stop()`: it stops the query, then `sb_sink.flush()` writes what the sink still
# MAGIC holds for the state tables (with `state_writes: async`, the default, a background thread on the driver
# MAGIC writes them after each batch) and raises if a write failed. Do this before detaching or stopping the cluster.
# MAGIC On standard (shared) access mode and serverless (Spark Connect) the writes are synchronous and `flush()` has
# MAGIC nothing to do.

# COMMAND ----------


def stop() -> None:
    """Stop the stream, then write the sink's pending state-table rows (driver)."""
    query.stop()
    sb_sink.flush()
