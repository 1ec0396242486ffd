"""Rows -> project messages -> SDK messages (SPEC S2, B7, S5, S6): the public names, gathered from their homes.

* :mod:`spark_sb.message` - the message model: :class:`OutboundMessage` (and its SDK mapping),
  :class:`FrozenMap`, :class:`RejectError`, :class:`Reject`, the field checks, :func:`message_id_from_content`.
* :mod:`spark_sb.rows` - row conversion: :func:`row_to_message`, :func:`validate_schema`, :func:`row_to_json`.
* :mod:`spark_sb.wire_size` - wire size: :func:`encoded_size`, :func:`batch_cost`, :func:`batch_overhead`.
* :mod:`spark_sb.backlog` - the backlog translation (B6).

Nothing is implemented here; import from here or from the home module, whichever reads better.
"""

from __future__ import annotations

# from_backlog, is_backlog_message, to_backlog: re-exported for spark_sb/syphon.py and the syphon tests, which
# import them from here; their home is spark_sb.backlog. To be removed once those import spark_sb.backlog.
from spark_sb.backlog import from_backlog as from_backlog
from spark_sb.backlog import is_backlog_message as is_backlog_message
from spark_sb.backlog import to_backlog as to_backlog
from spark_sb.message import (
    MAX_ID_LENGTH,
    MAX_TTL_MS,
    FrozenMap,
    OutboundMessage,
    Reject,
    RejectError,
    Scalar,
    message_id_from_content,
)
from spark_sb.rows import (
    JSON_CONTENT_TYPE,
    LOGICAL_COLUMNS,
    SchemaError,
    row_to_json,
    row_to_message,
    validate_schema,
)
from spark_sb.wire_size import batch_cost, batch_overhead, encoded_size

__all__ = [
    "JSON_CONTENT_TYPE",
    "LOGICAL_COLUMNS",
    "MAX_ID_LENGTH",
    "MAX_TTL_MS",
    "FrozenMap",
    "OutboundMessage",
    "Reject",
    "RejectError",
    "Scalar",
    "SchemaError",
    "batch_cost",
    "batch_overhead",
    "encoded_size",
    "message_id_from_content",
    "row_to_json",
    "row_to_message",
    "validate_schema",
]
