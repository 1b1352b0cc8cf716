"""The journal hand-off of the entry storage (``bookie.storage``, steps 2 and 3 of its write path).

Adds and ledger records join the open *group*; one group at a time is
written and synced (on the journal thread, or on the loop for a small one),
then its entries enter the write cache and its callbacks run in order.
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
from bookie.storage_core import (
    StorageCore,
    _Batch,
)

__all__ = ["GroupCommit"]

log = logging.getLogger(__name__)

_SLICE = 32
"""Completion callbacks run between two checks for handing over the next group."""
_INLINE_ENTRIES = 16
"""A group of at most this many adds is written by the loop thread itself (see ``_start_commit``)."""
_INLINE_SYNC = 0.002
"""... and only while the last journal sync took less than this (seconds): a slow disk never stalls the loop."""


class GroupCommit(StorageCore):
    """The journal hand-off of ``EntryStorage``: the open group, its write and sync, its completion."""

    def _open_batch(self) -> _Batch:
        batch = self._batch = _Batch()
        if not self._committing and not self._kicked:
            self._kicked = True
            loop = self._loop or asyncio.get_running_loop()
            self._loop = loop
            if self._group_wait:
                loop.call_later(self._group_wait, self._start_commit)
            else:
                loop.call_soon(self._start_commit)
            if self._flush_timer is None and self._flush_interval > 0:
                self._flush_timer = loop.call_later(self._flush_interval, self._flush_tick)
        return batch

    def _inline(self, batch: _Batch) -> bool:
        """Whether the loop thread writes ``batch`` itself: small, and the disk syncs fast."""
        return len(batch.keys) <= _INLINE_ENTRIES and self.last_sync_seconds < _INLINE_SYNC

    def _start_commit(self, inline: bool = True) -> bool:
        """Hand the open group to the journal thread (on the loop; one write in flight at most).

        A small group (``_inline``) is written on the loop thread at once when
        ``inline``: at low rates a group of a few adds then costs no thread
        hand-off (a queue put, a GIL hand-over each way, a loop wake-up),
        which costs more CPU than the write. Callers pass ``inline=False``
        while responses of the previous group still wait to be written.
        """
        self._kicked = False
        batch = self._batch
        if batch is None or self._committing:
            return False
        if self._thread is None:
            loop = self._loop = self._loop or asyncio.get_running_loop()
            thread = threading.Thread(target=self._journal_thread, args=(loop,),
                                      name="bookie-journal", daemon=True)
            thread.start()
            self._thread = thread
        if batch.dirty:
            state = self._state
            batch.parts.extend(journal.encode_lac(lid, st.lac) for lid in batch.dirty
                              if (st := state.get(lid)) is not None and st.lac >= 0)
            self._dirty |= batch.dirty
        self._batch = None
        self._committing = True
        if inline and self._inline(batch):
            self._commit_done(batch, self._write_group(batch))
        else:
            self._jobs.put(batch)
        return True

    def _write_group(self, batch: _Batch) -> BaseException | None:
        """Write and sync the group's records (on the journal thread, or on the loop for a small group)."""
        try:
            parts = batch.parts
            t0 = time.perf_counter()
            batch.position = self._writer.append(b"".join(parts)) if parts else self._writer.position
            batch.sync_seconds = time.perf_counter() - t0
            batch.nbytes = sum(map(len, batch.values))
            batch.parts = []
        except BaseException as exc:  # reported to every waiter of the group
            return exc
        return None

    def _journal_thread(self, loop: asyncio.AbstractEventLoop) -> None:
        """The journal thread: write each group handed over (one synchronous write), report it on the loop."""
        jobs = self._jobs
        done = self._commit_done
        write = self._write_group
        while True:
            batch = jobs.get()
            if batch is None:
                return
            error = write(batch)
            try:
                loop.call_soon_threadsafe(done, batch, error)
            except RuntimeError:  # the loop is closed: nobody is left to tell
                log.error("journal write finished after its event loop closed")
                return

    def _commit_done(self, batch: _Batch, cause: BaseException | None) -> None:
        """On the loop: the group is synced (``cause`` is None) or its write failed."""
        self._committing = False
        n = len(batch.keys)
        if cause is not None:
            reason, no_space = describe_commit_error(cause, self.journal_dir)
            log.error("journal write of %d entries failed: %s", n, reason)
            exc = BookieServerError(f"journal write failed: {reason}")
            exc.__cause__ = cause
            batch.error = exc
            self._report_error(reason, no_space)
        else:
            assert batch.position is not None
            self._synced = batch.position
            cache = self._cache
            cache.update(zip(batch.keys, batch.values, strict=True))
            self.cache_bytes += batch.nbytes
            state = self._state
            for lid, eid in batch.last.items():
                st = state.get(lid)
                if st is not None and eid > st.last:
                    st.last = eid
            self.commits += 1
            self.entries_committed += n
            self.last_commit_bytes = batch.nbytes
            self.last_sync_seconds = batch.sync_seconds
            self.last_group_entries = n
            if self.on_commit is not None:
                try:
                    self.on_commit(n, time.perf_counter() - batch.started)
                except Exception:
                    log.exception("entry storage on_commit hook raised")
            if self.cache_bytes >= self._half_cache and self._flushing is None:
                self._start_flush()
        batch.waiters.reverse()  # popped from the end, in order
        self._complete(batch)

    def _report_error(self, reason: str, no_space: bool) -> None:
        if self.on_commit_error is not None:
            try:
                self.on_commit_error(reason, no_space)
            except Exception:
                log.exception("entry storage on_commit_error hook raised")

    def _complete(self, batch: _Batch) -> None:
        """Run the group's callbacks in order; hand the next group over in their midst.

        Each callback is dropped as soon as it has run: what it holds is freed at
        once, and a batch of dead closures does not pile up to trigger cyclic GC
        passes (they count allocations minus deallocations).
        """
        exc = batch.error
        waiters = batch.waiters
        pop = waiters.pop
        left = len(waiters)
        seen = -1
        handover = not self._group_wait
        while left:
            # The journal thread is idle: hand it the open group once that holds as
            # many adds as there are callbacks left to run, or once the callbacks
            # stop adding to it. Pipelining clients (whose callbacks add again) then
            # settle into two groups of about the same size, one syncing while the
            # loop runs the callbacks of the other.
            if handover and not self._committing and self._batch is not None:
                size = len(self._batch.keys)
                if size >= left or size == seen:
                    self._start_commit(inline=False)
                seen = size
            run = min(left, _SLICE)
            left -= run
            for _ in range(run):
                done = pop()
                try:
                    done(exc)
                except Exception:
                    log.exception("entry storage completion callback raised")
            del done
        for fut in batch.futures:
            if not fut.done():
                if exc is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(exc)
        if not self._committing:
            if self._batch is not None:
                self._schedule_commit(self._batch)
            else:
                idle, self._idle_waiters = self._idle_waiters, []
                for w in idle:
                    if not w.done():
                        w.set_result(None)

    def _schedule_commit(self, batch: _Batch) -> None:
        wait = self._group_wait - (time.perf_counter() - batch.started)
        if wait <= 0 and not self._inline(batch):
            self._start_commit(inline=False)
        elif wait <= 0:  # written on the loop: after the responses queued now (their flushes come first)
            if not self._kicked:
                self._kicked = True
                loop = self._loop
                assert loop is not None
                loop.call_soon(self._start_commit)
        elif not self._kicked:
            self._kicked = True
            loop = self._loop
            assert loop is not None
            loop.call_later(wait, self._start_commit)

    async def flush(self) -> None:
        """Return once every write submitted so far is durable in the journal (and its callbacks ran)."""
        while self._committing or self._batch is not None:
            idle = asyncio.get_running_loop().create_future()
            self._idle_waiters.append(idle)
            if not self._committing:
                self._start_commit()
            await idle
