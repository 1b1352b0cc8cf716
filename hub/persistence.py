"""A topic's messages on ledgers: batched entries, dense seq ids, ledger ranges, the read path.

    log = await TopicLog.acquire(topic, bk, persistence_mgr, conf, owned=lambda: session.alive)  # after the claim
    seq = await log.publish(message_proto)      # returns once the ledger add holding it is acknowledged
    msgs = await log.scan(start_seq, max_messages, max_bytes)         # the read-ahead cache's Scanner
    deleted = await log.delete_consumed(min_consumed_seq)            # consumed-ledger deletion
    await log.release()                          # close the current ledger

``TopicLog`` is three modules: this one (acquisition, ledger ranges,
consumed-ledger deletion, release), ``hub.batcher`` (the publishing path:
``EntryBatcher``) and ``hub.log_reader`` (the read path: ``LogReader``).

Acquisition reads the topic's ``LedgerRanges``; every range left open by a
previous owner (normally only the last; an earlier one if that owner's
close failed and it went on regardless) is recovery-opened (``bk.open_ledger``
fences and closes it) and its end seq id read from its last entry, so
nothing acknowledged is skipped; the ends are written back (CAS on the
version read) before the topic serves. The first publish creates a new
ledger and appends it as the open range (CAS on the version this owner
holds, so two hubs never both write a topic). An acquisition made for a
publish (``start_ledger``) creates that ledger itself and writes its range
with the recovered ends, in the one CAS on the version read.

Fencing: only the version read at acquisition, and each version this log
wrote after it, is ever used. Once a range write fails (a conflict, or the
metastore down: its outcome unknown), once the current ledger cannot be
closed (its range keeps no end), or once ``owned()`` says the hub lost its
metastore session (the ownership claim), the log opens no new ledger and
sends no more entries (those in flight may still be acknowledged: they are
in a recorded ledger, which the next owner recovers): ``closed`` turns
True, publishes fail with ``ServiceDownError`` (the server releases the
topic) and only the next acquisition's recovery goes on. So no
publish is ever acknowledged in a ledger that follows one left open.

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
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from bookie.errors import BKError
from hub import errors
from hub.batcher import Batch, Done, EntryBatcher, Gate, InflightAdd, Persisted, Queued
from hub.conf import HubConf
from hub.dedup import ProducerDedup
from hub.entry_index import EntryIndex
from hub.log_reader import NOTHING_DECODED, LogReader, decode_batch
from hub.log_usage import LogUsage
from hub.proto import pubsub_pb2 as pb
from metastore import Version
from metastore.idle import IDLE, IDLE_DICT, KeptVersion, VersionSlot

if TYPE_CHECKING:
    from bookie.client import BookKeeper
    from bookie.ledger import LedgerHandle
    from hub.metadata import TopicDedupManager, TopicPersistenceManager

log = logging.getLogger(__name__)

__all__ = ["Batch", "Done", "LedgerHold", "TopicLog", "decode_batch"]

_KNOWN_BYTES = 120
"""About what one known entry start of a previous owner's ledger costs (a tuple of two ints in a list)."""
_REJECTED = (errors.BadVersionError, errors.TopicPersistenceInfoExistsError, errors.NoTopicPersistenceInfoError)
"""Range-write failures that certainly wrote nothing."""


class LedgerHold(Protocol):
    """What holds a topic's ledgers from consumed-ledger deletion (``hub.compaction.TopicCompaction``)."""

    def keep_from(self) -> int | None:
        """The first seq id whose ledger (and every later one) must be kept; None: nothing held."""


