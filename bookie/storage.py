"""Entry storage: ledger entries in LMDB with group commit.

    storage = EntryStorage("/var/lib/quire/bookie")
    await storage.add_entry(ledger_id, entry_id, master_key, payload, lac)   # durable on return
    entry_id, payload = storage.read_entry(ledger_id, LAST_ENTRY)
    await storage.fence(ledger_id, master_key)
    await storage.close()

Layout: one LMDB environment (opened with ``sync=True``: a commit returns
after fsync) holding two databases. ``entries`` maps
``ledger_id (8 bytes BE) + entry_id (8 bytes BE)`` to the entry payload
(``bookie/digest.py`` format, stored as received); ``ledgers`` maps
``ledger_id (8 bytes BE)`` to a ``LedgerIndexRecord`` (master key, fenced
flag, highest LAC piggybacked on an add).

Group commit: every write (add, fence, delete) joins the open batch. While
no commit is in flight the batch is handed, at the end of the current loop
turn, to a single commit thread that writes it in one transaction; adds that
arrive meanwhile fill the next batch, which is handed over as soon as the
previous commit returns. A write is acknowledged (its future resolved or
``done`` callback called) only after its transaction committed with sync, so
every acknowledged add survives a kill -9.

The per-add cost on the loop is what bounds a bookie's throughput, so the
write path is lean: ``submit_add`` validates and appends the key, payload and
callback to the open batch (no object per add besides the key); the commit
thread puts the batch with one ``putmulti`` (``append=True`` when its keys
sort after everything stored, the usual case of a ledger written in order);
and a finished commit comes back to the loop as one ``call_soon_threadsafe``
that runs the batch's callbacks in a tight loop. While it runs them it hands
the next batch (filled meanwhile, or by those very callbacks when clients
pipeline their adds) to the commit thread, so one batch's fsync overlaps the
loop's work on the other. py-lmdb releases the GIL around every single put;
to keep the puts from trading the GIL with a busy loop one at a time, the
completion callbacks (when more than ``_SLICE`` are left) pause while the
commit thread puts a batch handed over in their midst (the loop serves other events meanwhile, or sleeps in
its selector with the GIL released) and resume when the thread reports the
batch staged (``call_soon_threadsafe``, sent only for a batch handed over
in such a pause, so a lone commit wakes the loop once), or after
``_STAGE_WAIT`` at the latest; they run on during the fsync. The loop never
waits on a lock.

Validation happens on the event loop against the in-memory ledger state,
which already includes writes not yet committed: the first add to a ledger
records its master key, another key is refused with ``UnauthorizedError``, a
fenced ledger refuses adds with ``LedgerFencedError`` (recovery adds pass).
Reads see committed entries only.

Failures: validation errors are raised synchronously; a failed commit
(disk full, map full) is passed to every waiter of that batch as a
``BookieServerError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb

from bookie.disk import describe_commit_error
from bookie.errors import (
    BadRequestError,
    BKError,
    BookieServerError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
)
from bookie.proto.bookie_pb2 import LedgerIndexRecord
from bookie.protocol import LAST_ENTRY

log = logging.getLogger(__name__)


DEFAULT_MAP_SIZE = 64 * 1024**3
_MAX_ID = (1 << 63) - 1
_STAGE_WAIT = 0.002
"""Longest the completion callbacks of a batch pause while the commit thread puts the next (seconds).

Only a scheduling aid, and the loop never blocks on it: past it (the LMDB
writer lock held by another process, a huge batch) the callbacks run on
while the puts finish concurrently."""
_SLICE = 32
"""Completion callbacks run between two checks for handing over the next batch."""

Done = Callable[[BaseException | None], None]
"""Completion callback: ``None`` once durable, else the error (called on the event loop)."""


_ENTRY_KEY = struct.Struct(">QQ")
_pack_key = _ENTRY_KEY.pack


def _future_placeholder(exc: BaseException | None) -> None:
    raise AssertionError("add_entry replaces this callback with its future")


_FUTURE: Done = _future_placeholder


def entry_key(ledger_id: int, entry_id: int) -> bytes:
    """The 16-byte LMDB key of an entry."""
    return _ENTRY_KEY.pack(ledger_id, entry_id)


def ledger_prefix(ledger_id: int) -> bytes:
    """The 8-byte LMDB key of a ledger's record, and the prefix of its entries' keys."""
    return ledger_id.to_bytes(8, "big")


@dataclass(frozen=True)
class LedgerInfo:
    """A snapshot of one ledger's record (including writes not yet committed)."""

    ledger_id: int
    master_key: bytes
    fenced: bool
    lac: int


