"""Delayed delivery (DESIGN 6b, hub.delayed) end to end with real hub and bookie processes.

SHARED and KEY_SHARED hold a message until it is due; EXCLUSIVE and FAILOVER deliver at once; bad
delays are refused and the hub keeps serving; the index is bounded; pending delayed messages survive a
kill -9 of the owner. Receive times are the client's clock, due times the owner's: one machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from bookie.protocol import FrameDecoder
from hub import errors
from hub.client import Consumer, HedwigClient, Message
from hub.delayed import now_ms
from hub.proto import pubsub_pb2 as pb
from hub.protocol import encode
from tools.cluster import LocalCluster

from .conftest import HUB_CONF, hub_url

pytestmark = pytest.mark.asyncio(loop_scope="module")

TIMEOUT = 20.0
MAX_DELAY_MS = 600_000
TRACKED = 6     # max_tracked_delayed_messages: small, so that tests pass it
CONF = {**HUB_CONF, "max_delivery_delay_ms": str(MAX_DELAY_MS), "max_tracked_delayed_messages": str(TRACKED),
        "ack_persist_interval_ms": "200"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("delayed")
    async with LocalCluster(bookies=2, hubs=2, data_dir=root, conf_overrides=CONF) as c:
        yield c


def name() -> bytes:
    return uuid.uuid4().hex[:10].encode()


async def sub_stats(http: aiohttp.ClientSession, cluster: LocalCluster, topic: bytes, sub: bytes) -> dict:
    async with http.get(f"{hub_url(cluster, 0)}/admin/v1/topics/{topic.decode()}/stats") as resp:
        assert resp.status == 200, await resp.text()
        return (await resp.json())["subscriptions"][sub.decode()]  # type: ignore[no-any-return]


async def gauge(http: aiohttp.ClientSession, cluster: LocalCluster, i: int, metric: str) -> float:
    async with http.get(cluster.stats_urls[i]) as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith(metric + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {metric} in the metrics of hub {i}")


async def receive_late(consumer: Consumer, body: bytes, due: int | None = None) -> tuple[Message, int]:
    """The next message (it must be ``body``) and the client's clock when it came, no earlier than its due time.

    With ``due`` (a lower bound of its due time) it asserts first that nothing comes until 150 ms before
    then: a message delivered early would be waiting in the consumer's queue."""
    if due is not None:
        quiet = (due - now_ms() - 150) / 1000
        if quiet > 0:
            with pytest.raises(TimeoutError):
                early = await consumer.receive(timeout=quiet)
                pytest.fail(f"{early.body!r} came {due - now_ms()} ms before its due time")
    msg = await consumer.receive(timeout=TIMEOUT)
    at = now_ms()
    assert msg.body == body
    assert msg.deliver_at_ms and at >= msg.deliver_at_ms, f"{body!r} came {msg.deliver_at_ms - at} ms early"
    return msg, at


async def test_shared_holds_a_delayed_message_until_due_and_counts_it(cluster: LocalCluster,
                                                                      http: aiohttp.ClientSession) -> None:
    topic, sub = name(), name()
    delay = 1500
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        consumer = await c.consumer(topic, sub, subscription_type="SHARED")
        async with consumer:
            t0 = now_ms()                               # the owner stamps "later" no earlier than this
            await c.publish(topic, b"later", deliver_after_ms=delay)
            await c.publish(topic, b"now")
            first = await consumer.receive(timeout=TIMEOUT)
            assert first.body == b"now" and first.deliver_at_ms == 0
            await consumer.ack(first)
            stats = await sub_stats(http, cluster, topic, sub)
            assert stats["delayed"] == 1 and stats["backlog"] == 2    # stored, in the backlog, held
            owner = cluster.hub_addresses.index(c.owner[topic])
            assert await gauge(http, cluster, owner, "hub_delayed_messages") >= 1
            late, _ = await receive_late(consumer, b"later", t0 + delay)
            assert late.deliver_at_ms == late.publish_time_ms + delay and late.redelivery_count == 0
            await consumer.ack(late)
            stats = await sub_stats(http, cluster, topic, sub)
            assert stats["delayed"] == 0


