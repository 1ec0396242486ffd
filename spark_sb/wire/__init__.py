"""Talking to a namespace: AMQP over one shared connection per namespace, and the admin (HTTPS) endpoint.

* :mod:`~spark_sb.wire.lane` - one thread that owns a namespace's connection; every call has a deadline;
* :mod:`~spark_sb.wire.connection` - opening (TCP, TLS, SASL, open: each with a deadline), reading in slices,
  aborting a silent connection;
* :mod:`~spark_sb.wire.transport` - sending batches to entities, the transport a paired sender uses;
* :mod:`~spark_sb.wire.parking` - parked sends: a send unanswered on a connection that answers is set aside;
* :mod:`~spark_sb.wire.probe` - one probe of a target (ping or schedule-cancel), with its verdict;
* :mod:`~spark_sb.wire.receivers` - receivers on the shared connection (the syphon's);
* :mod:`~spark_sb.wire.admin_api` - admin calls and their errors: the primary's namespace name.

Runs where messages are sent or received: executors' Python workers, the syphon, plain processes. Live objects
here are never pickled. Imports: core, config, message.
"""
