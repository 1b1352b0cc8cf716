"""Consumed-ledger deletion, retention release and re-acquisition (real processes)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bookie.client import BookKeeper
from bookie.errors import BKError
from hub.client import HedwigClient, Message
from hub.errors import UncertainStateError
from hub.proto import pubsub_pb2 as pb
from metastore import open_metastore
from metastore.errors import NoKeyError
from tests.fixtures.polling import eventually
from tests.fixtures.standalone import quire_standalone
from tools.cluster import LocalCluster

from .conftest import HUB_CONF


@pytest.mark.slow
async def test_consumed_ledgers_deleted_idle_topic_released_then_reacquired(tmp_path: Path) -> None:
    conf = dict(HUB_CONF, max_entries_per_ledger="2", messages_consumed_thread_run_interval="300",
                retention_secs="1")
    async with LocalCluster(bookies=3, hubs=1, data_dir=tmp_path, conf_overrides=conf) as cluster:
        ms = await open_metastore(cluster.metastore_uri)
        bk = await BookKeeper.connect(ms)
        try:
            persistence = await ms.create_table("topic_persistence")
            owners = await ms.create_table("topic_owners")
            topic = b"lifecycle"
            async with await HedwigClient.connect(cluster.hub_addresses[0],
                                                  conf={"consumed_messages_buffer_size": "1"}) as c:
                await c.subscribe(topic, b"s")
                got: list[int] = []
                done = asyncio.Event()

                async def handler(t: bytes, s: bytes, m: Message) -> None:
                    got.append(m.seq_id)
                    if m.seq_id == 10:
                        done.set()

                for i in range(10):
                    await c.publish(topic, b"%d" % i)      # one entry each: 5 ledgers of 2 entries
                # the ledgers before anything is consumed (the consumed-ledger timer trims as delivery goes on)
                first = pb.LedgerRanges.FromString((await persistence.get("lifecycle")).value["data"] or b"")
                old_ids = [r.ledgerId for r in first.ranges[:-1]]
                assert len(first.ranges) >= 4
                await c.start_delivery(topic, b"s", handler)
                await asyncio.wait_for(done.wait(), 20)

                async def trimmed() -> bool:
                    ranges = pb.LedgerRanges.FromString((await persistence.get("lifecycle")).value["data"] or b"")
                    return len(ranges.ranges) == 1

                # while the subscriber is attached, so that the idle release (retention_secs) cannot come first:
                # a released topic's consumed ledgers wait for its next owner (under load the hub's timer, 300 ms,
                # could slip past the 1 s of idleness and release it before trimming)
                await eventually(trimmed)

                async def deleted() -> bool:    # the hub trims the record first, then deletes the ledgers
                    for lid in old_ids:
                        try:
                            await bk.open_ledger_no_recovery(lid)
                            return False
                        except BKError:
                            pass
                    return True

                await eventually(deleted)
                assert await owners.get("lifecycle")        # still owned: nothing idle yet
                await c.close_subscription(topic, b"s")

            async def released() -> bool:
                try:
                    await owners.get("lifecycle")
                except NoKeyError:
                    return True
                return False

            await eventually(released)
            async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
                assert await c.publish(topic, b"again") == 11     # dense across release and re-acquisition
        finally:
            await bk.close()
            await ms.close()


@pytest.mark.slow
async def test_clean_owner_stop_hands_the_topic_over_and_subscribers_follow(tmp_path: Path) -> None:
    async with LocalCluster(bookies=3, hubs=2, data_dir=tmp_path, conf_overrides=HUB_CONF) as cluster:
        addrs = ",".join(cluster.hub_addresses)
        topic = b"handover"
        async with await HedwigClient.connect(addrs) as pub, await HedwigClient.connect(addrs) as sub:
            await sub.subscribe(topic, b"s")
            await sub.subscribe(topic, b"late")            # reads everything after the handover
            await sub.close_subscription(topic, b"late")
            got: list[int] = []
            cond = asyncio.Condition()

            async def handler(t: bytes, s: bytes, m: Message) -> None:
                async with cond:
                    got.append(m.seq_id)
                    cond.notify_all()

            await sub.start_delivery(topic, b"s", handler)
            assert [await pub.publish(topic, b"%d" % i) for i in range(5)] == [1, 2, 3, 4, 5]
            owner = cluster.hub_addresses.index(pub.owner[topic])
            await cluster.stop_hub(owner)                   # SIGTERM: the topic is released at once
            assert [await pub.publish(topic, b"%d" % i) for i in range(5, 8)] == [6, 7, 8]
            assert pub.owner[topic] == cluster.hub_addresses[1 - owner]
            async with asyncio.timeout(20), cond:
                await cond.wait_for(lambda: len(got) >= 8)
            assert got == list(range(1, 9))
            await sub.subscribe(topic, b"late", create_or_attach="ATTACH")
            late: list[bytes] = []
            done = asyncio.Event()

            async def late_handler(t: bytes, s: bytes, m: Message) -> None:
                late.append(m.body)
                if len(late) == 8:
                    done.set()

            await sub.start_delivery(topic, b"late", late_handler)   # the old owner's ledgers, read back
            await asyncio.wait_for(done.wait(), 20)
            assert late == [b"%d" % i for i in range(8)]
            await cluster.restart_hub(owner)
            assert cluster.hub_pid(owner) is not None
        async with await HedwigClient.connect(cluster.hub_addresses[owner]) as c:
            assert await c.publish(topic, b"via the restarted hub") == 9


@pytest.mark.slow
@pytest.mark.zookeeper
async def test_hubs_on_zookeeper_ephemeral_ownership(tmp_path: Path) -> None:
    async with LocalCluster(bookies=3, hubs=2, metastore="zookeeper", data_dir=tmp_path,
                            conf_overrides=HUB_CONF) as cluster:
        addrs = ",".join(cluster.hub_addresses)
        async with await HedwigClient.connect(addrs) as c:
            assert [await c.publish(b"zk-topic", b"%d" % i) for i in range(3)] == [1, 2, 3]
            owner = cluster.hub_addresses.index(c.owner[b"zk-topic"])
            await cluster.kill_hub(owner)          # its ZooKeeper session expires; the other hub claims
            assert await c.publish(b"zk-topic", b"after") == 4


@pytest.mark.slow
async def test_quire_standalone_serves_pub_sub(tmp_path: Path) -> None:
    async with quire_standalone("--bookies", "3", "--hub-port", "0", "--data", str(tmp_path / "sa")) as lines:
        (hub_line,) = [x for x in lines if x.startswith("hub ")]
        async with await HedwigClient.connect(hub_line.split()[1]) as c:
            await c.subscribe(b"greetings", b"me")
            got: list[Message] = []
            done = asyncio.Event()

            async def handler(topic: bytes, sub: bytes, m: Message) -> None:
                got.append(m)
                done.set()

            await c.start_delivery(b"greetings", b"me", handler)
            assert await c.publish(b"greetings", b"hello, quire") == 1
            await asyncio.wait_for(done.wait(), 20)
            assert (got[0].seq_id, got[0].body, got[0].src_region) == (1, b"hello, quire", "standalone")


@pytest.mark.slow
async def test_hubs_on_the_hbase_metastore(tmp_path: Path) -> None:
    async with LocalCluster(bookies=3, hubs=1, metastore="hbase", data_dir=tmp_path,
                            conf_overrides=HUB_CONF) as cluster:
        async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
            await c.subscribe(b"hb", b"s")
            assert [await c.publish(b"hb", b"%d" % i) for i in range(3)] == [1, 2, 3]


@pytest.mark.slow
async def test_owner_stop_under_load_answers_in_flight_publishes_and_stores_nothing_twice(tmp_path: Path) -> None:
    """SIGTERM of the owner while publishers keep 4 publishes in flight (plain clients, no producer
    deduplication): the hub releases its topics before it closes the connections, so every publish it
    read is answered; one sent as the connection closes is uncertain to the client, and asking it again
    must not store it twice. Every acknowledged body is stored exactly once."""
    async with LocalCluster(bookies=3, hubs=2, data_dir=tmp_path, conf_overrides=HUB_CONF) as cluster:
        addrs = ",".join(cluster.hub_addresses)
        topic = b"stop-under-load"
        async with await HedwigClient.connect(addrs) as sub:
            await sub.subscribe(topic, b"all")
            await sub.close_subscription(topic, b"all")
        acked: list[bytes] = []
        stop = asyncio.Event()
        enough = asyncio.Event()
        target = [200]        # acknowledgements to wait for: before the stop, then through the other hub

        async def publisher(n: int, pub: HedwigClient) -> None:
            i = 0
            while not stop.is_set():
                body = b"%d-%d" % (n, i)
                try:
                    await pub.publish(topic, body)
                except UncertainStateError:
                    # sent as the hub closed the connection after its last answers: never read, so never
                    # stored; asked again (had the hub stored it, the check below finds it twice)
                    await pub.publish(topic, body)
                acked.append(body)
                i += 1
                if len(acked) >= target[0]:
                    enough.set()

        async with await HedwigClient.connect(addrs) as pub:
            await pub.publish(topic, b"first")
            acked.append(b"first")
            owner = cluster.hub_addresses.index(pub.owner[topic])
            tasks = [asyncio.create_task(publisher(n, pub)) for n in range(4)]
            await asyncio.wait_for(enough.wait(), 30)
            await cluster.stop_hub(owner)                    # SIGTERM while publishes are in flight
            target[0] = len(acked) + 100                     # publishing goes on through the other hub
            enough.clear()
            await asyncio.wait_for(enough.wait(), 30)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
        async with await HedwigClient.connect(cluster.hub_addresses[1 - owner]) as sub:
            stored: list[bytes] = []
            done = asyncio.Event()

            async def handler(t: bytes, s: bytes, m: Message) -> None:
                stored.append(m.body)
                if set(acked) <= set(stored):
                    done.set()

            await sub.subscribe(topic, b"all", create_or_attach="ATTACH")
            await sub.start_delivery(topic, b"all", handler)
            await asyncio.wait_for(done.wait(), 30)
        twice = sorted({b for b in stored if stored.count(b) > 1})
        assert not twice, f"stored more than once: {twice[:10]} ({len(twice)} bodies)"
        assert set(acked) <= set(stored)
