"""End to end with real processes: publish/subscribe/deliver/consume, redirects, bad input, flow control."""

from __future__ import annotations

import asyncio
import struct
import uuid
from collections.abc import Callable

import aiohttp
import pytest

from hub import errors
from hub.client import HedwigClient, Message
from hub.proto import pubsub_pb2 as pb
from hub.protocol import encode
from tests.fixtures.polling import eventually
from tools.cluster import LocalCluster

from .conftest import hub_url

pytestmark = pytest.mark.asyncio(loop_scope="module")


def name() -> bytes:
    return uuid.uuid4().hex[:10].encode()


class Collector:
    def __init__(self) -> None:
        self.got: list[Message] = []
        self.cond = asyncio.Condition()

    async def __call__(self, topic: bytes, sub: bytes, msg: Message) -> None:
        async with self.cond:
            self.got.append(msg)
            self.cond.notify_all()

    async def wait(self, pred: Callable[[list[Message]], bool], timeout: float = 20.0) -> None:
        async with asyncio.timeout(timeout):
            async with self.cond:
                await self.cond.wait_for(lambda: pred(self.got))


async def test_round_trip_dense_seq_ids_across_rolls(cluster: LocalCluster) -> None:
    topic = name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        first = [await c.publish(topic, b"a%d" % i, properties={"k": b"v"}) for i in range(3)]
        assert first == [1, 2, 3]
        rest = await asyncio.gather(*(c.publish(topic, b"b%d" % i) for i in range(40)))
        assert sorted(rest) == list(range(4, 44))   # several ledgers (max_entries_per_ledger=4), batched
        prefs = await c.subscribe(topic, b"s", options={"o": b"1"}, message_window_size=5)
        assert prefs.options == {"o": b"1"} and prefs.message_window_size == 5
        col = Collector()
        await c.start_delivery(topic, b"s", col)
        seqs = [await c.publish(topic, b"c%d" % i) for i in range(12)]
        assert seqs == list(range(44, 56))
        await col.wait(lambda g: len(g) == 12)
        assert [m.seq_id for m in col.got] == seqs
        assert [m.body for m in col.got] == [b"c%d" % i for i in range(12)]
        assert col.got[0].src_region == "standalone"
        with pytest.raises(errors.PubSubError) as info:
            await c.start_delivery(topic, b"s", col)
        assert info.value.status == "ALREADY_DELIVERING"
        await c.close_subscription(topic, b"s")
        await c.publish(topic, b"later")
    async with await HedwigClient.connect(cluster.hub_addresses[1]) as c:  # redirected to the owner
        await c.subscribe(topic, b"s", create_or_attach="ATTACH")
        col = Collector()
        await c.start_delivery(topic, b"s", col)
        await col.wait(lambda g: len(g) >= 1)
        assert col.got[0].seq_id == 56 and col.got[0].body == b"later"


async def test_subscription_statuses(cluster: LocalCluster) -> None:
    topic = name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        with pytest.raises(errors.ClientNotSubscribedError):
            await c.subscribe(topic, b"s", create_or_attach="ATTACH")
        await c.subscribe(topic, b"s", create_or_attach="CREATE")
        with pytest.raises(errors.ClientAlreadySubscribedError):
            await c.subscribe(topic, b"s", create_or_attach="CREATE")
        with pytest.raises(errors.InvalidMessageFilterError):
            await c.subscribe(topic, b"f", message_filter="no.such.module.Filter")
        await c.unsubscribe(topic, b"s")
        with pytest.raises(errors.ClientNotSubscribedError):
            await c.unsubscribe(topic, b"s")
        with pytest.raises(errors.MessageTooLargeError):
            await c.publish(topic, b"x" * (c.conf.max_message_size + 1))


async def test_manual_consume_is_seen_by_a_later_close(cluster: LocalCluster) -> None:
    topic = name()
    async with await HedwigClient.connect(cluster.hub_addresses[0],
                                          conf={"auto_send_consume_message_enabled": "false"}) as c:
        await c.subscribe(topic, b"s")
        for i in range(6):
            await c.publish(topic, b"%d" % i)
        await c.consume(topic, b"s", 4)
        await c.close_subscription(topic, b"s")
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        await c.subscribe(topic, b"s", create_or_attach="ATTACH")
        col = Collector()
        await c.start_delivery(topic, b"s", col)
        await col.wait(lambda g: len(g) >= 2)
        assert [m.seq_id for m in col.got] == [5, 6]


