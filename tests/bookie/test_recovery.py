"""Recovery-open, fencing and crash faults with real bookie and writer processes."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from bookie import digest as digests
from bookie import protocol
from bookie.client import BookKeeper
from bookie.errors import BookieUnavailableError, LedgerFencedError
from bookie.ledger import LedgerHandle
from bookie.metadata import LedgerState
from tests.bookie.clusterutil import FAST_CLIENT, cluster_and_client


async def test_recovery_fences_the_old_writer(tmp_path: Path) -> None:
    async with cluster_and_client(tmp_path) as (cluster, writer):
        lh = await writer.create_ledger(3, 2, 2, password=b"pw")
        await lh.add_entries([b"m%d" % i for i in range(20)])
        recoverer = await BookKeeper.connect(cluster.metastore_uri, conf=FAST_CLIENT)
        try:
            rh = await recoverer.open_ledger(lh.ledger_id, password=b"pw")
            assert rh.is_closed and rh.metadata.state is LedgerState.CLOSED
            assert rh.metadata.last_entry_id == 19
            assert rh.metadata.length == sum(len(b"m%d" % i) for i in range(20))
            assert [e.data async for e in rh.read(0, 19)] == [b"m%d" % i for i in range(20)]
            with pytest.raises(LedgerFencedError):
                await lh.add_entry(b"too late")
            # a second recovery-open of a closed ledger is a plain open
            again = await recoverer.open_ledger(lh.ledger_id, password=b"pw")
            assert again.metadata.last_entry_id == 19
        finally:
            await recoverer.close()


async def test_tailing_an_open_ledger(tmp_path: Path) -> None:
    async with cluster_and_client(tmp_path) as (_, bk):
        lh = await bk.create_ledger(3, 2, 2)
        for i in range(10):  # one at a time: each add carries the LAC of the one before
            await lh.add_entry(b"t%d" % i)
        reader = await bk.open_ledger_no_recovery(lh.ledger_id)
        assert not reader.is_closed
        # bookies learn the LAC piggybacked on later adds: it lags the writer's by at most one entry
        assert 8 <= reader.last_add_confirmed <= 9
        assert [e.data async for e in reader.read(0, 8)] == [b"t%d" % i for i in range(9)]
        for i in range(10, 20):
            await lh.add_entry(b"t%d" % i)
        assert await reader.read_last_add_confirmed() == 18
        assert [e.data async for e in reader.read(17, 18)] == [b"t17", b"t18"]
        assert lh.metadata.state is LedgerState.OPEN  # tailing does not fence
        assert await lh.add_entry(b"still writable") == 20


async def test_recovery_replaces_a_dead_bookie_and_needs_enough_fenced(tmp_path: Path) -> None:
    async with cluster_and_client(tmp_path, bookies=4) as (cluster, bk):
        lh = await bk.create_ledger(3, 2, 2)
        await lh.add_entries([b"r%d" % i for i in range(30)])
        ensemble = lh.metadata.current_ensemble
        await cluster.kill_bookie(cluster.bookie_addresses.index(ensemble[0]))
        rh = await bk.open_ledger(lh.ledger_id)
        assert rh.metadata.last_entry_id == 29
        assert [e.data async for e in rh.read(0, 29)] == [b"r%d" % i for i in range(30)]

        lh2 = await bk.create_ledger(3, 2, 2)
        await lh2.add_entries([b"x"] * 5)
        alive = [a for a in lh2.metadata.current_ensemble if a != ensemble[0]]
        for a in alive[:2]:
            await cluster.kill_bookie(cluster.bookie_addresses.index(a))
        with pytest.raises(BookieUnavailableError):
            await bk.open_ledger(lh2.ledger_id)
        assert (await bk.ledgers.read(lh2.ledger_id))[0].state is LedgerState.IN_RECOVERY


async def _add_to_one_bookie(bk: BookKeeper, lh: LedgerHandle, addr: str, entry_id: int, lac: int, length: int,
                             body: bytes, password: bytes = b"") -> None:
    """An add that reached one bookie only (its writer died before the others): never acknowledged."""
    payload = digests.encode_entry(lh.ledger_id, entry_id, lac, length, body, lh.metadata.digest, password)
    conn = await bk._ctx.pool.get(addr)
    resp = await conn.request(protocol.add_request(conn.next_txn_id(), lh.ledger_id, entry_id,
                                                   digests.master_key(password), payload), 5.0)
    protocol.raise_for_status(resp)


async def test_recovery_keeps_the_last_entry_it_met_and_rewrites_entries_found_on_one_bookie(tmp_path: Path) -> None:
    """Entries past the LAC that only one bookie has (answered by the fence or read) are recovered to the
    full write set; ``read_last_entry`` then gives recovery's copy with no read (every bookie is gone)."""
    async with cluster_and_client(tmp_path) as (cluster, bk):
        lh = await bk.create_ledger(3, 2, 2)
        for i in range(5):   # one at a time: entry 4 carries LAC 3
            await lh.add_entry(b"e%d" % i)
        ens = lh.metadata.current_ensemble
        length = lh.length
        # entry 5 (write set 2, 0) only on ens[2]; entry 6 (write set 0, 1) only on ens[0]: a hole on each
        await _add_to_one_bookie(bk, lh, ens[2], 5, 3, length + 2, b"e5")
        await _add_to_one_bookie(bk, lh, ens[0], 6, 3, length + 4, b"e6")
        recoverer = await BookKeeper.connect(cluster.metastore_uri, conf=FAST_CLIENT)
        try:
            rh = await recoverer.open_ledger(lh.ledger_id)
            assert rh.metadata.last_entry_id == 6
            assert rh.metadata.length == length + 4
            reader = rh._reader
            for eid in (4, 5, 6):   # every member of each write set has it now
                for i in rh.metadata.write_set(eid):
                    got = reader.decode(await reader.read_from(ens[i], eid), eid)
                    assert got.body == b"e%d" % eid
            for i in range(3):
                await cluster.kill_bookie(i)
            last = await rh.read_last_entry()
            assert last is not None and (last.entry_id, last.data, last.ledger_length) == (6, b"e6", length + 4)
        finally:
            await recoverer.close()


