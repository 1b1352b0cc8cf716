"""Per-topic-prefix authorization (``hub.permissions``) on real hub processes: grants made with the admin API,
``quire console`` and checked on publish and subscribe; ``quire client`` tokens; region tokens."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from hub import errors
from hub.auth import create_secret_key, create_token
from hub.client import HedwigClient, Message
from hub.permissions import CONSUME, PRODUCE, Authorizer, Grant, PermissionCache, PermissionStore
from hub.proto import pubsub_pb2 as pb
from metastore import open_metastore
from tests.fixtures.polling import eventually
from tools.cluster import LocalCluster

from .conftest import hub_url

in_cluster = pytest.mark.asyncio(loop_scope="module")
pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]

ADMIN_TOKEN = "hub-admin-token"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
REFRESH = 1.0        # permissions_refresh_interval of the cluster, in seconds
SLACK = 5.0          # one metastore read and a loaded machine on top of the refresh interval
ONE_BOOKIE = {"bk_ensemble_size": "1", "bk_write_quorum_size": "1", "bk_ack_quorum_size": "1"}


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "hub.key"
    create_secret_key(path)
    return path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(key: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    conf = {**ONE_BOOKIE, "authentication_enabled": "true", "token_secret_key": str(key),
            "superuser_roles": "admin", "http_admin_token": ADMIN_TOKEN,
            "permissions_refresh_interval": str(int(REFRESH * 1000))}
    async with LocalCluster(bookies=1, hubs=2, data_dir=tmp_path_factory.mktemp("perms"), conf_overrides=conf) as c:
        yield c


def grant_url(cluster: LocalCluster, i: int, role: str, prefix: str) -> str:
    return f"{hub_url(cluster, i)}/admin/v1/permissions/{quote(role, safe='')}/{quote(prefix, safe='')}"


async def call(http: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> tuple[int, Any]:
    async with http.request(method, url, **kw) as resp:
        return resp.status, await resp.json(content_type=None)


async def grant_everywhere(cluster: LocalCluster, http: aiohttp.ClientSession, role: str, prefix: str,
                           actions: list[str]) -> None:
    """PUT the grant on every hub: each re-reads the grants when it answers, so it is in force at once."""
    for i in range(len(cluster.hub_addresses)):
        status, body = await call(http, "PUT", grant_url(cluster, i, role, prefix), json={"actions": actions},
                                  headers=AUTH)
        assert (status, body) == (200, {"role": role, "prefix": prefix, "actions": sorted(actions)})


async def connect(cluster: LocalCluster, key: Path, role: str) -> HedwigClient:
    return await HedwigClient.connect(cluster.hub_addresses[0], conf={"auth_token": create_token(key, role)})


async def not_authorized_count(cluster: LocalCluster, http: aiohttp.ClientSession) -> float:
    total = 0.0
    for url in cluster.stats_urls[:len(cluster.hub_addresses)]:
        async with http.get(url) as resp:
            text = await resp.text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "hub_events_total" and sample.labels.get("event") == "not_authorized":
                    total += sample.value
    return total


@in_cluster
async def test_a_consumer_only_role_may_not_publish(cluster: LocalCluster, key: Path,
                                                    http: aiohttp.ClientSession) -> None:
    role, prefix = f"reader-{uuid.uuid4().hex[:8]}", f"feed-{uuid.uuid4().hex[:8]}/"
    topic = (prefix + "news").encode()
    await grant_everywhere(cluster, http, role, prefix, ["consume"])
    refused_before = await not_authorized_count(cluster, http)
    async with await connect(cluster, key, role) as c, await connect(cluster, key, "admin") as admin:
        got: asyncio.Queue[Message] = asyncio.Queue()

        async def handler(t: bytes, s: bytes, m: Message) -> None:
            got.put_nowait(m)

        await c.subscribe(topic, b"s")
        await c.start_delivery(topic, b"s", handler)
        with pytest.raises(errors.NotAuthorizedError) as refused:
            await c.publish(topic, b"mine")
        assert role in str(refused.value) and "produce" in str(refused.value) and prefix + "news" in str(refused.value)
        assert refused.value.status == "NOT_AUTHORIZED"
        assert await admin.publish(topic, b"from a superuser") >= 1          # superusers need no grant
        assert (await asyncio.wait_for(got.get(), 20)).body == b"from a superuser"
    assert await not_authorized_count(cluster, http) >= refused_before + 1


@in_cluster
async def test_a_grant_covers_its_prefix_only(cluster: LocalCluster, key: Path, http: aiohttp.ClientSession) -> None:
    role, tag = f"writer-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:8]
    await grant_everywhere(cluster, http, role, f"orders-{tag}/", ["produce"])
    async with await connect(cluster, key, role) as c:
        assert await c.publish(f"orders-{tag}/eu".encode(), b"ok") == 1
        with pytest.raises(errors.NotAuthorizedError, match=f"{role}.*produce.*payments-{tag}/eu"):
            await c.publish(f"payments-{tag}/eu".encode(), b"elsewhere")
        with pytest.raises(errors.NotAuthorizedError, match=f"{role}.*consume.*orders-{tag}/eu"):
            await c.subscribe(f"orders-{tag}/eu".encode(), b"s")       # produce does not grant consume


@in_cluster
async def test_a_multi_topic_publish_with_a_topic_not_granted_is_refused_whole_and_sent_again_singly(
        cluster: LocalCluster, key: Path, http: aiohttp.ClientSession) -> None:
    role, tag = f"writer-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:8]
    await grant_everywhere(cluster, http, role, f"orders-{tag}/", ["produce"])
    mine = [f"orders-{tag}/{i}".encode() for i in range(2)]
    other = f"payments-{tag}/eu".encode()
    async with await connect(cluster, key, role) as c:
        assert await asyncio.gather(*(c.publish(t, b"first") for t in mine)) == [1, 1]
        owner = c.owner[mine[0]]
        c.owner[mine[1]] = c.owner[other] = owner     # believed owned there: the three leave as one request
        multis: list[int] = []
        send = c.conns[owner].publish_multi

        def publish_multi(parts: Any, timeout: float, answer: Any) -> None:
            multis.append(len(parts))
            send(parts, timeout, answer)

        c.conns[owner].publish_multi = publish_multi  # type: ignore[method-assign]
        got = await asyncio.gather(*(c.publish_async(t, b"second") for t in (*mine, other)), return_exceptions=True)
        assert multis == [3] and got[:2] == [2, 2]
        assert isinstance(got[2], errors.NotAuthorizedError) and f"payments-{tag}/eu" in str(got[2])
        assert c.conns[owner].multi_publish        # a refusal, not a hub that predates PUBLISH_MULTI


def console(cluster: LocalCluster, *commands: str, options: tuple[str, ...] = (),
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "tools.cli", "console", "--server", cluster.hub_addresses[0],
            "--metastore", cluster.metastore_uri, *options]
    for c in commands:
        args += ["-c", c]
    environ = {k: v for k, v in os.environ.items() if k != "QUIRE_AUTH_TOKEN"}
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**environ, **(env or {})})


@in_cluster
async def test_console_takes_a_token(cluster: LocalCluster, key: Path, tmp_path: Path) -> None:
    topic = f"console-{uuid.uuid4().hex[:8]}"
    token_file = tmp_path / "admin.token"
    token_file.write_text(create_token(key, "admin") + "\n")
    done = await asyncio.to_thread(console, cluster, f"pub {topic} one", options=("--auth-token-file",
                                                                                 str(token_file)))
    assert done.returncode == 0, done.stdout + done.stderr
    done = await asyncio.to_thread(console, cluster, f"pub {topic} two",
                                   env={"QUIRE_AUTH_TOKEN": create_token(key, "admin")})
    assert done.returncode == 0, done.stdout + done.stderr
    done = await asyncio.to_thread(console, cluster, f"pub {topic} three",
                                   options=("--auth-token", create_token(key, "nobody")))
    assert done.returncode == 1
    assert f"NOT_AUTHORIZED: role 'nobody' is not authorized to produce on topic '{topic}'" in done.stdout
    done = await asyncio.to_thread(console, cluster, f"pub {topic} four")
    assert done.returncode == 1 and "AUTHENTICATION_FAILED: this hub requires authentication" in done.stdout


async def publishes(c: HedwigClient, topic: bytes) -> bool:
    try:
        await c.publish(topic, b"x")
    except errors.NotAuthorizedError:
        return False
    return True


@in_cluster
async def test_console_grant_and_revoke_take_effect_within_the_refresh_interval(
        cluster: LocalCluster, key: Path) -> None:
    role, prefix = f"app-{uuid.uuid4().hex[:8]}", f"jobs-{uuid.uuid4().hex[:8]}/"
    topic = (prefix + "1").encode()
    async with await connect(cluster, key, role) as c:
        assert not await publishes(c, topic)
        done = await asyncio.to_thread(console, cluster, f"grant {role} {prefix} produce,consume",
                                       f"show grants {role}", f"show grants {role} --json")
        assert done.returncode == 0, done.stdout + done.stderr
        granted = time.monotonic()      # the console wrote the metastore; hubs learn of it when they re-read
        lines = done.stdout.splitlines()
        assert f"Role {role} may now consume and produce on topics starting with '{prefix}'" in lines
        assert any(line.split() == [role, prefix, "consume,produce"] for line in lines), lines
        docs = [json.loads(line) for line in lines if line.startswith("[")]
        assert docs == [[{"role": role, "prefix": prefix, "actions": ["consume", "produce"]}]]
        await eventually(lambda: publishes(c, topic), timeout=REFRESH + SLACK, interval=0.1)
        assert time.monotonic() - granted <= REFRESH + SLACK

        done = await asyncio.to_thread(console, cluster, f"revoke {role} {prefix} produce",
                                       f"show grants {role} --json")
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(done.stdout.splitlines()[-2]) == [{"role": role, "prefix": prefix, "actions": ["consume"]}]
        await eventually(lambda: _not(publishes(c, topic)), timeout=REFRESH + SLACK, interval=0.1)
        await c.subscribe(topic, b"s")               # consume is still granted
        closed: asyncio.Queue[tuple[bytes, bytes, str]] = asyncio.Queue()
        c.add_subscription_listener(lambda t, s, event: closed.put_nowait((t, s, event)))

        done = await asyncio.to_thread(console, cluster, f"revoke {role} {prefix}", f"revoke {role} {prefix}",
                                       f"grant {role} {prefix} delete")
        # revoking consume closes the attached subscription once the hub has re-read the grants
        assert await asyncio.wait_for(closed.get(), REFRESH + SLACK) == (topic, b"s", "SUBSCRIPTION_FORCED_CLOSED")
        with pytest.raises(errors.NotAuthorizedError, match="consume"):
            await c.subscribe(topic, b"s")
    assert done.returncode == 1                       # the second revoke and the bad action fail
    assert f"Role {role} has no grant left on topics starting with '{prefix}'" in done.stdout
    assert f"role {role!r} has no grant on prefix {prefix!r}" in done.stdout
    assert "unknown action 'delete'" in done.stdout
    done = await asyncio.to_thread(console, cluster, f"show grants {role} --json")
    assert json.loads(done.stdout.splitlines()[0]) == []


async def _not(check: Any) -> bool:
    return not await check


@in_cluster
async def test_admin_api_grants_need_the_admin_token(cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    role, prefix = f"ops-{uuid.uuid4().hex[:8]}", "metrics/eu"
    url = grant_url(cluster, 1, role, prefix)
    listing = f"{hub_url(cluster, 0)}/admin/v1/permissions?role={role}"
    assert (await call(http, "PUT", url, json={"actions": ["produce"]}))[0] == 401
    assert (await call(http, "PUT", url, json={"actions": ["produce"]},
                       headers={"Authorization": "Bearer wrong"}))[0] == 401
    assert await call(http, "GET", listing) == (200, [])
    status, body = await call(http, "PUT", url, json={"actions": ["produce", "consume"]}, headers=AUTH)
    assert (status, body) == (200, {"role": role, "prefix": prefix, "actions": ["consume", "produce"]})
    assert await call(http, "GET", listing) == (200, [body])
    status, body = await call(http, "PUT", url, json={"actions": ["publish"]}, headers=AUTH)
    assert status == 400 and "unknown action 'publish'" in body["error"]
    assert (await call(http, "DELETE", url + "?action=produce"))[0] == 401
    assert await call(http, "DELETE", url + "?action=produce", headers=AUTH) == (
        200, {"role": role, "prefix": prefix, "actions": ["consume"]})
    assert await call(http, "DELETE", url, headers=AUTH) == (200, {"role": role, "prefix": prefix, "actions": []})
    status, body = await call(http, "DELETE", url, headers=AUTH)
    assert status == 404 and "no grant" in body["error"]
    assert await call(http, "GET", listing) == (200, [])


def quire_client(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "QUIRE_AUTH_TOKEN"}
    return subprocess.run([sys.executable, "-m", "tools.cli", "client", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**environ, **(env or {})})


@in_cluster
async def test_quire_client_produce_with_a_token(cluster: LocalCluster, key: Path, http: aiohttp.ClientSession,
                                                 tmp_path: Path) -> None:
    role, topic = f"cli-{uuid.uuid4().hex[:8]}", f"cli-{uuid.uuid4().hex[:8]}"
    await grant_everywhere(cluster, http, role, topic, ["produce"])
    token_file = tmp_path / "cli.token"
    token_file.write_text(create_token(key, role) + "\n")
    server = ["--server", cluster.hub_addresses[0]]
    done = await asyncio.to_thread(quire_client, "produce", topic, "-m", "hi", *server,
                                   "--auth-token-file", str(token_file))
    assert (done.returncode, done.stdout) == (0, f"produced 1 message to {topic} (seq id 1)\n"), done.stderr
    done = await asyncio.to_thread(quire_client, "produce", topic, "-m", "hi", *server,
                                   env={"QUIRE_AUTH_TOKEN": create_token(key, role)})
    assert (done.returncode, done.stdout) == (0, f"produced 1 message to {topic} (seq id 2)\n"), done.stderr
    done = await asyncio.to_thread(quire_client, "produce", topic, "-m", "hi", *server)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("quire client produce: AUTHENTICATION_FAILED: this hub requires authentication")
    assert "--auth-token-file" in done.stderr
    done = await asyncio.to_thread(quire_client, "produce", "elsewhere", "-m", "hi", *server,
                                   "--auth-token", create_token(key, role))
    assert done.returncode == 1
    assert done.stderr.startswith(f"quire client produce: NOT_AUTHORIZED: role '{role}' is not authorized to "
                                  "produce on topic 'elsewhere'"), done.stderr


async def _replicates(key: Path, conf: dict[str, str], data_dir: Path) -> None:
    """r2's subscriber gets what is published in r1 (r2's hub subscribes in r1 with conf's region token)."""
    admin = {"auth_token": create_token(key, "admin")}
    async with LocalCluster(bookies=1, hubs=1, regions=["r1", "r2"], data_dir=data_dir, conf_overrides=conf) as c:
        topic = uuid.uuid4().hex.encode()
        got: asyncio.Queue[Message] = asyncio.Queue()

        async def handler(t: bytes, s: bytes, m: Message) -> None:
            got.put_nowait(m)

        async with await HedwigClient.connect(c.hub_addresses_by_region["r2"][0], conf=admin) as c2, \
                await HedwigClient.connect(c.hub_addresses_by_region["r1"][0], conf=admin) as c1:
            await c2.subscribe(topic, b"s", synchronous=True)
            await c2.start_delivery(topic, b"s", handler)
            await c1.publish(topic, b"across")
            msg = await asyncio.wait_for(got.get(), 30)
            assert (msg.body, msg.src_region) == (b"across", "r1")


