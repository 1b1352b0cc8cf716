"""A topic's messages on ledgers: batched entries, dense seq ids, ledger ranges, the read path.

    log = await TopicLog.acquire(topic, bk, persistence_mgr, conf)   # after the ownership claim
    seq = await log.publish(message_proto)      # returns once the ledger add holding it is acknowledged
    msgs = await log.scan(start_seq, max_messages, max_bytes)         # the read-ahead cache's Scanner
    deleted = await log.delete_consumed(min_consumed_seq)            # consumed-ledger deletion
    await log.release()                          # close the current ledger

Acquisition reads the topic's ``LedgerRanges``; a last range left open by a
previous owner is recovery-opened (``bk.open_ledger`` fences and closes it)
and its end seq id read from its last entry; then a new ledger is created
and appended as the open range (CAS on ``topic_persistence``, so two hubs
never both write a topic).

Publishes are batched DistributedLog-style. A publish that finds no add in
flight for its topic is sent as soon as the read that brought it is
dispatched (the server calls ``send_queued``; otherwise at the end of the
loop turn), together with the other publishes of that read. Publishes that arrive
while adds are in flight queue up and go out together, one
``pubsub_pb2.MessageBatch`` per entry (bounded by ``max_batch_messages`` and
``max_batch_bytes``): once no add is in flight, or as soon as the queue
holds ``batch_flush_bytes`` of message bodies (DistributedLog's output
buffer: another entry joins those in flight, up to ``max_outstanding_adds``).
So a lone publish is never delayed, a trickle of publishes costs one add per
round trip, and a stream of them keeps several large entries in flight
(sending whatever had queued at every acknowledgement instead degenerates
into many small entries in flight, each costing the bookies a commit).
Seq ids are dense per message: the first message of a topic is 1. The
ledger rolls after ``max_entries_per_ledger`` entries. An acknowledged entry
completes its publishes first and only then goes to ``on_persisted`` (the
read-ahead cache and delivery), so publishers are answered before the
deliveries of the same messages are built.

Reads of the current ledger, and of one being closed, go through its
writer (its LAC follows the acknowledgements). Other ledgers are read
through cached read handles; a handle opened while its ledger was still
open (its LAC one entry short: the last entry's LAC travels with the next
add or the close) is replaced by one on the closed metadata once the range
records its end, and is reopened when a scan needs an entry past its LAC.

Failure: a failed add fails its batch and every publish queued behind it
with ``ServiceDownError``; the ledger is closed at its last acknowledged
entry (so the failed batch never surfaces) and the next publish starts a
new ledger. A ledger that cannot be started (too few bookies), or that
failed before any entry was acknowledged, is not retried at once: the
topic backs off ``ledger_create_backoff_ms``, doubling per further failure
up to ``ledger_create_backoff_max_ms``, and publishes meanwhile fail at once
with ``ServiceDownError`` naming the last failure; an acknowledged entry
resets the backoff. So a hub without enough bookies neither spins nor
leaves a trail of empty ledgers (an empty one is deleted when closed).
Metadata conflicts raise ``hub.errors.BadVersionError`` (someone
else owns the topic).

Producer deduplication (``hub.dedup``): a message carrying a ``producer``
goes through ``ProducerDedup.admit`` before it is queued. A topic's first
such message waits until the topic's record in ``topic_dedup`` exists (so
the next owner knows to rebuild); every ``dedup_snapshot_interval`` stored
messages a snapshot is written there (failures only logged). Acquisition
restores the snapshot and replays the producer messages of the log after it
(the log is the truth: a snapshot is only where the reading starts).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import functools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from bookie.errors import BKError
from hub import errors
from hub.conf import HubConf
from hub.dedup import ProducerDedup
from hub.message import Message
from hub.proto import pubsub_pb2 as pb
from metastore import Version

log = logging.getLogger(__name__)

__all__ = ["TopicLog", "decode_batch"]

Done = Callable[[int, BaseException | None], None]
"""A publish's completion: ``(seq_id, None)`` once durable, ``(0, error)`` when it failed."""
Batch = list[tuple[pb.Message, Done]]


class _Add:
    """One entry sent to the ledger: its batch and, once the add's callback ran, the outcome."""

    __slots__ = ("batch", "error", "first", "lh", "settled")

    def __init__(self, lh: Any, first: int, batch: Batch) -> None:
        self.lh = lh
        self.first = first
        self.batch = batch
        self.settled = False
        self.error: BaseException | None = None


