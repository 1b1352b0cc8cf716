"""The journal hand-off of the entry storage (``bookie.storage``, steps 1 to 3 of its write path).

Adds and ledger records are checked against the ledger index and join the
open *group*; one group at a time is written and synced (on the journal
thread, or on the loop for a small one), then its entries enter the write
cache and its callbacks run in order.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import struct
import threading
import time
from collections.abc import Callable, Container, Sequence
from pathlib import Path

from crc32c import crc32c

from bookie import journal
from bookie.digest import HEADER_SIZE as _ENTRY_HEADER_SIZE
from bookie.disk import describe_commit_error
from bookie.errors import (
    BadRequestError,
    BKError,
    BookieServerError,
    LedgerFencedError,
    UnauthorizedError,
)
from bookie.journal import JournalWriter, Position
from bookie.messages import ENTRY_HEADER
from bookie.storage_core import (
    _HEADER_PACK,
    _MAX_ID,
    AckSink,
    CheckpointTrigger,
    Done,
    LedgerIndex,
    _Batch,
    _check_ids,
    _LedgerState,
    _pack_key,
)
from bookie.write_cache import WriteCache, settle

__all__ = ["GroupCommit"]

log = logging.getLogger(__name__)

_SLICE = 32
"""Completion callbacks run between two checks for handing over the next group."""
_INLINE_ENTRIES = 16
"""A group of at most this many adds is written by the loop thread itself (see ``_start_commit``)."""
_INLINE_SYNC = 0.002
"""... and only while journal syncs take less than this (seconds, ``sync_estimate``): a slow disk never stalls
the loop."""
_SYNC_WEIGHT = 0.125
"""The weight of the last sync in ``sync_estimate`` (a moving average): one sync slowed by a busy machine (the
loop thread descheduled, the GIL held by the flush thread) does not send the next groups through the thread."""
_ADD_HEAD_PACK = struct.Struct(">BQQ").pack
_ADD_KIND = bytes([journal.ADD])
_LAC_PACK = struct.Struct(">Bqq").pack
_ENTRY_HEADER_UNPACK = ENTRY_HEADER.unpack_from


def _future_placeholder(exc: BaseException | None) -> None:
    raise AssertionError("a throttled add_entry completes its future, never this callback")


class GroupCommit:
    """The journal hand-off: checks writes, the open group, its write and sync, its completion.

    Owns the journal writer and thread, the open group and the commit
    figures; hands synced entries to the write cache and tells checkpoints
    (``CheckpointTrigger``) when writes come and when the cache fills.
    Hooks (called on the loop): ``on_commit(entries, seconds)``,
    ``on_lac(ledger_id, lac)`` (only for ledgers in ``lac_watched`` when it
    is set, except explicit LACs).
    """

    def __init__(self, index: LedgerIndex, cache: WriteCache, checkpoints: CheckpointTrigger, writer: JournalWriter,
                 journal_dir: Path, *, group_wait: float, report_error: Callable[[str, bool], None]) -> None:
        self._index = index
        self._state = index.state
        self._cache = cache
        self._checkpoints = checkpoints
        self.writer = writer
        self._journal_dir = journal_dir
        self._group_wait = max(group_wait, 0.0)
        self._report_error = report_error
        self.synced: Position = writer.position
        """The end of the last synced group."""
        self._batch: _Batch | None = None
        self._committing = False
        self._kicked = False
        self.reading = False
        """A connection's read is being served (set by the connection): a group it opens waits for ``end_read``."""
        self.held = False
        """A group opened during the read waits for ``end_read`` (no commit is scheduled for it yet)."""
        self.closing = False
        """Set by ``EntryStorage.close``: new writes are refused."""
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._jobs: queue.SimpleQueue[_Batch | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.on_commit: Callable[[int, float], None] | None = None
        self.on_lac: Callable[[int, int], None] | None = None
        self.lac_watched: Container[int] | None = None
        self.last_commit_bytes = 0
        self.last_sync_seconds = 0.0
        self.sync_estimate = 0.0
        """A moving average of the journal syncs' seconds (``_SYNC_WEIGHT``): small groups are written on the loop
        while it is under ``_INLINE_SYNC``."""
        self.last_group_entries = 0
        self.commits = 0
        self.entries_committed = 0

    @property
    def busy(self) -> bool:
        """A group is open or being written (``GroupState``)."""
        return self._batch is not None or self._committing

    # --- writes ------------------------------------------------------------------------------

    def _new_ledger(self, ledger_id: int, master_key: bytes, batch: _Batch) -> _LedgerState:
        state = self._index.create(ledger_id, master_key)
        batch.parts.append(journal.encode_ledger(ledger_id, master_key))
        batch.dirty.add(ledger_id)
        return state

    def submit_add(self, ledger_id: int, entry_id: int, master_key: bytes, payload: bytes, lac: int,
                   done: Done, *, recovery: bool = False) -> None:
        """``EntryStorage.submit_add``."""
        batch = self._admit(ledger_id, entry_id, master_key, payload, lac, recovery)
        if batch is None:
            self._cache.throttle(_pack_key(ledger_id, entry_id), payload, done, ledger_id)
        else:
            batch.waiters.append(done)
            batch.run_sink = None

    def submit_acked_add(self, sink: AckSink, ack: object, ledger_id: int, entry_id: int, master_key: bytes,
                         payload: bytes, lac: int, *, recovery: bool = False) -> None:
        """``EntryStorage.submit_acked_add``."""
        batch = self._admit(ledger_id, entry_id, master_key, payload, lac, recovery)
        if batch is None:
            self._cache.throttle(_pack_key(ledger_id, entry_id), payload, functools.partial(sink, [ack]), ledger_id)
        else:
            batch.join_run(sink, ack)

    def add_entry(self, ledger_id: int, entry_id: int, master_key: bytes, payload: bytes,
                  lac: int = -1, *, recovery: bool = False) -> asyncio.Future[None]:
        """``EntryStorage.add_entry``."""
        fut: asyncio.Future[None] = (self._loop or asyncio.get_running_loop()).create_future()
        try:
            batch = self._admit(ledger_id, entry_id, master_key, payload, lac, recovery)
        except BKError as exc:
            fut.set_exception(exc)
            return fut
        if batch is None:
            self._cache.throttle(_pack_key(ledger_id, entry_id), payload, _future_placeholder, ledger_id, fut)
        else:
            batch.futures.append(fut)
            batch.run_sink = None
        return fut

    def _admit(self, ledger_id: int, entry_id: int, master_key: bytes, payload: bytes, lac: int,
               recovery: bool) -> _Batch | None:
        """Check one add and put its journal record in the open group (returned; the caller adds the waiter).

        ``None``: the write cache is full, the caller throttles the add. Raises
        the errors of ``submit_add`` before changing anything but the ledger
        state it loads (and a new ledger's record).
        """
        # The hot path of the server: kept inline (no helper call), with no
        # per-add allocation besides the key and the record head (see ``_Batch``).
        if self.closing:
            raise BookieServerError("entry storage is closing")
        if not (0 <= ledger_id <= _MAX_ID and 0 <= entry_id <= _MAX_ID):
            raise BadRequestError(f"entry id {ledger_id}:{entry_id} out of range")
        state = self._state.get(ledger_id) or self._index.get(ledger_id)
        batch = self._batch or self._open_batch()
        if state is None:
            state = self._new_ledger(ledger_id, master_key, batch)
        elif state.master_key != master_key:
            raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")
        elif state.fenced and not recovery:
            raise LedgerFencedError(f"ledger {ledger_id} is fenced")
        if lac > state.lac:
            state.lac = lac
            batch.dirty.add(ledger_id)
            if self.on_lac is not None and (self.lac_watched is None or ledger_id in self.lac_watched):
                self.on_lac(ledger_id, lac)
        cache = self._cache  # ``WriteCache.full``, inline
        if cache.throttled or (cache.flushing is not None and cache.nbytes >= cache.half):
            return None
        # the journal record, encoded here: the journal thread then needs the GIL only to join and
        # hand back (a thread waiting for the GIL behind a busy loop waits a switch interval)
        key = _pack_key(ledger_id, entry_id)
        head = _ADD_HEAD_PACK(journal.ADD, ledger_id, entry_id)  # kind + key: a pack is cheaper than a concatenation
        batch.parts += (_HEADER_PACK(17 + len(payload), crc32c(payload, crc32c(head))), head, payload)
        batch.keys.append(key)
        batch.values.append(payload)
        last = batch.last
        if entry_id > last.get(ledger_id, -1):
            last[ledger_id] = entry_id
        return batch

    def admit_frame(self, entries: Sequence[bytes], ledger_id: int, multi: bool, master_key: bytes, recovery: bool,
                    sink: AckSink, ack: object) -> int:
        """Admit a frame's adds (ADD_ENTRIES of ``ledger_id``, or ADD_ENTRIES_MULTI when ``multi``) from the first
        while each passes ``_admit``'s checks plainly; once all were admitted, ``ack`` joins ``sink``'s run as one
        ``submit_acked_add`` does (one ack for the whole frame: the frame and the single adds of one connection
        form one run, one waiter).

        Returns how many were admitted (in order, into the open group). Fewer than all: the caller serves the
        rest one by one (``submit_acked_add``), which raises or throttles what stopped this loop (a short
        payload, another ledger's, an unknown ledger, a key or fencing refusal, an id out of range, a full write
        cache), and adds the waiter of the admitted ones (``add_waiter``). The journal records are those of
        ``_admit``, each add's kind and key joined to its payload (one checksum call, one buffer less). A LAC
        these adds raise needs no LAC record of its own (``_Batch.piggybacked``): the replay reads it from the
        entry header of the add's record, as the LAC came from there.
        """
        cache = self._cache
        if self.closing or cache.throttled or (cache.flushing is not None and cache.nbytes >= cache.half):
            return 0
        batch = self._batch or self._open_batch()
        states = self._state.get
        parts, dirty, last, piggybacked = batch.parts, batch.dirty, batch.last, batch.piggybacked
        add_key, add_value, last_of = batch.keys.append, batch.values.append, last.get
        header, add_head, pack_key, record_head = _ENTRY_HEADER_UNPACK, _ADD_HEAD_PACK, _pack_key, _HEADER_PACK
        on_lac, watched = self.on_lac, self.lac_watched
        kind, single, size = journal.ADD, not multi, _ENTRY_HEADER_SIZE
        n = 0
        for payload in entries:
            if len(payload) < size:
                return n
            lid, entry_id, lac = header(payload)
            if single and lid != ledger_id:
                return n
            state = states(lid)
            # a known ledger's id is in range; the entry id, read signed, is at most _MAX_ID
            if state is None or entry_id < 0 or state.master_key != master_key or (state.fenced and not recovery):
                return n
            if lac > state.lac:
                state.lac = lac
                if lid not in dirty:
                    dirty.add(lid)
                piggybacked[lid] = lac   # in the header of this add's record, below: no LAC record for it
                if on_lac is not None and (watched is None or lid in watched):
                    on_lac(lid, lac)
            body = add_head(kind, lid, entry_id) + payload
            parts += (record_head(len(body), crc32c(body)), body)
            add_key(pack_key(lid, entry_id))
            add_value(payload)
            if entry_id > last_of(lid, -1):
                last[lid] = entry_id
            n += 1
        batch.join_run(sink, ack)
        return n

    def add_waiter(self, done: Done) -> None:
        """``done`` runs once the open group is durable (or failed); after ``admit_frame`` admitted some adds."""
        batch = self._batch or self._open_batch()
        batch.waiters.append(done)
        batch.run_sink = None

    def admit_throttled(self) -> None:
        """Room in the write cache: the adds waiting for it join the open group, in order (``GroupState``)."""
        throttled = self._cache.take_throttled()
        if not throttled:
            return
        batch = self._batch or self._open_batch()
        batch.run_sink = None
        for key, payload, done, fut, ledger_id, _ in throttled:
            head = _ADD_KIND + key
            batch.parts += (_HEADER_PACK(17 + len(payload), crc32c(payload, crc32c(head))), head, payload)
            batch.keys.append(key)
            batch.values.append(payload)
            batch.dirty.add(ledger_id)
            entry_id = int.from_bytes(key[8:], "big")
            if entry_id > batch.last.get(ledger_id, -1):
                batch.last[ledger_id] = entry_id
            if fut is None:
                batch.waiters.append(done)
            else:  # futures complete after the callbacks: keep the order with a callback of its own
                batch.waiters.append(settle(fut))

    def _record_of(self, ledger_id: int, master_key: bytes) -> tuple[_LedgerState, _Batch]:
        """The ledger's record (a new one with ``master_key`` when unknown) and the open group."""
        state = self._index.get(ledger_id)
        batch = self._batch or self._open_batch()
        if state is None:
            state = self._new_ledger(ledger_id, master_key, batch)
        elif state.master_key != master_key:
            raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")
        return state, batch

    def fence(self, ledger_id: int, master_key: bytes) -> _Batch:
        """Fence the ledger in the open group (returned: the caller adds its waiter)."""
        if self.closing:
            raise BookieServerError("entry storage is closing")
        _check_ids(ledger_id)
        state, batch = self._record_of(ledger_id, master_key)
        state.fenced = True
        batch.parts.append(journal.encode_fence(ledger_id))
        batch.dirty.add(ledger_id)
        return batch

    def submit_write_lac(self, ledger_id: int, master_key: bytes, lac: int, done: Done) -> None:
        """``EntryStorage.submit_write_lac``."""
        if self.closing:
            raise BookieServerError("entry storage is closing")
        _check_ids(ledger_id)
        if not -1 <= lac <= _MAX_ID:
            raise BadRequestError(f"LAC {lac} out of range")
        state, batch = self._record_of(ledger_id, master_key)
        if lac > state.lac:
            state.lac = lac
            batch.dirty.add(ledger_id)
            if self.on_lac is not None:
                self.on_lac(ledger_id, lac)
        batch.waiters.append(done)
        batch.run_sink = None

    # --- the group ---------------------------------------------------------------------------

    def _open_batch(self) -> _Batch:
        batch = self._batch = _Batch()
        if not self._committing and not self._kicked:
            if not self._checkpoints.armed:
                self._checkpoints.arm()
            if self.reading:
                self.held = True  # ``end_read`` commits it or kicks
            else:
                self._kick()
        return batch

    def _kick(self) -> None:
        """Commit the open group in a later loop turn (after ``group_wait``)."""
        self._kicked = True
        loop = self._loop or asyncio.get_running_loop()
        self._loop = loop
        if self._group_wait:
            loop.call_later(self._group_wait, self._start_commit)
        else:
            loop.call_soon(self._start_commit)

    def end_read(self, commit: bool) -> None:
        """The read (``reading``) is served. ``commit``: hand a group it opened over now (written at once when small, as
        ``_start_commit``), so its answers leave with this read's flush: no loop turn, handle or epoll in
        between. The caller passes it only when no other connection could share the group (``bookie.server``'s
        connection with adds alone); else, and with ``group_wait``, the group is committed in a later turn
        as without ``reading``, with the adds other connections' reads of this loop turn bring.
        """
        self.reading = False
        if not self.held:
            return
        self.held = False
        if self._batch is None or self._committing or self._kicked:
            return
        if commit and not self._group_wait:
            self._start_commit()
        else:
            self._kick()

    def _inline(self, batch: _Batch) -> bool:
        """Whether the loop thread writes ``batch`` itself: small, and the disk syncs fast."""
        return len(batch.keys) <= _INLINE_ENTRIES and self.sync_estimate < _INLINE_SYNC

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
            states = self._state.get
            parts = batch.parts
            piggybacked = batch.piggybacked.get
            for lid in batch.dirty:   # ``journal.encode_lac``'s records, without two calls each
                st = states(lid)
                # none where an add of the group carries the ledger's LAC in its header (the replay reads it
                # there): with many ledgers nearly every add raises its own ledger's LAC (issue 34)
                if st is not None and st.lac >= 0 and piggybacked(lid) != st.lac:
                    body = _LAC_PACK(journal.LAC, lid, st.lac)
                    parts += (_HEADER_PACK(17, crc32c(body)), body)
            self._index.dirty |= batch.dirty
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
            batch.position = self.writer.append(b"".join(parts)) if parts else self.writer.position
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
            reason, no_space = describe_commit_error(cause, self._journal_dir)
            log.error("journal write of %d entries failed: %s", n, reason)
            exc = BookieServerError(f"journal write failed: {reason}")
            exc.__cause__ = cause
            batch.error = exc
            self._report_error(reason, no_space)
            filled = False
        else:
            assert batch.position is not None
            self.synced = batch.position
            filled = self._cache.add_group(batch.keys, batch.values, batch.nbytes, batch.position)
            state = self._state
            for lid, eid in batch.last.items():
                st = state.get(lid)
                if st is not None and eid > st.last:
                    st.last = eid
            self.commits += 1
            self.entries_committed += n
            self.last_commit_bytes = batch.nbytes
            seconds = self.last_sync_seconds = batch.sync_seconds
            self.sync_estimate += (seconds - self.sync_estimate) * _SYNC_WEIGHT
            self.last_group_entries = n
            if self.on_commit is not None:
                try:
                    self.on_commit(n, time.perf_counter() - batch.started)
                except Exception:
                    log.exception("entry storage on_commit hook raised")
            if filled:
                self._checkpoints.cache_filled()
        self._complete(batch)

    def _complete(self, batch: _Batch) -> None:
        """Run the group's callbacks in order; hand the next group over in their midst.

        Each callback is dropped as soon as it has run: what it holds is freed at
        once, and a batch of dead closures does not pile up to trigger cyclic GC
        passes (they count allocations minus deallocations).
        """
        exc = batch.error
        waiters = batch.waiters
        left = len(waiters)
        handover = not self._group_wait
        if left <= _SLICE and (self._batch is None or self._committing or not handover):
            # one slice and no open group to hand over before it (the usual small group): in order, plainly
            for done in waiters:
                try:
                    done(exc)
                except Exception:
                    log.exception("entry storage completion callback raised")
            waiters.clear()
            left = 0
        else:
            waiters.reverse()  # popped from the end, in order
        pop = waiters.pop
        seen = -1
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

    def close(self) -> None:
        """Stop the journal thread and close the journal (after the last group)."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None
        self.writer.close()
