"""Entry storage: a journal for durability, a write cache, LMDB behind it (BookKeeper's DbLedgerStorage).

    storage = EntryStorage("/var/lib/quire/bookie")          # replays the journal first
    await storage.add_entry(ledger_id, entry_id, master_key, payload, lac)   # durable on return
    storage.submit_add(ledger_id, entry_id, master_key, payload, lac, done)   # done(None) once durable
    storage.submit_acked_add(sink, ack, ledger_id, entry_id, master_key, payload, lac)   # sink([ack, ...], None)
    entry_id, payload = storage.read_entry(ledger_id, LAST_ENTRY)
    await storage.fence(ledger_id, master_key)
    await storage.checkpoint()                               # write cache -> LMDB, old journal files go
    await storage.close()

The write path (an add is acknowledged once durable):

1. ``submit_add`` validates on the event loop against the in-memory ledger
   state (which includes writes not yet durable): the first add to a ledger
   records its master key, another key is refused with
   ``UnauthorizedError``, a fenced ledger refuses adds with
   ``LedgerFencedError`` (recovery adds pass). The add joins the open
   *group*; ledger records (``LEDGER``: a ledger's master key when it becomes
   known, ``FENCE``, explicit ``LAC``) join it too.
2. Group commit: while no journal write is in flight the group is handed,
   at the end of the loop turn (or ``group_wait`` after its first write), to
   the journal thread, which encodes its records (``bookie.journal``: length,
   CRC32C, kind, body; one ``LAC`` record per ledger whose piggybacked LAC
   rose), writes them with one ``pwrite`` and syncs them with one
   ``fdatasync``. Groups that fill meanwhile go next. One hand-off each way
   per group: a queue put to the thread, one ``call_soon_threadsafe`` back.
   A small group (at most ``_INLINE_ENTRIES`` adds, while syncs take under
   ``_INLINE_SYNC``) handed over at the end of a loop turn is written by the
   loop thread itself: at low rates the hand-off and the wake-ups cost more
   CPU than the write, and the adds wait for a sync either way.
3. Back on the loop the group's entries enter the *write cache* (a dict
   keyed by the 16-byte storage key) and its callbacks run in order (a run
   of ``submit_acked_add`` adds with one sink is one call: the server's
   connections).
4. Checkpoint: every ``flush_interval`` seconds, or once the cache holds half
   of ``write_cache_max_size`` bytes, the cache is swapped for an empty one
   and the flush thread writes the swapped one into LMDB in one synced
   transaction (``bookie.segments``: one value per run of a ledger's
   entries), with the ledger records and the journal position it covers;
   then journal files wholly before that position are deleted.
   Reads look in the cache, then in the cache being flushed, then in LMDB.
5. Back-pressure: while a flush runs and the cache is half full again, the
   cache is full: adds wait (unjournalled, in order) for the flush, at most
   ``max_throttle`` seconds, then fail with ``BookieServerError("write cache
   full ...")``. Memory stays bounded by the cache and the connections' own
   flow control.

Restart: the constructor replays the journal from the last checkpoint into
LMDB (and deletes the replayed files) before anything is served, so a
kill -9 (or a power cut) loses no acknowledged add, fence or master key. A
torn record at the tail ends the replay; damage before the tail raises
``JournalCorruptError`` naming the file and offset. A directory written
before the journal existed (entries in LMDB database ``entries``, no
checkpoint) opens as it is.

Failures: validation errors are raised synchronously; a failed journal
write is passed to every waiter of that group as a ``BookieServerError``; a
failed checkpoint (disk full, map full) keeps its entries in memory
(readable, retried every ``flush_interval``) and is reported through
``on_commit_error``; the cache then fills and adds fail clearly.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import os
import queue
import struct
import threading
from collections.abc import Callable, Container, Iterable
from pathlib import Path

from crc32c import crc32c

from bookie import journal
from bookie.checkpoints import Checkpoints
from bookie.errors import (
    BadRequestError,
    BKError,
    BookieServerError,
    LedgerFencedError,
    UnauthorizedError,
)
from bookie.group_commit import GroupCommit
from bookie.journal import JournalCorruptError, JournalWriter, Position
from bookie.protocol import LAST_ENTRY
from bookie.segments import SegmentStore
from bookie.storage_core import (
    _HEADER_PACK,
    _MAX_ID,
    DEFAULT_JOURNAL_MAX_SIZE,
    DEFAULT_JOURNAL_PREALLOCATE,
    DEFAULT_MAP_SIZE,
    DEFAULT_WRITE_CACHE,
    AckSink,
    Done,
    LedgerInfo,
    _Batch,
    _check_ids,
    _Flush,
    _LedgerState,
    _open_env,
    _pack_key,
    entry_key,
    ledger_prefix,
)
from bookie.storage_reads import StorageReads, corrupt_stored_entry
from bookie.write_cache import WriteCache

log = logging.getLogger(__name__)

__all__ = ["LAST_ENTRY", "EntryStorage", "JournalCorruptError", "LedgerInfo", "corrupt_stored_entry",
           "entry_key", "ledger_prefix"]

_ADD_HEAD_PACK = struct.Struct(">BQQ").pack


def _future_placeholder(exc: BaseException | None) -> None:
    raise AssertionError("add_entry replaces this callback with its future")


_FUTURE: Done = _future_placeholder


class EntryStorage(GroupCommit, WriteCache, Checkpoints, StorageReads):
    """Durable entry storage of one bookie; see the module docstring.

    All methods are called from one event loop thread; journal writes and
    checkpoints run on two private threads. Hooks (each optional, called on
    the loop): ``on_commit(entries, seconds)`` after each journal group with
    its size and the time from its first write to its sync;
    ``on_checkpoint(entries, seconds)`` after each checkpoint;
    ``on_commit_error(reason, no_space)`` when a journal write or a
    checkpoint failed; ``on_lac(ledger_id, lac)`` when a ledger's LAC rises.
    """

    def __init__(self, path: str | os.PathLike[str], *, map_size: int = DEFAULT_MAP_SIZE,
                 journal_dir: str | os.PathLike[str] | None = None,
                 journal_max_size: int = DEFAULT_JOURNAL_MAX_SIZE,
                 journal_preallocate: int = DEFAULT_JOURNAL_PREALLOCATE,
                 group_wait: float = 0.0, write_cache_max_size: int = DEFAULT_WRITE_CACHE,
                 flush_interval: float = 1.0, max_throttle: float = 10.0) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.journal_dir = Path(journal_dir) if journal_dir else self.path / "journal"
        self._env = _open_env(self.path, map_size)
        self._store = SegmentStore(self._env)
        self._ledgers = self._env.open_db(b"ledgers")
        self._meta = self._env.open_db(b"journal")
        self._state: dict[int, _LedgerState] = {}
        self._group_wait = max(group_wait, 0.0)
        self._half_cache = max(write_cache_max_size // 2, 1)
        self._flush_interval = flush_interval
        self._max_throttle = max_throttle
        # the write cache: synced entries not yet in LMDB (and the part being flushed)
        self._cache: dict[bytes, bytes] = {}
        self.cache_bytes = 0
        self._flushing: _Flush | None = None
        self._flushing_bytes = 0
        self._dirty: set[int] = set()       # ledgers whose record changed since the last checkpoint
        self._deleting: set[int] = set()    # ledgers to delete at the next checkpoint
        self._checkpoint_waiters: list[asyncio.Future[None]] = []
        self._flush_timer: asyncio.TimerHandle | None = None
        self._synced = Position(0, 0)
        # adds waiting for room in the cache: (key, payload, done, future, ledger, deadline)
        self._throttled: collections.deque[tuple[bytes, bytes, Done, asyncio.Future[None] | None, int, float]] = (
            collections.deque())
        self._throttle_timer: asyncio.TimerHandle | None = None
        self._batch: _Batch | None = None
        self._committing = False
        self._kicked = False
        self._closing = False
        self._closed = False
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._jobs: queue.SimpleQueue[_Batch | None] = queue.SimpleQueue()
        self._flush_jobs: queue.SimpleQueue[_Flush | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._flush_thread: threading.Thread | None = None
        self.on_commit: Callable[[int, float], None] | None = None
        self.on_checkpoint: Callable[[int, float], None] | None = None
        self.on_commit_error: Callable[[str, bool], None] | None = None
        self.on_lac: Callable[[int, int], None] | None = None
        """Called on the loop as ``on_lac(ledger_id, lac)`` when a ledger's LAC rises (long-poll reads)."""
        self.lac_watched: Container[int] | None = None
        """When set, ``on_lac`` is called only for the ledgers in it (the server's ledgers with parked reads)."""
        self.last_commit_bytes = 0
        self.last_sync_seconds = 0.0
        self.last_group_entries = 0
        self.commits = 0
        self.entries_committed = 0
        self.checkpoints = 0
        self.replayed = 0
        try:
            next_file = self._replay()
            self._writer = JournalWriter(self.journal_dir, next_file, max_size=journal_max_size,
                                         preallocate=journal_preallocate)
        except BaseException:
            self._env.close()
            raise
        self._synced = self._writer.position

    # --- writes ------------------------------------------------------------------------------

    def _new_ledger(self, ledger_id: int, master_key: bytes, batch: _Batch) -> _LedgerState:
        state = self._state[ledger_id] = _LedgerState(master_key)
        self._deleting.discard(ledger_id)
        batch.parts.append(journal.encode_ledger(ledger_id, master_key))
        batch.dirty.add(ledger_id)
        return state

    def submit_add(self, ledger_id: int, entry_id: int, master_key: bytes, payload: bytes, lac: int,
                   done: Done, *, recovery: bool = False) -> None:
        """Queue one entry for the next group commit; ``done(None)`` once it is durable.

        Raises at once (``done`` is then never called): ``BadRequestError``
        for an id out of range, ``UnauthorizedError`` for a master key other
        than the ledger's, ``LedgerFencedError`` on a fenced ledger unless
        ``recovery``, ``BookieServerError`` when the storage is closing.
        """
        batch = self._admit(ledger_id, entry_id, master_key, payload, lac, recovery)
        if batch is None:
            self._throttle(_pack_key(ledger_id, entry_id), payload, done, ledger_id)
        else:
            batch.waiters.append(done)
            batch.run_sink = None

    def submit_acked_add(self, sink: AckSink, ack: object, ledger_id: int, entry_id: int, master_key: bytes,
                         payload: bytes, lac: int, *, recovery: bool = False) -> None:
        """``submit_add`` whose completion is handed over in runs (the server's hot path).

        ``ack`` is whatever the caller wants back for this add (the server: its
        framed OK answer). Adds submitted one after the other with the same
        ``sink`` object end with one ``sink(acks, exc)`` call per run, ``acks``
        in submission order; runs and ``done`` callbacks complete in the order
        they were submitted. Raises as ``submit_add`` (``sink`` then never
        hears of this add).
        """
        batch = self._admit(ledger_id, entry_id, master_key, payload, lac, recovery)
        if batch is None:
            self._throttle(_pack_key(ledger_id, entry_id), payload, functools.partial(sink, [ack]), ledger_id)
        elif batch.run_sink is sink:
            batch.run_acks.append(ack)
        else:
            acks = batch.run_acks = [ack]
            batch.run_sink = sink
            batch.waiters.append(functools.partial(sink, acks))

    def _admit(self, ledger_id: int, entry_id: int, master_key: bytes, payload: bytes, lac: int,
               recovery: bool) -> _Batch | None:
        """Check one add and put its journal record in the open group (returned; the caller adds the waiter).

        ``None``: the write cache is full, the caller throttles the add. Raises
        the errors of ``submit_add`` before changing anything but the ledger
        state it loads (and a new ledger's record).
        """
        # The hot path of the server: kept inline (no helper call), with no
        # per-add allocation besides the key and the record head (see ``_Batch``).
        if self._closing:
            raise BookieServerError("entry storage is closing")
        if not (0 <= ledger_id <= _MAX_ID and 0 <= entry_id <= _MAX_ID):
            raise BadRequestError(f"entry id {ledger_id}:{entry_id} out of range")
        state = self._state.get(ledger_id) or self._ledger(ledger_id)
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
        if self._throttled or (self._flushing is not None and self.cache_bytes >= self._half_cache):
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

    def add_entry(self, ledger_id: int, entry_id: int, master_key: bytes, payload: bytes,
                  lac: int = -1, *, recovery: bool = False) -> asyncio.Future[None]:
        """Store one entry: ``await storage.add_entry(...)`` returns once it is durable.

        A plain function returning a future (one coroutine less per add on
        the hot path); the future fails with the errors of ``submit_add`` or
        of the commit.
        """
        fut: asyncio.Future[None] = (self._loop or asyncio.get_running_loop()).create_future()
        throttled = len(self._throttled)
        try:
            self.submit_add(ledger_id, entry_id, master_key, payload, lac, _FUTURE, recovery=recovery)
        except BKError as exc:
            fut.set_exception(exc)
        else:  # swap the placeholder for the future (``submit_add`` appended it last)
            if len(self._throttled) > throttled:
                key, value, _, _, lid, deadline = self._throttled.pop()
                self._throttled.append((key, value, _FUTURE, fut, lid, deadline))
            else:
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
        batch = self._fence(ledger_id, master_key)
        batch.waiters.append(done)
        batch.run_sink = None

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
        batch = self._batch or self._open_batch()
        if state is None:
            state = self._new_ledger(ledger_id, master_key, batch)
        elif state.master_key != master_key:
            raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")
        state.fenced = True
        batch.parts.append(journal.encode_fence(ledger_id))
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
            state = self._new_ledger(ledger_id, master_key, batch)
        elif state.master_key != master_key:
            raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")
        if lac > state.lac:
            state.lac = lac
            batch.dirty.add(ledger_id)
            if self.on_lac is not None:
                self.on_lac(ledger_id, lac)
        batch.waiters.append(done)
        batch.run_sink = None

    async def delete_ledger(self, ledger_id: int) -> None:
        """Delete the ledger's entries and record durably (garbage collection): one checkpoint."""
        await self.delete_ledgers([ledger_id])

    async def delete_ledgers(self, ledger_ids: Iterable[int]) -> None:
        """Delete several ledgers in one checkpoint; ``BookieServerError`` when the checkpoint fails."""
        if self._closing:
            raise BookieServerError("entry storage is closing")
        ids = list(ledger_ids)
        for ledger_id in ids:
            _check_ids(ledger_id)
        for ledger_id in ids:
            self._state.pop(ledger_id, None)
            self._dirty.discard(ledger_id)
            self._deleting.add(ledger_id)
        await self.checkpoint()

    # --- closing -----------------------------------------------------------------------------

    async def close(self) -> None:
        """Refuse new writes, wait for the journal, checkpoint, close (a failed checkpoint is logged)."""
        if self._closed:
            return
        self._closing = True
        self._fail_throttled(BookieServerError("entry storage is closing"))
        await self.flush()
        try:
            await self.checkpoint()
        except BKError as exc:
            log.error("final checkpoint failed; the journal keeps the entries for the next start: %s", exc)
        self._closed = True
        for timer in (self._flush_timer, self._throttle_timer):
            if timer is not None:
                timer.cancel()
        self._flush_timer = self._throttle_timer = None
        for thread, jobs in ((self._thread, self._jobs), (self._flush_thread, self._flush_jobs)):
            if thread is not None:
                jobs.put(None)
                thread.join()
        self._thread = self._flush_thread = None
        self._writer.close()
        self._env.close()

    @property
    def closed(self) -> bool:
        return self._closed
