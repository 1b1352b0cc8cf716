"""A SparkSession for scans, whose Python workers run this interpreter.

    from tools.scan.session import spark_session
    spark = spark_session("local[*]")           # or "spark://host:7077"; datasource registered
    ...
    spark.stop()

Python workers (driver-side planning and executors) run ``PYSPARK_PYTHON``;
when it is unset this interpreter is used, so they import the same Quire
and protobuf as the caller. Spark's own log is turned down to errors.
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from tools.scan.datasource import register_datasource


def spark_session(master: str = "local[*]", app_name: str = "quire scan",
                  conf: dict[str, str] | None = None) -> SparkSession:
    """Create (or reuse) a session on ``master`` with the ``quire-metastore`` format registered.

    Raises pyspark's errors when Spark cannot start (no Java, a master that does not answer).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register_datasource(spark)
    return spark
