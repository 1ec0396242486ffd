"""SparkSession construction with real Delta Lake (driver only).

Jobs, the demo and the test suite build their session here, so the Delta wiring (extensions, catalog, the
``delta-spark`` jars resolved from Maven Central through ``configure_spark_with_delta_pip``) lives in one place.
Library functions never build sessions; they take ``spark`` as a parameter (inside ``foreachBatch`` use
``batch_df.sparkSession``).

The jars are downloaded once into an Ivy cache (``SPARK_SB_IVY_DIR``, default ``~/.ivy2.5.2`` as Spark uses)
and reused offline afterwards. The first session resolves them with Ivy (``spark.jars.packages``), which prints
its resolution report, and records the resolved jar files beside the cache; later sessions pass those files as
``spark.jars`` and skip Ivy, so their output starts with the program's own.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

#: Settings that keep a local session small and fast (2 cores): UI off, 2 shuffle partitions, few Delta
#: snapshot partitions, a larger thread stack (stopping a streaming query mid-batch otherwise printed a
#: StackOverflowError from the stream thread).
LOCAL_DEFAULTS: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
    "spark.driver.extraJavaOptions": "-Xss16m",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.stopTimeout": "30s",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
}


def ivy_dir() -> str | None:
    """The Ivy cache directory for the Delta jars, if overridden with ``SPARK_SB_IVY_DIR``."""
    return os.environ.get("SPARK_SB_IVY_DIR") or None


def delta_packages() -> str:
    """The Maven coordinates of the Delta jars matching the installed ``delta-spark`` and ``pyspark`` (what
    ``configure_spark_with_delta_pip`` puts in ``spark.jars.packages``)."""
    from delta import configure_spark_with_delta_pip
    from pyspark.sql import SparkSession

    builder = configure_spark_with_delta_pip(SparkSession.Builder())
    return str(builder._options["spark.jars.packages"])


def _jar_list_file(packages: str, ivy: str | None) -> Path:
    """Where the jar files resolved for ``packages`` are recorded: beside the Ivy cache that holds them."""
    home = Path(ivy) if ivy else Path.home() / ".ivy2.5.2"
    digest = hashlib.sha256(packages.encode()).hexdigest()[:16]
    return home / f"spark-sb-jars-{digest}.txt"


def _recorded_jars(packages: str, ivy: str | None) -> list[str] | None:
    """The jar files recorded for ``packages``, or None when none are recorded or one is gone."""
    try:
        jars = _jar_list_file(packages, ivy).read_text().split()
    except OSError:
        return None
    if not jars or not all(Path(_local_path(j)).is_file() for j in jars):
        return None
    return jars


def _local_path(jar: str) -> str:
    return jar[len("file://") :] if jar.startswith("file://") else jar


def _record_jars(spark: SparkSession, packages: str, ivy: str | None) -> None:
    """Record the jar files Ivy resolved for ``packages`` (spark-submit lists them in ``spark.jars``)."""
    try:
        resolved = spark.sparkContext.getConf().get("spark.jars") or ""
    except Exception:  # noqa: BLE001 - no SparkContext (Spark Connect): nothing to record
        return
    jars = [j for j in resolved.split(",") if "/jars/" in j and Path(_local_path(j)).is_file()]
    if not jars:
        return
    target = _jar_list_file(packages, ivy)
    try:
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        tmp.write_text("\n".join(jars) + "\n")
        os.replace(tmp, target)  # atomic: concurrent sessions never read half a list
    except OSError:
        pass  # read-only cache: the next session resolves with Ivy again


def build_spark_session(
    app_name: str = "spark-servicebus",
    master: str | None = "local[2]",
    conf: Mapping[str, str] | None = None,
    *,
    local_defaults: bool = True,
) -> SparkSession:
    """Build (or get) a SparkSession with Delta Lake enabled. Runs on the driver.

    ``master=None`` leaves the master to spark-submit / the platform (Databricks already has a session with
    Delta: there, use the existing ``spark``). ``conf`` entries override the defaults.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers must run the interpreter that has spark_sb and the SDK installed (the venv's).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    settings: dict[str, str] = {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    }
    if local_defaults:
        settings.update(LOCAL_DEFAULTS)
    ivy = ivy_dir()
    if ivy:
        settings["spark.jars.ivy"] = ivy
    settings.update(conf or {})
    ivy = settings.get("spark.jars.ivy")
    packages = delta_packages()
    jars = _recorded_jars(packages, ivy)
    if jars is not None:  # resolved before: no Ivy run, no resolution report
        settings["spark.jars"] = ",".join([*jars, *filter(None, [settings.get("spark.jars")])])
    else:
        settings["spark.jars.packages"] = ",".join(
            [packages, *filter(None, [settings.get("spark.jars.packages")])]
        )
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if jars is None:
        _record_jars(spark, packages, ivy)
    return spark


def ensure_delta_jars() -> None:
    """Resolve the Delta jars into the Ivy cache (downloads them the first time), then stop. Driver only."""
    spark = build_spark_session("spark-servicebus-jar-fetch")
    try:
        spark.range(1).count()
    finally:
        spark.stop()


if __name__ == "__main__":  # pragma: no cover - used by .ci/run
    ensure_delta_jars()
    print("delta jars ready")
