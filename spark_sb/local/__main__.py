"""``python -m spark_sb.local``: the one-release alias of ``python -m servicebus_local`` (same flags, same output),
with a note on stderr that the namespace moved. Without the ``local`` extra it says what to install and exits 2.
"""

from __future__ import annotations

import importlib
import sys

NOTE = (
    "note: the local namespace moved to its own distribution, servicebus-local: "
    "run `python -m servicebus_local` (this alias goes away in the next release)"
)
MISSING = (
    "python -m spark_sb.local: the local namespace is not installed; "
    "pip install 'spark-servicebus[local]' (it brings servicebus-local), then run python -m servicebus_local"
)


def main(argv: list[str] | None = None) -> int:
    print(NOTE, file=sys.stderr, flush=True)
    try:
        target = importlib.import_module("servicebus_local.__main__")
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] in ("servicebus_local", "proton", "trustme"):
            print(MISSING, file=sys.stderr, flush=True)
            return 2
        raise
    result: int = target.main(argv)
    return result


if __name__ == "__main__":
    sys.exit(main())
