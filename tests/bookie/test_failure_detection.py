"""The ledger client notices a bookie that answers nothing in about ``add_entry_timeout`` (issue 20).

A SIGSTOPped bookie process is a faithful model of a cut-off host for the
client: its TCP connections stay up (the kernel still acknowledges packets)
and nothing answers. A bookie stopped and continued in turn models a slow one
(stalls well under the timeout): it must not be replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from bookie import errors
from bookie.client import BookKeeper
from bookie.connection import BookieConnectionPool
from bookie.ledger import LedgerHandle
from tests.bookie.clusterutil import FAST_CLIENT, cluster_and_client
from tests.fixtures.polling import eventually
from tools.cluster import LocalCluster

pytestmark = pytest.mark.asyncio(loop_scope="function")

STALL_LIMIT = 2.0   # seconds: add_entry_timeout (1.5 s) + ensemble change + re-send
REGISTERED = {"session_timeout": "30000"}  # a cut-off bookie stays registered (as with lmdb leases across hosts)


@contextlib.contextmanager
def stopped(cluster: LocalCluster, address: str) -> Iterator[int]:
    """SIGSTOP the bookie at ``address`` for the block; SIGCONT on the way out, whatever happens."""
    pid = cluster.bookie_pid(cluster.bookie_addresses.index(address))
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        os.kill(pid, signal.SIGCONT)


class Writer:
    """Adds back to back (``window`` in flight) until stopped; records when each acknowledgement arrived."""

    def __init__(self, lh: LedgerHandle, window: int = 8) -> None:
        self.lh = lh
        self.loop = asyncio.get_running_loop()
        self.acked: dict[int, bytes] = {}
        self.ack_times: list[float] = []
        self.errors: list[BaseException] = []
        self._room = asyncio.Semaphore(window)
        self._progress = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _done(self, data: bytes, entry_id: int, error: errors.BKError | None) -> None:
        self._room.release()
        if error is None:
            self.acked[entry_id] = data
            self.ack_times.append(self.loop.time())
        else:
            self.errors.append(error)
        self._progress.set()

    async def _run(self) -> None:
        i = 0
        while not self._stop.is_set() and not self.errors:
            await self._room.acquire()
            data = b"entry-%d" % i
            self.lh.async_add_entry(data, lambda eid, err, data=data: self._done(data, eid, err))
            i += 1

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Writer]:
        self._task = self.loop.create_task(self._run())
        try:
            yield self
        finally:
            self._stop.set()
            await asyncio.wait_for(self._task, 30)
            await asyncio.wait_for(self.lh._require_writer().drain(), 30)

    async def acks(self, n: int, timeout: float = 20.0) -> None:
        """Wait until ``n`` more adds were acknowledged."""
        target = len(self.ack_times) + n
        async with asyncio.timeout(timeout):
            while len(self.ack_times) < target and not self.errors:
                self._progress.clear()
                await self._progress.wait()

    def longest_gap(self, since: float) -> float:
        """The longest time without an acknowledgement from ``since`` to the last one."""
        times = [since] + [t for t in self.ack_times if t > since]
        return max(b - a for a, b in itertools.pairwise(times)) if len(times) > 1 else float("inf")


async def test_a_stopped_bookie_stalls_adds_at_most_about_two_seconds(tmp_path: Path) -> None:
    async with cluster_and_client(tmp_path, bookies=4, overrides=REGISTERED) as (cluster, bk):
        lh = await bk.create_ledger(3, 2, 2)
        victim = lh.metadata.current_ensemble[1]
        writer = Writer(lh)
        async with writer.running():
            await writer.acks(200)
            old_conn = bk.pool.connected(victim)
            assert old_conn is not None
            with stopped(cluster, victim):
                cut_at = writer.loop.time()
                await eventually(lambda: victim not in lh.metadata.current_ensemble or writer.errors, 10, 0.02)
                await writer.acks(200)
                stall = writer.longest_gap(cut_at)
                # new ledgers meanwhile leave the quarantined (still registered) bookie out and start at once
                t0 = writer.loop.time()
                other = await bk.create_ledger(3, 2, 2)
                assert await other.add_entry(b"during") == 0
                during_create = writer.loop.time() - t0
                assert victim not in other.metadata.current_ensemble
                assert victim in bk.watcher.writable
            await writer.acks(50)
        assert not writer.errors
        print(f"longest gap between acknowledgements after SIGSTOP: {stall:.3f} s; "
              f"new ledger while stopped: {during_create:.3f} s")
        assert stall <= STALL_LIMIT
        assert during_create < 1.0
        assert len(lh.metadata.ensembles) == 2 and victim not in lh.metadata.current_ensemble
        assert old_conn.is_closed and bk.pool.connected(victim) is not old_conn
        assert bk.failure_history[victim] >= 1
        # continued: the next ledger on it opens a fresh connection, no wait behind the old one
        await eventually(lambda: victim not in bk._ctx.quarantined(), 10)   # bookie_quarantine_time_s
        t0 = writer.loop.time()
        again = await bk.create_ledger(4, 2, 2)     # every bookie
        assert victim in again.metadata.current_ensemble
        assert await again.add_entries([b"x-%d" % i for i in range(8)]) == list(range(8))
        after_create = writer.loop.time() - t0
        print(f"new ledger on the continued bookie: {after_create:.3f} s")
        assert after_create < 1.0
        await again.close()
        await other.close()
        # every acknowledged add reads back
        await lh.close()
        last = max(writer.acked)
        assert sorted(writer.acked) == list(range(last + 1))
        rh = await bk.open_ledger(lh.ledger_id)
        assert rh.last_add_confirmed >= last
        got = {e.entry_id: e.data async for e in rh.read(0, last)}
        assert got == writer.acked


async def test_a_slow_bookie_that_keeps_answering_is_not_replaced(tmp_path: Path) -> None:
    async with cluster_and_client(tmp_path, bookies=4, overrides=REGISTERED) as (cluster, bk):
        lh = await bk.create_ledger(3, 2, 2)
        slow = lh.metadata.current_ensemble[0]
        pid = cluster.bookie_pid(cluster.bookie_addresses.index(slow))
        assert pid is not None
        writer = Writer(lh)
        async with writer.running():
            await writer.acks(100)
            start = writer.loop.time()
            try:
                for _ in range(5):   # answers come in bursts 0.9 s apart: slow, never silent for 1.5 s
                    os.kill(pid, signal.SIGSTOP)
                    await asyncio.sleep(0.9)  # the stall being modelled
                    os.kill(pid, signal.SIGCONT)
                    await writer.acks(5)
                    await asyncio.sleep(0.1)
            finally:
                os.kill(pid, signal.SIGCONT)
            await writer.acks(50)
        gap = writer.longest_gap(start)
        print(f"longest gap between acknowledgements with a stalling bookie: {gap:.3f} s")
        assert not writer.errors
        assert gap >= 0.8                                   # the bookie really was slow
        assert len(lh.metadata.ensembles) == 1 and slow in lh.metadata.current_ensemble
        assert slow not in bk.failure_history
        conn = bk.pool.connected(slow)
        assert conn is not None
        await lh.close()


async def test_a_quarantined_bookie_is_left_out_of_new_ledgers(tmp_path: Path) -> None:
    async with cluster_and_client(tmp_path, bookies=3, overrides=REGISTERED) as (cluster, bk):
        lh = await bk.create_ledger(3, 2, 2)
        assert await lh.add_entry(b"a") == 0
        victim = lh.metadata.current_ensemble[0]
        with stopped(cluster, victim):
            with pytest.raises(errors.NotEnoughBookiesError):   # judged silent, no spare: the add fails
                await asyncio.wait_for(lh.add_entries([b"b-%d" % i for i in range(3)]), 10)
        assert victim in bk.failure_history and victim in bk.watcher.writable
        with pytest.raises(errors.NotEnoughBookiesError):       # still registered, but quarantined
            await bk.create_ledger(3, 2, 2)
        await eventually(lambda: victim not in bk._ctx.quarantined(), 10)
        again = await bk.create_ledger(3, 2, 2)
        assert victim in again.metadata.current_ensemble and await again.add_entry(b"c") == 0
        await again.close()


async def test_the_quorum_timeout_fails_an_add_the_per_bookie_timeout_has_not_judged(tmp_path: Path) -> None:
    async with cluster_and_client(tmp_path, bookies=4, overrides=REGISTERED) as (cluster, _):
        bk = await BookKeeper.connect(cluster.metastore_uri, conf={
            **FAST_CLIENT, "add_entry_timeout": "30", "add_entry_quorum_timeout": "1"})
        try:
            lh = await bk.create_ledger(3, 3, 3)
            assert await lh.add_entry(b"before") == 0
            victim = lh.metadata.current_ensemble[2]
            with stopped(cluster, victim):
                t0 = asyncio.get_running_loop().time()
                with pytest.raises(errors.BKTimeoutError, match="add_entry_quorum_timeout"):
                    await asyncio.wait_for(lh.add_entry(b"stuck"), 10)
                waited = asyncio.get_running_loop().time() - t0
                with pytest.raises(errors.BKTimeoutError):  # entries complete in order: later adds fail too
                    await lh.add_entry(b"later")
            assert 0.9 <= waited < 3.0
            assert len(lh.metadata.ensembles) == 1        # the bookie itself was not judged failed
        finally:
            await bk.close()


async def test_pooled_connections_have_keepalive_and_a_user_timeout(tmp_path: Path) -> None:
    async with cluster_and_client(tmp_path, bookies=1) as (cluster, _):
        pool = BookieConnectionPool(connect_timeout=2.0, user_timeout=1.5, keepalive=1.0)
        try:
            conn = await pool.get(cluster.bookie_addresses[0])
            assert conn._transport is not None
            sock = conn._transport.get_extra_info("socket")
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 1500
            pool.drop(conn)
            assert conn.is_closed and pool.connected(cluster.bookie_addresses[0]) is None
            fresh = await pool.get(cluster.bookie_addresses[0])
            assert fresh is not conn and not fresh.is_closed
        finally:
            pool.close()
