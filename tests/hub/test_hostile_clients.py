"""Clients that misbehave at the socket level, against real hub processes: half-close, stalls, memory."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from bookie.protocol import FrameDecoder
from hub.client import HedwigClient
from hub.proto import pubsub_pb2 as pb
from hub.protocol import encode
from tools.cluster import LocalCluster

pytestmark = pytest.mark.asyncio(loop_scope="module")
TIMEOUT = 20.0


def name() -> bytes:
    return uuid.uuid4().hex[:10].encode()


def publish_frame(topic: bytes, body: bytes, txn: int) -> bytes:
    req = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.PUBLISH, txnId=txn, topic=topic)
    req.publishRequest.topic = topic
    req.publishRequest.msg.body = body
    return encode(req)


async def owner_of(cluster: LocalCluster, topic: bytes) -> tuple[str, int]:
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        await c.publish(topic, b"claim")
        host, port = c.owner[topic].split(":")
    return host, int(port)


async def test_half_closed_client_still_gets_the_answers_of_its_publishes(cluster: LocalCluster) -> None:
    topic = name()
    host, port = await owner_of(cluster, topic)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"".join(publish_frame(topic, b"m%d" % i, i) for i in range(1, 4)))
        writer.write_eof()                       # shutdown(SHUT_WR): nothing more to send, still reading
        async with asyncio.timeout(TIMEOUT):
            data = await reader.read()           # to EOF: the hub closes once it has answered
    finally:
        writer.close()
    got = [pb.PubSubResponse.FromString(f) for f in FrameDecoder(1 << 20).feed(data)]
    assert [(r.txnId, r.statusCode) for r in got] == [(1, pb.SUCCESS), (2, pb.SUCCESS), (3, pb.SUCCESS)]
    assert [r.publishResponse.publishedMsgId.localComponent for r in got] == [2, 3, 4]
