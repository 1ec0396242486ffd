"""Rows -> project messages -> SDK messages (SPEC S2, B7, S5, S6): the public names, gathered from their homes.

* :mod:`spark_sb.message` - the message model: :class:`OutboundMessage` (and its SDK mapping),
  :class:`FrozenMap`, :class:`RejectError`, :class:`Reject`, the field checks, :func:`message_id_from_content`.
* :mod:`spark_sb.rows` - row conversion: :func:`row_to_message`, :func:`validate_schema`, :func:`row_to_json`.
* :mod:`spark_sb.wire_size` - wire size: :func:`encoded_size`, :func:`batch_cost`, :func:`batch_overhead`.

The backlog translation (B6) lives with the other backlog rules in :mod:`spark_sb.backlog`.

Nothing is implemented here; import from here or from the home module, whichever reads better.
"""

from __future__ import annotations

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
