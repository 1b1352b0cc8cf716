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
from hub.readahead import ReadAheadCache
from metastore import open_metastore
from tools.cluster import LocalCluster

pytestmark = pytest.mark.asyncio(loop_scope="module")

TIMEOUT = 5.0


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


async def test_pipelined_and_time_bounded_entries_stay_dense_and_in_order_across_rolls(env: tuple[Any, Any]) -> None:
    bk, pm = env
    conf = load_hub_conf(None, {"bk_ensemble_size": 2, "batch_hold_after_adds": 3, "batch_flush_delay_ms": 0.2,
                                "max_outstanding_adds": 4, "max_entries_per_ledger": 8})
    log = await TopicLog.acquire(b"pipelined", bk, pm, conf)
    futs: list[asyncio.Future[int]] = []
    for wave in range(20):      # each wave starts while the last one's later entries are in flight
        for i in range(wave * 10, wave * 10 + 10):
            futs.append(log.enqueue(msg(i)))
            await asyncio.sleep(0)     # one publish a loop turn: the first three go as entries at once
        await asyncio.wait_for(asyncio.shield(futs[-10]), 10)
    seqs = await asyncio.wait_for(asyncio.gather(*futs), 30)
    assert seqs == list(range(1, 201))
    ledgers = [r.ledgerId for r in log.ranges.ranges]
    await log.release()
    stored = [s for lid in ledgers for e in await entries_of(bk, lid) for s in e]
    assert stored == list(range(1, 201))                               # dense, in order, across ledgers
    assert len(ledgers) > 1


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


async def test_subscriber_reads_past_a_ledger_that_was_closing_when_first_read(env: tuple[Any, Any]) -> None:
    """Issue 17: a reader opened while the owner closed the ledger cached a LAC one short, forever."""
    bk, pm = env
    conf = load_hub_conf(None, {"bk_ensemble_size": 2, "max_entries_per_ledger": 3, "scan_backoff_ms": 20})
    log = await TopicLog.acquire(b"closing", bk, pm, conf)
    for i in range(3):                            # one entry each: the ledger is full
        assert await log.publish(msg(i)) == i + 1
    full = log.lh
    closing, go = asyncio.Event(), asyncio.Event()
    real_close = full.close

    async def held_close() -> None:               # the roll's close, held after the writer is let go
        closing.set()
        await go.wait()
        await real_close()

    full.close = held_close
    fourth = asyncio.ensure_future(log.publish(msg(3)))     # rolls: closes the full ledger first
    await asyncio.wait_for(closing.wait(), TIMEOUT)
    assert log.lh is None and not full.metadata.is_closed

    async def scanner(topic: bytes, start: int, n: int, size: int) -> list[Any]:
        return await log.scan(start, n, size)

    cache = ReadAheadCache(conf, scanner, last_seq=lambda topic: log.last_seq)
    got = [await asyncio.wait_for(cache.scan_single(b"closing", s), TIMEOUT) for s in (1, 2)]
    go.set()                                      # the close completes, the roll goes on
    assert await asyncio.wait_for(fourth, TIMEOUT) == 4
    for i in range(4, 10):
        assert await log.publish(msg(i)) == i + 1
    for s in range(3, 11):                        # the old code's reader stopped at seq id 2 for good
        got.append(await asyncio.wait_for(cache.scan_single(b"closing", s), TIMEOUT))
    assert [m.seq_id for m in got] == list(range(1, 11))
    assert [m.body for m in got] == [b"m%d" % i for i in range(10)]
    assert [m.seq_id for m in await log.scan(1, 20, 1 << 20)] == list(range(1, 11))
    await cache.close()
    await log.release()


