"""Topic compaction (Pulsar's ``TwoPhaseCompactor`` and ``CompactedTopic``): the newest message per key.

    c = TopicCompaction(topic_log)          # one per owned topic (``hub.topic.Topic.compaction``)
    task = c.start()                        # a run (or the one already running); awaits to an error or None
    c.status()                              # JSON: status, ledger_id, compacted_up_to_seq_id, last_run_ms, ...
    msgs, point = await c.read(seq, 100, 1 << 20)   # a compacted reader's page (``hub.seek``, SEEK readCompacted)
    await c.housekeep(threshold_bytes)      # the consumed-ledger timer: leftovers, compaction_threshold_bytes

A run takes the compaction point ``P`` = the topic's last seq id when it
starts and reads, in two passes (so only the keys and seq ids are held in
memory, never the bodies), what the previous compacted ledger holds and
then the topic's messages after the previous point up to ``P``. The first
pass finds the newest seq id of each key (an empty body deletes its key;
messages without a key are left out); the second writes those messages, in
seq-id order and unchanged (seq id, key, properties, publish time), into a
NEW ledger, batched (``ENTRY_MESSAGES`` per entry at most, each entry a
``MessageBatch`` whose messages carry their own ``msgId``). So a run is
incremental: the second run reads the first's ledger, not the whole topic.

Crash safety. The new ledger is recorded as ``pendingLedgerId`` in the
topic's ``LedgerRanges`` record (CAS on the owner's version:
``TopicLog.write_compaction``) before anything is written to it, and only
once it is complete and closed does a second CAS make it the topic's
``ledgerId`` with ``compactedUpToSeqId = P``; only then do readers use it,
and only then is the previous compacted ledger deleted. A run cut short (a
failure, a release of the topic, a ``kill -9`` of the owner) leaves at most
a pending ledger, which is never read: the next run, or the next
housekeeping round of whichever hub owns the topic then, deletes it. (A
crash between creating the ledger and recording it as pending leaves an
unrecorded ledger with the ledger property ``compacted_topic``; Pulsar has
the same window.)

What it keeps from deletion (Pulsar keeps a ``__compaction`` subscription;
Quire holds without one): while a run reads, the ledgers from its first
seq id on are kept (``TopicLog.hold``). Between runs nothing is held
unless ``compaction_threshold_bytes`` > 0: then the ledgers after the
compaction point are kept for the next automatic run, but only while they
hold at most ``HOLD_FACTOR`` times the threshold, so a compactor that
cannot run (no bookies) never makes the topic grow for ever. Without a
threshold, consumed ledgers go as before; a later run then starts at the
oldest kept message and logs the seq ids it never saw.

Reading: ``read`` answers the messages of the compacted ledger from a seq
id on (a binary search by entry, then sequential; a sequential reader's
next page resumes where the last stopped) with the compaction point.

Failure: a failed run is logged and kept as ``last_error`` (its ledger is
deleted, or left pending for the next run); ``start`` never raises. A
compacted ledger replaced during a read is read again from the new one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from bookie.errors import BKError, NoSuchLedgerError
from hub import errors
from hub.message import Message
from hub.proto import pubsub_pb2 as pb
from metastore.idle import IDLE_DICT

if TYPE_CHECKING:
    from bookie.ledger import LedgerHandle
    from hub.persistence import TopicLog

__all__ = ["ENTRIES_AT_ONCE", "ENTRY_BYTES", "ENTRY_MESSAGES", "HOLD_FACTOR", "PAUSE_FILE_ENV", "TopicCompaction",
           "compaction_ledgers", "state_json"]

log = logging.getLogger(__name__)

ENTRY_MESSAGES = 100
"""Most messages in one entry of a compacted ledger."""
ENTRY_BYTES = 1 << 20
"""Most bytes of bodies in one entry of a compacted ledger (one larger message makes an entry of its own)."""
ENTRIES_AT_ONCE = 16
"""Entries of a compacted ledger sent together (pipelined) by a run."""
HOLD_FACTOR = 4
"""With ``compaction_threshold_bytes`` set, ledgers after the compaction point are kept from deletion while they
hold at most this many times the threshold."""
SCAN_MESSAGES = 1000
PAUSE_FILE_ENV = "QUIRE_COMPACTION_PAUSE_FILE"
"""Test hook: while the file this names exists, a run pauses after its first entry (``status()["paused"]``)."""


def state_json(state: pb.CompactionState) -> dict[str, Any]:
    """The recorded part of a topic's compaction, as the admin API and the console show it."""
    return {"ledger_id": int(state.ledgerId) or None, "compacted_up_to_seq_id": int(state.compactedUpToSeqId),
            "last_run_ms": int(state.lastRunMs) or None, "messages": int(state.messages),
            "pending_ledger_id": int(state.pendingLedgerId) or None}


