"""Cross-region subscriptions between real per-region clusters (own metastore, bookie, hub each)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from hub import errors
from hub.client import HedwigClient, Message
from hub.message import SubscriptionPreferences
from hub.regions import RegionFilter, parse_regions
from metastore.conf import ConfError
from tests.hub.test_hub import Collector
from tests.hub.test_stats import scrape  # the same handler/waiter as the single-region tests
from tools.cluster import LocalCluster

in_cluster = pytest.mark.asyncio(loop_scope="module")
REGIONS = ["r1", "r2", "r3"]
CONF = {"bk_ensemble_size": "1", "bk_write_quorum_size": "1", "bk_ack_quorum_size": "1", "zk_timeout": "1000",
        "retry_remote_subscribe_thread_run_interval": "300"}
FAST = {"server_ack_response_timeout": "5000", "subscribe_reconnect_retry_wait_time": "100"}
ROOT = Path(__file__).resolve().parents[2]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(bookies=1, hubs=1, regions=REGIONS, data_dir=tmp_path_factory.mktemp("regions"),
                            conf_overrides=CONF) as c:
        yield c


def name() -> bytes:
    return uuid.uuid4().hex[:10].encode()


async def publish(c: HedwigClient, topic: bytes, body: bytes, timeout: float = 20.0) -> int:
    """Publish, retrying while a restarted hub's predecessor still holds the topic (until its lease ends)."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                return await c.publish(topic, body)
            except (errors.TooManyRedirectsError, errors.ServiceDownError):
                await asyncio.sleep(0.2)


async def connect(cluster: LocalCluster, region: str) -> HedwigClient:
    return await HedwigClient.connect(cluster.hub_addresses_by_region[region][0], conf=FAST)


@in_cluster
async def test_publish_in_r1_reaches_r2_with_its_source_region(cluster: LocalCluster) -> None:
    assert set(cluster.hub_addresses_by_region) == set(REGIONS)
    assert cluster.hub_addresses == cluster.hub_addresses_by_region["r1"]
    assert len(cluster.stats_urls) == 6
    topic = name()
    async with await connect(cluster, "r1") as c1, await connect(cluster, "r2") as c2:
        col = Collector()
        await c2.subscribe(topic, b"s2", synchronous=True)   # returns once r2's hub follows r1 and r3
        await c2.start_delivery(topic, b"s2", col)
        seqs = [await c1.publish(topic, b"m%d" % i, properties={"p": b"v"}) for i in range(5)]
        await col.wait(lambda g: len(g) == 5)
        assert [m.body for m in col.got] == [b"m%d" % i for i in range(5)]
        assert {m.src_region for m in col.got} == {"r1"}
        assert [m.msg_id.remote["r1"] for m in col.got] == seqs   # the r1 component is r1's seq id
        assert [m.seq_id for m in col.got] == [1, 2, 3, 4, 5]       # r2's own local components
        assert col.got[0].properties == {"p": b"v"}
        r2_stats = await scrape(cluster.region_clusters["r2"].stats_urls[0])    # r2's hub
        assert r2_stats["hub_remote_subscriptions"] >= 2                           # in r1 and r3
        assert r2_stats["hub_events_total{event=remote_messages_persisted}"] >= 5
        # a local publish in r2 carries the vector-max
        await c2.publish(topic, b"local")
        await col.wait(lambda g: len(g) == 6)
        assert col.got[-1].src_region == "r2" and col.got[-1].msg_id.remote == {"r1": seqs[-1]}


@in_cluster
async def test_three_regions_all_to_all_without_duplicates_or_loops(cluster: LocalCluster) -> None:
    topic = name()
    clients = {r: await connect(cluster, r) for r in REGIONS}
    cols = {r: Collector() for r in REGIONS}
    try:
        for r, c in clients.items():
            await c.subscribe(topic, b"sub-" + r.encode(), synchronous=True)
            await c.start_delivery(topic, b"sub-" + r.encode(), cols[r])
        for i in range(4):
            for r, c in clients.items():
                await c.publish(topic, f"{r}-{i}".encode())
        for r in REGIONS:
            await cols[r].wait(lambda g: len(g) >= 12)
        # sentinels published after everything: once they are in, anything looping would be too
        for r, c in clients.items():
            await c.publish(topic, f"{r}-end".encode())
        for r in REGIONS:
            await cols[r].wait(lambda g: sum(m.body.endswith(b"-end") for m in g) == 3)
        for r in REGIONS:
            bodies = [m.body.decode() for m in cols[r].got]
            assert len(bodies) == 15 == len(set(bodies)), (r, bodies)
            for src in REGIONS:    # each region's messages in that region's order everywhere
                mine = [b for b in bodies if b.startswith(src)]
                assert mine == [f"{src}-{i}" for i in range(4)] + [f"{src}-end"]
                assert {m.src_region for m in cols[r].got if m.body.decode().startswith(src)} == {src}
            assert [m.seq_id for m in cols[r].got] == list(range(1, 16))
    finally:
        for c in clients.values():
            await c.close()


