"""White-box tests of hub.readahead.ReadAheadCache, one per rule of the developers' guide."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hub.errors import ServiceDownError
from hub.message import Message, MessageId
from hub.proto import pubsub_pb2 as pb
from hub.readahead import ReadAheadCache, held_size, message_size

TIMEOUT = 5.0


@dataclass(frozen=True)
class Conf:
    readahead_enabled: bool = True
    readahead_count: int = 10
    readahead_size: int = 4 * 1024 * 1024
    cache_size: int = 1 << 30
    cache_entry_ttl: int = 0
    scan_backoff_ms: int = 10_000   # tests that need a retry set it small


def msg(seq: int, size: int = 100) -> Message:
    return Message(body=bytes([seq % 256]) * size, msg_id=MessageId(seq))


UNIT = held_size(msg(1))   # what a cached msg(seq) with seq < 128 holds (a longer seq id serializes longer)


class FakeLedgers:
    """A scanner over in-memory topics; records its calls; optionally gated or failing."""

    def __init__(self, topics: dict[bytes, int], size: int = 100) -> None:
        self.topics = {t: [msg(s, size) for s in range(1, n + 1)] for t, n in topics.items()}
        self.calls: list[tuple[bytes, int, int, int]] = []
        self.call_times: list[float] = []
        self.gate: asyncio.Event | None = None
        self.failures = 0
        self._changed = asyncio.Condition()

    async def __call__(self, topic: bytes, start: int, max_messages: int, max_bytes: int) -> list[Message]:
        async with self._changed:
            self.calls.append((topic, start, max_messages, max_bytes))
            self.call_times.append(asyncio.get_running_loop().time())
            self._changed.notify_all()
        if self.gate is not None:
            await self.gate.wait()
        if self.failures:
            self.failures -= 1
            raise OSError("bookies unreachable")
        out: list[Message] = []
        total = 0
        for m in self.topics[topic][start - 1:start - 1 + max_messages]:
            out.append(m)
            total += message_size(m)
            if total >= max_bytes:
                break
        return out

    async def wait_calls(self, n: int) -> None:
        async def until() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: len(self.calls) >= n)
        await asyncio.wait_for(until(), TIMEOUT)


async def read(cache: ReadAheadCache, topic: bytes, seq: int) -> Message:
    return await asyncio.wait_for(cache.scan_single(topic, seq), TIMEOUT)


async def settle(cache: ReadAheadCache) -> None:
    """Wait until no scan task is running (white box: the cache's own task sets)."""
    tasks = [task for t in cache._topics.values() for task in t.tasks]
    if tasks:
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), TIMEOUT)


async def read_in_order(cache: ReadAheadCache, topic: bytes, last: int) -> None:
    """Read ``topic`` from seq id 1 to ``last``, one at a time, each the message asked for; then settle."""
    for seq in range(1, last + 1):
        assert (await read(cache, topic, seq)).seq_id == seq
    await settle(cache)


async def test_miss_stubs_readahead_count_and_issues_one_scan() -> None:
    ledgers = FakeLedgers({b"t": 100})
    ledgers.gate = asyncio.Event()
    cache = ReadAheadCache(Conf(readahead_size=5000), ledgers)
    reader = asyncio.create_task(cache.scan_single(b"t", 1))
    await ledgers.wait_calls(1)
    assert ledgers.calls == [(b"t", 1, 10, 5000)]
    assert cache.stats()["stubs"] == 10 and cache.stats()["entries"] == 0
    ledgers.gate.set()
    assert (await asyncio.wait_for(reader, TIMEOUT)).seq_id == 1
    st = cache.stats()
    assert (st["stubs"], st["entries"], st["size_bytes"], st["misses"], st["hits"]) == (0, 10, 10 * UNIT, 1, 0)
    assert len(ledgers.calls) == 1
    await cache.close()


