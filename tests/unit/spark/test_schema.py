"""The schema check of a streaming DataFrame (:mod:`spark_sb.spark.schema`, SPEC S2): :func:`validate_schema`
accepts the column types rows can become messages from and names the column and the type found otherwise, through
the configured column mapping; :class:`SchemaError` carries the column. pyspark's types only, no SparkSession."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from pyspark.sql import types as T

from spark_sb.spark.schema import SchemaError, validate_schema
from tests.unit.spark.test_sink import COLS

#: The columns that must be strings (every logical column but body, time_to_live, scheduled_enqueue_time and
#: properties).
STRING_COLUMNS = (
    "entity",
    "message_id",
    "session_id",
    "partition_key",
    "correlation_id",
    "content_type",
    "subject",
    "to",
    "reply_to",
    "reply_to_session_id",
)


def _schema(**columns: Any) -> T.StructType:
    return T.StructType([T.StructField(name, data_type) for name, data_type in columns.items()])


def _refused(schema: T.StructType, columns: dict[str, str] | None = None) -> SchemaError:
    with pytest.raises(SchemaError) as caught:
        validate_schema(schema, columns or {})
    return caught.value


# --------------------------------------------------------------------------- schema check (S2)
def test_validate_schema_accepts_the_s2_schema() -> None:
    from pyspark.sql import types as T

    schema = T.StructType(
        [
            T.StructField("payload", T.StructType([T.StructField("a", T.IntegerType())])),
            *(
                T.StructField(n, T.StringType())
                for n in ("entity", "message_id", "session_id", "subject", "to")
            ),
            T.StructField("time_to_live", T.LongType()),
            T.StructField("scheduled_enqueue_time", T.TimestampType()),
            T.StructField("properties", T.MapType(T.StringType(), T.LongType())),
            T.StructField("other", T.ArrayType(T.IntegerType())),
        ]
    )
    validate_schema(schema, {"body": "payload"})
    validate_schema(T.StructType([T.StructField("body", T.BinaryType())]), {})
    ttl_interval = T.StructType(
        [T.StructField("body", T.StringType()), T.StructField("ttl", T.DayTimeIntervalType())]
    )
    validate_schema(ttl_interval, {"time_to_live": "ttl"})


def _types() -> dict[str, Any]:
    from pyspark.sql import types as T

    return {
        "string": T.StringType(),
        "int": T.IntegerType(),
        "date": T.DateType(),
        "map<string,array<int>>": T.MapType(T.StringType(), T.ArrayType(T.IntegerType())),
        "map<int,string>": T.MapType(T.IntegerType(), T.StringType()),
    }


@pytest.mark.parametrize(
    ("fields", "cols", "column", "fragment"),
    [
        ([("x", "string")], {}, "body", "missing"),
        ([("body", "int")], {}, "body", "found int"),
        ([("b", "string"), ("sid", "int")], {"body": "b", "session_id": "sid"}, "sid", "found int"),
        ([("body", "string"), ("time_to_live", "string")], {}, "time_to_live", "found string"),
        (
            [("body", "string"), ("scheduled_enqueue_time", "date")],
            {},
            "scheduled_enqueue_time",
            "found date",
        ),
        ([("body", "string"), ("properties", "map<string,array<int>>")], {}, "properties", "array<int>"),
        ([("body", "string"), ("properties", "map<int,string>")], {}, "properties", "map<int,string>"),
    ],
)
def test_validate_schema_names_the_column(
    fields: list[tuple[str, str]], cols: dict[str, str], column: str, fragment: str
) -> None:
    from pyspark.sql import types as T

    types = _types()
    schema = T.StructType([T.StructField(n, types[t]) for n, t in fields])
    with pytest.raises(SchemaError) as e:
        validate_schema(schema, cols)
    assert e.value.column == column and fragment in str(e.value)
    assert str(e.value).startswith(f"column {column!r}: ")


def test_schema_check_names_the_column_and_the_accepted_types() -> None:
    from pyspark.sql import types as T

    good = T.StructType([T.StructField("body", T.StringType()), T.StructField("time_to_live", T.LongType())])
    validate_schema(good, COLS)
    bad = T.StructType([T.StructField("body", T.StringType()), T.StructField("session_id", T.IntegerType())])
    with pytest.raises(SchemaError, match="column 'session_id': expected string, found int") as info:
        validate_schema(bad, COLS)
    assert info.value.column == "session_id"
    with pytest.raises(SchemaError, match="column 'body': expected string, binary, struct, map or array"):
        validate_schema(T.StructType([T.StructField("body", T.DoubleType())]), COLS)


# --------------------------------------------------------------------------- body
@pytest.mark.parametrize(
    "body",
    [
        T.StringType(),
        T.BinaryType(),
        T.StructType([T.StructField("a", T.IntegerType())]),
        T.MapType(T.StringType(), T.IntegerType()),
        T.ArrayType(T.StringType()),
    ],
    ids=lambda t: t.simpleString(),
)
def test_a_body_of_string_binary_struct_map_or_array_is_accepted(body: T.DataType) -> None:
    validate_schema(_schema(body=body), {})


@pytest.mark.parametrize(
    "body",
    [T.IntegerType(), T.DoubleType(), T.BooleanType(), T.TimestampType(), T.DateType(), T.DecimalType(10, 2)],
    ids=lambda t: t.simpleString(),
)
def test_a_body_of_any_other_type_is_refused_naming_the_type(body: T.DataType) -> None:
    err = _refused(_schema(body=body))
    assert err.column == "body"
    assert err.reason == f"expected string, binary, struct, map or array, found {body.simpleString()}"


def test_a_missing_body_column_is_refused_listing_the_columns_there_are() -> None:
    err = _refused(_schema(value=T.StringType(), key=T.BinaryType()), {"body": "payload"})
    assert (err.column, err.reason) == ("payload", "the body column is missing (columns: value, key)")
    assert _refused(T.StructType([])).reason == "the body column is missing (columns: none)"


# --------------------------------------------------------------------------- string columns
@pytest.mark.parametrize("column", STRING_COLUMNS)
def test_an_id_or_address_column_must_be_a_string(column: str) -> None:
    validate_schema(_schema(body=T.BinaryType(), **{column: T.StringType()}), {})
    err = _refused(_schema(body=T.BinaryType(), **{column: T.LongType()}))
    assert (err.column, err.reason) == (column, "expected string, found bigint")
    mapped = _refused(_schema(body=T.BinaryType(), renamed=T.BooleanType()), {column: "renamed"})
    assert (mapped.column, mapped.reason) == ("renamed", "expected string, found boolean")


def test_only_the_mapped_column_is_checked_and_other_columns_are_ignored() -> None:
    schema = _schema(
        payload=T.StringType(),
        body=T.IntegerType(),  # not the body: the body is mapped to payload
        session_id=T.IntegerType(),  # not the session id: that is mapped to sid
        sid=T.StringType(),
        anything=T.ArrayType(T.MapType(T.IntegerType(), T.DateType())),
    )
    validate_schema(schema, {"body": "payload", "session_id": "sid"})


# --------------------------------------------------------------------------- time_to_live
@pytest.mark.parametrize(
    "ttl",
    [
        T.ByteType(),
        T.ShortType(),
        T.IntegerType(),
        T.LongType(),
        T.FloatType(),
        T.DoubleType(),
        T.DecimalType(12, 3),
        T.DayTimeIntervalType(),
        T.DayTimeIntervalType(T.DayTimeIntervalType.SECOND, T.DayTimeIntervalType.SECOND),
    ],
    ids=lambda t: t.simpleString(),
)
def test_a_time_to_live_of_milliseconds_or_a_day_time_interval_is_accepted(ttl: T.DataType) -> None:
    validate_schema(_schema(body=T.StringType(), time_to_live=ttl), {})


@pytest.mark.parametrize(
    "ttl",
    [T.StringType(), T.YearMonthIntervalType(), T.TimestampType(), T.BooleanType()],
    ids=lambda t: t.simpleString(),
)
def test_a_time_to_live_of_any_other_type_is_refused(ttl: T.DataType) -> None:
    err = _refused(_schema(body=T.StringType(), ttl=ttl), {"time_to_live": "ttl"})
    assert (err.column, err.reason) == (
        "ttl",
        f"expected milliseconds or a day-time interval, found {ttl.simpleString()}",
    )


# --------------------------------------------------------------------------- scheduled_enqueue_time
@pytest.mark.parametrize("when", [T.TimestampType(), T.TimestampNTZType()], ids=lambda t: t.simpleString())
def test_a_scheduled_time_of_either_timestamp_type_is_accepted(when: T.DataType) -> None:
    validate_schema(_schema(body=T.StringType(), scheduled_enqueue_time=when), {})


@pytest.mark.parametrize("when", [T.DateType(), T.StringType(), T.LongType()], ids=lambda t: t.simpleString())
def test_a_scheduled_time_of_any_other_type_is_refused(when: T.DataType) -> None:
    err = _refused(_schema(body=T.StringType(), scheduled_enqueue_time=when))
    assert (err.column, err.reason) == (
        "scheduled_enqueue_time",
        f"expected timestamp, found {when.simpleString()}",
    )


# --------------------------------------------------------------------------- properties
@pytest.mark.parametrize(
    "value",
    [
        T.StringType(),
        T.ByteType(),
        T.ShortType(),
        T.IntegerType(),
        T.LongType(),
        T.FloatType(),
        T.DoubleType(),
        T.BooleanType(),
        T.BinaryType(),
        T.TimestampType(),
        T.TimestampNTZType(),
    ],
    ids=lambda t: t.simpleString(),
)
def test_properties_of_string_keys_and_scalar_values_are_accepted(value: T.DataType) -> None:
    validate_schema(_schema(body=T.StringType(), properties=T.MapType(T.StringType(), value)), {})


@pytest.mark.parametrize(
    "properties",
    [
        T.MapType(T.StringType(), T.DecimalType(10, 2)),
        T.MapType(T.StringType(), T.DateType()),
        T.MapType(T.StringType(), T.ArrayType(T.StringType())),
        T.MapType(T.StringType(), T.MapType(T.StringType(), T.StringType())),
        T.MapType(T.StringType(), T.StructType([T.StructField("a", T.StringType())])),
        T.MapType(T.IntegerType(), T.StringType()),
        T.MapType(T.BinaryType(), T.StringType()),
        T.StringType(),
        T.ArrayType(
            T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.StringType())])
        ),
    ],
    ids=lambda t: t.simpleString(),
)
def test_properties_of_any_other_type_are_refused_naming_the_type(properties: T.DataType) -> None:
    err = _refused(_schema(body=T.StringType(), props=properties), {"properties": "props"})
    assert err.column == "props"
    assert err.reason == (
        "expected map<string, string|integral|float|double|boolean|binary|timestamp>, "
        f"found {properties.simpleString()}"
    )


# --------------------------------------------------------------------------- SchemaError
def test_a_schema_error_names_its_column_and_pickles() -> None:
    err = SchemaError("sid", "expected string, found int")
    assert isinstance(err, ValueError)
    assert str(err) == "column 'sid': expected string, found int"
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is SchemaError and (back.column, back.reason, str(back)) == (
        err.column,
        err.reason,
        str(err),
    )
