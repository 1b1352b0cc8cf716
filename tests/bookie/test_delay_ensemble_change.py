"""``delay_ensemble_change``: writes go on through a bookie's loss while the ack quorum holds, on real bookies."""

from __future__ import annotations

from pathlib import Path

import pytest

from bookie.client import BookKeeper
from bookie.errors import NotEnoughBookiesError
from tests.bookie.clusterutil import FAST_CLIENT, cluster_and_client, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def test_e3_w3_a2_keeps_writing_through_a_lost_bookie_and_replaces_it_once_one_exists(tmp_path: Path) -> None:
    async with cluster_and_client(tmp_path, bookies=4) as (cluster, plain):
        await cluster.stop_bookie(3)                                   # the spare comes back later
        bk = await BookKeeper.connect(cluster.metastore_uri, conf={**FAST_CLIENT, "delay_ensemble_change": "true"})
        try:
            async def three_writable() -> bool:
                for client in (bk, plain):
                    await client._ctx.watcher.refresh()
                return all(len(client._ctx.watcher.writable) == 3 for client in (bk, plain))

            await wait_for(three_writable)
            lh = await bk.create_ledger(3, 3, 2)
            strict = await plain.create_ledger(3, 3, 2)                 # the same ensemble, without the key
            assert set(strict.metadata.current_ensemble) == set(lh.metadata.current_ensemble)
            assert await lh.add_entries([b"a-%d" % i for i in range(20)]) == list(range(20))
            assert await strict.add_entries([b"a-%d" % i for i in range(5)]) == list(range(5))
            victim = lh.metadata.current_ensemble[1]
            await cluster.kill_bookie(cluster.bookie_addresses.index(victim))
            # two of three copies still make the ack quorum: adds go on, on the same ensemble
            assert await lh.add_entries([b"b-%d" % i for i in range(30)]) == list(range(20, 50))
            assert len(lh.metadata.ensembles) == 1 and lh.metadata.current_ensemble[1] == victim
            with pytest.raises(NotEnoughBookiesError):                   # without the key: no replacement, failure
                for i in range(50):   # an add may still make its quorum before the lost connection is noticed
                    await strict.add_entries([b"b-%d" % i])
            await cluster.restart_bookie(3)                               # a replacement exists: the writer takes it

            async def replaced() -> bool:
                return len(lh.metadata.ensembles) == 2

            await wait_for(replaced)
            first, ensemble = lh.metadata.ensembles[1]
            assert first == 50 and victim not in ensemble and cluster.bookie_addresses[3] in ensemble
            assert await lh.add_entries([b"c-%d" % i for i in range(10)]) == list(range(50, 60))
            await lh.close()
            rh = await plain.open_ledger(lh.ledger_id)
            data = [e.data async for e in rh.read(0, 59)]
            assert data == ([b"a-%d" % i for i in range(20)] + [b"b-%d" % i for i in range(30)]
                            + [b"c-%d" % i for i in range(10)])
        finally:
            await bk.close()


async def test_a_loss_that_leaves_a_write_set_short_of_the_ack_quorum_still_fails(tmp_path: Path) -> None:
    async with cluster_and_client(tmp_path, bookies=3) as (cluster, _):
        bk = await BookKeeper.connect(cluster.metastore_uri, conf={**FAST_CLIENT, "delay_ensemble_change": "true"})
        try:
            lh = await bk.create_ledger(3, 2, 2)          # E3 W2 A2: a lost bookie leaves two write sets one copy
            assert await lh.add_entries([b"x"] * 6) == list(range(6))
            await cluster.kill_bookie(0)
            with pytest.raises(NotEnoughBookiesError):
                await lh.add_entries([b"y"] * 6)
        finally:
            await bk.close()
