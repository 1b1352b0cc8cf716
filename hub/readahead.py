"""The read-ahead cache between delivery and the ledgers (hedwig-developers-guide.txt).

Delivery asks the cache for one message at a time; the cache answers from
memory, or puts *stubs* for the next ``readahead_count`` messages and issues
one range scan to the ledgers through the injected ``scanner``::

    async def scanner(topic: bytes, start: int, max_messages: int, max_bytes: int) -> list[Message]:
        ...   # consecutive messages from ``start`` (fewer if the topic ends or max_bytes is passed)

    cache = ReadAheadCache(conf, scanner)            # conf: readahead_enabled, readahead_count,
                                                     # readahead_size, cache_size, cache_entry_ttl,
                                                     # scan_backoff_ms (HubConf has them)
    cache = ReadAheadCache(conf, scanner, last_seq=lambda topic: persisted_last_seq(topic))
    msg = await cache.scan_single(b"topic", 42)      # hit, or wait on the stub filled by a scan
    msg = cache.cached(b"topic", 43)                 # a hit without awaiting, else None
    cache.on_published(b"topic", msg)                # a new message: fills a stub, may be cached
    cache.on_published_many(b"topic", msgs)          # the same for the messages of one persisted entry
    cache.consumed_up_to(b"topic", 40)               # every subscriber consumed 40: prune <= 40
    cache.release_topic(b"topic")                    # the hub gave the topic up
    cache.stats()    # {"size_bytes": .., "entries": .., "hits": .., "misses": .., "stubs": .., ...}
    await cache.close()

The rules, as the developers' guide states them:

* A miss puts stubs for ``seq .. seq + n - 1`` (``n`` = ``readahead_count``,
  1 when ``readahead_enabled`` is false; stopping at the first message
  already cached or stubbed) and issues ONE scan for them with the
  ``readahead_size`` byte hint. Readers of a stubbed seq wait on the stub.
* On a read (hit, or served by a stub) of ``seq`` the cache looks ``n // 2``
  ahead; when that message is neither cached nor stubbed it stubs and scans
  the missing messages up to ``seq + n``, so the next ``n`` are always on
  their way. It does not read past the last message it knows of when the
  last scan ended short (the topic's end). Given ``last_seq`` (the hub
  passes its topic log's last persisted seq id), it never stubs or scans
  past that: a subscriber at the tail gets new messages from
  ``on_published`` instead of reading back from the ledgers what was just
  written.
* ``on_published`` fills a stub at once and caches the message, as the
  guide says ("whenever a message is published, it is cached"), for every
  topic a reader has asked for. A reader that trails the publishers (a
  burst of batched publishes runs hundreds ahead of it) then reads from
  memory instead of scanning back from the ledgers what was just written;
  ``cache_size`` bounds what that holds.
* Pruning: ``consumed_up_to`` drops every message up to that seq id; when
  the bytes the cached messages hold (``held_size``: body, serialized form,
  properties, ids, objects and index) pass ``cache_size`` the oldest
  entries go first (FIFO), a run at a time (the messages one persisted
  entry or one scan added); with
  ``cache_entry_ttl`` > 0 (milliseconds) each addition first drops the
  runs older than that. Stubs take no space and are never evicted.

Failure: a scanner that raises is retried after ``scan_backoff_ms`` for as
long as a reader waits on one of its stubs (stubs nobody waits on are then
dropped). A scan that comes back short while a reader waits on a later
stub is continued from where it stopped (at once if it made progress, else
after the backoff, or sooner when ``on_published`` brings the message).
``scan_single`` raises ``ServiceDownError`` only once the cache is closed
(also for readers waiting at ``close``) or the topic is released under a
waiting reader, and ``NoTopicPersistenceInfoError`` (not retried) when the
scanner says the message was deleted (a bounded subscriber's trimmed ones).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from hub.errors import NoTopicPersistenceInfoError, ServiceDownError
from hub.message import Message
from hub.proto import pubsub_pb2 as pb

__all__ = ["ReadAheadCache", "ReadAheadConf", "Scanner", "held_size", "message_size"]

log = logging.getLogger(__name__)

Scanner = Callable[[bytes, int, int, int], Awaitable[list[Message]]]
"""``scanner(topic, start_seq_id, max_messages, max_bytes)`` -> consecutive messages from start."""


class ReadAheadConf(Protocol):
    """The configuration keys the cache reads (hub-core's ``HubConf`` has them all)."""

    @property
    def readahead_enabled(self) -> bool: ...
    @property
    def readahead_count(self) -> int: ...
    @property
    def readahead_size(self) -> int: ...
    @property
    def cache_size(self) -> int: ...
    @property
    def cache_entry_ttl(self) -> int: ...
    @property
    def scan_backoff_ms(self) -> int: ...


def message_size(message: Message) -> int:
    """A message's payload: its body plus property keys and values (the ``readahead_size`` hint's unit)."""
    return len(message.body) + sum(len(k) + len(v) for k, v in message.properties.items())


_DICT_SLOT = 3 * 8 + 8 * 2    # a dict entry (hash, key, value) with the index and growth slack of a dict
_INSTANCE_DICT = 104


def _fixed_overhead() -> int:
    """What every cached message holds besides its variable parts: the instances, their dicts, and
    the cache's own index entries ((topic, seq) -> (size, time) in the FIFO, seq -> message per topic)."""
    size = sys.getsizeof
    sample = Message.from_proto(pb.Message(body=b"", srcRegion=b"r"), keep_wire=True)
    mid = sample.msg_id
    # instance dicts share their keys: about 100 bytes each (getsizeof overstates a fresh one)
    objects = size(sample) + size(mid) + 2 * _INSTANCE_DICT + size(mid.remote)
    index = 2 * _DICT_SLOT + size((b"", 0)) + size((0, 0.0)) + size(0.0) + 2 * size(1 << 40)
    return objects + index


_FIXED = _fixed_overhead()
_BYTES = sys.getsizeof(b"")


def held_size(message: Message) -> int:
    """The bytes a cached message keeps alive, which is what ``cache_size`` bounds.

    Its objects as ``sys.getsizeof`` counts them: the body, the serialized
    form kept for delivery (``Message.wire``; one more copy of the body),
    the properties, the ids, the instances, plus the cache's index entry.
    (Counting the body alone let a hub hold about 2.8 times ``cache_size``.)
    Builds ``message.wire`` if it is not built yet: a cached message is
    there to be delivered, which needs it anyway.
    """
    size = sys.getsizeof
    # a bytes object's size is its length plus a fixed header (len: cheaper than getsizeof)
    n = _FIXED + 2 * _BYTES + len(message.wire) + len(message.body) + size(message.src_region)
    if message.message_type:
        n += size(message.message_type)
    props = message.properties
    if props:
        n += size(props) + sum(size(k) + size(v) for k, v in props.items())
    remote = message.msg_id.remote
    if remote:
        n += size(remote) + sum(size(r) + size(c) for r, c in remote.items())
    return n


class _Stub:
    """A message on its way: readers wait on ``future``; ``waiters`` counts them."""

    __slots__ = ("future", "waiters")

    def __init__(self, future: asyncio.Future[Message]) -> None:
        self.future = future
        self.waiters = 0


class _Topic:
    """Everything the cache holds for one topic."""

    __slots__ = ("consumed", "known_last", "max_read", "maybe_more", "messages", "name", "sizes", "stubs",
                 "tasks")

    def __init__(self, name: bytes) -> None:
        self.name = name
        self.messages: dict[int, Message] = {}
        self.sizes: dict[int, int] = {}    # each cached message's held_size, by seq id
        self.stubs: dict[int, _Stub] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.known_last = 0      # the highest seq id known to exist
        self.maybe_more = True   # False after a scan that ended short (the topic's end, probably)
        self.max_read = 0        # the highest seq id a reader asked for
        self.consumed = 0        # everyone consumed up to here: never cache at or below it

    def present(self, seq: int) -> bool:
        return seq in self.messages or seq in self.stubs


_COMPACT_FROM = 64


class _Run:
    """The messages one addition cached (``_cache``, ``_cache_run``): FIFO eviction and the TTL go a run at a
    time, not a message at a time (issue 32: a FIFO entry per message cost about 0.3 us a message)."""

    __slots__ = ("at", "last", "seqs", "topic")

    def __init__(self, topic: _Topic, seqs: list[int], at: float) -> None:
        # seqs ascend; one pruned, then cached again (a late reader), is in two runs: the first eviction takes it
        self.topic, self.seqs, self.last, self.at = topic, seqs, seqs[-1], at


class ReadAheadCache:
    """Messages of the owned topics, read ahead of the subscribers (see the module docstring)."""

    def __init__(self, conf: ReadAheadConf, scanner: Scanner, *,
                 clock: Callable[[], float] = time.monotonic,
                 last_seq: Callable[[bytes], int] | None = None) -> None:
        self._scanner = scanner
        self._last_seq = last_seq
        self._clock = clock
        self._n = max(1, int(conf.readahead_count)) if conf.readahead_enabled else 1
        self._half = self._n // 2   # ``_refill``'s look-ahead (0 when n is 1: ``_refill`` does nothing then)
        self._readahead_size = max(1, int(conf.readahead_size))
        self._cache_size = int(conf.cache_size)
        self._ttl = float(conf.cache_entry_ttl) / 1000.0
        self._backoff = max(0.0, float(conf.scan_backoff_ms) / 1000.0)
        self._topics: dict[bytes, _Topic] = {}
        self._fifo: deque[_Run] = deque()
        self._compact_at = _COMPACT_FROM   # FIFO runs from which the ones nothing is left of are dropped
        self._size = 0
        self._entries = 0
        self._closed = False
        self._counters = {"hits": 0, "misses": 0, "stub_waits": 0, "scans": 0, "scan_failures": 0,
                          "evicted": 0, "pruned": 0}

    # -- reading -------------------------------------------------------------------------------

    async def scan_single(self, topic: bytes, seq_id: int) -> Message:
        """The message ``seq_id`` of ``topic``: from the cache or through a stub and a range scan.

        The caller guarantees ``seq_id`` was published. Raises ``ServiceDownError``
        when the cache is (or gets) closed or the topic is released meanwhile.
        """
        if self._closed:
            raise ServiceDownError("read-ahead cache is closed")
        if seq_id < 1:
            raise ValueError(f"seq ids start at 1, not {seq_id}")
        t = self._topics.get(topic)
        if t is None:
            t = self._topics[topic] = _Topic(topic)
        t.max_read = max(t.max_read, seq_id)
        t.known_last = max(t.known_last, seq_id)
        if seq_id <= t.consumed:
            t.consumed = seq_id - 1   # a reader is back here (a late attach): cache from here again
        msg = self._hit(t, seq_id)
        if msg is not None:
            return msg
        self._counters["misses"] += 1
        stub = t.stubs.get(seq_id)
        if stub is None:
            n = self._n
            if self._last_seq is not None:
                n = max(1, min(n, self._last_seq(topic) - seq_id + 1))
            self._start_scan(t, seq_id, n)
            stub = t.stubs[seq_id]
        else:
            self._counters["stub_waits"] += 1
        stub.waiters += 1
        try:
            msg = await asyncio.shield(stub.future)
        finally:
            stub.waiters -= 1
        self._refill(t, seq_id)
        return msg

    def cached(self, topic: bytes, seq_id: int) -> Message | None:
        """The message ``seq_id`` when the cache holds it (a hit, read-ahead kept going), else None.

        The synchronous half of ``scan_single``: a reader at a cached message
        takes it without a coroutine; on None it awaits ``scan_single``.
        """
        t = self._topics.get(topic)
        if t is None or self._closed:
            return None
        if seq_id > t.max_read and seq_id in t.messages:
            t.max_read = seq_id
        return self._hit(t, seq_id)

    def cached_run(self, topic: bytes, seq_id: int, count: int) -> list[Message]:
        """The cached messages ``seq_id``, ``seq_id + 1``, ... (at most ``count``), up to the first one not
        cached: ``cached`` of each, without a call per message (a dispatcher's run of new messages). The
        hits are counted; the read-ahead is kept going from the run's last message, whose look-ahead
        covers every earlier one's."""
        t = self._topics.get(topic)
        if t is None or self._closed:
            return []
        get = t.messages.get
        run = []
        for seq in range(seq_id, seq_id + count):
            msg = get(seq)
            if msg is None:
                break
            run.append(msg)
        if run:
            last = seq_id + len(run) - 1
            if last > t.max_read:
                t.max_read = last
            self._counters["hits"] += len(run)
            if last + self._half not in t.messages:
                self._refill(t, last)
        return run

    def _hit(self, t: _Topic, seq_id: int) -> Message | None:
        """The cached message ``seq_id`` (counted, read-ahead kept going), else None."""
        messages = t.messages
        msg = messages.get(seq_id)
        if msg is not None:
            self._counters["hits"] += 1
            # ``_refill`` returns at once when its probe is cached: skip its call then (every hit of
            # every subscriber ran it; a cached message is persisted, so ``last_seq`` cannot lower it)
            if seq_id + self._half not in messages:
                self._refill(t, seq_id)
        return msg

    def on_published(self, topic: bytes, message: Message) -> None:
        """A message was persisted: fill its stub and cache it (for a topic that has a reader)."""
        self.on_published_many(topic, [message])

    def on_published_many(self, topic: bytes, messages: list[Message]) -> None:
        """``on_published`` of each of ``messages`` (one persisted entry, in seq order), in one pass."""
        t = self._topics.get(topic)
        if t is None or self._closed:
            return
        stubs = t.stubs
        if not stubs and self._ttl <= 0:
            self._cache_run(t, messages)
            return
        entries: list[tuple[int, Message]] = []
        append = entries.append
        for message in messages:
            seq = message.msg_id.local
            if seq < 1:
                continue
            if stubs:
                stub = stubs.pop(seq, None)
                if stub is not None:
                    self._fulfil(stub, message)
            append((seq, message))
        if entries:
            self._cache(t, entries)   # known_last moves there

    def consumed_up_to(self, topic: bytes, seq_id: int) -> None:
        """Every subscriber consumed ``topic`` up to ``seq_id``: prune those messages."""
        t = self._topics.get(topic)
        if t is None or seq_id <= t.consumed:
            return
        previous, t.consumed = t.consumed, seq_id
        messages = t.messages
        if seq_id - previous <= len(messages):
            gone: Iterable[int] = range(previous + 1, seq_id + 1)
        else:
            gone = [s for s in messages if s <= seq_id]
        sizes, freed, pruned = t.sizes, 0, 0
        for s in gone:                   # a consumer's acks prune a run at a time (its _Run goes by _compact)
            if messages.pop(s, None) is not None:
                freed += sizes.pop(s)
                pruned += 1
        if pruned:
            self._size -= freed
            self._entries -= pruned
            self._counters["pruned"] += pruned
        for s in [s for s, stub in t.stubs.items() if s <= seq_id and not stub.waiters]:
            self._drop_stub(t, s)

    def release_topic(self, topic: bytes) -> None:
        """Forget ``topic``: its messages, stubs and scans (waiting readers get ``ServiceDownError``)."""
        t = self._topics.pop(topic, None)
        if t is not None:
            self._forget(t, "topic released")

    def stats(self) -> dict[str, int]:
        """Counters and gauges: size_bytes, entries, hits, misses, stubs, stub_waits, scans, ..."""
        return {"size_bytes": self._size, "entries": self._entries,
                "stubs": sum(len(t.stubs) for t in self._topics.values()),
                "topics": len(self._topics), **self._counters}

    async def close(self) -> None:
        """Stop every scan; readers still waiting get ``ServiceDownError``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        tasks = [task for t in self._topics.values() for task in t.tasks]
        for t in self._topics.values():
            self._forget(t, "read-ahead cache is closed")
        self._topics.clear()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- scans ---------------------------------------------------------------------------------

    def _refill(self, t: _Topic, seq: int) -> None:
        """Keep the next ``n`` messages after ``seq`` on their way (look ``n // 2`` ahead)."""
        if self._n < 2:
            return
        probe = seq + self._half
        last = self._last_seq(t.name) if self._last_seq is not None else None
        if last is not None and probe > last:
            probe = last   # never read ahead of what is persisted: on_published brings it
            if probe <= seq:
                return
        # the usual answer (the probe is there) first; the guards only matter before a scan
        if probe in t.messages or probe in t.stubs or (probe > t.known_last and not t.maybe_more):
            return
        if self._closed or self._topics.get(t.name) is not t:
            return
        start = seq + 1
        while t.present(start):
            start += 1
        end = seq + self._n if t.maybe_more else min(seq + self._n, t.known_last)
        if last is not None:
            end = min(end, last)
        if start <= end:
            self._start_scan(t, start, end - start + 1)

    def _start_scan(self, t: _Topic, start: int, count: int) -> None:
        """Stub ``start ..`` (up to ``count``, stopping at a present one) and scan them in a task."""
        loop = asyncio.get_running_loop()
        n = 0
        while n < count and not t.present(start + n):
            t.stubs[start + n] = _Stub(loop.create_future())
            n += 1
        if n:
            task = loop.create_task(self._scan(t, start, n), name=f"readahead {t.name!r}@{start}")
            t.tasks.add(task)
            task.add_done_callback(t.tasks.discard)

    def _live(self, t: _Topic) -> bool:
        return not self._closed and self._topics.get(t.name) is t

    def _pending(self, t: _Topic, start: int, count: int) -> tuple[int, int]:
        """The sub-range of ``[start, start+count)`` from its first seq still stubbed."""
        for s in range(start, start + count):
            if s in t.stubs:
                return s, start + count - s
        return start, 0

    def _waited(self, t: _Topic, start: int, count: int) -> bool:
        return any((stub := t.stubs.get(s)) is not None and stub.waiters for s in range(start, start + count))

    async def _scan(self, t: _Topic, start: int, count: int) -> None:
        while count > 0 and self._live(t):
            self._counters["scans"] += 1
            try:
                got = await self._scanner(t.name, start, count, self._readahead_size)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._counters["scan_failures"] += 1
                if not self._live(t):
                    return
                if isinstance(exc, NoTopicPersistenceInfoError):   # deleted (trimmed): retrying cannot help
                    self._fail_stubs(t, start, count, exc)
                    return
                if not self._waited(t, start, count):
                    log.info("read-ahead of %r from %d failed (%s); nobody waits, dropped", t.name, start, exc)
                    for s in range(start, start + count):
                        self._drop_stub(t, s)
                    return
                log.warning("scan of %r from %d failed (%s); retrying in %d ms", t.name, start, exc,
                            self._backoff * 1000)
                await asyncio.sleep(self._backoff)
                start, count = self._pending(t, start, count)
                continue
            if not self._live(t):
                return
            got = got[:count]
            self._cache(t, [(start + i, m) for i, m in enumerate(got)], from_scan=True)
            t.maybe_more = len(got) == count or sum(map(message_size, got)) >= self._readahead_size
            start, count = start + len(got), count - len(got)
            if count and not self._waited(t, start, count):
                for s in range(start, start + count):
                    self._drop_stub(t, s)
                return
            if count and not got:
                # a reader waits for a message this scan did not see yet: look again after the
                # backoff (on_published may fill the stub first)
                await asyncio.sleep(self._backoff)
                start, count = self._pending(t, start, count)

    # -- entries -------------------------------------------------------------------------------

    def _fulfil(self, stub: _Stub, message: Message) -> None:
        if not stub.future.done():
            stub.future.set_result(message)

    def _fail_stubs(self, t: _Topic, start: int, count: int, exc: Exception) -> None:
        """Fail the waiters of ``start ..`` (``count``) with ``exc``; drop the stubs nobody waits on."""
        for s in range(start, start + count):
            stub = t.stubs.pop(s, None)
            if stub is None or stub.future.done():
                continue
            if stub.waiters:
                stub.future.set_exception(exc)
            else:
                stub.future.cancel()

    def _drop_stub(self, t: _Topic, seq: int) -> None:
        stub = t.stubs.pop(seq, None)
        if stub is not None and not stub.future.done():
            stub.future.cancel()

    def _cache(self, t: _Topic, entries: list[tuple[int, Message]], *, from_scan: bool = False) -> None:
        """Fill stubs and add entries (dropping expired ones first, then FIFO past ``cache_size``)."""
        now = self._clock()
        if self._ttl > 0:
            self._evict_expired(now)
        messages, sizes, consumed, added = t.messages, t.sizes, t.consumed, 0
        known_last = t.known_last
        seqs: list[int] = []
        for seq, msg in entries:
            if from_scan:
                stub = t.stubs.pop(seq, None)
                if stub is not None:
                    self._fulfil(stub, msg)
            if seq > known_last:
                known_last = seq
            if seq <= consumed or seq in messages:
                continue
            size = held_size(msg)
            messages[seq] = msg
            sizes[seq] = size
            seqs.append(seq)
            added += size
        self._cached(t, known_last, added, seqs, now)

    def _cache_run(self, t: _Topic, messages: list[Message]) -> None:
        """``_cache`` of a persisted entry's messages when no stub waits and entries do not expire: one loop,
        ``held_size`` inline for a message without properties, type or remote components (the usual one)."""
        now = self._clock()
        messages_of, sizes, consumed, added = t.messages, t.sizes, t.consumed, 0
        known_last = t.known_last
        seqs: list[int] = []
        fixed, size_of = _FIXED + 2 * _BYTES, sys.getsizeof
        for msg in messages:
            msg_id = msg.msg_id
            seq = msg_id.local
            if seq < 1:
                continue
            if seq > known_last:
                known_last = seq
            if seq <= consumed or seq in messages_of:
                continue
            if msg.properties or msg.message_type or msg_id.remote:
                size = held_size(msg)
            else:
                size = fixed + len(msg.wire) + len(msg.body) + size_of(msg.src_region)
            messages_of[seq] = msg
            sizes[seq] = size
            seqs.append(seq)
            added += size
        self._cached(t, known_last, added, seqs, now)

    def _cached(self, t: _Topic, known_last: int, added: int, seqs: list[int], now: float) -> None:
        """After ``_cache`` or ``_cache_run``: the topic's highest known seq id, the run ``seqs`` (``added``
        bytes, at ``now``) at the FIFO's end, and the oldest runs evicted past ``cache_size``."""
        t.known_last = known_last
        fifo = self._fifo
        if seqs:
            self._size, self._entries = self._size + added, self._entries + len(seqs)
            fifo.append(_Run(t, seqs, now))
            if len(fifo) >= self._compact_at:
                self._compact()
        while self._size > self._cache_size and fifo:
            self._evict_oldest()

    def _compact(self) -> None:
        """Drop the runs nothing is left of (pruned by ``consumed_up_to``, or of a forgotten topic): at most
        twice as many runs as there are live ones stay in the FIFO, for one pass over them per doubling."""
        topics = self._topics
        self._fifo = deque(r for r in self._fifo if r.last > r.topic.consumed and topics.get(r.topic.name) is r.topic)
        self._compact_at = max(_COMPACT_FROM, 2 * len(self._fifo))

    def _evict_expired(self, now: float) -> None:
        fifo = self._fifo
        while fifo and now - fifo[0].at >= self._ttl:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        """Evict the oldest run: what is left of its messages."""
        run = self._fifo.popleft()
        t = run.topic
        messages, sizes = t.messages, t.sizes
        freed = evicted = 0
        for seq in run.seqs:
            size = sizes.pop(seq, None)
            if size is not None:   # else pruned or forgotten already
                del messages[seq]
                freed += size
                evicted += 1
        self._size, self._entries = self._size - freed, self._entries - evicted
        self._counters["evicted"] += evicted

    def _forget(self, t: _Topic, why: str) -> None:
        for task in list(t.tasks):
            task.cancel()
        self._size, self._entries = self._size - sum(t.sizes.values()), self._entries - len(t.sizes)
        t.messages.clear()   # its runs go by _compact
        t.sizes.clear()
        for stub in t.stubs.values():
            if stub.future.done():
                continue
            if stub.waiters:
                stub.future.set_exception(ServiceDownError(why))
            else:
                stub.future.cancel()
        t.stubs.clear()
