"""The paired sender (SPEC B2-B5, B7, B8, B10, F1-F9): send to the primary, divert to the backlog when an
entity is down, probe it and come back.

* :mod:`~spark_sb.sender.paired` - :class:`~spark_sb.sender.paired.PairedSender`, the public face;
* :mod:`~spark_sb.sender.context` - :class:`~spark_sb.sender.context.SendContext`, what the sender's parts share;
* :mod:`~spark_sb.sender.attempts` - the attempt loop that carries out what the failover state decides (and
  the links opened ahead, a refused batch halved);
* :mod:`~spark_sb.sender.diverter` - sending to the backlog queues (rotation, rejects);
* :mod:`~spark_sb.sender.lines` - ordering within a call: held lines, R4's stop;
* :mod:`~spark_sb.sender.notices` - what the sender tells its user: never reached, wrong entity, throttled;
* :mod:`~spark_sb.sender.prober` - probing failed-over entities on the isolated connections;
* :mod:`~spark_sb.sender.ahead` - backlog translations made while the sender waits anyway;
* :mod:`~spark_sb.sender.pool` - the executor's pool of live senders and syphons between tasks.

Runs in any process (executors' Python workers, plain applications); one sender per thread. Imports: core,
config, message, wire, failover; never Spark, state or admin.
"""