def _resolve(fut: asyncio.Future[int], seq: int, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(seq)


def _call(done: Done, seq: int, error: BaseException | None) -> None:
    try:
        done(seq, error)
    except Exception:
        log.exception("publish completion callback raised")


async def _one(batch: list[pb.Message]) -> AsyncIterator[list[pb.Message]]:
    yield batch


def decode_batch(data: bytes) -> list[pb.Message]:
    """The messages of one ledger entry, each with its local seq id set."""
    batch = pb.MessageBatch.FromString(data)
    first = batch.first_local_seq_id
    for i, m in enumerate(batch.messages):
        m.msgId.localComponent = first + i
    return list(batch.messages)


class TopicLog:
    """One owned topic's ledgers (see the module docstring)."""

    def __init__(self, topic: bytes, bk: Any, pm: Any, conf: HubConf,
                 on_persisted: Callable[[bytes, list[pb.Message]], None] | None = None,
                 dedup_store: Any = None) -> None:
        self.topic = topic
        self.bk = bk
        self.pm = pm
        self.conf = conf
        self.on_persisted = on_persisted
        self.ranges = pb.LedgerRanges()
        self.version: Version = Version.NEW
        self.last_seq = 0                 # last acknowledged seq id
        self.lh: Any = None               # current ledger (writer handle)
        self.entries_in_ledger = 0
        self._index: dict[int, list[int]] = {}      # ledgers we wrote: first seq id of every entry
        self._decoded: tuple[tuple[int, int], list[pb.Message]] = ((-1, -1), [])  # last entry read, decoded
        self._known: dict[int, list[tuple[int, int]]] = {}  # other ledgers: sorted (first seq id, entry id) read
        self._readers: dict[int, Any] = {}           # read-only handles on ledgers that are not current
        self._closing: Any = None         # the writer handle being closed (reads go through it meanwhile)
        self._queue: collections.deque[tuple[pb.Message, Done]] = collections.deque()
        self._queued_bytes = 0
        self._inflight: collections.deque[_Add] = collections.deque()   # sent, in entry order
        self._pump_soon = False           # a _pump is scheduled for the end of this loop turn
        self._pumping = False             # a _pump is running (an add settled inside it waits for it)
        self._slow: asyncio.Task[None] | None = None      # a ledger roll or a failed add being handled
        self._drain: asyncio.Future[None] | None = None   # _add_failed waits for the adds in flight
        self._idle: list[asyncio.Future[None]] = []       # _drained waits for the queue to empty
        self._lock = asyncio.Lock()       # ledger changes (roll, delete) vs. each other
        self._start_failures = 0          # ledgers that could not be started (or failed empty) in a row
        self._start_not_before = 0.0      # loop time before which no new ledger is tried
        self._start_error: BaseException | None = None
        self.dedup = ProducerDedup(conf.dedup_window)
        self._dedup_store = dedup_store          # hub.metadata.TopicDedupManager (None: in memory only)
        self._dedup_armed = dedup_store is None  # the topic's topic_dedup record exists
        self._needs_arm = False
        self._since_snapshot = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self.closed = False

    # --- acquisition ----------------------------------------------------------------------------
    @classmethod
    async def acquire(cls, topic: bytes, bk: Any, pm: Any, conf: HubConf,
                      on_persisted: Callable[[bytes, list[pb.Message]], None] | None = None,
                      dedup_store: Any = None) -> TopicLog:
        """Recover the previous owner's last ledger and the dedup state; ``BadVersionError`` if raced."""
        self = cls(topic, bk, pm, conf, on_persisted, dedup_store)
        got = await pm.read_topic_persistence_info(topic)
        if got is not None:
            self.ranges, self.version = got
        rs = self.ranges.ranges
        if rs and not rs[-1].HasField("endSeqIdIncluded"):
            last = rs[-1]
            rh = await bk.open_ledger(last.ledgerId)
            end = last.startSeqIdIncluded - 1
            if rh.last_add_confirmed >= 0:
                async for e in rh.read(rh.last_add_confirmed, rh.last_add_confirmed):
                    batch = pb.MessageBatch.FromString(e.data)
                    end = batch.first_local_seq_id + len(batch.messages) - 1
            await rh.close()
            if end < last.startSeqIdIncluded:
                del rs[-1]        # an empty ledger: forget it
                await self._delete_ledger_quietly(last.ledgerId)
            else:
                last.endSeqIdIncluded.localComponent = end
        if rs:
            self.last_seq = rs[-1].endSeqIdIncluded.localComponent
        if got is not None:   # record the recovered end (and fence a racing owner) before anyone reads
            self.version = await pm.write_topic_persistence_info(topic, self.ranges, self.version)
        if dedup_store is not None:
            snap = await dedup_store.read_snapshot(topic)
            if snap is not None:
                self.dedup.restore(snap)
                self._dedup_armed = True
                await self._replay_dedup(snap.atSeqId + 1)
        return self   # the first publish creates the new ledger

    async def _replay_dedup(self, start: int) -> None:
        """Feed the producer messages stored from ``start`` on to the dedup state."""
        seq = start
        n = 0
        while seq <= self.last_seq:
            try:
                msgs = await self.scan(seq, 1000, 4 << 20)
            except errors.NoTopicPersistenceInfoError:   # consumed ledgers deleted: start at the oldest kept
                rs = self.ranges.ranges
                if not rs or rs[0].startSeqIdIncluded <= seq:
                    raise
                seq = rs[0].startSeqIdIncluded
                continue
            if not msgs:
                raise errors.ServiceDownError(f"topic {self.topic!r}: cannot read seq id {seq} to rebuild "
                                              "producer deduplication")
            for m in msgs:
                pm = pb.Message.FromString(m.wire)
                if pm.producer:
                    self.dedup.stored(pm.producer, pm.sequenceId, m.seq_id)
                n += 1
            seq = msgs[-1].seq_id + 1
        log.info("topic %r: producer deduplication rebuilt from %d messages after seq id %d", self.topic, n,
                 start - 1)

    async def _delete_ledger_quietly(self, ledger_id: int) -> None:
        try:
            await self.bk.delete_ledger(ledger_id)
        except BKError as exc:
            log.info("topic %r: could not delete ledger %d: %s", self.topic, ledger_id, exc)

    async def _new_ledger(self) -> None:
        c = self.conf
        lh = await self.bk.create_ledger(ensemble=c.bk_ensemble_size, write_quorum=c.bk_write_quorum_size,
                                         ack_quorum=c.bk_ack_quorum_size,
                                         properties={"topic": self.topic})
        ranges = pb.LedgerRanges()
        ranges.CopyFrom(self.ranges)
        ranges.ranges.add(ledgerId=lh.ledger_id, startSeqIdIncluded=self.last_seq + 1)
        try:
            self.version = await self.pm.write_topic_persistence_info(self.topic, ranges, self.version)
        except BaseException:
            await self._close_quietly(lh)
            await self._delete_ledger_quietly(lh.ledger_id)
            raise
        self.ranges = ranges
        self.lh = lh
        self.entries_in_ledger = 0
        self._index[lh.ledger_id] = []

    @staticmethod
    async def _close_quietly(lh: Any) -> None:
        try:
            await lh.close()
        except BKError as exc:
            log.info("ledger %d: close failed: %s", lh.ledger_id, exc)

    async def _close_current(self) -> None:
        """Close the current ledger at its last acknowledged entry and record its end seq id."""
        lh, self.lh = self.lh, None
        if lh is None:
            return
        self._closing = lh   # until its end is recorded, reads use the writer's LAC, not a half-closed ledger's
        try:
            await self._record_close(lh)
        finally:
            self._closing = None

    async def _record_close(self, lh: Any) -> None:
        await lh.close()
        rs = self.ranges.ranges
        ranges = pb.LedgerRanges()
        ranges.CopyFrom(self.ranges)
        cur = ranges.ranges[-1]
        if self.last_seq < cur.startSeqIdIncluded:
            del ranges.ranges[-1]
            self._index.pop(lh.ledger_id, None)
            drop = True
        else:
            cur.endSeqIdIncluded.localComponent = self.last_seq
            drop = False
        self.version = await self.pm.write_topic_persistence_info(self.topic, ranges, self.version)
        self.ranges = ranges
        del rs
        if drop:
            await self._delete_ledger_quietly(lh.ledger_id)

    # --- publishing -----------------------------------------------------------------------------
    async def publish(self, message: pb.Message) -> int:
        """Persist ``message``; its seq id once acknowledged. ``ServiceDownError`` when not durable."""
        return await self.enqueue(message)

    def enqueue(self, message: pb.Message) -> asyncio.Future[int]:
        """Queue ``message`` now (publish order is call order); the future gets its seq id."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.submit(message, functools.partial(_resolve, fut))
        return fut

    def submit(self, message: pb.Message, done: Done) -> None:
        """Queue ``message`` now; ``done(seq_id, None)`` once it is durable, else ``done(0, error)``.

        The callback form of ``enqueue`` (no future, no extra loop turn): the
        server answers a publish from inside the add's acknowledgement.
        ``done`` runs on the loop, in publish order, exactly once.
        """
        if self.closed:
            done(0, errors.ServiceDownError(f"topic {self.topic!r} is being released"))
            return
        if message.producer:
            producer, sequence_id = message.producer, message.sequenceId
            if not self.dedup.admit(producer, sequence_id, done):
                return     # a duplicate: answered (or waiting for its original)
            done = functools.partial(self._dedup_settled, producer, sequence_id, done)
            if not self._dedup_armed:
                self._needs_arm = True
        self._queue.append((message, done))
        self._queued_bytes += len(message.body)
        if (not self._pump_soon and self._slow is None
                and (not self._inflight or self._queued_bytes >= self.conf.batch_flush_bytes)):
            # at the end of this loop turn, so the publishes of one read share an entry
            self._pump_soon = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _dedup_settled(self, producer: bytes, sequence_id: int, done: Done, seq: int,
                       error: BaseException | None) -> None:
        self.dedup.settle(producer, sequence_id, seq, error)
        done(seq, error)

    async def _arm_dedup(self) -> None:
        """Create the topic's ``topic_dedup`` record before its first producer message is sent."""
        try:
            await self._dedup_store.write_snapshot(self.topic, self.dedup.snapshot(self.last_seq), create=True)
            self._dedup_armed = True
        except Exception as exc:
            self._fail_queue(self._error(exc))
        finally:
            self._needs_arm = False
            self._slow = None
        self._pump()

    def _snapshot_soon(self, batch_len: int) -> None:
        self._since_snapshot += batch_len
        if self._dedup_store is None or not self._dedup_armed or \
                self._since_snapshot < self.conf.dedup_snapshot_interval:
            return
        self._since_snapshot = 0
        task = asyncio.get_running_loop().create_task(self._write_snapshot(self.dedup.snapshot(self.last_seq)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write_snapshot(self, snap: pb.DedupSnapshot) -> None:
        try:
            await self._dedup_store.write_snapshot(self.topic, snap)
        except Exception as exc:   # the next owner reads a longer tail
            log.info("topic %r: dedup snapshot at seq id %d not written: %s", self.topic, snap.atSeqId, exc)

    def send_queued(self) -> None:
        """Send what ``submit`` queued for the end of this loop turn now (the server calls it after a read)."""
        if self._pump_soon:
            self._pump()

    def _settle(self, add: _Add, entry_id: int, error: BaseException | None) -> None:
        """A ledger add's callback: complete what is acknowledged in order, send what may go."""
        add.settled = True
        add.error = error
        if self._pumping:
            return   # settled from inside _send (a refusal): the running _pump sees it next
        if self._slow is None:
            self._pump()
        elif self._drain is not None and all(a.settled for a in self._inflight) and not self._drain.done():
            self._drain.set_result(None)

    def _pump(self) -> None:
        """Complete the settled adds at the head, in order, then send batches (see the module docstring).

        Synchronous; a ledger roll or a failed add hands over to a task
        (``_slow``) that calls this again when done.
        """
        self._pump_soon = False
        if self._slow is not None or self._pumping:
            return
        self._pumping = True
        try:
            self._pump_once()
        finally:
            self._pumping = False

    def _pump_once(self) -> None:
        inflight = self._inflight
        conf = self.conf
        while True:
            while inflight and inflight[0].settled:
                head = inflight[0]
                if head.error is not None:
                    self._slow = asyncio.get_running_loop().create_task(self._add_failed(head))
                    return
                inflight.popleft()
                self._acked(head)
            if not (self._queue and len(inflight) < conf.max_outstanding_adds
                    and (not inflight or self._queued_bytes >= conf.batch_flush_bytes)):
                break
            if self._needs_arm:
                self._slow = asyncio.get_running_loop().create_task(self._arm_dedup())
                return
            maxe = conf.max_entries_per_ledger
            if self.lh is None or (maxe and self.entries_in_ledger >= maxe):
                if not inflight:   # roll once the entries in flight are settled
                    loop = asyncio.get_running_loop()
                    wait = self._start_not_before - loop.time()
                    if wait > 0 and self.lh is None:
                        self._fail_queue(errors.ServiceDownError(
                            f"topic {self.topic!r}: no ledger ({self._start_error}); next attempt in "
                            f"{wait * 1000:.0f} ms"))
                        break
                    self._slow = loop.create_task(self._roll())
                return
            self._send(self._take_batch())
        if not inflight and not self._queue:
            idle, self._idle = self._idle, []
            for w in idle:
                if not w.done():
                    w.set_result(None)

    def _send(self, batch: Batch) -> None:
        first = self.last_seq + 1 + sum(len(a.batch) for a in self._inflight)
        entry = pb.MessageBatch(first_local_seq_id=first)
        entry.messages.extend(m for m, _ in batch)
        add = _Add(self.lh, first, batch)
        self._inflight.append(add)
        self.entries_in_ledger += 1
        try:
            add.lh.async_add_entry(entry.SerializeToString(), functools.partial(self._settle, add))
        except Exception as exc:   # refused before anything was sent: a failed add, in order
            add.settled, add.error = True, exc

    def _take_batch(self) -> Batch:
        batch: Batch = []
        size = 0
        queue = self._queue
        while queue and len(batch) < self.conf.max_batch_messages:
            m = queue[0][0]
            if batch and size + len(m.body) > self.conf.max_batch_bytes:
                break
            batch.append(queue.popleft())
            size += len(m.body)
            self._queued_bytes -= len(m.body)
        return batch

    async def _roll(self) -> None:
        """Start the first ledger, or close the full one and start the next; then carry on publishing."""
        try:
            async with self._lock:
                if self.lh is not None:
                    await self._close_current()
                await self._new_ledger()
        except Exception as exc:
            self._start_failed(exc)
            self._fail_queue(self._error(exc))
        finally:
            self._slow = None
        self._pump()

    def _start_failed(self, exc: BaseException) -> None:
        """A ledger could not be started (or failed empty): back off before the next (module docstring)."""
        self._start_failures += 1
        delay = min(self.conf.ledger_create_backoff_ms * 2 ** min(self._start_failures - 1, 30),
                    self.conf.ledger_create_backoff_max_ms) / 1000.0
        self._start_not_before = asyncio.get_running_loop().time() + delay
        self._start_error = exc
        log.warning("topic %r: no ledger (%s); next attempt in %.0f ms", self.topic, exc, delay * 1000)

    async def _drained(self) -> None:
        """Return once nothing is queued or in flight."""
        while self._queue or self._inflight or self._slow is not None:
            if self._slow is not None:
                await asyncio.gather(self._slow, return_exceptions=True)
                continue
            idle: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._idle.append(idle)
            if not self._pump_soon:
                self._pump()
            if not idle.done():
                await idle

    def _error(self, exc: BaseException) -> errors.PubSubError:
        if isinstance(exc, errors.PubSubError):
            return exc
        return errors.ServiceDownError(f"publish to {self.topic!r} not durable: {exc}")

    def _fail_queue(self, err: errors.PubSubError, batches: Any = ()) -> None:
        for batch in batches:
            for _, done in batch:
                _call(done, 0, err)
        while self._queue:
            _, done = self._queue.popleft()
            _call(done, 0, err)
        self._queued_bytes = 0

    async def _add_failed(self, head: _Add) -> None:
        """An add failed: the entries after it fail too; close the ledger at its last acknowledged entry."""
        lh, exc = head.lh, head.error
        assert exc is not None
        try:
            log.warning("topic %r: add to ledger %d failed: %s; rolling", self.topic, lh.ledger_id, exc)
            if not all(a.settled for a in self._inflight):   # the writer fails the adds after it
                self._drain = asyncio.get_running_loop().create_future()
                try:
                    await self._drain
                finally:
                    self._drain = None
            failed = [a.batch for a in self._inflight]
            self._inflight.clear()
            if not self._index.get(lh.ledger_id):   # nothing acknowledged on it: as good as never started
                self._start_failed(exc)
            self._fail_queue(self._error(exc), failed)
            try:
                async with self._lock:
                    await self._close_current()
            except Exception as exc2:
                log.warning("topic %r: closing ledger %d failed: %s", self.topic, lh.ledger_id, exc2)
                self.lh = None
                self.closed = True   # the owner must give the topic up; the next owner recovers the ledger
        finally:
            self._slow = None
        self._pump()

    def _acked(self, add: _Add) -> None:
        self._start_failures = 0
        first, batch = add.first, add.batch
        self._index[add.lh.ledger_id].append(first)
        self.last_seq = first + len(batch) - 1
        msgs = []
        for seq, (m, done) in enumerate(batch, first):   # answers first: deliveries (on_persisted) follow
            m.msgId.localComponent = seq
            msgs.append(m)
            _call(done, seq, None)
        self._snapshot_soon(len(batch))
        if self.on_persisted is not None:
            self.on_persisted(self.topic, msgs)

    # --- reading --------------------------------------------------------------------------------
    def first_kept(self) -> int:
        """The oldest seq id still stored (the ledgers before it were deleted); ``last_seq + 1`` when none."""
        if not self.ranges.ranges:
            return int(self.last_seq) + 1
        return max(1, int(self.ranges.ranges[0].startSeqIdIncluded))

    def _range_for(self, seq: int) -> pb.LedgerRange | None:
        for r in self.ranges.ranges:
            end = r.endSeqIdIncluded.localComponent if r.HasField("endSeqIdIncluded") else self.last_seq
            if r.startSeqIdIncluded <= seq <= end:
                return r
        return None

    async def _reader(self, r: pb.LedgerRange, *, reopen: bool = False) -> Any:
        """A read handle on ``r``'s ledger: the writer's while it is current or closing, else a cached reader.

        A cached reader opened while its ledger was still open knows a LAC
        that may stop short of the ledger's end (the last entry's LAC travels
        with the next add or the close). Once the range records its end the
        ledger is closed, so such a reader is replaced by one opened on the
        closed metadata; ``reopen`` replaces it regardless (a scan that found
        it short).
        """
        lid = r.ledgerId
        for writer in (self.lh, self._closing):
            if writer is not None and writer.ledger_id == lid:
                return writer
        rh = self._readers.get(lid)
        if rh is not None and not rh.is_closed and (reopen or r.HasField("endSeqIdIncluded")):
            del self._readers[lid]
            await self._close_quietly(rh)
            rh = None
        if rh is None:
            rh = await self.bk.open_ledger_no_recovery(lid)
            if self._readers.get(lid) is not None:   # another scan opened it meanwhile: keep one
                await self._close_quietly(rh)
                return self._readers[lid]
            self._readers[lid] = rh
        return rh

    def _may_be_short(self, rh: Any) -> bool:
        """``rh`` is a reader whose LAC may lag its ledger (not a writer's, not on closed metadata)."""
        return rh is not self.lh and rh is not self._closing and not rh.is_closed

    def _learn(self, ledger_id: int, entry_id: int, first_seq: int) -> None:
        """Remember where an entry of a ledger we did not write starts (narrows later searches)."""
        if ledger_id in self._index:
            return
        known = self._known.setdefault(ledger_id, [])
        i = bisect.bisect_left(known, (first_seq, entry_id))
        if i == len(known) or known[i] != (first_seq, entry_id):
            known.insert(i, (first_seq, entry_id))

    async def _entry_of(self, rh: Any, seq: int) -> int:
        """The entry id of ``rh`` holding ``seq``: our own index, else a binary search by reads.

        Ledgers this owner wrote have a complete in-memory index; for a
        previous owner's ledgers, every entry read so far bounds the search,
        so a sequential reader costs about one extra read per scan.
        """
        idx = self._index.get(rh.ledger_id)
        if idx is not None:
            return bisect.bisect_right(idx, seq) - 1
        lo, hi = 0, rh.last_add_confirmed
        known = self._known.get(rh.ledger_id, [])
        i = bisect.bisect_right(known, (seq, 1 << 62))      # first entry known to start after seq
        if i > 0:
            lo = known[i - 1][1]
        if i < len(known):
            hi = min(hi, known[i][1] - 1)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            first = -1
            async for e in rh.read(mid, mid):
                first = pb.MessageBatch.FromString(e.data).first_local_seq_id
                self._learn(rh.ledger_id, mid, first)
            if first <= seq:
                lo = mid
            else:
                hi = mid - 1
        return lo

    async def _read_decoded(self, rh: Any, first: int, last: int) -> AsyncIterator[list[pb.Message]]:
        async for e in rh.read(first, last):
            batch = decode_batch(e.data)
            if batch:
                self._learn(rh.ledger_id, e.entry_id, batch[0].msgId.localComponent)
            self._decoded = ((rh.ledger_id, e.entry_id), batch)
            yield batch

    def _last_entry_for(self, ledger_id: int, entry: int, last_seq: int) -> int:
        """The last entry to read so that ``entry..`` covers ``last_seq`` without reading past it.

        Exact for ledgers we wrote; for others, bounded by what earlier reads
        taught us, else one entry (the scan loop reads on from where it stops).
        """
        idx = self._index.get(ledger_id)
        if idx is not None:
            return max(entry, bisect.bisect_right(idx, last_seq) - 1)
        known = self._known.get(ledger_id, [])
        i = bisect.bisect_right(known, (last_seq, 1 << 62))
        if i < len(known) and known[i][1] > entry:
            return known[i][1] - 1
        return entry

    async def scan(self, start: int, max_messages: int, max_bytes: int) -> list[Message]:
        """Consecutive messages from ``start`` (fewer or none past the end); stops at either hint."""
        out: list[Message] = []
        size = 0
        seq = start
        reopened: set[int] = set()
        while seq <= self.last_seq and len(out) < max_messages and (not out or size < max_bytes):
            r = self._range_for(seq)
            if r is None:
                if out:
                    break
                raise errors.NoTopicPersistenceInfoError(f"seq id {seq} of {self.topic!r} was deleted")
            rh = await self._reader(r)
            entry = await self._entry_of(rh, seq)
            if entry > rh.last_add_confirmed and self._may_be_short(rh) and r.ledgerId not in reopened:
                reopened.add(r.ledgerId)   # a stale LAC: look again (once per scan; the read-ahead retries)
                rh = await self._reader(r, reopen=True)
                entry = await self._entry_of(rh, seq)
            last_entry = rh.last_add_confirmed
            if entry > last_entry:
                break
            progressed = False
            end_entry = min(last_entry, self._last_entry_for(rh.ledger_id, entry, seq + max_messages - len(out) - 1))
            if self._decoded[0] == (rh.ledger_id, entry):     # a sequential reader: the entry it just read
                entries: Any = _one(self._decoded[1])
            else:
                entries = self._read_decoded(rh, entry, end_entry)
            async for batch in entries:
                for m in batch:
                    s = m.msgId.localComponent
                    if s < seq:
                        continue
                    if s != seq or len(out) >= max_messages or (out and size >= max_bytes):
                        break
                    m.srcRegion = m.srcRegion or self.conf.region.encode()
                    out.append(Message.from_proto(m, keep_wire=True))
                    size += len(m.body)
                    seq += 1
                    progressed = True
                if len(out) >= max_messages or (out and size >= max_bytes):
                    break
            if not progressed:
                break
        return out

    # --- consumed ledgers and release -----------------------------------------------------------
    async def delete_consumed(self, consumed: int) -> list[int]:
        """Delete closed ledgers whose every message is at or below ``consumed``; their ids."""
        async with self._lock:
            gone = [r for r in self.ranges.ranges[:-1]   # the last range keeps the topic's last seq id
                    if r.HasField("endSeqIdIncluded") and r.endSeqIdIncluded.localComponent <= consumed
                    and (self.lh is None or r.ledgerId != self.lh.ledger_id)]
            if not gone:
                return []
            ranges = pb.LedgerRanges()
            ids = {r.ledgerId for r in gone}
            for r in self.ranges.ranges:
                if r.ledgerId not in ids:
                    ranges.ranges.append(r)
            self.version = await self.pm.write_topic_persistence_info(self.topic, ranges, self.version)
            self.ranges = ranges
            for lid in ids:
                self._index.pop(lid, None)
                self._known.pop(lid, None)
                rh = self._readers.pop(lid, None)
                if rh is not None:
                    await self._close_quietly(rh)
                await self._delete_ledger_quietly(lid)
            return sorted(ids)

    async def release(self) -> None:
        """Stop publishing, close the current ledger (recording its end), drop readers."""
        self.closed = True
        await self._drained()
        async with self._lock:
            try:
                await self._close_current()
            except Exception as exc:
                log.info("topic %r: release left ledger open: %s", self.topic, exc)
        for rh in self._readers.values():
            await self._close_quietly(rh)
        self._readers.clear()
