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
   CRC32C, kind, body; one ``LAC`` record per ledger whose LAC rose, but
   none where an add of the group carries that LAC in its entry header: the
   replay reads it there), writes them with one ``pwrite`` and syncs them with one
   ``fdatasync``. Groups that fill meanwhile go next. One hand-off each way
   per group: a queue put to the thread, one ``call_soon_threadsafe`` back.
   A small group (at most ``_INLINE_ENTRIES`` adds, while syncs take under
   ``_INLINE_SYNC`` on a moving average) handed over at the end of a loop turn is written by the
   loop thread itself: at low rates the hand-off and the wake-ups cost more
   CPU than the write, and the adds wait for a sync either way.
3. Back on the loop the group's entries enter the *write cache* (a dict
   keyed by the 16-byte storage key) and its callbacks run in order (a run
   of ``submit_acked_add`` adds with one sink is one call: the server's
   connections).
4. Checkpoint: every ``flush_interval`` seconds, or once the cache holds
   ``write_cache.CHECKPOINT_BYTES`` (at most half of ``write_cache_max_size``), the cache is swapped for an empty one
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

The parts are collaborators, each owning its state (``EntryStorage`` only
wires them and keeps the public methods): ``storage_core.LedgerIndex`` (LMDB
and the ledgers' records), ``group_commit.GroupCommit`` (steps 1 to 3, the
journal hand-off), ``write_cache.WriteCache`` (the cache and step 5),
``checkpoints.Checkpoints`` (step 4, and the replay) and
``storage_reads.StorageReads``.

Failures: validation errors are raised synchronously; a failed journal
write is passed to every waiter of that group as a ``BookieServerError``; a
failed checkpoint (disk full, map full) keeps its entries in memory
(readable, retried every ``flush_interval``) and is reported through
``on_commit_error``; the cache then fills and adds fail clearly.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Container, Iterable
from pathlib import Path
from typing import Protocol

from bookie.checkpoints import Checkpoints, replay
from bookie.errors import BKError, BookieServerError
from bookie.group_commit import GroupCommit
from bookie.journal import JournalCorruptError, JournalWriter, Position
from bookie.protocol import LAST_ENTRY
from bookie.storage_core import (
    DEFAULT_JOURNAL_MAX_SIZE,
    DEFAULT_JOURNAL_PREALLOCATE,
    DEFAULT_MAP_SIZE,
    DEFAULT_WRITE_CACHE,
    AckSink,
    Done,
    LedgerIndex,
    LedgerInfo,
    _check_ids,
    entry_key,
    ledger_prefix,
)
from bookie.storage_reads import StorageReads, corrupt_stored_entry
from bookie.write_cache import WriteCache

log = logging.getLogger(__name__)


class SubmitAdd(Protocol):
    """``EntryStorage.submit_add``."""

    def __call__(self, ledger_id: int, entry_id: int, master_key: bytes, payload: bytes, lac: int,
                 done: Done, *, recovery: bool = False) -> None: ...


class SubmitAckedAdd(Protocol):
    """``EntryStorage.submit_acked_add``."""

    def __call__(self, sink: AckSink, ack: object, ledger_id: int, entry_id: int, master_key: bytes,
                 payload: bytes, lac: int, *, recovery: bool = False) -> None: ...


class AddEntry(Protocol):
    """``EntryStorage.add_entry``."""

    def __call__(self, ledger_id: int, entry_id: int, master_key: bytes, payload: bytes,
                 lac: int = -1, *, recovery: bool = False) -> asyncio.Future[None]: ...


__all__ = ["LAST_ENTRY", "EntryStorage", "JournalCorruptError", "LedgerInfo", "corrupt_stored_entry",
           "entry_key", "ledger_prefix"]