class TopicLog(EntryBatcher, LogReader, LogUsage):
    """One owned topic's ledgers (see the module docstring); its read path is ``hub.log_reader.LogReader``.

    Slots, and nothing built before it is needed (the dedup state, the
    publish queues: ``metastore.idle.IDLE``): a hub owns thousands of idle
    topics (issue 34).
    """

    __slots__ = ("_broken", "_closing", "_ctimes", "_decoded", "_dedup", "_dedup_armed", "_dedup_store", "_drain",
                 "_first_time_ms", "_hold_over", "_hold_timer", "_idle",
                 "_index", "_inflight", "_known", "_last_index", "_ledger_slots", "_lock_", "_needs_arm",
                 "_pump_soon", "_pumping", "_queue", "_queued_bytes", "_ranges_wire", "_readers",
                 "_since_snapshot", "_sizes",
                 "_slow", "_start_error", "_start_failures", "_start_not_before", "_tasks", "_version", "bk",
                 "closed", "conf", "entries_in_ledger", "gate", "hold", "last_seq", "last_write_ms", "lh",
                 "on_persisted", "owned", "pm", "topic")

    def __init__(self, topic: bytes, bk: BookKeeper, pm: TopicPersistenceManager, conf: HubConf,
                 on_persisted: Persisted | None = None,
                 dedup_store: TopicDedupManager | None = None, owned: Callable[[], bool] | None = None,
                 ledger_slots: asyncio.Semaphore | None = None) -> None:
        self.topic = topic
        self.bk = bk
        self.pm = pm
        self.conf = conf
        self.on_persisted = on_persisted
        self._ranges_wire = b""           # the topic's LedgerRanges, serialized (``ranges``)
        self._version: KeptVersion = Version.NEW   # the ranges' version (``version``), kept as an int
        self.last_seq = 0                 # last acknowledged seq id
        self.lh: LedgerHandle | None = None   # current ledger (writer handle)
        self.entries_in_ledger = 0
        self._first_time_ms = 0           # the current ledger's first message's publish time (0: none yet)
        self._index: dict[int, EntryIndex] = IDLE_DICT   # earlier ledgers we wrote: first seq id of every entry
        self._last_index: EntryIndex | None = None   # the last ledger we started: its index (and id)
        self._decoded: tuple[tuple[int, int], list[pb.Message]] = NOTHING_DECODED  # last entry read, decoded
        self._known: dict[int, list[tuple[int, int]]] = IDLE_DICT  # other ledgers: sorted (first seq id, entry id) read
        self._readers: dict[int, LedgerHandle] = IDLE_DICT  # read-only handles on ledgers that are not current
        self._closing: LedgerHandle | None = None   # the writer handle being closed (reads go through it meanwhile)
        self._queue: collections.deque[tuple[Queued, Done, bytes | None]] = IDLE   # a deque of its own once used
        self._queued_bytes = 0
        self._inflight: collections.deque[InflightAdd] = IDLE   # sent, in entry order
        self._pump_soon = False           # a _pump is scheduled for the end of this loop turn
        self._hold_timer: asyncio.TimerHandle | None = None   # batch_flush_delay_ms bound on the queue's hold
        self._hold_over = False           # the bound passed: what queued goes out without waiting for an add
        self._pumping = False             # a _pump is running (an add settled inside it waits for it)
        self._slow: asyncio.Task[None] | None = None      # a ledger roll or a failed add being handled
        self._drain: asyncio.Future[None] | None = None   # _add_failed waits for the adds in flight
        self._idle: list[asyncio.Future[None]] | None = None   # _drained waits for the queue to empty
        self._lock_ = None   # ledger changes (roll, delete) one at a time: only while one runs (``_lock``)
        self._start_failures = 0          # ledgers that could not be started (or failed empty) in a row
        self._start_not_before = 0.0      # loop time before which no new ledger is tried
        self._start_error: BaseException | None = None
        self._dedup: ProducerDedup | None = None   # built by the first producer message (``dedup``)
        self._dedup_store = dedup_store          # hub.metadata.TopicDedupManager (None: in memory only)
        self._dedup_armed = dedup_store is None  # the topic's topic_dedup record exists
        self._needs_arm = False
        self._since_snapshot = 0
        self._tasks: set[asyncio.Task[Any]] | None = None   # dedup snapshot writes (a set once one starts)
        self.closed = False
        self.owned = owned                # False once this hub may have lost the topic (its metastore session)
        self._broken: str | None = None   # why this log may write no more ledger ranges (see _give_up)
        self._ledger_slots = ledger_slots  # the hub's bound on ledgers started at once (max_concurrent_topic_loads)
        self._init_usage()                # sizes and times of the ledgers (hub.log_usage)
        self.gate: Gate | None = None     # the backlog quota (hub.lifecycle): the object, not bound methods
        self.hold: LedgerHold | None = None   # compaction's hold on ledgers (hub.compaction)

    @property
    def ranges(self) -> pb.LedgerRanges:
        """The topic's ``LedgerRanges`` as this owner last read or wrote them, parsed anew at each read.

        Kept serialized (about 60 bytes for one range): a parsed protobuf
        message holds about 550 bytes of its own for as long as the topic is
        owned, and a hub owns thousands of idle topics (issue 34). What this
        returns is therefore a copy: changing it changes nothing until it is
        assigned back (``log.ranges = changed``), as every range write does
        after its CAS. The metastore record is the same ``LedgerRanges``.
        """
        return pb.LedgerRanges.FromString(self._ranges_wire)

    @ranges.setter
    def ranges(self, value: pb.LedgerRanges) -> None:
        self._ranges_wire = value.SerializeToString()

    version = VersionSlot()
    """The version of the topic's ranges this owner read or last wrote (the CAS of its next write)."""

    def last_seq_now(self) -> int:
        """``last_seq`` as a method (``hub.subscriptions.LogPosition``): subscriptions keep the log, not a
        callable of 64 to 200 bytes a topic (issue 34)."""
        return self.last_seq

    @property
    def dedup(self) -> ProducerDedup:
        """The topic's producer deduplication state (``hub.dedup``), built when first needed."""
        dedup = self._dedup
        if dedup is None:
            dedup = self._dedup = ProducerDedup(self.conf.dedup_window, self.conf.dedup_max_producers)
        return dedup

    # --- acquisition ----------------------------------------------------------------------------
    @classmethod
    async def acquire(cls, topic: bytes, bk: BookKeeper, pm: TopicPersistenceManager, conf: HubConf,
                      on_persisted: Persisted | None = None,
                      dedup_store: TopicDedupManager | None = None,
                      owned: Callable[[], bool] | None = None,
                      ledger_slots: asyncio.Semaphore | None = None, start_ledger: bool = False) -> TopicLog:
        """Recover every range left open and the dedup state; ``BadVersionError`` if raced.

        ``owned`` (the ownership claim's liveness: the hub's metastore session)
        is asked before every new ledger and every entry sent: once it says
        False the log gives the topic up (see "Fencing" in the module docstring).
        ``ledger_slots`` (the hub's, shared by its topics) bounds the new
        ledgers being started at once: a start waits for a slot.
        ``start_ledger`` (an acquisition for a publish): the new ledger is
        started here, its range written with the recovered ends in the one
        compare-and-set that records them (a takeover: one metastore write and
        one task a topic fewer, issue 34); when it cannot be started the ends
        are written alone and the first publish starts it, as without.
        """
        self = cls(topic, bk, pm, conf, on_persisted, dedup_store, owned, ledger_slots)
        got = await pm.read_topic_persistence_info(topic)
        if got is not None:
            self.ranges, self.version = got
        empty = await self._recover_open_ranges()
        rs = self.ranges.ranges
        if rs:
            self.last_seq = rs[-1].endSeqIdIncluded.localComponent
        started = start_ledger and await self._start_first_ledger()
        if got is not None and not started:   # record the recovered ends (and fence a racing owner) before anyone reads
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

    async def _start_first_ledger(self) -> bool:
        """``acquire``'s new ledger, its range written on the version read (the recovered ends with it);
        False when no ledger could be created (nothing was written: the caller writes the ends alone). A
        failed or refused range write (the log gave the topic up) raises, as the ends' own write would."""
        try:
            await self._new_ledger()
        except Exception as exc:
            if self._broken is not None:
                raise
            # no ledger (too few bookies, say): the first publish tries again, backing off as it does
            log.info("topic %r: no ledger at acquisition: %s", self.topic, exc)
            return False
        return True

    async def _recover_open_ranges(self) -> list[int]:
        """Recovery-open (fence and close) every ledger whose range has no end; record the ends.

        Normally only the last range can be open; an earlier one is a previous
        owner that started a ledger without closing the one before (its close
        failed). Each is recovered, so nothing acknowledged is skipped: an end
        past the next range's start is cut there (the writer never acknowledged
        those entries: it started the next ledger after the last it had), an
        empty ledger is forgotten (its id returned, to be deleted).
        """
        ranges = self.ranges   # a copy (``ranges``): stored back below
        rs = ranges.ranges
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
        self.ranges = ranges
        return empty

    async def _recovered_end(self, r: pb.LedgerRange) -> int:
        """Open ``r``'s ledger with recovery (fencing its writer) and return its last seq id."""
        rh = await self.bk.open_ledger(r.ledgerId)
        end = r.startSeqIdIncluded - 1
        try:
            e = await rh.read_last_entry()   # recovery's copy: no second read
            if e is not None:
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

    def _may_write(self) -> None:
        """``ServiceDownError`` unless this log may open a ledger or send an entry (``_give_up``, ``owned``)."""
        if self._broken is None and self.owned is not None and not self.owned():
            self._give_up("this hub lost its metastore session (and with it the topic's ownership)")
        if self._broken is not None:
            raise errors.ServiceDownError(f"topic {self.topic!r}: not writable here ({self._broken}); retry")

    async def _new_ledger(self) -> None:
        if self._ledger_slots is None:
            await self._start_ledger()
            return
        async with self._ledger_slots:
            await self._start_ledger()

    async def _start_ledger(self) -> None:
        self._may_write()
        c = self.conf
        lh = await self.bk.create_ledger(ensemble=c.bk_ensemble_size, write_quorum=c.bk_write_quorum_size,
                                         ack_quorum=c.bk_ack_quorum_size,
                                         properties={"topic": self.topic})
        # serializations concatenate as a merge: the range is appended
        added = pb.LedgerRanges(ranges=[pb.LedgerRange(ledgerId=lh.ledger_id, startSeqIdIncluded=self.last_seq + 1)])
        ranges = pb.LedgerRanges.FromString(self._ranges_wire + added.SerializeToString())
        tried = False
        try:
            self._may_write()   # the create may have outlived the session
            tried = True
            self.version = await self._write_ranges(ranges)
        except BaseException as exc:
            await self._close_quietly(lh)
            # a write whose outcome is unknown (metastore down, cancelled) may have recorded the ledger:
            # the next owner recovers it (empty, closed), so it must stay; refused or rejected, it is nobody's
            if not tried or isinstance(exc, _REJECTED):
                await self._delete_ledger_quietly(lh.ledger_id)
            raise
        self.ranges = ranges
        self.lh = lh
        self._ledger_started(lh)
        self.entries_in_ledger = 0
        self._first_time_ms = 0
        last = self._last_index
        if last is not None:   # an earlier ledger of ours: its index goes in the table (``_index_of``)
            if self._index is IDLE_DICT:
                self._index = {}
            self._index[last.ledger_id] = last
        self._last_index = EntryIndex(lh.ledger_id)

    async def _write_ranges(self, ranges: pb.LedgerRanges) -> Version:
        """CAS ``ranges`` on the version this owner holds; any failure gives the topic up (``_give_up``)."""
        try:
            version: Version = await self.pm.write_topic_persistence_info(self.topic, ranges, self.version)
        except Exception as exc:
            self._give_up(f"writing its ledger ranges failed: {exc}")
            raise
        return version

    @staticmethod
    async def _close_quietly(lh: LedgerHandle) -> None:
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

    async def _record_close(self, lh: LedgerHandle) -> None:
        await lh.close()
        self._ledger_closed(lh)
        ranges = self.ranges   # a copy (``ranges``)
        cur = ranges.ranges[-1]
        if self.last_seq < cur.startSeqIdIncluded:
            del ranges.ranges[-1]
            self._forget_index(lh.ledger_id)
            drop = True
        else:
            cur.endSeqIdIncluded.localComponent = self.last_seq
            cur.firstPublishTimeMs = self._first_time_ms
            drop = False
        self._first_time_ms = 0
        self.version = await self._write_ranges(ranges)
        self.ranges = ranges
        if drop:
            await self._delete_ledger_quietly(lh.ledger_id)

    def _forget_index(self, ledger_id: int) -> None:
        """Drop the entry index of a ledger of ours (dropped or deleted)."""
        self._index.pop(ledger_id, None)
        if self._last_index is not None and self._last_index.ledger_id == ledger_id:
            self._last_index = None

    # --- what it holds ---------------------------------------------------------------------------
    def memory(self) -> dict[str, int]:
        """What this log holds in memory, for the hub's gauges (``hub.stats``).

        ``queued_messages``/``queued_bytes``: publishes waiting for an entry;
        ``adds_in_flight``/``messages_in_flight``: entries sent to the
        bookies, not yet acknowledged (at most ``max_outstanding_adds``);
        ``index_bytes``: the entry indexes of its ledgers (``hub.entry_index``,
        about a byte per entry, dropped with the ledger) and the entry starts
        known of a previous owner's ledgers (at most ``KNOWN_PER_LEDGER`` each);
        ``dedup_producers``/``dedup_entries``: its deduplication state
        (``hub.dedup``).
        """
        return {
            "queued_messages": len(self._queue), "queued_bytes": self._queued_bytes,
            "adds_in_flight": len(self._inflight), "messages_in_flight": sum(len(a.batch) for a in self._inflight),
            "index_bytes": (sum(i.nbytes for i in self._index.values())
                            + (self._last_index.nbytes if self._last_index is not None else 0)
                            + _KNOWN_BYTES * sum(len(k) for k in self._known.values())),
            "dedup_producers": self._dedup.producers if self._dedup is not None else 0,
            "dedup_entries": len(self._dedup) if self._dedup is not None else 0,
        }

    # --- consumed ledgers and release -----------------------------------------------------------
    async def delete_consumed(self, consumed: int, retain: Callable[[list[int]], list[int]] | None = None
                              ) -> list[int]:
        """Delete closed ledgers whose every message is at or below ``consumed``; their ids.

        ``retain`` (retention, ``hub.policies.retention_deletes``) gets the ids
        of those ledgers, oldest first, and returns the ones that may go.
        ``hold`` (compaction, ``hub.compaction``), when its ``keep_from()``
        answers a seq id, keeps every ledger holding it or a later one."""
        hold = self.hold.keep_from() if self.hold is not None else None
        if hold is not None:
            consumed = min(consumed, hold - 1)
        async with self._lock:
            cur = self.ranges   # a copy (``ranges``)
            gone = [r for r in cur.ranges[:-1]   # the last range keeps the topic's last seq id
                    if r.HasField("endSeqIdIncluded") and r.endSeqIdIncluded.localComponent <= consumed
                    and (self.lh is None or r.ledgerId != self.lh.ledger_id)]
            if retain is not None and gone:
                allowed = set(retain([r.ledgerId for r in gone]))
                gone = [r for r in gone if r.ledgerId in allowed]
            if not gone:
                return []
            ranges = pb.LedgerRanges()
            if cur.HasField("compaction"):
                ranges.compaction.CopyFrom(cur.compaction)
            ids = {r.ledgerId for r in gone}
            for r in cur.ranges:
                if r.ledgerId not in ids:
                    ranges.ranges.append(r)
            self.version = await self._write_ranges(ranges)
            self.ranges = ranges
            for lid in ids:
                self._forget_index(lid)
                self._known.pop(lid, None)
                rh = self._readers.pop(lid, None)
                if rh is not None:
                    await self._close_quietly(rh)
                self._forget_usage(lid)
                await self._delete_ledger_quietly(lid)
            return sorted(ids)

    async def write_compaction(self, state: pb.CompactionState) -> None:
        """Record the topic's compaction state with its ranges (CAS on the version this owner holds).

        ``ServiceDownError`` when this log may no longer write (a failure
        gives the topic up, as any range write's: ``_write_ranges``)."""
        async with self._lock:
            self._may_write()
            ranges = self.ranges   # a copy (``ranges``)
            ranges.compaction.CopyFrom(state)
            self.version = await self._write_ranges(ranges)
            self.ranges = ranges

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
