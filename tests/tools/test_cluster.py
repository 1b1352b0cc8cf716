"""LocalCluster and `quire standalone`: real bookie processes, kill/restart, data-dir ownership."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bookie.client import BookKeeper
from bookie.registration import list_bookies
from metastore import open_metastore
from tests.fixtures.standalone import quire_standalone
from tools.cluster import LocalCluster


@pytest.mark.parametrize("fork_server", ["0", "1"], ids=["execed", "forked"])
async def test_bookies_register_and_survive_kill_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         fork_server: str) -> None:
    monkeypatch.setenv("QUIRE_FORK_SERVER", fork_server)  # tools.forkserver; the suite forks by default
    data = tmp_path / "given"
    async with LocalCluster(bookies=2, hubs=0, metastore="lmdb", data_dir=data,
                            conf_overrides={"session_timeout": "1000"}) as cluster:
        assert cluster.hub_addresses == []
        assert len(set(cluster.bookie_addresses)) == 2
        ms = await open_metastore(cluster.metastore_uri)
        try:
            regs = await list_bookies(ms)
            assert set(regs) == set(cluster.bookie_addresses)
            bk = await BookKeeper.connect(ms)
            lh = await bk.create_ledger(2, 2, 2)
            await lh.add_entries([b"a", b"b"])
            await lh.close()
            addr = cluster.bookie_addresses[0]
            pid = cluster.bookie_pid(0)
            await cluster.kill_bookie(0)
            assert cluster.bookie_pid(0) is None
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)  # type: ignore[arg-type]
            await cluster.restart_bookie(0)
            assert cluster.bookie_addresses[0] == addr
            assert addr in await list_bookies(ms)
            rh = await bk.open_ledger_no_recovery(lh.ledger_id)
            assert [e.data async for e in rh.read(0, 1)] == [b"a", b"b"]
            await bk.close()
        finally:
            await ms.close()
    assert data.is_dir(), "a data_dir given by the caller is never deleted"
    assert (data / "bookie-0" / "bk_server.conf").is_file()
    # a second run on the same data dir keeps the bookies' addresses, so old ledgers stay readable
    async with LocalCluster(bookies=2, data_dir=data) as again:
        assert again.bookie_addresses == cluster.bookie_addresses
        bk = await BookKeeper.connect(again.metastore_uri)
        rh = await bk.open_ledger(lh.ledger_id)
        assert [e.data async for e in rh.read(0, 1)] == [b"a", b"b"]
        await bk.close()


async def test_owned_temp_dir_is_removed_and_bad_counts_are_refused(tmp_path: Path) -> None:
    cluster = LocalCluster(bookies=1)
    await cluster.start()
    owned = cluster.data_dir
    assert owned.is_dir()
    await cluster.stop()
    assert not owned.exists()
    with pytest.raises(ValueError):
        LocalCluster(bookies=1, hubs=-1)


async def test_bad_bookie_conf_fails_start_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="no_such_key"):
        async with LocalCluster(bookies=1, data_dir=tmp_path, conf_overrides={"no_such_key": "1"}):
            pass


async def test_standalone_serves_until_sigterm(tmp_path: Path) -> None:
    async with quire_standalone("--bookies", "2", "--hub-port", "0", "--data", str(tmp_path / "sa"),
                                stop_within=30) as lines:
        uri = lines[0].split()[1]
        assert uri.startswith("lmdb://") and len([x for x in lines if x.startswith("bookie ")]) == 2
        assert lines[-2].startswith("console http://127.0.0.1:") and lines[-2].endswith("/ui/ (quire ui --open)")
        for line in lines[1:-2]:   # every process: address, metrics URL, log file, pid
            role, address, metrics, logf, pid = line.split()
            assert role in ("bookie", "hub") and address.startswith("127.0.0.1:")
            assert metrics.startswith("metrics=http://127.0.0.1:") and metrics.endswith("/metrics")
            assert Path(logf.removeprefix("log=")).is_file() and pid.removeprefix("pid=").isdigit()
        bk = await BookKeeper.connect(uri)
        lh = await bk.create_ledger(2, 2, 2)
        assert await lh.add_entry(b"hello") == 0
        await bk.close()


@pytest.mark.parametrize("backend", ["zookeeper", "hbase"])
async def test_cluster_on_other_metastores(tmp_path: Path, backend: str) -> None:
    """LocalCluster starts its own ZooKeeper (system jars) or HBase gateway emulator and runs ledgers on it."""
    async with LocalCluster(bookies=3, metastore=backend, data_dir=tmp_path,
                            conf_overrides={"session_timeout": "2000"}) as cluster:
        scheme = "zk://" if backend == "zookeeper" else "hbase://"
        assert cluster.metastore_uri.startswith(scheme)
        bk = await BookKeeper.connect(cluster.metastore_uri)
        try:
            assert bk.watcher.writable == set(cluster.bookie_addresses)
            lh = await bk.create_ledger(3, 2, 2)
            await lh.add_entries([b"on-" + backend.encode()] * 20)
            await cluster.kill_bookie(0)
            await cluster.restart_bookie(0)
            await lh.close()
            rh = await bk.open_ledger(lh.ledger_id)
            assert rh.metadata.last_entry_id == 19
            assert {e.data async for e in rh.read(0, 19)} == {b"on-" + backend.encode()}
        finally:
            await bk.close()


async def test_cluster_on_a_given_metastore_uri(tmp_path: Path) -> None:
    uri = f"lmdb://{tmp_path / 'shared-meta'}"
    async with LocalCluster(bookies=1, metastore=uri, data_dir=tmp_path / "c") as cluster:
        assert cluster.metastore_uri == uri
        ms = await open_metastore(uri)
        try:
            assert list(await list_bookies(ms)) == cluster.bookie_addresses
        finally:
            await ms.close()
