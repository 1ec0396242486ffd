"""The Delta jars are resolved with Ivy once; later sessions use the recorded jar files (no resolver report in
the output of `make demo` or a job). No JVM here: the builder's getOrCreate is replaced by a recorder."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("delta")

from pyspark.sql import SparkSession  # noqa: E402

from spark_sb.spark import session as session_module  # noqa: E402


class _FakeSession:
    def __init__(self, jars: str) -> None:
        self.sparkContext = SimpleNamespace(getConf=lambda: SimpleNamespace(get=lambda key: jars))


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict[str, Any]]:
    """Options of every session 'started'; Spark's answer lists the jar files Ivy resolved into tmp_path."""
    jars_dir = tmp_path / "jars"
    jars_dir.mkdir()
    resolved = []
    for name in ("io.delta_delta-spark_4.2_2.13-4.4.0.jar", "io.delta_delta-storage-4.4.0.jar"):
        (jars_dir / name).write_bytes(b"PK")
        resolved.append(f"file://{jars_dir / name}")
    calls: list[dict[str, Any]] = []

    def get_or_create(builder: Any) -> _FakeSession:
        calls.append(dict(builder._options))
        return _FakeSession(",".join(resolved))

    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", get_or_create)
    monkeypatch.setenv("SPARK_SB_IVY_DIR", str(tmp_path))
    return calls


def test_first_session_resolves_with_ivy_and_records_the_jars(started: list[dict[str, Any]]) -> None:
    session_module.build_spark_session("a")
    assert started[0]["spark.jars.packages"].startswith("io.delta:delta-spark_")
    assert "spark.jars" not in started[0]
    assert started[0]["spark.jars.ivy"]


def test_later_sessions_use_the_recorded_jars_and_skip_ivy(started: list[dict[str, Any]]) -> None:
    session_module.build_spark_session("a")
    session_module.build_spark_session("b", conf={"spark.jars": "/opt/extra.jar"})
    second = started[1]
    assert "spark.jars.packages" not in second
    jars = second["spark.jars"].split(",")
    assert jars[-1] == "/opt/extra.jar"  # the caller's jars are kept
    assert any(j.endswith("io.delta_delta-spark_4.2_2.13-4.4.0.jar") for j in jars)
    assert second["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"


def test_a_missing_jar_file_sends_the_next_session_back_to_ivy(
    started: list[dict[str, Any]], tmp_path: Path
) -> None:
    session_module.build_spark_session("a")
    (tmp_path / "jars" / "io.delta_delta-storage-4.4.0.jar").unlink()
    session_module.build_spark_session("b")
    assert "spark.jars.packages" in started[1]


def test_the_record_is_per_package_set(tmp_path: Path) -> None:
    a = session_module._jar_list_file("io.delta:delta-spark_4.2_2.13:4.4.0", str(tmp_path))
    b = session_module._jar_list_file("io.delta:delta-spark_4.2_2.13:4.3.0", str(tmp_path))
    assert a != b and a.parent == b.parent == tmp_path
    assert session_module._recorded_jars("io.delta:x:1", str(tmp_path)) is None