@pytest.mark.asyncio(loop_scope="function")
async def test_regions_replicate_with_region_tokens_and_refuse_a_region_without_one(key: Path,
                                                                                    tmp_path: Path) -> None:
    conf = {**ONE_BOOKIE, "authentication_enabled": "true", "token_secret_key": str(key),
            "superuser_roles": "admin", "region_roles": "region-hub"}
    token_file = tmp_path / "region.token"
    token_file.write_text(create_token(key, "region-hub") + "\n")
    # a region role (not a superuser) with its token in a file: replication works
    await _replicates(key, {**conf, "region_auth_token_file": str(token_file)}, tmp_path / "with")
    # no region token: the remote hub refuses the region's subscription
    with pytest.raises(errors.CouldNotConnectError, match=r"region r2: subscribing .* in region r1 failed: "
                                                          r".*requires authentication"):
        await _replicates(key, conf, tmp_path / "without")
    # a token, but of a role that is neither a region role nor a superuser
    with pytest.raises(errors.CouldNotConnectError, match=r"region r2: .*role 'app' may not subscribe as a region hub"):
        await _replicates(key, {**conf, "region_auth_token": create_token(key, "app")}, tmp_path / "app")


@pytest.mark.asyncio(loop_scope="function")
async def test_grants_merge_revoke_and_match_prefixes(tmp_path: Path) -> None:
    ms = await open_metastore(f"lmdb://{tmp_path / 'ms'}")
    try:
        store = PermissionStore(ms)
        cache = PermissionCache(store, refresh_interval=60.0)
        auth = Authorizer(cache, superuser_roles=["admin"], region_roles=["region-hub"])
        await cache.start()
        assert await store.grant("app", "orders/", "produce") == Grant("app", "orders/", ("produce",))
        assert await store.grant("app", "orders/", ["consume"]) == Grant("app", "orders/", ("consume", "produce"))
        await store.grant("app", "", "consume")                  # the empty prefix: every topic
        assert not cache.allowed("app", b"orders/eu", PRODUCE)   # not re-read yet
        generation = cache.generation
        await cache.refresh()
        assert cache.generation == generation + 1
        assert cache.allowed("app", b"orders/eu", PRODUCE) and not cache.allowed("app", b"payments", PRODUCE)
        assert cache.allowed("app", b"payments", CONSUME) and not cache.allowed("other", b"orders/eu", CONSUME)
        assert auth.check("admin", pb.PUBLISH, b"anything", b"") is None
        assert auth.check("region-hub", pb.SUBSCRIBE, b"t", b"__region_r2") is None
        refused = auth.check("region-hub", pb.SUBSCRIBE, b"t", b"local-sub")
        assert refused is not None and "role 'region-hub' is not authorized to consume on topic 't'" in str(refused)
        assert await store.revoke("app", "orders/", ["produce"]) == Grant("app", "orders/", ("consume",))
        assert await store.revoke("app", "orders/") is None
        with pytest.raises(LookupError, match="no grant"):
            await store.revoke("app", "orders/")
        assert await store.grants() == [Grant("app", "", ("consume",))]
        for bad in ("", "delete", "produce,publish"):
            with pytest.raises(ValueError, match="action"):
                await store.grant("app", "x", bad)
        with pytest.raises(ValueError, match="role"):
            await store.grant("", "x", "produce")
        with pytest.raises(ValueError, match="x00"):
            await store.grant("a\x00b", "x", "produce")
    finally:
        await ms.close()


