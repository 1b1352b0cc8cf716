"""PUBLISH_MULTI (issue 34): the publishes of one loop turn to many topics of one hub leave as one request, each
topic's messages stored in order as entries of its own ledger; a hub that predates it still gets every message."""

from __future__ import annotations

import asyncio
import struct
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from hub.client import HedwigClient
from hub.frames_multi import multi_published, part_published, publish_multi
from hub.proto import pubsub_pb2 as pb
from hub.protocol import encode, response
from tests.hub.test_hub import Collector, publish_req, raw_exchange
from tools.cluster import LocalCluster

pytestmark = pytest.mark.asyncio(loop_scope="module")


def names(n: int) -> list[bytes]:
    run = uuid.uuid4().hex[:8]
    return [f"multi-{run}-{i}".encode() for i in range(n)]


def count_requests(c: HedwigClient) -> dict[str, int]:
    """How many publish requests of each kind ``c``'s open connections send from now on."""
    sent = {"multi": 0, "single": 0, "parts": 0}
    for conn in c.conns.values():
        multi, batch, request = conn.publish_multi, conn.publish_batch, conn.request

        def publish_multi(parts, timeout, answer, multi=multi):  # type: ignore[no-untyped-def]
            sent["multi"] += 1
            sent["parts"] += len(parts)
            multi(parts, timeout, answer)

        def publish_batch(topic, bodies, timeout, answer, now=False, batch=batch):  # type: ignore[no-untyped-def]
            sent["single"] += 1
            batch(topic, bodies, timeout, answer, now)

        def one_request(req, timeout, request=request):  # type: ignore[no-untyped-def]
            if req.type == pb.PUBLISH:
                sent["single"] += 1
            return request(req, timeout)

        conn.publish_multi = publish_multi  # type: ignore[method-assign]
        conn.publish_batch = publish_batch  # type: ignore[method-assign]
        conn.request = one_request  # type: ignore[method-assign]
    return sent


async def collect(client: HedwigClient, topics: list[bytes]) -> dict[bytes, Collector]:
    got = {}
    for topic in topics:
        await client.subscribe(topic, b"r", message_window_size=1000)
        got[topic] = Collector()
        await client.start_delivery(topic, b"r", got[topic])
    return got


async def test_one_turns_publishes_to_many_topics_leave_as_one_request_per_hub_in_order_per_topic(
        cluster: LocalCluster) -> None:
    every = names(24)
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as r, \
            await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        assert await asyncio.gather(*(c.publish(t, b"first") for t in every)) == [1] * len(every)  # owners learnt
        owners = [c.owner[t] for t in every]
        topics = [t for t in every if c.owner[t] == max(owners, key=owners.count)]   # 12 or more, of one hub
        got = await collect(r, topics)   # from seq id 2 on
        sent = count_requests(c)
        expected: dict[bytes, list[bytes]] = {t: [] for t in topics}
        for turn in range(6):     # each turn: one message to some topics, three to others (a batched part)
            futures = {}
            for i, topic in enumerate(topics):
                n = 3 if (i + turn) % 4 == 0 else 1
                bodies = [b"%d-%d" % (turn, k) for k in range(n)]
                futures[topic] = [c.publish_async(topic, b) for b in bodies]
                expected[topic] += bodies
            for futs in futures.values():
                seqs = await asyncio.gather(*futs)
                assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))   # consecutive within the turn
        assert sent == {"multi": 6, "single": 0, "parts": 6 * len(topics)}
        for topic, col in got.items():
            await col.wait(lambda g, topic=topic: len(g) == len(expected[topic]))
            assert [m.body for m in col.got] == expected[topic]
            assert [m.seq_id for m in col.got] == list(range(2, len(expected[topic]) + 2))


def multi_req(txn: int, *parts: tuple[bytes, list[bytes]]) -> bytes:
    req = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.PUBLISH_MULTI, txnId=txn)
    req.multiPublishRequest.SetInParent()   # sent even without parts
    for topic, bodies in parts:
        pub = req.multiPublishRequest.publishes.add(topic=topic)
        if len(bodies) == 1:
            pub.msg.body = bodies[0]
        else:
            pub.msgs.extend(pb.Message(body=b) for b in bodies)
    return encode(req)