async def test_message_bound_keeps_the_newest(cluster: LocalCluster) -> None:
    topic = name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        await c.subscribe(topic, b"s", message_bound=3)
        await c.close_subscription(topic, b"s")
        for i in range(8):
            await c.publish(topic, b"%d" % i)
        await c.subscribe(topic, b"s", create_or_attach="ATTACH", message_bound=3)
        col = Collector()
        await c.start_delivery(topic, b"s", col)
        await col.wait(lambda g: len(g) >= 3)
        assert [m.seq_id for m in col.got] == [6, 7, 8]


async def test_redirects_bounded(cluster: LocalCluster) -> None:
    topic = name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        await c.publish(topic, b"x")
        owner = c.owner[topic]
    other = next(a for a in cluster.hub_addresses if a != owner)
    async with await HedwigClient.connect(other, conf={"max_server_redirects": "0"}) as c:
        with pytest.raises(errors.TooManyRedirectsError):
            await c.publish(topic, b"y")
    async with await HedwigClient.connect(other) as c:
        assert await c.publish(topic, b"z") == 2
        assert c.owner[topic] == owner


async def test_a_publish_to_a_stale_owner_follows_the_redirect(cluster: LocalCluster) -> None:
    topic = name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        assert await c.publish(topic, b"x") == 1
        owner = c.owner[topic]
        other = next(a for a in cluster.hub_addresses if a != owner)
        await c._conn(other)       # an open connection to a hub that does not own the topic ...
        c.owner[topic] = other     # ... believed to be the owner (as after the topic moved)
        assert await c.publish(topic, b"y") == 2   # NOT_RESPONSIBLE on the direct path, then redirected
        assert c.owner[topic] == owner


async def raw_exchange(address: str, data: bytes, n: int) -> list[pb.PubSubResponse]:
    host, port = address.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        out = []
        async with asyncio.timeout(20):
            for _ in range(n):
                (size,) = struct.unpack(">I", await reader.readexactly(4))
                out.append(pb.PubSubResponse.FromString(await reader.readexactly(size)))
        return out
    finally:
        writer.close()


def publish_req(topic: bytes, body: bytes, txn: int) -> bytes:
    req = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.PUBLISH, txnId=txn, topic=topic, shouldClaim=True)
    req.publishRequest.topic = topic
    req.publishRequest.msg.body = body
    return encode(req)


async def test_bad_input_gets_statuses_and_the_hub_keeps_serving(cluster: LocalCluster) -> None:
    addr = cluster.hub_addresses[0]
    unknown = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, txnId=2, topic=b"t")
    unknown.type = 77  # type: ignore[assignment]
    data = (struct.pack(">I", 3) + b"\xff\xff\xff"
            + encode(unknown)
            + publish_req(b"", b"x", 3)
            + publish_req(b"big", b"x" * 1258292, 4))
    got = await raw_exchange(addr, data, 4)
    assert [r.statusCode for r in got] == [pb.MALFORMED_REQUEST, pb.UNKNOWN_OPERATION, pb.MALFORMED_REQUEST,
                                           pb.MESSAGE_TOO_LARGE]
    # an oversized frame closes only that connection
    host, port = addr.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(struct.pack(">I", 1 << 31))
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()
    async with await HedwigClient.connect(addr) as c:
        assert await c.publish(name(), b"still serving") == 1


def ping_req(txn: int) -> bytes:
    req = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.PING, txnId=txn)
    req.pingRequest.SetInParent()
    return encode(req)


