"""The schema check of a streaming DataFrame against SPEC S2, made before any row is read (driver, at the first batch
of the sink and when a ``format("servicebus")`` write starts). Pure apart from reading pyspark's types.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spark_sb.message.rows import LOGICAL_COLUMNS


class SchemaError(ValueError):
    """A DataFrame schema that cannot be mapped to messages (SPEC S2); ``column`` names the column."""

    def __init__(self, column: str, reason: str) -> None:
        self.column = column
        self.reason = reason
        super().__init__(f"column {column!r}: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (SchemaError, (self.column, self.reason))


_NON_STRING_COLUMNS = frozenset({"body", "time_to_live", "scheduled_enqueue_time", "properties"})


_STRING_COLUMNS = tuple(c for c in LOGICAL_COLUMNS if c not in _NON_STRING_COLUMNS)


def validate_schema(schema: Any, columns: Mapping[str, str]) -> None:
    """Check a pyspark ``StructType`` against SPEC S2 before any row is read; raises :class:`SchemaError`
    naming the column and the type found. Runs on the driver (at the first batch).

    ``body``: string, binary, struct, map or array (the last three as JSON); the id/address columns:
    string; ``time_to_live``: integral/fractional milliseconds or a day-time interval;
    ``scheduled_enqueue_time``: timestamp; ``properties``: map<string, scalar>. Absent optional columns are
    fine; extra columns are ignored.
    """
    from pyspark.sql import types as T

    by_name = {f.name: f.dataType for f in schema.fields}

    def col(logical: str) -> str:
        return columns.get(logical, logical)

    def found(dt: Any) -> str:
        return str(dt.simpleString())

    body = col("body")
    if body not in by_name:
        raise SchemaError(body, f"the body column is missing (columns: {', '.join(by_name) or 'none'})")
    if not isinstance(by_name[body], (T.StringType, T.BinaryType, T.StructType, T.MapType, T.ArrayType)):
        raise SchemaError(
            body, f"expected string, binary, struct, map or array, found {found(by_name[body])}"
        )
    for logical in _STRING_COLUMNS:
        dt = by_name.get(col(logical))
        if dt is not None and not isinstance(dt, T.StringType):
            raise SchemaError(col(logical), f"expected string, found {found(dt)}")
    dt = by_name.get(col("time_to_live"))
    if dt is not None and not isinstance(dt, (T.IntegralType, T.FractionalType, T.DayTimeIntervalType)):
        raise SchemaError(
            col("time_to_live"), f"expected milliseconds or a day-time interval, found {found(dt)}"
        )
    dt = by_name.get(col("scheduled_enqueue_time"))
    if dt is not None and not isinstance(dt, (T.TimestampType, T.TimestampNTZType)):
        raise SchemaError(col("scheduled_enqueue_time"), f"expected timestamp, found {found(dt)}")
    dt = by_name.get(col("properties"))
    if dt is not None:
        scalar = (
            T.StringType,
            T.IntegralType,
            T.FloatType,
            T.DoubleType,
            T.BooleanType,
            T.BinaryType,
            T.TimestampType,
            T.TimestampNTZType,
        )
        if (
            not isinstance(dt, T.MapType)
            or not isinstance(dt.keyType, T.StringType)
            or not isinstance(dt.valueType, scalar)
        ):
            raise SchemaError(
                col("properties"),
                "expected map<string, string|integral|float|double|boolean|binary|timestamp>, "
                f"found {found(dt)}",
            )
