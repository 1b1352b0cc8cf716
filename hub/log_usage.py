"""What a topic's log holds: bytes per ledger, bytes behind a consume pointer, when each ledger was written.

    await log.learn_usage()              # sizes and times of ledgers another owner wrote (ledger metadata)
    log.storage_bytes()                  # every ledger the topic keeps
    log.bytes_after(seq)                 # the messages after seq (a backlog)
    log.consumed_ledgers(seq)            # closed ledgers wholly at or below seq, oldest first (retention)
    log.written_through()                # [(last seq id, when stored, ms)] per ledger (TTL)

``LogUsage`` is a part of ``hub.persistence.TopicLog`` (a mixin, like
``hub.batcher`` and ``hub.log_reader``). A ledger's size is its length in
bytes (its entries, as the bookies store them): the writer's for the ledger
being written, the metadata's once closed. Within a ledger, bytes are
shared out in proportion of seq ids (exact when messages are of one size);
so a backlog is known without reading a message.

When a ledger was written (ledger-level time, the policies' clock): every
message of a closed ledger was stored before the next ledger was created
(the log rolls: close, then create), so its time is the next ledger's
``ctime_ms``; the last ledger's is the owner's last acknowledged add (after
an acquisition, the acquisition: a new owner cannot know better without
reading). Retention by time is therefore approximate, by up to one ledger's
span; message TTL uses this for whole ledgers and the messages' own publish
times within the one ledger partly expired (``hub.lifecycle``).

Failure: ``learn_usage`` logs a metastore or bookie failure and leaves the
ledger unknown; a size not known counts as 0 and a consumed ledger whose
size or time is not known is kept (``consumed_ledgers`` stops there).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hub.proto import pubsub_pb2 as pb
from metastore.idle import IDLE_DICT

if TYPE_CHECKING:
    from bookie.client import BookKeeper
    from bookie.ledger import LedgerHandle

log = logging.getLogger("hub.persistence")

__all__ = ["LedgerUsage", "LogUsage", "bytes_after"]


def _now_ms() -> int:
    return int(time.time() * 1000)


def bytes_after(ledgers: Iterable[tuple[int, int, int]], seq: int) -> int:
    """Bytes of the messages after ``seq`` in ``(first seq id, last seq id, bytes)`` ledgers.

    A ledger holding ``seq`` counts in proportion of its seq ids after it."""
    total = 0
    for start, end, size in ledgers:
        if end <= seq or end < start:
            continue
        total += size if start > seq else size * (end - seq) // (end - start + 1)
    return total


@dataclass(frozen=True)
class LedgerUsage:
    """One closed ledger for retention (``hub.policies.ConsumedLedger``)."""

    ledger_id: int
    size_bytes: int
    closed_ms: int


class LogUsage:
    """Sizes and times of a topic log's ledgers (see the module docstring); a mixin of ``TopicLog``."""

    if not TYPE_CHECKING:    # the state is TopicLog's slots (mypy checks it through the annotations below)
        __slots__ = ()

    # the log's state this uses (set by TopicLog.__init__)
    topic: bytes
    bk: BookKeeper
    ranges: pb.LedgerRanges
    last_seq: int
    lh: LedgerHandle | None
    _closing: LedgerHandle | None

    def _init_usage(self) -> None:
        # a dict of their own from the first ledger closed or learnt (an idle topic with one ledger holds none)
        self._sizes: dict[int, int] = IDLE_DICT    # closed ledgers: length in bytes
        self._ctimes: dict[int, int] = IDLE_DICT   # ledgers but the writer's: created, epoch ms (``_ctime``)
        self.last_write_ms = _now_ms()         # the last acknowledged add (or the acquisition)

    def _ledger_started(self, lh: LedgerHandle) -> None:
        """Nothing to remember yet: the writer's creation time is its metadata's (``_ctime``)."""

    def _ledger_closed(self, lh: LedgerHandle) -> None:
        length = getattr(lh, "length", None)         # (a stand-in handle of a white-box test may have none;
        metadata = getattr(lh, "metadata", None)     # learn_usage reads them from the metadata then)
        if self._sizes is IDLE_DICT:
            self._sizes, self._ctimes = {}, dict(self._ctimes)
        if length is not None:
            self._sizes[lh.ledger_id] = int(length)
        if metadata is not None:
            self._ctimes[lh.ledger_id] = metadata.ctime_ms

    def _ctime(self, ledger_id: int) -> int | None:
        """When ``ledger_id`` was created (epoch ms), if known."""
        writer = self._writer_of(ledger_id)
        metadata = getattr(writer, "metadata", None) if writer is not None else None
        if metadata is not None:
            return int(metadata.ctime_ms)
        return self._ctimes.get(ledger_id)

    def _forget_usage(self, ledger_id: int) -> None:
        self._sizes.pop(ledger_id, None)
        self._ctimes.pop(ledger_id, None)

    async def learn_usage(self) -> None:
        """Read the metadata of the kept ledgers whose size or creation time is not known yet."""
        for r in list(self.ranges.ranges):
            lid = r.ledgerId
            if self._ctime(lid) is not None and (lid in self._sizes or self._writer_of(lid) is not None):
                continue
            try:
                md, _ = await self.bk.ledgers.read(lid)
            except Exception as exc:   # a bookie or metastore failure: retried at the next round
                log.info("topic %r: cannot read the metadata of ledger %d: %s", self.topic, lid, exc)
                continue
            if self._sizes is IDLE_DICT:
                self._sizes, self._ctimes = {}, dict(self._ctimes)
            self._ctimes.setdefault(lid, md.ctime_ms)
            if md.is_closed and self._writer_of(lid) is None:
                self._sizes[lid] = md.length

    def _writer_of(self, ledger_id: int) -> LedgerHandle | None:
        for writer in (self.lh, self._closing):
            if writer is not None and writer.ledger_id == ledger_id:
                return writer
        return None

    def _size(self, ledger_id: int) -> int:
        writer = self._writer_of(ledger_id)
        if writer is not None:
            return int(writer.length)
        return self._sizes.get(ledger_id, 0)

    def _end(self, r: pb.LedgerRange) -> int:
        return int(r.endSeqIdIncluded.localComponent if r.HasField("endSeqIdIncluded") else self.last_seq)

    def storage_bytes(self) -> int:
        """Bytes of every ledger the topic keeps (those not known yet count 0)."""
        return sum(self._size(r.ledgerId) for r in self.ranges.ranges)

    def bytes_after(self, seq: int) -> int:
        """Bytes of the messages after ``seq`` (in proportion of seq ids within a ledger)."""
        return bytes_after([(int(r.startSeqIdIncluded), self._end(r), self._size(r.ledgerId))
                            for r in self.ranges.ranges], seq)

    def consumed_ledgers(self, consumed: int) -> list[LedgerUsage]:
        """Closed ledgers (not the last) wholly at or below ``consumed``, oldest first, with size and time.

        Stops at the first whose size or time is not known (it and the newer
        ones are kept this round)."""
        rs = self.ranges.ranges
        out = []
        for i, r in enumerate(rs[:-1]):
            if not r.HasField("endSeqIdIncluded") or r.endSeqIdIncluded.localComponent > consumed:
                break
            closed = self._ctime(rs[i + 1].ledgerId)
            if r.ledgerId not in self._sizes or closed is None:
                break
            out.append(LedgerUsage(r.ledgerId, self._sizes[r.ledgerId], closed))
        return out

    def written_through(self) -> list[tuple[int, int]]:
        """``(last seq id, when its ledger was last written, epoch ms)`` per ledger, oldest first.

        Ledgers whose time is not known are left out (their messages do not expire this round)."""
        rs = self.ranges.ranges
        out = []
        for i, r in enumerate(rs):
            end = self._end(r)
            if end < r.startSeqIdIncluded:
                continue
            if i + 1 < len(rs):
                when = self._ctime(rs[i + 1].ledgerId)
                if when is None:
                    continue
            else:
                when = self.last_write_ms
            out.append((end, when))
        return out
