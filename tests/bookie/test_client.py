"""The ledger client against real bookie processes: writes, reads, passwords, ensemble changes.

The tests that only write and read ledgers of their own share one module-scoped cluster (``shared``),
each with a client of its own (``bk``; a corrupted entry is one of its own ledger); those that kill or stop
a bookie, or need more bookies, start their own."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from bookie.client import BookKeeper
from bookie.errors import (
    DigestMismatchError,
    EntryTooLargeError,
    LedgerClosedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    UnauthorizedError,
)
from bookie.storage import corrupt_stored_entry
from tests.bookie.clusterutil import CLUSTER_CONF, FAST_CLIENT, cluster_and_client, wait_for
from tools.cluster import LocalCluster

in_shared = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(bookies=3, data_dir=tmp_path_factory.mktemp("shared"),
                            conf_overrides=CLUSTER_CONF) as cluster:
        yield cluster


@pytest_asyncio.fixture(loop_scope="module")
async def bk(shared: LocalCluster) -> AsyncIterator[BookKeeper]:
    client = await BookKeeper.connect(shared.metastore_uri, conf=FAST_CLIENT)
    yield client
    await client.close()


@in_shared
async def test_write_read_close_round_trip(shared: LocalCluster, bk: BookKeeper) -> None:
    lh = await bk.create_ledger(3, 2, 2, digest="crc32c", password=b"pw", properties={"app": b"test"})
    assert set(lh.metadata.current_ensemble) == set(shared.bookie_addresses)
    first = await lh.add_entry(b"zero")
    ids = await lh.add_entries([f"entry-{i}".encode() for i in range(1, 200)])
    assert first == 0 and ids == list(range(1, 200))
    assert lh.last_add_confirmed == 199
    got = [(e.entry_id, e.data, e.length) async for e in lh.read(0, 199)]
    assert got[0] == (0, b"zero", 4)
    assert got[1:] == [(i, f"entry-{i}".encode(), len(f"entry-{i}")) for i in range(1, 200)]
    await lh.close()
    assert lh.is_closed and lh.metadata.last_entry_id == 199
    assert lh.metadata.length == 4 + sum(len(f"entry-{i}") for i in range(1, 200))
    with pytest.raises(LedgerClosedError):
        await lh.add_entry(b"late")
    rh = await bk.open_ledger_no_recovery(lh.ledger_id, password=b"pw")
    assert rh.is_closed and rh.last_add_confirmed == 199
    assert rh.metadata.properties == {"app": b"test"}
    assert [e.data async for e in rh.read(198, 199)] == [b"entry-198", b"entry-199"]
    with pytest.raises(NoSuchEntryError):
        [e async for e in rh.read(150, 200)]


@in_shared
async def test_a_writer_keeps_its_queue_between_adds_and_drops_it_once_idle(bk: BookKeeper) -> None:
    """A busy writer keeps its queue of adds and per-bookie callbacks from one add to the next (issue 34: made
    anew for every add of a spread publish before); the add timer's look at an idle writer drops them."""
    from metastore.idle import IDLE

    lh = await bk.create_ledger(3, 2, 2, password=b"pw")
    writer = lh._writer
    assert writer is not None and writer._pending is IDLE and writer._callbacks is None
    assert await lh.add_entry(b"a") == 0
    kept, callbacks = writer._pending, writer._callbacks
    assert kept is not IDLE and not kept and callbacks is not None
    assert await lh.add_entry(b"b") == 1
    assert writer._pending is kept and writer._callbacks is callbacks
    slot = writer._timer_slot
    assert slot and writer in bk._ctx.add_timers._buckets[slot]
    bk._ctx.add_timers._fire(slot)   # the add timer's look (due add_entry_timeout after the first add), now
    assert writer._pending is IDLE and writer._callbacks is None and not writer._timer_slot
    assert await lh.add_entry(b"c") == 2 and lh.last_add_confirmed == 2
    await lh.close()
    assert [e.data async for e in lh.read(0, 2)] == [b"a", b"b", b"c"]


