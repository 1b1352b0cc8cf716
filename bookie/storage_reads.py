"""Reads of the entry storage (``bookie.storage``): entries, LACs, the last entry, usage figures."""

from __future__ import annotations

import os
import time

import lmdb

from bookie.errors import (
    NoSuchEntryError,
    NoSuchLedgerError,
)
from bookie.protocol import LAST_ENTRY
from bookie.segments import SegmentStore
from bookie.storage_core import (
    _ENTRY_KEY,
    LedgerIndex,
    _check_ids,
    _pack_key,
    entry_key,
)
from bookie.write_cache import WriteCache

__all__ = ["StorageReads", "corrupt_stored_entry"]

class StorageReads:
    """Reads of ``EntryStorage``: the write cache first, then the cache being flushed, then LMDB."""

    def __init__(self, index: LedgerIndex, cache: WriteCache) -> None:
        self._index = index
        self._cache = cache

    def read_entry(self, ledger_id: int, entry_id: int) -> tuple[int, bytes]:
        """``(entry_id, payload)`` of a durable entry; ``LAST_ENTRY`` reads the highest one.

        Raises ``NoSuchLedgerError`` when the bookie has no record of the
        ledger, ``NoSuchEntryError`` when it has no such entry (durable),
        ``BadRequestError`` for an id out of range.
        """
        _check_ids(ledger_id, None if entry_id == LAST_ENTRY else entry_id)
        state = self._index.get(ledger_id)
        if state is None:
            raise NoSuchLedgerError(f"no ledger {ledger_id} on this bookie")
        if entry_id == LAST_ENTRY:
            entry_id = state.last
            if entry_id < 0:
                raise NoSuchEntryError(f"no entries of ledger {ledger_id} on this bookie")
        payload = self._cache.get(_pack_key(ledger_id, entry_id))
        if payload is None:
            with self._index.env.begin(buffers=True) as txn:
                payload = self._index.store.read(txn, ledger_id, entry_id)
            if payload is None:
                raise NoSuchEntryError(f"no entry {ledger_id}:{entry_id} on this bookie")
        return entry_id, payload

    def last_entry_id(self, ledger_id: int) -> int:
        """The highest durable entry id of the ledger, ``-1`` when none."""
        state = self._index.get(ledger_id)
        return -1 if state is None else state.last

    def read_lac(self, ledger_id: int) -> int:
        """The highest LAC piggybacked on an add or written explicitly (``-1`` when none); ``NoSuchLedgerError``."""
        _check_ids(ledger_id)
        state = self._index.get(ledger_id)
        if state is None:
            raise NoSuchLedgerError(f"no ledger {ledger_id} on this bookie")
        return state.lac

    def map_usage(self) -> tuple[int, int]:
        """``(used, size)`` bytes of the LMDB map: its high-water page mark plus what the write cache
        will add at the next checkpoint, and how far it may grow."""
        info = self._index.env.info()
        psize = int(self._index.env.stat()["psize"])
        pending = self._cache.pending_bytes
        return (int(info["last_pgno"]) + 1) * psize + pending, int(info["map_size"])

    def lmdb_usage(self) -> tuple[int, int]:
        """``(file_bytes, reclaimable_bytes)`` of the LMDB file: its high-water page mark, and the part of it
        no database page uses (the free pages of deleted ledgers, which later checkpoints reuse before the
        file grows; LMDB's file itself never shrinks)."""
        index = self._index
        info = index.env.info()
        with index.env.begin() as txn:
            stats = [index.env.stat()] + [txn.stat(db) for db in (index.store.segments, index.store.legacy,
                                                                 index.ledgers, index.meta)]
        psize = int(stats[0]["psize"])
        used = 2 + sum(int(st["branch_pages"]) + int(st["leaf_pages"]) + int(st["overflow_pages"])
                       for st in stats)   # + the two meta pages
        high = int(info["last_pgno"]) + 1
        return high * psize, max(0, high - used) * psize

    def entry_count(self) -> int:
        """Durable entries in the storage, all ledgers (scans LMDB: for tools and tests)."""
        keys = self._cache.keys()
        deleting = self._index.deleting
        with self._index.env.begin(buffers=True) as txn:
            n = self._index.store.count(txn)
            for key in keys:
                lid, eid = _ENTRY_KEY.unpack(key)
                if lid not in deleting and self._index.store.read(txn, lid, eid) is None:
                    n += 1
        return n

    # --- test hooks --------------------------------------------------------------------------

    def corrupt_entry_for_test(self, ledger_id: int, entry_id: int) -> None:
        """Flip the last byte of a stored entry (test hook: the client must detect it)."""
        if self._cache.corrupt_for_test(entry_key(ledger_id, entry_id)):
            return
        with self._index.env.begin(write=True) as txn:
            if not self._index.store.corrupt(txn, ledger_id, entry_id):
                raise NoSuchEntryError(f"no entry {ledger_id}:{entry_id} to corrupt")


def corrupt_stored_entry(path: str | os.PathLike[str], ledger_id: int, entry_id: int, *,
                         timeout: float = 10.0) -> None:
    """Flip the last byte of a stored entry in the storage at ``path`` (test hook).

    Safe while a bookie process uses the directory (LMDB serialises writers
    across processes). A live bookie keeps new entries in its write cache
    until its next checkpoint (``flush_interval``), so this waits up to
    ``timeout`` seconds for the entry to reach LMDB; ``NoSuchEntryError``
    when it does not.
    """
    env = lmdb.open(str(path), max_dbs=4, sync=True, lock=True, create=False)
    try:
        store = SegmentStore(env)
        deadline = time.monotonic() + timeout
        while True:
            with env.begin(write=True) as txn:
                if store.corrupt(txn, ledger_id, entry_id):
                    return
            if time.monotonic() >= deadline:
                raise NoSuchEntryError(f"no entry {ledger_id}:{entry_id} to corrupt")
            time.sleep(0.05)  # another process's checkpoint: nothing here to wait on
    finally:
        env.close()
