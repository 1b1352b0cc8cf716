"""quire scan on a real Spark standalone master + worker (separate JVMs), against lmdb and ZooKeeper.

One master, one worker and one driver session for the whole module; the
"executor cannot see the lmdb path" case runs ``quire scan`` as its own
Spark application against the same master. Every JVM runs with the quick
options of ``tests.fixtures.spark``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.fixtures.spark import SparkStandalone, quick_env, quick_spark_session
from tests.tools.scan_data import Dataset, cursor_rows, populate
from tests.tools.test_scan_spark import expected_reports
from tools.scan.reports import run_report
from tools.zookeeper import ZooKeeperServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    with SparkStandalone(tmp_path_factory.mktemp("spark-standalone"), cores=2, memory="2g") as running:
        yield running


@pytest.fixture(scope="module")
def spark(cluster: SparkStandalone) -> Iterator[SparkSession]:
    # one core for this session, so the CLI's own application (below) gets the other
    session = quick_spark_session(cluster.master_url, conf={**cluster.driver_conf, "spark.cores.max": "1"})
    try:
        assert session.sparkContext.master == cluster.master_url
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def lmdb_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Dataset]:
    uri = f"lmdb://{tmp_path_factory.mktemp('scan-standalone')}/meta"
    return uri, populate(uri, ledgers=60)


def _check_tables(spark: SparkSession, uri: str) -> None:
    for table in ("ledgers", "bookies", "subscriptions", "topic_persistence", "hubs"):
        df = spark.read.format("quire-metastore").option("uri", uri).option("table", table) \
            .option("partitions", 3).load()
        rows = df.collect()
        expected = cursor_rows(uri, table)
        assert {r.key: r.version for r in rows} == {k: v for k, (v, _) in expected.items()}, table
        assert len(rows) == len(expected), table


def test_lmdb_scan_and_report_on_the_standalone_cluster(spark: SparkSession, lmdb_store: tuple[str, Dataset]) -> None:
    uri, data = lmdb_store
    _check_tables(spark, uri)
    under = run_report(spark, "under-replicated", uri, partitions=3).collect()
    assert [(r.ledger_id, r.fragments) for r in under] == expected_reports(data)["under"]


def test_zookeeper_scan_and_report_on_the_standalone_cluster(spark: SparkSession,
                                                             zk_server: ZooKeeperServer) -> None:
    uri = f"zk://{zk_server.connect_string}/quire-scan-{uuid.uuid4().hex}"
    data = populate(uri, ledgers=30)
    _check_tables(spark, uri)
    backlog = run_report(spark, "subscription-backlog", uri).collect()
    assert [tuple(r) for r in backlog] == expected_reports(data)["backlog"]
    per_bookie = run_report(spark, "ledgers-per-bookie", uri).collect()
    assert [(r.bookie, r.ledgers, r.registered) for r in per_bookie] == expected_reports(data)["per_bookie"]


def test_executor_that_cannot_see_the_lmdb_path(spark: SparkSession, cluster: SparkStandalone,
                                                tmp_path: Path) -> None:
    # A relative lmdb URI resolves in each process's working directory: the CLI (and its driver JVM)
    # run in tmp_path, where the store is; the executors run in the worker's directory, where it is not.
    uri = "lmdb://relative-store/meta"
    populate(f"lmdb://{tmp_path}/relative-store/meta", ledgers=5)
    env = {**os.environ, **quick_env(), "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run([sys.executable, "-m", "tools.cli", "--log-level", "WARNING", "scan", "ledgers-per-bookie",
                           "--metastore", uri, "--master", cluster.master_url], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout
    line = done.stderr.splitlines()[-1]
    assert line.startswith("quire scan: error: MetastoreNotVisibleError: lmdb metastore lmdb://relative-store/meta "
                           "is not visible on executor host"), done.stderr[-3000:]
    assert "every executor must see it at the same absolute path" in line


def test_the_executor_probe_answers_without_task_retries(spark: SparkSession, lmdb_store: tuple[str, Dataset]) -> None:
    """``quire scan`` probes the executors first: a task reports "not visible" as a value, so the answer comes
    from one attempt per task rather than after ``spark.task.maxFailures`` failed ones."""
    from tools.scan.datasource import probe_executors
    from tools.scan.errors import MetastoreNotVisibleError

    probe_executors(spark, lmdb_store[0])      # an absolute path on this host: every executor sees it
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup())
    with pytest.raises(MetastoreNotVisibleError, match=r"lmdb://nowhere-\w+/meta is not visible on executor host"):
        probe_executors(spark, f"lmdb://nowhere-{uuid.uuid4().hex}/meta")   # relative: not in the worker's cwd
    (job,) = set(tracker.getJobIdsForGroup()) - before
    # the tracker learns a job's end from Spark's listener bus, after collect() has returned: wait for it
    deadline = time.monotonic() + 30
    while (info := tracker.getJobInfo(job)) is not None and info.status == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert info is not None and info.status == "SUCCEEDED"   # the job itself did not fail, nothing was retried
