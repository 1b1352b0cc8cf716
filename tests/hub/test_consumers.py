"""Consumers (DESIGN 6b) end to end with real hub and bookie processes: types, acks, redelivery, flow, DLQ."""

from __future__ import annotations

import asyncio
import random
import time
import uuid

import aiohttp
import pytest

from hub import errors
from hub.client import Consumer, HedwigClient, Message
from tools.cluster import LocalCluster

from .conftest import hub_url

pytestmark = pytest.mark.asyncio(loop_scope="module")

TIMEOUT = 20.0


def name() -> bytes:
    return uuid.uuid4().hex[:10].encode()


async def drain(consumer: Consumer, n: int, *, ack: bool = True, timeout: float = TIMEOUT) -> list[Message]:
    """Receive ``n`` messages (acking each unless told not to)."""
    got = []
    async with asyncio.timeout(timeout):
        while len(got) < n:
            msg = await consumer.receive()
            got.append(msg)
            if ack:
                await consumer.ack(msg)
    return got


async def nothing_more(consumer: Consumer, wait: float = 0.5) -> None:
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout=wait)


async def test_messages_carry_key_publish_time_and_redelivery_count(cluster: LocalCluster) -> None:
    topic, sub = name(), name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        consumer = await c.consumer(topic, sub, subscription_type="SHARED")
        async with consumer:
            await c.publish(topic, b"a", key=b"user-7", properties={"p": b"1"})
            await c.publish(topic, b"b")
            first, second = await drain(consumer, 2, ack=False)
            assert (first.body, first.key, first.properties) == (b"a", b"user-7", {"p": b"1"})
            assert first.redelivery_count == 0 and second.key is None
            assert abs(first.publish_time_ms - time.time() * 1000) < 60_000
            await consumer.ack(first)
            await consumer.ack(second)
        # a Hedwig subscriber sees the same fields
        await c.subscribe(topic, b"h" + sub)
        got: list[Message] = []
        done = asyncio.Event()

        async def handler(t: bytes, s: bytes, m: Message) -> None:
            got.append(m)
            done.set()

        await c.start_delivery(topic, b"h" + sub, handler)
        await c.publish(topic, b"c", key=b"k")
        await asyncio.wait_for(done.wait(), TIMEOUT)
        assert got[0].key == b"k" and got[0].publish_time_ms > 0


async def test_shared_round_robin_each_message_to_one_consumer(cluster: LocalCluster) -> None:
    topic, sub = name(), name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        a = await c.consumer(topic, sub, subscription_type="SHARED", receiver_queue_size=10)
        b = await c.consumer(topic, sub, subscription_type="SHARED", receiver_queue_size=10)
        for i in range(40):
            await c.publish(topic, str(i).encode())
        got_a: list[Message] = []
        got_b: list[Message] = []
        all_in = asyncio.Event()

        async def run(cons: Consumer, out: list[Message]) -> None:
            while True:
                msg = await cons.receive()
                out.append(msg)
                await cons.ack(msg)
                if len(got_a) + len(got_b) >= 40:
                    all_in.set()

        tasks = [asyncio.create_task(run(a, got_a)), asyncio.create_task(run(b, got_b))]
        await asyncio.wait_for(all_in.wait(), TIMEOUT)
        for t in tasks:
            t.cancel()
        seqs = sorted(m.seq_id for m in got_a + got_b)
        assert seqs == list(range(1, 41))
        assert got_a and got_b, "both consumers got messages"
        await nothing_more(a, 0.3)
        await a.close()
        await b.close()


