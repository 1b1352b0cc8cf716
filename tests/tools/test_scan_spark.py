"""tools.scan on a real Spark (``local[2]``, one session for the module, quick JVM options:
``tests.fixtures.spark``) against lmdb; ``quire scan`` runs in this process on that session."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from tests.fixtures.spark import quick_spark_session
from tests.tools.scan_data import (
    ADDRESSES,
    BAD_LEDGER_KEY,
    DEAD,
    HOUR_MS,
    NOW_MS,
    REGISTERED,
    Dataset,
    cursor_rows,
    ensembles_of,
    populate,
)
from tools.cli import LIBRARY_LOGGERS, main
from tools.scan.reports import run_report

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = quick_spark_session("local[2]")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Dataset]:
    uri = f"lmdb://{tmp_path_factory.mktemp('scan-spark')}/meta"
    return uri, populate(uri)


def _df(spark: SparkSession, uri: str, table: str, partitions: int = 4, fields: str = ""):
    reader = spark.read.format("quire-metastore").option("uri", uri).option("table", table)
    reader = reader.option("partitions", partitions)
    return reader.option("fields", fields).load() if fields else reader.load()


def expected_reports(data: Dataset) -> dict[str, list[tuple]]:
    ids = range(1, data.ledgers + 1)
    holders = {i: {b for _, bs in ensembles_of(i) for b in bs} for i in ids}
    per_bookie = sorted(((a, sum(a in holders[i] for i in ids), a in REGISTERED) for a in ADDRESSES),
                        key=lambda r: (-r[1], r[0]))
    under = [(i, sum(DEAD in bs for _, bs in ensembles_of(i))) for i in ids if DEAD in holders[i]]
    last = {t: max([e for _, _, e in rs if e is not None] + [s - 1 for _, s, e in rs if e is None])
            for t, rs in data.topics.items()}
    backlog = sorted(((t, s, c, last[t], max(last[t] - c, 0)) for (t, s), c in data.subscriptions.items()),
                     key=lambda r: (-r[4], r[0], r[1]))
    referenced = {lid for rs in data.topics.values() for lid, _, _ in rs}
    orphans = [i for i in ids if i not in referenced and data.ctime(i) <= NOW_MS - HOUR_MS]
    return {"per_bookie": per_bookie, "under": under, "backlog": backlog, "orphans": orphans}


def test_every_table_matches_a_cursor_scan(spark: SparkSession, store: tuple[str, Dataset]) -> None:
    uri, _ = store
    for table in ("ledgers", "bookies", "subscriptions", "topic_persistence", "hubs", "misc"):
        df = _df(spark, uri, table)
        rows = df.collect()
        expected = cursor_rows(uri, table)
        assert len(rows) == len(expected), table
        assert {r.key: r.version for r in rows} == {k: v for k, (v, _) in expected.items()}, table
    assert _df(spark, uri, "ledgers", partitions=5).rdd.getNumPartitions() == 5


def test_decoded_columns(spark: SparkSession, store: tuple[str, Dataset]) -> None:
    uri, data = store
    df = _df(spark, uri, "ledgers")
    assert df.where("error is null").count() == data.ledgers
    assert [r.key for r in df.where("error is not null").collect()] == [BAD_LEDGER_KEY]
    row = df.where("ledger_id = 9").collect()[0]
    assert (row.state, row.length, row.ensemble_size, row.write_quorum, row.ack_quorum) == ("CLOSED", 9000, 3, 2, 2)
    assert [(e.first_entry, e.bookies) for e in row.ensembles] == ensembles_of(9)
    assert df.where("state = 'OPEN'").count() == data.ledgers // 4
    misc = _df(spark, uri, "misc", fields="a,b")
    assert misc.columns == ["key", "version", "a", "b", "error"]
    assert misc.where("b is null").count() == 15
    pruned = (spark.read.format("quire-metastore").option("uri", uri).option("table", "ledgers")
              .option("columns", "length").load())
    assert pruned.columns == ["key", "version", "length", "error"]
    assert pruned.agg({"length": "sum"}).collect()[0][0] == df.agg({"length": "sum"}).collect()[0][0]
    bad = spark.read.format("quire-metastore").option("uri", uri).option("table", "ledgers").option("columns", "nope")
    with pytest.raises(Exception, match="has no column 'nope'"):
        bad.load()


def test_reports_exact_values(spark: SparkSession, store: tuple[str, Dataset]) -> None:
    uri, data = store
    want = expected_reports(data)
    per_bookie = run_report(spark, "ledgers-per-bookie", uri).collect()
    assert [(r.bookie, r.ledgers, r.registered) for r in per_bookie] == want["per_bookie"]
    assert {r.bookie: r.state for r in per_bookie}[REGISTERED[3]] == "READ_ONLY"
    under = run_report(spark, "under-replicated", uri).collect()
    assert [(r.ledger_id, r.fragments) for r in under] == want["under"]
    assert {r.missing_bookies for r in under} == {DEAD}
    backlog = run_report(spark, "subscription-backlog", uri).collect()
    assert [tuple(r) for r in backlog] == want["backlog"]
    orphans = run_report(spark, "orphan-ledgers", uri, min_age_s=3600, now_ms=NOW_MS).collect()
    assert [r.ledger_id for r in orphans] == want["orphans"]
    assert {r.age_s for r in orphans} == {7200}


def quire_in_process(*argv: str) -> int:
    """``quire ARGV`` in this process (``tools.cli.main``), leaving the logging setup as it was."""
    loggers = [logging.getLogger(), *map(logging.getLogger, LIBRARY_LOGGERS)]
    saved = [(lg, lg.level, lg.handlers[:]) for lg in loggers]
    try:
        return main(list(argv))
    finally:
        for lg, level, handlers in saved:
            lg.setLevel(level)
            lg.handlers[:] = handlers


def test_cli_prints_the_table_and_writes_parquet(spark: SparkSession, store: tuple[str, Dataset], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``quire scan`` on the module's session (its ``getOrCreate`` finds it; the CLI stops only a session it
    started, so the session serves on). A ``quire scan`` process of its own starting Spark is
    ``test_scan_standalone.py``'s ``test_executor_that_cannot_see_the_lmdb_path``."""
    uri, data = store
    out = tmp_path / "under.parquet"
    status = quire_in_process("scan", "under-replicated", "--metastore", uri, "--master", "local[2]",
                              "--out", str(out), "--limit", "3")
    stdout, stderr = capsys.readouterr()
    assert status == 0, stderr[-2000:]
    under = expected_reports(data)["under"]
    lines = stdout.splitlines()
    assert lines[0].split() == ["ledger_id", "state", "missing_bookies", "fragments"]
    assert lines[2].split()[0] == str(under[0][0])
    assert f"... {len(under) - 3} more rows" in stdout and f"({len(under)} rows)" in stdout
    table = pq.read_table(out)
    assert [(r["ledger_id"], r["fragments"]) for r in table.to_pylist()] == under
    assert spark.range(3).count() == 3          # not stopped by the CLI
