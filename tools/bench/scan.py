"""``quire bench scan``: a Spark scan of N ledger rows against the one-process cursor scan, same run.

    quire bench scan                         # 1 000 000 rows, local[2]
    quire bench scan --rows 200000 --master local[2] --partitions 4

The ``ledgers`` table of a fresh lmdb store is filled with raw LMDB puts in
big transactions (records in the lmdb backend's own format, written with
``metastore.backends.lmdb.encode_record``; the metastore's one-durable-
transaction-per-put path would take hours for a million rows). Then, on the
same store and the same decoder (``tools.scan.schema``):

* ``cursor_scan``: one process, ``metastore.sync`` cursor over the whole
  table, every record decoded into Arrow record batches exactly as a Spark
  executor does (``TableSpec.batch``); count and sum of ``length``;
* ``spark_scan``: ``quire-metastore`` DataSource on ``--master`` with
  ``--partitions`` key ranges, ``count`` and ``sum(length)``. Spark's
  start-up is not timed, and neither is one warm-up run of the query
  (``spark_warmup``: it starts the Python workers, which Spark then reuses;
  the one-process scan has none to start);
* ``ratio spark/cursor (best runs)``: the best Spark rate over the best
  cursor rate, ``--runs`` (3) timed runs of each: the machine is shared and
  noisy, so each side's best run is the figure least disturbed by others.

Both are run twice: with every column (``"columns": "all columns"``), and
with ``columns=length`` (the data source's hand-made column pruning; the
cursor side builds the same one column), since Python data sources cannot
prune columns themselves and the JVM otherwise converts the nested
``ensembles`` of every row that ``count``/``sum(length)`` never reads.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterable
from typing import Any

from tools.bench import rate

BATCH = 50_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=1_000_000, help="ledger rows to write (default 1000000)")
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    parser.add_argument("--partitions", type=int, default=4, help="key ranges for Spark (default 4)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each scan (default 3)")
    parser.add_argument("--dir", help="store directory (default: a temp dir, removed afterwards)")


def _ledger_blobs(n: int) -> list[bytes]:
    from bookie.proto.ledger_metadata_pb2 import LedgerMetadataFormat

    rnd = random.Random(7)
    bookies = [f"10.0.{r}.{h}:3181" for r in range(3) for h in range(1, 11)]
    out = []
    for i in range(n):
        m = LedgerMetadataFormat(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2,
                                 state=LedgerMetadataFormat.CLOSED, last_entry_id=rnd.randrange(10_000),
                                 length=rnd.randrange(1 << 30), digest_type="crc32c",
                                 password_digest=bytes(32), ctime_ms=1_700_000_000_000 + i)
        for first in range(1 + i % 2):
            seg = m.segments.add()
            seg.first_entry_id = first * 5000
            seg.ensemble.extend(rnd.sample(bookies, 3))
        out.append(m.SerializeToString())
    return out


def write_ledgers(path: str, rows: int) -> float:
    """Fill table ``ledgers`` of the lmdb store at ``path`` with ``rows`` records; returns seconds."""
    import lmdb

    from metastore import Value, sync
    from metastore.backends.lmdb import encode_record

    sync.open_metastore(f"lmdb://{path}").close()  # creates the store as the backend lays it out
    blobs = _ledger_blobs(1024)
    t0 = time.perf_counter()
    env = lmdb.open(path, map_size=8 << 30, max_dbs=16, subdir=True)
    try:
        db = env.open_db(b"t:ledgers", create=True)
        version = time.time_ns()
        for start in range(0, rows, BATCH):
            with env.begin(write=True, db=db) as txn:
                for i in range(start + 1, min(start + BATCH, rows) + 1):
                    txn.put(b"%020d" % i, encode_record(version + i, Value({"data": blobs[i % len(blobs)]})),
                            append=True)
    finally:
        env.close()
    return time.perf_counter() - t0


def cursor_scan(uri: str, select: tuple[str, ...] = ()) -> tuple[int, int]:
    """(rows, sum of length) by one process reading every record and decoding it as a Spark executor does."""
    import pyarrow.compute as pc

    from metastore import sync
    from tools.scan.datasource import DEFAULT_BATCH
    from tools.scan.schema import spec_for

    spec = spec_for("ledgers", select=select)
    schema = spec.arrow_schema
    ms = sync.open_metastore(uri)
    n = total = 0
    try:
        cur = ms.create_scannable_table("ledgers").open_cursor_range("", True, "", True, fields=spec.fields)
        while cur.has_more():
            batch = spec.batch(cur.read_entries(DEFAULT_BATCH), schema)
            n += batch.num_rows
            total += pc.sum(batch.column("length")).as_py() or 0
        cur.close()
    finally:
        ms.close()
    return n, total


def _compare(spark: Any, uri: str, args: argparse.Namespace, base: dict[str, Any], label: str,
             select: tuple[str, ...]) -> Iterable[dict[str, Any]]:
    """Cursor scan and Spark scan of the same columns, ``--runs`` each, then their ratio."""
    from pyspark.sql import functions as F

    best: dict[str, float] = {}
    n = total = 0
    for i in range(1, args.runs + 1):
        t0 = time.perf_counter()
        n, total = cursor_scan(uri, select)
        secs = time.perf_counter() - t0
        best["cursor"] = max(best.get("cursor", 0.0), rate(n, secs))
        yield {**base, "case": "cursor_scan", "columns": label,
               "client": "one process (metastore.sync cursor + decode)",
               "run": i, "seconds": round(secs, 2), "ops_per_sec": rate(n, secs), "rows_seen": n}
    reader = (spark.read.format("quire-metastore").option("uri", uri).option("table", "ledgers")
              .option("partitions", args.partitions))
    if select:
        reader = reader.option("columns", ",".join(select))
    df = reader.load()

    def query() -> Any:
        # a new Dataset each time: collecting one twice reuses its shuffle output and skips the scan
        return df.agg(F.count("*").alias("n"), F.sum("length").alias("total")).collect()[0]

    t0 = time.perf_counter()
    query()  # untimed, like Spark's start-up: starts the Python workers, as the cursor side has none
    yield {**base, "case": "spark_warmup", "columns": label, "client": f"quire-metastore on {args.master}",
           "seconds": round(time.perf_counter() - t0, 2)}
    for i in range(1, args.runs + 1):
        t0 = time.perf_counter()
        got = query()
        secs = time.perf_counter() - t0
        if (got.n, got.total) != (n, total):
            raise RuntimeError(f"Spark saw {got.n} rows / {got.total} bytes, the cursor {n} / {total}")
        best["spark"] = max(best.get("spark", 0.0), rate(n, secs))
        yield {**base, "case": "spark_scan", "columns": label, "client": f"quire-metastore on {args.master}",
               "partitions": args.partitions, "run": i, "seconds": round(secs, 2),
               "ops_per_sec": rate(n, secs), "rows_seen": got.n}
    yield {**base, "case": "ratio spark/cursor (best runs)", "columns": label, "master": args.master,
           "partitions": args.partitions, "spark_ops_per_sec": best["spark"], "cursor_ops_per_sec": best["cursor"],
           "ratio": round(best["spark"] / best["cursor"], 3) if best["cursor"] else None}


def run(args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    from tools.scan.session import spark_session

    base = {"bench": "scan", "rows": args.rows, "cpus": os.cpu_count()}
    root = args.dir or tempfile.mkdtemp(prefix="quire-bench-scan-")
    path = os.path.join(root, "meta")
    uri = f"lmdb://{path}"
    try:
        secs = write_ledgers(path, args.rows)
        yield {**base, "case": "load", "client": "raw lmdb batched puts", "seconds": round(secs, 2),
               "ops_per_sec": rate(args.rows, secs)}

        spark = spark_session(args.master, "quire bench scan")
        try:
            for label, select in (("all columns", ()), ("columns=length", ("length",))):
                yield from _compare(spark, uri, args, base, label, select)
        finally:
            spark.stop()
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