@in_cluster
async def test_answered_and_refused_requests_let_a_half_closed_connection_close(cluster: LocalCluster,
                                                                                 key: Path) -> None:
    """AUTHENTICATE, a PING before it and a refused publish are all answered: after the client's EOF the hub
    closes the connection (it waited for requests it had counted as unanswered before)."""
    import struct

    from hub.protocol import encode

    def req(op: int, txn: int, body: str, topic: bytes = b"") -> pb.PubSubRequest:
        r = pb.PubSubRequest(protocolVersion=pb.VERSION_ONE, type=op, txnId=txn, topic=topic)  # type: ignore[arg-type]
        getattr(r, body).SetInParent()
        return r

    ping = req(pb.PING, 1, "pingRequest")
    unauthenticated = req(pb.PUBLISH, 2, "publishRequest", b"t")
    unauthenticated.publishRequest.topic, unauthenticated.publishRequest.msg.body = b"t", b"x"
    auth = req(pb.AUTHENTICATE, 3, "authenticateRequest")
    auth.authenticateRequest.token = create_token(key, f"nobody-{uuid.uuid4().hex[:6]}").encode()
    refused = req(pb.PUBLISH, 4, "publishRequest", b"t")
    refused.publishRequest.topic, refused.publishRequest.msg.body = b"t", b"x"
    host, port = cluster.hub_addresses[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"".join(encode(r) for r in (ping, unauthenticated, auth, refused)))
        writer.write_eof()
        got = []
        async with asyncio.timeout(20):
            for _ in range(4):
                (size,) = struct.unpack(">I", await reader.readexactly(4))
                got.append(pb.PubSubResponse.FromString(await reader.readexactly(size)))
            assert await reader.read() == b""
    finally:
        writer.close()
    assert [(r.txnId, r.statusCode) for r in got] == [(1, pb.SUCCESS), (2, pb.AUTHENTICATION_FAILED),
                                                      (3, pb.SUCCESS), (4, pb.NOT_AUTHORIZED)]


