"""Publishing across many owned topics: what one message per topic costs the hub on the wire.

Real processes (``LocalCluster``: 3 bookies, 1 hub, E3 W2 A2). The hub's own
write syscalls are read from ``/proc/<pid>/io`` (``syscw``) around a burst of
one publish to each of many topics that it owns already, so each publish is
an entry of its own ledger.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from hub.client import HedwigClient
from tools.cluster import LocalCluster

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOPICS = 200
CONF = {"bk_ensemble_size": "3", "bk_write_quorum_size": "2", "bk_ack_quorum_size": "2",
        "rebalance_interval_sec": "0"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("spread")
    async with LocalCluster(bookies=3, hubs=1, data_dir=root, conf_overrides=CONF) as c:
        yield c


def write_syscalls(pid: int) -> int:
    """The write syscalls process ``pid`` has made so far (``/proc/<pid>/io`` ``syscw``)."""
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key == "syscw":
                return int(value)
    raise AssertionError(f"no syscw in /proc/{pid}/io")


async def test_publish_answers_of_many_topics_leave_together_not_one_write_per_entry(cluster: LocalCluster) -> None:
    """Each entry acknowledged used to flush every client connection at once (to get its answers out before
    its deliveries were built), so 200 topics' answers took 200 writes; without subscribers there is nothing
    to build and the answers of one bookie read leave in one write."""
    topics = [f"spread-{uuid.uuid4().hex[:8]}-{i}".encode() for i in range(TOPICS)]
    client = await HedwigClient.connect(cluster.hub_addresses[0], conf={"max_outstanding_messages": str(TOPICS)})
    try:
        async with asyncio.timeout(60):
            await asyncio.gather(*(client.publish(t, b"first") for t in topics))   # acquired, ledgers open
            pid = cluster.hub_pid(0)
            assert pid is not None
            before = write_syscalls(pid)
            seqs = await asyncio.gather(*(client.publish_async(t, b"x" * 100) for t in topics))
            writes = write_syscalls(pid) - before
    finally:
        await client.close()
    assert seqs == [2] * TOPICS                 # each topic's second message: one entry per topic
    # the old path: at least one write to the client per entry, plus the bookie frames
    assert writes < TOPICS // 2, f"{writes} write syscalls for {TOPICS} publishes to {TOPICS} topics"
