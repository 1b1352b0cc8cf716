"""The bookie's HTTP server (``bookie.http``, ``bookie.admin``) on real bookie processes, with a real client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from bookie import protocol as proto
from bookie.client import BookKeeper
from bookie.http import TOKEN_ENV, admin_token, resolve_http_port
from bookie.testing import RawBookieClient
from metastore import Value, Version, open_metastore
from tests.bookie.conftest import StartBookie, add_req
from tests.fixtures.polling import eventually
from tools.cluster import LocalCluster

in_cluster = pytest.mark.asyncio(loop_scope="module")
pytestmark = pytest.mark.timeout(120)

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(bookies=2, hubs=0, data_dir=tmp_path_factory.mktemp("bkhttp"),
                            conf_overrides={"http_admin_token": TOKEN}) as c:
        yield c


@pytest_asyncio.fixture(loop_scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        yield session


def base(cluster: LocalCluster, i: int = 0) -> str:
    return cluster.stats_urls[i].removesuffix("/metrics")


async def get(http: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with http.get(url) as resp:
        return resp.status, await resp.json(content_type=None)



@in_cluster
async def test_health_ready_and_metrics(cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    assert len(cluster.stats_urls) == 2 and all(u.endswith("/metrics") for u in cluster.stats_urls)
    for path in ("/heartbeat", "/healthz"):
        assert (await get(http, base(cluster) + path))[0] == 200
    assert await get(http, base(cluster) + "/readyz") == (200, {"ready": True})
    async with http.get(cluster.stats_urls[0]) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
        names = {f.name for f in text_string_to_metric_families(await resp.text())}
    assert "bookie_requests" in names
    status, body = await get(http, base(cluster) + "/no/such/path")
    assert status == 404 and "error" in body


@in_cluster
async def test_info_and_list_bookies(cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    status, info = await get(http, base(cluster) + "/api/v1/bookie/info")
    assert status == 200
    assert info["address"] == cluster.bookie_addresses[0] and info["state"] == "writable"
    assert 0 < info["free_disk"] <= info["total_disk"] and info["freeSpace"] == info["free_disk"]
    assert 0 <= info["reclaimable_bytes"] < info["lmdb_file_bytes"]
    status, rw = await get(http, base(cluster) + "/api/v1/bookie/list_bookies?type=rw")
    assert status == 200 and set(rw) == set(cluster.bookie_addresses)
    assert (await get(http, base(cluster) + "/api/v1/bookie/list_bookies?type=ro")) == (200, {})
    status, body = await get(http, base(cluster) + "/api/v1/bookie/list_bookies?type=xx")
    assert status == 400 and "type" in body["error"]


@in_cluster
async def test_read_only_switch_flips_readiness_and_registration(cluster: LocalCluster,
                                                                 http: aiohttp.ClientSession) -> None:
    url = base(cluster, 1) + "/api/v1/bookie/state/readonly"
    address = cluster.bookie_addresses[1]
    async with http.put(url, json={"readOnly": True}) as resp:      # no token
        assert resp.status == 401 and "error" in await resp.json()
    assert (await get(http, base(cluster, 1) + "/readyz"))[0] == 200

    async with http.put(url, json={"readOnly": True}, headers=AUTH) as resp:
        assert resp.status == 200 and (await resp.json())["readOnly"] is True
    status, body = await get(http, base(cluster, 1) + "/readyz")
    assert status == 503 and body["ready"] is False and "read-only" in body["reason"]
    assert (await get(http, base(cluster, 1) + "/api/v1/bookie/state/readonly"))[1]["readOnly"] is True
    assert address in (await get(http, base(cluster) + "/api/v1/bookie/list_bookies?type=ro"))[1]
    assert address not in (await get(http, base(cluster) + "/api/v1/bookie/list_bookies?type=rw"))[1]
    assert (await get(http, base(cluster, 1) + "/api/v1/bookie/info"))[1]["state"] == "read_only"
    c = await RawBookieClient.connect(address)
    try:
        assert (await c.call(add_req(7, 0))).status == proto.READ_ONLY   # the switch is real: adds refused
        async with http.put(url, json={"readOnly": False}, headers=AUTH) as resp:
            assert resp.status == 200 and (await resp.json())["readOnly"] is False
        assert await get(http, base(cluster, 1) + "/readyz") == (200, {"ready": True})
        assert address in (await get(http, base(cluster) + "/api/v1/bookie/list_bookies?type=rw"))[1]
        assert (await c.call(add_req(7, 0))).status == proto.OK
    finally:
        await c.close()


@in_cluster
async def test_bad_input_is_a_json_error(cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    url = base(cluster) + "/api/v1/bookie/state/readonly"
    for body in (b"{not json", b'{"readOnly": "yes"}', b"[true]"):
        async with http.put(url, data=body, headers=AUTH) as resp:
            assert resp.status == 400 and "error" in await resp.json()
    async with http.put(url, json={"readOnly": True}, headers={"Authorization": "Bearer wrong"}) as resp:
        assert resp.status == 401
    for query, want in (("", 400), ("?ledger_id=abc", 400), ("?ledger_id=-3", 400), ("?ledger_id=999999", 404)):
        status, body = await get(http, base(cluster) + "/api/v1/ledger/metadata" + query)
        assert status == want and "error" in body, (query, status, body)
    async with http.post(base(cluster) + "/api/v1/bookie/info", headers=AUTH) as resp:
        assert resp.status == 405 and "error" in await resp.json()
    assert (await get(http, base(cluster) + "/readyz"))[0] == 200     # nothing above changed the bookie


@in_cluster
async def test_ledger_list_and_metadata(cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    bk = await BookKeeper.connect(cluster.metastore_uri)
    try:
        lh = await bk.create_ledger(ensemble=2, write_quorum=2, ack_quorum=2, password=b"pw")
        await lh.add_entry(b"x")
        await lh.close()
    finally:
        await bk.close()
    status, listed = await get(http, base(cluster) + "/api/v1/ledger/list")
    assert status == 200 and lh.ledger_id in listed["ledgers"]
    status, md = await get(http, base(cluster, 1) + f"/api/v1/ledger/metadata?ledger_id={lh.ledger_id}")
    assert status == 200
    assert (md["ledger_id"], md["ensemble_size"], md["state"], md["last_entry_id"]) == (lh.ledger_id, 2, "CLOSED", 0)
    assert set(md["ensembles"][0]["bookies"]) == set(cluster.bookie_addresses)
    status, with_md = await get(http, base(cluster) + "/api/v1/ledger/list?print_metadata=true")
    assert with_md["metadata"][str(lh.ledger_id)]["ledger_id"] == lh.ledger_id


@in_cluster
async def test_under_replicated_ledgers_from_the_table(cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    url = base(cluster) + "/api/v1/autorecovery/list_under_replicated_ledger"
    assert await get(http, url) == (200, [])
    ms = await open_metastore(cluster.metastore_uri)
    try:
        table = await ms.create_scannable_table("underreplicated_ledgers")
        await table.put(f"{42:020d}", Value({"missing": b"127.0.0.1:1"}), Version.NEW)
    finally:
        await ms.close()
    assert await get(http, url) == (200, [42])
    assert await get(http, url + "?printmissingreplica=true") == (200, {"42": ["127.0.0.1:1"]})


def test_port_and_token_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_http_port(0, 0) == 0 and resolve_http_port(0, -1) == 0      # a free port by default
    assert resolve_http_port(0, 9100) == 9100                                  # the older key still chooses
    assert resolve_http_port(9200, 9100) == 9200 and resolve_http_port(-1, 9100) is None
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert admin_token("", "") == ""
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert admin_token("", "") == "from-env"
    (tmp_path / "tok").write_text("from-file\n")
    assert admin_token("", str(tmp_path / "tok")) == "from-file"
    assert admin_token("from-conf", str(tmp_path / "tok")) == "from-conf"
    with pytest.raises(OSError):
        admin_token("", str(tmp_path / "missing"))


async def test_a_failing_handler_is_a_json_500_without_traceback() -> None:
    from aiohttp import web
    from prometheus_client import CollectorRegistry

    from bookie.http import HttpError, HttpServer

    async def boom(request: web.Request) -> web.Response:
        raise RuntimeError("kaput")

    async def teapot(request: web.Request) -> web.Response:
        raise HttpError(418, "short and stout")

    async def not_ready() -> str | None:
        return "warming up"

    server = HttpServer(CollectorRegistry(), ready=not_ready, token="t",
                        routes=[web.get("/boom", boom), web.delete("/teapot", teapot)])
    url = await server.start("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            async with http.get(url + "/boom") as resp:
                text = await resp.text()
                assert resp.status == 500 and "Traceback" not in text and "kaput" in (await resp.json())["error"]
            assert await get(http, url + "/readyz") == (503, {"ready": False, "reason": "warming up"})
            async with http.delete(url + "/teapot") as resp:
                assert resp.status == 401
            async with http.delete(url + "/teapot", headers={"Authorization": "Bearer t"}) as resp:
                assert resp.status == 418 and await resp.json() == {"error": "short and stout"}
    finally:
        await server.stop()


async def test_a_full_disk_keeps_the_bookie_unready_whatever_the_switch(start_bookie: StartBookie,
                                                                       tmp_path: Path) -> None:
    override = tmp_path / "usage"
    override.write_text("0.10")
    bookie = start_bookie("full", disk_usage_override_file=override, disk_check_interval=100,
                          http_admin_token=TOKEN)
    url = bookie.stats_url.removesuffix("/metrics")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        assert await get(http, url + "/readyz") == (200, {"ready": True})
        override.write_text("0.99")

        async def unready() -> Any:
            status, body = await get(http, url + "/readyz")
            return body if status == 503 else None

        assert "disk" in (await eventually(unready))["reason"]
        async with http.put(url + "/api/v1/bookie/state/readonly", json={"readOnly": False}, headers=AUTH) as resp:
            assert resp.status == 200 and (await resp.json())["readOnly"] is True    # the disk decides
        assert (await get(http, url + "/readyz"))[0] == 503
        override.write_text("0.10")

        async def ready() -> bool:
            return (await get(http, url + "/readyz"))[0] == 200

        await eventually(ready)


def test_http_server_port_minus_one_turns_it_off(start_bookie: StartBookie) -> None:
    assert "stats=" not in start_bookie("off", http_server_port=-1).ready_line
    assert "stats=" in start_bookie("on").ready_line                  # on by default, on a free port


async def test_token_from_a_file_or_the_environment(start_bookie: StartBookie, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "token").write_text("file-token\n")
    from_file = start_bookie("file", http_admin_token_file=tmp_path / "token")
    monkeypatch.setenv(TOKEN_ENV, "env-token")              # the bookie process inherits it
    from_env = start_bookie("env")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        for proc, token in ((from_file, "file-token"), (from_env, "env-token")):
            url = proc.stats_url.removesuffix("/metrics") + "/api/v1/bookie/state/readonly"
            for given, want in (("", 401), ("Bearer nope", 401), (f"Bearer {token}", 200)):
                headers = {"Authorization": given} if given else {}
                async with http.put(url, json={"readOnly": False}, headers=headers) as resp:
                    assert resp.status == want, (proc.address, given, resp.status)
