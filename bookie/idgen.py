"""Ledger ids handed out from blocks: one metastore write per ``block_size`` ids, not one per ledger.

    ids = LedgerIdAllocator(idgen_table, block_size=1000)
    ledger_id = await ids.next_id()          # 1, 2, ... within this allocator's block; a new block when used up
    await ids.reserved()                     # the highest id any allocator has reserved so far

The record ``idgen/ledger`` holds ``next``: the first id nobody has
reserved (BookKeeper's ``LongZkLedgerIdGenerator`` keeps the same high-water
mark). An allocator reserves ``[next, next + block_size)`` with one
compare-and-set raising ``next`` and hands those ids out from memory, so
hundreds of ledgers created at once (a hub taking over its topics) cost one
metastore write per block instead of a compare-and-set storm on one record.
A client of an older version, which takes ids one at a time from the same
record, stays compatible: it only ever takes ids nobody reserved.

Ids are unique across clients and restarts: a block is reserved before any
of its ids is used, and an allocator that stops (a killed process) leaves
its unused ids as a gap; nothing hands them out again. Gaps are fine
(BookKeeper's ids have them too).

Concurrent callers of one allocator share its block: at most one reservation
is in flight, the others wait for it. A reservation that loses the
compare-and-set to another allocator reads the record again and retries with
jittered backoff for as long as it keeps losing to *other writers* (they
are making progress, so it will win): ``metastore.cas.ANY_ATTEMPTS`` tries,
over a minute of solid contention, which the operation timeouts of the
caller end first in practice. Other errors (the metastore down) propagate.

Where the store offers native counters (``MetaStore.counters()``: LMDB in
one write transaction, HBase by ``atomicIncrement``) a block is one atomic
add on the counter ``ledger`` instead, which never conflicts. The counter
takes over from the record once: the first such allocator raises the
counter past the record's ``next`` and fences the record by moving its
``next`` to ``LEGACY_FENCE`` (2**62), remembering the old value in
``floor``, so a client of an older version still sharing the store takes
ids from 2**62 on and never meets the counter's.
"""

from __future__ import annotations

import asyncio
import logging

from metastore import MetaStore, Value
from metastore.api import Counters, MetastoreTable, Versioned
from metastore.cas import ANY_ATTEMPTS, update_record
from metastore.errors import IllegalOpError, NoKeyError

log = logging.getLogger(__name__)

__all__ = ["COUNTER_NAME", "DEFAULT_BLOCK_SIZE", "IDGEN_KEY", "IDGEN_TABLE", "LEGACY_FENCE", "LedgerIdAllocator"]

IDGEN_TABLE = "idgen"
IDGEN_KEY = "ledger"
COUNTER_NAME = "ledger"
DEFAULT_BLOCK_SIZE = 1000
LEGACY_FENCE = 1 << 62
"""Where the ``idgen/ledger`` record's ``next`` moves once a native counter took over (see the module docstring)."""


def _next_of(current: Versioned | None) -> int:
    return int(current.value.get("next") or b"1") if current is not None else 1


class LedgerIdAllocator:
    """See the module docstring."""

    def __init__(self, idgen: MetastoreTable, block_size: int = DEFAULT_BLOCK_SIZE,
                 counters: Counters | None = None) -> None:
        if block_size < 1:
            raise ValueError(f"ledger id block size must be >= 1, not {block_size}")
        self.idgen = idgen
        self.block_size = block_size
        self.counters = counters
        self._next = 0          # the next id of the current block
        self._end = 0           # one past the current block's last id
        self._lock = asyncio.Lock()
        self._counter_ready = False
        self.blocks = 0         # blocks reserved by this allocator (for tests and stats)

    @classmethod
    async def open(cls, store: MetaStore, idgen: MetastoreTable,
                   block_size: int = DEFAULT_BLOCK_SIZE) -> LedgerIdAllocator:
        """An allocator on ``store``'s native counters when it has them, else on CAS blocks of ``idgen``."""
        try:
            counters: Counters | None = await store.counters()
        except IllegalOpError:
            counters = None
        return cls(idgen, block_size, counters)

    async def next_id(self) -> int:
        """A ledger id no other caller, allocator or process ever gets."""
        while self._next >= self._end:
            async with self._lock:
                if self._next >= self._end:     # nobody refilled it while we waited
                    self._next, self._end = await self._reserve(self.block_size)
                    self.blocks += 1
        nid = self._next
        self._next += 1
        return nid

    async def _reserve(self, n: int) -> tuple[int, int]:
        """Reserve ``n`` ids nobody else holds: ``(first, end)`` with ``end`` excluded."""
        if self.counters is not None:
            if not self._counter_ready:
                await self._take_over_record()
                self._counter_ready = True
            last = await self.counters.add(COUNTER_NAME, n)
            return last - n + 1, last + 1
        written = await update_record(
            self.idgen, IDGEN_KEY, lambda cur: Value({"next": str(_next_of(cur) + n).encode()}),
            attempts=ANY_ATTEMPTS)
        assert written is not None
        end = int(written.value.get("next") or b"1")
        log.debug("reserved ledger ids %d..%d", end - n, end - 1)
        return end - n, end

    async def _take_over_record(self) -> None:
        """Fence the ``idgen/ledger`` record and raise the native counter past every id it handed out."""
        assert self.counters is not None

        def fence(cur: Versioned | None) -> Value | None:
            if cur is not None and cur.value.get("floor") is not None:
                return None                                   # fenced already
            return Value({"next": str(LEGACY_FENCE).encode(), "floor": str(_next_of(cur)).encode()})

        rec = await update_record(self.idgen, IDGEN_KEY, fence, attempts=ANY_ATTEMPTS)
        assert rec is not None
        floor = int(rec.value.get("floor") or b"1")           # ids below it were handed out from the record
        have = await self.counters.add(COUNTER_NAME, 0)       # the counter holds the last id reserved
        if have < floor - 1:
            # two allocators may both add here: the counter overshoots (a gap), it never stays below
            await self.counters.add(COUNTER_NAME, floor - 1 - have)

    async def reserved(self) -> int:
        """The highest ledger id reserved so far by any allocator on this store (0: none)."""
        if self.counters is not None:
            return await self.counters.add(COUNTER_NAME, 0)
        try:
            return _next_of(await self.idgen.get(IDGEN_KEY)) - 1
        except NoKeyError:
            return 0