async def test_second_reader_waits_on_the_stub_without_a_second_scan() -> None:
    ledgers = FakeLedgers({b"t": 100})
    ledgers.gate = asyncio.Event()
    cache = ReadAheadCache(Conf(), ledgers)
    first = asyncio.create_task(cache.scan_single(b"t", 1))
    await ledgers.wait_calls(1)
    second = asyncio.create_task(cache.scan_single(b"t", 4))
    again = asyncio.create_task(cache.scan_single(b"t", 1))
    await asyncio.sleep(0)
    assert not second.done() and cache.stats()["stub_waits"] == 2
    ledgers.gate.set()
    got = await asyncio.wait_for(asyncio.gather(first, second, again), TIMEOUT)
    assert [m.seq_id for m in got] == [1, 4, 1]
    assert len(ledgers.calls) == 1
    await cache.close()


async def test_refill_when_a_read_passes_half_the_window() -> None:
    ledgers = FakeLedgers({b"t": 100})
    cache = ReadAheadCache(Conf(readahead_count=10), ledgers)
    assert (await read(cache, b"t", 1)).seq_id == 1
    for seq in range(2, 6):                      # up to n/2 ahead is still stubbed or cached
        assert (await read(cache, b"t", seq)).seq_id == seq
    assert len(ledgers.calls) == 1
    await read(cache, b"t", 6)                   # 6 + 5 = 11 is missing: refill 11..16
    await ledgers.wait_calls(2)
    assert ledgers.calls[1][:3] == (b"t", 11, 6)
    await settle(cache)
    for seq in range(7, 60):
        assert (await read(cache, b"t", seq)).seq_id == seq
        await settle(cache)
    st = cache.stats()
    assert st["misses"] == 1 and st["hits"] == 58
    starts = [c[1] for c in ledgers.calls]
    assert starts == sorted(starts) and starts[:3] == [1, 11, 17]
    scanned = [s for _, start, n, _ in ledgers.calls for s in range(start, start + n)]
    assert len(scanned) == len(set(scanned))     # nothing is scanned twice
    await cache.close()


async def test_no_refill_past_the_end_of_the_topic() -> None:
    ledgers = FakeLedgers({b"t": 4})
    cache = ReadAheadCache(Conf(readahead_count=10), ledgers)
    await read_in_order(cache, b"t", 4)
    assert len(ledgers.calls) == 1 and cache.stats()["stubs"] == 0
    await cache.close()


async def test_readahead_size_stops_a_scan_early_and_a_waiter_is_still_served() -> None:
    ledgers = FakeLedgers({b"t": 100}, size=100)
    cache = ReadAheadCache(Conf(readahead_size=250), ledgers)
    assert (await read(cache, b"t", 1)).seq_id == 1
    await settle(cache)
    st = cache.stats()
    # each scan stops once 250 bytes are passed (3 messages of 100); stubs past it are dropped and
    # the read of 1 refills from 4 (6 = 1 + n/2 was missing): two scans, six entries, no stubs
    assert ledgers.calls == [(b"t", 1, 10, 250), (b"t", 4, 8, 250)]
    assert (st["entries"], st["stubs"]) == (6, 0)
    assert set(cache._topics[b"t"].messages) == set(range(1, 7))
    # a reader waiting on a stub behind the byte limit is served by continuing the scan at
    # once (the backoff is 10 s: the timeout proves it is not waited for)
    ledgers.gate = asyncio.Event()
    first = asyncio.create_task(cache.scan_single(b"t", 30))     # stubs 30..39, one scan
    await ledgers.wait_calls(3)
    behind = asyncio.create_task(cache.scan_single(b"t", 35))    # waits on a stub past 250 bytes
    await asyncio.sleep(0)
    ledgers.gate.set()
    assert (await asyncio.wait_for(first, 2.0)).seq_id == 30
    assert (await asyncio.wait_for(behind, 2.0)).seq_id == 35
    assert ledgers.calls[2:4] == [(b"t", 30, 10, 250), (b"t", 33, 7, 250)]
    assert cache.stats()["scan_failures"] == 0
    await cache.close()


