"""Readers and seek by seq id or publish time; admin reset by time; consume --start-* (real processes)."""

from __future__ import annotations

import asyncio
import datetime
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import pytest_asyncio

from hub import errors
from hub.client import HedwigClient
from hub.proto import pubsub_pb2 as pb
from metastore import Value, open_metastore
from tools.cluster import LocalCluster

from .conftest import HUB_CONF, hub_url

pytestmark = pytest.mark.asyncio(loop_scope="module")

N = 12   # max_entries_per_ledger 2, one entry per awaited publish: six ledgers


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(tmp_path_factory: Any) -> AsyncIterator[tuple[LocalCluster, HedwigClient]]:
    root: Path = tmp_path_factory.mktemp("readers")
    conf = dict(HUB_CONF, max_entries_per_ledger="2")
    async with LocalCluster(bookies=2, hubs=1, data_dir=root, conf_overrides=conf) as cluster:
        async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
            yield cluster, c


async def filled(c: HedwigClient) -> tuple[bytes, dict[int, int]]:
    """A topic with N messages kept by an idle subscription ``keep``; seq id -> publish time."""
    topic = uuid.uuid4().hex[:10].encode()
    await c.subscribe(topic, b"keep")
    for i in range(N):
        await c.publish(topic, b"m%d" % (i + 1))
    times: dict[int, int] = {}
    async with await c.reader(topic, start_seq_id=1) as r:
        for _ in range(N):
            m = await r.read_next(timeout=20)
            times[m.seq_id] = m.publish_time_ms
    assert sorted(times) == list(range(1, N + 1))
    return topic, times


def first_at(times: dict[int, int], t: int) -> int:
    return min((s for s, pt in times.items() if pt >= t), default=N + 1)


async def read(r: Any, n: int) -> list[int]:
    return [(await r.read_next(timeout=20)).seq_id for _ in range(n)]


async def test_reader_from_seq_and_time_across_ledgers(env: tuple[LocalCluster, HedwigClient]) -> None:
    cluster, c = env
    topic, times = await filled(c)
    async with await c.reader(topic, start_seq_id=5) as r:
        assert r.start_seq_id == 5
        assert await read(r, N - 4) == list(range(5, N + 1))
    t = times[8]
    async with await c.reader(topic, start_publish_time_ms=t) as r:
        want = first_at(times, t)
        assert want <= 8
        assert await read(r, N + 1 - want) == list(range(want, N + 1))
    async with await c.reader(topic, start_publish_time_ms=0) as r:       # before the first: the first
        assert await read(r, 1) == [1]
    async with await c.reader(topic, start_publish_time_ms=times[N] + 60_000) as r:   # after the last: the next
        assert r.start_seq_id == N + 1
        assert await c.publish(topic, b"next") == N + 1
        assert await read(r, 1) == [N + 1]
    # the closed ranges record their first message's time (the current one may not yet)
    ms = await open_metastore(cluster.metastore_uri)
    try:
        table = await ms.create_table("topic_persistence")
        ranges = pb.LedgerRanges.FromString((await table.get(topic.decode())).value["data"]).ranges
    finally:
        await ms.close()
    closed = [r for r in ranges if r.HasField("endSeqIdIncluded")]
    assert len(closed) >= 5
    assert all(r.firstPublishTimeMs == times[r.startSeqIdIncluded] for r in closed)
    # readers keep no subscription once closed
    async with aiohttp.ClientSession() as http, \
            http.get(f"{hub_url(cluster, 0)}/admin/v1/topics/{quote(topic.decode())}/stats") as resp:
        subs = (await resp.json())["subscriptions"]
    assert list(subs) == ["keep"]


@pytest.mark.parametrize("stype", ["EXCLUSIVE", "SHARED"])
async def test_seek_by_seq_and_time(env: tuple[LocalCluster, HedwigClient], stype: str) -> None:
    _, c = env
    topic, times = await filled(c)
    async with await c.consumer(topic, b"s", subscription_type=stype) as con:
        assert await c.seek(topic, b"s", seq_id=1) == 1
        got = [(await con.receive(timeout=20)) for _ in range(N)]
        assert [m.seq_id for m in got] == list(range(1, N + 1))
        for m in got:
            await con.ack(m)
        assert await c.seek(topic, b"s", seq_id=3) == 3
        assert (await con.receive(timeout=20)).seq_id == 3
        t = times[9]
        want = first_at(times, t)
        assert await c.seek(topic, b"s", publish_time_ms=t) == want
        assert (await con.receive(timeout=20)).seq_id == want
        assert await c.seek(topic, b"s", publish_time_ms=0) == 1          # before the first: the first
        assert (await con.receive(timeout=20)).seq_id == 1
        assert await c.seek(topic, b"s", publish_time_ms=times[N] + 60_000) == N + 1   # after the last: the end
        assert await c.publish(topic, b"after") == N + 1
        assert (await con.receive(timeout=20)).seq_id == N + 1


