"""Helpers for ledger-client tests that run a real LocalCluster."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from bookie.client import BookKeeper
from tools.cluster import LocalCluster

FAST_CLIENT = {"read_entry_timeout": "5", "speculative_read_timeout_ms": "200",
               "bookie_watch_interval_ms": "200"}


CLUSTER_CONF = {"session_timeout": "1000", "gc_wait_time": "600000"}


@asynccontextmanager
async def cluster_and_client(tmp_path: Path, bookies: int = 3,
                             overrides: dict[str, str] | None = None) -> AsyncIterator[tuple[LocalCluster, BookKeeper]]:
    conf = {**CLUSTER_CONF, **(overrides or {})}
    async with LocalCluster(bookies=bookies, data_dir=tmp_path / "cluster", conf_overrides=conf) as cluster:
        bk = await BookKeeper.connect(cluster.metastore_uri, conf=FAST_CLIENT)
        try:
            yield cluster, bk
        finally:
            await bk.close()


async def wait_for(predicate, timeout: float = 20.0, interval: float = 0.05) -> None:  # type: ignore[no-untyped-def]
    """Poll an external condition (a registration, a file) until true; fail after ``timeout``."""
    async with asyncio.timeout(timeout):
        while not await predicate():  # noqa: ASYNC110 - an external condition, with a deadline
            await asyncio.sleep(interval)
