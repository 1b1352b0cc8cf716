"""Clients that misbehave at the socket level, against real hub processes: half-close, stalls, memory."""

from __future__ import annotations

import asyncio
import struct
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from bookie.protocol import FrameDecoder
from hub.client import HedwigClient
from hub.proto import pubsub_pb2 as pb
from hub.protocol import encode
from tests.hub.conftest import HUB_CONF
from tools.cluster import LocalCluster

pytestmark = pytest.mark.asyncio(loop_scope="module")
TIMEOUT = 20.0
PARTIAL_BUDGET = 8 << 20
STALL_MS = 1500


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    root = tmp_path_factory.mktemp("hostile")
    conf = {**HUB_CONF, "max_partial_frame_bytes": str(PARTIAL_BUDGET), "incomplete_frame_timeout": str(STALL_MS)}
    async with LocalCluster(bookies=2, hubs=1, data_dir=root, conf_overrides=conf) as c:
        yield c


def name() -> bytes:
    return uuid.uuid4().hex[:10].encode()


def publish_frame(topic: bytes, body: bytes, txn: int) -> bytes:
    req = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.PUBLISH, txnId=txn, topic=topic)
    req.publishRequest.topic = topic
    req.publishRequest.msg.body = body
    return encode(req)


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM) in bytes."""
    for line in open(f"/proc/{pid}/status").read().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


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


async def test_partial_frames_are_capped_hub_wide_and_stalled_ones_closed(cluster: LocalCluster) -> None:
    host, port = cluster.hub_addresses[0].split(":")
    pid = cluster.hub_pid(0)
    assert pid is not None
    peak_before = peak_rss(pid)
    body, n = 1_900_000, 40
    streams = []
    for _ in range(n):      # 40 x 1.9 MB of frames that never complete: 76 MB against a budget of 8 MiB
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(struct.pack(">I", 2_000_000) + b"x" * body)
        streams.append((reader, writer))
    await asyncio.gather(*(w.drain() for _, w in streams), return_exceptions=True)   # some are reset at once
    t0 = time.monotonic()

    async def closed_at(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> float:
        while True:          # a byte a second (here: every 0.2 s) while the hub keeps the connection open
            try:
                data = await asyncio.wait_for(reader.read(1), 0.2)
            except TimeoutError:
                writer.write(b"x")
                continue
            except ConnectionError:
                data = b""
            assert data == b""
            return time.monotonic() - t0

    try:
        async with asyncio.timeout(TIMEOUT):
            ends = sorted(await asyncio.gather(*(closed_at(r, w) for r, w in streams)))
    finally:
        for _, w in streams:
            w.close()
    over_budget = [e for e in ends if e < STALL_MS / 1000 - 0.3]
    assert len(over_budget) >= n - PARTIAL_BUDGET // (body + 4), ends    # closed at once: over the budget
    assert all(e < STALL_MS / 1000 + 3.0 for e in ends), ends               # the rest: when they stalled
    grown = peak_rss(pid) - peak_before
    assert grown < 4 * PARTIAL_BUDGET, f"peak RSS grew by {grown >> 20} MiB"   # holding it all: 76 MB and up
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:   # and the hub still serves
        assert await c.publish(name(), b"fine") == 1
