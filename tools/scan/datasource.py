"""The ``quire-metastore`` PySpark Python DataSource: a metadata table as a DataFrame.

    from tools.scan import register_datasource
    register_datasource(spark)
    df = (spark.read.format("quire-metastore")
          .option("uri", "lmdb://data/metastore")    # any metastore URI
          .option("table", "ledgers")
          .option("partitions", 8)                         # optional; default 2 x driver CPUs
          .load())

Options: ``uri`` and ``table`` (required); ``partitions`` (key ranges to
split a scannable table into, default twice the driver's CPU count);
``batch`` (entries per cursor read, default 2000); ``fields`` (a comma list:
one binary column per named field instead of the decoded or generic schema);
``columns`` (a comma list, known tables only: keep just these decoded
columns besides ``key``, ``version`` and ``error``. Python data sources
cannot prune columns by themselves, so a query that reads few columns of
``ledgers`` says so here and skips building the nested ones).
The schema is ``tools.scan.schema`` (``key``, ``version`` as a long, the
decoded columns, ``error``).

Planning runs on the driver (``tools.scan.ranges``); each partition is one
key range read inside its executor with ``metastore.sync`` and a cursor over
``[low, high)``, yielding Arrow record batches. A table the backend cannot
scan in key order is read as one partition with an unordered cursor.

An lmdb metastore is a local directory: the driver refuses a path that does
not exist (instead of creating an empty store), and an executor that cannot
see the path fails with ``MetastoreNotVisibleError`` naming the path, the
executor's host and the driver's host (``quire scan`` probes the executors
first, ``probe_executors``, so that this error is not retried). Store errors
(``metastore.errors.MetastoreError``) propagate and fail the Spark job.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from metastore import sync
from metastore.errors import IllegalOpError
from tools.scan.errors import MetastoreNotVisibleError, ScanError
from tools.scan.ranges import plan_ranges
from tools.scan.schema import TableSpec, spec_for

FORMAT = "quire-metastore"
DEFAULT_BATCH = 2000


def register_datasource(spark: SparkSession) -> None:
    """Register the ``quire-metastore`` format on ``spark`` (idempotent)."""
    spark.dataSource.register(QuireMetastoreDataSource)


def lmdb_path(uri: str) -> str | None:
    """The directory an ``lmdb://`` URI names, resolved here as the backend does; None for other schemes."""
    parts = urlsplit(uri)
    if parts.scheme != "lmdb":
        return None
    return os.path.abspath(unquote(parts.netloc + parts.path))


def check_visible(uri: str, where: str, driver_host: str | None = None) -> None:
    """Raise ``MetastoreNotVisibleError`` when ``uri`` is lmdb and its store is not on this host's disk."""
    path = lmdb_path(uri)
    if path is None or os.path.isfile(os.path.join(path, "data.mdb")):
        return
    host = socket.gethostname()
    if driver_host is None:
        raise MetastoreNotVisibleError(f"no lmdb metastore at {path} on {where} host {host} (uri {uri})")
    raise MetastoreNotVisibleError(
        f"lmdb metastore {uri} is not visible on executor host {host}: {path} has no store there "
        f"(the driver on {driver_host} planned the scan); an lmdb store is a local directory, so every "
        f"executor must see it at the same absolute path: run executors on that machine, share the "
        f"directory, or use a zk:// or hbase:// metastore")


def probe_executors(spark: SparkSession, uri: str) -> None:
    """Check, before a scan, that the executors see an lmdb ``uri``; ``MetastoreNotVisibleError`` if one does not.

    One task per slot of the default parallelism. A task reports what it
    found as a value instead of raising: a raised error would be retried
    ``spark.task.maxFailures`` times (4 on a cluster) before the job failed,
    half a minute for an answer that cannot change. Nothing to do for other
    schemes, or in local mode (the executors are the driver's host).
    """
    if lmdb_path(uri) is None or (spark.sparkContext.master or "local").startswith("local"):
        return
    driver = socket.gethostname()
    slots = max(1, spark.sparkContext.defaultParallelism)

    def check(_rows: Iterable[int]) -> Iterable[str]:
        try:
            check_visible(uri, "executor", driver)
        except MetastoreNotVisibleError as exc:
            yield str(exc)

    problems = spark.sparkContext.parallelize(range(slots), slots).mapPartitions(check).collect()
    if problems:
        raise MetastoreNotVisibleError(problems[0])


