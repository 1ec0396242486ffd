"""Talking to a namespace: AMQP over one shared connection per namespace, and the admin (HTTPS) endpoint.

* :mod:`~spark_sb.wire.transport` - the interface the sender and the syphon use (targets, batches, calls);
* :mod:`~spark_sb.wire.sdk_transport` - that interface over the SDK: a lane and a shared connection per namespace;
* :mod:`~spark_sb.wire.lane` - one thread that owns a namespace's connection; every call has a deadline (the
  process's :mod:`~spark_sb.wire.watchdog` fires the deadlines of direct calls);
* :mod:`~spark_sb.wire.connection` - the shared connection: a link per entity, each call made on its link;
* :mod:`~spark_sb.wire.opening` - opening a connection (TCP, TLS, SASL, open: each with a deadline);
* :mod:`~spark_sb.wire.liveness` - tending a connection between calls, pinging it while a call waits;
* :mod:`~spark_sb.wire.closing` - closing connections and sockets without blocking or leaking;
* :mod:`~spark_sb.wire.pyamqp_state` - the SDK's private state, read in this one module;
* :mod:`~spark_sb.wire.timing` - every timing constant of the wire;
* :mod:`~spark_sb.wire.parking` - parked sends: a send unanswered on a connection that answers is set aside;
* :mod:`~spark_sb.wire.probe` - one probe of a target (ping or schedule-cancel), with its verdict;
* :mod:`~spark_sb.wire.receivers` - receivers on the shared connection (the syphon's);
* :mod:`~spark_sb.wire.admin_api` - admin calls and their errors: the primary's namespace name;
* :mod:`~spark_sb.wire.duplicate_detection` - a primary entity's duplicate detection (the exactly-once horizon).

Runs where messages are sent or received: executors' Python workers, the syphon, plain processes. Live objects
here are never pickled. Imports: core, config, message.
"""
