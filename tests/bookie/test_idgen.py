"""Ledger ids in blocks (``bookie.idgen``): unique under contention, across clients, kills and restarts."""

from __future__ import annotations

import asyncio
import os
import signal
import textwrap
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bookie.client import BookKeeper
from bookie.idgen import IDGEN_KEY, IDGEN_TABLE, LEGACY_FENCE, LedgerIdAllocator
from bookie.metadata import LedgerMetadataManager
from metastore import MetaStore, Value, Version, open_metastore
from metastore.cas import update_record
from metastore.testing.children import child, readline, reap
from tests.bookie.clusterutil import FAST_CLIENT, cluster_and_client

BACKENDS = ["lmdb-cas", "lmdb-native", "zookeeper", "hbase"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, bool]:
    """``(uri, native)``: the store, and whether allocators use its native counters (else CAS blocks)."""
    kind = request.param
    if kind.startswith("lmdb"):
        return f"lmdb://{tmp_path / 'meta'}", kind == "lmdb-native"
    if kind == "zookeeper":
        return f"zk://{request.getfixturevalue('zk_server').connect_string}/ids-{uuid.uuid4().hex[:8]}", False
    return f"hbase://{request.getfixturevalue('hbase_gateway')}/ids{uuid.uuid4().hex[:8]}", True


async def _allocator(store: MetaStore, native: bool, block: int) -> LedgerIdAllocator:
    idgen = await store.create_table(IDGEN_TABLE)
    if native:
        ids = await LedgerIdAllocator.open(store, idgen, block)
        assert ids.counters is not None
        return ids
    return LedgerIdAllocator(idgen, block)


@pytest.fixture
async def two_stores(backend: tuple[str, bool]) -> AsyncIterator[tuple[MetaStore, MetaStore, bool]]:
    uri, native = backend
    a = await open_metastore(uri)
    b = await open_metastore(uri)
    try:
        yield a, b, native
    finally:
        await a.close()
        await b.close()


async def test_hundreds_of_concurrent_ids_from_two_allocators_are_unique(
        two_stores: tuple[MetaStore, MetaStore, bool]) -> None:
    a, b, native = two_stores
    # small blocks, so that many reservations race each other (and lose compare-and-sets) on both sides
    ids_a, ids_b = await _allocator(a, native, 7), await _allocator(b, native, 7)
    got = await asyncio.wait_for(asyncio.gather(*(ids.next_id() for ids in [ids_a, ids_b] * 300)), 120)
    assert len(set(got)) == 600 and min(got) >= 1
    # callers of one allocator share its block: one reservation per 7 ids, not one per id or per caller
    assert ids_a.blocks == ids_b.blocks == 300 // 7 + 1
    assert await ids_a.reserved() == 2 * 7 * ids_a.blocks   # no block lost, none handed out twice
    # the default block: a burst of 512 takes one reservation
    big = await _allocator(a, native, 1000)
    more = await asyncio.gather(*(big.next_id() for _ in range(512)))
    assert big.blocks == 1 and len(set(more)) == 512 and min(more) > max(got)


_HOLDER = textwrap.dedent("""
    import asyncio, sys
    from bookie.metadata import LedgerMetadataManager
    from metastore import open_metastore
    async def main():
        store = await open_metastore(sys.argv[1])
        mgr = await LedgerMetadataManager.open(store, id_block_size=int(sys.argv[2]))
        got = [await mgr.new_ledger_id() for _ in range(5)]
        print(" ".join(map(str, got)), flush=True)
        await asyncio.sleep(300)     # killed here, mid-block
    asyncio.run(main())
""")


@pytest.mark.parametrize("backend", ["lmdb-native", "zookeeper"], indirect=True)
async def test_an_allocator_killed_mid_block_never_has_its_ids_reused(backend: tuple[str, bool]) -> None:
    uri, _ = backend
    store = await open_metastore(uri)
    try:
        mgr = await LedgerMetadataManager.open(store, id_block_size=100)
        before = await mgr.new_ledger_id()
        proc = child(_HOLDER, uri, "100")
        try:
            theirs = [int(x) for x in (await readline(proc, timeout=60)).split()]
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
        finally:
            reap(proc)
        assert len(set(theirs)) == 5 and before not in theirs
        # this allocator's own block goes on; then new blocks, and a new process's, pass the dead one's
        mine = [await mgr.new_ledger_id() for _ in range(250)]
        again = await LedgerMetadataManager.open(store, id_block_size=100)
        fresh = [await again.new_ledger_id() for _ in range(50)]
        assert not set(theirs) & set(mine + fresh)
        assert len(set(mine + fresh + [before])) == 301
        assert min(fresh) > max(theirs)
    finally:
        await store.close()


async def test_native_counter_takes_over_from_the_record_of_older_clients(tmp_path: Path) -> None:
    store = await open_metastore(f"lmdb://{tmp_path / 'meta'}")
    try:
        idgen = await store.create_table(IDGEN_TABLE)
        await idgen.put(IDGEN_KEY, Value({"next": b"57"}), Version.NEW)   # ids 1..56 taken one at a time

        def old_client_bump(cur: object) -> Value:   # what an older client does for each ledger
            n = int(cur.value["next"])  # type: ignore[attr-defined]
            return Value({"next": str(n + 1).encode()})

        ids = await LedgerIdAllocator.open(store, idgen, 10)
        first = await ids.next_id()
        assert first >= 57
        rec = await idgen.get(IDGEN_KEY)
        assert rec.value["next"] == str(LEGACY_FENCE).encode() and rec.value["floor"] == b"57"
        # an older client still sharing the store takes ids far above the counter's
        written = await update_record(idgen, IDGEN_KEY, old_client_bump)
        assert written is not None and int(written.value["next"]) - 1 == LEGACY_FENCE
        # a second new allocator finds the record fenced and starts past both
        other = await LedgerIdAllocator.open(store, idgen, 10)
        assert await other.next_id() > first
        assert await ids.reserved() >= 76
    finally:
        await store.close()


async def test_a_conflicting_block_reservation_retries_instead_of_failing(tmp_path: Path) -> None:
    """More racing reservations than ``metastore.cas.DEFAULT_ATTEMPTS``: every id is still handed out."""
    uri = f"lmdb://{tmp_path / 'meta'}"
    stores = [await open_metastore(uri) for _ in range(6)]
    try:
        allocators = [await _allocator(s, False, 1) for s in stores for _ in range(12)]
        got = await asyncio.wait_for(asyncio.gather(*(a.next_id() for a in allocators)), 120)
        assert sorted(got) == list(range(1, 73))
    finally:
        for s in stores:
            await s.close()


async def test_many_concurrent_ledger_creations_from_two_clients(tmp_path: Path) -> None:
    async with cluster_and_client(tmp_path) as (cluster, bk):
        other = await BookKeeper.connect(cluster.metastore_uri, conf={**FAST_CLIENT, "ledger_id_block_size": "10"})
        try:
            assert other.ledgers.ids.block_size == 10
            results = await asyncio.wait_for(asyncio.gather(
                *(c.create_ledger(3, 2, 2) for c in [bk, other] * 200), return_exceptions=True), 120)
            failures = [r for r in results if isinstance(r, BaseException)]
            assert not failures, failures[:3]
            ids = [h.ledger_id for h in results if not isinstance(h, BaseException)]
            assert len(set(ids)) == 400
            assert bk.ledgers.ids.blocks == 1 and other.ledgers.ids.blocks == 20
            assert await bk.ledgers.ledger_ids() >= set(ids)
        finally:
            await other.close()