async def test_the_hub_answers_each_part_as_its_publish_and_refuses_a_bad_request_whole(
        cluster: LocalCluster) -> None:
    a, b, elsewhere = names(3)
    hub0, hub1 = cluster.hub_addresses
    claimed = await raw_exchange(hub0, publish_req(a, b"a1", 1) + publish_req(b, b"b1", 2), 2)
    assert [x.statusCode for x in claimed] == [pb.SUCCESS, pb.SUCCESS]
    assert (await raw_exchange(hub1, publish_req(elsewhere, b"e1", 1), 1))[0].statusCode == pb.SUCCESS
    r = await HedwigClient.connect(hub0)
    cols = await collect(r, [a, b])   # from seq id 2 on
    too_big = b"x" * 1258292
    data = (multi_req(3, (a, [b"a2"]), (b, [b"b2", b"b3", b"b4"]), (a, [b"a3"]), (elsewhere, [b"e2"]))
            + multi_req(4, (a, [b"never"]), (b"", [b"x"]))             # a part without a topic
            + multi_req(5, (b, [b"never"]), (a, [b"x", too_big]))      # a message over max_message_size
            + publish_req(a, b"a4", 6)                                 # an old-style publish after them
            + multi_req(7))                                            # no parts at all
    got = {x.txnId: x for x in await raw_exchange(hub0, data, 5)}
    assert got[3].statusCode == pb.SUCCESS
    parts = got[3].multiPublishResponse.answers
    assert [p.statusCode for p in parts] == [pb.SUCCESS, pb.SUCCESS, pb.SUCCESS, pb.NOT_RESPONSIBLE_FOR_TOPIC]
    assert [p.publishResponse.publishedMsgId.localComponent for p in parts[:3]] == [2, 2, 3]
    assert parts[1].publishResponse.stored == 3
    assert parts[3].redirect_to and parts[3].redirect_to.split(":")[1] == hub1.split(":")[1]
    assert got[4].statusCode == pb.MALFORMED_REQUEST and "part 1" in got[4].statusMsg
    assert got[5].statusCode == pb.MESSAGE_TOO_LARGE and "part 1" in got[5].statusMsg
    assert not got[4].multiPublishResponse.answers and not got[5].multiPublishResponse.answers
    # the refused requests stored nothing: the old-style publish to ``a`` continues at seq id 4
    assert got[6].statusCode == pb.SUCCESS and got[6].publishResponse.publishedMsgId.localComponent == 4
    assert got[7].statusCode == pb.SUCCESS and got[7].HasField("multiPublishResponse")
    async with r:
        await cols[a].wait(lambda g: len(g) == 3)
        await cols[b].wait(lambda g: len(g) == 3)
        assert [m.body for m in cols[a].got] == [b"a2", b"a3", b"a4"]
        assert [m.body for m in cols[b].got] == [b"b2", b"b3", b"b4"]


async def test_a_part_the_hub_does_not_own_is_redirected_alone_and_the_others_are_stored(
        cluster: LocalCluster) -> None:
    here, moved = names(2)
    hub0, hub1 = cluster.hub_addresses
    assert (await raw_exchange(hub0, publish_req(here, b"h1", 1), 1))[0].statusCode == pb.SUCCESS
    assert (await raw_exchange(hub1, publish_req(moved, b"m1", 1), 1))[0].statusCode == pb.SUCCESS
    async with await HedwigClient.connect(hub0) as c, await HedwigClient.connect(hub0) as r:
        cols = await collect(r, [here, moved])   # from seq id 2 on
        assert await asyncio.gather(c.publish(here, b"h2"), c.publish(moved, b"m2")) == [2, 2]
        assert c.owner[moved] != c.owner[here]
        c.owner[moved] = c.owner[here]            # believed owned there, as after the topic moved
        sent = count_requests(c)
        assert await asyncio.gather(c.publish_async(here, b"h3"), c.publish_async(moved, b"m3")) == [3, 3]
        assert sent["multi"] == 1 and sent["parts"] == 2      # the redirected part went again alone
        assert c.owner[moved] != c.owner[here]    # learnt from the redirect
        assert await asyncio.gather(c.publish_async(here, b"h4"), c.publish_async(moved, b"m4")) == [4, 4]
        for topic, tag in ((here, b"h"), (moved, b"m")):
            await cols[topic].wait(lambda g: len(g) == 3)
            assert [m.body for m in cols[topic].got] == [tag + b"2", tag + b"3", tag + b"4"]