async def test_a_ping_is_answered_at_once_and_a_half_closed_connection_then_closes(cluster: LocalCluster) -> None:
    host, port = cluster.hub_addresses[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(ping_req(7) + ping_req(8))
        writer.write_eof()                     # nothing more from us: the hub answers, then closes
        got = []
        async with asyncio.timeout(20):
            for _ in range(2):
                (size,) = struct.unpack(">I", await reader.readexactly(4))
                got.append(pb.PubSubResponse.FromString(await reader.readexactly(size)))
            assert await reader.read() == b""  # closed: the pings count as answered
    finally:
        writer.close()
    assert [(r.txnId, r.statusCode) for r in got] == [(7, pb.SUCCESS), (8, pb.SUCCESS)]


async def test_bad_names_fail_at_once_naming_the_limit(cluster: LocalCluster) -> None:
    addr = cluster.hub_addresses[0]
    sub = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.SUBSCRIBE, txnId=2, topic=b"t" * 600,
                           shouldClaim=True)
    sub.subscribeRequest.topic, sub.subscribeRequest.subscriberId = b"t" * 600, b"s"
    long_sub = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.SUBSCRIBE, txnId=3, topic=name(),
                                shouldClaim=True)
    long_sub.subscribeRequest.topic, long_sub.subscribeRequest.subscriberId = long_sub.topic, b"s" * 300
    got = await raw_exchange(addr, publish_req(b"a\x00" + name(), b"x", 1) + encode(sub) + encode(long_sub), 3)
    assert [r.statusCode for r in got] == [pb.MALFORMED_REQUEST] * 3   # were SERVICE_DOWN, UNEXPECTED_CONDITION
    assert "NUL" in got[0].statusMsg
    assert "topic of 600 bytes is over the limit of 255 bytes" in got[1].statusMsg and got[1].topic == b""
    assert "subscriber id of 300 bytes is over the limit of 255 bytes" in got[2].statusMsg
    async with await HedwigClient.connect(addr) as c:
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(errors.MalformedRequestError, match="NUL"):       # not 5 s of SERVICE_DOWN retries
            await c.publish(b"a\x00" + name(), b"x")
        with pytest.raises(errors.MalformedRequestError, match="topic of 1300000 bytes"):
            await c.publish(b"t" * 1_300_000, b"x")                           # was a reset connection
        assert asyncio.get_running_loop().time() - t0 < 2.0
        # the longest names: a topic that can be published to can be subscribed to
        topic, subscriber = name() + b"t" * 245, b"s" * 255
        await c.subscribe(topic, subscriber)
        col = Collector()
        await c.start_delivery(topic, subscriber, col)
        assert await c.publish(topic, b"longest") == 1
        await col.wait(lambda g: len(g) == 1)
        assert col.got[0].body == b"longest"


def rss_bytes(pid: int) -> int:
    for line in open(f"/proc/{pid}/status").read().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def test_a_client_that_never_reads_is_bounded(cluster: LocalCluster) -> None:
    topic = name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        await c.publish(topic, b"claim")
        owner = c.owner[topic]
        pid = cluster.hub_pid(cluster.hub_addresses.index(owner))
        assert pid is not None
        host, port = owner.split(":")
        _, writer = await asyncio.open_connection(host, int(port))
        writer.transport.set_write_buffer_limits(0)
        sock = writer.transport.get_extra_info("socket")
        sock.setsockopt(__import__("socket").SOL_SOCKET, __import__("socket").SO_RCVBUF, 65536)
        sub = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.SUBSCRIBE, txnId=1, topic=topic)
        sub.subscribeRequest.topic = topic
        sub.subscribeRequest.subscriberId = b"lazy"
        start = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.START_DELIVERY, txnId=2, topic=topic)
        start.startDeliveryRequest.topic = topic
        start.startDeliveryRequest.subscriberId = b"lazy"
        writer.write(encode(sub) + encode(start))
        await writer.drain()
        body = b"x" * 100_000
        await asyncio.gather(*(c.publish(topic, body) for _ in range(10)))
        before = rss_bytes(pid)
        for _ in range(60):     # 60 MB the lazy client never reads
            await asyncio.gather(*(c.publish(topic, body) for _ in range(10)))
        grown = rss_bytes(pid) - before
        assert grown < 30_000_000, f"hub grew {grown} bytes for a client that never reads"
        # the hub keeps serving everyone else while it holds the lazy client's deliveries back
        assert await c.publish(name(), b"ok") == 1
        writer.transport.abort()


async def test_server_filter_and_bad_filters(cluster: LocalCluster) -> None:
    topic = name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        await c.subscribe(topic, b"s", options={"want": b"red"},
                          message_filter="tests.hub.sample_filter.HeaderFilter")
        col = Collector()
        await c.start_delivery(topic, b"s", col)
        for i, colour in enumerate([b"red", b"blue", b"red", b"green", b"red"]):
            await c.publish(topic, b"%d" % i, properties={"type": colour})
        await col.wait(lambda g: len(g) >= 3)
        assert [m.seq_id for m in col.got] == [1, 3, 5]
        with pytest.raises(errors.InvalidMessageFilterError):
            await c.subscribe(topic, b"bad", message_filter="tests.hub.sample_filter.BadInit")
        with pytest.raises(errors.InvalidMessageFilterError):
            await c.subscribe(topic, b"bad", message_filter="tests.hub.sample_filter.NoSuchClass")
        for not_allowed in ("socket.socket", "multiprocessing.pool.ThreadPool", "hub.server.HubServer"):
            with pytest.raises(errors.InvalidMessageFilterError, match="not an allowed filter class"):
                await c.subscribe(topic, b"bad", message_filter=not_allowed)
        # a filter that raises closes that subscription; the hub and the others carry on
        await c.subscribe(topic, b"x", message_filter="tests.hub.sample_filter.Exploding")
        await c.start_delivery(topic, b"x", Collector())
        await c.publish(topic, b"6", properties={"type": b"red"})
        await col.wait(lambda g: len(g) >= 4)
        assert col.got[-1].seq_id == 6