async def test_type_is_stored_and_a_mismatch_is_refused(cluster: LocalCluster) -> None:
    topic, sub = name(), name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        consumer = await c.consumer(topic, sub, subscription_type="SHARED")
        await consumer.close()
        with pytest.raises(errors.SubscriptionTypeMismatchError) as info:
            await c.consumer(topic, sub, subscription_type="FAILOVER")
        assert info.value.status == "SUBSCRIPTION_TYPE_MISMATCH"
        with pytest.raises(errors.SubscriptionTypeMismatchError):
            await c.subscribe(topic, sub)             # a Hedwig (EXCLUSIVE) attach
        with pytest.raises(ValueError):
            await c.consumer(topic, sub, subscription_type="ROUND_ROBIN")
        # the hub keeps serving, and the subscription stays SHARED
        again = await c.consumer(topic, sub, subscription_type="SHARED")
        await c.publish(topic, b"x")
        assert (await drain(again, 1))[0].body == b"x"
        await again.close()
        # an EXCLUSIVE consumer refuses a second one, as a Hedwig attach does
        ex = await c.consumer(topic, b"ex" + sub)
        with pytest.raises(errors.PubSubError) as busy:
            await c.consumer(topic, b"ex" + sub)
        assert busy.value.status == "TOPIC_BUSY"
        await ex.close()


async def test_ack_errors_cumulative_on_shared_not_outstanding_and_after_close(cluster: LocalCluster) -> None:
    topic, sub = name(), name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        consumer = await c.consumer(topic, sub, subscription_type="SHARED")
        await c.publish(topic, b"m")
        (msg,) = await drain(consumer, 1, ack=False)
        with pytest.raises(errors.PubSubError) as cumulative:
            await consumer.ack_cumulative(msg)
        assert cumulative.value.status == "NOT_ALLOWED"
        await consumer.ack(msg)
        with pytest.raises(errors.PubSubError) as twice:
            await consumer.ack(msg)
        assert twice.value.status == "MESSAGE_NOT_OUTSTANDING"
        with pytest.raises(errors.PubSubError):
            await consumer.ack(Message(b"never", msg_id=msg.msg_id.__class__(999)))
        await consumer.close()
        with pytest.raises(errors.ConsumerClosedError):
            await consumer.ack(msg)
        with pytest.raises(errors.ConsumerClosedError):
            await consumer.receive(timeout=0.1)
        # the acked message is not delivered again
        again = await c.consumer(topic, sub, subscription_type="SHARED")
        await nothing_more(again)
        await again.close()


async def test_nack_and_a_closing_consumer_redeliver_with_counts(cluster: LocalCluster) -> None:
    topic, sub = name(), name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        a = await c.consumer(topic, sub, subscription_type="SHARED", negative_ack_redelivery_delay_ms=100)
        for i in range(3):
            await c.publish(topic, str(i).encode())
        got = await drain(a, 3, ack=False)
        await a.nack(got[0])
        again = await a.receive(timeout=TIMEOUT)
        assert (again.seq_id, again.redelivery_count) == (got[0].seq_id, 1)
        await a.ack(again)
        # a's two unacked messages go to b when a closes
        b = await c.consumer(topic, sub, subscription_type="SHARED")
        await a.close()
        moved = await drain(b, 2)
        assert sorted((m.seq_id, m.redelivery_count) for m in moved) == [(got[1].seq_id, 1), (got[2].seq_id, 1)]
        await nothing_more(b)
        await b.close()


async def test_a_dropped_connection_hands_its_messages_to_the_others(cluster: LocalCluster) -> None:
    topic, sub = name(), name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c, \
            await HedwigClient.connect(cluster.hub_addresses[0], conf={"enable_resubscribe": "false"}) as d:
        survivor = await c.consumer(topic, sub, subscription_type="SHARED", receiver_queue_size=2)
        doomed = await d.consumer(topic, sub, subscription_type="SHARED", receiver_queue_size=100)
        for i in range(20):
            await c.publish(topic, str(i).encode())
        held = await drain(doomed, 3, ack=False)
        for conn in list(d.conns.values()):
            conn.drop("test: the consumer's connection dies")
        seen = await drain(survivor, 20)
        assert sorted(m.seq_id for m in seen) == list(range(1, 21))
        redelivered = {m.seq_id: m.redelivery_count for m in seen}
        assert all(redelivered[m.seq_id] == 1 for m in held)
        await survivor.close()


