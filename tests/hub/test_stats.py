"""The stats endpoints of real hub and bookie processes: scraped during traffic, counters move."""

from __future__ import annotations

import asyncio
import json
import urllib.request
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from bookie.metrics import metric_name, serve_metrics
from hub.client import HedwigClient, Message
from tools.cluster import LocalCluster

in_cluster = pytest.mark.asyncio(loop_scope="module")

CONF = {"bk_ensemble_size": "1", "bk_write_quorum_size": "1", "bk_ack_quorum_size": "1", "zk_timeout": "1000"}
ROOT = Path(__file__).resolve().parents[2]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(bookies=1, hubs=1, data_dir=tmp_path_factory.mktemp("stats"),
                            conf_overrides=CONF) as c:
        yield c


def _scrape_sync(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


async def scrape(url: str) -> dict[str, float]:
    return await asyncio.to_thread(_scrape_sync, url)


@in_cluster
async def test_stats_urls_one_per_hub_and_bookie(cluster: LocalCluster) -> None:
    urls = cluster.stats_urls
    assert len(urls) == 2 and len(set(urls)) == 2
    assert all(u.startswith("http://127.0.0.1:") and u.endswith("/metrics") for u in urls)
    hub, bookie = await scrape(urls[0]), await scrape(urls[1])
    assert "hub_packets_received_total" in hub and "hub_readahead_cache_hits_total" in hub
    assert any(k.startswith("bookie_") for k in bookie) and not any(k.startswith("hub_") for k in bookie)


@in_cluster
async def test_counters_move_with_traffic(cluster: LocalCluster) -> None:
    hub_url, bookie_url = cluster.stats_urls
    before, bk_before = await scrape(hub_url), await scrape(bookie_url)
    topic = uuid.uuid4().hex.encode()
    got: list[Message] = []
    done = asyncio.Event()

    async def handler(t: bytes, s: bytes, m: Message) -> None:
        got.append(m)
        if len(got) == 5:
            done.set()

    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        await c.subscribe(topic, b"s")
        await c.start_delivery(topic, b"s", handler)
        during = await scrape(hub_url)
        assert during["hub_subscription_channels"] >= 1
        for i in range(5):
            await c.publish(topic, b"m%d" % i)
        await asyncio.wait_for(done.wait(), 20)
        await c.unsubscribe(topic, b"s")
    after, bk_after = await scrape(hub_url), await scrape(bookie_url)

    def delta(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    assert delta("hub_requests_total{op=publish}") == 5
    assert delta("hub_requests_total{op=subscribe}") == 1
    assert delta("hub_requests_total{op=unsubscribe}") == 1
    assert delta("hub_request_seconds_count{op=publish}") == 5
    assert delta("hub_messages_delivered_total") >= 5
    assert delta("hub_packets_received_total") >= 8
    assert delta("hub_packets_sent_total") >= 8
    assert after["hub_topics_owned"] >= 1
    assert delta("hub_readahead_cache_hits_total") + delta("hub_readahead_cache_misses_total") >= 5
    adds = 'bookie_requests_total{op=ADD_ENTRY,status=OK}'
    assert bk_after.get(adds, 0) - bk_before.get(adds, 0) >= 1


@in_cluster
async def test_hub_metrics_survive_restart_on_same_port(cluster: LocalCluster) -> None:
    url = cluster.stats_urls[0]
    await cluster.kill_hub(0)
    await cluster.restart_hub(0)
    assert cluster.stats_urls[0] == url
    assert (await scrape(url))["hub_packets_received_total"] == 0


def test_naming_scheme_and_serve_errors() -> None:
    assert metric_name("hub", "x") == "hub_x" and metric_name("bookie", "x") == "bookie_x"
    with pytest.raises(ValueError, match="role"):
        metric_name("spark", "x")
    from prometheus_client import CollectorRegistry

    url, stop = serve_metrics(CollectorRegistry(), "127.0.0.1", 0)
    try:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        with pytest.raises(OSError):
            serve_metrics(CollectorRegistry(), "127.0.0.1", port)
    finally:
        stop()


def test_dashboard_uses_only_exported_metrics() -> None:
    dash = json.loads((ROOT / "conf" / "grafana-quire.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 7
    text = " ".join(exprs)
    for needed in ("hub_requests_total", "hub_request_seconds_bucket", "hub_messages_delivered_total",
                   "hub_backlog_messages", "hub_readahead_cache_hits_total", "bookie_group_commit_entries",
                   "bookie_group_commit_seconds_bucket"):
        assert needed in text
