"""``quire bench disk`` scaled down: the bookie's disk usage plateaus once deleted ledgers' space is reused
(real bookie and hub processes; LMDB's free pages take the next cycle's entries)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.bench.disk import BENCH_CONF, MIB, disk_sample, plateau, soak
from tools.cluster import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CYCLE_MB = 24
CONF = {**BENCH_CONF, "max_entries_per_ledger": "16", "max_batch_bytes": "65536",   # the last ledger: < 1 MB
        "journal_max_size_mb": "8", "journal_preallocate_mb": "4"}


def test_disk_sample_counts_lmdb_and_journal(tmp_path: Path) -> None:
    (tmp_path / "journal").mkdir()
    (tmp_path / "data.mdb").write_bytes(b"x" * 8192)
    (tmp_path / "journal" / "1.txn").write_bytes(b"y" * 4096)
    (tmp_path / "other").write_bytes(b"z" * 100)
    s = disk_sample(tmp_path)
    assert s["lmdb_file_bytes"] == 8192 and s["journal_bytes"] >= 4096
    assert s["disk_bytes"] == s["lmdb_allocated_bytes"] + s["journal_bytes"]


@pytest.mark.asyncio(loop_scope="function")
async def test_usage_after_three_cycles_is_that_after_the_first(tmp_path: Path) -> None:
    async with LocalCluster(bookies=1, hubs=1, data_dir=tmp_path, conf_overrides=CONF) as cluster:
        rows = await soak(cluster, gb=CYCLE_MB * MIB / 1e9, cycles=3, message_size=16384, window=32, wait=3.0)
    deleted = [r for r in rows if r["phase"] == "deleted"]
    published = [r for r in rows if r["phase"] == "published"]
    assert len(deleted) == 3 and published[-1]["published_bytes"] >= 3 * CYCLE_MB * MIB * 0.99
    # without reuse each cycle would add its CYCLE_MB to the LMDB file; with it, a few MB at most
    slack = 4 * MIB
    assert deleted[2]["lmdb_file_bytes"] <= deleted[0]["lmdb_file_bytes"] + slack, rows
    assert deleted[0]["lmdb_file_bytes"] < 2 * CYCLE_MB * MIB, rows
    journal_file = 8 * MIB + 4 * MIB
    assert deleted[2]["disk_bytes"] <= deleted[0]["disk_bytes"] + slack + journal_file, rows
    assert plateau(rows, slack + journal_file)["plateau"]
