"""Positions of a topic's log by seq id or by publish time: readers, seek and the admin reset.

    seq = await seq_for_time(topic_log, publish_time_ms)   # first message stored at or after the time
    check_seq(seq, last_seq, ranges)                        # ValueError unless delivery can start at seq

Finding a time does not read the whole topic: every closed ledger range
records its first message's publish time (``LedgerRange.firstPublishTimeMs``,
set when the ledger is closed). The ranges are binary-searched by it; a range
without it (the current ledger, or one recorded before the field existed)
costs one read of its first entry. Then one ledger is read from its start
until a message at or after the time. Publish times are the owner's clock,
taken as non-decreasing along the log. A time before the first retained
message gives that message; one after the last gives ``last_seq + 1`` (the
next message published).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from hub import errors
from hub.proto import pubsub_pb2 as pb

if TYPE_CHECKING:
    from hub.persistence import TopicLog
    from hub.readahead import ReadAheadCache
    from hub.topic import Topic

__all__ = ["check_seq", "seek", "seq_for_time"]

log = logging.getLogger(__name__)

_CHUNK = 256
_PAGE_BYTES = 1 << 20
"""About the most bytes of bodies one compacted reader's page carries (at least one message)."""


def check_seq(seq: int, last: int | None, ranges: pb.LedgerRanges) -> None:
    """``ValueError`` unless messages from ``seq`` on can be delivered: not past the end, not deleted.

    ``last`` is the topic's last seq id (None: unknown, not checked)."""
    if seq < 1:
        raise ValueError(f"seq_id {seq} must be >= 1")
    if last is not None and seq > last + 1:
        raise ValueError(f"seq_id {seq} is past the topic's next seq id {last + 1}")
    first = ranges.ranges[0].startSeqIdIncluded if ranges.ranges else 1
    if seq < first:
        raise ValueError(f"seq_id {seq} is gone (its ledger was deleted once consumed); the first kept is {first}")


async def _first_time(log_: TopicLog, r: pb.LedgerRange) -> int:
    if r.firstPublishTimeMs:
        return int(r.firstPublishTimeMs)
    msgs = await log_.scan(int(r.startSeqIdIncluded), 1, 1)
    return msgs[0].publish_time_ms if msgs else 0


async def seq_for_time(log_: TopicLog, publish_time_ms: int) -> int:
    """The seq id of the first message published at or after ``publish_time_ms`` (``last_seq + 1`` if none)."""
    if publish_time_ms < 0:
        raise ValueError(f"publish_time_ms {publish_time_ms} must be >= 0")
    last = int(log_.last_seq)
    rs = [r for r in log_.ranges.ranges if r.startSeqIdIncluded <= last]   # ranges holding messages
    if not rs:
        return last + 1
    lo, hi = 0, len(rs) - 1         # the last range whose first message is before the time
    if await _first_time(log_, rs[0]) >= publish_time_ms:
        return int(rs[0].startSeqIdIncluded)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if await _first_time(log_, rs[mid]) < publish_time_ms:
            lo = mid
        else:
            hi = mid - 1
    r = rs[lo]
    end = r.endSeqIdIncluded.localComponent if r.HasField("endSeqIdIncluded") else last
    seq = int(r.startSeqIdIncluded)
    while seq <= end:
        msgs = await log_.scan(seq, min(_CHUNK, end - seq + 1), 1 << 30)
        if not msgs:
            break
        for m in msgs:
            if m.publish_time_ms >= publish_time_ms:
                return m.seq_id
        seq = msgs[-1].seq_id + 1
    return int(end) + 1


async def seek(t: Topic, sub: bytes, req: pb.SeekRequest, cache: ReadAheadCache,
               out: pb.SeekResponse | None = None) -> int:
    """Answer a SEEK on owned topic ``t``: the seq id chosen (``MalformedRequestError`` on a bad position).

    With ``resolveOnly`` (a reader's probe) a seq id before the first kept
    message moves to it and no subscription moves; otherwise ``sub``'s next
    delivered message becomes that seq id (``TopicSubscriptions.reset``).
    With ``readCompacted`` too (a compacted reader's page), ``out`` gets the
    compacted ledger's messages from ``seqId`` on and the compaction point
    (``hub.compaction``); the seq id answered is ``seqId``."""
    log_ = t.log
    if req.readCompacted:
        if not req.resolveOnly or req.byTime or req.seqId < 1:
            raise errors.MalformedRequestError("readCompacted is a compacted reader's page: resolveOnly, by a "
                                               "seqId >= 1")
        msgs, point = await t.compaction.read(int(req.seqId), max(1, min(int(req.maxMessages) or _CHUNK, 10_000)),
                                              _PAGE_BYTES)
        if out is not None:
            out.messages.extend(msgs)
            out.compactedUpToSeqId = point
        return int(req.seqId)
    try:
        if req.byTime:
            seq = await seq_for_time(log_, int(req.publishTimeMs))
        else:
            seq = int(req.seqId)
            if req.resolveOnly:
                seq = max(seq, log_.first_kept())
            check_seq(seq, int(log_.last_seq), log_.ranges)
    except ValueError as exc:
        raise errors.MalformedRequestError(str(exc)) from exc
    if not req.resolveOnly:
        await t.subs.reset(sub, seq - 1, cache)
        log.info("subscription %r/%r seeks to seq id %d", t.log.topic, sub, seq)
    return seq