def compaction_ledgers(ranges: pb.LedgerRanges) -> list[int]:
    """The compacted ledgers a topic's record names (its compacted and its pending one): a topic delete's too."""
    st = ranges.compaction
    return [int(lid) for lid in (st.ledgerId, st.pendingLedgerId) if lid]


class TopicCompaction:
    """One owned topic's compaction: runs, their status, the compacted ledger's reads (module docstring).

    Slots: every owned topic has one (issue 34)."""

    __slots__ = ("_reading_from", "_resume", "_upto", "entries_written", "last_error", "log", "on_done", "paused",
                 "task", "threshold")

    def __init__(self, topic_log: TopicLog) -> None:
        self.log = topic_log
        self.task: asyncio.Task[BaseException | None] | None = None
        self.last_error: str | None = None
        self.threshold = 0                    # compaction_threshold_bytes, as the timer last saw it
        self.entries_written = 0              # by the run in progress
        self.paused = False                   # the test hook holds the run in progress
        self._upto = 0                        # the run in progress: its compaction point
        self._reading_from: int | None = None   # the run in progress: the first seq id it reads from the log
        self._resume: tuple[int, int, int] = (0, 0, 0)   # (ledger, next seq id, its entry) of the last page
        self.on_done: Callable[[str], None] | None = None   # "succeeded" / "failed" per run (the hub's counters)
        topic_log.hold = self                 # its ``keep_from`` holds ledgers from deletion

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    # --- status -----------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """``status`` (``running``/``idle``), the recorded state (``state_json``), ``last_error`` and, while
        running, ``running_up_to_seq_id``, ``entries_written`` and ``paused``."""
        out = {"status": "running" if self.running else "idle", **state_json(self.log.ranges.compaction),
               "last_error": self.last_error}
        if self.running:
            out.update(running_up_to_seq_id=self._upto, entries_written=self.entries_written, paused=self.paused)
        return out

    def keep_from(self) -> int | None:
        """The first seq id whose ledgers consumed-ledger deletion must keep (None: no hold; module docstring)."""
        if self._reading_from is not None:
            return self._reading_from
        if self.threshold <= 0:
            return None
        point = int(self.log.ranges.compaction.compactedUpToSeqId)
        if self.log.bytes_after(point) > HOLD_FACTOR * self.threshold:
            return None      # far behind: consumed ledgers go (the next run logs what it never saw)
        return point + 1

    # --- runs -------------------------------------------------------------------------------------
    def start(self) -> asyncio.Task[BaseException | None]:
        """The run in progress, else a new one; its task ends with the run's error or None (never raises)."""
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._guarded(),
                                                               name=f"compaction {self.log.topic!r}")
        return self.task

    async def _guarded(self) -> BaseException | None:
        try:
            await self._run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.last_error = str(exc) or type(exc).__name__
            log.warning("topic %r: compaction failed: %s", self.log.topic, self.last_error)
            self._count("failed")
            return exc
        else:
            self.last_error = None
            self._count("succeeded")
            return None
        finally:
            self._reading_from = None
            self.paused = False
            self._upto = 0

    def _count(self, outcome: str) -> None:
        if self.on_done is not None:
            self.on_done(outcome)

    def _check(self) -> None:
        if self.log.closed:
            raise errors.ServiceDownError(f"topic {self.log.topic!r} was released during its compaction")

    async def _run(self) -> None:
        tlog = self.log
        await self._collect_pending()
        prev = pb.CompactionState()
        prev.CopyFrom(tlog.ranges.compaction)
        upto = int(tlog.last_seq)
        if upto <= prev.compactedUpToSeqId:
            log.info("topic %r: nothing to compact after seq id %d", tlog.topic, prev.compactedUpToSeqId)
            return
        self._upto = upto
        first = max(int(prev.compactedUpToSeqId) + 1, tlog.first_kept())
        self._reading_from = first
        if first > prev.compactedUpToSeqId + 1:
            log.warning("topic %r: seq ids %d..%d were deleted before they were compacted", tlog.topic,
                        prev.compactedUpToSeqId + 1, first - 1)
        t0 = time.monotonic()
        latest: dict[bytes, int] = {}          # phase one: the newest seq id of each key
        read = 0
        async for m in self._messages(prev, first, upto):
            read += 1
            if m.key is None:
                continue
            if m.body:
                latest[m.key] = m.seq_id
            else:
                latest.pop(m.key, None)
        keep = set(latest.values())
        del latest
        lh = await tlog.bk.create_ledger(ensemble=tlog.conf.bk_ensemble_size,
                                         write_quorum=tlog.conf.bk_write_quorum_size,
                                         ack_quorum=tlog.conf.bk_ack_quorum_size,
                                         properties={"compacted_topic": tlog.topic,
                                                     "compacted_up_to": str(upto).encode()})
        log.info("topic %r: compacting %d messages up to seq id %d: %d keys kept, into ledger %d", tlog.topic,
                 read, upto, len(keep), lh.ledger_id)
        pending = pb.CompactionState()
        pending.CopyFrom(prev)
        pending.pendingLedgerId = lh.ledger_id
        recorded = finishing = False
        try:
            self._check()
            await tlog.write_compaction(pending)
            recorded = True
            await self._write(lh, self._messages(prev, first, upto), keep)
            await lh.close()
            self._check()
            done = pb.CompactionState(ledgerId=lh.ledger_id, compactedUpToSeqId=upto,
                                      lastRunMs=int(time.time() * 1000), messages=len(keep))
            finishing = True
            await tlog.write_compaction(done)     # from here on readers use it
        except BaseException:
            # a failed last write may still have recorded it (its outcome unknown): it stays, and the record
            # says which it is (compacted, or pending for the next run to delete)
            if not finishing:
                await self._abandon(lh, recorded)
            raise
        log.info("topic %r: compacted up to seq id %d into ledger %d (%d messages) in %.2f s", tlog.topic, upto,
                 lh.ledger_id, len(keep), time.monotonic() - t0)
        if prev.ledgerId:
            await self._delete(int(prev.ledgerId))

    async def _write(self, lh: LedgerHandle, messages: AsyncIterator[Message], keep: set[int]) -> None:
        """Phase two: the kept messages, in seq-id order, batched into entries of ``lh`` (``ENTRIES_AT_ONCE``
        pipelined; the test hook sends the first entry alone and pauses after it)."""
        self.entries_written = 0
        batch = pb.MessageBatch()
        size = 0
        entries: list[bytes] = []
        pause = os.environ.get(PAUSE_FILE_ENV, "")

        async def send() -> None:
            nonlocal pause
            await lh.add_entries(entries)
            self.entries_written += len(entries)
            entries.clear()
            if pause and os.path.exists(pause):
                await self._paused(lh, pause)
            pause = ""

        async def flush() -> None:
            nonlocal batch, size
            if batch.messages:
                batch.first_local_seq_id = batch.messages[0].msgId.localComponent
                entries.append(batch.SerializeToString())
                batch, size = pb.MessageBatch(), 0
                if len(entries) >= (1 if pause else ENTRIES_AT_ONCE):
                    await send()

        async for m in messages:
            if m.seq_id not in keep:
                continue
            if len(batch.messages) >= ENTRY_MESSAGES or (batch.messages and size + len(m.body) > ENTRY_BYTES):
                await flush()
            batch.messages.append(pb.Message.FromString(m.wire))
            size += len(m.body)
        await flush()
        if entries:
            await send()

    async def _paused(self, lh: LedgerHandle, path: str) -> None:
        self.paused = True
        log.warning("topic %r: compaction paused (test hook %s) with ledger %d half written", self.log.topic,
                    PAUSE_FILE_ENV, lh.ledger_id)
        while os.path.exists(path):   # noqa: ASYNC110 - a file of another process: nothing to await
            await asyncio.sleep(0.05)
        self.paused = False

    async def _abandon(self, lh: LedgerHandle, recorded: bool) -> None:
        """A run failed with ``lh`` written: delete it, and clear it as pending if this log still may."""
        try:
            await lh.close()
        except BKError:
            pass
        await self._delete(lh.ledger_id)
        if recorded and not self.log.closed:
            try:
                await self._clear_pending(lh.ledger_id)
            except Exception as exc:   # it stays pending: the next run deletes it again
                log.info("topic %r: cannot clear pending compacted ledger %d: %s", self.log.topic, lh.ledger_id,
                         exc)

    async def _messages(self, prev: pb.CompactionState, first: int, upto: int) -> AsyncIterator[Message]:
        """The previous compacted ledger's messages, then the topic's from ``first`` to ``upto``."""
        if prev.ledgerId:
            rh = await self.log.bk.open_ledger_no_recovery(int(prev.ledgerId))
            try:
                entry = 0
                while entry <= rh.last_add_confirmed:
                    self._check()
                    last = min(rh.last_add_confirmed, entry + 15)
                    async for e in rh.read(entry, last):
                        for pm in pb.MessageBatch.FromString(e.data).messages:
                            yield Message.from_proto(pm, keep_wire=True)
                    entry = last + 1
            finally:
                await _close_quietly(rh)
        seq = first
        while seq <= upto:
            self._check()
            msgs = await self.log.scan(seq, min(SCAN_MESSAGES, upto - seq + 1), 4 << 20)
            if not msgs:
                raise errors.ServiceDownError(f"topic {self.log.topic!r}: cannot read seq id {seq} to compact it")
            for m in msgs:
                if m.seq_id > upto:
                    return
                yield m
            seq = msgs[-1].seq_id + 1

    # --- leftovers --------------------------------------------------------------------------------
    async def _delete(self, ledger_id: int) -> None:
        rh = self.log._readers.pop(ledger_id, None)
        if rh is not None:
            await _close_quietly(rh)
        try:
            await self.log.bk.delete_ledger(ledger_id)
        except NoSuchLedgerError:
            pass
        except BKError as exc:
            log.info("topic %r: could not delete compacted ledger %d: %s", self.log.topic, ledger_id, exc)

    async def _clear_pending(self, ledger_id: int) -> None:
        st = pb.CompactionState()
        st.CopyFrom(self.log.ranges.compaction)
        if st.pendingLedgerId == ledger_id:
            st.pendingLedgerId = 0
            await self.log.write_compaction(st)

    async def _collect_pending(self) -> None:
        """Delete a compacted ledger a run cut short left pending (never read), and forget it."""
        lid = int(self.log.ranges.compaction.pendingLedgerId)
        if not lid:
            return
        await self._delete(lid)
        await self._clear_pending(lid)
        log.info("topic %r: deleted compacted ledger %d, left half written by a compaction cut short",
                 self.log.topic, lid)

    async def housekeep(self, threshold: int, track: Callable[[asyncio.Task[Any]], None] | None = None) -> None:
        """One round of the consumed-ledger timer: note ``threshold``, delete a pending ledger left behind,
        start a run when the bytes after the compaction point exceed ``threshold`` (> 0)."""
        self.threshold = threshold
        if self.running or self.log.closed:
            return
        try:
            await self._collect_pending()
        except Exception as exc:
            log.info("topic %r: cannot delete a pending compacted ledger yet: %s", self.log.topic, exc)
            return
        if threshold <= 0:
            return
        await self.log.learn_usage()
        point = int(self.log.ranges.compaction.compactedUpToSeqId)
        behind = self.log.bytes_after(point)
        if behind > threshold:
            log.info("topic %r: %d bytes after compaction point %d exceed compaction_threshold_bytes %d: "
                     "compacting", self.log.topic, behind, point, threshold)
            task = self.start()
            if track is not None:
                track(task)

    # --- reading ----------------------------------------------------------------------------------
    async def read(self, start: int, max_messages: int, max_bytes: int) -> tuple[list[pb.Message], int]:
        """Messages of the compacted ledger from seq id ``start`` on (at most ``max_messages``, about
        ``max_bytes``; at least one if any) and the compaction point they stand for."""
        for attempt in (1, 2):
            st = self.log.ranges.compaction
            point = int(st.compactedUpToSeqId)
            if not st.ledgerId or start > point:
                return [], point
            lid = int(st.ledgerId)
            try:
                return await self._read(lid, start, max_messages, max_bytes), point
            except BKError:
                if attempt == 2 or self.log.ranges.compaction.ledgerId == lid:
                    raise
                # a newer compaction replaced (and deleted) it meanwhile: read that one
        raise AssertionError("unreachable")

    async def _handle(self, ledger_id: int) -> LedgerHandle:
        """A read handle on the compacted ledger, kept with the log's (``TopicLog.release`` closes them)."""
        rh = self.log._readers.get(ledger_id)
        if rh is None:
            rh = await self.log.bk.open_ledger_no_recovery(ledger_id)
            if self.log._readers is IDLE_DICT:
                self.log._readers = {}
            readers = self.log._readers
            if ledger_id in readers:      # another read opened it meanwhile: keep one
                await _close_quietly(rh)
                return readers[ledger_id]
            readers[ledger_id] = rh
        return rh

    async def _entry_of(self, rh: LedgerHandle, seq: int) -> int:
        """The last entry whose first seq id is at or below ``seq`` (binary search by reads)."""
        lo, hi = 0, rh.last_add_confirmed
        while lo < hi:
            mid = (lo + hi + 1) // 2
            first = pb.MessageBatch.FromString((await rh.read_entry(mid)).data).first_local_seq_id
            if first <= seq:
                lo = mid
            else:
                hi = mid - 1
        return lo

    async def _read(self, ledger_id: int, start: int, max_messages: int, max_bytes: int) -> list[pb.Message]:
        rh = await self._handle(ledger_id)
        last = rh.last_add_confirmed
        if last < 0:
            return []
        lid, seq, entry = self._resume
        if (lid, seq) != (ledger_id, start):
            entry = await self._entry_of(rh, start)
        out: list[pb.Message] = []
        size = 0
        while entry <= last:
            async for e in rh.read(entry, min(last, entry + 7)):
                for m in pb.MessageBatch.FromString(e.data).messages:
                    if m.msgId.localComponent < start:
                        continue
                    if len(out) >= max_messages or (out and size + len(m.body) > max_bytes):
                        self._resume = (ledger_id, int(m.msgId.localComponent), e.entry_id)
                        return out
                    out.append(m)
                    size += len(m.body)
                entry = e.entry_id + 1
        self._resume = (0, 0, 0)
        return out


async def _close_quietly(rh: LedgerHandle) -> None:
    try:
        await rh.close()
    except BKError as exc:
        log.info("ledger %d: close failed: %s", rh.ledger_id, exc)