async def test_client_filter_and_force_attach(cluster: LocalCluster) -> None:
    topic = name()

    class OddOnly:
        def set_subscription_preferences(self, topic: bytes, sub: bytes, prefs: object) -> None:
            self.prefs = prefs

        def test_message(self, message: Message) -> bool:
            return message.seq_id % 2 == 1

    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c1, \
            await HedwigClient.connect(cluster.hub_addresses[0]) as c2:
        await c1.subscribe(topic, b"s", options={"k": b"v"})
        flt = OddOnly()
        col1 = Collector()
        await c1.start_delivery(topic, b"s", col1, message_filter=flt)
        assert flt.prefs.options == {"k": b"v"}  # type: ignore[attr-defined]
        for i in range(4):
            await c1.publish(topic, b"%d" % i)
        await col1.wait(lambda g: len(g) >= 2)
        assert [m.seq_id for m in col1.got] == [1, 3]
        with pytest.raises(errors.PubSubError) as info:
            await c2.subscribe(topic, b"s", create_or_attach="ATTACH")
        assert info.value.status == "TOPIC_BUSY"
        await c2.subscribe(topic, b"s", create_or_attach="ATTACH", force_attach=True)
        col2 = Collector()
        await c2.start_delivery(topic, b"s", col2)
        await c1.publish(topic, b"after")
        await col2.wait(lambda g: any(m.seq_id == 5 for m in g))
        assert all(m.seq_id != 5 for m in col1.got)   # the first attachment was closed


async def test_delivery_pauses_at_the_window_until_consumes_arrive(cluster: LocalCluster) -> None:
    topic = name()
    async with await HedwigClient.connect(cluster.hub_addresses[0],
                                          conf={"auto_send_consume_message_enabled": "false"}) as c:
        await c.subscribe(topic, b"s", message_window_size=3)
        col = Collector()
        await c.start_delivery(topic, b"s", col)
        for i in range(10):
            await c.publish(topic, b"%d" % i)
        await col.wait(lambda g: len(g) >= 3)
        with pytest.raises(TimeoutError):      # the hub holds the 4th back: nothing consumed yet
            await col.wait(lambda g: len(g) > 3, timeout=0.5)
        await c.consume(topic, b"s", 3)
        await col.wait(lambda g: len(g) >= 6)
        assert [m.seq_id for m in col.got] == [1, 2, 3, 4, 5, 6]


async def test_silent_hub_gives_response_timeout_and_closed_port_could_not_connect() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()       # never answers
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with await HedwigClient.connect(f"127.0.0.1:{port}",
                                              conf={"server_ack_response_timeout": "300"}) as c:
            with pytest.raises(errors.ResponseTimeoutError):
                await c.publish(b"t", b"x")
    finally:
        server.close()
        await server.wait_closed()
    with pytest.raises(errors.CouldNotConnectError):
        await HedwigClient.connect(f"127.0.0.1:{port}")


async def test_consume_pointer_persisted_when_the_connection_drops(cluster: LocalCluster,
                                                                   http: aiohttp.ClientSession) -> None:
    from hub.metadata import SubscriptionDataManager
    from metastore import open_metastore

    topic = name()
    c = await HedwigClient.connect(cluster.hub_addresses[0],
                                   conf={"consumed_messages_buffer_size": "1", "enable_resubscribe": "false"})
    await c.subscribe(topic, b"s")
    col = Collector()
    await c.start_delivery(topic, b"s", col)
    ms = await open_metastore(cluster.metastore_uri)
    try:
        mgr = SubscriptionDataManager(ms)
        await mgr.start()

        async def stored() -> int:
            got = await mgr.read_subscription_data(topic, b"s")
            assert got is not None
            return int(got[0].state.msgId.localComponent)

        async def stored_is(seq: int) -> bool:
            return await stored() == seq

        async def consumed_is(seq: int) -> bool:     # the owner's pointer, persisted or not
            url = f"{hub_url(cluster, 0)}/admin/v1/topics/{topic.decode()}/stats"
            async with http.get(url) as resp:
                assert resp.status == 200, await resp.text()
                return int((await resp.json())["subscriptions"]["s"]["consumed_seq_id"]) == seq

        for i in range(2):
            await c.publish(topic, b"%d" % i)
        await col.wait(lambda g: len(g) == 2)  # consumes 1, 2 sent: consume_interval=2 persists 2
        # (its write, in the background, takes the pointer as it is then: wait for it, or a third consume
        # arriving meanwhile would be written with it)
        await eventually(lambda: stored_is(2))
        await c.publish(topic, b"2")
        await col.wait(lambda g: len(g) == 3)  # consume 3 sent: one-way, so wait until the hub has it
        await eventually(lambda: consumed_is(3))
        assert await stored() == 2                   # not yet: the third consume is below consume_interval
        for conn in list(c.conns.values()):
            assert conn.transport is not None
            conn.transport.abort()                   # no close_subscription: the hub sees a dropped connection
        await eventually(lambda: stored_is(3))       # another process's write: poll the metastore
    finally:
        await ms.close()
        await c.close()