@in_shared
async def test_an_idle_writer_holds_no_add_timer(bk: BookKeeper) -> None:
    """Once its adds are answered, the client's wheel drops an idle writer at the add timer's look: no slot,
    no entry in the wheel, no queue (issue 34: no timer per idle topic)."""
    from metastore.idle import IDLE

    lh = await bk.create_ledger(3, 2, 2, password=b"pw")
    writer = lh._writer
    assert writer is not None and not writer._timer_slot and len(bk._ctx.add_timers) == 0
    await lh.add_entries([b"a", b"b"])
    assert writer._timer_slot and len(bk._ctx.add_timers) == 1

    async def dropped() -> bool:
        return not writer._timer_slot

    await wait_for(dropped, bk._ctx.conf.add_entry_timeout + 5)   # the look: add_entry_timeout after the adds
    assert writer._pending is IDLE and writer._callbacks is None and len(bk._ctx.add_timers) == 0
    await lh.close()


@in_shared
async def test_mac_digest_and_wrong_password(bk: BookKeeper) -> None:
    lh = await bk.create_ledger(3, 3, 2, digest="mac", password=b"secret")
    await lh.add_entries([b"a", b"b", b"c"])
    with pytest.raises(UnauthorizedError):
        await bk.open_ledger(lh.ledger_id, password=b"wrong")
    with pytest.raises(UnauthorizedError):
        await bk.open_ledger_no_recovery(lh.ledger_id, password=b"wrong")
    # the writer was not disturbed by the refused opens
    assert await lh.add_entry(b"d") == 3
    await lh.close()
    rh = await bk.open_ledger(lh.ledger_id, password=b"secret")
    assert [e.data async for e in rh.read(0, 3)] == [b"a", b"b", b"c", b"d"]


@in_shared
async def test_bad_arguments_and_missing_ledgers(bk: BookKeeper) -> None:
    with pytest.raises(ValueError):
        await bk.create_ledger(2, 3, 2)
    with pytest.raises(ValueError):
        await bk.create_ledger(3, 2, 2, digest="md5")
    with pytest.raises(NotEnoughBookiesError):
        await bk.create_ledger(5, 2, 2)
    with pytest.raises(NoSuchLedgerError):
        await bk.open_ledger(424242)
    lh = await bk.create_ledger(3, 2, 2)
    await lh.add_entry(b"x")
    await lh.close()
    await bk.delete_ledger(lh.ledger_id)
    with pytest.raises(NoSuchLedgerError):
        await bk.open_ledger_no_recovery(lh.ledger_id)
    with pytest.raises(NoSuchLedgerError):
        await bk.delete_ledger(lh.ledger_id)


@in_shared
async def test_ledger_ids_are_unique_across_clients(shared: LocalCluster, bk: BookKeeper) -> None:
    other = await BookKeeper.connect(shared.metastore_uri, conf=FAST_CLIENT)
    try:
        handles = await asyncio.gather(*(c.create_ledger(3, 2, 2) for c in [bk, other] * 5))
    finally:
        await other.close()
    ids = [h.ledger_id for h in handles]
    assert len(set(ids)) == 10


async def test_ensemble_change_when_a_bookie_dies(tmp_path: Path) -> None:
    async with cluster_and_client(tmp_path, bookies=4) as (cluster, bk):
        lh = await bk.create_ledger(3, 2, 2)
        spare = (set(cluster.bookie_addresses) - set(lh.metadata.current_ensemble)).pop()
        assert await lh.add_entries([b"before-%d" % i for i in range(50)]) == list(range(50))
        victim = lh.metadata.current_ensemble[1]
        await cluster.kill_bookie(cluster.bookie_addresses.index(victim))
        ids = await lh.add_entries([b"after-%d" % i for i in range(50)])
        assert ids == list(range(50, 100))
        assert len(lh.metadata.ensembles) == 2
        first, ensemble = lh.metadata.ensembles[1]
        # the new segment starts right after the LAC when the failure was seen: no later than the
        # first entry after the kill that the victim had to store (entries complete in order)
        victim_index = lh.metadata.ensembles[0][1].index(victim)
        blocked = next(e for e in range(50, 100) if victim_index in lh.metadata.write_set(e))
        assert 50 <= first <= blocked
        assert victim not in ensemble and spare in ensemble
        await lh.close()
        rh = await bk.open_ledger(lh.ledger_id)
        data = [e.data async for e in rh.read(0, 99)]
        assert data == [b"before-%d" % i for i in range(50)] + [b"after-%d" % i for i in range(50)]


