"""Checkpoints of the entry storage (``bookie.storage``, step 4 of its write path) and its replay.

A checkpoint swaps the write cache for an empty one and writes it into LMDB
in one synced transaction on the flush thread, with the ledger records and
the journal position it covers; journal files wholly before it are deleted.
At start-up the journal is replayed from the last checkpoint into LMDB
(``replay``).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path

import lmdb

from bookie import journal
from bookie.disk import describe_commit_error
from bookie.errors import BookieServerError
from bookie.journal import Position
from bookie.messages import ENTRY_HEADER as _ENTRY_HEADER
from bookie.storage_core import (
    _CHECKPOINT_KEY,
    _POSITION,
    GroupState,
    LedgerIndex,
    _LedgerState,
    _pack_key,
    ledger_prefix,
)
from bookie.write_cache import WriteCache

__all__ = ["Checkpoints", "replay"]

log = logging.getLogger(__name__)


class _Flush:
    """One checkpoint: the swapped cache, ledger records and deletes, and the journal position it covers."""

    __slots__ = ("cache", "deletes", "error", "position", "records", "seconds", "waiters")

    def __init__(self, cache: dict[bytes, bytes], records: list[tuple[bytes, bytes]], deletes: set[int],
                 position: Position) -> None:
        self.cache = cache
        self.records = records
        self.deletes = deletes
        self.position = position
        self.waiters: list[asyncio.Future[None]] = []
        self.error: BaseException | None = None
        self.seconds = 0.0


class _Idle:
    """The journal hand-off before it is wired (``Checkpoints.group``): no group, nothing waiting."""

    busy = False

    def admit_throttled(self) -> None:
        pass


class Checkpoints:
    """Checkpoints of the write cache into LMDB: periodic, once the cache holds ``checkpoint_bytes``, or asked for.

    ``group`` (the journal hand-off) is wired after construction: it needs
    this object too. ``closing`` is set by ``EntryStorage.close``: a failed
    checkpoint is then no longer retried.
    """

    def __init__(self, index: LedgerIndex, cache: WriteCache, journal_dir: Path, *, interval: float,
                 report_error: Callable[[str, bool], None]) -> None:
        self._index = index
        self._cache = cache
        self._journal_dir = journal_dir
        self._interval = interval
        self._report_error = report_error
        self.group: GroupState = _Idle()
        self.on_checkpoint: Callable[[int, float], None] | None = None
        self.checkpoints = 0
        self.closing = False
        self._closed = False
        self.flushing: _Flush | None = None
        self._waiters: list[asyncio.Future[None]] = []
        self._timer: asyncio.TimerHandle | None = None
        self.armed = False
        """The periodic timer is set (``CheckpointTrigger.armed``)."""
        self._jobs: queue.SimpleQueue[_Flush | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- triggers (``CheckpointTrigger``) ----------------------------------------------------

    def arm(self) -> None:
        """Writes are coming: start the periodic checkpoint unless it runs."""
        if self._timer is None and self._interval > 0:
            loop = self._loop = self._loop or asyncio.get_running_loop()
            self._timer = loop.call_later(self._interval, self._tick)
            self.armed = True

    def cache_filled(self) -> None:
        """The write cache holds ``checkpoint_bytes``: checkpoint it unless a checkpoint runs."""
        if self.flushing is None:
            self._start()

    def _tick(self) -> None:
        self._timer = None
        self.armed = False
        if self._closed:
            return
        index = self._index
        if self.flushing is None and (self._cache.entries or index.dirty or index.deleting):
            self._start()
        elif self.flushing is not None and self.flushing.error is not None:
            self._retry()
        if self._interval > 0 and (self._cache.entries or index.dirty or self.flushing is not None
                                   or self.group.busy):
            loop = self._loop
            assert loop is not None
            self._timer = loop.call_later(self._interval, self._tick)
            self.armed = True

    # --- the checkpoint ----------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is None:
            loop = self._loop = self._loop or asyncio.get_running_loop()
            thread = threading.Thread(target=self._thread_main, args=(loop,), name="bookie-flush", daemon=True)
            thread.start()
            self._thread = thread

    def _start(self) -> None:
        """Swap the cache for an empty one and hand it to the flush thread (on the loop)."""
        assert self.flushing is None
        self._ensure_thread()
        records = self._index.take_dirty_records()
        cache, position = self._cache.swap()
        job = _Flush(cache, records, set(self._index.deleting), position)
        job.waiters, self._waiters = self._waiters, []
        self.flushing = job
        self._jobs.put(job)
        if self._cache.throttled and not self.closing:
            self.group.admit_throttled()

    def _retry(self) -> None:
        job = self.flushing
        assert job is not None and job.error is not None
        job.error = None
        self._cache.flush_error = None
        job.records.extend(self._index.take_dirty_records())
        self._jobs.put(job)

    def _thread_main(self, loop: asyncio.AbstractEventLoop) -> None:
        jobs = self._jobs
        while True:
            job = jobs.get()
            if job is None:
                return
            error: BaseException | None = None
            t0 = time.perf_counter()
            try:
                self.write(job)
            except BaseException as exc:
                error = exc
            job.seconds = time.perf_counter() - t0
            try:
                loop.call_soon_threadsafe(self._done, job, error)
            except RuntimeError:
                log.error("checkpoint finished after its event loop closed")
                return

    def write(self, job: _Flush) -> None:
        """On the flush thread: one synced LMDB transaction, then the journal files before it go."""
        index = self._index
        position = _POSITION.pack(*job.position)
        with index.env.begin(write=True) as txn:
            for lid in job.deletes:
                index.store.delete_ledger(txn, lid)
                txn.delete(ledger_prefix(lid), db=index.ledgers)
            index.store.write(txn, job.cache, job.deletes)
            if job.records:
                txn.cursor(db=index.ledgers).putmulti(job.records)
            txn.put(_CHECKPOINT_KEY, position, db=index.meta)
        if job.deletes:
            self._free_deleted(position)
        for file_id in journal.journal_files(self._journal_dir):
            if file_id >= job.position.file_id:
                break
            try:
                (self._journal_dir / journal.file_name(file_id)).unlink()
            except OSError as exc:
                log.warning("could not delete journal file %s: %s", journal.file_name(file_id), exc)

    def _free_deleted(self, position: bytes) -> None:
        """After a transaction that deleted ledgers, one small one more, so that the next checkpoint can take
        their pages.

        LMDB's allocator takes the pages freed by write transaction T only
        from transaction T + 2 on (it counts the last committed snapshot as
        still read, and T's pages are in the one before). Without this, the
        next checkpoint, often a whole burst of writes after a quiet spell,
        took none of the freed pages and grew the file by its size (the disk
        soak test's one run in five, when garbage collection came after the
        last checkpoint of the cycle). A failure is only logged: the pages
        then go to the checkpoint after the next.
        """
        try:
            with self._index.env.begin(write=True) as txn:
                txn.put(_CHECKPOINT_KEY, position, db=self._index.meta)
        except lmdb.Error as exc:
            log.warning("could not commit the transaction after a deletion (its pages wait a checkpoint): %s", exc)

    def _done(self, job: _Flush, cause: BaseException | None) -> None:
        if cause is not None:
            reason, no_space = describe_commit_error(cause, self._index.path)
            log.error("checkpoint of %d entries failed (kept in memory, retried): %s", len(job.cache), reason)
            job.error = self._cache.flush_error = BookieServerError(f"checkpoint failed: {reason}")
            self._report_error(reason, no_space)
            if self.closing:  # nobody retries: the journal keeps the entries for the next start
                self._fail_waiters(job)
            return
        self.flushing = None
        self._cache.flushed()
        self._index.deleting -= job.deletes
        self.checkpoints += 1
        if self.on_checkpoint is not None:
            try:
                self.on_checkpoint(len(job.cache), job.seconds)
            except Exception:
                log.exception("entry storage on_checkpoint hook raised")
        for fut in job.waiters:
            if not fut.done():
                fut.set_result(None)
        if self._waiters or self._cache.nbytes >= self._cache.checkpoint_bytes or self._index.deleting:
            self._start()
        elif self._cache.throttled:
            self.group.admit_throttled()

    def _fail_waiters(self, job: _Flush) -> None:
        for fut in [*job.waiters, *self._waiters]:
            if not fut.done():
                fut.set_exception(job.error or BookieServerError("checkpoint failed"))
        job.waiters = []
        self._waiters = []

    async def checkpoint(self) -> None:
        """Write the write cache into LMDB (and apply pending deletes); a failure raises.

        The caller waits for the journal first (``EntryStorage.checkpoint``).
        """
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        if self.flushing is None:
            self._start()
        elif self.flushing.error is not None:
            self._fail_waiters(self.flushing)
        await fut

    def close(self) -> None:
        """Stop the timer and the flush thread (after the last checkpoint)."""
        self._closed = True
        self.armed = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None


def replay(index: LedgerIndex, journal_dir: Path) -> tuple[int, int]:
    """Replay the journal from the last checkpoint into LMDB: the id of the next journal file, and the entries."""
    files = journal.journal_files(journal_dir)
    with index.env.begin(db=index.meta) as txn:
        raw = txn.get(_CHECKPOINT_KEY)
    start = Position(*_POSITION.unpack(raw)) if raw is not None else Position(files[0] if files else 0, 0)
    if not files:
        return max(start.file_id + 1, 1), 0
    t0 = time.perf_counter()
    entries: dict[bytes, bytes] = {}
    states: dict[int, _LedgerState] = {}

    def state_of(ledger_id: int, master_key: bytes = b"") -> _LedgerState:
        st = states.get(ledger_id) or index.get(ledger_id)
        if st is None:
            st = _LedgerState(master_key)
        states[ledger_id] = st
        return st

    n = 0
    for rec in journal.read_journal(journal_dir, start):
        n += 1
        if rec.kind == journal.ADD:
            st = state_of(rec.ledger_id)
            value = rec.value
            entries[_pack_key(rec.ledger_id, rec.entry_id)] = value
            if len(value) >= _ENTRY_HEADER.size:   # the LAC piggybacked in the entry's header (no LAC record)
                lid, entry_id, lac = _ENTRY_HEADER.unpack_from(value)
                if lac > st.lac and lid == rec.ledger_id and entry_id == rec.entry_id:
                    st.lac = lac
        elif rec.kind == journal.LEDGER:
            st = state_of(rec.ledger_id, rec.value)
            if not st.master_key:
                st.master_key = rec.value
        elif rec.kind == journal.FENCE:
            state_of(rec.ledger_id).fenced = True
        elif rec.kind == journal.LAC:
            st = state_of(rec.ledger_id)
            st.lac = max(st.lac, rec.lac)
    next_file = files[-1] + 1
    with index.env.begin(write=True) as txn:
        index.store.write(txn, entries)
        for lid, st in states.items():
            txn.put(ledger_prefix(lid), st.record(), db=index.ledgers)
        txn.put(_CHECKPOINT_KEY, _POSITION.pack(next_file, 0), db=index.meta)
    index.state.clear()
    for file_id in files:
        (journal_dir / journal.file_name(file_id)).unlink(missing_ok=True)
    if n:
        log.info("replayed %d journal records (%d entries of %d ledgers) from %s in %.3f s", n, len(entries),
                 len(states), journal_dir, time.perf_counter() - t0)
    return next_file, len(entries)
