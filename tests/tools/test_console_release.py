"""``quire console`` ``release topic``: the owner gives a topic up as load shedding does (real processes)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from hub.client import HedwigClient, Message
from metastore import open_metastore
from tests.fixtures.polling import eventually
from tests.hub.conftest import HUB_CONF
from tools.cluster import LocalCluster

TOKEN = "release-admin-token"
TIMEOUT = 90
pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.slow, pytest.mark.timeout(240)]


async def console(cluster: LocalCluster, server: int, *commands: str, token: str | None = TOKEN,
                  extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "tools.cli", "console", "--server", cluster.hub_addresses[server],
            "--metastore", cluster.metastore_uri, *extra]
    for c in commands:
        args += ["-c", c]
    env = {k: v for k, v in os.environ.items() if k != "QUIRE_HTTP_ADMIN_TOKEN"}
    if token is not None:
        env["QUIRE_HTTP_ADMIN_TOKEN"] = token
    return await asyncio.to_thread(subprocess.run, args, capture_output=True, text=True, timeout=TIMEOUT, env=env)


async def test_release_moves_the_topic_to_the_least_loaded_hub_without_loss(tmp_path: Path) -> None:
    conf = dict(HUB_CONF, http_admin_token=TOKEN)      # rebalance_interval_sec=0: only the console moves topics
    async with LocalCluster(bookies=3, hubs=2, data_dir=tmp_path, conf_overrides=conf) as cluster:
        hub0, hub1 = cluster.hub_addresses
        await cluster.stop_hub(1)                       # everything lands on hub 0 ...
        got: list[int] = []
        events: list[str] = []
        cond = asyncio.Condition()

        async def handler(topic: bytes, sub: bytes, m: Message) -> None:
            async with cond:
                got.append(m.seq_id)
                cond.notify_all()

        async def listener(topic: bytes, sub: bytes, event: str) -> None:
            async with cond:
                events.append(event)
                cond.notify_all()

        async def wait(pred: object) -> None:
            async with asyncio.timeout(30), cond:
                await cond.wait_for(pred)  # type: ignore[arg-type]

        async with await HedwigClient.connect(hub0) as pub, \
                await HedwigClient.connect(hub0, conf={"consumed_messages_buffer_size": "1"}) as sub:
            sub.add_subscription_listener(listener)
            await sub.subscribe(b"rel", b"s1")
            await sub.start_delivery(b"rel", b"s1", handler)
            published = [await pub.publish(b"rel", b"%d" % i) for i in range(5)]
            for other in (b"rel-other-1", b"rel-other-2"):
                await pub.publish(other, b"x")
            assert pub.owner[b"rel"] == hub0
            await cluster.restart_hub(1)                # ... and hub 1 joins empty
            await wait(lambda: len(got) == 5)
            ms = await open_metastore(cluster.metastore_uri)
            try:
                async def consumed_on_hub() -> bool:   # the consume of 5 reached the hub (persisted at release)
                    async with aiohttp.ClientSession() as http:
                        url = cluster.stats_urls[0].removesuffix("/metrics") + "/admin/v1/topics/rel/stats"
                        async with http.get(url) as resp:
                            stats = await resp.json()
                    return bool(stats["subscriptions"]["s1"]["consumed_seq_id"] == 5)

                await eventually(consumed_on_hub)

                # asked of hub 1, which forwards to the owner
                res = await console(cluster, 1, "release topic rel")
                assert res.returncode == 0, res.stdout + res.stderr
                assert f"Topic rel released by hub {hub0} at seq id 5; subscribers moved: s1" in res.stdout
                await wait(lambda: "TOPIC_MOVED" in events)
                owners = await ms.create_table("topic_owners")

                # the next access goes to the least loaded hub (hub 0 kept two topics, hub 1 has none)
                published += [await pub.publish(b"rel", b"%d" % i) for i in range(5, 10)]
                assert published == list(range(1, 11))          # dense: nothing lost or stored twice
                assert pub.owner[b"rel"] == hub1
                assert (await owners.get("rel")).value         # claimed again
                await wait(lambda: len(got) >= 10)
                assert got == published                         # delivered once each, in order

                # --json, asked of hub 0 (forwarded to hub 1, the owner now)
                res = await console(cluster, 0, "release topic rel", extra=("--json",))
                assert res.returncode == 0, res.stdout + res.stderr
                doc = json.loads(res.stdout.strip())
                assert doc == {"released": "rel", "owner": hub1, "last_seq_id": 10, "subscribers_moved": ["s1"]}
                assert "Finished" in res.stderr and "Finished" not in res.stdout
                await wait(lambda: events.count("TOPIC_MOVED") == 2)
                assert await pub.publish(b"rel", b"10") == 11
                await wait(lambda: len(got) >= 11)
                assert got == list(range(1, 12))

                # an unowned topic: a clear message, a non-zero exit; a wrong token is refused
                res = await console(cluster, 0, "release topic nosuchtopic")
                assert res.returncode == 1
                assert "Topic nosuchtopic is not owned by any hub: nothing to release." in res.stdout
                res = await console(cluster, 0, "release topic rel", token="wrong")
                assert res.returncode == 1 and "HTTP 401" in res.stdout, res.stdout
                res = await console(cluster, 0, "release topic")
                assert res.returncode == 1 and "usage: release topic {topic} [--json]" in res.stdout
            finally:
                await ms.close()