async def test_a_silent_bookie_times_out_and_is_replaced(tmp_path: Path) -> None:
    async with cluster_and_client(tmp_path, bookies=4) as (cluster, bk):
        fast = await BookKeeper.connect(cluster.metastore_uri, conf={**FAST_CLIENT, "add_entry_timeout": "1"})
        try:
            lh = await fast.create_ledger(3, 2, 2)
            assert await lh.add_entries([b"a-%d" % i for i in range(20)]) == list(range(20))
            victim = lh.metadata.current_ensemble[0]
            pid = cluster.bookie_pid(cluster.bookie_addresses.index(victim))
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)  # connected but silent: only the add timeout can notice
            try:
                loop = asyncio.get_running_loop()
                t0 = loop.time()
                ids = await asyncio.wait_for(lh.add_entries([b"b-%d" % i for i in range(20)]), 30)
                waited = loop.time() - t0
            finally:
                os.kill(pid, signal.SIGCONT)
            assert ids == list(range(20, 40))
            assert waited >= 0.9  # one add_entry_timeout, then the ensemble change
            assert len(lh.metadata.ensembles) == 2 and victim not in lh.metadata.current_ensemble
            assert fast.failure_history[victim] >= 1
            await lh.close()
            rh = await bk.open_ledger(lh.ledger_id)
            assert [e.data async for e in rh.read(0, 39)] == [b"a-%d" % i for i in range(20)] + [
                b"b-%d" % i for i in range(20)]
        finally:
            await fast.close()


async def test_add_fails_only_when_no_replacement_exists(tmp_path: Path) -> None:
    async with cluster_and_client(tmp_path, bookies=3) as (cluster, bk):
        lh = await bk.create_ledger(3, 2, 2)
        await lh.add_entry(b"ok")
        await cluster.kill_bookie(0)
        with pytest.raises(NotEnoughBookiesError):
            await lh.add_entries([b"x"] * 5)
        with pytest.raises(NotEnoughBookiesError):
            await lh.add_entry(b"y")


