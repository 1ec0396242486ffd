# Databricks notebook source
# MAGIC %md
# MAGIC # spark-servicebus: failover dashboard
# MAGIC
# MAGIC Reads the Delta state tables the sink and the syphon write and charts: the timeline of entity states, sent
# MAGIC vs diverted per micro-batch, the backlog depth over time, and rejects by reason. On Databricks the charts
# MAGIC are `display()` charts (pick the chart type under each result); run locally, matplotlib draws them when it
# MAGIC is installed, else the tables are printed.
# MAGIC
# MAGIC Give `state_location` (Delta path tables) or `state_table_prefix` (Unity Catalog tables, e.g. `main.ops.sb_`).

# COMMAND ----------

dbutils.widgets.text("wheel", "/Volumes/main/default/libs/spark_servicebus-0.1.0-py3-none-any.whl")  # noqa: F821
dbutils.widgets.text("state_location", "/Volumes/main/ops/servicebus/state")  # noqa: F821
dbutils.widgets.text("state_table_prefix", "")  # noqa: F821
dbutils.widgets.text("bucket", "1 minute")  # noqa: F821
wheel = dbutils.widgets.get("wheel")  # noqa: F821

# COMMAND ----------

# MAGIC %pip install $wheel

# COMMAND ----------

dbutils.library.restartPython()  # noqa: F821 - the installed package becomes importable

# COMMAND ----------

from spark_sb.admin.dashboard import prepare  # noqa: E402
from spark_sb.state.delta import StateTables  # noqa: E402

prefix = dbutils.widgets.get("state_table_prefix").strip()  # noqa: F821
tables = (
    StateTables(prefix=prefix) if prefix else StateTables(location=dbutils.widgets.get("state_location"))  # noqa: F821
)
charts = prepare(spark, tables, bucket=dbutils.widgets.get("bucket"))  # noqa: F821


def show(name, x, ys):
    """display() on Databricks; matplotlib when installed; else the table as text."""
    df = charts[name]
    try:
        display(df)  # noqa: F821 - Databricks
        return
    except NameError:
        pass
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        df.show(50, truncate=False)
        return
    pdf = df.toPandas()
    ax = pdf.plot(x=x, y=ys, title=name, drawstyle="steps-post" if name == "timeline" else None)
    ax.figure.autofmt_xdate()
    plt.show()


# COMMAND ----------

# MAGIC %md ## Entity states over time (healthy 0, failing 1, failed over 2)

# COMMAND ----------

show("timeline", "time", ["level"])

# COMMAND ----------

# MAGIC %md ## Sent to the primary vs diverted to the backlog, per micro-batch

# COMMAND ----------

show("sent_vs_diverted", "batch_id", ["sent", "diverted"])

# COMMAND ----------

# MAGIC %md ## Backlog depth over time (diverted in; moved, expired, dead-lettered out)

# COMMAND ----------

show("backlog_depth", "time", ["depth"])

# COMMAND ----------

# MAGIC %md ## Rejects by reason

# COMMAND ----------

show("rejects_by_reason", "reason", ["rejected"])


# COMMAND ----------

# MAGIC %md ## Sessions held behind their backlog, returned, still draining (`ordering`; empty without it)

# COMMAND ----------

show("sessions", "time", ["draining"])
