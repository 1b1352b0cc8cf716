"""A subscription's acknowledgement state: the mark-delete point plus ranges acked beyond it.

    cur = AckCursor(mark_delete=10, ranges=[(13, 15)])   # as stored (``SubscriptionState``)
    cur.ack(11)            # True: newly acked; mark_delete moves to 11 (12 is still unacked)
    cur.ack(12)            # mark_delete jumps through the range to 15
    cur.is_acked(14)       # True
    cur.ack_through(20)    # cumulative: everything up to 20
    cur.persisted_ranges() # what goes into SubscriptionState.ackedRanges (bounded)

Pulsar's ``ManagedCursorImpl``: ``mark_delete`` is the first unacknowledged
message minus one (everything up to it is acknowledged; Hedwig's consume
pointer), and the individually acknowledged messages after it are kept as
disjoint, ascending ranges. Retention and the backlog use ``mark_delete``.

Persisted ranges are bounded by ``MAX_PERSISTED_ACK_RANGES`` (Pulsar's
``managedLedgerMaxUnackedRangesToPersist``, default 10000; we choose 4096:
each range is two varints, so the record stays under about 80 KB, well
inside every metastore backend's value limit). The ranges nearest
``mark_delete`` are kept; acks in ranges past the bound are delivered again
after a restart or owner change (at least once), so one stuck message cannot
grow the subscription record without limit. Plain state, no I/O; nothing
here raises.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

__all__ = ["MAX_PERSISTED_ACK_RANGES", "AckCursor"]

MAX_PERSISTED_ACK_RANGES = 4096


class AckCursor:
    """See the module docstring."""

    def __init__(self, mark_delete: int = 0, ranges: Iterable[tuple[int, int]] = ()) -> None:
        self.mark_delete = mark_delete
        self._starts: list[int] = []
        self._ends: list[int] = []
        for first, last in sorted(ranges):
            if last > mark_delete:
                self._add_range(max(first, mark_delete + 1), last)
        self._advance()

    def _add_range(self, first: int, last: int) -> None:
        if last < first:
            return
        if self._ends and first <= self._ends[-1] + 1 and first >= self._starts[-1]:
            self._ends[-1] = max(self._ends[-1], last)
            return
        self._starts.append(first)
        self._ends.append(last)

    @property
    def range_count(self) -> int:
        return len(self._starts)

    @property
    def acked_beyond(self) -> int:
        """How many messages after ``mark_delete`` are acknowledged."""
        return sum(e - s + 1 for s, e in zip(self._starts, self._ends, strict=True))

    def is_acked(self, seq: int) -> bool:
        if seq <= self.mark_delete:
            return True
        ends = self._ends
        if not ends or seq > ends[-1]:      # past every range: a message not read yet, the usual question
            return False
        i = bisect.bisect_right(self._starts, seq) - 1
        return i >= 0 and ends[i] >= seq

    def ack(self, seq: int) -> bool:
        """Acknowledge ``seq``; True when it was not acknowledged before."""
        return self._ack_fresh(seq, seq)

    def ack_many(self, seqs: list[int]) -> int:
        """``ack`` of each of ``seqs``; how many were not acknowledged before. A run of consecutive seq ids
        (ascending) of which none is acknowledged goes in as one range: a consumer acks its runs in order."""
        n = 0
        i, count = 0, len(seqs)
        ack = self.ack
        while i < count:
            first = last = seqs[i]
            j = i + 1
            while j < count and seqs[j] == last + 1:
                last += 1
                j += 1
            if j - i > 1 and self._ack_fresh(first, last):
                n += j - i
            else:
                for seq in seqs[i:j]:
                    if ack(seq):
                        n += 1
            i = j
        return n

    def _ack_fresh(self, first: int, last: int) -> bool:
        """Acknowledge ``first`` .. ``last`` when none of them is acknowledged yet (else False, nothing done)."""
        if first <= self.mark_delete:
            return False
        starts, ends = self._starts, self._ends
        i = bisect.bisect_right(starts, last) - 1     # the last range that starts at or before ``last``
        if i >= 0 and ends[i] >= first:
            return False
        left = i >= 0 and ends[i] == first - 1
        right = i + 1 < len(starts) and starts[i + 1] == last + 1
        if left and right:
            ends[i] = ends[i + 1]
            del starts[i + 1], ends[i + 1]
        elif left:
            ends[i] = last
        elif right:
            starts[i + 1] = first
        else:
            starts.insert(i + 1, first)
            ends.insert(i + 1, last)
        if starts[0] <= self.mark_delete + 1:    # _advance, inline (ranges keep gaps: one at most)
            self.mark_delete = max(self.mark_delete, ends[0])
            del starts[0], ends[0]
        return True

    def unacked_from(self, seq: int) -> bool:
        """Whether no message from ``seq`` on is acknowledged (the usual state past what was read)."""
        return seq > self.mark_delete and (not self._ends or self._ends[-1] < seq)

    def ack_through(self, seq: int) -> bool:
        """Acknowledge everything up to ``seq`` (cumulative); True when ``mark_delete`` moved."""
        if seq <= self.mark_delete:
            return False
        self.mark_delete = seq
        starts, ends = self._starts, self._ends
        while starts and ends[0] <= seq:
            del starts[0], ends[0]
        if starts and starts[0] <= seq:
            starts[0] = seq + 1
        self._advance()
        return True

    def _advance(self) -> None:
        if self._starts and self._starts[0] <= self.mark_delete + 1:
            self.mark_delete = max(self.mark_delete, self._ends[0])
            del self._starts[0], self._ends[0]

    def reset(self, mark_delete: int) -> None:
        """Forget every ack; everything after ``mark_delete`` is unacknowledged (an operator's reset)."""
        self.mark_delete = mark_delete
        self._starts.clear()
        self._ends.clear()

    def persisted_ranges(self, limit: int = MAX_PERSISTED_ACK_RANGES) -> list[tuple[int, int]]:
        """The ranges to store with the subscription: the ``limit`` nearest ``mark_delete``."""
        return list(zip(self._starts[:limit], self._ends[:limit], strict=True))