class _LedgerState:
    __slots__ = ("fenced", "lac", "master_key")

    def __init__(self, master_key: bytes, fenced: bool = False, lac: int = -1) -> None:
        self.master_key = master_key
        self.fenced = fenced
        self.lac = lac

    def record(self) -> bytes:
        return LedgerIndexRecord(master_key=self.master_key, fenced=self.fenced,
                                 lac=self.lac).SerializeToString()


class _Batch:
    """The writes of one group commit.

    Entries are two parallel lists (keys, payloads) rather than a tuple per
    add: the hot path allocates no object the cyclic GC has to track.
    ``waiters`` are the ``done`` callbacks, ``futures`` those of the
    coroutine API; both are completed in order, callbacks first.
    ``error`` is set once the commit failed (the waiters get it).
    """

    __slots__ = ("deletes", "dirty", "error", "futures", "keys", "nbytes", "notify_staged", "records", "started",
                 "values", "waiters")

    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.values: list[bytes] = []
        self.waiters: list[Done] = []
        self.futures: list[asyncio.Future[None]] = []
        self.dirty: set[int] = set()
        self.deletes: list[int] = []
        self.records: list[tuple[bytes, bytes]] = []
        self.error: BaseException | None = None
        self.started = time.perf_counter()
        self.nbytes = 0
        self.notify_staged = False  # the loop paused callbacks until this batch is staged


def _check_ids(ledger_id: int, entry_id: int | None = None) -> None:
    if not 0 <= ledger_id <= _MAX_ID:
        raise BadRequestError(f"ledger id {ledger_id} out of range")
    if entry_id is not None and not 0 <= entry_id <= _MAX_ID:
        raise BadRequestError(f"entry id {entry_id} out of range")