async def test_deliver_at_an_epoch_time_and_a_past_time_at_once(cluster: LocalCluster) -> None:
    topic, sub = name(), name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        consumer = await c.consumer(topic, sub, subscription_type="SHARED")
        async with consumer:
            at = now_ms() + 2000
            await c.publish(topic, b"at", deliver_at_ms=at)
            await c.publish(topic, b"past", deliver_at_ms=now_ms() - 60_000)
            past = await consumer.receive(timeout=TIMEOUT)
            assert past.body == b"past"
            late, _ = await receive_late(consumer, b"at", at)
            assert late.deliver_at_ms == at
            await consumer.ack(past)
            await consumer.ack(late)


async def test_key_shared_delayed_messages_go_to_their_keys_consumer_when_due(cluster: LocalCluster) -> None:
    """The semantics chosen (as Pulsar's): a delay takes a message out of its key's order (later messages of
    the key that are not delayed go first); when due it goes to its key's consumer, and messages of one key
    due together keep seq order."""
    topic, sub = name(), name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        a = await c.consumer(topic, sub, subscription_type="KEY_SHARED")
        b = await c.consumer(topic, sub, subscription_type="KEY_SHARED")
        order = [(b"d1", 2000), (b"n2", 0), (b"d3", 2000), (b"n4", 0)]
        await asyncio.gather(*(c.publish_async(topic, body, key=b"user-7", deliver_after_ms=after or None)
                               for body, after in order))     # sent in this order, stored in it
        got: dict[str, list[tuple[Message, int]]] = {"a": [], "b": []}
        all_in = asyncio.Event()

        async def run(label: str, cons: Consumer) -> None:
            while True:
                msg = await cons.receive()
                got[label].append((msg, now_ms()))
                await cons.ack(msg)
                if len(got["a"]) + len(got["b"]) >= len(order):
                    all_in.set()

        tasks = [asyncio.create_task(run("a", a)), asyncio.create_task(run("b", b))]
        try:
            await asyncio.wait_for(all_in.wait(), TIMEOUT)
        finally:
            for t in tasks:
                t.cancel()
        holder = got["a"] or got["b"]
        assert not (got["a"] and got["b"]), "one key, one consumer"
        assert [m.body for m, _ in holder] == [b"n2", b"n4", b"d1", b"d3"]
        for m, at in holder:
            assert at >= m.deliver_at_ms
        await a.close()
        await b.close()


async def test_once_delivered_nack_redelivery_and_the_dead_letter_topic_work_as_for_any_message(
        cluster: LocalCluster) -> None:
    topic, sub = name(), name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        dlq = await c.consumer(topic + b"-" + sub + b"-DLQ", b"dlq-reader")
        consumer = await c.consumer(topic, sub, subscription_type="SHARED", negative_ack_redelivery_delay_ms=10,
                                    max_redeliver_count=1)
        t0 = now_ms()
        await c.publish(topic, b"poison", key=b"k1", deliver_after_ms=800)
        msg, _ = await receive_late(consumer, b"poison", t0 + 800)
        assert msg.redelivery_count == 0
        await consumer.nack(msg)
        again = await consumer.receive(timeout=TIMEOUT)
        assert (again.body, again.redelivery_count) == (b"poison", 1)
        await consumer.nack(again)
        async with asyncio.timeout(TIMEOUT):        # over max_redeliver_count: to the DLQ, not the application
            while not consumer.dead_lettered:
                with contextlib.suppress(TimeoutError):
                    handed = await consumer.receive(timeout=0.2)
                    pytest.fail(f"{handed.body!r} (redelivery {handed.redelivery_count}) went to the application")
        dead = await dlq.receive(timeout=TIMEOUT)
        assert (dead.body, dead.key, dead.deliver_at_ms) == (b"poison", b"k1", 0)   # the copy is not delayed
        assert dead.properties["ORIGIN_SEQ_ID"] == str(msg.seq_id).encode()
        assert consumer.dead_lettered == 1
        await consumer.close()
        await dlq.close()


