"""Explicit LAC and long-poll LAC reads through the ledger client, against real bookie processes.

Two clients share one cluster: ``tailing`` writes with a short
``explicit_lac_interval`` (100 ms), ``piggyback_only`` with explicit LAC off
(the control: only the next add tells the bookies about the last one).
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from bookie import protocol
from bookie.client import BookKeeper
from tests.bookie.clusterutil import FAST_CLIENT, wait_for
from tools.cluster import LocalCluster

INTERVAL_MS = 100
PER_LEDGER = 2  # long polls one connection may park per ledger on each bookie
WAIT = 10.0

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(120)]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(bookies=3, hubs=0, data_dir=tmp_path_factory.mktemp("lac"),
                            conf_overrides={"session_timeout": "1000", "gc_wait_time": "600000",
                                            "max_long_poll_reads_per_ledger": str(PER_LEDGER)}) as c:
        yield c


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tailing(cluster: LocalCluster) -> AsyncIterator[BookKeeper]:
    bk = await BookKeeper.connect(cluster.metastore_uri,
                                  conf={**FAST_CLIENT, "explicit_lac_interval": str(INTERVAL_MS)})
    yield bk
    await bk.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def piggyback_only(cluster: LocalCluster) -> AsyncIterator[BookKeeper]:
    bk = await BookKeeper.connect(cluster.metastore_uri, conf={**FAST_CLIENT, "explicit_lac_interval": "0"})
    yield bk
    await bk.close()


async def test_idle_open_ledger_last_entry_readable_within_two_intervals(tailing: BookKeeper) -> None:
    lh = await tailing.create_ledger(3, 2, 2, password=b"pw")
    await lh.add_entries([b"e0", b"e1", b"e2", b"e3"])
    started = time.monotonic()
    assert await lh.add_entry(b"last") == 4
    rh = await tailing.open_ledger_no_recovery(lh.ledger_id, password=b"pw")
    assert rh.last_add_confirmed in (3, 4)  # 4 once the explicit LAC arrived
    lac = await rh.wait_last_add_confirmed(after=3, timeout=WAIT)
    elapsed = time.monotonic() - started
    assert lac == 4 and rh.last_add_confirmed == 4
    assert elapsed < 2 * INTERVAL_MS / 1000, f"explicit LAC took {elapsed:.3f} s"
    assert [e.data async for e in rh.read(4, 4)] == [b"last"]
    assert await rh.read_last_add_confirmed() == 4   # a plain read serves the explicit LAC too
    await rh.close()
    await lh.close()


async def test_without_explicit_lac_the_last_entry_stays_unconfirmed(piggyback_only: BookKeeper) -> None:
    lh = await piggyback_only.create_ledger(3, 2, 2)
    for data in (b"a", b"b", b"c"):  # one at a time: each add carries the LAC of the one before
        await lh.add_entry(data)
    rh = await piggyback_only.open_ledger_no_recovery(lh.ledger_id)
    assert rh.last_add_confirmed == 1
    assert rh.last_entry_seen == 2             # the bookies hold entry 2, not known confirmed
    started = time.monotonic()
    lac = await rh.wait_last_add_confirmed(after=1, timeout=3 * INTERVAL_MS / 1000)
    elapsed = time.monotonic() - started
    assert lac == 1                            # the timeout ended the wait, no exception
    assert 0.29 <= elapsed < 3.0
    await lh.close()


async def test_long_poll_returns_as_soon_as_a_new_add_lands(piggyback_only: BookKeeper) -> None:
    lh = await piggyback_only.create_ledger(3, 2, 2)
    for data in (b"a", b"b"):
        await lh.add_entry(data)
    rh = await piggyback_only.open_ledger_no_recovery(lh.ledger_id)
    assert rh.last_add_confirmed == 0
    waiting = asyncio.create_task(rh.wait_last_add_confirmed(after=0, timeout=60))
    await lh.add_entry(b"c")                  # carries LAC 1: the bookies' LAC passes 0
    started = time.monotonic()
    lac = await asyncio.wait_for(waiting, WAIT)
    assert lac == 1 and rh.last_add_confirmed == 1
    assert time.monotonic() - started < 5.0   # far from the 60 s timeout
    assert [e.data async for e in rh.read(0, 1)] == [b"a", b"b"]
    await lh.close()


async def test_wait_returns_at_once_when_already_past_or_closed(tailing: BookKeeper) -> None:
    lh = await tailing.create_ledger(3, 2, 2)
    await lh.add_entries([b"a", b"b", b"c"])
    started = time.monotonic()
    assert await lh.wait_last_add_confirmed(after=1, timeout=WAIT) == 2   # the writer's own LAC
    await lh.close()
    rh = await tailing.open_ledger_no_recovery(lh.ledger_id)
    assert await rh.wait_last_add_confirmed(after=5, timeout=WAIT) == 2   # closed: its last entry
    assert time.monotonic() - started < WAIT / 2


async def test_explicit_lac_stops_when_the_writer_closes(tailing: BookKeeper, cluster: LocalCluster) -> None:
    lh = await tailing.create_ledger(3, 3, 3)
    for data in (b"a", b"b"):
        await lh.add_entry(data)
    await lh.close()
    conn = await tailing.pool.get(cluster.bookie_addresses[0])
    now = await conn.request(protocol.read_lac_request(conn.next_txn_id(), lh.ledger_id), WAIT)
    assert now.lac in (0, 1)   # 1 only if the interval passed before the close
    # a long poll on the bookie over three intervals: no WRITE_LAC arrives after the close
    started = time.monotonic()
    later = await conn.request(protocol.read_lac_request(conn.next_txn_id(), lh.ledger_id, previous_lac=now.lac,
                                                         timeout_ms=3 * INTERVAL_MS), WAIT)
    assert (later.status, later.lac) == (protocol.OK, now.lac)
    assert time.monotonic() - started >= 0.29


async def test_waiting_past_anything_written_returns_the_known_lac_at_the_timeout(tailing: BookKeeper) -> None:
    lh = await tailing.create_ledger(3, 2, 2)
    await lh.add_entries([b"a", b"b"])
    rh = await tailing.open_ledger_no_recovery(lh.ledger_id)
    started = time.monotonic()
    lac = await rh.wait_last_add_confirmed(after=5, timeout=0.5)
    assert time.monotonic() - started >= 0.49
    assert lac == 1 and rh.last_add_confirmed == 1   # the explicit LAC came; nothing passes 5
    await lh.close()


async def _answered(cluster: LocalCluster, op: str, status: str) -> int:
    """Requests of ``op`` answered with ``status`` so far, over every bookie (their /metrics)."""
    sample = f'bookie_requests_total{{op="{op}",status="{status}"}}'

    def fetch() -> int:
        total = 0
        for url in cluster.stats_urls:
            with urllib.request.urlopen(url, timeout=WAIT) as resp:
                text = resp.read().decode()
            total += sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
                         if line.startswith(sample))
        return total
    return await asyncio.to_thread(fetch)


async def _refusals(cluster: LocalCluster) -> int:
    return await _answered(cluster, "READ_LAC", "TOO_MANY_REQUESTS")


async def test_an_idle_writer_sends_its_lac_once_to_the_write_set(tailing: BookKeeper,
                                                                  cluster: LocalCluster) -> None:
    before = await _answered(cluster, "WRITE_LAC", "OK")
    lh = await tailing.create_ledger(3, 2, 2)
    await lh.add_entries([b"a", b"b", b"c"])   # pipelined: each carries LAC -1
    rh = await tailing.open_ledger_no_recovery(lh.ledger_id)
    assert await rh.wait_last_add_confirmed(after=1, timeout=WAIT) == 2
    # five more intervals of idleness (a long poll that must time out: nothing passes 2)
    started = time.monotonic()
    assert await rh.wait_last_add_confirmed(after=2, timeout=5 * INTERVAL_MS / 1000) == 2
    assert time.monotonic() - started >= 0.49
    assert await _answered(cluster, "WRITE_LAC", "OK") - before == 2   # W bookies, one WRITE_LAC each
    await lh.close()


async def test_the_lacs_of_many_idle_ledgers_leave_together(tailing: BookKeeper, cluster: LocalCluster) -> None:
    """Writers that went idle about together (a hub's quiet topics) send their explicit LACs on the same
    tick: one WRITE_LAC_MULTI per bookie rather than one WRITE_LAC per ledger and bookie."""
    n = 8
    singles = await _answered(cluster, "WRITE_LAC", "OK")
    multis = await _answered(cluster, "WRITE_LAC_MULTI", "OK")
    ledgers = await asyncio.gather(*(tailing.create_ledger(3, 2, 2, password=b"many") for _ in range(n)))
    await asyncio.gather(*(lh.add_entry(b"only") for lh in ledgers))   # entry 0 each, carrying LAC -1
    for lh in ledgers:   # each one's entry 0 becomes visible through its explicit LAC
        rh = await tailing.open_ledger_no_recovery(lh.ledger_id, password=b"many")
        assert await rh.wait_last_add_confirmed(after=-1, timeout=WAIT) == 0
        await rh.close()
    sent_multi = await _answered(cluster, "WRITE_LAC_MULTI", "OK") - multis
    sent_single = await _answered(cluster, "WRITE_LAC", "OK") - singles
    assert sent_multi >= 1
    assert sent_multi + sent_single < 2 * n, (sent_multi, sent_single)   # one per ledger and bookie before
    for lh in ledgers:
        await lh.close()


async def test_waits_over_the_bookies_limit_retry_and_still_return_on_the_next_add(
        piggyback_only: BookKeeper, cluster: LocalCluster) -> None:
    assert len(cluster.stats_urls) == 3
    lh = await piggyback_only.create_ledger(3, 2, 2)
    for data in (b"a", b"b"):
        await lh.add_entry(data)
    readers = [await piggyback_only.open_ledger_no_recovery(lh.ledger_id) for _ in range(PER_LEDGER + 1)]
    before = await _refusals(cluster)
    # one client, one connection per bookie: one wait is refused (TOO_MANY_REQUESTS) by every bookie
    # and retries after a back-off; none raises
    waits = [asyncio.create_task(rh.wait_last_add_confirmed(after=0, timeout=60)) for rh in readers]

    async def every_bookie_refused_one() -> bool:
        return await _refusals(cluster) - before >= 3

    await wait_for(every_bookie_refused_one, timeout=WAIT)
    assert not any(w.done() for w in waits)
    await lh.add_entry(b"c")
    assert await asyncio.wait_for(asyncio.gather(*waits), WAIT) == [1] * (PER_LEDGER + 1)
    await lh.close()
