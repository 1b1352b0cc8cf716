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

The read path (``scan``) is ``hub.log_reader.LogReader``: reads of the
current ledger, and of one being closed, go through its writer; other
ledgers through cached read handles (see that module).

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
import collections
import functools
import logging
from collections.abc import Callable
from typing import Any

from bookie.errors import BKError
from hub import errors
from hub.conf import HubConf
from hub.dedup import ProducerDedup
from hub.log_reader import LogReader, decode_batch
from hub.proto import pubsub_pb2 as pb
from metastore import Version
from metastore.tasks import spawn

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


class TopicLog(LogReader):
    """One owned topic's ledgers (see the module docstring); its read path is ``hub.log_reader.LogReader``."""

    def __init__(self, topic: bytes, bk: Any, pm: Any, conf: HubConf,
                 on_persisted: Callable[[bytes, list[pb.Message]], None] | None = None,
                 dedup_store: Any = None, owned: Callable[[], bool] | None = None) -> None:
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
        self.owned = owned                # False once this hub may have lost the topic (its metastore session)
        self._broken: str | None = None   # why this log may write no more ledger ranges (see _give_up)

    # --- acquisition ----------------------------------------------------------------------------
    @classmethod
    async def acquire(cls, topic: bytes, bk: Any, pm: Any, conf: HubConf,
                      on_persisted: Callable[[bytes, list[pb.Message]], None] | None = None,
                      dedup_store: Any = None, owned: Callable[[], bool] | None = None) -> TopicLog:
        """Recover every range left open and the dedup state; ``BadVersionError`` if raced.

        ``owned`` (the ownership claim's liveness: the hub's metastore session)
        is asked before every new ledger: once it says False the log opens none.
        """
        self = cls(topic, bk, pm, conf, on_persisted, dedup_store, owned)
        got = await pm.read_topic_persistence_info(topic)
        if got is not None:
            self.ranges, self.version = got
        empty = await self._recover_open_ranges()
        rs = self.ranges.ranges
        if rs:
            self.last_seq = rs[-1].endSeqIdIncluded.localComponent
        if got is not None:   # record the recovered ends (and fence a racing owner) before anyone reads
            self.version = await pm.write_topic_persistence_info(topic, self.ranges, self.version)
        for lid in empty:     # only once no range names them (a raced acquisition would still open them)
            await self._delete_ledger_quietly(lid)
        if dedup_store is not None:
            snap = await dedup_store.read_snapshot(topic)
            if snap is not None:
                self.dedup.restore(snap)
                self._dedup_armed = True
                await self._replay_dedup(snap.atSeqId + 1)
        return self   # the first publish creates the new ledger

    async def _recover_open_ranges(self) -> list[int]:
        """Recovery-open (fence and close) every ledger whose range has no end; record the ends.

        Normally only the last range can be open; an earlier one is a previous
        owner that started a ledger without closing the one before (its close
        failed). Each is recovered, so nothing acknowledged is skipped: an end
        past the next range's start is cut there (the writer never acknowledged
        those entries: it started the next ledger after the last it had), an
        empty ledger is forgotten (its id returned, to be deleted).
        """
        rs = self.ranges.ranges
        empty: list[int] = []
        i = 0
        while i < len(rs):
            r = rs[i]
            if r.HasField("endSeqIdIncluded"):
                i += 1
                continue
            end = await self._recovered_end(r)
            if i + 1 < len(rs):
                nxt = rs[i + 1].startSeqIdIncluded
                log.warning("topic %r: ledger %d (seq ids %d..) was left open before ledger %d; recovered to "
                            "seq id %d", self.topic, r.ledgerId, r.startSeqIdIncluded, rs[i + 1].ledgerId, end)
                if end >= nxt:
                    end = nxt - 1
                elif end < nxt - 1:
                    log.error("topic %r: seq ids %d..%d are in no ledger", self.topic, end + 1, nxt - 1)
            if end < r.startSeqIdIncluded:
                empty.append(r.ledgerId)
                del rs[i]        # an empty ledger: forget it
                continue
            r.endSeqIdIncluded.localComponent = end
            i += 1
        return empty

    async def _recovered_end(self, r: pb.LedgerRange) -> int:
        """Open ``r``'s ledger with recovery (fencing its writer) and return its last seq id."""
        rh = await self.bk.open_ledger(r.ledgerId)
        end = r.startSeqIdIncluded - 1
        try:
            if rh.last_add_confirmed >= 0:
                async for e in rh.read(rh.last_add_confirmed, rh.last_add_confirmed):
                    batch = pb.MessageBatch.FromString(e.data)
                    end = batch.first_local_seq_id + len(batch.messages) - 1
        finally:
            await rh.close()
        return end

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

    def _give_up(self, why: str) -> None:
        """This log may no longer change the topic's ranges: no new ledger, publishes fail, the hub releases it.

        After a failed close of the current ledger (its range keeps no end) or
        a failed or conflicting range write (the version this owner holds is
        no longer known to be current) only the next owner's acquisition
        (recovery, then a CAS on the version it read) may go on.
        """
        if self._broken is None:
            log.warning("topic %r: giving the topic up: %s", self.topic, why)
            self._broken = why
        self.closed = True

    def _may_start_ledger(self) -> None:
        """``ServiceDownError`` unless this log may open a new ledger (``_give_up``, ``owned``)."""
        if self._broken is None and self.owned is not None and not self.owned():
            self._give_up("this hub lost its metastore session (and with it the topic's ownership)")
        if self._broken is not None:
            raise errors.ServiceDownError(f"topic {self.topic!r}: no new ledger ({self._broken}); retry")

    async def _new_ledger(self) -> None:
        self._may_start_ledger()
        c = self.conf
        lh = await self.bk.create_ledger(ensemble=c.bk_ensemble_size, write_quorum=c.bk_write_quorum_size,
                                         ack_quorum=c.bk_ack_quorum_size,
                                         properties={"topic": self.topic})
        ranges = pb.LedgerRanges()
        ranges.CopyFrom(self.ranges)
        ranges.ranges.add(ledgerId=lh.ledger_id, startSeqIdIncluded=self.last_seq + 1)
        tried = False
        try:
            self._may_start_ledger()   # the create may have outlived the session
            tried = True
            self.version = await self._write_ranges(ranges)
        except BaseException as exc:
            await self._close_quietly(lh)
            # a write whose outcome is unknown (metastore down) may have recorded the ledger: the next
            # owner recovers it (empty, closed), so it must stay; refused or rejected, it is nobody's
            if not (tried and isinstance(exc, errors.ServiceDownError)):
                await self._delete_ledger_quietly(lh.ledger_id)
            raise
        self.ranges = ranges
        self.lh = lh
        self.entries_in_ledger = 0
        self._index[lh.ledger_id] = []

    async def _write_ranges(self, ranges: pb.LedgerRanges) -> Version:
        """CAS ``ranges`` on the version this owner holds; any failure gives the topic up (``_give_up``)."""
        try:
            version: Version = await self.pm.write_topic_persistence_info(self.topic, ranges, self.version)
        except Exception as exc:
            self._give_up(f"writing its ledger ranges failed: {exc}")
            raise
        return version

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
        except Exception as exc:   # its range keeps no end: no ledger may follow it, only a recovery
            self._give_up(f"closing ledger {lh.ledger_id} failed: {exc}")
            raise
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
        self.version = await self._write_ranges(ranges)
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
        spawn(self._tasks, self._write_snapshot(self.dedup.snapshot(self.last_seq)))

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
                self._give_up(f"closing ledger {lh.ledger_id} failed: {exc2}")   # the next owner recovers it
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
            self.version = await self._write_ranges(ranges)
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
