"""The tail of delivery: published runs cached whole, hits taken without awaiting, no read-back of the tail."""

from __future__ import annotations

import asyncio

from hub.delivery import _YIELD_EVERY, Delivery
from hub.message import Message
from hub.readahead import ReadAheadCache
from tests.hub.test_readahead import TIMEOUT, Conf, FakeLedgers, msg, read, settle


async def test_a_subscriber_at_the_tail_is_served_from_publishes_not_ledger_reads() -> None:
    persisted = 5
    ledgers = FakeLedgers({b"t": 5})
    cache = ReadAheadCache(Conf(readahead_count=4), ledgers, last_seq=lambda topic: persisted)
    for seq in range(1, 6):
        await read(cache, b"t", seq)
    await settle(cache)
    scans = cache.stats()["scans"]
    persisted = 45
    for seq in range(6, 46):          # one persisted batch of 40, ten times the read-ahead count
        cache.on_published(b"t", msg(seq))
    for seq in range(6, 46):
        got = cache.cached(b"t", seq)
        assert got is not None and got.seq_id == seq
    await settle(cache)
    assert cache.stats()["scans"] == scans          # nothing read back from the ledgers
    assert cache.cached(b"t", 46) is None           # not published: no hit, and no scan past the end
    await settle(cache)
    assert cache.stats()["scans"] == scans and not cache._topics[b"t"].stubs
    await cache.close()


async def test_a_long_run_of_hits_is_delivered_in_order_and_lets_other_tasks_run() -> None:
    n = 5 * _YIELD_EVERY
    ledgers = FakeLedgers({b"t": n})
    cache = ReadAheadCache(Conf(readahead_count=n), ledgers, last_seq=lambda topic: n)
    await read(cache, b"t", 1)
    await settle(cache)                     # 1..n cached
    sent: list[int] = []
    ticks: list[int] = []
    done = asyncio.Event()

    def send(topic: bytes, subscriber: bytes, m: Message) -> None:
        sent.append(m.seq_id)
        if m.seq_id == n:
            done.set()

    async def ticker() -> None:
        while not done.is_set():
            ticks.append(len(sent))
            await asyncio.sleep(0)

    writable = asyncio.Event()
    writable.set()
    d = Delivery(b"t", b"s", 1, cache=cache, last_seq=lambda: n, send=send, writable=writable, window=0)
    tick = asyncio.create_task(ticker())
    d.start()
    await asyncio.wait_for(done.wait(), TIMEOUT)
    await d.stop()
    await tick
    assert sent == list(range(2, n + 1))
    assert any(0 < t < n - 1 for t in ticks)      # the other task ran while delivery was under way
    await cache.close()