class EntryStorage:
    """Durable entry storage of one bookie; see the module docstring.

    All methods are called from one event loop thread; commits run on a
    private thread. ``on_commit(entries, seconds)`` (optional) is called on
    the loop after each commit with the number of entries written and the
    time from the batch's first write to its commit.
    """

    def __init__(self, path: str | os.PathLike[str], *, map_size: int = DEFAULT_MAP_SIZE) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        try:
            self._env = lmdb.open(str(self.path), map_size=map_size, max_dbs=2, sync=True,
                                  metasync=True, readahead=False, lock=True)
        except lmdb.Error as exc:
            raise BookieServerError(f"cannot open entry storage at {self.path}: {exc}") from exc
        self._entries = self._env.open_db(b"entries")
        self._ledgers = self._env.open_db(b"ledgers")
        self._state: dict[int, _LedgerState] = {}
        self._batch: _Batch | None = None
        self._committing = False
        self._kicked = False
        self._closing = False
        self._closed = False
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._completing: _Batch | None = None  # a committed batch whose callbacks are paused
        self._resume_timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._jobs: queue.SimpleQueue[_Batch | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.on_commit: Callable[[int, float], None] | None = None
        self.on_commit_error: Callable[[str, bool], None] | None = None
        self.on_lac: Callable[[int, int], None] | None = None
        """Called on the loop as ``on_lac(ledger_id, lac)`` when a ledger's LAC rises (long-poll reads)."""
        self.last_commit_bytes = 0
        self.commits = 0
        self.entries_committed = 0

    # --- ledger state ---------------------------------------------------------------------------

    def _ledger(self, ledger_id: int) -> _LedgerState | None:
        state = self._state.get(ledger_id)
        if state is None:
            with self._env.begin(db=self._ledgers) as txn:
                raw = txn.get(ledger_prefix(ledger_id))
            if raw is None:
                return None
            rec = LedgerIndexRecord.FromString(raw)
            state = self._state[ledger_id] = _LedgerState(rec.master_key, rec.fenced, rec.lac)
        return state

    def ledger_info(self, ledger_id: int) -> LedgerInfo | None:
        """The ledger's record, or ``None`` when this bookie has none."""
        state = self._ledger(ledger_id)
        if state is None:
            return None
        return LedgerInfo(ledger_id, state.master_key, state.fenced, state.lac)

    def ledger_ids(self) -> set[int]:
        """Every ledger this storage has a record of (committed or pending)."""
        with self._env.begin(db=self._ledgers) as txn:
            ids = {int.from_bytes(k, "big") for k in txn.cursor().iternext(keys=True, values=False)}
        return ids | set(self._state)

    # --- writes ---------------------------------------------------------------------------------

    def submit_add(self, ledger_id: int, entry_id: int, master_key: bytes, payload: bytes, lac: int,
                   done: Done, *, recovery: bool = False) -> None:
        """Queue one entry for the next group commit; ``done(None)`` once it is durable.

        Raises at once (``done`` is then never called): ``BadRequestError``
        for an id out of range, ``UnauthorizedError`` for a master key other
        than the ledger's, ``LedgerFencedError`` on a fenced ledger unless
        ``recovery``, ``BookieServerError`` when the storage is closing.
        """
        # The hot path of the server: kept inline (no helper call), with no
        # per-add allocation besides the key (see ``_Batch``).
        if self._closing:
            raise BookieServerError("entry storage is closing")
        if not (0 <= ledger_id <= _MAX_ID and 0 <= entry_id <= _MAX_ID):
            raise BadRequestError(f"entry id {ledger_id}:{entry_id} out of range")
        state = self._state.get(ledger_id) or self._ledger(ledger_id)
        batch = self._batch or self._open_batch()
        if state is None:
            state = self._state[ledger_id] = _LedgerState(master_key)
            batch.dirty.add(ledger_id)
        elif state.master_key != master_key:
            raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")
        elif state.fenced and not recovery:
            raise LedgerFencedError(f"ledger {ledger_id} is fenced")
        if lac > state.lac:
            state.lac = lac
            batch.dirty.add(ledger_id)
            if self.on_lac is not None:
                self.on_lac(ledger_id, lac)
        batch.keys.append(_pack_key(ledger_id, entry_id))
        batch.values.append(payload)
        batch.waiters.append(done)

    def add_entry(self, ledger_id: int, entry_id: int, master_key: bytes, payload: bytes,
                  lac: int = -1, *, recovery: bool = False) -> asyncio.Future[None]:
        """Store one entry: ``await storage.add_entry(...)`` returns once it is durable.

        A plain function returning a future (one coroutine less per add on
        the hot path); the future fails with the errors of ``submit_add`` or
        of the commit.
        """
        fut: asyncio.Future[None] = (self._loop or asyncio.get_running_loop()).create_future()
        try:
            self.submit_add(ledger_id, entry_id, master_key, payload, lac, _FUTURE, recovery=recovery)
        except BKError as exc:
            fut.set_exception(exc)
        else:  # swap the placeholder for the future (``submit_add`` appended it last)
            batch = self._batch
            assert batch is not None
            batch.waiters.pop()
            batch.futures.append(fut)
        return fut

    def submit_fence(self, ledger_id: int, master_key: bytes, done: Done) -> None:
        """Fence the ledger (creating its record if unknown); ``done(None)`` once durable.

        Raises ``UnauthorizedError`` for a wrong master key, ``BadRequestError``
        for a bad id, ``BookieServerError`` when closing.
        """
        self._fence(ledger_id, master_key).waiters.append(done)

    async def fence(self, ledger_id: int, master_key: bytes) -> None:
        """Fence the ledger durably; errors as ``submit_fence``."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._fence(ledger_id, master_key).futures.append(fut)
        await fut

    def _fence(self, ledger_id: int, master_key: bytes) -> _Batch:
        if self._closing:
            raise BookieServerError("entry storage is closing")
        _check_ids(ledger_id)
        state = self._ledger(ledger_id)
        if state is None:
            state = self._state[ledger_id] = _LedgerState(master_key)
        elif state.master_key != master_key:
            raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")
        batch = self._batch or self._open_batch()
        state.fenced = True
        batch.dirty.add(ledger_id)
        return batch

    def submit_write_lac(self, ledger_id: int, master_key: bytes, lac: int, done: Done) -> None:
        """Record an explicit LAC sent by the ledger's writer; ``done(None)`` once durable.

        The ledger's LAC becomes the larger of the stored one and ``lac``
        (``read_lac`` serves it, ``on_lac`` hears of the rise at once). An
        unknown ledger gets a record with ``master_key``. Raises
        ``UnauthorizedError`` for another master key, ``BadRequestError``
        for a bad id or a LAC below -1, ``BookieServerError`` when closing.
        """
        if self._closing:
            raise BookieServerError("entry storage is closing")
        _check_ids(ledger_id)
        if not -1 <= lac <= _MAX_ID:
            raise BadRequestError(f"LAC {lac} out of range")
        state = self._ledger(ledger_id)
        batch = self._batch or self._open_batch()
        if state is None:
            state = self._state[ledger_id] = _LedgerState(master_key)
            batch.dirty.add(ledger_id)
        elif state.master_key != master_key:
            raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")
        if lac > state.lac:
            state.lac = lac
            batch.dirty.add(ledger_id)
            if self.on_lac is not None:
                self.on_lac(ledger_id, lac)
        batch.waiters.append(done)

    async def delete_ledger(self, ledger_id: int) -> None:
        """Delete the ledger's entries and record durably (garbage collection)."""
        if self._closing:
            raise BookieServerError("entry storage is closing")
        _check_ids(ledger_id)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._state.pop(ledger_id, None)
        batch = self._batch or self._open_batch()
        batch.dirty.discard(ledger_id)
        batch.deletes.append(ledger_id)
        batch.futures.append(fut)
        await fut

    # --- reads ----------------------------------------------------------------------------------

    def read_entry(self, ledger_id: int, entry_id: int) -> tuple[int, bytes]:
        """``(entry_id, payload)`` of a committed entry; ``LAST_ENTRY`` reads the highest one.

        Raises ``NoSuchLedgerError`` when the bookie has no record of the
        ledger, ``NoSuchEntryError`` when it has no such entry (committed),
        ``BadRequestError`` for an id out of range.
        """
        _check_ids(ledger_id, None if entry_id == LAST_ENTRY else entry_id)
        if self._ledger(ledger_id) is None:
            raise NoSuchLedgerError(f"no ledger {ledger_id} on this bookie")
        with self._env.begin(db=self._entries) as txn:
            if entry_id != LAST_ENTRY:
                payload = txn.get(entry_key(ledger_id, entry_id))
                if payload is None:
                    raise NoSuchEntryError(f"no entry {ledger_id}:{entry_id} on this bookie")
                return entry_id, payload
            found = self._last_key(txn, ledger_id)
            if found is None:
                raise NoSuchEntryError(f"no entries of ledger {ledger_id} on this bookie")
            key, payload = found
            return int.from_bytes(key[8:], "big"), payload

    def _last_key(self, txn: lmdb.Transaction, ledger_id: int) -> tuple[bytes, bytes] | None:
        cur = txn.cursor()
        positioned = cur.set_range(entry_key(ledger_id + 1, 0)) if ledger_id < _MAX_ID else False
        if not (cur.prev() if positioned else cur.last()):
            return None
        key = bytes(cur.key())
        if key[:8] != ledger_prefix(ledger_id):
            return None
        return key, bytes(cur.value())

    def last_entry_id(self, ledger_id: int) -> int:
        """The highest committed entry id of the ledger, ``-1`` when none."""
        with self._env.begin(db=self._entries) as txn:
            found = self._last_key(txn, ledger_id)
        return -1 if found is None else int.from_bytes(found[0][8:], "big")

    def read_lac(self, ledger_id: int) -> int:
        """The highest LAC piggybacked on an add or written explicitly (``-1`` when none); ``NoSuchLedgerError``."""
        _check_ids(ledger_id)
        state = self._ledger(ledger_id)
        if state is None:
            raise NoSuchLedgerError(f"no ledger {ledger_id} on this bookie")
        return state.lac

    def map_usage(self) -> tuple[int, int]:
        """``(used, size)`` bytes of the LMDB map: its high-water page mark, and how far it may grow."""
        info = self._env.info()
        psize = int(self._env.stat()["psize"])
        return (int(info["last_pgno"]) + 1) * psize, int(info["map_size"])

    def entry_count(self) -> int:
        """Committed entries in the storage (all ledgers)."""
        with self._env.begin(db=self._entries) as txn:
            return int(txn.stat(self._entries)["entries"])

    # --- group commit ---------------------------------------------------------------------------

    def _open_batch(self) -> _Batch:
        batch = self._batch = _Batch()
        if not self._committing and not self._kicked:
            self._kicked = True
            loop = self._loop or asyncio.get_running_loop()
            self._loop = loop
            loop.call_soon(self._start_commit)
        return batch

    def _start_commit(self, notify_staged: bool = False) -> bool:
        """Hand the open batch to the commit thread (on the loop; one commit in flight at most).

        Returns whether a batch was handed over. With ``notify_staged`` the
        thread reports when it has put the batch into its transaction
        (``_staged``: the caller pauses its callbacks until then); otherwise
        it reports only the commit, one wake-up of the loop per commit.
        """
        self._kicked = False
        batch = self._batch
        if batch is None or self._committing:
            return False
        if self._thread is None:
            loop = self._loop = self._loop or asyncio.get_running_loop()
            thread = threading.Thread(target=self._commit_thread, args=(loop,),
                                      name="bookie-commit", daemon=True)
            thread.start()
            self._thread = thread
        state = self._state
        batch.records = [(ledger_prefix(lid), ledger.record())
                         for lid in batch.dirty if (ledger := state.get(lid)) is not None]
        batch.notify_staged = notify_staged
        self._batch = None
        self._committing = True
        self._jobs.put(batch)
        return True

    def _commit_thread(self, loop: asyncio.AbstractEventLoop) -> None:
        """The commit thread: write each batch handed over, then complete it on the loop."""
        jobs = self._jobs
        done = self._commit_done
        staged = self._staged
        while True:
            batch = jobs.get()
            if batch is None:
                return
            error: BaseException | None = None
            try:
                self._write(batch, loop, staged)
                batch.nbytes = sum(map(len, batch.values))
            except BaseException as exc:  # reported to every waiter of the batch
                error = exc
            try:
                loop.call_soon_threadsafe(done, batch, error)
            except RuntimeError:  # the loop is closed: nobody is left to tell
                log.error("entry storage commit finished after its event loop closed")
                return

    def _write(self, batch: _Batch, loop: asyncio.AbstractEventLoop, staged: Callable[[], None]) -> None:
        """On the commit thread: one transaction, committed with sync (the env has ``sync=True``)."""
        try:
            txn = self._env.begin(write=True)
            try:
                self._put(txn, batch)
            except BaseException:
                txn.abort()
                raise
        finally:
            if batch.notify_staged:
                with contextlib.suppress(RuntimeError):  # the loop is closed
                    loop.call_soon_threadsafe(staged)  # paused callbacks resume; deletes may take long
        try:
            for lid in batch.deletes:
                prefix = ledger_prefix(lid)
                cur = txn.cursor(db=self._entries)
                if cur.set_range(prefix):
                    while cur.key()[:8] == prefix:
                        if not cur.delete():
                            break
                txn.delete(prefix, db=self._ledgers)
        except BaseException:
            txn.abort()
            raise
        txn.commit()

    def _put(self, txn: lmdb.Transaction, batch: _Batch) -> None:
        keys = batch.keys
        if keys:
            cur = txn.cursor(db=self._entries)
            items = zip(keys, batch.values, strict=True)
            # A ledger is mostly written in order: when the batch's keys ascend past
            # every stored key, MDB_APPEND skips the tree descent and fills pages
            # rather than splitting them. Should an append be refused (a key twice
            # in the batch), the whole batch is put again plainly: same result as
            # plain puts, the later add of a key wins.
            if keys == sorted(keys) and (not cur.last() or bytes(cur.key()) < keys[0]):
                consumed, added = cur.putmulti(items, append=True)
                if added != consumed:
                    cur.putmulti(zip(keys, batch.values, strict=True))
            else:
                cur.putmulti(items)
        if batch.records:
            txn.cursor(db=self._ledgers).putmulti(batch.records)

    def _commit_done(self, batch: _Batch, cause: BaseException | None) -> None:
        """On the loop: the batch's transaction committed (``cause`` is None) or failed."""
        if self._completing is not None:  # never happens (staged is reported first); keep order anyway
            self._staged()
        self._committing = False
        n = len(batch.keys)
        if cause is not None:
            reason, no_space = describe_commit_error(cause, self.path)
            log.error("entry storage commit of %d entries failed: %s", n, reason)
            exc = BookieServerError(f"commit failed: {reason}")
            exc.__cause__ = cause
            batch.error = exc
            if self.on_commit_error is not None:
                try:
                    self.on_commit_error(reason, no_space)
                except Exception:
                    log.exception("entry storage on_commit_error hook raised")
        else:
            self.commits += 1
            self.entries_committed += n
            self.last_commit_bytes = batch.nbytes
            if self.on_commit is not None:
                try:
                    self.on_commit(n, time.perf_counter() - batch.started)
                except Exception:
                    log.exception("entry storage on_commit hook raised")
        for lid in batch.deletes:
            self._state.pop(lid, None)
        batch.waiters.reverse()  # popped from the end, in order
        self._complete(batch)

    def _complete(self, batch: _Batch) -> None:
        """Run the batch's callbacks in order; pause when the next batch is handed over in their midst.

        Each callback is dropped as soon as it has run: what it holds is freed at
        once, and a batch of dead closures does not pile up to trigger cyclic GC
        passes (they count allocations minus deallocations).
        """
        exc = batch.error
        waiters = batch.waiters
        pop = waiters.pop
        left = len(waiters)
        seen = -1
        while left:
            # The commit thread is idle: hand it the open batch once that holds as
            # many adds as there are callbacks left to run, or once the callbacks
            # stop adding to it. Pipelining clients (whose callbacks add again) then
            # settle into two batches of about the same size, one committing while
            # the loop runs the callbacks of the other. While the thread puts the
            # batch, the callbacks pause (see the module docstring).
            if not self._committing and self._batch is not None:
                size = len(self._batch.keys)
                pause = left > _SLICE  # pause only when many callbacks are left
                if (size >= left or size == seen) and self._start_commit(pause) and pause:
                    self._completing = batch
                    loop = self._loop
                    assert loop is not None
                    self._resume_timer = loop.call_later(_STAGE_WAIT, self._staged)
                    return
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
                self._start_commit()
            else:
                idle, self._idle_waiters = self._idle_waiters, []
                for w in idle:
                    if not w.done():
                        w.set_result(None)

    def _staged(self) -> None:
        """On the loop: the commit thread put the batch handed over (or ``_STAGE_WAIT`` passed)."""
        if self._resume_timer is not None:
            self._resume_timer.cancel()
            self._resume_timer = None
        batch, self._completing = self._completing, None
        if batch is not None:
            self._complete(batch)

    async def flush(self) -> None:
        """Return once every write submitted so far is committed (and its callbacks ran)."""
        while self._committing or self._batch is not None or self._completing is not None:
            idle = asyncio.get_running_loop().create_future()
            self._idle_waiters.append(idle)
            if not self._committing:
                self._start_commit()
            await idle

    async def close(self) -> None:
        """Refuse new writes, wait for the commits in flight, close the environment."""
        if self._closed:
            return
        self._closing = True
        await self.flush()
        self._closed = True
        if self._thread is not None:
            self._jobs.put(None)  # the thread is idle (nothing in flight): it ends at once
            self._thread.join()
            self._thread = None
        self._env.close()

    @property
    def closed(self) -> bool:
        return self._closed

    # --- test hooks -----------------------------------------------------------------------------

    def corrupt_entry_for_test(self, ledger_id: int, entry_id: int) -> None:
        """Flip the last byte of a stored entry (test hook: the client must detect it)."""
        with self._env.begin(write=True, db=self._entries) as txn:
            _flip_last_byte(txn, self._entries, ledger_id, entry_id)


def corrupt_stored_entry(path: str | os.PathLike[str], ledger_id: int, entry_id: int) -> None:
    """Flip the last byte of a stored entry in the storage at ``path`` (test hook).

    Safe while a bookie process uses the directory (LMDB serialises writers
    across processes). Raises ``NoSuchEntryError`` when the entry is absent.
    """
    env = lmdb.open(str(path), max_dbs=2, sync=True, lock=True, create=False)
    try:
        db = env.open_db(b"entries")
        with env.begin(write=True, db=db) as txn:
            _flip_last_byte(txn, db, ledger_id, entry_id)
    finally:
        env.close()


def _flip_last_byte(txn: lmdb.Transaction, db: Any, ledger_id: int, entry_id: int) -> None:
    key = entry_key(ledger_id, entry_id)
    found = txn.get(key, db=db)
    if found is None:
        raise NoSuchEntryError(f"no entry {ledger_id}:{entry_id} to corrupt")
    payload = bytes(found)
    if not payload:
        raise BadRequestError(f"entry {ledger_id}:{entry_id} is empty")
    txn.put(key, payload[:-1] + bytes([payload[-1] ^ 0xFF]), db=db)
