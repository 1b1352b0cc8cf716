"""Region subscriptions belong to region hubs (issue 33, D1) and come back when closed under them (D2).

Two real regions, ``east`` and ``west``, with authentication on: ``region_roles=regionhub`` (the hubs
present a ``regionhub`` token to each other), ``superuser_roles=ops``, and role ``app`` granted
produce/consume on ``news``. West's subscriber on a ``news`` topic makes east's hub hold
``__region_west``.
"""

from __future__ import annotations

import asyncio
import struct
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote

import aiohttp
import pytest
import pytest_asyncio

from hub import errors
from hub.auth import create_secret_key, create_token
from hub.client import HedwigClient
from hub.proto import pubsub_pb2 as pb
from hub.protocol import encode
from tests.hub.test_hub import Collector
from tools.cluster import LocalCluster

in_cluster = pytest.mark.asyncio(loop_scope="module")
ONE_BOOKIE = {"bk_ensemble_size": "1", "bk_write_quorum_size": "1", "bk_ack_quorum_size": "1"}
RETRY_MS = 500
REGION_SUB = b"__region_west"          # what west's hub holds in east
AS_WEST = {"options": {"quire.region": b"east"}, "message_filter": "hub.regions.RegionFilter"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def regions(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    """The two regions; the hubs' secret key is ``data_dir/hub.key`` (``key_of``)."""
    data_dir = tmp_path_factory.mktemp("trust")
    key = key_of(data_dir)
    create_secret_key(key)
    conf = {**ONE_BOOKIE, "authentication_enabled": "true", "token_secret_key": str(key),
            "superuser_roles": "ops", "region_roles": "regionhub",
            "region_auth_token": create_token(key, "regionhub"),
            "retry_remote_subscribe_thread_run_interval": str(RETRY_MS)}
    async with LocalCluster(bookies=1, hubs=1, regions=["east", "west"], conf_overrides=conf,
                            data_dir=data_dir) as c:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
            for region in c.region_clusters.values():
                url = region.stats_urls[0].removesuffix("/metrics") + "/admin/v1/permissions/app/news"
                async with http.put(url, json={"actions": ["produce", "consume"]}) as resp:
                    assert resp.status == 200, await resp.text()
        yield c


def key_of(data_dir: Path) -> Path:
    return data_dir / "hub.key"


def token(cluster: LocalCluster, role: str) -> str:
    return create_token(key_of(cluster.data_dir), role)


async def connect(cluster: LocalCluster, region: str, role: str) -> HedwigClient:
    return await HedwigClient.connect(cluster.hub_addresses_by_region[region][0],
                                      conf={"auth_token": token(cluster, role),
                                            "server_ack_response_timeout": "10000"})


def topic_name() -> bytes:
    return b"news-" + uuid.uuid4().hex[:8].encode()


async def west_follows(cluster: LocalCluster, topic: bytes) -> tuple[HedwigClient, Collector]:
    """A west subscriber on ``topic``: once this returns, east's hub holds ``__region_west`` on it."""
    west = await connect(cluster, "west", "app")
    col = Collector()
    await west.subscribe(topic, b"local", synchronous=True)
    await west.start_delivery(topic, b"local", col)
    return west, col


async def reaches_west(east: HedwigClient, topic: bytes, col: Collector, tag: bytes, timeout: float = 30.0) -> None:
    """Publish ``tag-N`` in east until one reaches west's subscriber (replication is (re)made at some point
    we cannot observe from here; a message published before it is not pulled when the subscription was
    deleted). Fails after ``timeout``."""
    async with asyncio.timeout(timeout):
        n = 0
        while not any(m.body.startswith(tag) for m in col.got):
            await east.publish(topic, tag + b"-%d" % n)
            n += 1
            try:
                await col.wait(lambda got: any(m.body.startswith(tag) for m in got), timeout=RETRY_MS / 1000.0)
            except TimeoutError:
                pass


def _request(op: int, txn: int, body: str, topic: bytes, sub: bytes) -> pb.PubSubRequest:
    r = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=op, txnId=txn, topic=topic)  # type: ignore[arg-type]
    inner = getattr(r, body)
    inner.topic, inner.subscriberId = topic, sub
    return r


async def raw_requests(address: str, token: str, requests: list[pb.PubSubRequest]) -> list[pb.PubSubResponse]:
    """AUTHENTICATE with ``token``, send ``requests`` on one connection, and return the answers (each
    request here gets one, a refused CONSUME included), the AUTHENTICATE's first."""
    auth = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=pb.AUTHENTICATE, txnId=1)
    auth.authenticateRequest.token = token.encode()
    host, port = address.split(":")[:2]
    reader, writer = await asyncio.open_connection(host, int(port))
    got = []
    try:
        writer.write(b"".join(encode(r) for r in (auth, *requests)))
        async with asyncio.timeout(20):
            for _ in range(len(requests) + 1):
                (size,) = struct.unpack(">I", await reader.readexactly(4))
                got.append(pb.PubSubResponse.FromString(await reader.readexactly(size)))
    finally:
        writer.close()
    return got