@dataclass
class KeyRangePartition(InputPartition):
    """One key range ``[low, high)`` of one table (``""`` = open); ``ordered`` False = one unordered cursor."""

    uri: str
    table: str
    low: str
    high: str
    ordered: bool
    driver_host: str


def _open_table(ms: sync.SyncMetaStore, table: str) -> tuple[sync.SyncTable, bool]:
    """The table and whether it scans in key order (``IllegalOpError`` from the backend -> unordered)."""
    try:
        return ms.create_scannable_table(table), True
    except IllegalOpError:
        return ms.create_table(table), False


def _options(options: dict[str, str]) -> tuple[str, str, int, int, list[str], list[str]]:
    uri, table = options.get("uri"), options.get("table")
    if not uri:
        raise ScanError(f"{FORMAT}: option 'uri' is required (a metastore URI such as lmdb:///path)")
    if not table:
        raise ScanError(f"{FORMAT}: option 'table' is required (e.g. ledgers)")
    try:
        parts = int(options.get("partitions") or 2 * (os.cpu_count() or 1))
        batch = int(options.get("batch") or DEFAULT_BATCH)
    except ValueError:
        raise ScanError(f"{FORMAT}: options 'partitions' and 'batch' take integers") from None
    if parts < 1 or batch < 1:
        raise ScanError(f"{FORMAT}: options 'partitions' and 'batch' must be >= 1")
    return uri, table, parts, batch, _names(options.get("fields")), _names(options.get("columns"))


def _names(option: str | None) -> list[str]:
    """A comma-separated option as a list of names (blanks dropped)."""
    return [n.strip() for n in (option or "").split(",") if n.strip()]


def _spec(table: str, fields: list[str], select: list[str]) -> TableSpec:
    try:
        return spec_for(table, fields, select)
    except ValueError as exc:
        raise ScanError(f"{FORMAT}: {exc}") from None


class QuireMetastoreDataSource(DataSource):
    """``spark.read.format("quire-metastore")``; see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        _, table, _, _, fields, select = _options(dict(self.options))
        return _spec(table, fields, select).schema

    def reader(self, schema: StructType) -> DataSourceReader:
        return KeyRangeReader(dict(self.options))


class KeyRangeReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.uri, self.table, self.partition_count, self.batch, self.fields, self.select = _options(options)

    def partitions(self) -> list[KeyRangePartition]:
        check_visible(self.uri, "driver")
        host = socket.gethostname()
        ms = sync.open_metastore(self.uri)
        try:
            table, ordered = _open_table(ms, self.table)
            ranges = plan_ranges(table, self.partition_count) if ordered else [("", "")]
        finally:
            ms.close()
        return [KeyRangePartition(self.uri, self.table, lo, hi, ordered, host) for lo, hi in ranges]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, KeyRangePartition)
        yield from read_range(partition, _spec(self.table, self.fields, self.select), self.batch)


def read_range(partition: KeyRangePartition, spec: TableSpec, batch: int) -> Iterator[Any]:
    """Arrow record batches of the rows in ``partition`` (runs in the executor)."""
    check_visible(partition.uri, "executor", partition.driver_host)
    arrow_schema = spec.arrow_schema
    fields = spec.fields
    ms = sync.open_metastore(partition.uri)
    try:
        table, _ = _open_table(ms, partition.table)
        if partition.ordered:
            cur = table.open_cursor_range(partition.low, True, partition.high, False, fields=fields)
        else:
            cur = table.open_cursor(fields=fields)
        try:
            while cur.has_more():
                entries = cur.read_entries(batch)
                if entries:
                    yield spec.batch(entries, arrow_schema)
        finally:
            cur.close()
    finally:
        ms.close()