async def test_recovery_of_a_cleanly_stopped_writer_and_of_an_empty_ledger(tmp_path: Path) -> None:
    """Every entry on its whole write set: the end is the last entry, nothing lost; an empty ledger ends at -1."""
    async with cluster_and_client(tmp_path) as (cluster, bk):
        lh = await bk.create_ledger(3, 2, 2)
        for i in range(7):
            await lh.add_entry(b"c%d" % i)
        empty = await bk.create_ledger(3, 2, 2)
        recoverer = await BookKeeper.connect(cluster.metastore_uri, conf=FAST_CLIENT)
        try:
            rh = await recoverer.open_ledger(lh.ledger_id)
            assert rh.metadata.last_entry_id == 6 and rh.metadata.length == lh.length
            assert [e.data async for e in rh.read(0, 6)] == [b"c%d" % i for i in range(7)]
            last = await rh.read_last_entry()
            assert last is not None and (last.entry_id, last.data) == (6, b"c6")
            with pytest.raises(LedgerFencedError):
                await lh.add_entry(b"too late")
            rempty = await recoverer.open_ledger(empty.ledger_id)
            assert rempty.metadata.last_entry_id == -1 and await rempty.read_last_entry() is None
            # a ledger another recoverer closed: read_last_entry reads it
            again = await bk.open_ledger(lh.ledger_id)
            last = await again.read_last_entry()
            assert last is not None and (last.entry_id, last.data) == (6, b"c6")
        finally:
            await recoverer.close()


@pytest.mark.slow
async def test_ten_thousand_adds_survive_a_bookie_kill(tmp_path: Path) -> None:
    async with cluster_and_client(tmp_path, bookies=4) as (cluster, bk):
        lh = await bk.create_ledger(3, 2, 2)
        victim = lh.metadata.current_ensemble[2]
        acked: list[int] = []
        third = asyncio.Event()

        async def writer() -> None:
            for start in range(0, 10_000, 100):
                ids = await lh.add_entries([b"entry-%06d" % i for i in range(start, start + 100)])
                acked.extend(ids)
                if len(acked) >= 3000:
                    third.set()

        task = asyncio.create_task(writer())
        await asyncio.wait_for(third.wait(), 60)
        await cluster.kill_bookie(cluster.bookie_addresses.index(victim))
        await asyncio.wait_for(task, 120)
        assert acked == list(range(10_000))
        assert len(lh.metadata.ensembles) >= 2
        await lh.close()
        rh = await bk.open_ledger(lh.ledger_id)
        seen = 0
        async for e in rh.read(0, 9999):
            assert e.entry_id == seen and e.data == b"entry-%06d" % seen
            seen += 1
        assert seen == 10_000


WRITER = textwrap.dedent("""
    import asyncio, sys
    from bookie.client import BookKeeper
    async def main():
        bk = await BookKeeper.connect(sys.argv[1], conf={"add_entry_timeout": "3"})
        lh = await bk.create_ledger(3, 2, 2, password=b"crash")
        print("ledger", lh.ledger_id, flush=True)
        i = 0
        while True:
            futs = [asyncio.ensure_future(lh.add_entry(b"w-%d" % (i + k))) for k in range(20)]
            for f in futs:
                print("acked", await f, flush=True)
            i += 20
    asyncio.run(main())
""")


@pytest.mark.slow
async def test_writer_killed_mid_stream_two_recoverers_agree(tmp_path: Path) -> None:
    async with cluster_and_client(tmp_path) as (cluster, bk):
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", WRITER, cluster.metastore_uri,
                                                    stdout=asyncio.subprocess.PIPE)
        assert proc.stdout is not None
        acked = -1
        ledger_id = None
        try:
            async with asyncio.timeout(60):
                while acked < 500:
                    line = (await proc.stdout.readline()).decode().split()
                    assert line, "writer died"
                    if line[0] == "ledger":
                        ledger_id = int(line[1])
                    else:
                        acked = int(line[1])
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()
        assert ledger_id is not None
        other = await BookKeeper.connect(cluster.metastore_uri, conf=FAST_CLIENT)
        try:
            r1, r2 = await asyncio.gather(bk.open_ledger(ledger_id, b"crash"), other.open_ledger(ledger_id, b"crash"))
        finally:
            await other.close()
        last = r1.metadata.last_entry_id
        assert last == r2.metadata.last_entry_id
        assert r1.metadata.length == r2.metadata.length
        assert last >= acked, f"recovered up to {last} but the writer saw {acked} acknowledged"
        data = [e.data async for e in r1.read(0, last)]
        assert data == [b"w-%d" % i for i in range(last + 1)]
