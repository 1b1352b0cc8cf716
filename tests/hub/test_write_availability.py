"""Write availability on real processes: a hub keeps publishing through a bookie's loss when the ack quorum
holds (``delay_ensemble_change``), and backs off instead of churning ledgers when it cannot start one."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from bookie.metadata import LedgerMetadataManager
from hub import errors
from hub.client import HedwigClient, Message
from hub.metadata import TopicPersistenceManager
from metastore import open_metastore
from tools.cluster import LocalCluster

pytestmark = pytest.mark.asyncio(loop_scope="function")
BASE = {"zk_timeout": "1000", "session_timeout": "1000"}


async def test_e3_w3_a2_hub_keeps_publishing_through_a_bookie_loss(tmp_path: Path) -> None:
    bk_conf = tmp_path / "bk_client.conf"
    bk_conf.write_text("delay_ensemble_change=true\nbookie_watch_interval_ms=200\n")
    conf = {**BASE, "bk_ensemble_size": "3", "bk_write_quorum_size": "3", "bk_ack_quorum_size": "2",
            "bk_client_conf": str(bk_conf)}
    async with LocalCluster(bookies=3, hubs=1, data_dir=tmp_path / "c", conf_overrides=conf) as cluster:
        topic = uuid.uuid4().hex.encode()
        got: asyncio.Queue[Message] = asyncio.Queue()

        async def handler(t: bytes, s: bytes, m: Message) -> None:
            got.put_nowait(m)

        async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
            await c.subscribe(topic, b"s")
            await c.start_delivery(topic, b"s", handler)
            assert [await c.publish(topic, b"%d" % i) for i in range(5)] == [1, 2, 3, 4, 5]
            await cluster.kill_bookie(1)
            # no spare bookie: without delay_ensemble_change these would fail with ServiceDownError
            assert [await c.publish(topic, b"%d" % i) for i in range(5, 25)] == list(range(6, 26))
            bodies = []
            for _ in range(25):
                bodies.append((await asyncio.wait_for(got.get(), 20)).body)
            assert bodies == [b"%d" % i for i in range(25)]


async def test_a_hub_without_enough_bookies_backs_off_and_leaves_no_empty_ledgers(tmp_path: Path) -> None:
    bk_conf = tmp_path / "bk_client.conf"
    bk_conf.write_text("ledger_id_block_size=1\n")     # every ledger the hub tries reserves one id
    conf = {**BASE, "bk_ensemble_size": "3", "bk_write_quorum_size": "2", "bk_ack_quorum_size": "2",
            "ledger_create_backoff_ms": "200", "ledger_create_backoff_max_ms": "1000",
            "bk_client_conf": str(bk_conf)}
    async with LocalCluster(bookies=3, hubs=1, data_dir=tmp_path / "c", conf_overrides=conf) as cluster:
        topic = uuid.uuid4().hex.encode()
        store = await open_metastore(cluster.metastore_uri)
        try:
            ledgers = await LedgerMetadataManager.open(store)

            async def allocated() -> int:
                return await ledgers.ids.reserved()

            async with await HedwigClient.connect(cluster.hub_addresses[0],
                                                  conf={"server_ack_response_timeout": "4000"}) as c:
                assert [await c.publish(topic, b"%d" % i) for i in range(5)] == [1, 2, 3, 4, 5]
                before = await allocated()
                await cluster.kill_bookie(0)            # E3 needs three bookies: no ledger can be written
                t0 = asyncio.get_running_loop().time()
                stored = 5           # an entry whose write set misses the dead bookie still succeeds
                with pytest.raises(errors.ServiceDownError) as info:
                    for _ in range(50):                   # the client retries each for up to 4 s
                        assert await c.publish(topic, b"maybe") == stored + 1
                        stored += 1
                assert asyncio.get_running_loop().time() - t0 < 30
                failures = [info.value]
                # short probes: one that finds the backoff over makes the hub try (and fail) again, which
                # on a busy machine may outlast the probe; a later one lands in the new backoff
                async with await HedwigClient.connect(cluster.hub_addresses[0],
                                                      conf={"server_ack_response_timeout": "300"}) as probe:
                    for _ in range(4):
                        if any("next attempt in" in str(e) for e in failures):
                            break
                        with pytest.raises((errors.ServiceDownError, errors.ResponseTimeoutError)) as more:
                            await probe.publish(topic, b"lost")
                        failures.append(more.value)
                assert any("next attempt in" in str(e) for e in failures), [str(e) for e in failures]
                # ~12 s of retried publishes every 50 ms: bounded exponential backoff tries a handful of
                # ledgers (each abandoned one deleted), not one per publish
                assert await allocated() - before <= 12
                ids = await ledgers.ledger_ids()
                pm = TopicPersistenceManager(store)
                await pm.start()
                ranges = await pm.read_topic_persistence_info(topic)
                assert ranges is not None
                kept = [r.ledgerId for r in ranges[0].ranges]
                assert set(kept) <= ids and len(kept) == 1          # the ledger of the stored messages only
                for ledger_id in ids - set(kept):                     # anything else: still being closed
                    md, _ = await ledgers.read(ledger_id)
                    assert md.last_entry_id >= 1 or not md.is_closed
                await cluster.restart_bookie(0)
                assert await c.publish(topic, b"back") == stored + 1   # dense seq ids once bookies return
        finally:
            await store.close()