@in_shared
async def test_oversized_add_is_refused_up_front_and_the_handle_stays_usable(bk: BookKeeper) -> None:
    lh = await bk.create_ledger(3, 2, 2)
    other = await bk.create_ledger(3, 2, 2)  # same bookies, same connections
    limit = bk.conf.max_entry_size
    assert await lh.add_entry(b"before") == 0
    with pytest.raises(EntryTooLargeError, match=f"6291456 bytes .* exceeds max_entry_size {limit}"):
        await lh.add_entry(b"x" * (6 * 1024 * 1024))
    with pytest.raises(EntryTooLargeError):  # a batch is checked before anything is sent
        await lh.add_entries([b"fits", b"x" * (limit + 1)])
    assert await lh.add_entry(b"after") == 1
    assert await other.add_entry(b"other") == 0
    largest = bytes(range(256)) * (limit // 256) + b"z" * (limit % 256)
    assert await lh.add_entry(largest) == 2  # the limit itself fits a bookie's frame
    assert len(lh.metadata.ensembles) == 1 and len(other.metadata.ensembles) == 1
    await lh.close()
    await other.close()
    assert lh.metadata.last_entry_id == 2 and lh.metadata.length == 6 + 5 + limit
    rh = await bk.open_ledger(lh.ledger_id)
    assert [e.data async for e in rh.read(0, 2)] == [b"before", b"after", largest]


@in_shared
async def test_corrupt_replica_falls_back_and_all_corrupt_fails(shared: LocalCluster, bk: BookKeeper) -> None:
    lh = await bk.create_ledger(3, 2, 2, password=b"p")
    await lh.add_entries([b"payload-%d" % i for i in range(10)])
    await lh.close()
    ensemble = lh.metadata.current_ensemble
    holders = [ensemble[i] for i in lh.metadata.write_set(4)]
    corrupt_stored_entry(shared.bookie_data_dir(shared.bookie_addresses.index(holders[0])), lh.ledger_id, 4)
    for _ in range(3):  # whatever replica is asked first, the good one answers
        rh = await bk.open_ledger_no_recovery(lh.ledger_id, password=b"p")
        assert (await rh.read_entry(4)).data == b"payload-4"
    assert bk.failure_history[holders[0]] >= 1
    corrupt_stored_entry(shared.bookie_data_dir(shared.bookie_addresses.index(holders[1])), lh.ledger_id, 4)
    with pytest.raises(DigestMismatchError):
        await rh.read_entry(4)
    assert (await rh.read_entry(5)).data == b"payload-5"


async def test_read_only_bookie_is_not_chosen(tmp_path: Path) -> None:
    override = tmp_path / "usage"
    override.write_text("0.10\n")
    async with cluster_and_client(tmp_path, bookies=4,
                                  overrides={"disk_check_interval": "100"}) as (cluster, bk):
        # make bookie 0 read-only through its disk-usage hook
        ro = cluster.bookie_addresses[0]
        cluster.set_bookie_conf(0, disk_usage_override_file=str(override))
        await cluster.stop_bookie(0)
        await cluster.restart_bookie(0)
        override.write_text("0.99\n")

        async def seen_read_only() -> bool:
            await bk.watcher.refresh()
            return ro in bk.watcher.readonly

        await wait_for(seen_read_only)
        for _ in range(10):
            lh = await bk.create_ledger(3, 2, 2)
            assert ro not in lh.metadata.current_ensemble
            await lh.add_entry(b"x")
        with pytest.raises(NotEnoughBookiesError):
            await bk.create_ledger(4, 2, 2)


def test_client_conf_file_lists_every_key_and_rejects_unknown(tmp_path: Path) -> None:
    from bookie.client import PLACEMENT_KEYS, ClientConf, load_client_conf
    from bookie.errors import ConfError

    shipped = Path(__file__).resolve().parents[2] / "conf" / "bk_client.conf"
    conf = load_client_conf(shipped)
    listed = {line.split("=", 1)[0] for line in shipped.read_text().splitlines()
              if line and not line.startswith("#")}
    from dataclasses import fields

    assert listed == {f.name for f in fields(ClientConf)} | PLACEMENT_KEYS
    assert ClientConf.from_mapping(conf) == ClientConf()
    bad = tmp_path / "bad.conf"
    bad.write_text("add_entry_timeout=soon\n")
    with pytest.raises(ConfError, match="add_entry_timeout"):
        load_client_conf(bad)
    bad.write_text("no_such_key=1\n")
    with pytest.raises(ConfError, match="no_such_key"):
        load_client_conf(bad)


async def test_region_aware_policy_from_conf(tmp_path: Path) -> None:
    from placement import RegionAwareEnsemblePlacementPolicy

    async with cluster_and_client(tmp_path, bookies=3) as (cluster, _):
        bk = await BookKeeper.connect(cluster.metastore_uri, conf={**FAST_CLIENT,
                                      "ensemble_placement_policy": "regionaware", "local_region": "default-region"})
        try:
            assert isinstance(bk.policy, RegionAwareEnsemblePlacementPolicy)
            lh = await bk.create_ledger(3, 2, 2)
            assert set(lh.metadata.current_ensemble) == set(cluster.bookie_addresses)
            assert await lh.add_entry(b"x") == 0
        finally:
            await bk.close()