@asynccontextmanager
async def old_hub(hub: str, answer: Callable[[pb.PubSubRequest], bytes] | None = None
                  ) -> AsyncIterator[tuple[str, list[int]]]:
    """A proxy to ``hub`` that answers PUBLISH_MULTI as a hub that predates it does (UNKNOWN_OPERATION, nothing
    stored; or with ``answer(request)``'s frame) and passes every other frame through; its address, and the txn
    ids it refused (answered)."""
    refused: list[int] = []
    host, port = hub.split(":")
    tasks: set[asyncio.Task[None]] = set()

    async def frames(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
        while True:
            try:
                head = await reader.readexactly(4)
                yield head + await reader.readexactly(struct.unpack(">I", head)[0])
            except asyncio.IncompleteReadError:
                return

    async def serve(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        hub_r, hub_w = await asyncio.open_connection(host, int(port))

        async def back() -> None:   # whole frames only, so a refusal never lands inside one
            async for frame in frames(hub_r):
                client_w.write(frame)
            client_w.close()

        task = asyncio.create_task(back())
        tasks.add(task)
        async for frame in frames(client_r):
            req = pb.PubSubRequest.FromString(frame[4:])
            if req.type == pb.PUBLISH_MULTI:
                refused.append(req.txnId)
                client_w.write(encode(response(req.txnId, pb.UNKNOWN_OPERATION, "unknown operation 11"))
                               if answer is None else answer(req))
            else:
                hub_w.write(frame)
        hub_w.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}", refused
    finally:
        server.close()
        for task in tasks:
            task.cancel()


async def test_a_hub_that_predates_publish_multi_gets_each_part_as_a_request_of_its_own(
        cluster: LocalCluster) -> None:
    proxied = names(8)
    claims = await raw_exchange(cluster.hub_addresses[0],   # claimed by the hub behind the proxy
                                b"".join(publish_req(t, b"first", i + 1) for i, t in enumerate(proxied)), 8)
    assert {x.statusCode for x in claims} == {pb.SUCCESS}
    async with old_hub(cluster.hub_addresses[0]) as (address, refused), \
            await HedwigClient.connect(address) as c:
        await asyncio.gather(*(c.publish(t, b"second") for t in proxied))
        assert {c.owner[t] for t in proxied} == {address}
        async with await HedwigClient.connect(cluster.hub_addresses[0]) as r:
            cols = await collect(r, proxied)   # from seq id 3 on
            sent = count_requests(c)
            for turn in range(3):
                seqs = await asyncio.gather(*(c.publish_async(t, b"%d" % turn) for t in proxied))
                assert seqs == [turn + 3] * len(proxied)
            assert len(refused) == 1 and not c.conns[address].multi_publish   # refused once, then not sent again
            assert sent["multi"] == 1 and sent["single"] == 3 * len(proxied)
            for col in cols.values():
                await col.wait(lambda g: len(g) == 3)
                assert [m.body for m in col.got] == [b"0", b"1", b"2"]


@pytest.mark.parametrize("txn", [0, 1, 300, 2**40])
async def test_the_hand_made_frames_are_what_protobuf_serializes(txn: int) -> None:
    parts = [(b"t1", [b"a"]), (b"t2", [b"b", b"", b"c" * 200]), (b"t3", [b""]), (b"t" * 255, [b"d" * 20000])]
    assert publish_multi(txn, parts) == multi_req(txn, *parts)
    resp = pb.PubSubResponse(protocolVersion=pb.VERSION_ONE, txnId=txn)
    answers = resp.multiPublishResponse.answers
    answers.add().publishResponse.publishedMsgId.localComponent = 5
    batch = answers.add().publishResponse
    batch.publishedMsgId.localComponent, batch.stored = 2**33, 3
    answers.add(statusCode=pb.SERVICE_DOWN, statusMsg="down")
    answers.add().publishResponse.SetInParent()     # first 0, nothing stored: an empty publish response
    made = [part_published(5, 1, False), part_published(2**33, 3, True), answers[2].SerializeToString(),
            part_published(0, 0, True)]
    assert multi_published(txn, made) == encode(resp)
    # a plain part's seq id as an int: encoded with the frame as part_published(seq, 0, False) is
    for seq in (1, 127, 128, 2**33, 2**63 - 1):
        plain = [seq, *made, seq]
        assert multi_published(txn, plain) == multi_published(txn, [part_published(seq, 0, False), *made,
                                                                     part_published(seq, 0, False)])
