"""Protected mode of the admin HTTP API (issue 33, item 6), on real hub processes without an admin token.

Hub 0 listens for HTTP on 0.0.0.0 (not loopback): its mutating calls are refused with 403 naming
``http_admin_token``. Hub 1 keeps the default 127.0.0.1: its mutating calls are open, as Pulsar standalone's.
Neither has a token, so a request that presents one gets 401.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bookie.http import is_loopback
from hub.client import HedwigClient
from tools.cluster import LocalCluster

from .conftest import hub_url

ONE_BOOKIE = {"bk_ensemble_size": "1", "bk_write_quorum_size": "1", "bk_ack_quorum_size": "1"}


async def call(http: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> tuple[int, Any]:
    async with http.request(method, url, **kw) as resp:
        return resp.status, await resp.json(content_type=None)


@pytest.mark.asyncio(loop_scope="function")
async def test_protected_mode_without_an_admin_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUIRE_HTTP_ADMIN_TOKEN", raising=False)     # the hubs inherit our environment
    cluster = LocalCluster(bookies=1, hubs=2, data_dir=tmp_path / "c", conf_overrides=ONE_BOOKIE)
    cluster.set_hub_conf(0, http_server_host="0.0.0.0")
    async with cluster, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        exposed, local = hub_url(cluster, 0), hub_url(cluster, 1)
        assert exposed.startswith("http://0.0.0.0:") and local.startswith("http://127.0.0.1:")
        async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
            await c.subscribe(b"guarded", b"s")
            await c.close_subscription(b"guarded", b"s")
        sub = "/admin/v1/topics/guarded/subscriptions/s"
        for method, path, body in (("DELETE", sub, None), ("POST", "/admin/v1/topics/guarded/release", None),
                                   ("PUT", "/admin/v1/permissions/app/", {"actions": ["consume"]})):
            status, answer = await call(http, method, exposed + path, json=body)
            assert status == 403, (method, path, answer)
            assert "protected mode" in answer["error"] and "http_admin_token" in answer["error"]
        # reads stay open, and the refused DELETE changed nothing
        status, stats = await call(http, "GET", exposed + "/admin/v1/topics/guarded/stats")
        assert status == 200 and "s" in stats["subscriptions"]
        # a token where none is configured: 401, on either hub, for admin calls (monitoring paths stay open)
        bearer = {"Authorization": "Bearer guess"}
        for base in (exposed, local):
            status, answer = await call(http, "GET", base + "/admin/v1/topics", headers=bearer)
            assert status == 401 and "http_admin_token" in answer["error"]
        status, _ = await call(http, "DELETE", local + sub, headers=bearer)
        assert status == 401
        async with http.get(local + "/metrics", headers=bearer) as resp:
            assert resp.status == 200
        # on loopback, without a token, the mutating calls are open (a grant, kept in the metastore)...
        status, answer = await call(http, "PUT", local + "/admin/v1/permissions/app/", json={"actions": ["consume"]})
        assert status == 200, answer
        status, grants = await call(http, "GET", exposed + "/admin/v1/permissions?role=app")
        assert status == 200 and grants, grants
        # ...but one forwarded to the topic's owner, the exposed hub, is refused there
        owner = stats["owner"]
        assert owner == cluster.hub_addresses[0], stats
        status, answer = await call(http, "DELETE", local + sub)
        assert status == 403 and "protected mode" in answer["error"]


def test_loopback_addresses() -> None:
    assert all(map(is_loopback, ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost")))
    assert not any(map(is_loopback, ("0.0.0.0", "::", "10.1.2.3", "hub.example", "")))