async def test_consumed_up_to_prunes() -> None:
    ledgers = FakeLedgers({b"t": 100})
    cache = ReadAheadCache(Conf(), ledgers)
    await read(cache, b"t", 1)
    assert cache.stats()["entries"] == 10
    cache.consumed_up_to(b"t", 4)
    st = cache.stats()
    assert (st["entries"], st["size_bytes"], st["pruned"]) == (6, 6 * UNIT, 4)
    assert (await read(cache, b"t", 5)).seq_id == 5 and cache.stats()["hits"] == 1
    cache.on_published(b"t", msg(3))                  # at or below consumed: never cached again
    assert cache.stats()["entries"] == 6
    cache.consumed_up_to(b"t", 1_000_000)             # a far jump prunes everything
    assert cache.stats()["entries"] == 0 and cache.stats()["size_bytes"] == 0
    await cache.close()


async def test_a_reader_behind_the_consumed_point_is_cached_again() -> None:
    ledgers = FakeLedgers({b"t": 100})
    cache = ReadAheadCache(Conf(), ledgers)
    cache.on_published(b"t", msg(1))                  # topic unknown to the cache yet: ignored
    await read(cache, b"t", 50)
    cache.consumed_up_to(b"t", 60)
    assert cache.stats()["entries"] == 0
    for seq in range(20, 26):                         # a subscriber attached late, at 20
        assert (await read(cache, b"t", seq)).seq_id == seq
    assert cache.stats()["misses"] == 2               # 50, then 20; 21..25 from the read-ahead
    await cache.close()


async def test_fifo_eviction_by_cache_size() -> None:
    ledgers = FakeLedgers({b"a": 100, b"b": 100}, size=100)
    cache = ReadAheadCache(Conf(cache_size=10 * UNIT), ledgers)
    assert (await read(cache, b"a", 1)).seq_id == 1
    assert cache.stats()["entries"] == 10
    assert (await read(cache, b"b", 1)).seq_id == 1  # 20 units > 10: topic a's (older) go
    st = cache.stats()
    assert (st["entries"], st["size_bytes"], st["evicted"]) == (10, 10 * UNIT, 10)
    assert set(cache._topics[b"b"].messages) == set(range(1, 11))
    assert not cache._topics[b"a"].messages
    # a message larger than the cache still reaches its waiting reader
    small = ReadAheadCache(Conf(cache_size=50, readahead_count=3), FakeLedgers({b"t": 5}, size=100))
    assert (await read(small, b"t", 2)).seq_id == 2
    assert small.stats()["entries"] == 0 and small.stats()["size_bytes"] == 0
    await cache.close()
    await small.close()


async def test_cache_entry_ttl_evicts_expired_entries_on_add() -> None:
    now = [100.0]
    ledgers = FakeLedgers({b"a": 100, b"b": 100})
    cache = ReadAheadCache(Conf(cache_entry_ttl=1000), ledgers, clock=lambda: now[0])
    await read(cache, b"a", 1)
    now[0] += 0.5
    await read(cache, b"b", 1)                       # a's are 0.5 s old: kept
    assert cache.stats()["entries"] == 20
    now[0] += 0.6
    await read(cache, b"b", 20)                      # adding: a's (1.1 s) expire, b's first 10 (0.6 s) stay
    await settle(cache)
    assert not cache._topics[b"a"].messages
    assert cache.stats()["entries"] == len(cache._topics[b"b"].messages) > 10
    assert cache.stats()["evicted"] == 10
    await cache.close()


async def test_ttl_zero_keeps_entries() -> None:
    now = [0.0]
    cache = ReadAheadCache(Conf(cache_entry_ttl=0), FakeLedgers({b"a": 100, b"b": 100}), clock=lambda: now[0])
    await read(cache, b"a", 1)
    now[0] += 1e6
    await read(cache, b"b", 1)
    assert cache.stats()["entries"] == 20
    await cache.close()


async def test_readahead_disabled_reads_one_message_per_scan() -> None:
    ledgers = FakeLedgers({b"t": 100})
    cache = ReadAheadCache(Conf(readahead_enabled=False), ledgers)
    await read_in_order(cache, b"t", 5)
    assert [c[1:3] for c in ledgers.calls] == [(s, 1) for s in range(1, 6)]
    assert cache.stats()["misses"] == 5
    await cache.close()


