# examples/orders_to_servicebus.py: stream JSON files to Service Bus, one message per row
import sys

from pyspark.sql import SparkSession

from spark_sb import ServiceBusSink, load_config

config_path, source_dir, checkpoint_dir = sys.argv[1:4]
spark = SparkSession.builder.appName("orders-to-servicebus").getOrCreate()
spark.sparkContext.setLogLevel("WARN")  # Spark's INFO lines off: what the sink says can be read
sink = ServiceBusSink(load_config(config_path))
query = (
    spark.readStream.schema("body STRING, message_id STRING")
    .json(source_dir)
    .writeStream.foreachBatch(sink)
    .option("checkpointLocation", checkpoint_dir)
    .trigger(availableNow=True)
    .start()
)
query.awaitTermination()
sink.flush()  # the state tables' last writes
print(sink.summary())  # e.g. "sink ...: 1 batches, 3 rows: 3 sent, 0 diverted, 0 rejected"
