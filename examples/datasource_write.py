# examples/datasource_write.py: format("servicebus"), a table pushed once and a stream, then the sink's counts
from spark_sb import ServiceBusSink, load_config, register
from spark_sb.spark.session import build_spark_session

# local[2] with Delta Lake (the state tables are Delta tables); on Databricks use the notebook's `spark`
spark = build_spark_session("orders-datasource")
register(spark)  # once per session: format("servicebus"); classic Spark or Spark Connect
opts = {
    "primary.connection_string": "${env:SB_PRIMARY_CONNECTION_STRING}",  # secrets by reference, as in YAML
    "primary.namespace_name": "primary",  # a local namespace's name (else asked of its admin endpoint)
    "secondary.connection_string": "${env:SB_SECONDARY_CONNECTION_STRING}",
    "entity": "orders",
    "state_location": "/tmp/spark-sb-example/sb_state",  # or "config_path": "conf/local.yaml" (options win)
}
rows = [("order 1", "order-1"), ("order 2", "order-2")]
orders = spark.createDataFrame(rows, "body STRING, message_id STRING")
orders.write.format("servicebus").options(**opts).mode("append").save()  # a batch write: a table pushed once

# a folder of JSON files, read as a stream
orders.write.mode("overwrite").json("/tmp/spark-sb-example/ds-input")
query = (
    spark.readStream.schema("body STRING, message_id STRING")
    .json("/tmp/spark-sb-example/ds-input")
    .writeStream.format("servicebus")
    .options(**opts)
    .option("checkpointLocation", "/tmp/spark-sb-example/chk/ds")
    .trigger(availableNow=True)
    .start()
)
query.awaitTermination()
# the counts are in the state tables: "sink primary/orders: ... batches, ... rows: ... sent, 0 diverted, 0 rejected"
print(ServiceBusSink(load_config(opts)).summary(spark))