async def test_scanner_failure_is_retried_after_the_backoff() -> None:
    ledgers = FakeLedgers({b"t": 100})
    ledgers.failures = 2
    cache = ReadAheadCache(Conf(scan_backoff_ms=50), ledgers)
    assert (await read(cache, b"t", 3)).seq_id == 3
    assert len(ledgers.calls) == 3 and cache.stats()["scan_failures"] == 2
    gaps = [b - a for a, b in zip(ledgers.call_times, ledgers.call_times[1:], strict=False)]
    assert all(gap >= 0.045 for gap in gaps)
    await cache.close()


async def test_failed_readahead_nobody_waits_for_is_dropped() -> None:
    ledgers = FakeLedgers({b"t": 100})
    cache = ReadAheadCache(Conf(scan_backoff_ms=10_000), ledgers)
    await read(cache, b"t", 1)
    ledgers.failures = 1
    await read(cache, b"t", 6)                       # the refill scan fails: nobody waits on it
    await settle(cache)
    st = cache.stats()
    assert (st["scan_failures"], st["stubs"], len(ledgers.calls)) == (1, 0, 2)
    assert (await read(cache, b"t", 11)).seq_id == 11   # a later read scans again
    await cache.close()


async def test_on_published_fills_a_stub_and_caches_every_message_of_a_read_topic() -> None:
    ledgers = FakeLedgers({b"t": 5})
    cache = ReadAheadCache(Conf(readahead_count=4), ledgers)
    await read_in_order(cache, b"t", 5)
    cache.on_published(b"t", msg(6))                 # a reader is at 5: cached
    cache.on_published(b"t", msg(60))                # far ahead of the reader: cached too (it reads it later)
    cache.on_published(b"other", msg(1))             # a topic nobody reads: ignored
    assert 6 in cache._topics[b"t"].messages and 60 in cache._topics[b"t"].messages
    assert b"other" not in cache._topics
    hits = cache.stats()["hits"]
    assert (await read(cache, b"t", 6)).seq_id == 6
    assert cache.stats()["hits"] == hits + 1         # served from what on_published cached
    # a reader whose scan raced the publish is served by on_published, not after the 10 s backoff
    waiter = asyncio.create_task(cache.scan_single(b"t", 61))
    await ledgers.wait_calls(len(ledgers.calls) + 1)
    await asyncio.sleep(0)
    cache.on_published(b"t", msg(61))
    assert (await asyncio.wait_for(waiter, 2.0)).seq_id == 61
    await cache.close()


async def test_a_run_of_cached_messages_is_each_one_cached_up_to_the_first_not_cached() -> None:
    ledgers = FakeLedgers({b"t": 40})
    persisted = [30]
    cache = ReadAheadCache(Conf(readahead_count=4), ledgers, last_seq=lambda topic: persisted[0])
    assert (await read(cache, b"t", 1)).seq_id == 1      # the topic is read: what is published gets cached
    await settle(cache)
    for seq in range(11, 31):
        cache.on_published(b"t", msg(seq))
    hits = cache.stats()["hits"]
    calls = len(ledgers.calls)
    run = cache.cached_run(b"t", 11, 8)
    assert [m.seq_id for m in run] == list(range(11, 19))  # at most the count asked for
    assert cache.stats()["hits"] == hits + 8
    run = cache.cached_run(b"t", 19, 100)
    assert [m.seq_id for m in run] == list(range(19, 31))  # up to the last cached one
    assert [m.seq_id for m in cache.cached_run(b"t", 30, 5)] == [30]    # 31 is not cached: the run stops
    assert cache.cached_run(b"t", 31, 5) == []
    assert cache.cached_run(b"unread", 1, 5) == []
    assert len(ledgers.calls) == calls                     # at the persisted tail: nothing to read ahead
    persisted[0] = 40                                      # more persisted, not cached: the run's read-ahead
    assert [m.seq_id for m in cache.cached_run(b"t", 29, 2)] == [29, 30]
    await ledgers.wait_calls(calls + 1)
    assert ledgers.calls[-1][1] == 31                      # ... goes on from its last message
    await cache.close()


