"""The tail of delivery: published runs cached whole, hits taken without awaiting, no read-back of the tail."""

from __future__ import annotations

import asyncio

from hub.delivery import _YIELD_EVERY, BATCH_BYTES, Delivery
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

    def send(topic: bytes, subscriber: bytes, messages: list[Message]) -> None:
        assert len(messages) == 1                 # batch=1 (the default): one message at a time
        sent.append(messages[0].seq_id)
        if messages[0].seq_id == n:
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


async def test_a_run_of_hits_goes_out_in_batches_that_hold_only_what_was_ready() -> None:
    """batch=10: a cached run leaves 10 at a time; the window and the end of what is persisted cut a batch
    short (sent before the delivery waits, so nothing is held back); order and the window hold."""
    n = 95
    persisted = 45
    ledgers = FakeLedgers({b"t": n})
    cache = ReadAheadCache(Conf(readahead_count=n), ledgers, last_seq=lambda topic: n)
    await read(cache, b"t", 1)
    await settle(cache)                     # 1..n cached
    batches: list[list[int]] = []
    arrived = asyncio.Event()

    def send(topic: bytes, subscriber: bytes, messages: list[Message]) -> None:
        batches.append([m.seq_id for m in messages])
        arrived.set()

    async def sent_through(seq: int) -> None:
        while not batches or batches[-1][-1] < seq:
            arrived.clear()
            await asyncio.wait_for(arrived.wait(), TIMEOUT)

    writable = asyncio.Event()
    writable.set()
    d = Delivery(b"t", b"s", 1, cache=cache, last_seq=lambda: persisted, send=send, writable=writable,
                 window=30, batch=10)
    d.start()
    await sent_through(31)                  # the window of 30 stops it after 31
    assert batches == [list(range(2, 12)), list(range(12, 22)), list(range(22, 32))]
    d.consumed_up_to(26)                    # 25 more may go; 45 is the last persisted
    await sent_through(45)
    assert batches[3:] == [list(range(32, 42)), [42, 43, 44, 45]]
    persisted = n
    d.wake()                                # published: the rest, still bounded by the window
    await sent_through(56)
    assert batches[5:] == [list(range(46, 56)), [56]]
    await d.stop()
    await cache.close()


async def test_a_batch_stays_near_batch_bytes_and_a_large_message_goes_alone() -> None:
    ledgers = FakeLedgers({b"t": 6})
    big = BATCH_BYTES // 2
    ledgers.topics[b"t"] = [msg(seq, size) for seq, size in
                            zip(range(1, 7), [10, big, big, 10, BATCH_BYTES * 2, 10], strict=True)]
    cache = ReadAheadCache(Conf(readahead_count=6), ledgers, last_seq=lambda topic: 6)
    await read(cache, b"t", 1)
    await settle(cache)                     # 1..6 cached
    batches: list[list[int]] = []
    done = asyncio.Event()

    def send(topic: bytes, subscriber: bytes, messages: list[Message]) -> None:
        batches.append([m.seq_id for m in messages])
        if messages[-1].seq_id == 6:
            done.set()

    writable = asyncio.Event()
    writable.set()
    d = Delivery(b"t", b"s", 0, cache=cache, last_seq=lambda: 6, send=send, writable=writable, window=0,
                 batch=100)
    d.start()
    await asyncio.wait_for(done.wait(), TIMEOUT)
    await d.stop()
    assert batches == [[1, 2], [3, 4], [5], [6]]
    await cache.close()