@in_cluster
async def test_a_dead_letter_topic_the_role_may_not_produce_to_loses_nothing(
        cluster: LocalCluster, key: Path, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture) -> None:
    prefix = f"dlqjobs-{uuid.uuid4().hex[:6]}"
    await grant_everywhere(cluster, http, "worker", prefix, [PRODUCE, CONSUME])
    topic = f"{prefix}/q".encode()
    c = await connect(cluster, key, "worker")
    try:
        consumer = await c.consumer(topic, b"w", subscription_type="SHARED", negative_ack_redelivery_delay_ms=10,
                                    max_redeliver_count=1, dead_letter_topic=b"forbidden/dlq")
        await c.publish(topic, b"poison")
        for expected in (0, 1):
            msg = await consumer.receive(timeout=20)
            assert msg.redelivery_count == expected
            await consumer.nack(msg)
        with caplog.at_level("WARNING", logger="hub.client"):
            msg = await consumer.receive(timeout=20)     # the DLQ publish is refused: the application gets it
        assert (msg.body, msg.redelivery_count, consumer.dead_lettered) == (b"poison", 2, 0)
        assert "could not go to the dead-letter topic" in caplog.text and "not authorized" in caplog.text
        await consumer.ack(msg)
        assert await c.publish(topic, b"next") == 2       # the hub keeps serving this role
        assert (await consumer.receive(timeout=20)).body == b"next"
        await consumer.close()
    finally:
        await c.close()