async def test_a_reader_trailing_a_burst_of_publishes_reads_it_from_memory() -> None:
    """A reader 100 behind the tail when a burst is persisted (batched publishes): the burst is not scanned."""
    ledgers = FakeLedgers({b"t": 400})            # 1..100 persisted before the reader came
    persisted = [100]
    cache = ReadAheadCache(Conf(readahead_count=10), ledgers, last_seq=lambda topic: persisted[0])
    assert (await read(cache, b"t", 1)).seq_id == 1
    for seq in range(101, 401):                   # the burst, while the reader is at 1
        persisted[0] = seq
        cache.on_published(b"t", msg(seq))
    for seq in range(2, 401):
        assert (await read(cache, b"t", seq)).seq_id == seq
    await settle(cache)
    assert max(start for _, start, _, _ in ledgers.calls) <= 100   # were scans up to 391
    await cache.close()


async def test_stats_counts() -> None:
    ledgers = FakeLedgers({b"t": 100}, size=10)
    cache = ReadAheadCache(Conf(readahead_count=4), ledgers)
    assert cache.stats() == {"size_bytes": 0, "entries": 0, "stubs": 0, "topics": 0, "hits": 0,
                             "misses": 0, "stub_waits": 0, "scans": 0, "scan_failures": 0,
                             "evicted": 0, "pruned": 0}
    await read(cache, b"t", 1)
    await read(cache, b"t", 2)
    await read(cache, b"t", 2)
    await settle(cache)
    st = cache.stats()
    assert (st["hits"], st["misses"], st["topics"]) == (2, 1, 1)
    assert st["entries"] == len(cache._topics[b"t"].messages)
    assert st["size_bytes"] == sum(held_size(m) for m in cache._topics[b"t"].messages.values())
    await cache.close()


async def test_release_topic_drops_everything_of_that_topic() -> None:
    ledgers = FakeLedgers({b"a": 100, b"b": 100}, size=10)
    cache = ReadAheadCache(Conf(), ledgers)
    await read(cache, b"a", 1)
    await read(cache, b"b", 1)
    ledgers.gate = asyncio.Event()
    waiter = asyncio.create_task(cache.scan_single(b"a", 50))
    await ledgers.wait_calls(3)
    cache.release_topic(b"a")
    with pytest.raises(ServiceDownError):
        await asyncio.wait_for(waiter, TIMEOUT)
    st = cache.stats()
    assert (st["entries"], st["size_bytes"], st["stubs"], st["topics"]) == (10, 10 * held_size(msg(1, 10)), 0, 1)
    ledgers.gate.set()
    assert (await read(cache, b"a", 1)).seq_id == 1   # usable again: a fresh scan
    cache.release_topic(b"never-read")                # unknown topic: nothing happens
    await cache.close()


async def test_close_fails_waiting_readers() -> None:
    ledgers = FakeLedgers({b"t": 100})
    ledgers.gate = asyncio.Event()
    cache = ReadAheadCache(Conf(), ledgers)
    waiters = [asyncio.create_task(cache.scan_single(b"t", s)) for s in (1, 2)]
    await ledgers.wait_calls(1)
    await asyncio.wait_for(cache.close(), TIMEOUT)
    for w in waiters:
        with pytest.raises(ServiceDownError):
            await asyncio.wait_for(w, TIMEOUT)
    with pytest.raises(ServiceDownError):
        await cache.scan_single(b"t", 1)
    assert cache.stats()["entries"] == 0
    await cache.close()                              # idempotent


async def test_cancelled_reader_leaves_the_stub_for_others() -> None:
    ledgers = FakeLedgers({b"t": 100})
    ledgers.gate = asyncio.Event()
    cache = ReadAheadCache(Conf(), ledgers)
    quitter = asyncio.create_task(cache.scan_single(b"t", 1))
    stayer = asyncio.create_task(cache.scan_single(b"t", 1))
    await ledgers.wait_calls(1)
    quitter.cancel()
    ledgers.gate.set()
    assert (await asyncio.wait_for(stayer, TIMEOUT)).seq_id == 1
    assert quitter.cancelled()
    await cache.close()


# -- property: any interleaving of reads, publishes, consumes, releases and scan failures ---------

