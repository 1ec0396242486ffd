"""Failover state, event log and rejects (SPEC S4-S6), one module per job:

* :mod:`~spark_sb.state.records` - event names, table schemas and the records;
* :mod:`~spark_sb.state.planning` - one batch's writes planned (pure);
* :mod:`~spark_sb.state.store` - the store interface and the in-memory store;
* :mod:`~spark_sb.state.sessions` - the held sessions of a sink with ordering on (the ``sessions`` table);
* :mod:`~spark_sb.state.writer` - group commit on a background thread, the driver's view between commits;
* :mod:`~spark_sb.state.delta` - the Delta Lake store through Spark;
* :mod:`~spark_sb.state.deltars` - the same tables through delta-rs, where there is no Spark session;
* :mod:`~spark_sb.state.maintenance` - keeping the tables small.

Where it runs: the driver. Each name is imported from the module that defines it; the one that the README
documents stays here too: :func:`maintain` (``spark_sb.state.maintain(spark, ...)``). Imports: core, message, failover (records and the
ordering rule; outcome and the registry for type hints only).
"""

from spark_sb.state.maintenance import maintain

__all__ = ["maintain"]
