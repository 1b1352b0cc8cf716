"""Topic compaction: the compacted reader's output, incremental runs, the admin API and console, the automatic
threshold, and a run interrupted by kill -9 of the owner (real processes)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import pytest_asyncio

from bookie.client import BookKeeper
from bookie.errors import NoSuchLedgerError
from hub.client import HedwigClient
from hub.compaction import PAUSE_FILE_ENV
from hub.message import Message
from tools.cluster import LocalCluster

from .conftest import HUB_CONF, hub_url

pytestmark = pytest.mark.asyncio(loop_scope="module")

TIMEOUT = 30.0


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(tmp_path_factory: Any) -> AsyncIterator[tuple[LocalCluster, Path]]:
    root: Path = tmp_path_factory.mktemp("compaction")
    pause = root / "pause"
    saved = os.environ.get(PAUSE_FILE_ENV)
    os.environ[PAUSE_FILE_ENV] = str(pause)     # the hubs inherit it: a run pauses while the file exists
    conf = dict(HUB_CONF, max_entries_per_ledger="3", messages_consumed_thread_run_interval="300",
                zk_timeout="3000")    # a lost session under a loaded machine releases topics mid-test
    try:
        async with LocalCluster(bookies=2, hubs=1, data_dir=root, conf_overrides=conf) as cluster:
            yield cluster, pause
    finally:
        if saved is None:
            os.environ.pop(PAUSE_FILE_ENV, None)
        else:
            os.environ[PAUSE_FILE_ENV] = saved


@pytest_asyncio.fixture(loop_scope="module")
async def c(env: tuple[LocalCluster, Path]) -> AsyncIterator[HedwigClient]:
    async with await HedwigClient.connect(env[0].hub_addresses[0]) as client:
        yield client


def new_topic() -> bytes:
    return b"compact-" + uuid.uuid4().hex[:8].encode()


async def admin(cluster: LocalCluster, method: str, path: str, **kw: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT)) as http, \
            http.request(method, hub_url(cluster, 0) + path, **kw) as resp:
        text = await resp.text()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text


def topic_path(topic: bytes) -> str:
    return f"/admin/v1/topics/{quote(topic.decode(), safe='')}"


async def compact(cluster: LocalCluster, topic: bytes) -> dict[str, Any]:
    status, doc = await admin(cluster, "POST", topic_path(topic) + "/compact")
    assert status == 200, doc
    return doc   # type: ignore[no-any-return]


async def read_all(c: HedwigClient, topic: bytes, start: int, n: int, compacted: bool = True) -> list[Message]:
    """``n`` messages of a reader from ``start``, then nothing more within a short wait."""
    async with await c.reader(topic, start_seq_id=start, compacted=compacted) as r:
        got = [await r.read_next(timeout=TIMEOUT) for _ in range(n)]
        with pytest.raises(TimeoutError):
            await r.read_next(timeout=0.3)
    return got


def view(msgs: list[Message]) -> list[tuple[int, bytes | None, bytes]]:
    return [(m.seq_id, m.key, m.body) for m in msgs]


async def ledger_exists(cluster: LocalCluster, ledger_id: int) -> bool:
    async with await BookKeeper.connect(cluster.metastore_uri) as bk:
        try:
            await bk.ledgers.read(ledger_id)
        except NoSuchLedgerError:
            return False
    return True


async def wait_status(cluster: LocalCluster, topic: bytes, ok: Any) -> dict[str, Any]:
    """Poll the compaction status until ``ok(status)`` (an event of another process: no notification)."""
    async with asyncio.timeout(TIMEOUT):
        while True:
            status, doc = await admin(cluster, "GET", topic_path(topic) + "/compaction")
            if status == 200 and ok(doc):
                return doc   # type: ignore[no-any-return]
            await asyncio.sleep(0.1)


async def test_compacted_reader_and_an_incremental_second_run(env: tuple[LocalCluster, Path],
                                                              c: HedwigClient) -> None:
    cluster, _ = env
    topic = new_topic()
    await c.subscribe(topic, b"keep")          # nothing is consumed: every ledger stays
    for body, key, props in [(b"a1", b"k1", None), (b"b1", b"k2", None), (b"x", None, None), (b"a2", b"k1", None),
                             (b"c1", b"k3", None), (b"", b"k2", None), (b"c2", b"k3", {"p": b"v"}),
                             (b"d1", b"k4", None)]:
        await c.publish(topic, body, props, key=key)
    first = await compact(cluster, topic)
    assert (first["status"], first["compacted_up_to_seq_id"], first["messages"]) == ("idle", 8, 3)
    assert first["ledger_id"] and first["last_run_ms"] and first["pending_ledger_id"] is None
    again = await compact(cluster, topic)        # nothing new: the same ledger
    assert (again["ledger_id"], again["compacted_up_to_seq_id"]) == (first["ledger_id"], 8)
    assert await c.publish(topic, b"a3", key=b"k1") == 9
    assert await c.publish(topic, b"y") == 10

    plain = {m.seq_id: m for m in await read_all(c, topic, 1, 10, compacted=False)}
    got = await read_all(c, topic, 1, 5)
    # newest per key up to 8 (k2 deleted by its empty body, the keyless 3 left out), then all after 8
    assert view(got) == [(4, b"k1", b"a2"), (7, b"k3", b"c2"), (8, b"k4", b"d1"), (9, b"k1", b"a3"), (10, None, b"y")]
    for m in got:    # as stored: properties and publish time kept
        assert (m.properties, m.publish_time_ms) == (plain[m.seq_id].properties, plain[m.seq_id].publish_time_ms)
    assert got[1].properties == {"p": b"v"}
    assert view(await read_all(c, topic, 5, 4)) == view(got[1:])          # from within the compacted part
    assert view(await read_all(c, topic, 9, 2)) == view(got[3:])          # beyond the point: the topic itself

    # more, and a second run reads the first's ledger and the rest
    assert await c.publish(topic, b"", key=b"k4") == 11
    assert await c.publish(topic, b"e1", key=b"k5") == 12
    second = await compact(cluster, topic)
    assert (second["compacted_up_to_seq_id"], second["messages"]) == (12, 3)   # k1@9, k3@7, k5@12
    assert second["ledger_id"] != first["ledger_id"]
    assert not await ledger_exists(cluster, first["ledger_id"])          # the previous one, once replaced
    assert view(await read_all(c, topic, 1, 3)) == [(7, b"k3", b"c2"), (9, b"k1", b"a3"), (12, b"k5", b"e1")]
    # the stats carry it; a reader of a topic never compacted reads it all
    status, stats = await admin(cluster, "GET", topic_path(topic) + "/stats")
    assert status == 200 and stats["compaction"]["ledger_id"] == second["ledger_id"]
    other = new_topic()
    await c.subscribe(other, b"keep")
    await c.publish(other, b"only", key=b"k")
    assert view(await read_all(c, other, 1, 1)) == [(1, b"k", b"only")]


async def test_the_compacted_part_outlives_consumed_ledgers(env: tuple[LocalCluster, Path], c: HedwigClient) -> None:
    """Without a threshold compaction holds nothing back: consumed ledgers go, the record and its keys stay."""
    cluster, _ = env
    topic = new_topic()
    await c.subscribe(topic, b"s")
    for i in range(9):       # three ledgers of three entries (max_entries_per_ledger 3), then a fourth
        await c.publish(topic, b"v%d" % i, key=b"k%d" % (i % 2))
    first = await compact(cluster, topic)
    assert (first["compacted_up_to_seq_id"], first["messages"]) == (9, 2)
    await c.publish(topic, b"tail", key=b"k0")
    await c.consume(topic, b"s", 10)
    async with asyncio.timeout(TIMEOUT):       # the consumed-ledger timer (300 ms) deletes them
        while True:
            _, stats = await admin(cluster, "GET", topic_path(topic) + "/stats")
            if stats["ledgers"] and stats["ledgers"][0]["start_seq_id"] > 9:
                break
            await asyncio.sleep(0.1)
    assert stats["compaction"]["ledger_id"] == first["ledger_id"]      # kept across the range rewrites
    assert view(await read_all(c, topic, 1, 3)) == [(8, b"k1", b"v7"), (9, b"k0", b"v8"), (10, b"k0", b"tail")]


async def console(cluster: LocalCluster, *commands: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "tools.cli", "console", "--server", cluster.hub_addresses[0], "--metastore",
            cluster.metastore_uri]
    for command in commands:
        args += ["-c", command]
    return await asyncio.to_thread(subprocess.run, args, capture_output=True, text=True, timeout=90)


async def test_admin_api_and_console_with_bad_input(env: tuple[LocalCluster, Path], c: HedwigClient) -> None:
    cluster, _ = env
    topic = new_topic()
    await c.subscribe(topic, b"keep")
    for i in range(4):
        await c.publish(topic, b"v%d" % i, key=b"k%d" % (i % 2))
    path = topic_path(topic)
    status, doc = await admin(cluster, "GET", path + "/compaction")
    assert status == 200 and (doc["status"], doc["ledger_id"]) == ("idle", None)
    assert (await admin(cluster, "POST", topic_path(b"no-such-topic") + "/compact"))[0] == 404
    assert (await admin(cluster, "GET", topic_path(b"no-such-topic") + "/compaction"))[0] == 404
    assert (await admin(cluster, "GET", path + "/compact"))[0] == 405                # bad method
    assert (await admin(cluster, "DELETE", path + "/compaction"))[0] == 405
    status, doc = await admin(cluster, "POST", path + "/compact", headers={"Authorization": "Bearer guess"})
    assert status == 401 and "http_admin_token" in doc["error"]      # the admin token machinery guards it
    status, doc = await admin(cluster, "POST", path + "/compact?wait=maybe")
    assert status == 400 and "wait" in doc["error"]
    status, doc = await admin(cluster, "POST", path + "/compact?wait=false")     # started; polled
    assert status == 202 and doc["topic"] == topic.decode()
    done = await wait_status(cluster, topic, lambda d: d["status"] == "idle" and d["compacted_up_to_seq_id"] == 4)
    assert done["messages"] == 2 and done["last_error"] is None
    async with aiohttp.ClientSession() as http, http.get(cluster.stats_urls[0]) as resp:
        assert 'hub_events_total{event="compactions_succeeded"}' in await resp.text()

    await c.publish(topic, b"v4", key=b"k0")
    res = await console(cluster, f"compact topic {topic.decode()}", f"compact topic {topic.decode()} --json",
                        f"describe topic {topic.decode()} --json", f"describe topic {topic.decode()}")
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert f"Topic {topic.decode()} compacted up to seq id 5 into ledger" in res.stdout
    as_json = json.loads(lines[2])
    assert (as_json["compacted_up_to_seq_id"], as_json["messages"]) == (5, 2)
    described = json.loads(lines[4])
    assert described["compaction"]["ledger_id"] == as_json["ledger_id"]
    assert f"Compacted ledger {as_json['ledger_id']} [ up to 5 ], 2 keys" in res.stdout
    bad = await console(cluster, "compact topic no-such-topic")
    assert bad.returncode != 0 and "does not exist" in bad.stdout + bad.stderr
    usage = await console(cluster, "compact topic")
    assert usage.returncode != 0 and "compact topic {topic}" in usage.stdout + usage.stderr
    assert await c.publish(topic, b"still serving", key=b"k9") == 6              # the hub keeps serving


async def test_threshold_compacts_on_the_timer(env: tuple[LocalCluster, Path], c: HedwigClient) -> None:
    cluster, _ = env
    prefix = "auto-" + uuid.uuid4().hex[:6]
    topic = (prefix + "/t").encode()
    status, doc = await admin(cluster, "PUT", f"/admin/v1/policies/{prefix}", json={"compaction_threshold_bytes": -1})
    assert status == 400 and doc["key"] == "compaction_threshold_bytes"
    status, doc = await admin(cluster, "PUT", f"/admin/v1/policies/{prefix}", json={"compaction_threshold_bytes": 250})
    assert status == 200, doc
    await c.subscribe(topic, b"keep")
    for i in range(12):
        await c.publish(topic, b"x" * 50, key=b"k%d" % (i % 3))
    done = await wait_status(cluster, topic, lambda d: d["ledger_id"] is not None and d["status"] == "idle")
    assert done["messages"] == 3 and done["compacted_up_to_seq_id"] >= 3     # the three keys, once over the threshold
    status, _ = await admin(cluster, "DELETE", f"/admin/v1/policies/{prefix}")
    assert status == 200


async def test_a_run_killed_half_way_is_never_read_and_runs_again(env: tuple[LocalCluster, Path]) -> None:
    cluster, pause = env
    topic = new_topic()
    keys = 250          # three entries of the compacted ledger: the run pauses after the first
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        await c.subscribe(topic, b"keep")
        await asyncio.gather(*(c.publish_async(topic, b"old%d" % i, key=b"k%d" % i) for i in range(keys)))
        first = await compact(cluster, topic)
        assert first["compacted_up_to_seq_id"] == keys
        await asyncio.gather(*(c.publish_async(topic, b"new%d" % i, key=b"k%d" % i) for i in range(keys)))
    pause.touch()
    status, doc = await admin(cluster, "POST", topic_path(topic) + "/compact?wait=false")
    assert status == 202, doc
    paused = await wait_status(cluster, topic, lambda d: d.get("paused"))
    half = paused["pending_ledger_id"]
    assert half and paused["entries_written"] == 1 and paused["ledger_id"] == first["ledger_id"]
    await cluster.kill_hub(0)                  # kill -9 with the new compacted ledger half written
    pause.unlink()
    res = await console(cluster, f"describe topic {topic.decode()} --json")      # the record in the metastore
    assert res.returncode == 0, res.stdout + res.stderr
    record = json.loads(res.stdout.splitlines()[0])["compaction"]
    assert (record["ledger_id"], record["pending_ledger_id"]) == (first["ledger_id"], half)
    await cluster.restart_hub(0)

    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        # the half-written ledger is never read: the first compaction, then everything after it
        got = await read_all(c, topic, 1, 2 * keys)
        assert [m.seq_id for m in got] == list(range(1, 2 * keys + 1))
        assert got[keys].body == b"new0"
        again = await compact(cluster, topic)
        assert (again["compacted_up_to_seq_id"], again["messages"], again["pending_ledger_id"]) == (2 * keys, keys,
                                                                                                    None)
        assert again["ledger_id"] not in (half, first["ledger_id"])
        assert not await ledger_exists(cluster, half) and not await ledger_exists(cluster, first["ledger_id"])
        got = await read_all(c, topic, 1, keys)
        assert [(m.seq_id, m.body) for m in got] == [(keys + i + 1, b"new%d" % i) for i in range(keys)]
        assert await c.publish(topic, b"after", key=b"k0") == 2 * keys + 1