async def test_message_type_header_is_stored_and_delivered(cluster: LocalCluster) -> None:
    topic = name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        await c.subscribe(topic, b"s")
        await c.publish(topic, b"typed", properties={"k": b"v"}, message_type="History")
        await c.publish(topic, b"plain")
        col = Collector()
        await c.start_delivery(topic, b"s", col)    # after the publishes: read back from the ledger
        await col.wait(lambda g: len(g) == 2)
        assert [(m.body, m.message_type, dict(m.properties)) for m in col.got] == [
            (b"typed", "History", {"k": b"v"}), (b"plain", "", {})]
        assert col.got[0].to_proto().header.messageType == "History"


async def test_a_publisher_cannot_forge_its_region_or_version_vector(cluster: LocalCluster) -> None:
    from hub.proto import pubsub_pb2 as pb

    topic = name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        await c.subscribe(topic, b"s")
        col = Collector()
        await c.start_delivery(topic, b"s", col)
        req = pb.PubSubRequest(type=pb.PUBLISH, topic=topic)
        req.publishRequest.topic = topic
        msg = req.publishRequest.msg
        msg.body = b"forged"
        msg.srcRegion = b"west"
        msg.msgId.remoteComponents.add(region=b"west", seqId=2 ** 62)   # would poison the topic's vector-max
        _, resp = await c._call(topic, req)
        assert resp.statusCode == pb.SUCCESS
        await c.publish(topic, b"honest")
        await col.wait(lambda g: len(g) == 2)
        for m in col.got:
            assert m.src_region == "standalone" and m.msg_id.remote == {}


async def test_publish_async_keeps_order_raises_bad_arguments_at_once_and_follows_redirects(
        cluster: LocalCluster) -> None:
    topic = name()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as reader, \
            await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        await reader.subscribe(topic, b"s", message_window_size=300)
        col = Collector()
        await reader.start_delivery(topic, b"s", col)
        first = c.publish_async(topic, b"m0")        # this client knows no owner yet: the long way, in a task
        assert await first == 1
        futures = [c.publish_async(topic, b"m%d" % i) for i in range(1, 201)]   # started back to back
        assert await asyncio.gather(*futures) == list(range(2, 202))
        # a cancelled future does not recall its publish: the next one gets the seq id after it
        gone = c.publish_async(topic, b"m201")
        gone.cancel()
        assert await c.publish_async(topic, b"m202") == 203
        await col.wait(lambda g: len(g) == 203)
        assert [m.body for m in col.got] == [b"m%d" % i for i in range(203)]
        assert [m.seq_id for m in col.got] == list(range(1, 204))
        # bad arguments raise at the call, before anything is sent
        with pytest.raises(errors.MessageTooLargeError):
            c.publish_async(topic, b"x" * (c.conf.max_message_size + 1))
        with pytest.raises(errors.MalformedRequestError, match="NUL"):
            c.publish_async(b"a\x00b", b"x")
        with pytest.raises(ValueError, match="sequence_id needs a producer"):
            c.publish_async(topic, b"x", sequence_id=3)
        # a believed owner that is not the owner: NOT_RESPONSIBLE on the direct path, then the redirect
        owner = c.owner[topic]
        other = next(a for a in cluster.hub_addresses if a != owner)
        await c._conn(other)
        c.owner[topic] = other
        assert await c.publish_async(topic, b"m203") == 204
        assert c.owner[topic] == owner
        # a producer's publish is deduplicated by its sequence id through the future as well
        assert await c.publish_async(topic, b"p", producer=b"prod", sequence_id=7) == 205
        assert await c.publish_async(topic, b"p", producer=b"prod", sequence_id=7) == 205
        assert await c.publish(topic, b"end") == 206
        await col.wait(lambda g: len(g) == 206)
        assert [m.body for m in col.got[203:]] == [b"m203", b"p", b"end"]
