"""The tail of delivery: published runs cached whole, hits taken without awaiting, no read-back of the tail."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

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


async def _batches_sent(sizes: list[int], window: int, batch: int, persisted: int, consumes: list[int],
                        fast: bool) -> list[list[int]]:
    """The batches a Delivery sends of cached messages 1..len(sizes) (``sizes``: body bytes), persisted up to
    ``persisted`` then to the end, consuming at each of ``consumes`` once delivery has stopped at its window."""
    n = len(sizes)
    ledgers = FakeLedgers({b"t": n})
    ledgers.topics[b"t"] = [msg(seq, size) for seq, size in enumerate(sizes, start=1)]
    cache = ReadAheadCache(Conf(readahead_count=n), ledgers, last_seq=lambda topic: n)
    await read(cache, b"t", 1)
    await settle(cache)                     # 1..n cached
    batches: list[list[int]] = []
    arrived = asyncio.Event()
    last = persisted

    def send(topic: bytes, subscriber: bytes, messages: list[Message]) -> None:
        batches.append([m.seq_id for m in messages])
        arrived.set()

    writable = asyncio.Event()
    writable.set()
    d = Delivery(b"t", b"s", 0, cache=cache, last_seq=lambda: last, send=send, writable=writable,
                 window=window, batch=batch)
    if not fast:
        d._take_hits = lambda batch, run, size: (run, size)   # type: ignore[method-assign]
    consumed = 0

    async def sent_through() -> None:
        upto = min(last, consumed + window) if window else last
        while upto and (not batches or batches[-1][-1] < upto):
            arrived.clear()
            await asyncio.wait_for(arrived.wait(), TIMEOUT)

    d.start()
    await sent_through()
    last = n
    d.wake()
    await sent_through()
    for seq in sorted(consumes):
        consumed = max(consumed, min(seq, batches[-1][-1]))
        d.consumed_up_to(consumed)
        await sent_through()
    await d.stop()
    await cache.close()
    return batches


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([10, 100, BATCH_BYTES // 3, BATCH_BYTES * 2]), min_size=1, max_size=150),
       st.integers(min_value=0, max_value=40), st.integers(min_value=1, max_value=70),
       st.integers(min_value=0, max_value=150), st.lists(st.integers(min_value=1, max_value=150), max_size=6))
def test_runs_of_hits_taken_at_once_are_sent_exactly_as_one_by_one(sizes: list[int], window: int, batch: int,
                                                                      persisted: int, consumes: list[int]) -> None:
    """``Delivery._take_hits`` (a run of cache hits on locals) changes no batch: the same messages in the same
    frames as the message-at-a-time loop, under any window, batch size, message sizes and consumes."""
    persisted = min(persisted, len(sizes))
    if window:
        consumes = [*consumes, *range(window, len(sizes) + window, window)]   # enough to deliver them all
    fast = asyncio.run(_batches_sent(sizes, window, batch, persisted, consumes, fast=True))
    slow = asyncio.run(_batches_sent(sizes, window, batch, persisted, consumes, fast=False))
    assert fast == slow
    assert [seq for b in fast for seq in b] == list(range(1, len(sizes) + 1))
    assert all(len(b) <= batch for b in fast)
