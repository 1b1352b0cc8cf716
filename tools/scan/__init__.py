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

from tools.scan.datasource import FORMAT, register_datasource

__all__ = ["FORMAT", "register_datasource"]