async def test_ack_timeout_redelivers(cluster: LocalCluster) -> None:
    topic, sub = name(), name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        consumer = await c.consumer(topic, sub, subscription_type="SHARED", ack_timeout_ms=200)
        await c.publish(topic, b"slow")
        first = await consumer.receive(timeout=TIMEOUT)
        second = await consumer.receive(timeout=TIMEOUT)
        assert second.seq_id == first.seq_id and second.redelivery_count == 1
        await consumer.ack(second)
        await nothing_more(consumer, 0.6)
        await consumer.close()


async def test_failover_first_attached_is_active_and_the_next_takes_over(cluster: LocalCluster) -> None:
    topic, sub = name(), name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        first = await c.consumer(topic, sub, subscription_type="FAILOVER")
        second = await c.consumer(topic, sub, subscription_type="FAILOVER")
        for i in range(10):
            await c.publish(topic, str(i).encode())
        got = await drain(first, 4, ack=False)
        await first.ack_cumulative(got[1])           # 1 and 2 acknowledged; 3 and 4 held
        await nothing_more(second, 0.3)
        await first.close()
        rest = await drain(second, 8)
        assert [m.seq_id for m in rest] == list(range(3, 11))
        assert [m.redelivery_count for m in rest[:2]] == [1, 1]
        await second.close()


async def test_flow_control_a_consumer_that_stops_receiving_stops_getting(cluster: LocalCluster) -> None:
    topic, sub = name(), name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        idle = await c.consumer(topic, sub, subscription_type="SHARED", receiver_queue_size=5)
        busy = await c.consumer(topic, sub, subscription_type="SHARED", receiver_queue_size=5)
        for i in range(60):
            c.publish_async(topic, str(i).encode())
        got = await drain(busy, 55)
        assert len({m.seq_id for m in got}) == 55
        # idle holds at most its 5 permits' worth, the busy one got everything else
        held = await drain(idle, 5, ack=False)
        assert not {m.seq_id for m in held} & {m.seq_id for m in got}
        await nothing_more(idle, 0.3)
        await idle.close()
        await busy.close()


async def test_dead_letter_topic_after_max_redeliveries(cluster: LocalCluster) -> None:
    topic, sub = name(), name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        dlq = await c.consumer(topic + b"-" + sub + b"-DLQ", b"dlq-reader")
        consumer = await c.consumer(topic, sub, subscription_type="SHARED", negative_ack_redelivery_delay_ms=10,
                                    max_redeliver_count=2)
        await c.publish(topic, b"poison", key=b"k1", properties={"app": b"x"})
        await c.publish(topic, b"fine")
        counts = []
        async with asyncio.timeout(TIMEOUT):
            while True:
                msg = await consumer.receive()
                if msg.body == b"fine":
                    await consumer.ack(msg)
                    continue
                counts.append(msg.redelivery_count)
                await consumer.nack(msg)
                if len(counts) == 3:
                    break
        assert counts == [0, 1, 2]
        # the next receive finds it redelivered a third time: it goes to the DLQ, not to the application
        await nothing_more(consumer, 0.5)
        dead = await dlq.receive(timeout=TIMEOUT)
        assert (dead.body, dead.key) == (b"poison", b"k1")
        assert dead.properties == {"app": b"x", "ORIGIN_TOPIC": topic, "ORIGIN_SEQ_ID": b"1"}
        await nothing_more(consumer, 0.5)           # counted as acknowledged, not handed out again
        await nothing_more(dlq, 0.2)                # and dead-lettered once
        assert consumer.dead_lettered == 1
        await consumer.close()
        await dlq.close()


async def test_individual_acks_survive_closing_and_reattaching(cluster: LocalCluster) -> None:
    topic, sub = name(), name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        consumer = await c.consumer(topic, sub, subscription_type="SHARED")
        for i in range(10):
            await c.publish(topic, str(i).encode())
        got = await drain(consumer, 10, ack=False)
        for m in got:
            if m.seq_id % 3:
                await consumer.ack(m)
        await consumer.close()
    async with await HedwigClient.connect(cluster.hub_addresses[1]) as c:
        consumer = await c.consumer(topic, sub, subscription_type="SHARED")
        again = await drain(consumer, 3)
        assert sorted(m.seq_id for m in again) == [3, 6, 9]
        await nothing_more(consumer)
        await consumer.close()


