"""A shared LocalCluster (3 bookie and 2 hub processes) for the hub tests of one module; HTTP helpers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest_asyncio

from tools.cluster import LocalCluster

HUB_CONF = {"bk_ensemble_size": "2", "bk_write_quorum_size": "2", "bk_ack_quorum_size": "2", "zk_timeout": "1000",
            "max_entries_per_ledger": "4", "consume_interval": "2", "session_timeout": "1000",
            "cache_size": "1048576", "server_filter_allowlist": "tests.hub.sample_filter",
            "rebalance_interval_sec": "0"}  # no load shedding: these tests pin topics to the hub that claimed them


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: object) -> AsyncIterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("hubcluster")  # type: ignore[attr-defined]
    async with LocalCluster(bookies=3, hubs=2, data_dir=root, conf_overrides=HUB_CONF) as c:
        yield c


@pytest_asyncio.fixture(loop_scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """An HTTP client for the hubs' admin API (tests whose event loop is the module's)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        yield session


def hub_url(cluster: LocalCluster, i: int) -> str:
    """The HTTP base URL of hub ``i`` (``stats_urls`` lists hubs first)."""
    return cluster.stats_urls[i].removesuffix("/metrics")
