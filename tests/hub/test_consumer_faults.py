"""A SHARED work queue under faults (real processes), checked by tests/partition/checker.check_queue.

Cases: kill -9 of the owner hub with 4 consumers mid-stream; a consumer whose connection is cut; a
clean hub restart with acknowledgements outstanding beyond the first unacknowledged message.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from hub import errors
from hub.client import Consumer, HedwigClient
from tests.partition.checker import QUEUE_GUARANTEE, check_queue
from tools.cluster import LocalCluster

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

ACK_PERSIST_MS = 200
CONF = {"bk_ensemble_size": "2", "bk_write_quorum_size": "2", "bk_ack_quorum_size": "2", "zk_timeout": "1000",
        "session_timeout": "1000", "consume_interval": "20", "ack_persist_interval_ms": str(ACK_PERSIST_MS),
        "rebalance_interval_sec": "0"}
TOTAL = 300


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(bookies=3, hubs=2, data_dir=tmp_path_factory.mktemp("queuefaults"),
                            conf_overrides=CONF) as c:
        yield c


async def run_queue(cluster: LocalCluster, fault: Callable[[bytes, list[HedwigClient], list[dict[str, Any]]],
                                                         Awaitable[None]], tmp: Path) -> None:
    """4 SHARED consumers (one client each) work through TOTAL messages; ``fault`` strikes after a third."""
    topic, sub = uuid.uuid4().hex[:10].encode(), b"workers"
    addresses = ",".join(cluster.hub_addresses)
    ops: list[dict[str, Any]] = []
    rng = random.Random(29)
    third = asyncio.Event()
    done = asyncio.Event()
    acked: set[int] = set()
    publisher = await HedwigClient.connect(addresses, conf={"producer_name": "queue-producer",
                                                            "server_ack_response_timeout": "15000"})
    clients = [await HedwigClient.connect(addresses, conf={"server_ack_response_timeout": "15000"})
               for _ in range(4)]
    consumers = [await c.consumer(topic, sub, subscription_type="SHARED", receiver_queue_size=20) for c in clients]

    async def work(i: int, cons: Consumer) -> None:
        name = f"c{i}"
        while True:
            try:
                msg = await cons.receive()
            except errors.ConsumerClosedError:
                return
            ops.append({"op": "recv", "consumer": name, "seq": msg.seq_id, "t": time.monotonic(),
                        "count": msg.redelivery_count})
            await asyncio.sleep(rng.random() * 0.003)
            try:
                await cons.ack(msg)
            except errors.PubSubError:
                continue     # reset while held (not expected here), or closed
            ops.append({"op": "acked", "consumer": name, "seq": msg.seq_id, "t": time.monotonic()})
            acked.add(msg.seq_id)
            if len(acked) >= TOTAL // 3:
                third.set()
            if len(acked) >= TOTAL:
                done.set()

    async def produce() -> None:
        for n in range(TOTAL):
            seq = await publisher.publish(topic, f"m{n}".encode())
            ops.append({"op": "ack", "seq": seq, "producer": "p", "n": n, "body": f"m{n}"})

    workers = [asyncio.create_task(work(i, cons)) for i, cons in enumerate(consumers)]
    producer = asyncio.create_task(produce())
    try:
        await asyncio.wait_for(third.wait(), 60)
        await fault(topic, clients, ops)
        await asyncio.wait_for(producer, 60)
        await asyncio.wait_for(done.wait(), 90)
    finally:
        (tmp / "history.jsonl").write_text("".join(json.dumps(o) + "\n" for o in ops))
        for w in workers:
            w.cancel()
        producer.cancel()
        for c in [publisher, *clients]:
            await c.close()
    v = check_queue(ops, ack_slack=ACK_PERSIST_MS / 1000.0 + 1.0)
    assert v.ok, f"{QUEUE_GUARANTEE}:\n  " + "\n  ".join(v.problems[:20]) + f"\n{v.summary()} (history in {tmp})"
    assert v.published == TOTAL


async def test_kill_9_of_the_owner_with_four_shared_consumers(cluster: LocalCluster, tmp_path: Path) -> None:
    killed: list[int] = []

    async def kill_owner(topic: bytes, clients: list[HedwigClient], ops: list[dict[str, Any]]) -> None:
        owner = cluster.hub_addresses.index(clients[0].owner[topic])
        fault = {"op": "fault", "kind": "owner", "t": time.monotonic()}
        ops.append(fault)
        await cluster.kill_hub(owner)
        fault["until"] = time.monotonic()  # the owner hands out messages until the kill lands; their acks may be lost
        killed.append(owner)

    try:
        await run_queue(cluster, kill_owner, tmp_path)
    finally:
        for i in killed:
            await cluster.restart_hub(i)


async def test_a_consumer_cut_off_hands_its_messages_to_the_others(cluster: LocalCluster, tmp_path: Path) -> None:
    async def cut(topic: bytes, clients: list[HedwigClient], ops: list[dict[str, Any]]) -> None:
        ops.append({"op": "fault", "kind": "consumer", "consumer": "c1", "t": time.monotonic()})
        for conn in list(clients[1].conns.values()):
            conn.drop("test: the consumer is cut off")

    await run_queue(cluster, cut, tmp_path)


async def test_a_hub_restart_keeps_acks_beyond_the_first_unacknowledged(cluster: LocalCluster,
                                                                         tmp_path: Path) -> None:
    stopped: list[int] = []

    async def restart(topic: bytes, clients: list[HedwigClient], ops: list[dict[str, Any]]) -> None:
        owner = cluster.hub_addresses.index(clients[0].owner[topic])
        fault = {"op": "fault", "kind": "owner", "t": time.monotonic()}
        ops.append(fault)
        await cluster.stop_hub(owner)      # a clean stop persists every subscription's acks ...
        fault["until"] = time.monotonic()  # ... and acks arriving while it stops may be lost (at least once)
        stopped.append(owner)
        await cluster.restart_hub(owner)
        stopped.clear()

    try:
        await run_queue(cluster, restart, tmp_path)
    finally:
        for i in stopped:
            await cluster.restart_hub(i)


async def test_acks_beyond_the_first_unacknowledged_survive_a_kill_9_once_persisted(cluster: LocalCluster) -> None:
    """Within ack_persist_interval_ms the owner stores the acked ranges; an owner killed after that does not
    hand the acknowledged messages out again."""
    from hub.metadata import SubscriptionDataManager
    from metastore import open_metastore
    from tests.fixtures.polling import eventually

    topic, sub = uuid.uuid4().hex[:10].encode(), b"w"
    addresses = ",".join(cluster.hub_addresses)
    store = await open_metastore(cluster.metastore_uri)
    killed: list[int] = []
    try:
        subs = SubscriptionDataManager(store)
        await subs.start()
        async with await HedwigClient.connect(addresses, conf={"server_ack_response_timeout": "15000"}) as c:
            consumer = await c.consumer(topic, sub, subscription_type="SHARED")
            for i in range(10):
                await c.publish(topic, str(i).encode())
            got = [await consumer.receive(timeout=20) for _ in range(10)]
            for m in got:
                if m.seq_id % 2 == 0:       # 1 stays unacknowledged: the pointer cannot move
                    await consumer.ack(m)

            async def stored() -> Any:
                found = await subs.read_subscription_data(topic, sub)
                ranges = [(r.first, r.last) for r in found[0].state.ackedRanges] if found else []
                return ranges if len(ranges) == 5 else None

            assert await eventually(stored, timeout=10) == [(2, 2), (4, 4), (6, 6), (8, 8), (10, 10)]
            owner = cluster.hub_addresses.index(c.owner[topic])
            await cluster.kill_hub(owner)
            killed.append(owner)
            again = sorted([(await consumer.receive(timeout=30)).seq_id for _ in range(5)])
            assert again == [1, 3, 5, 7, 9]
            with pytest.raises(TimeoutError):
                await consumer.receive(timeout=0.5)
            await consumer.close()
    finally:
        await store.close()
        for i in killed:
            await cluster.restart_hub(i)
