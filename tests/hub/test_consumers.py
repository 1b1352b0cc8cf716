"""Consumers (DESIGN 6b) end to end with real hub and bookie processes: types, acks, redelivery, flow, DLQ."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from hub import errors
from hub.client import Consumer, HedwigClient, Message
from tools.cluster import LocalCluster

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
            assert (first.body, first.key, first.properties, first.redelivery_count) == (b"a", b"user-7", {"p": b"1"}, 0)
            assert second.key is None
            assert abs(first.publish_time_ms - __import__("time").time() * 1000) < 60_000
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

        async def run(cons: Consumer, out: list[Message]) -> None:
            while True:
                msg = await cons.receive()
                out.append(msg)
                await cons.ack(msg)

        tasks = [asyncio.create_task(run(a, got_a)), asyncio.create_task(run(b, got_b))]
        async with asyncio.timeout(TIMEOUT):
            while len(got_a) + len(got_b) < 40:
                await asyncio.sleep(0.02)
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

        tasks = [asyncio.create_task(work(cons)) for cons in consumers]
        async with asyncio.timeout(TIMEOUT * 2):
            while len(acked) < 50:
                await asyncio.sleep(0.05)
        for t in tasks:
            t.cancel()
        assert nacks >= 150
        assert await c.publish(topic, b"after") == 51
        for cons in consumers:
            await cons.close()
