"""The ``servicebus`` source (SPEC S12; ../shared/SOURCE.md R10-R31): exactly-once reads of a queue or subscription.

* :mod:`~spark_sb.source.transport` - what the protocol needs from a namespace (driver link, executor peeks);
* :mod:`~spark_sb.source.manifest` - the offset: a manifest of exact sequence numbers and the owed set (pure data);
* :mod:`~spark_sb.source.settle` - the settle step: delete a committed manifest's deferred messages (driver);
* :mod:`~spark_sb.source.planner` - the driver's receive, lock keeper, defer and read-ahead (``latestOffset``,
  ``partitions``); :mod:`~spark_sb.source.batch` - its limits and per-batch numbers;
* :mod:`~spark_sb.source.locks` - the driver's held peek-locks, the keeper thread that renews them, the defer thread;
* :mod:`~spark_sb.source.orphans` - a new checkpoint's orphan deferred messages: their count's WARN (driver);
* :mod:`~spark_sb.source.reader` - the executors' peek read of one partition;
* :mod:`~spark_sb.source.options` - the reader's options, checked before anything is received;
* :mod:`~spark_sb.source.rows` - the row schema and a received message as a row;
* :mod:`~spark_sb.source.sdk` - the transport on the azure-servicebus SDK (driver link, executor client cache).

The Spark adapter (the ``DataSourceStreamReader`` and the batch reader) is thin and lives beside the writer in
:mod:`spark_sb.spark`. Runs on the driver (the planner process) and in executors' Python workers, as each
module says. Imports: core, config, message, wire; never Spark, state, sender, syphon or admin.
"""
