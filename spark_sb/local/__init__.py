"""The local Service Bus namespace moved to its own distribution, ``servicebus-local`` (import ``servicebus_local``).

This alias keeps ``python -m spark_sb.local`` working for one release; it holds no part of the namespace.
Install the extra (``pip install 'spark-servicebus[local]'``) and use ``python -m servicebus_local`` and
``from servicebus_local.server import LocalNamespace``. Runs in a terminal or a test process; imports nothing of
``spark_sb`` (``servicebus_local`` only, when it is run).
"""

MOVED_TO = "servicebus_local"
