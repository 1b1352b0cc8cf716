"""``quire bench disk`` scaled down: the bookie's disk usage plateaus once deleted ledgers' space is reused
(real bookie and hub processes; LMDB's free pages take the next cycle's entries)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hub.client import HedwigClient
from tests.fixtures.polling import eventually
from tools.bench.disk import BENCH_CONF, MIB, _publish, disk_sample, plateau, soak
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
    # without reuse each cycle would add its CYCLE_MB to the LMDB file (48 MB over cycles 2 and 3); with it,
    # a few MB: a segment (up to about 1 MB, bookie.segments) needs a contiguous run of free pages, and what a
    # fragmented free list cannot hold goes to new pages (seen: 0 to 8 MB). A cycle is written in about one
    # checkpoint; when the garbage collection's deletion was the bookie's last transaction before it (no other
    # checkpoint between, as under load), that checkpoint took no freed page (LMDB gives a transaction's freed
    # pages only to the second one after it) and grew the file by a whole cycle, one run in five, until the
    # storage committed one transaction more after a deletion (bookie.checkpoints; tests/bookie/test_storage.py
    # checks that without timing).
    slack = CYCLE_MB * MIB // 2
    files = [r["lmdb_file_bytes"] for r in deleted]
    assert max(files[1] - files[0], files[2] - files[1]) <= slack, rows
    assert files[2] <= files[0] + slack, rows
    assert files[0] < 2 * CYCLE_MB * MIB, rows
    journal_file = 8 * MIB + 4 * MIB
    assert deleted[2]["disk_bytes"] <= deleted[0]["disk_bytes"] + slack + journal_file, rows
    assert plateau(rows, slack + journal_file)["plateau"]


@pytest.mark.asyncio(loop_scope="function")
async def test_a_read_only_bookie_still_deletes_and_reclaims(tmp_path: Path) -> None:
    """Pulsar #3205: garbage collection must go on on a full (read-only) bookie, or it never gets room back.

    (The reuse of the freed pages is the soak test's: LMDB places a large value only in a contiguous run of
    free pages, so how much of one small batch lands in them varies.)"""
    async with LocalCluster(bookies=1, hubs=1, data_dir=tmp_path, conf_overrides=CONF) as cluster, \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http, \
            await HedwigClient.connect(cluster.hub_addresses[0], {"auto_send_consume_message_enabled": "false"}) as c:
        hub = cluster.stats_urls[0].removesuffix("/metrics")
        bookie = cluster.stats_urls[1].removesuffix("/metrics")
        topic, body = b"ro-gc", b"g" * 16384

        async def info() -> dict[str, Any]:
            async with http.get(bookie + "/api/v1/bookie/info") as resp:
                return dict(await resp.json())

        await c.subscribe(topic, b"s")
        last = await _publish(c, topic, body, count=12 * MIB // len(body), window=32)
        async with http.put(bookie + "/api/v1/bookie/state/readonly", json={"readOnly": True}) as resp:
            assert resp.status == 200
        before = await info()
        assert before["read_only"] and before["reclaimable_bytes"] < 4 * MIB
        await c.consume(topic, b"s", last)

        async def hub_deleted() -> bool:
            async with http.get(f"{hub}/admin/v1/topics/{topic.decode()}/stats") as resp:
                return len((await resp.json())["ledgers"]) == 1
        await eventually(hub_deleted, timeout=30)

        async def reclaimed() -> dict[str, Any] | None:
            now = await info()
            return now if now["reclaimable_bytes"] >= 8 * MIB else None
        after = await eventually(reclaimed, timeout=30)     # garbage collected and checkpointed, read-only
        assert after["read_only"]
        async with http.put(bookie + "/api/v1/bookie/state/readonly", json={"readOnly": False}) as resp:
            assert resp.status == 200
        # writable again, it takes publishes (their reuse of the free pages is the soak test's business)
        assert await c.publish(topic, body) == last + 1
