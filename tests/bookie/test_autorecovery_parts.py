"""AutoRecovery's pieces without bookies: the under-replication tables and the copy pacer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bookie.autorecovery import UnderReplicationManager
from bookie.rereplication import EntryPacer
from metastore import MetaStore, open_metastore


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[MetaStore]:
    ms = await open_metastore(f"lmdb://{tmp_path / 'meta'}")
    yield ms
    await ms.close()


async def test_marks_merge_missing_bookies_and_keep_their_first_time(store: MetaStore) -> None:
    urm = await UnderReplicationManager.open(store)
    assert await urm.mark(7, {"b:1"})
    first = await urm.get(7)
    assert first is not None and first.missing == {"b:1"} and first.marked_ms > 0
    assert not await urm.mark(7, {"b:1"}), "a mark naming nothing new is not rewritten"
    assert await urm.mark(7, {"b:2"})
    merged = await urm.get(7)
    assert merged is not None and merged.missing == {"b:1", "b:2"} and merged.marked_ms == first.marked_ms
    assert await urm.mark(12, {"b:3"})
    assert [r.ledger_id for r in await urm.list()] == [7, 12]


async def test_unmark_keeps_a_mark_extended_since_it_was_read(store: MetaStore) -> None:
    urm = await UnderReplicationManager.open(store)
    await urm.mark(3, {"b:1"})
    claimed = await urm.get(3)
    assert claimed is not None
    await urm.mark(3, {"b:2"})  # the auditor finds another lost bookie meanwhile
    assert not await urm.unmark(3, claimed.version)
    now = await urm.get(3)
    assert now is not None and now.missing == {"b:1", "b:2"}
    assert await urm.unmark(3, now.version)
    assert await urm.get(3) is None


async def test_switch_and_delay_are_cluster_wide_keys(store: MetaStore) -> None:
    urm = await UnderReplicationManager.open(store)
    assert await urm.enabled()
    assert await urm.lost_bookie_recovery_delay(30.0) == 30.0
    assert await urm.lost_bookie_recovery_delay_override() is None
    await urm.set_enabled(False)
    await urm.set_lost_bookie_recovery_delay(5)
    other = await UnderReplicationManager.open(store)
    assert not await other.enabled()
    assert await other.lost_bookie_recovery_delay(30.0) == 5.0
    with pytest.raises(ValueError):
        await urm.set_lost_bookie_recovery_delay(-1)


async def test_pacer_holds_its_rate_and_saves_up_no_burst_after_a_pause() -> None:
    loop = asyncio.get_running_loop()
    pacer = EntryPacer(50)
    t0 = loop.time()
    for _ in range(11):
        await pacer.wait()
    assert loop.time() - t0 >= 0.19  # 10 intervals of 20 ms after the first copy
    await asyncio.sleep(0.3)  # idle: must not allow 15 copies at once afterwards
    t1 = loop.time()
    for _ in range(6):
        await pacer.wait()
    assert loop.time() - t1 >= 0.09
