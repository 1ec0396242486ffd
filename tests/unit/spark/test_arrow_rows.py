"""The source's rows as Arrow record batches (spark_sb.spark.arrow_rows) equal pyspark's own conversion of the same
rows - which is what a reader yielding tuples gets - schema included (pyspark 4.2 refuses a batch whose schema
differs). Runs against the installed pyspark (the pinned pair here; ``.venv-oldest/bin/python -m pytest`` this file
for the oldest)."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import StructType, _parse_datatype_json_string
from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches

from spark_sb.source.rows import row_of, schema
from spark_sb.spark.arrow_rows import arrow_schema, record_batches
from tests.unit.source.test_rows import _message


class _Source:
    @classmethod
    def name(cls) -> str:
        return "servicebus"


def _struct(columns: tuple[tuple[str, str], ...]) -> StructType:
    """The StructType the reader's worker gets: the JVM sends the schema as JSON, which pyspark parses
    (``_parse_datatype_json_string``, as the worker does). Spark's JSON names two DDL types differently."""
    named: dict[str, Any] = {
        "bigint": "long",
        "int": "integer",
        "map<string,string>": {
            "type": "map",
            "keyType": "string",
            "valueType": "string",
            "valueContainsNull": True,
        },
    }
    fields = [{"name": n, "type": named.get(k, k), "nullable": True, "metadata": {}} for n, k in columns]
    parsed = _parse_datatype_json_string(json.dumps({"type": "struct", "fields": fields}))
    assert isinstance(parsed, StructType)
    return parsed


def _rows(body_format: str) -> list[tuple[Any, ...]]:
    messages = [
        _message(),
        _message(state=1, ttl=None),
        _message(value={b"k": [1, 2, b"x"]}),
        _message(data=[b"\xff\xfe not utf-8"]),
        _message(annotations={b"x-opt-deadletter-source": b"orders"}, ttl=2**32 - 1),
    ]
    return [(*row_of(m, "ns", "orders", body_format), None) for m in messages] * 3


@pytest.mark.parametrize("body_format", ["binary", "string"])
def test_the_batches_equal_pysparks_conversion_of_the_same_rows(body_format: str) -> None:
    columns = tuple(schema(body_format, batch=True))
    rows = _rows(body_format)
    theirs = pa.Table.from_batches(
        list(records_to_arrow_batches(iter(rows), 10_000, _struct(columns), _Source()))
    )
    ours = list(record_batches(rows, arrow_schema(columns), max_rows=4))
    assert [b.num_rows for b in ours] == [4, 4, 4, 3]
    assert all(b.schema.equals(theirs.schema) for b in ours)
    assert pa.Table.from_batches(ours).equals(theirs)
    # and pyspark passes them on as they are
    passed = list(records_to_arrow_batches(iter(ours), 10_000, _struct(columns), _Source()))
    assert pa.Table.from_batches(passed).equals(theirs)


def test_a_batch_holds_at_most_its_bytes_of_bodies_unless_one_body_is_larger() -> None:
    columns = tuple(schema("binary", batch=True))
    template = _rows("binary")[0]
    rows = [(b"x" * size, *template[1:]) for size in (40, 40, 30, 200, 10)]
    got = list(record_batches(rows, arrow_schema(columns), max_body_bytes=100))
    assert [[len(v) for v in b.column(0).to_pylist()] for b in got] == [[40, 40], [30], [200], [10]]
    assert list(record_batches([], arrow_schema(columns))) == []
