"""Subscription events end to end (Hedwig's SubscriptionListener): a forced close reaches the attached client."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from hub import errors
from hub.client import HedwigClient, Message
from tools.cluster import LocalCluster

pytestmark = pytest.mark.asyncio(loop_scope="module")
TIMEOUT = 20.0


def name() -> bytes:
    return uuid.uuid4().hex[:10].encode()


class Events:
    """A subscription listener that queues what it is told."""

    def __init__(self) -> None:
        self.got: asyncio.Queue[tuple[bytes, bytes, str]] = asyncio.Queue()

    def __call__(self, topic: bytes, sub: bytes, event: str) -> None:
        self.got.put_nowait((topic, sub, event))

    async def next(self) -> tuple[bytes, bytes, str]:
        async with asyncio.timeout(TIMEOUT):
            return await self.got.get()


async def ignore(topic: bytes, sub: bytes, msg: Message) -> None:
    pass


async def test_unsubscribe_by_another_client_force_closes_the_attached_one(cluster: LocalCluster) -> None:
    topic = name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c1, \
            await HedwigClient.connect(cluster.hub_addresses[1]) as c2:
        events = Events()
        c1.add_subscription_listener(events)
        await c1.subscribe(topic, b"s")
        await c1.start_delivery(topic, b"s", ignore)
        await c2.unsubscribe(topic, b"s")
        assert await events.next() == (topic, b"s", "SUBSCRIPTION_FORCED_CLOSED")
        with pytest.raises(errors.ClientNotSubscribedError):
            await c1.consume(topic, b"s", 1)
        with pytest.raises(errors.ClientNotSubscribedError):
            await c1.start_delivery(topic, b"s", ignore)
        # and it is really gone from the hub: attaching again is refused
        with pytest.raises(errors.ClientNotSubscribedError):
            await c1.subscribe(topic, b"s", create_or_attach="ATTACH")
        assert events.got.empty()


async def test_force_attach_elsewhere_is_reported_and_an_async_listener_is_awaited(cluster: LocalCluster) -> None:
    topic = name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c1, \
            await HedwigClient.connect(cluster.hub_addresses[0]) as c2:
        seen: asyncio.Queue[str] = asyncio.Queue()

        async def listener(t: bytes, s: bytes, event: str) -> None:
            await asyncio.sleep(0)
            seen.put_nowait(event)

        def broken(t: bytes, s: bytes, event: str) -> None:
            raise RuntimeError("a listener's bug is logged, not fatal")

        c1.add_subscription_listener(broken)
        c1.add_subscription_listener(listener)
        await c1.subscribe(topic, b"s")
        await c2.subscribe(topic, b"s", create_or_attach="ATTACH", force_attach=True)
        async with asyncio.timeout(TIMEOUT):
            assert await seen.get() == "SUBSCRIPTION_FORCED_CLOSED"
        with pytest.raises(errors.ClientNotSubscribedError):
            await c1.consume(topic, b"s", 1)
        await c2.consume(topic, b"s", 0)   # the new attachment is unaffected


async def test_a_failing_server_filter_force_closes_and_frees_the_subscription(cluster: LocalCluster) -> None:
    topic = name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c1, \
            await HedwigClient.connect(cluster.hub_addresses[0]) as c2:
        events = Events()
        c1.add_subscription_listener(events)
        await c1.subscribe(topic, b"s", message_filter="tests.hub.sample_filter.Exploding")
        await c1.start_delivery(topic, b"s", ignore)
        await c1.publish(topic, b"boom")
        assert await events.next() == (topic, b"s", "SUBSCRIPTION_FORCED_CLOSED")
        with pytest.raises(errors.ClientNotSubscribedError):
            await c1.consume(topic, b"s", 1)
        # the hub let go of it as well: another client attaches without force (was TOPIC_BUSY)
        await c2.subscribe(topic, b"s", create_or_attach="ATTACH")


async def test_topic_moved_reaches_the_listener_and_the_client_resubscribes() -> None:
    from hub import protocol
    from hub.proto import pubsub_pb2 as pb

    subscribes: asyncio.Queue[int] = asyncio.Queue()

    async def hub(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answers everything; a publish makes it say the topic moved (as a releasing owner does)."""
        machine = protocol.ServerConnection(1 << 20, 1 << 20)
        while data := await reader.read(65536):
            for ev in machine.receive_data(data):
                if isinstance(ev, protocol.RequestReceived):
                    writer.write(protocol.encode(protocol.response(ev.request.txnId, topic=ev.topic)))
                    if ev.request.type == pb.SUBSCRIBE:
                        subscribes.put_nowait(ev.request.txnId)
                    elif ev.request.type == pb.PUBLISH:
                        writer.write(protocol.subscription_event(ev.topic, b"s", pb.SubscriptionEvent.TOPIC_MOVED))
        writer.close()

    server = await asyncio.start_server(hub, "127.0.0.1", 0)
    try:
        address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        async with await HedwigClient.connect(address) as c:
            events = Events()
            c.add_subscription_listener(events)
            await c.subscribe(b"t", b"s")
            await c.publish(b"t", b"x")
            assert await events.next() == (b"t", b"s", "TOPIC_MOVED")
            async with asyncio.timeout(TIMEOUT):
                await subscribes.get()
                await subscribes.get()        # enable_resubscribe: attached again by itself
            c.remove_subscription_listener(events)
    finally:
        server.close()