OPS = st.one_of(
    st.tuples(st.just("read"), st.lists(st.integers(1, 60), min_size=1, max_size=4)),
    st.tuples(st.just("publish"), st.integers(1, 60)),
    st.tuples(st.just("consume"), st.integers(0, 60)),
    st.tuples(st.just("fail"), st.integers(1, 3)),
    st.tuples(st.just("release"), st.just(0)),
)


def _check_invariants(cache: ReadAheadCache) -> None:
    cached = [(t, s, m) for t in cache._topics.values() for s, m in t.messages.items()]
    stats = cache.stats()
    assert stats["entries"] == len(cached)
    # each cached message is in a run of the FIFO (eviction finds it there; one cached again after a reader
    # went back below what was consumed is in the older run too), with its held size
    in_runs = {(id(r.topic), s) for r in cache._fifo for s in r.seqs if s in r.topic.messages}
    assert in_runs == {(id(t), s) for t, s, _ in cached}
    for t in cache._topics.values():
        assert t.sizes == {s: held_size(m) for s, m in t.messages.items()}
    assert stats["size_bytes"] == sum(held_size(m) for _, _, m in cached) <= PROP_CONF.cache_size
    for t, s, m in cached:
        assert m.seq_id == s and s > t.consumed


@dataclass(frozen=True)
class _PropConf(Conf):
    readahead_count: int = 6
    readahead_size: int = 700
    cache_size: int = 8000
    scan_backoff_ms: int = 1


PROP_CONF = _PropConf()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OPS, max_size=25), sizes=st.lists(st.integers(1, 300), min_size=60, max_size=60))
def test_any_interleaving_serves_the_right_messages(ops: list[tuple[str, object]], sizes: list[int]) -> None:
    async def scenario() -> None:
        ledgers = FakeLedgers({b"t": 0})
        ledgers.topics[b"t"] = [msg(s, sizes[s - 1]) for s in range(1, 61)]
        cache = ReadAheadCache(PROP_CONF, ledgers)
        for op, arg in ops:
            if op == "read":
                assert isinstance(arg, list)
                got = await asyncio.wait_for(asyncio.gather(*(cache.scan_single(b"t", s) for s in arg)), TIMEOUT)
                assert [m.seq_id for m in got] == arg
                assert all(m == ledgers.topics[b"t"][m.seq_id - 1] for m in got)
            elif op == "publish":
                assert isinstance(arg, int)
                cache.on_published(b"t", ledgers.topics[b"t"][arg - 1])
            elif op == "consume":
                assert isinstance(arg, int)
                cache.consumed_up_to(b"t", arg)
            elif op == "fail":
                assert isinstance(arg, int)
                ledgers.failures = arg
            else:
                cache.release_topic(b"t")
            _check_invariants(cache)
        await settle(cache)
        _check_invariants(cache)
        await cache.close()

    asyncio.run(scenario())


def _as_persistence_builds_it(seq: int, size: int) -> Message:
    """A fresh message as ``TopicLog.scan`` makes one: parsed from the ledger, serialized form kept."""
    proto = pb.Message(body=b"x" * size, srcRegion=b"standalone")
    proto.msgId.localComponent = seq
    proto.header.properties.entries.add(key="type", value=b"History")
    return Message.from_proto(pb.Message.FromString(proto.SerializeToString()), keep_wire=True)


@pytest.mark.parametrize("body", [100, 10_000])
async def test_size_bytes_is_the_memory_the_cached_messages_hold(body: int) -> None:
    n = 300

    async def scanner(topic: bytes, start: int, count: int, max_bytes: int) -> list[Message]:
        return [_as_persistence_builds_it(s, body) for s in range(start, min(start + count, n + 1))]

    cache = ReadAheadCache(Conf(readahead_count=50), scanner)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for seq in range(1, n + 1):
            await read(cache, b"t", seq)
        await settle(cache)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    counted = cache.stats()["size_bytes"]
    assert cache.stats()["entries"] == n
    assert 0.8 <= held / counted <= 1.2, (held, counted)   # counting bodies only: 2.1x (10 KB), 12x (100 B)
    await cache.close()


