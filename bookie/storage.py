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
import time
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb
from crc32c import crc32c

from bookie import journal
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
from bookie.journal import JournalCorruptError, JournalWriter, Position
from bookie.proto.bookie_pb2 import LedgerIndexRecord
from bookie.protocol import LAST_ENTRY
from bookie.segments import SegmentStore

log = logging.getLogger(__name__)

__all__ = ["LAST_ENTRY", "EntryStorage", "JournalCorruptError", "LedgerInfo", "corrupt_stored_entry",
           "entry_key", "ledger_prefix"]

DEFAULT_MAP_SIZE = 64 * 1024**3
DEFAULT_WRITE_CACHE = 64 << 20
DEFAULT_JOURNAL_MAX_SIZE = 2 << 30
DEFAULT_JOURNAL_PREALLOCATE = 16 << 20
_MAX_ID = (1 << 63) - 1
_SLICE = 32
"""Completion callbacks run between two checks for handing over the next group."""
_INLINE_ENTRIES = 16
"""A group of at most this many adds is written by the loop thread itself (see ``_start_commit``)."""
_INLINE_SYNC = 0.002
"""... and only while the last journal sync took less than this (seconds): a slow disk never stalls the loop."""
_CHECKPOINT_KEY = b"checkpoint"
_POSITION = struct.Struct(">QQ")

Done = Callable[[BaseException | None], None]
"""Completion callback: ``None`` once durable, else the error (called on the event loop)."""

AckSink = Callable[[list[Any], BaseException | None], None]
"""Completion of a run of adds (``submit_acked_add``): their acks in order, ``None`` once durable, else the error.

An ack is whatever the caller passed for its add (the server: the framed OK answer, or the add's index
in an ADD_ENTRIES frame)."""


_ENTRY_KEY = struct.Struct(">QQ")
_pack_key = _ENTRY_KEY.pack
_HEADER_PACK = journal.HEADER.pack
_ADD_KIND = bytes([journal.ADD])
_ADD_HEAD_PACK = struct.Struct(">BQQ").pack


def _future_placeholder(exc: BaseException | None) -> None:
    raise AssertionError("add_entry replaces this callback with its future")


_FUTURE: Done = _future_placeholder


def entry_key(ledger_id: int, entry_id: int) -> bytes:
    """The 16-byte storage key of an entry (ledger id, entry id, big-endian)."""
    return _ENTRY_KEY.pack(ledger_id, entry_id)


def ledger_prefix(ledger_id: int) -> bytes:
    """The 8-byte LMDB key of a ledger's record, and the prefix of its entries' keys."""
    return ledger_id.to_bytes(8, "big")


@dataclass(frozen=True)
class LedgerInfo:
    """A snapshot of one ledger's record (including writes not yet durable)."""

    ledger_id: int
    master_key: bytes
    fenced: bool
    lac: int


class _LedgerState:
    __slots__ = ("fenced", "lac", "last", "master_key")

    def __init__(self, master_key: bytes, fenced: bool = False, lac: int = -1, last: int = -1) -> None:
        self.master_key = master_key
        self.fenced = fenced
        self.lac = lac
        self.last = last  # highest entry id readable (durable: in the cache or LMDB)

    def record(self) -> bytes:
        return LedgerIndexRecord(master_key=self.master_key, fenced=self.fenced,
                                 lac=self.lac).SerializeToString()


class _Batch:
    """The writes of one group commit.

    Entries are two parallel lists (keys, payloads) rather than a tuple per
    add: the hot path allocates no object the cyclic GC has to track.
    ``parts`` holds the encoded journal records in order (adds, ledger
    records, fences, explicit LACs); ``dirty`` the ledgers whose LAC rose
    (one LAC record each, added when the group is handed over); ``last``
    the highest entry id per ledger. ``waiters`` are the ``done`` callbacks
    (a run of ``submit_acked_add`` adds of one sink is one of them, whose
    acks grow in ``run_acks`` while ``run_sink`` is its sink), ``futures``
    those of the coroutine API; both are completed in order, callbacks first.
    The journal thread sets ``position``, ``nbytes`` and ``sync_seconds``;
    ``error`` once the write failed.
    """

    __slots__ = ("dirty", "error", "futures", "keys", "last", "nbytes", "parts", "position", "run_acks",
                 "run_sink", "started", "sync_seconds", "values", "waiters")

    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.values: list[bytes] = []
        self.waiters: list[Done] = []
        self.run_sink: AckSink | None = None  # the sink of the run the last waiter completes (``run_acks``)
        self.run_acks: list[Any] = []
        self.futures: list[asyncio.Future[None]] = []
        self.parts: list[bytes] = []
        self.dirty: set[int] = set()
        self.last: dict[int, int] = {}
        self.error: BaseException | None = None
        self.position: Position | None = None
        self.started = time.perf_counter()
        self.nbytes = 0
        self.sync_seconds = 0.0


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


