"""The message model and its encodings (SPEC B6-B8, S2, S5, S6), the per-message hot path.

* :mod:`~spark_sb.message.outbound` - :class:`~spark_sb.message.outbound.OutboundMessage`, rejects, message ids;
* :mod:`~spark_sb.message.rows` - a Spark row (as a mapping) to a message, and the checks of rows and schemas;
* :mod:`~spark_sb.message.backlog` - backlog queue names, the probe messages, the reversible backlog form;
* :mod:`~spark_sb.message.wire_size` - a message's size on the wire, computed arithmetically;
* :mod:`~spark_sb.message.packing` - adding a message to the SDK's batch with one AMQP encoding.

Runs anywhere, mostly on executors' Python workers; pure (no I/O) and picklable. Imports: core and the SDK's
message types; never Spark.
"""