async def test_a_synchronous_hit_reads_ahead_only_when_its_look_ahead_is_missing() -> None:
    """``cached`` (the delivery loop's hit) skips the refill while ``seq + n/2`` is cached; past it,
    and up to ``last_seq`` (persisted messages the cache was not told about), it stubs and scans."""
    ledgers = FakeLedgers({b"t": 40})
    persisted = [10]
    cache = ReadAheadCache(Conf(readahead_count=10), ledgers, last_seq=lambda topic: persisted[0])
    assert (await read(cache, b"t", 1)).seq_id == 1
    await settle(cache)
    assert [c[1:3] for c in ledgers.calls] == [(1, 10)]
    for seq in range(2, 6):                       # 2 + 5 .. 5 + 5 = 10 are cached: no refill
        assert (m := cache.cached(b"t", seq)) is not None and m.seq_id == seq
    for seq in range(6, 11):                      # at the tail: nothing persisted past 10, no scan
        assert (m := cache.cached(b"t", seq)) is not None and m.seq_id == seq
    assert len(ledgers.calls) == 1 and cache.stats()["stubs"] == 0
    persisted[0] = 30                             # persisted, not published through the cache
    assert (m := cache.cached(b"t", 10)) is not None and m.seq_id == 10   # 15 is missing: 11..20
    await ledgers.wait_calls(2)
    assert ledgers.calls[1][1:3] == (11, 10)
    await settle(cache)
    assert [cache.cached(b"t", s).seq_id for s in range(11, 16)] == list(range(11, 16))  # type: ignore[union-attr]
    await cache.close()


async def test_a_persisted_run_is_held_and_pruned_at_its_held_size() -> None:
    """on_published_many without stubs (one loop, held_size inline for plain messages) holds what held_size
    says for each message, plain or not, and consumed_up_to gives it all back."""
    from hub.frames import stamped_wires

    ledgers = FakeLedgers({b"t": 1}, size=10)
    cache = ReadAheadCache(Conf(readahead_count=1), ledgers, last_seq=lambda topic: 1)
    await read(cache, b"t", 1)
    await settle(cache)
    before = cache.stats()["size_bytes"]
    plain = [pb.Message(body=bytes([i]) * (20 + i), srcRegion=b"standalone", publishTimeMs=1_700_000_000_000)
             for i in range(6)]
    plain[2].header.properties.entries.add(key="type", value=b"History")   # not plain: held_size itself
    plain[4].key = b"k"
    run = Message.persisted_run(plain, 2, [m.SerializeToString() for m in plain])
    assert stamped_wires([plain[0].body], b"standalone", 1_700_000_000_000)[0] == plain[0].SerializeToString()
    cache.on_published_many(b"t", run)
    st = cache.stats()
    assert st["entries"] == 7
    assert st["size_bytes"] - before == sum(held_size(m) for m in run)
    assert cache.cached(b"t", 4) is run[2]
    cache.consumed_up_to(b"t", 7)
    assert (cache.stats()["size_bytes"], cache.stats()["entries"]) == (0, 0)
    await cache.close()


async def test_the_fifo_keeps_no_run_of_what_was_pruned_or_released() -> None:
    """FIFO entries are runs (one per addition): a reader's acks prune their messages, and a released topic
    drops its own, so the runs nothing is left of go too (the FIFO stays within twice the live runs)."""
    ledgers = FakeLedgers({b"t": 5, b"u": 5})
    cache = ReadAheadCache(Conf(readahead_count=4), ledgers)
    await read_in_order(cache, b"t", 5)
    await read_in_order(cache, b"u", 5)
    seq = 6
    for _ in range(1000):   # a subscriber at the tail: each entry cached, then acked
        cache.on_published_many(b"t", [msg(seq + i) for i in range(3)])
        seq += 3
        cache.consumed_up_to(b"t", seq - 1)
    assert cache.stats()["entries"] == len(cache._topics[b"u"].messages) and len(cache._fifo) < 200
    cache.on_published_many(b"u", [msg(6), msg(7)])
    cache.release_topic(b"u")
    assert cache.stats()["entries"] == 0 and cache.stats()["size_bytes"] == 0
    for _ in range(300):
        cache.on_published_many(b"t", [msg(seq)])
        seq += 1
    assert all(r.topic is cache._topics[b"t"] for r in cache._fifo) and len(cache._fifo) < 700
    await cache.close()