@in_cluster
async def test_a_consume_grant_cannot_touch_another_regions_subscription(regions: LocalCluster) -> None:
    topic = topic_name()
    west, col = await west_follows(regions, topic)
    try:
        sub = REGION_SUB
        attach = _request(pb.SUBSCRIBE, 2, "subscribeRequest", topic, sub)
        attach.subscribeRequest.createOrAttach = pb.SubscribeRequest.ATTACH
        attach.subscribeRequest.forceAttach = True
        create = _request(pb.SUBSCRIBE, 3, "subscribeRequest", topic, sub)
        create.subscribeRequest.createOrAttach = pb.SubscribeRequest.CREATE_OR_ATTACH
        flagged = _request(pb.SUBSCRIBE, 4, "subscribeRequest", topic, sub)
        flagged.subscribeRequest.hubSubscriber = True
        consume = _request(pb.CONSUME, 7, "consumeRequest", topic, sub)
        consume.consumeRequest.msgId.localComponent = 1_000_000
        requests = [attach, create, flagged,
                    _request(pb.START_DELIVERY, 5, "startDeliveryRequest", topic, sub),
                    _request(pb.STOP_DELIVERY, 6, "stopDeliveryRequest", topic, sub),
                    consume,
                    _request(pb.CLOSESUBSCRIPTION, 8, "closeSubscriptionRequest", topic, sub),
                    _request(pb.UNSUBSCRIBE, 9, "unsubscribeRequest", topic, sub)]
        got = await raw_requests(regions.hub_addresses_by_region["east"][0], token(regions, "app"), requests)
        assert [(r.txnId, r.statusCode) for r in got] == [(1, pb.SUCCESS)] + [(t, pb.NOT_AUTHORIZED)
                                                                             for t in range(2, 10)]
        assert "region subscription" in got[1].statusMsg and "region_roles" in got[1].statusMsg

        # the client API says the same, and west's replication was never disturbed
        async with await connect(regions, "east", "app") as east:
            with pytest.raises(errors.NotAuthorizedError, match="may not use the region subscription"):
                await east.subscribe(topic, sub, "ATTACH", force_attach=True, **AS_WEST)
            with pytest.raises(errors.NotAuthorizedError):
                await east.unsubscribe(topic, sub)
            await east.publish(topic, b"still-replicated")
            await col.wait(lambda g: [m.body for m in g] == [b"still-replicated"])
            assert col.got[0].src_region == "east"
    finally:
        await west.close()


@in_cluster
async def test_replication_comes_back_after_its_region_subscription_is_closed_under_it(regions: LocalCluster) -> None:
    topic = topic_name()
    west, col = await west_follows(regions, topic)
    try:
        async with await connect(regions, "east", "ops") as ops, \
                await connect(regions, "east", "app") as east:
            # a superuser (may touch it) attaches with force: west's hub is closed out, then ops leaves
            await ops.subscribe(topic, REGION_SUB, "ATTACH", force_attach=True, **AS_WEST)
            await ops.close_subscription(topic, REGION_SUB)
            await reaches_west(east, topic, col, b"after-attach")

            # an operator deletes it with force: west's hub subscribes anew
            url = (regions.stats_urls[0].removesuffix("/metrics") +
                   f"/admin/v1/topics/{quote(topic.decode())}/subscriptions/{REGION_SUB.decode()}?force=true")
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
                async with http.delete(url) as resp:
                    assert resp.status == 200, await resp.text()
            await reaches_west(east, topic, col, b"after-delete")
            assert {m.src_region for m in col.got} == {"east"}
    finally:
        await west.close()


@pytest.mark.asyncio(loop_scope="function")
async def test_without_authentication_only_configured_region_hubs_hold_region_subscriptions(tmp_path: Path) -> None:
    """A hub with no ``regions`` knows no region hub: ``hubSubscriber`` and ``__region_*`` are refused."""
    async with LocalCluster(bookies=1, hubs=1, conf_overrides=ONE_BOOKIE, data_dir=tmp_path / "c") as c:
        async with await HedwigClient.connect(c.hub_addresses[0]) as client:
            topic = topic_name()
            with pytest.raises(errors.NotAuthorizedError, match="not a hub of a configured region"):
                await client.subscribe(topic, b"__region_west", hub_subscriber=True)
            with pytest.raises(errors.NotAuthorizedError, match="not a hub of a configured region"):
                await client.subscribe(topic, b"__region_west")
            with pytest.raises(errors.NotAuthorizedError, match="not a hub of a configured region"):
                await client.subscribe(topic, b"plain", hub_subscriber=True)
            # the connection and the hub go on serving everyone else
            await client.subscribe(topic, b"plain")
            assert await client.publish(topic, b"x") == 1


@pytest.mark.asyncio(loop_scope="function")
async def test_configured_region_hubs_are_known_by_address() -> None:
    """Without authentication: who counts as a configured region hub (``RegionManager.is_region_peer``)."""
    from types import SimpleNamespace

    from hub.conf import load_hub_conf
    from hub.regions import RegionManager

    def manager(regions: str) -> RegionManager:
        return RegionManager(SimpleNamespace(conf=load_hub_conf(None, {"region": "r1", "regions": regions})))

    m = manager("r2=10.0.0.2:4080 r3=10.0.0.3:4080:4443")
    assert m.is_region_peer("10.0.0.2") and m.is_region_peer("10.0.0.3")      # any port: hubs dial from any
    assert m.is_region_peer("::ffff:10.0.0.2")                                 # an IPv4-mapped peer address
    assert not m.is_region_peer("10.0.0.9") and not m.is_region_peer("127.0.0.1")
    local = manager("r2=127.0.0.1:4080")          # every region on one machine: any loopback address
    assert local.is_region_peer("127.0.0.1") and local.is_region_peer("::1")
    assert not local.is_region_peer("192.168.1.5")
    assert not manager("").is_region_peer("127.0.0.1")                       # no regions: nobody
    named = manager("r2=localhost:4080")          # names are resolved when the hub starts
    named.start()
    try:
        assert named._resolve_task is not None
        await asyncio.wait_for(named._resolve_task, 10)
        assert named.is_region_peer("127.0.0.1")
    finally:
        await named.close()