async def test_handlers_work_for_shared_subscriptions(cluster: LocalCluster) -> None:
    topic, sub = name(), name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c1, \
            await HedwigClient.connect(cluster.hub_addresses[0]) as c2:
        seen: dict[int, int] = {}
        done = asyncio.Event()

        def handler_for(who: int):  # type: ignore[no-untyped-def]
            async def handler(t: bytes, s: bytes, m: Message) -> None:
                seen[m.seq_id] = who
                if len(seen) == 30:
                    done.set()
            return handler

        for i, c in enumerate((c1, c2)):
            await c.subscribe(topic, sub, subscription_type="SHARED")
            await c.start_delivery(topic, sub, handler_for(i))
        with pytest.raises(errors.PubSubError) as already:
            await c1.start_delivery(topic, sub, handler_for(0))
        assert already.value.status == "ALREADY_DELIVERING"
        for i in range(30):
            await c1.publish(topic, str(i).encode())
        await asyncio.wait_for(done.wait(), TIMEOUT)
        assert sorted(seen) == list(range(1, 31)) and set(seen.values()) == {0, 1}
        await c1.close_subscription(topic, sub)
        await c2.close_subscription(topic, sub)
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:   # every message was acked
        consumer = await c.consumer(topic, sub, subscription_type="SHARED")
        await nothing_more(consumer)
        await consumer.close()


async def test_a_nack_storm_settles_and_the_hub_keeps_serving(cluster: LocalCluster) -> None:
    topic, sub = name(), name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        consumers = [await c.consumer(topic, sub, subscription_type="SHARED", negative_ack_redelivery_delay_ms=0)
                     for _ in range(3)]
        for i in range(50):
            c.publish_async(topic, str(i).encode())
        acked: set[int] = set()
        nacks = 0
        settled = asyncio.Event()

        async def work(cons: Consumer) -> None:
            nonlocal nacks
            while True:
                msg = await cons.receive()
                if msg.redelivery_count < 3:
                    nacks += 1
                    await cons.nack(msg)
                else:
                    acked.add(msg.seq_id)
                    await cons.ack(msg)
                    if len(acked) == 50:
                        settled.set()

        tasks = [asyncio.create_task(work(cons)) for cons in consumers]
        await asyncio.wait_for(settled.wait(), TIMEOUT * 2)
        for t in tasks:
            t.cancel()
        assert nacks >= 150
        assert await c.publish(topic, b"after") == 51
        for cons in consumers:
            await cons.close()


