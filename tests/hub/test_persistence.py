"""hub.persistence against real bookie processes: batched entries, dense seq ids, the read path."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from bookie.client import BookKeeper
from hub.conf import load_hub_conf
from hub.metadata import TopicPersistenceManager
from hub.persistence import TopicLog, decode_batch
from hub.proto import pubsub_pb2 as pb
from metastore import open_metastore
from tools.cluster import LocalCluster

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(tmp_path_factory: Any) -> AsyncIterator[tuple[Any, Any]]:
    root: Path = tmp_path_factory.mktemp("persist")
    async with LocalCluster(bookies=3, hubs=0, data_dir=root) as cluster:
        ms = await open_metastore(cluster.metastore_uri)
        bk = await BookKeeper.connect(ms)
        pm = TopicPersistenceManager(ms)
        await pm.start()
        yield bk, pm
        await bk.close()
        await ms.close()


def msg(i: int) -> pb.Message:
    return pb.Message(body=b"m%d" % i, srcRegion=b"standalone")


async def entries_of(bk: Any, ledger_id: int) -> list[list[int]]:
    rh = await bk.open_ledger_no_recovery(ledger_id)
    out = []
    if rh.last_add_confirmed >= 0:
        async for e in rh.read(0, rh.last_add_confirmed):
            out.append([m.msgId.localComponent for m in decode_batch(e.data)])
    await rh.close()
    return out


async def test_concurrent_publishes_share_entries_within_bounds(env: tuple[Any, Any]) -> None:
    bk, pm = env
    conf = load_hub_conf(None, {"bk_ensemble_size": 2, "max_batch_messages": 8, "max_outstanding_adds": 1})
    log = await TopicLog.acquire(b"batched", bk, pm, conf)
    assert await log.publish(msg(0)) == 1                    # a lone publish goes out at once
    seqs = await asyncio.gather(*(log.publish(msg(i)) for i in range(1, 101)))
    assert seqs == list(range(2, 102))
    ledger = log.lh.ledger_id
    await log.release()
    entries = await entries_of(bk, ledger)
    assert [s for e in entries for s in e] == list(range(1, 102))        # dense, in order
    assert len(entries) < 101 and max(len(e) for e in entries) <= 8      # batched, bounded


async def test_new_owner_recovers_and_reads_back_across_ledgers(env: tuple[Any, Any]) -> None:
    bk, pm = env
    conf = load_hub_conf(None, {"bk_ensemble_size": 2, "max_entries_per_ledger": 7})
    first = await TopicLog.acquire(b"moved", bk, pm, conf)
    for i in range(30):
        assert await first.publish(msg(i)) == i + 1             # one entry each: 5 ledgers
    # the first owner vanishes without closing its ledger; a new owner fences and recovers it
    second = await TopicLog.acquire(b"moved", bk, pm, conf)
    assert second.last_seq == 30
    with pytest.raises(Exception):  # noqa: B017 - the old writer is fenced out
        await first.publish(msg(99))
    assert await second.publish(msg(30)) == 31
    for start in range(1, 32):
        got = await second.scan(start, 7, 1 << 20)
        assert [m.seq_id for m in got] == list(range(start, min(start + 7, 32)))
        assert [m.body for m in got] == [b"m%d" % (s - 1) for s in range(start, min(start + 7, 32))]
    assert [m.seq_id for m in await second.scan(5, 100, 5)] == [5, 6, 7]  # stops once past the byte hint
    assert await second.scan(32, 10, 1 << 20) == []
    ranges = second.ranges.ranges
    assert [r.startSeqIdIncluded for r in ranges] == [1, 8, 15, 22, 29, 31]
    assert await second.delete_consumed(21) != []
    assert [r.startSeqIdIncluded for r in second.ranges.ranges] == [22, 29, 31]
    assert [m.seq_id for m in await second.scan(22, 3, 1 << 20)] == [22, 23, 24]
    await second.release()