def _check_ids(ledger_id: int, entry_id: int | None = None) -> None:
    if not 0 <= ledger_id <= _MAX_ID:
        raise BadRequestError(f"ledger id {ledger_id} out of range")
    if entry_id is not None and not 0 <= entry_id <= _MAX_ID:
        raise BadRequestError(f"entry id {entry_id} out of range")


def _open_env(path: Path, map_size: int) -> lmdb.Environment:
    try:
        return lmdb.open(str(path), map_size=map_size, max_dbs=4, sync=True, metasync=True,
                         readahead=False, lock=True)
    except lmdb.Error as exc:
        raise BookieServerError(f"cannot open entry storage at {path}: {exc}") from exc


class EntryStorage:
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

    # --- start-up -------------------------------------------------------------------------------

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

    # --- ledger state ---------------------------------------------------------------------------

    def _ledger(self, ledger_id: int) -> _LedgerState | None:
        state = self._state.get(ledger_id)
        if state is None:
            if ledger_id in self._deleting:
                return None
            with self._env.begin(buffers=True) as txn:
                raw = txn.get(ledger_prefix(ledger_id), db=self._ledgers)
                if raw is None:
                    return None
                rec = LedgerIndexRecord.FromString(bytes(raw))
                last = self._store.last_entry(txn, ledger_id)
            state = self._state[ledger_id] = _LedgerState(rec.master_key, rec.fenced, rec.lac,
                                                          -1 if last is None else last[0])
        return state

    def ledger_info(self, ledger_id: int) -> LedgerInfo | None:
        """The ledger's record, or ``None`` when this bookie has none."""
        state = self._ledger(ledger_id)
        if state is None:
            return None
        return LedgerInfo(ledger_id, state.master_key, state.fenced, state.lac)

    def ledger_ids(self) -> set[int]:
        """Every ledger this storage has a record of (durable or pending)."""
        with self._env.begin(db=self._ledgers) as txn:
            ids = {int.from_bytes(k, "big") for k in txn.cursor().iternext(keys=True, values=False)}
        return (ids - self._deleting) | set(self._state)

    def _new_ledger(self, ledger_id: int, master_key: bytes, batch: _Batch) -> _LedgerState:
        state = self._state[ledger_id] = _LedgerState(master_key)
        self._deleting.discard(ledger_id)
        batch.parts.append(journal.encode_ledger(ledger_id, master_key))
        batch.dirty.add(ledger_id)
        return state

    # --- writes ---------------------------------------------------------------------------------

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

    # --- back-pressure --------------------------------------------------------------------------

    def _throttle(self, key: bytes, payload: bytes, done: Done, ledger_id: int) -> None:
        loop = self._loop or asyncio.get_running_loop()
        self._loop = loop
        deadline = loop.time() + self._max_throttle
        self._throttled.append((key, payload, done, None, ledger_id, deadline))
        if self._throttle_timer is None:
            self._throttle_timer = loop.call_at(deadline, self._throttle_expired)

    def _throttle_expired(self) -> None:
        self._throttle_timer = None
        loop = self._loop
        assert loop is not None
        now = loop.time()
        throttled = self._throttled
        reason = (f"write cache full: no room for {self._max_throttle:g} s while a checkpoint of "
                  f"{self._flushing_bytes} bytes ran")
        flushing = self._flushing
        if flushing is not None and flushing.error is not None:
            reason += f" (the checkpoint fails: {flushing.error})"
        while throttled and throttled[0][5] <= now:
            _, _, done, fut, _, _ = throttled.popleft()
            _fail_waiter(done, fut, BookieServerError(reason))
        if throttled:
            self._throttle_timer = loop.call_at(throttled[0][5], self._throttle_expired)
        else:
            log.warning("%s; adds failed", reason)

    def _fail_throttled(self, exc: BookieServerError) -> None:
        """Fail every add waiting for room in the cache (never journalled)."""
        if self._throttle_timer is not None:
            self._throttle_timer.cancel()
            self._throttle_timer = None
        throttled, self._throttled = self._throttled, collections.deque()
        for _, _, done, fut, _, _ in throttled:
            _fail_waiter(done, fut, exc)

    def _release_throttled(self) -> None:
        """Room in the cache: the waiting adds join the open group, in order."""
        if self._throttle_timer is not None:
            self._throttle_timer.cancel()
            self._throttle_timer = None
        throttled, self._throttled = self._throttled, collections.deque()
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
                batch.waiters.append(_settle(fut))

    # --- reads ----------------------------------------------------------------------------------

    def _cached(self, key: bytes) -> bytes | None:
        found = self._cache.get(key)
        if found is None and self._flushing is not None:
            found = self._flushing.cache.get(key)
        return found

    def read_entry(self, ledger_id: int, entry_id: int) -> tuple[int, bytes]:
        """``(entry_id, payload)`` of a durable entry; ``LAST_ENTRY`` reads the highest one.

        Raises ``NoSuchLedgerError`` when the bookie has no record of the
        ledger, ``NoSuchEntryError`` when it has no such entry (durable),
        ``BadRequestError`` for an id out of range.
        """
        _check_ids(ledger_id, None if entry_id == LAST_ENTRY else entry_id)
        state = self._ledger(ledger_id)
        if state is None:
            raise NoSuchLedgerError(f"no ledger {ledger_id} on this bookie")
        if entry_id == LAST_ENTRY:
            entry_id = state.last
            if entry_id < 0:
                raise NoSuchEntryError(f"no entries of ledger {ledger_id} on this bookie")
        payload = self._cached(_pack_key(ledger_id, entry_id))
        if payload is None:
            with self._env.begin(buffers=True) as txn:
                payload = self._store.read(txn, ledger_id, entry_id)
            if payload is None:
                raise NoSuchEntryError(f"no entry {ledger_id}:{entry_id} on this bookie")
        return entry_id, payload

    def last_entry_id(self, ledger_id: int) -> int:
        """The highest durable entry id of the ledger, ``-1`` when none."""
        state = self._ledger(ledger_id)
        return -1 if state is None else state.last

    def read_lac(self, ledger_id: int) -> int:
        """The highest LAC piggybacked on an add or written explicitly (``-1`` when none); ``NoSuchLedgerError``."""
        _check_ids(ledger_id)
        state = self._ledger(ledger_id)
        if state is None:
            raise NoSuchLedgerError(f"no ledger {ledger_id} on this bookie")
        return state.lac

    def map_usage(self) -> tuple[int, int]:
        """``(used, size)`` bytes of the LMDB map: its high-water page mark plus what the write cache
        will add at the next checkpoint, and how far it may grow."""
        info = self._env.info()
        psize = int(self._env.stat()["psize"])
        pending = self.cache_bytes + self._flushing_bytes
        return (int(info["last_pgno"]) + 1) * psize + pending, int(info["map_size"])

    def lmdb_usage(self) -> tuple[int, int]:
        """``(file_bytes, reclaimable_bytes)`` of the LMDB file: its high-water page mark, and the part of it
        no database page uses (the free pages of deleted ledgers, which later checkpoints reuse before the
        file grows; LMDB's file itself never shrinks)."""
        info = self._env.info()
        with self._env.begin() as txn:
            stats = [self._env.stat()] + [txn.stat(db) for db in (self._store.segments, self._store.legacy,
                                                                 self._ledgers, self._meta)]
        psize = int(stats[0]["psize"])
        used = 2 + sum(int(st["branch_pages"]) + int(st["leaf_pages"]) + int(st["overflow_pages"])
                       for st in stats)   # + the two meta pages
        high = int(info["last_pgno"]) + 1
        return high * psize, max(0, high - used) * psize

    def entry_count(self) -> int:
        """Durable entries in the storage, all ledgers (scans LMDB: for tools and tests)."""
        keys = set(self._cache)
        if self._flushing is not None:
            keys |= set(self._flushing.cache)
        with self._env.begin(buffers=True) as txn:
            n = self._store.count(txn)
            for key in keys:
                lid, eid = _ENTRY_KEY.unpack(key)
                if lid not in self._deleting and self._store.read(txn, lid, eid) is None:
                    n += 1
        return n

    @property
    def journal_position(self) -> Position:
        """The end of the last synced journal group."""
        return self._synced

    # --- group commit (the journal) -------------------------------------------------------------

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

    # --- checkpoints (the write cache into LMDB) ------------------------------------------------

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

    # --- test hooks -----------------------------------------------------------------------------

    def corrupt_entry_for_test(self, ledger_id: int, entry_id: int) -> None:
        """Flip the last byte of a stored entry (test hook: the client must detect it)."""
        key = entry_key(ledger_id, entry_id)
        for cache in (self._cache, self._flushing.cache if self._flushing is not None else {}):
            payload = cache.get(key)
            if payload:
                cache[key] = payload[:-1] + bytes([payload[-1] ^ 0xFF])
                return
        with self._env.begin(write=True) as txn:
            if not self._store.corrupt(txn, ledger_id, entry_id):
                raise NoSuchEntryError(f"no entry {ledger_id}:{entry_id} to corrupt")


def _fail_waiter(done: Done, fut: asyncio.Future[None] | None, exc: BookieServerError) -> None:
    """Fail one add that never reached the journal: its future if it has one, else its callback."""
    if fut is not None:
        if not fut.done():
            fut.set_exception(exc)
        return
    try:
        done(exc)
    except Exception:
        log.exception("entry storage completion callback raised")


def _settle(fut: asyncio.Future[None]) -> Done:
    def done(exc: BaseException | None) -> None:
        if not fut.done():
            if exc is None:
                fut.set_result(None)
            else:
                fut.set_exception(exc)
    return done


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