async def test_key_shared_keeps_each_key_in_order_while_consumers_join_and_leave(cluster: LocalCluster) -> None:
    """Under load: B joins, C joins, A leaves with messages unacknowledged. For every key the messages are
    acknowledged for the first time in seq order (a key never moves while an earlier message of it is
    outstanding elsewhere), and every message is acknowledged."""
    topic, sub = name(), name()
    total, keys = 600, 16
    rng = random.Random(29)
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        first_acks: dict[bytes, list[int]] = {}
        acked: set[int] = set()
        per_consumer: dict[int, set[bytes]] = {}
        progress = asyncio.Condition()

        async def work(cons: Consumer, who: int) -> None:
            async for msg in cons:
                assert msg.key is not None
                per_consumer.setdefault(who, set()).add(msg.key)
                await asyncio.sleep(rng.random() * 0.002)     # uneven work
                await cons.ack(msg)
                if msg.seq_id not in acked:
                    acked.add(msg.seq_id)
                    first_acks.setdefault(msg.key, []).append(msg.seq_id)
                async with progress:
                    progress.notify_all()

        async def until(n: int) -> None:
            async with asyncio.timeout(TIMEOUT * 2), progress:
                await progress.wait_for(lambda: len(acked) >= n)

        a = await c.consumer(topic, sub, subscription_type="KEY_SHARED", receiver_queue_size=20)
        workers = {0: asyncio.create_task(work(a, 0))}

        async def produce() -> None:
            for i in range(total):
                await c.publish(topic, str(i).encode(), key=f"key-{i % keys}".encode())

        producer = asyncio.create_task(produce())
        await until(100)
        b = await c.consumer(topic, sub, subscription_type="KEY_SHARED", receiver_queue_size=20)
        workers[1] = asyncio.create_task(work(b, 1))
        await until(250)
        d = await c.consumer(topic, sub, subscription_type="KEY_SHARED", receiver_queue_size=20)
        workers[2] = asyncio.create_task(work(d, 2))
        await until(400)
        await a.close()                                   # leaves holding messages: they go to B and D
        await producer
        await until(total)
        assert acked == set(range(1, total + 1))
        for key, seqs in first_acks.items():
            assert seqs == sorted(seqs), f"{key!r} acknowledged out of order: {seqs}"
        assert len(per_consumer) == 3, "every consumer got keys"
        for w in workers.values():
            w.cancel()
        await b.close()
        await d.close()


async def test_admin_stats_show_type_consumers_unacked_and_redeliveries(cluster: LocalCluster,
                                                                       http: aiohttp.ClientSession) -> None:
    topic, sub = name(), name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        a = await c.consumer(topic, sub, subscription_type="SHARED", negative_ack_redelivery_delay_ms=0)
        for i in range(5):
            await c.publish(topic, str(i).encode())
        got = await drain(a, 5, ack=False)
        await a.nack(got[0])
        again = await a.receive(timeout=TIMEOUT)
        assert again.redelivery_count == 1
        b = await c.consumer(topic, sub, subscription_type="SHARED", receiver_queue_size=1)
        await c.publish(topic, b"5")
        tries = {cons: asyncio.ensure_future(cons.receive(timeout=TIMEOUT)) for cons in (a, b)}
        done, _ = await asyncio.wait(tries.values(), return_when=asyncio.FIRST_COMPLETED)
        (winner,) = [cons for cons, task in tries.items() if task in done]
        for task in tries.values():
            task.cancel()
        held = [done.pop().result()]
        owner = cluster.hub_addresses.index(c.owner[topic])
        url = f"{hub_url(cluster, owner)}/admin/v1/topics/{topic.decode()}/stats"
        async with http.get(url) as resp:
            stats = (await resp.json())["subscriptions"][sub.decode()]
        assert stats["type"] == "SHARED" and stats["attached"] is True
        assert stats["unacked"] == 6 and stats["redelivered_total"] == 1
        assert sorted(x["unacked"] for x in stats["consumers"]) == ([0, 6] if winner is a else [1, 5])
        assert all(x["address"].startswith("127.0.0.1:") for x in stats["consumers"])
        assert stats["msg_rate_out"] > 0 and stats["backlog"] == 6
        await winner.ack(held[0])
        await a.close()
        await b.close()


async def test_an_exclusive_consumer_acks_individually_and_cumulatively(cluster: LocalCluster) -> None:
    topic, sub = name(), name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        async with await c.consumer(topic, sub) as consumer:       # EXCLUSIVE, the default
            for i in range(6):
                await c.publish(topic, str(i).encode())
            got = await drain(consumer, 6, ack=False)
            await consumer.ack(got[4])                             # 5 acknowledged on its own
            await consumer.ack_cumulative(got[2])                  # 1..3
        assert consumer.closed
        async with await c.consumer(topic, sub) as again:          # 4 and 6 come again, in order
            assert [m.seq_id for m in await drain(again, 2)] == [4, 6]
            await nothing_more(again)
        # a Hedwig subscriber attaches to the same EXCLUSIVE subscription after the consumer left
        await c.subscribe(topic, sub, create_or_attach="ATTACH")
        await c.close_subscription(topic, sub)
