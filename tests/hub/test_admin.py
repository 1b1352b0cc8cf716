"""The hub's HTTP admin API (``hub.admin``) on real hub and bookie processes, with a real HTTP client."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from bookie.client import BookKeeper
from bookie.errors import NoSuchLedgerError
from hub.client import HedwigClient, Message
from tests.fixtures.polling import eventually
from tools.cluster import LocalCluster

from .conftest import hub_url

in_cluster = pytest.mark.asyncio(loop_scope="module")
pytestmark = pytest.mark.timeout(120)

TOKEN = "hub-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CONF = {"bk_ensemble_size": "1", "bk_write_quorum_size": "1", "bk_ack_quorum_size": "1", "zk_timeout": "1000",
        "http_admin_token": TOKEN}
MANUAL = {"auto_send_consume_message_enabled": "false"}
NO_FORWARD = {"X-Quire-Forwarded": "test"}     # as if forwarded once already: the hub answers itself


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(bookies=1, hubs=2, data_dir=tmp_path_factory.mktemp("hubadmin"),
                            conf_overrides=CONF) as c:
        yield c


def topic_url(cluster: LocalCluster, i: int, topic: str) -> str:
    return f"{hub_url(cluster, i)}/admin/v1/topics/{quote(topic, safe='')}"


async def call(http: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> tuple[int, Any]:
    async with http.request(method, url, **kw) as resp:
        return resp.status, await resp.json(content_type=None)



async def owner_index(cluster: LocalCluster, http: aiohttp.ClientSession, topic: str) -> int:
    status, stats = await call(http, "GET", topic_url(cluster, 0, topic) + "/stats")
    assert status == 200, stats
    return cluster.hub_addresses.index(stats["owner"])


class Received:
    """A delivery handler that records seq ids and lets a test await a count."""

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self._changed = asyncio.Event()

    async def __call__(self, topic: bytes, sub: bytes, msg: Message) -> None:
        self.seqs.append(msg.seq_id)
        self._changed.set()

    async def wait_for(self, n: int, timeout: float = 20.0) -> list[int]:
        async def until() -> None:
            while len(self.seqs) < n:
                self._changed.clear()
                await self._changed.wait()
        await asyncio.wait_for(until(), timeout)
        return list(self.seqs)


@in_cluster
async def test_health_ready_metrics_and_unknown_paths(cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    assert len(cluster.stats_urls) == 3          # two hubs, one bookie
    for i in range(2):
        assert (await call(http, "GET", hub_url(cluster, i) + "/healthz"))[0] == 200
        assert (await call(http, "GET", hub_url(cluster, i) + "/heartbeat"))[0] == 200
        assert await call(http, "GET", hub_url(cluster, i) + "/readyz") == (200, {"ready": True})
    async with http.get(cluster.stats_urls[0]) as resp:
        assert resp.status == 200
        names = {f.name for f in text_string_to_metric_families(await resp.text())}
    assert "hub_packets_received" in names and "hub_readahead_cache_hits" in names
    status, body = await call(http, "GET", hub_url(cluster, 0) + "/admin/v1/nothing")
    assert status == 404 and "error" in body


@in_cluster
async def test_topic_stats_match_what_was_published_and_consumed(cluster: LocalCluster,
                                                                 http: aiohttp.ClientSession) -> None:
    topic = f"admin/stats topic {uuid.uuid4().hex[:8]}"     # '/' and ' ' travel URL-encoded
    got = Received()
    async with await HedwigClient.connect(cluster.hub_addresses[0], MANUAL) as c:
        await c.subscribe(topic.encode(), b"s1", options={"app": b"demo"})
        await c.start_delivery(topic.encode(), b"s1", got)
        for i in range(5):
            assert await c.publish(topic.encode(), b"m%d" % i) == i + 1
        assert await got.wait_for(5) == [1, 2, 3, 4, 5]
        await c.consume(topic.encode(), b"s1", 3)
        owner = await owner_index(cluster, http, topic)
        other = 1 - owner

        async def consumed_3() -> dict[str, Any] | None:
            stats = (await call(http, "GET", topic_url(cluster, owner, topic) + "/stats"))[1]
            return stats if stats["subscriptions"]["s1"]["consumed_seq_id"] == 3 else None

        stats = await eventually(consumed_3)
        assert stats["owner"] == cluster.hub_addresses[owner] and stats["last_seq_id"] == 5
        s1 = stats["subscriptions"]["s1"]
        assert {k: s1[k] for k in ("consumed_seq_id", "backlog", "attached", "type", "unacked",
                                   "redelivered_total")} == {"consumed_seq_id": 3, "backlog": 2, "attached": True,
                                                             "type": "EXCLUSIVE", "unacked": 2,
                                                             "redelivered_total": 0}
        assert [x["unacked"] for x in s1["consumers"]] == [2] and s1["msg_rate_out"] >= 0
        assert stats["subscriptions"]["s1"]["preferences"]["options"] == {"app": "demo"}
        assert stats["ledgers"][0]["start_seq_id"] == 1 and stats["ledgers"][-1]["end_seq_id"] == 5
        assert all(isinstance(r["ledger_id"], int) for r in stats["ledgers"])
        assert isinstance(stats["publish_rate"], float) and stats["publish_rate"] >= 0
        assert topic in (await call(http, "GET", hub_url(cluster, owner) + "/admin/v1/topics"))[1]
        assert topic not in (await call(http, "GET", hub_url(cluster, other) + "/admin/v1/topics"))[1]
        assert topic in (await call(http, "GET", hub_url(cluster, other) + "/admin/v1/topics?all=1"))[1]
        await c.close_subscription(topic.encode(), b"s1")      # the pointer is persisted on close

    # the other hub forwards to the owner...
    status, fwd = await call(http, "GET", topic_url(cluster, other, topic) + "/stats")
    assert status == 200 and fwd["owned_here"] is True and fwd["owner"] == cluster.hub_addresses[owner]
    assert fwd["subscriptions"]["s1"]["attached"] is False and fwd["last_seq_id"] == 5

    async def from_metastore() -> dict[str, Any] | None:   # ...or, not forwarding, reads the metastore and LAC
        s = (await call(http, "GET", topic_url(cluster, other, topic) + "/stats", headers=NO_FORWARD))[1]
        return s if s["last_seq_id"] == 5 and s["subscriptions"]["s1"]["consumed_seq_id"] == 3 else None

    seen = await eventually(from_metastore)
    assert seen["owned_here"] is False and seen["owner"] == cluster.hub_addresses[owner]
    assert seen["subscriptions"]["s1"]["backlog"] == 2 and seen["subscriptions"]["s1"]["attached"] is None
    assert [r["ledger_id"] for r in seen["ledgers"]] == [r["ledger_id"] for r in stats["ledgers"]]


@in_cluster
async def test_reset_redelivers_from_the_given_seq_id(cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    topic = f"reset-{uuid.uuid4().hex[:8]}"
    got = Received()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        await c.subscribe(topic.encode(), b"s")
        await c.start_delivery(topic.encode(), b"s", got)
        for i in range(6):
            await c.publish(topic.encode(), b"m%d" % i)
        assert await got.wait_for(6) == [1, 2, 3, 4, 5, 6]
        owner = await owner_index(cluster, http, topic)
        url = topic_url(cluster, owner, topic) + "/subscriptions/s/reset"
        assert (await call(http, "POST", url, json={"seq_id": 3}))[0] == 401        # no token
        for bad in ({"seq_id": "3"}, {"seq_id": 0}, {"seq_id": 99}, {"seq": 3}):
            status, body = await call(http, "POST", url, json=bad, headers=AUTH)
            assert status == 400 and "error" in body, (bad, status, body)
        status, body = await call(http, "POST", url, data=b"{oops", headers=AUTH)
        assert status == 400 and "error" in body
        assert got.seqs == [1, 2, 3, 4, 5, 6]                  # nothing above moved the pointer
        other = topic_url(cluster, 1 - owner, topic) + "/subscriptions/s/reset"     # forwarded to the owner
        status, body = await call(http, "POST", other, json={"seq_id": 3}, headers=AUTH)
        assert status == 200 and body["consumed_seq_id"] == 2
        assert (await got.wait_for(10))[6:] == [3, 4, 5, 6]    # the attached subscriber, from seq id 3
        status, body = await call(http, "POST", topic_url(cluster, owner, topic) + "/subscriptions/nobody/reset",
                                  json={"seq_id": 1}, headers=AUTH)
        assert status == 404 and "error" in body


@in_cluster
async def test_delete_topic_removes_its_ledgers_and_restarts_at_seq_1(cluster: LocalCluster,
                                                                      http: aiohttp.ClientSession) -> None:
    topic = f"delete-{uuid.uuid4().hex[:8]}"
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        await c.subscribe(topic.encode(), b"s")
        await c.start_delivery(topic.encode(), b"s", Received())
        for i in range(3):
            await c.publish(topic.encode(), b"m%d" % i)
        owner = await owner_index(cluster, http, topic)
        url = topic_url(cluster, owner, topic)
        ledgers = [r["ledger_id"] for r in (await call(http, "GET", url + "/stats"))[1]["ledgers"]]
        assert ledgers
        assert (await call(http, "DELETE", url))[0] == 401
        status, body = await call(http, "DELETE", topic_url(cluster, 1 - owner, topic), headers=AUTH)
        assert status == 409 and "attached" in body["error"]    # forwarded: only the owner knows who is attached
        status, body = await call(http, "DELETE", topic_url(cluster, 1 - owner, topic) + "?force=true",
                                  headers={**AUTH, **NO_FORWARD})
        assert status == 409 and cluster.hub_addresses[owner] in body["error"]   # not forwarded: ask the owner
        status, body = await call(http, "DELETE", url, headers=AUTH)
        assert status == 409 and "s" in body["error"]           # a subscriber is attached
        assert (await call(http, "GET", url + "/stats"))[0] == 200
        status, body = await call(http, "DELETE", url + "?force=true", headers=AUTH)
        assert status == 200 and body["ledgers"] == ledgers and body["subscriptions"] == ["s"]
    status, body = await call(http, "GET", url + "/stats")
    assert status == 404 and "error" in body
    assert topic not in (await call(http, "GET", hub_url(cluster, 0) + "/admin/v1/topics?all=1"))[1]
    bk = await BookKeeper.connect(cluster.metastore_uri)
    try:
        for lid in ledgers:
            with pytest.raises(NoSuchLedgerError):
                await bk.open_ledger_no_recovery(lid)
    finally:
        await bk.close()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        assert await c.publish(topic.encode(), b"again") == 1


@in_cluster
async def test_delete_subscription_and_bad_names(cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    topic = f"unsub-{uuid.uuid4().hex[:8]}"
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        await c.subscribe(topic.encode(), b"a")
        await c.subscribe(topic.encode(), b"b")
        await c.publish(topic.encode(), b"x")
        await c.close_subscription(topic.encode(), b"a")
        owner = await owner_index(cluster, http, topic)
        url = topic_url(cluster, owner, topic)
        assert (await call(http, "DELETE", url + "/subscriptions/a"))[0] == 401
        assert (await call(http, "DELETE", url + "/subscriptions/a", headers=AUTH))[0] == 200
        assert (await call(http, "DELETE", url + "/subscriptions/a", headers=AUTH))[0] == 404
        assert (await call(http, "DELETE", url + "/subscriptions/b", headers=AUTH))[0] == 409   # attached
        subs = (await call(http, "GET", url + "/stats"))[1]["subscriptions"]
        assert set(subs) == {"b"} and subs["b"]["attached"] is True
    missing = topic_url(cluster, 0, f"never-{uuid.uuid4().hex[:8]}")
    for method, path, kw in (("GET", "/stats", {}), ("DELETE", "", {"headers": AUTH}),
                             ("POST", "/subscriptions/s/reset", {"headers": AUTH, "json": {"seq_id": 1}})):
        status, body = await call(http, method, missing + path, **kw)
        assert status == 404 and "error" in body, (method, path, status, body)


@in_cluster
async def test_changes_to_a_topic_no_hub_has_loaded(cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    """Runs last: it kills and restarts the owner, so that no hub owns the topic any more."""
    topic = f"unloaded-{uuid.uuid4().hex[:8]}"
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        for sub in (b"s", b"s2"):
            await c.subscribe(topic.encode(), sub)
        for i in range(4):
            await c.publish(topic.encode(), b"m%d" % i)
        owner = await owner_index(cluster, http, topic)
    await cluster.kill_hub(owner)
    await cluster.restart_hub(owner)
    url = topic_url(cluster, 0, topic)

    async def reset() -> bool:      # 503 while the dead owner's record waits for its session to expire
        status, body = await call(http, "POST", url + "/subscriptions/s/reset", json={"seq_id": 2}, headers=AUTH)
        assert status in (200, 503), (status, body)
        return status == 200

    await eventually(reset)
    stats = (await call(http, "GET", url + "/stats"))[1]
    assert stats["owner"] is None                                                 # nobody owns it now
    assert stats["last_seq_id"] in (3, 4)    # the dead owner's open ledger, read up to its LAC (no fencing)
    assert stats["subscriptions"]["s"]["consumed_seq_id"] == 1 and stats["subscriptions"]["s"]["attached"] is False
    assert (await call(http, "DELETE", url + "/subscriptions/s2", headers=AUTH))[0] == 200
    assert set((await call(http, "GET", url + "/stats"))[1]["subscriptions"]) == {"s"}
    got = Received()
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        await c.subscribe(topic.encode(), b"s", "ATTACH")
        await c.start_delivery(topic.encode(), b"s", got)
        assert await got.wait_for(3) == [2, 3, 4]