async def test_a_hedwig_handler_on_a_shared_subscription_gets_it_when_due(cluster: LocalCluster) -> None:
    topic, sub = name(), name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        await c.subscribe(topic, sub, subscription_type="SHARED")
        got: asyncio.Queue[tuple[Message, int]] = asyncio.Queue()

        async def handler(t: bytes, s: bytes, m: Message) -> None:
            got.put_nowait((m, now_ms()))

        await c.start_delivery(topic, sub, handler)
        await asyncio.gather(c.publish_async(topic, b"later", deliver_after_ms=1500), c.publish_async(topic, b"now"))
        bodies = []
        for _ in range(2):
            m, at = await asyncio.wait_for(got.get(), TIMEOUT)
            assert at >= m.deliver_at_ms
            bodies.append(m.body)
        assert bodies == [b"now", b"later"]


@pytest.mark.parametrize("stype", ["EXCLUSIVE", "FAILOVER"])
async def test_exclusive_and_failover_deliver_a_delayed_message_at_once(cluster: LocalCluster, stype: str) -> None:
    topic, sub = name(), name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        consumer = await c.consumer(topic, sub, subscription_type=stype)
        async with consumer:
            await c.publish(topic, b"x", deliver_after_ms=MAX_DELAY_MS)
            msg = await consumer.receive(timeout=TIMEOUT)   # ten minutes early
            assert msg.body == b"x" and msg.deliver_at_ms == msg.publish_time_ms + MAX_DELAY_MS
            await consumer.ack(msg)


async def raw_publish(address: str, topic: bytes, txn: int, **fields: int) -> pb.PubSubResponse:
    reader, writer = await asyncio.open_connection(*address.split(":"))
    try:
        req = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.PUBLISH, txnId=txn, topic=topic)
        req.publishRequest.topic = topic
        req.publishRequest.msg.CopyFrom(pb.Message(body=b"raw", **fields))
        writer.write(encode(req))
        decoder = FrameDecoder(1 << 20)
        async with asyncio.timeout(TIMEOUT):
            while True:
                frames = decoder.feed(await reader.read(65536))
                if frames:
                    return pb.PubSubResponse.FromString(frames[0])
    finally:
        writer.close()


async def test_bad_delays_are_refused_and_the_hub_keeps_serving(cluster: LocalCluster) -> None:
    topic = name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        first = await c.publish(topic, b"first")
        owner = c.owner[topic]
        with pytest.raises(ValueError, match="not both"):
            await c.publish(topic, b"x", deliver_after_ms=1, deliver_at_ms=now_ms())
        with pytest.raises(ValueError, match="deliver_after_ms"):
            await c.publish(topic, b"x", deliver_after_ms=-1)
        with pytest.raises(errors.DeliveryDelayTooLongError) as info:
            await c.publish(topic, b"x", deliver_after_ms=MAX_DELAY_MS + 1)
        assert info.value.status == "DELIVERY_DELAY_TOO_LONG" and "max_delivery_delay_ms" in str(info.value)
        with pytest.raises(errors.DeliveryDelayTooLongError):
            await c.publish(topic, b"x", deliver_at_ms=now_ms() + 2 * MAX_DELAY_MS)
        # what a client that skips the checks gets from the hub itself
        for txn, fields, status in ((1, {"deliverAfterMs": 5, "deliverAtMs": 5}, pb.MALFORMED_REQUEST),
                                    (2, {"deliverAfterMs": -5}, pb.MALFORMED_REQUEST),
                                    (3, {"deliverAtMs": -5}, pb.MALFORMED_REQUEST),
                                    (4, {"deliverAfterMs": MAX_DELAY_MS + 1}, pb.DELIVERY_DELAY_TOO_LONG)):
            resp = await raw_publish(owner, topic, txn, **fields)
            assert (resp.txnId, resp.statusCode) == (txn, status), resp
        # nothing of it was stored, and the hub serves on: the next publish is the next seq id
        assert await c.publish(topic, b"after", deliver_after_ms=10) == first + 1


