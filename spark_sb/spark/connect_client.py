"""A workaround on the Spark Connect client for SPARK-59135 (fixed upstream; pyspark 4.1 and 4.2.0 have it).

A Python data source's driver-side workers register pyspark's profiler accumulators even with profiling off, and
their empty updates reach the client as observed metrics named ``__python_accumulator__`` beside a command's
results. The client's command stream (``execute_command_as_iterator``: ``spark-pipelines run``'s events, streaming
query listeners) takes anything that is not a dictionary for an unknown response and fails: a declarative pipeline
that writes to ``format("servicebus")`` - or any Python data source - completes, then ``spark-pipelines run``
exits 1. :func:`tolerate_accumulator_updates` makes the client's response stream drop those updates after the
client has read them (it reads them before it yields them: nothing of the profiler's is lost), as the fix does.

Applied by :func:`spark_sb.register` for a Spark Connect session, and only where the client has the bug (its
command stream still refuses whatever is not a dictionary); idempotent. Runs on the driver (the Connect client's
process); no I/O.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Iterator
from typing import Any

_LOGGER = logging.getLogger(__name__)

#: The observed metrics' name under which the server sends Python accumulator updates.
ACCUMULATOR_METRICS = "__python_accumulator__"
_MARK = "_spark_sb_tolerates_accumulator_updates"
_lock = threading.Lock()


def has_the_bug(client_class: Any) -> bool:
    """``client_class``'s command stream refuses every response that is not a dictionary (SPARK-59135)."""
    try:
        source = inspect.getsource(client_class.execute_command_as_iterator)
    except (AttributeError, OSError, TypeError):
        return False
    return "UNKNOWN_RESPONSE" in source and "isinstance(response, dict)" in source


def tolerate_accumulator_updates() -> bool:
    """Make the Spark Connect client's response stream skip ``__python_accumulator__`` observed metrics, where its
    command stream has SPARK-59135. True when the client tolerates them now (patched, now or before)."""
    try:
        from pyspark.sql.connect.client.core import PlanObservedMetrics, SparkConnectClient
    except ImportError:  # no Spark Connect client here
        return False
    with _lock:
        original = SparkConnectClient._execute_and_fetch_as_iterator
        if getattr(original, _MARK, False):
            return True
        if not has_the_bug(SparkConnectClient):
            return False

        def _execute_and_fetch_as_iterator(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
            for item in original(self, *args, **kwargs):
                if isinstance(item, PlanObservedMetrics) and item.name == ACCUMULATOR_METRICS:
                    continue  # read already (the profiler's share taken), never anyone's result
                yield item

        setattr(_execute_and_fetch_as_iterator, _MARK, True)
        _execute_and_fetch_as_iterator.__wrapped__ = original  # type: ignore[attr-defined]
        SparkConnectClient._execute_and_fetch_as_iterator = _execute_and_fetch_as_iterator  # type: ignore[method-assign]
    _LOGGER.info(
        "spark_sb: this Spark Connect client has SPARK-59135 (a Python data source's empty profiler updates end "
        "command streams such as spark-pipelines run's): its responses skip them now"
    )
    return True
