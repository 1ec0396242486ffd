# Databricks notebook source
# MAGIC %md
# MAGIC # spark-servicebus: the syphon (backlog queues back to the primary)
# MAGIC
# MAGIC Runs the syphon as a Structured Streaming query (the package's `run_syphon`): each trigger reads the
# MAGIC backlog queues' message counts (management reads); a micro-batch runs only when there is something to move,
# MAGIC one backlog queue per partition, on the executors. Each row of a micro-batch is a message moved
# MAGIC (`numInputRows` in the query's progress); what it did per entity goes to the `events` state table.
# MAGIC
# MAGIC 1. Put the wheel's path in the `wheel` widget (a workspace folder or a Unity Catalog volume); the next cells
# MAGIC    install it for this notebook and restart Python.
# MAGIC 2. Keep the connection strings in a secret scope (`scope` widget; keys `primary-connection-string`,
# MAGIC    `secondary-connection-string`). They are referenced, never written here, and never logged.
# MAGIC 3. Pick how it runs in the `run` widget. `available now` (the default; the trigger serverless compute
# MAGIC    accepts, `Trigger.AvailableNow`): the query drains what the backlog queues hold, stops by itself, and the
# MAGIC    notebook ends, so a scheduled job runs it again later. `continuous` (classic compute): a micro-batch every
# MAGIC    `trigger`, until you stop it with the last cell (it lets the running micro-batch finish).
# MAGIC 4. Run the cells.

# COMMAND ----------

dbutils.widgets.text("wheel", "/Volumes/main/default/libs/spark_servicebus-0.1.0-py3-none-any.whl")  # noqa: F821
dbutils.widgets.text("scope", "servicebus")  # noqa: F821
dbutils.widgets.text("state_location", "/Volumes/main/ops/servicebus/state")  # noqa: F821
dbutils.widgets.text("checkpoint", "/Volumes/main/ops/servicebus/checkpoints/syphon")  # noqa: F821
dbutils.widgets.dropdown("run", "available now", ["available now", "continuous"])  # noqa: F821
dbutils.widgets.text("trigger", "30 seconds")  # noqa: F821 - continuous only
dbutils.widgets.text("backlog_queue_count", "10")  # noqa: F821
wheel = dbutils.widgets.get("wheel")  # noqa: F821

# COMMAND ----------

# MAGIC %pip install $wheel

# COMMAND ----------

dbutils.library.restartPython()  # noqa: F821 - the installed package becomes importable

# COMMAND ----------

import tempfile  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402

from spark_sb import load_config  # noqa: E402
from spark_sb.spark.syphon_job import run_syphon, stop_gracefully  # noqa: E402

scope = dbutils.widgets.get("scope")  # noqa: F821
config = load_config(
    {
        "primary": {"connection_string": "{{secrets/" + scope + "/primary-connection-string}}"},
        "secondary": {"connection_string": "{{secrets/" + scope + "/secondary-connection-string}}"},
        "backlog_queue_count": int(dbutils.widgets.get("backlog_queue_count")),  # noqa: F821
        "state_location": dbutils.widgets.get("state_location"),  # noqa: F821
        "syphon": {"batch_duration": "60s", "batch_size": 100, "prefetch": 0},
    }
)
print(config)  # secrets show as Secret('***')

# COMMAND ----------

# MAGIC %md Start the query. Each micro-batch drains the backlog queues that hold messages, at most
# MAGIC `syphon.batch_duration` each, and moves messages only to entities that are healthy or answer a probe.

# COMMAND ----------

available_now = dbutils.widgets.get("run") == "available now"  # noqa: F821
stop_file = str(Path(tempfile.gettempdir()) / f"spark-sb-syphon-{uuid.uuid4().hex}.stop")
query = run_syphon(
    spark,  # noqa: F821
    config,
    checkpoint=dbutils.widgets.get("checkpoint"),  # noqa: F821
    trigger=dbutils.widgets.get("trigger"),  # noqa: F821
    available_now=available_now,
    stop_file=stop_file,
)
print(f"syphon query {query.id} started")
if available_now:
    query.awaitTermination()  # it stops by itself once what the backlog held is drained
    print("syphon query finished: the backlog it found is drained")

# COMMAND ----------

# MAGIC %md Progress: the rows of the last micro-batches are the messages moved.

# COMMAND ----------

for progress in query.recentProgress[-10:]:
    print(progress.batchId, progress.timestamp, "messages moved:", progress.numInputRows)

# COMMAND ----------

# MAGIC %md Stop cleanly (`continuous`; an `available now` query has stopped already): the running micro-batch
# MAGIC finishes (what it holds is completed or abandoned), then the query stops.

# COMMAND ----------

stop_gracefully(query, stop_file, timeout=300)
