"""hub.compaction without processes: what a topic's compaction keeps from consumed-ledger deletion, and its record."""

from __future__ import annotations

from typing import Any

from hub.compaction import HOLD_FACTOR, TopicCompaction, compaction_ledgers, state_json
from hub.proto import pubsub_pb2 as pb


class _Log:
    """The part of ``hub.persistence.TopicLog`` a ``TopicCompaction`` reads for its hold."""

    topic = b"t"
    closed = False

    def __init__(self, point: int, after: int) -> None:
        self.ranges = pb.LedgerRanges()
        self.ranges.compaction.compactedUpToSeqId = point
        self.after = after
        self.hold: Any = None

    def bytes_after(self, seq: int) -> int:
        assert seq == self.ranges.compaction.compactedUpToSeqId
        return self.after


def test_the_hold_on_consumed_ledgers() -> None:
    log = _Log(point=10, after=250)
    c = TopicCompaction(log)    # type: ignore[arg-type]
    assert log.hold is c
    assert c.keep_from() is None                       # no threshold: nothing held between runs
    c.threshold = 100
    assert c.keep_from() == 11                         # kept for the next automatic run
    log.after = HOLD_FACTOR * 100 + 1
    assert c.keep_from() is None                       # far behind: let go, never for ever
    c._reading_from = 4
    assert c.keep_from() == 4                          # a run reading holds what it reads
    c.threshold = 0
    assert c.keep_from() == 4


def test_the_record_as_shown() -> None:
    ranges = pb.LedgerRanges()
    assert compaction_ledgers(ranges) == []
    assert state_json(ranges.compaction) == {"ledger_id": None, "compacted_up_to_seq_id": 0, "last_run_ms": None,
                                             "messages": 0, "pending_ledger_id": None}
    ranges.compaction.CopyFrom(pb.CompactionState(ledgerId=7, compactedUpToSeqId=40, lastRunMs=5, messages=3,
                                                  pendingLedgerId=9))
    assert compaction_ledgers(ranges) == [7, 9]
    assert state_json(ranges.compaction)["pending_ledger_id"] == 9
