"""``EntryIndex``: the first seq id of every entry of a ledger a topic's owner wrote, in about a byte per entry.

    idx = EntryIndex(ledger_id)         # ledger_id: whose entries (optional, -1)
    idx.append(first_seq, count)        # entry 0, 1, 2, ... as acknowledged: its first seq id and message count
    idx.entry_of(seq)                   # the last entry whose first seq id is <= seq (-1: none)
    len(idx)                            # entries indexed

A topic's seq ids are dense and its entries consecutive, so an entry's first
seq id is the one before it plus that one's message count. The index keeps
each entry's count in one byte (a count of 255 or more also in a dict: a
batch that large is rare and carries as many messages) and the first seq
id of every ``BLOCK``-th entry: about 1.1 bytes per entry, where a list of
ints cost 36. A lookup bisects the block starts, then adds up at most
``BLOCK`` counts. (Without it a hub writing one ledger for ever kept 36
bytes per entry, a few per message: issue 35.) The first block's start is
a slot and the array of the others is built by the ``BLOCK``-th entry: a
hub's idle topics each index a few entries of one ledger (issue 34).
"""

from __future__ import annotations

import bisect
from array import array

from metastore.idle import IDLE_DICT

__all__ = ["BLOCK", "EntryIndex"]

BLOCK = 64
"""Entries per stored first seq id (a lookup adds up at most this many counts)."""
_ESCAPE = 255


class EntryIndex:
    """See the module docstring."""

    __slots__ = ("_big", "_counts", "_first", "_next", "_starts", "ledger_id")

    def __init__(self, ledger_id: int = -1) -> None:
        self.ledger_id = ledger_id
        self._first = 0                 # first seq id of entry 0
        self._starts: array[int] | None = None   # first seq id of entries BLOCK, 2 * BLOCK, ... (built by BLOCK)
        self._counts = bytearray()      # message count of every entry (_ESCAPE: see _big)
        self._big: dict[int, int] = IDLE_DICT  # entry id -> count, for counts of _ESCAPE or more (mostly none)
        self._next = 0                  # the first seq id the next entry must have

    def append(self, first_seq: int, count: int) -> None:
        """Index the next entry: ``count`` (>= 1) messages from ``first_seq`` on.

        ``ValueError`` when it does not follow the last entry (seq ids are dense).
        """
        if count < 1:
            raise ValueError(f"an entry holds at least one message, not {count}")
        entry = len(self._counts)
        if entry and first_seq != self._next:
            raise ValueError(f"entry {entry} starts at seq id {first_seq}, expected {self._next}")
        if entry % BLOCK == 0:
            if not entry:
                self._first = first_seq
            elif self._starts is None:
                self._starts = array("q", (first_seq,))
            else:
                self._starts.append(first_seq)
        if count >= _ESCAPE:
            if self._big is IDLE_DICT:
                self._big = {}
            self._big[entry] = count
            self._counts.append(_ESCAPE)
        else:
            self._counts.append(count)
        self._next = first_seq + count

    def entry_of(self, seq: int) -> int:
        """The last entry whose first seq id is at or below ``seq`` (-1 when there is none)."""
        counts = self._counts
        if not counts or seq < self._first:
            return -1
        starts = self._starts
        block = 0
        first = self._first
        if starts is not None:
            block = bisect.bisect_right(starts, seq)   # of the blocks after the first
            if block:
                first = starts[block - 1]
        entry = block * BLOCK
        end = min(len(self._counts), entry + BLOCK)
        big = self._big
        while entry + 1 < end:
            n = counts[entry]
            if n == _ESCAPE:
                n = big[entry]
            if first + n > seq:
                break
            first += n
            entry += 1
        return entry

    @property
    def nbytes(self) -> int:
        """What the index holds, in bytes (its arrays; the dict of large counts at ~100 bytes an item)."""
        blocks = (1 + len(self._starts or ())) if self._counts else 0
        return len(self._counts) + 8 * blocks + 100 * len(self._big)

    def __len__(self) -> int:
        return len(self._counts)