async def test_a_reader_cached_before_its_ledger_closed_is_not_kept(env: tuple[Any, Any]) -> None:
    """White box: a reader whose open raced the close (LAC one short) is reopened on the closed metadata."""
    bk, pm = env
    conf = load_hub_conf(None, {"bk_ensemble_size": 2, "max_entries_per_ledger": 3})
    log = await TopicLog.acquire(b"stale-reader", bk, pm, conf)
    for i in range(3):
        assert await log.publish(msg(i)) == i + 1
    lid = log.lh.ledger_id
    stale = await bk.open_ledger_no_recovery(lid)     # the ledger is still open: its last entry's LAC is unknown
    assert stale.last_add_confirmed == 1
    assert await log.publish(msg(3)) == 4             # the roll closes the ledger at entry 2
    log._readers = {**log._readers, lid: stale}        # as if a scan had opened it while the close ran (a dict
    #                                                   of its own: an idle log shares metastore.idle.IDLE_DICT)
    assert [m.seq_id for m in await log.scan(1, 10, 1 << 20)] == [1, 2, 3, 4]
    assert [m.seq_id for m in await log.scan(3, 10, 1 << 20)] == [3, 4]
    assert log._readers[lid] is not stale and log._readers[lid].is_closed
    await log.release()


async def test_an_acquisition_for_a_publish_writes_the_recovered_ends_and_its_new_ledger_at_once(
        env: tuple[Any, Any]) -> None:
    """Issue 34: ``start_ledger`` records the recovered end and the new ledger's open range in one
    compare-and-set on the version read (the old owner's writes fenced as before), and the first
    publish goes into that ledger; a second takeover recovers it in turn."""
    bk, pm = env
    conf = load_hub_conf(None, {"bk_ensemble_size": 2})
    first = await TopicLog.acquire(b"eager", bk, pm, conf)
    for i in range(5):
        assert await first.publish(msg(i)) == i + 1
    old_ledger = first.lh.ledger_id
    _, read_version = await pm.read_topic_persistence_info(b"eager")
    second = await TopicLog.acquire(b"eager", bk, pm, conf, start_ledger=True)
    assert second.lh is not None and second.lh.ledger_id != old_ledger
    stored, version = await pm.read_topic_persistence_info(b"eager")
    assert version == second.version and read_version < version
    assert [(r.ledgerId, r.startSeqIdIncluded, r.HasField("endSeqIdIncluded")) for r in stored.ranges] == [
        (old_ledger, 1, True), (second.lh.ledger_id, 6, False)]
    assert stored.ranges[0].endSeqIdIncluded.localComponent == 5
    with pytest.raises(Exception):  # noqa: B017 - the old writer is fenced out
        await first.publish(msg(99))
    assert await second.publish(msg(5)) == 6
    third = await TopicLog.acquire(b"eager", bk, pm, conf, start_ledger=True)
    assert third.last_seq == 6
    assert [m.seq_id for m in await third.scan(1, 10, 1 << 20)] == [1, 2, 3, 4, 5, 6]
    await third.release()


async def test_an_acquisition_that_cannot_start_a_ledger_still_records_the_recovered_ends(
        env: tuple[Any, Any]) -> None:
    """With too few bookies for a new ledger, ``start_ledger`` writes the recovered ends alone (the
    acquisition succeeds, as it did before the first publish started ledgers) and no ledger is open."""
    bk, pm = env
    conf = load_hub_conf(None, {"bk_ensemble_size": 2})
    first = await TopicLog.acquire(b"eager-no-bookies", bk, pm, conf)
    assert await first.publish(msg(0)) == 1
    wide = load_hub_conf(None, {"bk_ensemble_size": 9, "bk_write_quorum_size": 9, "bk_ack_quorum_size": 9})
    second = await TopicLog.acquire(b"eager-no-bookies", bk, pm, wide, start_ledger=True)
    assert second.lh is None and second.last_seq == 1
    stored, version = await pm.read_topic_persistence_info(b"eager-no-bookies")
    assert version == second.version
    assert [(r.startSeqIdIncluded, r.endSeqIdIncluded.localComponent) for r in stored.ranges] == [(1, 1)]
    await second.release()
