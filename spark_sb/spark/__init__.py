"""Spark: the ``foreachBatch`` sink, the ``servicebus`` data source, the syphon job, sessions (SPEC S1-S10).

* :mod:`~spark_sb.spark.sink` - :class:`~spark_sb.spark.sink.ServiceBusSink` (driver); its counts
  :mod:`~spark_sb.spark.totals`;
* :mod:`~spark_sb.spark.partition` - the function each partition task runs (executors);
* :mod:`~spark_sb.spark.hooks` - the driver's exit and query hooks that flush what sinks hold;
* :mod:`~spark_sb.spark.datasource` - ``format("servicebus")`` (driver; writers on executors); its options
  :mod:`~spark_sb.spark.datasource_options`;
* :mod:`~spark_sb.spark.relay` - the data source's spool into catalog state tables (driver);
* :mod:`~spark_sb.spark.syphon_job` - the syphon as a Structured Streaming job;
* :mod:`~spark_sb.spark.syphon_planner`, :mod:`~spark_sb.spark.syphon_drain`, :mod:`~spark_sb.spark.syphon_ledger`,
  :mod:`~spark_sb.spark.syphon_lease` - its steps: planning (driver), draining (executors), recording and the
  ordered run's lease (driver);
* :mod:`~spark_sb.spark.schema` - the DataFrame's schema checked before any row is read (driver);
* :mod:`~spark_sb.spark.session` - a SparkSession with Delta Lake (driver).

DataFrame operations only (Spark Connect). Imports: every wing below it (core, config, message, wire, failover,
sender, syphon, state); never admin.
"""
