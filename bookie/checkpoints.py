"""Checkpoints of the entry storage (``bookie.storage``, step 4 of its write path) and its replay.

A checkpoint swaps the write cache for an empty one and writes it into LMDB
in one synced transaction on the flush thread, with the ledger records and
the journal position it covers; journal files wholly before it are deleted.
At start-up the journal is replayed from the last checkpoint into LMDB.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from bookie import journal
from bookie.disk import describe_commit_error
from bookie.errors import (
    BookieServerError,
)
from bookie.journal import Position
from bookie.storage_core import (
    _CHECKPOINT_KEY,
    _POSITION,
    StorageCore,
    _Flush,
    _LedgerState,
    _pack_key,
    ledger_prefix,
)

__all__ = ["Checkpoints"]

log = logging.getLogger(__name__)

class Checkpoints(StorageCore):
    """Checkpoints of ``EntryStorage`` (the write cache into LMDB) and the journal replay at start-up."""

    # --- start-up ----------------------------------------------------------------------------

    def _checkpoint_position(self) -> Position | None:
        with self._env.begin(db=self._meta) as txn:
            raw = txn.get(_CHECKPOINT_KEY)
        return None if raw is None else Position(*_POSITION.unpack(raw))

    def _replay(self) -> int:
        """Replay the journal from the last checkpoint into LMDB; the id of the next journal file."""
        files = journal.journal_files(self.journal_dir)
        start = self._checkpoint_position() or Position(files[0] if files else 0, 0)
        if not files:
            return max(start.file_id + 1, 1)
        t0 = time.perf_counter()
        entries: dict[bytes, bytes] = {}
        states: dict[int, _LedgerState] = {}

        def state_of(ledger_id: int, master_key: bytes = b"") -> _LedgerState:
            st = states.get(ledger_id) or self._ledger(ledger_id)
            if st is None:
                st = _LedgerState(master_key)
            states[ledger_id] = st
            return st

        n = 0
        for rec in journal.read_journal(self.journal_dir, start):
            n += 1
            if rec.kind == journal.ADD:
                state_of(rec.ledger_id)
                entries[_pack_key(rec.ledger_id, rec.entry_id)] = rec.value
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
        with self._env.begin(write=True) as txn:
            self._store.write(txn, entries)
            for lid, st in states.items():
                txn.put(ledger_prefix(lid), st.record(), db=self._ledgers)
            txn.put(_CHECKPOINT_KEY, _POSITION.pack(next_file, 0), db=self._meta)
        self._state.clear()
        for file_id in files:
            (self.journal_dir / journal.file_name(file_id)).unlink(missing_ok=True)
        self.replayed = len(entries)
        if n:
            log.info("replayed %d journal records (%d entries of %d ledgers) from %s in %.3f s", n, self.replayed,
                     len(states), self.journal_dir, time.perf_counter() - t0)
        return next_file

    # --- checkpoints (the write cache into LMDB) ---------------------------------------------

    def _flush_tick(self) -> None:
        self._flush_timer = None
        if self._closed:
            return
        if self._flushing is None and (self._cache or self._dirty or self._deleting):
            self._start_flush()
        elif self._flushing is not None and self._flushing.error is not None:
            self._retry_flush()
        if self._flush_interval > 0 and (self._cache or self._dirty or self._flushing is not None
                                         or self._batch is not None or self._committing):
            loop = self._loop
            assert loop is not None
            self._flush_timer = loop.call_later(self._flush_interval, self._flush_tick)

    def _ensure_flush_thread(self) -> None:
        if self._flush_thread is None:
            loop = self._loop = self._loop or asyncio.get_running_loop()
            thread = threading.Thread(target=self._flush_thread_main, args=(loop,), name="bookie-flush",
                                      daemon=True)
            thread.start()
            self._flush_thread = thread

    def _start_flush(self) -> None:
        """Swap the cache for an empty one and hand it to the flush thread (on the loop)."""
        assert self._flushing is None
        self._ensure_flush_thread()
        state = self._state
        records = [(ledger_prefix(lid), st.record()) for lid in self._dirty if (st := state.get(lid)) is not None]
        self._dirty = set()
        job = _Flush(self._cache, records, set(self._deleting), self._synced)
        job.waiters, self._checkpoint_waiters = self._checkpoint_waiters, []
        self._flushing = job
        self._flushing_bytes = self.cache_bytes
        self._cache = {}
        self.cache_bytes = 0
        self._flush_jobs.put(job)
        if self._throttled and not self._closing:
            self._release_throttled()

    def _retry_flush(self) -> None:
        job = self._flushing
        assert job is not None and job.error is not None
        job.error = None
        state = self._state
        job.records.extend((ledger_prefix(lid), st.record()) for lid in self._dirty
                           if (st := state.get(lid)) is not None)
        self._dirty = set()
        self._flush_jobs.put(job)

    def _flush_thread_main(self, loop: asyncio.AbstractEventLoop) -> None:
        jobs = self._flush_jobs
        while True:
            job = jobs.get()
            if job is None:
                return
            error: BaseException | None = None
            t0 = time.perf_counter()
            try:
                self._write_checkpoint(job)
            except BaseException as exc:
                error = exc
            job.seconds = time.perf_counter() - t0
            try:
                loop.call_soon_threadsafe(self._flush_done, job, error)
            except RuntimeError:
                log.error("checkpoint finished after its event loop closed")
                return

    def _write_checkpoint(self, job: _Flush) -> None:
        """On the flush thread: one synced LMDB transaction, then the journal files before it go."""
        with self._env.begin(write=True) as txn:
            for lid in job.deletes:
                self._store.delete_ledger(txn, lid)
                txn.delete(ledger_prefix(lid), db=self._ledgers)
            self._store.write(txn, job.cache, job.deletes)
            if job.records:
                txn.cursor(db=self._ledgers).putmulti(job.records)
            txn.put(_CHECKPOINT_KEY, _POSITION.pack(*job.position), db=self._meta)
        for file_id in journal.journal_files(self.journal_dir):
            if file_id >= job.position.file_id:
                break
            try:
                (self.journal_dir / journal.file_name(file_id)).unlink()
            except OSError as exc:
                log.warning("could not delete journal file %s: %s", journal.file_name(file_id), exc)

    def _flush_done(self, job: _Flush, cause: BaseException | None) -> None:
        if cause is not None:
            reason, no_space = describe_commit_error(cause, self.path)
            log.error("checkpoint of %d entries failed (kept in memory, retried): %s", len(job.cache), reason)
            job.error = BookieServerError(f"checkpoint failed: {reason}")
            self._report_error(reason, no_space)
            if self._closing:  # nobody retries: the journal keeps the entries for the next start
                self._fail_checkpoint_waiters(job)
            return
        self._flushing = None
        self._flushing_bytes = 0
        self._deleting -= job.deletes
        self.checkpoints += 1
        if self.on_checkpoint is not None:
            try:
                self.on_checkpoint(len(job.cache), job.seconds)
            except Exception:
                log.exception("entry storage on_checkpoint hook raised")
        for fut in job.waiters:
            if not fut.done():
                fut.set_result(None)
        if self._checkpoint_waiters or self.cache_bytes >= self._half_cache or self._deleting:
            self._start_flush()
        elif self._throttled:
            self._release_throttled()

    def _fail_checkpoint_waiters(self, job: _Flush) -> None:
        for fut in [*job.waiters, *self._checkpoint_waiters]:
            if not fut.done():
                fut.set_exception(job.error or BookieServerError("checkpoint failed"))
        job.waiters = []
        self._checkpoint_waiters = []

    async def checkpoint(self) -> None:
        """Write everything synced so far into LMDB (and apply pending deletes); a failure raises."""
        await self.flush()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._checkpoint_waiters.append(fut)
        if self._flushing is None:
            self._start_flush()
        elif self._flushing.error is not None:
            self._fail_checkpoint_waiters(self._flushing)
        await fut
