"""Token authentication on real hub processes, and ``hub.auth`` / ``quire token`` on their own."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from hub import errors
from hub.auth import TokenAuthenticator, create_secret_key, create_token
from hub.client import HedwigClient, Message
from tools.cluster import LocalCluster
from tools.token import duration

in_cluster = pytest.mark.asyncio(loop_scope="module")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The hubs' secret key and another one."""
    root = tmp_path_factory.mktemp("keys")
    create_secret_key(root / "hub.key")
    create_secret_key(root / "other.key")
    return root / "hub.key", root / "other.key"


async def grant_everything(cluster: LocalCluster, role: str) -> None:
    """Let ``role`` produce and consume on every topic (hub.permissions), on every hub of every region."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        for c in cluster.region_clusters.values():
            for url in c.stats_urls[:len(c.hub_addresses)]:
                async with http.put(url.removesuffix("/metrics") + f"/admin/v1/permissions/{role}/",
                                    json={"actions": ["produce", "consume"]}) as resp:
                    assert resp.status == 200, await resp.text()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(keys: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    conf = {"bk_ensemble_size": "1", "bk_write_quorum_size": "1", "bk_ack_quorum_size": "1",
            "authentication_enabled": "true", "token_secret_key": str(keys[0]), "superuser_roles": "region-hub"}
    async with LocalCluster(bookies=1, hubs=1, data_dir=tmp_path_factory.mktemp("auth"), conf_overrides=conf) as c:
        await grant_everything(c, "app")
        yield c


@in_cluster
async def test_without_a_valid_token_every_request_is_refused(cluster: LocalCluster,
                                                                keys: tuple[Path, Path]) -> None:
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        with pytest.raises(errors.AuthenticationError, match="requires authentication"):
            await c.publish(b"t", b"x")
        with pytest.raises(errors.AuthenticationError):
            await c.subscribe(b"t", b"s")
    forged = create_token(keys[1], "app")                      # signed with another key
    with pytest.raises(errors.AuthenticationError, match="invalid token"):
        await HedwigClient.connect(cluster.hub_addresses[0], conf={"auth_token": forged})
    expired = create_token(keys[0], "app", expiry=-10.0)
    with pytest.raises(errors.AuthenticationError, match="expired"):
        await HedwigClient.connect(cluster.hub_addresses[0], conf={"auth_token": expired})


@in_cluster
async def test_a_valid_token_publishes_and_subscribes(cluster: LocalCluster, keys: tuple[Path, Path],
                                                      tmp_path: Path) -> None:
    token_file = tmp_path / "app.token"
    token_file.write_text(create_token(keys[0], "app", expiry=3600.0) + "\n")
    topic = uuid.uuid4().hex.encode()
    got: asyncio.Queue[Message] = asyncio.Queue()

    async def handler(t: bytes, s: bytes, m: Message) -> None:
        got.put_nowait(m)

    async with await HedwigClient.connect(cluster.hub_addresses[0],
                                          conf={"auth_token_file": str(token_file)}) as c:
        await c.subscribe(topic, b"s")
        await c.start_delivery(topic, b"s", handler)
        assert await c.publish(topic, b"hello") == 1
        assert (await asyncio.wait_for(got.get(), 20)).body == b"hello"
        with pytest.raises(errors.NotAuthorizedError, match="region hub"):
            await c.subscribe(topic, b"__region_west", hub_subscriber=True)


@in_cluster
async def test_only_superuser_roles_subscribe_as_region_hubs(cluster: LocalCluster, keys: tuple[Path, Path]) -> None:
    topic = uuid.uuid4().hex.encode()
    async with await HedwigClient.connect(cluster.hub_addresses[0],
                                          conf={"auth_token": create_token(keys[0], "region-hub")}) as c:
        await c.subscribe(topic, b"__region_west", hub_subscriber=True)


def test_tokens_name_their_role_and_expire(keys: tuple[Path, Path]) -> None:
    auth = TokenAuthenticator(keys[0])
    assert auth.authenticate(create_token(keys[0], "orders", expiry=60.0)) == "orders"
    with pytest.raises(errors.AuthenticationError, match="expired"):
        auth.authenticate(create_token(keys[0], "orders", expiry=-1.0))
    with pytest.raises(errors.AuthenticationError, match="no token"):
        auth.authenticate(b"")
    with pytest.raises(errors.CertificateError, match="token_secret_key"):
        TokenAuthenticator(keys[0].parent / "missing.key")
    assert [duration(t) for t in ("30", "45s", "10m", "1h", "2d")] == [30, 45, 600, 3600, 172800]
    with pytest.raises(argparse.ArgumentTypeError):
        duration("soon")


def test_quire_token_commands(tmp_path: Path) -> None:
    def quire(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tools.cli", "token", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)

    key = tmp_path / "k"
    assert quire("create-secret-key", "--output", str(key)).returncode == 0
    assert key.stat().st_mode & 0o077 == 0
    again = quire("create-secret-key", "--output", str(key))
    assert again.returncode == 1 and "exists" in again.stderr       # a key is never overwritten
    made = quire("create", "--secret-key", str(key), "--subject", "app", "--expiry", "1h")
    assert made.returncode == 0
    assert TokenAuthenticator(key).authenticate(made.stdout.strip()) == "app"


@pytest.mark.asyncio(loop_scope="function")
async def test_region_hubs_authenticate_with_a_superuser_token(keys: tuple[Path, Path], tmp_path: Path) -> None:
    conf = {"bk_ensemble_size": "1", "bk_write_quorum_size": "1", "bk_ack_quorum_size": "1",
            "authentication_enabled": "true", "token_secret_key": str(keys[0]), "superuser_roles": "region-hub",
            "auth_token": create_token(keys[0], "region-hub")}        # hw_region_client.conf
    app = {"auth_token": create_token(keys[0], "app")}
    async with LocalCluster(bookies=1, hubs=1, regions=["r1", "r2"], data_dir=tmp_path / "c",
                            conf_overrides=conf) as c:
        await grant_everything(c, "app")
        topic = uuid.uuid4().hex.encode()
        got: asyncio.Queue[Message] = asyncio.Queue()

        async def handler(t: bytes, s: bytes, m: Message) -> None:
            got.put_nowait(m)

        async with await HedwigClient.connect(c.hub_addresses_by_region["r2"][0], conf=app) as c2, \
                await HedwigClient.connect(c.hub_addresses_by_region["r1"][0], conf=app) as c1:
            await c2.subscribe(topic, b"s", synchronous=True)     # r2's hub subscribes in r1 as region-hub
            await c2.start_delivery(topic, b"s", handler)
            await c1.publish(topic, b"across")
            msg = await asyncio.wait_for(got.get(), 30)
            assert (msg.body, msg.src_region) == (b"across", "r1")


def test_hub_with_a_missing_token_key_exits_with_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tools.cli", "hub", "--set", "server_port=0", "--set", "authentication_enabled=true",
         "--set", f"token_secret_key={tmp_path / 'nope.key'}", "--metastore", f"lmdb://{tmp_path / 'ms'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("quire hub:")]
    assert len(lines) == 1 and "nope.key" in lines[0] and "No such file" in lines[0]
