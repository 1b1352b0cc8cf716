"""The read path of a topic's log: seq id -> ledger range -> entry -> messages.

    msgs = await topic_log.scan(start_seq, max_messages, max_bytes)   # hub.persistence.TopicLog
    decode_batch(entry_data)                     # the messages of one ledger entry, seq ids set

``LogReader`` is the reading half of ``hub.persistence.TopicLog`` (a mixin:
the state it reads, ranges, handles and indexes, belongs to the log).
Reads of the current ledger, and of one being closed, go through its
writer (its LAC follows the acknowledgements). Other ledgers are read
through cached read handles; a handle opened while its ledger was still
open (its LAC one entry short: the last entry's LAC travels with the next
add or the close) is replaced by one on the closed metadata once the range
records its end, and is reopened when a scan needs an entry past its LAC.
The entry holding a seq id comes from the log's own index for ledgers this
owner wrote, else from a binary search by reads that every read narrows.

Failure: a seq id whose ledger was deleted raises
``NoTopicPersistenceInfoError`` (when nothing was read yet); ledger read
errors (``bookie.errors.BKError``) propagate.
"""

from __future__ import annotations

import bisect
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from hub import errors
from hub.conf import HubConf
from hub.entry_index import EntryIndex
from hub.message import Message
from hub.proto import pubsub_pb2 as pb
from metastore.idle import IDLE_DICT

if TYPE_CHECKING:
    from bookie.client import BookKeeper
    from bookie.ledger import LedgerHandle

__all__ = ["KNOWN_PER_LEDGER", "NOTHING_DECODED", "LogReader", "decode_batch"]

KNOWN_PER_LEDGER = 1024
"""Entry starts remembered per ledger of a previous owner (``LogReader._learn``): about 120 bytes each."""


async def _one(batch: list[pb.Message]) -> AsyncIterator[list[pb.Message]]:
    yield batch


def decode_batch(data: bytes) -> list[pb.Message]:
    """The messages of one ledger entry, each with its local seq id set."""
    batch = pb.MessageBatch.FromString(data)
    first = batch.first_local_seq_id
    for i, m in enumerate(batch.messages):
        m.msgId.localComponent = first + i
    return list(batch.messages)


NOTHING_DECODED: tuple[tuple[int, int], list[pb.Message]] = ((-1, -1), [])
"""``LogReader._decoded`` before any entry was read (shared: never changed)."""


class LogReader:
    """The read path of ``hub.persistence.TopicLog`` (see the module docstring)."""

    if not TYPE_CHECKING:    # the state is TopicLog's slots (mypy checks it through the annotations below)
        __slots__ = ()

    # the log's state this reads (set by TopicLog.__init__)
    topic: bytes
    conf: HubConf
    bk: BookKeeper
    ranges: pb.LedgerRanges
    last_seq: int
    lh: LedgerHandle | None
    _closing: LedgerHandle | None
    _readers: dict[int, LedgerHandle]
    _index: dict[int, EntryIndex]
    _last_index: EntryIndex | None
    _known: dict[int, list[tuple[int, int]]]
    _decoded: tuple[tuple[int, int], list[pb.Message]]

    if TYPE_CHECKING:
        @staticmethod
        async def _close_quietly(lh: LedgerHandle) -> None: ...

    def _index_of(self, ledger_id: int) -> EntryIndex | None:
        """The entry index of a ledger this owner wrote (None for others).

        The last ledger it started keeps its index in a slot of its own
        (``_last_index``), the earlier ones in ``_index``: an idle topic,
        which has written one ledger, holds no table (issue 34).
        """
        last = self._last_index
        if last is not None and last.ledger_id == ledger_id:
            return last
        return self._index.get(ledger_id)

    # --- reading --------------------------------------------------------------------------------
    def first_kept(self) -> int:
        """The oldest seq id still stored (the ledgers before it were deleted); ``last_seq + 1`` when none."""
        rs = self.ranges.ranges
        if not rs:
            return int(self.last_seq) + 1
        return max(1, int(rs[0].startSeqIdIncluded))

    def _range_for(self, seq: int) -> pb.LedgerRange | None:
        for r in self.ranges.ranges:
            end = r.endSeqIdIncluded.localComponent if r.HasField("endSeqIdIncluded") else self.last_seq
            if r.startSeqIdIncluded <= seq <= end:
                return r
        return None

    async def _reader(self, r: pb.LedgerRange, *, reopen: bool = False) -> LedgerHandle:
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
            if self._readers is IDLE_DICT:
                self._readers = {}
            self._readers[lid] = rh
        return rh

    def _may_be_short(self, rh: LedgerHandle) -> bool:
        """``rh`` is a reader whose LAC may lag its ledger (not a writer's, not on closed metadata)."""
        return rh is not self.lh and rh is not self._closing and not rh.is_closed

    def _learn(self, ledger_id: int, entry_id: int, first_seq: int) -> None:
        """Remember where an entry of a ledger we did not write starts (narrows later searches).

        At most ``KNOWN_PER_LEDGER`` entries per ledger: past that every
        second one is forgotten (searches stay bounded, a little wider), so a
        reader going through a previous owner's long ledger does not make the
        hub keep something per entry.
        """
        if self._index_of(ledger_id) is not None:
            return
        if self._known is IDLE_DICT:
            self._known = {}
        known = self._known.setdefault(ledger_id, [])
        i = bisect.bisect_left(known, (first_seq, entry_id))
        if i == len(known) or known[i] != (first_seq, entry_id):
            known.insert(i, (first_seq, entry_id))
            if len(known) > KNOWN_PER_LEDGER:
                del known[1::2]

    async def _entry_of(self, rh: LedgerHandle, seq: int) -> int:
        """The entry id of ``rh`` holding ``seq``: our own index, else a binary search by reads.

        Ledgers this owner wrote have a complete in-memory index; for a
        previous owner's ledgers, every entry read so far bounds the search,
        so a sequential reader costs about one extra read per scan.
        """
        idx = self._index_of(rh.ledger_id)
        if idx is not None:
            return idx.entry_of(seq)
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

    async def _read_decoded(self, rh: LedgerHandle, first: int, last: int) -> AsyncIterator[list[pb.Message]]:
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
        idx = self._index_of(ledger_id)
        if idx is not None:
            return max(entry, idx.entry_of(last_seq))
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