async def test_admin_reset_by_time_and_bad_input(env: tuple[LocalCluster, HedwigClient]) -> None:
    cluster, c = env
    topic, times = await filled(c)
    url = f"{hub_url(cluster, 0)}/admin/v1/topics/{quote(topic.decode())}/subscriptions/keep/reset"
    async with aiohttp.ClientSession() as http:
        t = times[6]
        async with http.post(url, json={"publish_time_ms": t}) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["seq_id"] == first_at(times, t)
        for bad in ({"publish_time_ms": -1}, {"seq_id": 2, "publish_time_ms": t}, {}, {"publish_time_ms": "x"}):
            async with http.post(url, json=bad) as resp:
                assert resp.status == 400, bad
    # client-side errors
    for kw in ({"seq_id": 1, "publish_time_ms": 1}, {}, {"publish_time_ms": -5}, {"seq_id": 0}):
        with pytest.raises(ValueError):
            await c.seek(topic, b"keep", **kw)
    with pytest.raises(ValueError):
        await c.reader(topic, start_publish_time_ms=-1)
    with pytest.raises(ValueError):
        await c.reader(topic)
    with pytest.raises(ValueError):     # a compacted reader starts at a seq id (tests/hub/test_compaction.py)
        await c.reader(topic, start_publish_time_ms=1, compacted=True)
    with pytest.raises(errors.NoSuchTopicError):
        await c.reader(b"never-" + uuid.uuid4().hex[:6].encode(), start_seq_id=1)
    with pytest.raises(errors.MalformedRequestError):
        await c.seek(topic, b"keep", seq_id=N + 5)               # past the end
    with pytest.raises(errors.ClientNotSubscribedError):
        await c.seek(topic, b"nobody", seq_id=1)
    assert await c.publish(topic, b"still serving") == N + 1     # the hub keeps serving


async def cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tools.cli", "client", *args, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


async def test_consume_start_seq_and_time(env: tuple[LocalCluster, HedwigClient]) -> None:
    cluster, c = env
    topic, times = await filled(c)
    hub = cluster.hub_addresses[0]
    rc, out, err = await cli("consume", topic.decode(), "-s", "cli", "-n", "2", "--start-seq", "3", "--server", hub)
    assert rc == 0, err
    assert [line.split("\t")[0] for line in out.splitlines()] == ["3", "4"]
    t = times[7]
    iso = datetime.datetime.fromtimestamp(t / 1000, datetime.UTC).isoformat(timespec="milliseconds")
    rc, out, err = await cli("consume", topic.decode(), "-s", "cli2", "-n", "1", "--type", "shared",
                             "--start-time", iso, "--server", hub)
    assert rc == 0, err
    assert out.split("\t")[0] == str(first_at(times, t))
    rc, _, err = await cli("consume", topic.decode(), "-s", "x", "--start-time", "yesterday", "--server", hub)
    assert rc == 2 and "ISO 8601" in err


async def test_ranges_without_times_and_a_released_topic(env: tuple[LocalCluster, HedwigClient]) -> None:
    """Ranges recorded before they carried a time are read by their first entry; an admin reset by time
    on a topic no hub holds loads it."""
    cluster, c = env
    topic, times = await filled(c)
    await c.close_subscription(topic, b"keep")   # else its resubscribe takes the topic again at once, racing
    base = f"{hub_url(cluster, 0)}/admin/v1/topics/{quote(topic.decode())}"   # the record's edit below
    async with aiohttp.ClientSession() as http:
        async with http.post(base + "/release") as resp:
            assert resp.status == 200, await resp.text()
        ms = await open_metastore(cluster.metastore_uri)
        try:
            table = await ms.create_table("topic_persistence")
            got = await table.get(topic.decode())
            ranges = pb.LedgerRanges.FromString(got.value["data"])
            assert any(r.firstPublishTimeMs for r in ranges.ranges)
            for r in ranges.ranges:
                r.ClearField("firstPublishTimeMs")     # as an older Quire wrote them
            await table.put(topic.decode(), Value({"data": ranges.SerializeToString()}), got.version)
        finally:
            await ms.close()
        t = times[10]
        async with http.post(base + "/subscriptions/keep/reset", json={"publish_time_ms": t}) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["seq_id"] == first_at(times, t)
    t = times[4]
    async with await c.reader(topic, start_publish_time_ms=t) as r:
        assert r.start_seq_id == first_at(times, t)
        assert await read(r, 2) == [first_at(times, t), first_at(times, t) + 1]
