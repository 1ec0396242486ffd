"""Classes built on first use: a module whose classes subclass pyspark's (the data source's writers and readers)
builds them when one is first asked for, so that importing it needs no pyspark, and names them by their module, so
that they pickle by reference. Runs anywhere (driver, planner process, executors)."""

from __future__ import annotations

import threading
from collections.abc import Callable, MutableMapping
from typing import Any


def lazy_module_getattr(
    namespace: MutableMapping[str, Any], names: tuple[str, ...], build: Callable[[], dict[str, Any]]
) -> Callable[[str], Any]:
    """A module's ``__getattr__``: ``names`` come from ``build()`` (run once, under a lock, its result put into the
    module's ``namespace``); any other name raises ``AttributeError``."""
    lock = threading.Lock()
    module = namespace.get("__name__", "?")

    def getattr_(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        with lock:
            if name not in namespace:
                namespace.update(build())
        return namespace[name]

    return getattr_
