"""Exactly-once publishing (producer deduplication) on real hub and bookie processes."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from bookie.client import BookKeeper
from hub import errors
from hub.client import HedwigClient
from hub.metadata import TopicPersistenceManager
from hub.persistence import decode_batch
from metastore import open_metastore
from tools.cluster import LocalCluster

in_cluster = pytest.mark.asyncio(loop_scope="module")
CONF = {"bk_ensemble_size": "2", "bk_write_quorum_size": "2", "bk_ack_quorum_size": "2", "zk_timeout": "1000",
        "session_timeout": "1000", "max_entries_per_ledger": "7", "dedup_window": "12",
        "dedup_snapshot_interval": "4"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(bookies=2, hubs=2, data_dir=tmp_path_factory.mktemp("once"),
                            conf_overrides=CONF) as c:
        yield c


def topic_name() -> bytes:
    return uuid.uuid4().hex.encode()


async def stored_bodies(cluster: LocalCluster, topic: bytes) -> list[bytes]:
    """Every message body of ``topic`` in its ledgers, in seq-id order (its ledgers must be closed)."""
    store = await open_metastore(cluster.metastore_uri)
    bk = await BookKeeper.connect(store)
    try:
        pm = TopicPersistenceManager(store)
        await pm.start()
        got = await pm.read_topic_persistence_info(topic)
        assert got is not None
        out: list[bytes] = []
        for r in got[0].ranges:
            assert r.HasField("endSeqIdIncluded")
            rh = await bk.open_ledger(r.ledgerId)
            async for e in rh.read(0, rh.last_add_confirmed):
                for m in decode_batch(e.data):
                    assert m.msgId.localComponent == len(out) + 1    # dense seq ids
                    out.append(m.body)
            await rh.close()
        return out
    finally:
        await bk.close()
        await store.close()


@in_cluster
async def test_a_duplicate_is_answered_with_the_original_seq_id(cluster: LocalCluster) -> None:
    topic = topic_name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        first = await c.publish(topic, b"order 42", producer=b"orders-1", sequence_id=42)
        assert await c.publish(topic, b"plain") == first + 1                  # no producer: no dedup
        assert await c.publish(topic, b"order 42", producer=b"orders-1", sequence_id=42) == first
        assert await c.publish(topic, b"other 42", producer=b"orders-2", sequence_id=42) == first + 2
        assert await c.publish(topic, b"order 43", producer=b"orders-1", sequence_id=43) == first + 3
        for sid in range(44, 56):                                              # dedup_window=12
            await c.publish(topic, b"order %d" % sid, producer=b"orders-1", sequence_id=sid)
        assert await c.publish(topic, b"order 45", producer=b"orders-1", sequence_id=45) == first + 5
        with pytest.raises(errors.DuplicatePublishError, match="orders-1"):
            await c.publish(topic, b"order 43", producer=b"orders-1", sequence_id=43)   # older than the window
        with pytest.raises(errors.DuplicatePublishError):
            await c.publish(topic, b"order 41", producer=b"orders-1", sequence_id=41)   # below the floor
        with pytest.raises(ValueError):
            await c.publish(topic, b"x", sequence_id=1)


@in_cluster
async def test_dedup_state_moves_with_the_topic(cluster: LocalCluster) -> None:
    topic = topic_name()
    async with await HedwigClient.connect(",".join(cluster.hub_addresses), conf={"producer_name": "app-7"}) as c:
        seqs = [await c.publish(topic, b"m%d" % i, producer=b"p", sequence_id=i) for i in range(10)]
        owner = cluster.hub_addresses.index(c.owner[topic])
    await cluster.stop_hub(owner)           # clean release: the other hub acquires from snapshot + log tail
    try:
        async with await HedwigClient.connect(cluster.hub_addresses[1 - owner]) as c2:
            for i in (5, 9):                # before and after the last snapshot (every 4 messages)
                assert await c2.publish(topic, b"again", producer=b"p", sequence_id=i) == seqs[i]
            assert await c2.publish(topic, b"m10", producer=b"p", sequence_id=10) == seqs[-1] + 1
    finally:
        await cluster.restart_hub(owner)


@in_cluster
async def test_producer_name_numbers_publishes_and_a_restarted_client_goes_on_above(cluster: LocalCluster) -> None:
    topic = topic_name()
    for _ in range(2):                      # a second client with the same producer_name is not refused
        async with await HedwigClient.connect(cluster.hub_addresses[0], conf={"producer_name": "orders"}) as c:
            await asyncio.gather(*(c.publish(topic, b"x") for _ in range(5)))
            assert c.owner[topic]


@in_cluster
async def test_kill_9_of_the_owner_during_retried_publishes_stores_none_twice(
        cluster: LocalCluster, caplog: pytest.LogCaptureFixture) -> None:
    topic = topic_name()
    n = 80
    conf = {"producer_name": "orders-1", "server_ack_response_timeout": "30000"}
    async with await HedwigClient.connect(",".join(cluster.hub_addresses), conf=conf) as c:
        await c.publish(topic, b"body-start")
        owner = cluster.hub_addresses.index(c.owner[topic])
        acked = 0
        twenty = asyncio.Event()

        async def one(i: int) -> int:
            nonlocal acked
            seq = await c.publish(topic, b"body-%d" % i)
            acked += 1
            if acked == 20:
                twenty.set()
            return seq

        async def publisher() -> list[int]:
            out: list[int] = []
            for start in range(0, n, 10):   # ten in flight at a time: some are in flight at the kill
                out += await asyncio.gather(*(one(i) for i in range(start, start + 10)))
            return out

        task = asyncio.create_task(publisher())
        await asyncio.wait_for(twenty.wait(), 30)
        with caplog.at_level("INFO", logger="hub.client"):
            await cluster.kill_hub(owner)
            seqs = await asyncio.wait_for(task, 120)
        assert len(set(seqs)) == n
        assert any("asking again" in r.getMessage() for r in caplog.records)   # answers were lost and re-asked
    await cluster.restart_hub(owner)
    await cluster.stop_hub(1 - owner)        # release the topic: its ledgers closed, to be read back
    try:
        async with await HedwigClient.connect(cluster.hub_addresses[owner]) as c:
            await c.publish(topic, b"body-end")
        await cluster.stop_hub(owner)
        bodies = await stored_bodies(cluster, topic)
        assert bodies[0] == b"body-start" and bodies[-1] == b"body-end"
        middle = bodies[1:-1]
        assert sorted(middle) == sorted(b"body-%d" % i for i in range(n))   # each exactly once
        assert [middle.index(b"body-%d" % i) + 2 for i in range(n)] == seqs  # where each answer said
    finally:
        for i in range(2):
            if cluster.hub_pid(i) is None:
                await cluster.restart_hub(i)
