"""A bookie that stops answering under publish load stalls a hub's publishing under 2 s (issue 20).

SIGSTOP of the bookie process models a cut-off host for the hub's ledger
client (its TCP stays up, nothing answers); the long ``session_timeout``
keeps it registered, as a cut-off bookie stays registered with lmdb leases.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import uuid
from pathlib import Path

import pytest

from bookie.metadata import LedgerMetadataManager
from hub import errors
from hub.client import HedwigClient, Message
from metastore import open_metastore
from tools.cluster import LocalCluster

pytestmark = pytest.mark.asyncio(loop_scope="function")

CONF = {"bk_ensemble_size": "3", "bk_write_quorum_size": "2", "bk_ack_quorum_size": "2", "zk_timeout": "1000",
        "session_timeout": "30000", "rebalance_interval_sec": "0"}


async def test_a_stopped_bookie_stalls_publishing_under_two_seconds(tmp_path: Path) -> None:
    async with LocalCluster(bookies=4, hubs=1, data_dir=tmp_path / "c", conf_overrides=CONF) as cluster:
        topic = uuid.uuid4().hex.encode()
        loop = asyncio.get_running_loop()
        acked: list[tuple[float, int]] = []
        failed: list[BaseException] = []
        stop = asyncio.Event()
        progress = asyncio.Event()

        async def publisher(c: HedwigClient, n: int) -> None:
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    seq = await c.publish(topic, b"p%d-%d" % (n, i))
                except errors.PubSubError as exc:
                    failed.append(exc)
                    continue
                acked.append((loop.time(), seq))
                progress.set()

        async def count_reaches(n: int) -> None:
            async with asyncio.timeout(30):
                while len(acked) < n:
                    progress.clear()
                    await progress.wait()

        async with await HedwigClient.connect(cluster.hub_addresses[0],
                                              conf={"server_ack_response_timeout": "30000"}) as c:
            await c.subscribe(topic, b"all")
            await c.close_subscription(topic, b"all")
            tasks = [asyncio.create_task(publisher(c, n)) for n in range(4)]
            try:
                await count_reaches(100)
                store = await open_metastore(cluster.metastore_uri)
                try:
                    ledgers = await LedgerMetadataManager.open(store)
                    open_ledgers = [md async for _, md in ledgers.list() if not md.is_closed]
                finally:
                    await store.close()
                assert len(open_ledgers) == 1
                victim = open_ledgers[0].current_ensemble[0]
                pid = cluster.bookie_pid(cluster.bookie_addresses.index(victim))
                assert pid is not None
                os.kill(pid, signal.SIGSTOP)
                try:
                    cut_at = loop.time()
                    await count_reaches(len(acked) + 200)
                finally:
                    os.kill(pid, signal.SIGCONT)
            finally:
                stop.set()
                await asyncio.wait_for(asyncio.gather(*tasks), 30)   # no publish hangs
            # healed: the first publish to a new topic does not wait on a stale connection
            for _ in range(3):
                t0 = loop.time()
                assert await asyncio.wait_for(c.publish(uuid.uuid4().hex.encode(), b"first"), 10) == 1
                first_publish = loop.time() - t0
                print(f"first publish to a new topic after SIGCONT: {first_publish:.3f} s")
                assert first_publish < 1.0
        times = [cut_at] + [t for t, _ in acked if t > cut_at]
        stall = max(b - a for a, b in itertools.pairwise(times))
        print(f"longest publish gap after SIGSTOP of a bookie: {stall:.3f} s")
        assert not failed
        assert stall <= 2.0
        seqs = sorted(s for _, s in acked)
        assert seqs == list(range(1, len(seqs) + 1))
        got: list[int] = []
        done = asyncio.Event()

        async def handler(t: bytes, s: bytes, m: Message) -> None:
            got.append(m.seq_id)
            if m.seq_id >= seqs[-1]:
                done.set()

        async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
            await c.subscribe(topic, b"all", create_or_attach="ATTACH")
            await c.start_delivery(topic, b"all", handler)
            await asyncio.wait_for(done.wait(), 30)
        assert set(seqs) <= set(got)
