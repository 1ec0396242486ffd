"""The Spark harness runs real Delta Lake: write, read, MERGE, idempotent writes (txnAppId/txnVersion)."""

from __future__ import annotations


def test_delta_write_read_and_merge(spark, tmp_path) -> None:
    from delta.tables import DeltaTable

    path = str(tmp_path / "t")
    spark.createDataFrame([(1, "a"), (2, "b")], "id INT, v STRING").write.format("delta").save(path)
    updates = spark.createDataFrame([(2, "B"), (3, "c")], "id INT, v STRING")
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(updates.alias("u"), "t.id = u.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    rows = sorted((r.id, r.v) for r in spark.read.format("delta").load(path).collect())
    assert rows == [(1, "a"), (2, "B"), (3, "c")]
    history = DeltaTable.forPath(spark, path).history().select("operation").collect()
    assert [h.operation for h in history] == ["MERGE", "WRITE"]


def test_delta_idempotent_append_skips_repeated_txn_version(spark, tmp_path) -> None:
    path = str(tmp_path / "log")
    df = spark.createDataFrame([(1,)], "n INT")
    for _ in range(2):  # the second write of the same (appId, version) must be skipped
        df.write.format("delta").mode("append").option("txnAppId", "q1").option("txnVersion", 7).save(path)
    df.write.format("delta").mode("append").option("txnAppId", "q1").option("txnVersion", 8).save(path)
    assert spark.read.format("delta").load(path).count() == 2