class EntryStorage:
    """Durable entry storage of one bookie; see the module docstring.

    All methods are called from one event loop thread; journal writes and
    checkpoints run on two private threads. Hooks (each optional, called on
    the loop): ``on_commit(entries, seconds)`` after each journal group with
    its size and the time from its first write to its sync;
    ``on_checkpoint(entries, seconds)`` after each checkpoint;
    ``on_commit_error(reason, no_space)`` when a journal write or a
    checkpoint failed; ``on_lac(ledger_id, lac)`` when a ledger's LAC rises.

    The parts: ``index`` (``LedgerIndex``), ``journal`` (``GroupCommit``),
    ``cache`` (``WriteCache``), ``checkpointer`` (``Checkpoints``), ``reads``
    (``StorageReads``).
    """

    # The write path's three calls are the journal hand-off's own bound methods (set in ``__init__``):
    # no forwarding frame on the hot path.
    submit_add: SubmitAdd
    """Queue one entry for the next group commit; ``done(None)`` once it is durable.

    Raises at once (``done`` is then never called): ``BadRequestError``
    for an id out of range, ``UnauthorizedError`` for a master key other
    than the ledger's, ``LedgerFencedError`` on a fenced ledger unless
    ``recovery``, ``BookieServerError`` when the storage is closing.
    """
    submit_acked_add: SubmitAckedAdd
    """``submit_add`` whose completion is handed over in runs (the server's hot path).

    ``ack`` is whatever the caller wants back for this add (the server: its
    framed OK answer). Adds submitted one after the other with the same
    ``sink`` object end with one ``sink(acks, exc)`` call per run, ``acks``
    in submission order; runs and ``done`` callbacks complete in the order
    they were submitted. Raises as ``submit_add`` (``sink`` then never
    hears of this add).
    """
    add_entry: AddEntry
    """Store one entry: ``await storage.add_entry(...)`` returns once it is durable.

    A plain function returning a future (one coroutine less per add on
    the hot path); the future fails with the errors of ``submit_add`` or
    of the commit.
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
        self.on_commit_error: Callable[[str, bool], None] | None = None
        self.index = LedgerIndex(self.path, map_size)
        try:
            next_file, self.replayed = replay(self.index, self.journal_dir)
            writer = JournalWriter(self.journal_dir, next_file, max_size=journal_max_size,
                                   preallocate=journal_preallocate)
        except BaseException:
            self.index.close()
            raise
        self.cache = WriteCache(write_cache_max_size, max_throttle, writer.position)
        self.checkpointer = Checkpoints(self.index, self.cache, self.journal_dir, interval=flush_interval,
                                        report_error=self._report_error)
        self.journal = GroupCommit(self.index, self.cache, self.checkpointer, writer, self.journal_dir,
                                   group_wait=group_wait, report_error=self._report_error)
        self.checkpointer.group = self.journal
        self.reads = StorageReads(self.index, self.cache)
        self.submit_add = self.journal.submit_add
        self.submit_acked_add = self.journal.submit_acked_add
        self.add_entry = self.journal.add_entry
        self._closed = False

    def _report_error(self, reason: str, no_space: bool) -> None:
        if self.on_commit_error is not None:
            try:
                self.on_commit_error(reason, no_space)
            except Exception:
                log.exception("entry storage on_commit_error hook raised")

    # --- writes (``GroupCommit``) ------------------------------------------------------------

    def submit_fence(self, ledger_id: int, master_key: bytes, done: Done) -> None:
        """Fence the ledger (creating its record if unknown); ``done(None)`` once durable.

        Raises ``UnauthorizedError`` for a wrong master key, ``BadRequestError``
        for a bad id, ``BookieServerError`` when closing.
        """
        batch = self.journal.fence(ledger_id, master_key)
        batch.waiters.append(done)
        batch.run_sink = None

    async def fence(self, ledger_id: int, master_key: bytes) -> None:
        """Fence the ledger durably; errors as ``submit_fence``."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.journal.fence(ledger_id, master_key).futures.append(fut)
        await fut

    def submit_write_lac(self, ledger_id: int, master_key: bytes, lac: int, done: Done) -> None:
        """Record an explicit LAC sent by the ledger's writer; ``done(None)`` once durable.

        The ledger's LAC becomes the larger of the stored one and ``lac``
        (``read_lac`` serves it, ``on_lac`` hears of the rise at once). An
        unknown ledger gets a record with ``master_key``. Raises
        ``UnauthorizedError`` for another master key, ``BadRequestError``
        for a bad id or a LAC below -1, ``BookieServerError`` when closing.
        """
        self.journal.submit_write_lac(ledger_id, master_key, lac, done)

    async def flush(self) -> None:
        """Return once every write submitted so far is durable in the journal (and its callbacks ran)."""
        await self.journal.flush()

    async def delete_ledger(self, ledger_id: int) -> None:
        """Delete the ledger's entries and record durably (garbage collection): one checkpoint."""
        await self.delete_ledgers([ledger_id])

    async def delete_ledgers(self, ledger_ids: Iterable[int]) -> None:
        """Delete several ledgers in one checkpoint; ``BookieServerError`` when the checkpoint fails."""
        if self.journal.closing:
            raise BookieServerError("entry storage is closing")
        ids = list(ledger_ids)
        for ledger_id in ids:
            _check_ids(ledger_id)
        self.index.delete(ids)
        await self.checkpoint()

    async def checkpoint(self) -> None:
        """Write everything synced so far into LMDB (and apply pending deletes); a failure raises."""
        await self.journal.flush()
        await self.checkpointer.checkpoint()

    # --- reads (``LedgerIndex``, ``StorageReads``) -------------------------------------------

    def ledger_info(self, ledger_id: int) -> LedgerInfo | None:
        """The ledger's record, or ``None`` when this bookie has none."""
        return self.index.info(ledger_id)

    def ledger_ids(self) -> set[int]:
        """Every ledger this storage has a record of (durable or pending)."""
        return self.index.ids()

    def read_entry(self, ledger_id: int, entry_id: int) -> tuple[int, bytes]:
        """``(entry_id, payload)`` of a durable entry; ``LAST_ENTRY`` reads the highest one (``StorageReads``)."""
        return self.reads.read_entry(ledger_id, entry_id)

    def last_entry_id(self, ledger_id: int) -> int:
        """The highest durable entry id of the ledger, ``-1`` when none."""
        return self.reads.last_entry_id(ledger_id)

    def read_lac(self, ledger_id: int) -> int:
        """The highest LAC piggybacked on an add or written explicitly (``-1`` when none); ``NoSuchLedgerError``."""
        return self.reads.read_lac(ledger_id)

    def map_usage(self) -> tuple[int, int]:
        """``(used, size)`` bytes of the LMDB map (``StorageReads.map_usage``)."""
        return self.reads.map_usage()

    def lmdb_usage(self) -> tuple[int, int]:
        """``(file_bytes, reclaimable_bytes)`` of the LMDB file (``StorageReads.lmdb_usage``)."""
        return self.reads.lmdb_usage()

    def entry_count(self) -> int:
        """Durable entries in the storage, all ledgers (scans LMDB: for tools and tests)."""
        return self.reads.entry_count()

    def corrupt_entry_for_test(self, ledger_id: int, entry_id: int) -> None:
        """Flip the last byte of a stored entry (test hook: the client must detect it)."""
        self.reads.corrupt_entry_for_test(ledger_id, entry_id)

    # --- figures and hooks of the parts ------------------------------------------------------

    @property
    def journal_position(self) -> Position:
        """The end of the last synced journal group."""
        return self.journal.synced

    @property
    def cache_bytes(self) -> int:
        """Payload bytes in the write cache (not counting a checkpoint's)."""
        return self.cache.nbytes

    @property
    def commits(self) -> int:
        return self.journal.commits

    @property
    def entries_committed(self) -> int:
        return self.journal.entries_committed

    @property
    def last_commit_bytes(self) -> int:
        return self.journal.last_commit_bytes

    @property
    def last_sync_seconds(self) -> float:
        return self.journal.last_sync_seconds

    @property
    def last_group_entries(self) -> int:
        return self.journal.last_group_entries

    @property
    def checkpoints(self) -> int:
        return self.checkpointer.checkpoints

    @property
    def on_commit(self) -> Callable[[int, float], None] | None:
        return self.journal.on_commit

    @on_commit.setter
    def on_commit(self, hook: Callable[[int, float], None] | None) -> None:
        self.journal.on_commit = hook

    @property
    def on_checkpoint(self) -> Callable[[int, float], None] | None:
        return self.checkpointer.on_checkpoint

    @on_checkpoint.setter
    def on_checkpoint(self, hook: Callable[[int, float], None] | None) -> None:
        self.checkpointer.on_checkpoint = hook

    @property
    def on_lac(self) -> Callable[[int, int], None] | None:
        """Called on the loop as ``on_lac(ledger_id, lac)`` when a ledger's LAC rises (long-poll reads)."""
        return self.journal.on_lac

    @on_lac.setter
    def on_lac(self, hook: Callable[[int, int], None] | None) -> None:
        self.journal.on_lac = hook

    @property
    def lac_watched(self) -> Container[int] | None:
        """When set, ``on_lac`` is called only for the ledgers in it (the server's ledgers with parked reads)."""
        return self.journal.lac_watched

    @lac_watched.setter
    def lac_watched(self, ledgers: Container[int] | None) -> None:
        self.journal.lac_watched = ledgers

    # --- closing -----------------------------------------------------------------------------

    async def close(self) -> None:
        """Refuse new writes, wait for the journal, checkpoint, close (a failed checkpoint is logged)."""
        if self._closed:
            return
        self.journal.closing = self.checkpointer.closing = True
        self.cache.fail_throttled(BookieServerError("entry storage is closing"))
        await self.journal.flush()
        try:
            await self.checkpoint()
        except BKError as exc:
            log.error("final checkpoint failed; the journal keeps the entries for the next start: %s", exc)
        self._closed = True
        self.cache.close()
        self.checkpointer.close()
        self.journal.close()
        self.index.close()

    @property
    def closed(self) -> bool:
        return self._closed
