"""Fault tests with real processes: kill -9 the owner hub, kill -9 a bookie, 10 000 subscriptions."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from hub import errors
from hub.client import HedwigClient, Message
from tools.cluster import LocalCluster

from .conftest import HUB_CONF

pytestmark = pytest.mark.slow


class Acks(list[int]):
    """Seq ids of acknowledged publishes; ``reach(n)`` waits until there are ``n``."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Event()

    def add(self, seq: int) -> None:
        self.append(seq)
        self.changed.set()

    async def reach(self, n: int, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while len(self) < n:
                self.changed.clear()
                await self.changed.wait()


async def publish_until(c: HedwigClient, topic: bytes, stop: asyncio.Event, acked: Acks) -> None:
    i = 0
    while not stop.is_set():
        i += 1
        with contextlib.suppress(errors.PubSubError):
            acked.add(await c.publish(topic, b"m%d" % i))


@pytest.mark.parametrize("cas", ["false", "true"])
async def test_kill_owner_hub_during_publishes(tmp_path: Path, cas: str) -> None:
    overrides = dict(HUB_CONF, metadata_manager_based_topic_manager_enabled=cas)
    async with LocalCluster(bookies=3, hubs=2, data_dir=tmp_path, conf_overrides=overrides) as cluster:
        addrs = ",".join(cluster.hub_addresses)
        topic = b"fault-topic"
        conf = {"server_ack_response_timeout": "20000", "consumed_messages_buffer_size": "1"}
        async with await HedwigClient.connect(addrs, conf=conf) as pub, \
                await HedwigClient.connect(addrs, conf=conf) as sub:
            await sub.subscribe(topic, b"s")
            got: list[Message] = []
            arrived = asyncio.Event()

            async def handler(t: bytes, s: bytes, m: Message) -> None:
                got.append(m)
                arrived.set()

            await sub.start_delivery(topic, b"s", handler)
            stop = asyncio.Event()
            acked = Acks()
            task = asyncio.create_task(publish_until(pub, topic, stop, acked))
            await acked.reach(30, 20)
            owner = pub.owner[topic]
            await cluster.kill_hub(cluster.hub_addresses.index(owner))
            before = len(acked)
            await acked.reach(before + 30, 30)
            stop.set()
            await task
            async with asyncio.timeout(30):
                while not got or got[-1].seq_id < max(acked):
                    arrived.clear()
                    await arrived.wait()
            seqs = [m.seq_id for m in got]
            assert seqs == list(range(1, seqs[-1] + 1)), "in order, dense, no duplicates"
            assert set(acked) <= set(seqs), "every acknowledged publish is delivered"


async def test_kill_a_bookie_during_publishes(tmp_path: Path) -> None:
    async with LocalCluster(bookies=3, hubs=1, data_dir=tmp_path, conf_overrides=HUB_CONF) as cluster:
        topic = b"bookie-fault"
        async with await HedwigClient.connect(cluster.hub_addresses[0],
                                              conf={"server_ack_response_timeout": "30000"}) as c:
            await c.subscribe(topic, b"all")      # starts before the first message
            await c.close_subscription(topic, b"all")
            stop = asyncio.Event()
            acked = Acks()
            task = asyncio.create_task(publish_until(c, topic, stop, acked))
            await acked.reach(20, 20)
            await cluster.kill_bookie(0)
            before = len(acked)
            await acked.reach(before + 20, 60)
            stop.set()
            await asyncio.wait_for(task, 60)           # in-flight publishes finished: none hangs
            assert acked == sorted(acked) and len(set(acked)) == len(acked)
        async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
            got: list[int] = []
            done = asyncio.Event()

            async def handler(t: bytes, s: bytes, m: Message) -> None:
                got.append(m.seq_id)
                if m.seq_id >= max(acked):
                    done.set()

            await c.subscribe(topic, b"all", create_or_attach="ATTACH")
            await c.start_delivery(topic, b"all", handler)
            await asyncio.wait_for(done.wait(), 30)
            assert set(acked) <= set(got)


async def test_ten_thousand_subscriptions_on_one_connection(tmp_path: Path) -> None:
    # a 5 s metastore session (not 1 s): 10 000 subscribes keep the hub's loop busy, and on a loaded machine
    # (a full suite on 2 shared cores) its lease heartbeat starved past 1 s: "session is lost; retry"
    conf = dict(HUB_CONF, zk_timeout="5000")
    async with LocalCluster(bookies=3, hubs=1, data_dir=tmp_path, conf_overrides=conf) as cluster:
        async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
            topics = [b"many-%d" % (i % 10) for i in range(10)]
            for t in topics:
                await c.publish(t, b"claim")
            sem = asyncio.Semaphore(500)

            async def one(i: int) -> None:
                async with sem:
                    await c.subscribe(topics[i % 10], b"sub-%d" % i)

            async with asyncio.timeout(240):
                await asyncio.gather(*(one(i) for i in range(10_000)))
            assert len(c.conns) == 1
            got: list[bytes] = []
            done = asyncio.Event()

            async def handler(t: bytes, s: bytes, m: Message) -> None:
                got.append(s)
                done.set()

            await c.start_delivery(topics[3], b"sub-9993", handler)
            await c.publish(topics[3], b"hello")
            await asyncio.wait_for(done.wait(), 20)
            assert got == [b"sub-9993"]


async def test_publish_without_enough_bookies_is_service_down_then_recovers(tmp_path: Path) -> None:
    async with LocalCluster(bookies=2, hubs=1, data_dir=tmp_path, conf_overrides=HUB_CONF) as cluster:
        topic = b"no-quorum"
        async with await HedwigClient.connect(cluster.hub_addresses[0],
                                              conf={"server_ack_response_timeout": "20000"}) as c:
            assert await c.publish(topic, b"first") == 1
            await cluster.kill_bookie(0)
            with pytest.raises(errors.ServiceDownError):
                async with asyncio.timeout(60):
                    await c.publish(topic, b"not durable")
            await cluster.restart_bookie(0)
            seq = await c.publish(topic, b"durable again")
            assert seq == 2                  # the failed publish left no gap and no trace
