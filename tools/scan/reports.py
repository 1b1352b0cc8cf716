"""The built-in scan reports: each a function ``(spark, uri, ...) -> DataFrame``.

    from tools.scan.session import spark_session
    from tools.scan.reports import REPORTS, ledgers_per_bookie
    spark = spark_session("local[*]")
    ledgers_per_bookie(spark, "lmdb://data/metastore").show()

Every report reads tables through the ``quire-metastore`` DataSource and
returns flat columns (strings and numbers) so it can be written as CSV or
Parquet. Records that do not decode (non-null ``error``) are left out.

* ``ledgers-per-bookie``: per bookie address, how many ledgers have it in
  any ensemble, whether it is registered, and its state; registered bookies
  holding no ledger are listed with 0.
* ``under-replicated``: ledgers with at least one fragment (ensemble
  segment) on a bookie that is not registered in ``bookies``; the missing
  bookies (comma-separated, sorted) and how many fragments they touch.
* ``subscription-backlog``: per topic and subscriber, ``last_published_seq_id
  - consumed_seq_id`` (never below 0). "Last published" is what the
  metastore knows: the largest ``end_seq_id`` of the topic's closed ledger
  ranges, or ``start_seq_id - 1`` of its current (open) ledger when that is
  larger. Messages in the current ledger are not in the metastore until the
  ledger is closed, so the backlog is a lower bound; a topic with no
  ``topic_persistence`` record counts as 0 published.
* ``orphan-ledgers``: ledgers that no ``topic_persistence`` range
  references and whose ``ctime_ms`` is at least ``min_age_s`` old.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tools.scan.catalog import REPORT_HELP
from tools.scan.datasource import FORMAT


def load(spark: SparkSession, uri: str, table: str, partitions: int | None = None) -> DataFrame:
    """The decoded rows of ``table`` (records that did not decode are dropped)."""
    reader = spark.read.format(FORMAT).option("uri", uri).option("table", table)
    if partitions:
        reader = reader.option("partitions", str(partitions))
    return reader.load().where(F.col("error").isNull())


def _registered(spark: SparkSession, uri: str) -> DataFrame:
    return load(spark, uri, "bookies", 1).select(F.col("key").alias("bookie"), F.col("state"))


def ledgers_per_bookie(spark: SparkSession, uri: str, partitions: int | None = None) -> DataFrame:
    pairs = (load(spark, uri, "ledgers", partitions)
             .select("ledger_id", F.explode("ensembles").alias("seg"))
             .select("ledger_id", F.explode("seg.bookies").alias("bookie"))
             .distinct())
    counts = pairs.groupBy("bookie").agg(F.count("ledger_id").alias("ledgers"))
    bookies = _registered(spark, uri).withColumn("registered", F.lit(True))
    return (counts.join(F.broadcast(bookies), "bookie", "full_outer")
            .select("bookie", F.coalesce("ledgers", F.lit(0)).alias("ledgers"),
                    F.coalesce("registered", F.lit(False)).alias("registered"), "state")
            .orderBy(F.desc("ledgers"), "bookie"))


def under_replicated(spark: SparkSession, uri: str, partitions: int | None = None) -> DataFrame:
    placed = (load(spark, uri, "ledgers", partitions)
              .select("ledger_id", "state", F.posexplode("ensembles").alias("fragment", "seg"))
              .select("ledger_id", "state", "fragment", F.explode("seg.bookies").alias("bookie")))
    missing = placed.join(F.broadcast(_registered(spark, uri).select("bookie")), "bookie", "left_anti")
    return (missing.groupBy("ledger_id", "state")
            .agg(F.array_join(F.array_sort(F.collect_set("bookie")), ",").alias("missing_bookies"),
                 F.countDistinct("fragment").alias("fragments"))
            .orderBy("ledger_id"))


def _ranges(spark: SparkSession, uri: str) -> DataFrame:
    return (load(spark, uri, "topic_persistence", 1)
            .select("topic", F.explode("ranges").alias("r"))
            .select("topic", "r.ledger_id", "r.start_seq_id", "r.end_seq_id"))


def subscription_backlog(spark: SparkSession, uri: str, partitions: int | None = None) -> DataFrame:
    last = (_ranges(spark, uri).groupBy("topic")
            .agg(F.greatest(F.max("end_seq_id"),
                            F.max(F.when(F.col("end_seq_id").isNull(), F.col("start_seq_id") - 1)))
                 .alias("last_published_seq_id")))
    subs = load(spark, uri, "subscriptions", partitions).select("topic", "subscriber", "consumed_seq_id")
    published = F.coalesce(F.col("last_published_seq_id"), F.lit(0))
    return (subs.join(last, "topic", "left")
            .select("topic", "subscriber", "consumed_seq_id", published.alias("last_published_seq_id"),
                    F.greatest(published - F.col("consumed_seq_id"), F.lit(0)).alias("backlog"))
            .orderBy(F.desc("backlog"), "topic", "subscriber"))


def orphan_ledgers(spark: SparkSession, uri: str, partitions: int | None = None, min_age_s: float = 3600.0,
                   now_ms: int | None = None) -> DataFrame:
    now = int(time.time() * 1000) if now_ms is None else now_ms
    referenced = _ranges(spark, uri).select("ledger_id").distinct()
    old = load(spark, uri, "ledgers", partitions).where(F.col("ctime_ms") <= F.lit(now - int(min_age_s * 1000)))
    return (old.join(referenced, "ledger_id", "left_anti")
            .select("ledger_id", "state", "length", "ctime_ms",
                    ((F.lit(now) - F.col("ctime_ms")) / 1000).cast("long").alias("age_s"))
            .orderBy("ledger_id"))


Report = Callable[..., DataFrame]
REPORTS: dict[str, tuple[Report, str]] = {
    name: (func, REPORT_HELP[name]) for name, func in (
        ("ledgers-per-bookie", ledgers_per_bookie), ("under-replicated", under_replicated),
        ("subscription-backlog", subscription_backlog), ("orphan-ledgers", orphan_ledgers))
}


def run_report(spark: SparkSession, name: str, uri: str, **kwargs: Any) -> DataFrame:
    """The DataFrame of report ``name`` (``KeyError`` for an unknown name)."""
    return REPORTS[name][0](spark, uri, **kwargs)