@in_cluster
async def test_last_local_subscriber_leaving_removes_remote_subscriptions(cluster: LocalCluster) -> None:
    topic = name()
    async with await connect(cluster, "r1") as c1, await connect(cluster, "r2") as c2:
        await c2.subscribe(topic, b"s", synchronous=True)
        probe = b"__region_r2"
        same = {"options": {"quire.region": b"r1"}, "message_filter": "hub.regions.RegionFilter"}
        prefs = await c1.subscribe(topic, probe, "ATTACH", force_attach=True, **same)   # r2's hub subscription
        assert prefs.options == {"quire.region": b"r1"}
        # r2's hub takes its subscription back within its retry interval (issue 33, D2): it may have done so already
        with contextlib.suppress(errors.ClientNotSubscribedError):
            await c1.close_subscription(topic, probe)
        await c2.unsubscribe(topic, b"s")
        async with asyncio.timeout(20):
            while True:
                try:
                    await c1.subscribe(topic, probe, "ATTACH", force_attach=True, **same)
                except (errors.ClientNotSubscribedError, errors.NoSubscriptionStateError):
                    break   # (the second: our ATTACH raced the removal)
                with contextlib.suppress(errors.ClientNotSubscribedError):
                    await c1.close_subscription(topic, probe)
                await asyncio.sleep(0.1)


@in_cluster
async def test_region_hubs_killed_and_restarted_lose_nothing(cluster: LocalCluster) -> None:
    topic = name()
    sent: list[bytes] = []
    col = Collector()
    async with await connect(cluster, "r2") as c2:
        await c2.subscribe(topic, b"s", synchronous=True)
        await c2.start_delivery(topic, b"s", col)
        async with await connect(cluster, "r1") as c1:
            for i in range(3):
                await c1.publish(topic, b"a%d" % i)
                sent.append(b"a%d" % i)
        await cluster.region_clusters["r1"].kill_hub(0)          # the publishing region's hub
        await cluster.region_clusters["r1"].restart_hub(0)
        async with await connect(cluster, "r1") as c1:
            for i in range(3):
                await publish(c1, topic, b"b%d" % i)
                sent.append(b"b%d" % i)
            await col.wait(lambda g: len(g) == 6)
            await cluster.region_clusters["r2"].kill_hub(0)      # the subscribing region's hub
            for i in range(3):
                await publish(c1, topic, b"c%d" % i)              # acknowledged in r1 while r2 is down
                sent.append(b"c%d" % i)
            await cluster.region_clusters["r2"].restart_hub(0)   # c2 resubscribes; r2's hub follows r1 again
            for i in range(2):
                await publish(c1, topic, b"d%d" % i)
                sent.append(b"d%d" % i)
        await col.wait(lambda g: {m.body for m in g} >= set(sent))
        bodies = [m.body for m in col.got]
        assert len(bodies) == len(set(bodies)) == len(sent)      # nothing lost, nothing twice
        assert bodies == sent                                    # r1's order


@in_cluster
async def test_remote_region_down_local_service_unaffected_and_retried(cluster: LocalCluster) -> None:
    topic = name()
    r3 = cluster.region_clusters["r3"]
    await r3.kill_hub(0)
    try:
        async with await connect(cluster, "r1") as c1:
            col = Collector()
            await c1.subscribe(topic, b"s")                      # not synchronous: answered at once
            await c1.start_delivery(topic, b"s", col)
            assert await c1.publish(topic, b"local") == 1
            await col.wait(lambda g: len(g) == 1)
            async with await HedwigClient.connect(cluster.hub_addresses[0],
                                                  conf={"server_ack_response_timeout": "20000"}) as slow:
                with pytest.raises(errors.CouldNotConnectError, match="r3"):   # after the region client's 5 s
                    await slow.subscribe(name(), b"s", synchronous=True)
            await r3.restart_hub(0)                              # retried every 300 ms: r3's messages arrive
            async with await connect(cluster, "r3") as c3:
                async with asyncio.timeout(30):
                    while not any(m.src_region == "r3" for m in col.got):
                        await c3.publish(topic, b"from r3")
                        await asyncio.sleep(0.3)
            await col.wait(lambda g: any(m.body == b"from r3" for m in g))
    finally:
        if r3.hub_pid(0) is None:
            await r3.restart_hub(0)


def test_region_conf_parsing_and_filter() -> None:
    assert parse_regions(("r2", "r3=h:1,h:2", "r1"), ("r2=a:1",), own="r1") == {"r2": "a:1", "r3": "h:1,h:2"}
    for entries, hubs, needle in [(("r2",), (), "no hub address for region 'r2'"),
                                  (("r2=",), (), "bad entry"), ((), ("nonsense",), "remote_hubs")]:
        with pytest.raises(ConfError, match=needle):
            parse_regions(entries, hubs, own="r1")
    f = RegionFilter().initialize({})
    f.set_subscription_preferences(b"t", b"__region_r2", SubscriptionPreferences(options={"quire.region": b"r1"}))
    assert f.test_message(Message(b"x", src_region="r1")) and not f.test_message(Message(b"x", src_region="r3"))
    with pytest.raises(ValueError, match=r"quire\.region"):
        RegionFilter().set_subscription_preferences(b"t", b"s", SubscriptionPreferences())


def test_hub_with_a_bad_regions_entry_exits_with_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tools.cli", "hub", "--set", "server_port=0", "--set", "region=r1",
         "--set", "regions=r2", "--metastore", f"lmdb://{tmp_path / 'ms'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("quire hub:")]
    assert len(lines) == 1 and "no hub address for region 'r2'" in lines[0]


def test_readme_two_region_example_runs(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Hub operations"):]
    code = section[section.index("```python\n") + 10:section.index("```\n\nprints")]
    script = tmp_path / "example.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "b'published in the east' east {'east': 1}"