async def test_past_the_tracked_cap_none_is_early_or_lost_and_undelayed_ones_flow(
        cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    topic, sub = name(), name()
    delayed = 2 * TRACKED + 2
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        consumer = await c.consumer(topic, sub, subscription_type="SHARED")
        async with consumer:
            sent = []
            for i in range(delayed):            # later ones due earlier
                sent.append(c.publish_async(topic, b"d%d" % i, deliver_after_ms=3000 - 100 * i))
                if i % 4 == 3:
                    sent.append(c.publish_async(topic, b"n%d" % i))
            await asyncio.gather(*sent)
            undelayed = [await consumer.receive(timeout=TIMEOUT) for _ in range(delayed // 4)]
            assert all(m.body.startswith(b"n") for m in undelayed)
            stats = await sub_stats(http, cluster, topic, sub)
            assert 0 < stats["delayed"] <= TRACKED and stats["delayed_overflow"] is True
            for m in undelayed:
                await consumer.ack(m)
            got: dict[bytes, int] = {}
            async with asyncio.timeout(TIMEOUT):
                while len(got) < delayed:
                    msg = await consumer.receive()
                    at = now_ms()
                    assert msg.body.startswith(b"d") and at >= msg.deliver_at_ms, (msg.body, msg.deliver_at_ms - at)
                    got[msg.body] = at
                    await consumer.ack(msg)
            assert sorted(got) == sorted(b"d%d" % i for i in range(delayed))
            stats = await sub_stats(http, cluster, topic, sub)
            assert stats["delayed"] == 0 and stats["delayed_overflow"] is False


async def test_delayed_messages_survive_a_kill_9_of_the_owner(cluster: LocalCluster) -> None:
    """Published delayed, owner killed: the consumer reattaches through the other hub, whose dispatcher
    rebuilds the index from the log; every delayed message comes, none before its time."""
    topic, sub = name(), name()
    addresses = ",".join(cluster.hub_addresses)
    killed: list[int] = []
    delays = [2500 + 800 * i for i in range(TRACKED + 2)]   # past the cap: the rescan runs on the new owner
    try:
        async with await HedwigClient.connect(addresses, conf={"server_ack_response_timeout": "15000"}) as c:
            consumer = await c.consumer(topic, sub, subscription_type="SHARED")
            await asyncio.gather(*(c.publish_async(topic, b"d%d" % i, deliver_after_ms=after)
                                   for i, after in enumerate(delays)), c.publish_async(topic, b"n0"))
            got: dict[bytes, tuple[Message, int]] = {}
            async with asyncio.timeout(TIMEOUT):
                while True:                      # n0, and whatever is due already on a slow machine
                    msg = await consumer.receive()
                    at = now_ms()
                    assert at >= msg.deliver_at_ms, f"{msg.body!r} came {msg.deliver_at_ms - at} ms early"
                    await consumer.ack(msg)
                    if msg.body == b"n0":
                        break
                    got[msg.body] = (msg, at)
            owner = cluster.hub_addresses.index(c.owner[topic])
            await cluster.kill_hub(owner)
            killed.append(owner)
            await c.publish(topic, b"n1")        # to the new owner
            serving_since: int | None = None     # the new owner handed out its first message
            async with asyncio.timeout(40):
                while len(got) < len(delays):
                    msg = await consumer.receive()
                    at = now_ms()
                    if serving_since is None:
                        serving_since = at
                    if msg.body.startswith(b"d"):
                        assert at >= msg.deliver_at_ms, f"{msg.body!r} came {msg.deliver_at_ms - at} ms early"
                        got.setdefault(msg.body, (msg, at))
                    await consumer.ack(msg)      # n0 may come again: its ack may have died with the owner
            assert sorted(got) == sorted(b"d%d" % i for i in range(len(delays)))
            assert serving_since is not None
            held = [m.body for m, _ in got.values() if m.deliver_at_ms > serving_since]
            assert held, "the new owner held back none: it served only after every message was due"
            await consumer.close()
    finally:
        for i in killed:
            await cluster.restart_hub(i)
