"""The syphon (SPEC B9, B11, B12): moves backlog messages back to their primary entities.

* :mod:`~spark_sb.syphon.mover` - :class:`~spark_sb.syphon.mover.Syphon`, one drain pass over the backlog queues;
* :mod:`~spark_sb.syphon.sorting`, :mod:`~spark_sb.syphon.peeking`, :mod:`~spark_sb.syphon.forwarding`,
  :mod:`~spark_sb.syphon.probing`, :mod:`~spark_sb.syphon.base` - the syphon's parts (a batch sorted, the queue
  looked at, forwards and settles, the entity gate asked, the state they share);
* :mod:`~spark_sb.syphon.receivers` - the backlog receivers and what a received message becomes;
* :mod:`~spark_sb.syphon.rules` - the pure rules: what to do with each message, when to give up;
* :mod:`~spark_sb.syphon.lines` - the ordered drain: a line (entity, session id) moved in queue order.

Runs in any process (the syphon job's executors, plain applications); one syphon per thread. Imports: core,
config, message, wire, failover; never Spark, state or admin.
"""
