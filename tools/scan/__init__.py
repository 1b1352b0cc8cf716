"""``quire scan``: Spark over the metastore's scannable tables.

    from pyspark.sql import SparkSession
    from tools.scan import register_datasource
    spark = SparkSession.builder.master("local[*]").getOrCreate()
    register_datasource(spark)
    ledgers = (spark.read.format("quire-metastore")
               .option("uri", "lmdb://data/metastore").option("table", "ledgers").load())
    ledgers.groupBy("state").count().show()

``tools.scan.datasource`` is the DataSource (key-range partitions, cursor
reads in the executors), ``tools.scan.schema`` the per-table columns,
``tools.scan.reports`` the built-in reports and ``tools.scan.cli`` the
``quire scan`` command.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FORMAT", "register_datasource"]


def __getattr__(name: str) -> Any:
    """``FORMAT`` and ``register_datasource`` come from ``tools.scan.datasource`` (Spark) when first used,
    so ``tools.scan.cli`` imports (and ``quire scan --help`` shows its options) without the scan extra."""
    if name in __all__:
        from tools.scan import datasource

        return getattr(datasource, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
