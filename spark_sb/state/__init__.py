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
documents stays here too: :func:`maintain` (``spark_sb.state.maintain(spark, ...)``). ``spark_sb.state.StateTables``,
which notebooks written before 0.1.x imported, still resolves for one release with a ``DeprecationWarning``
naming its address (``spark_sb.state.delta``). Imports: core, message, failover (records and the
ordering rule; outcome and the registry for type hints only).
"""

import warnings
from typing import Any

from spark_sb.state.maintenance import maintain

#: Old addresses of names that moved, kept for one release: name -> the module that defines it.
MOVED_NAMES = {"StateTables": "spark_sb.state.delta"}


def __getattr__(name: str) -> Any:
    """``spark_sb.state.StateTables`` (a notebook's old import): the name from its module, with a warning."""
    if name in MOVED_NAMES:
        from importlib import import_module

        where = MOVED_NAMES[name]
        warnings.warn(
            f"spark_sb.state.{name} moved to {where}.{name}; the old path goes in 0.2",
            DeprecationWarning,
            stacklevel=2,
        )
        value = getattr(import_module(where), name)
        globals()[name] = value  # warned once: ``from ... import`` looks the name up twice
        return value
    raise AttributeError(f"module 'spark_sb.state' has no attribute {name!r}")


__all__ = ["maintain"]
