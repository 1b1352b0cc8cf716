"""What the parts of the entry storage (``bookie.storage``) share: keys, ledger records, a group, a checkpoint.

``StorageCore`` is the state every part of ``EntryStorage`` works on, and
the ledger state they look up; the parts are the journal hand-off
(``bookie.group_commit``), the write cache and its back-pressure
(``bookie.write_cache``), checkpoints and the start-up replay
(``bookie.checkpoints``) and reads (``bookie.storage_reads``). Each part is
a mix-in of ``StorageCore``: they share one object, so the hot path pays
no extra hop between them.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import struct
import threading
import time
from collections.abc import Callable, Container
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb

from bookie import journal
from bookie.errors import (
    BadRequestError,
    BookieServerError,
)
from bookie.journal import JournalWriter, Position
from bookie.proto.bookie_pb2 import LedgerIndexRecord
from bookie.segments import SegmentStore

__all__ = ["AckSink", "Done", "LedgerInfo", "StorageCore", "entry_key", "ledger_prefix"]

DEFAULT_MAP_SIZE = 64 * 1024**3
DEFAULT_WRITE_CACHE = 64 << 20
DEFAULT_JOURNAL_MAX_SIZE = 2 << 30
DEFAULT_JOURNAL_PREALLOCATE = 16 << 20
_MAX_ID = (1 << 63) - 1
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


class StorageCore:
    """The state of one ``EntryStorage`` (set by its constructor) and its ledger records.

    Methods one part calls in another are named here; the part defines them.
    """

    path: Path
    journal_dir: Path
    _env: lmdb.Environment
    _store: SegmentStore
    _ledgers: Any
    _meta: Any
    _state: dict[int, _LedgerState]
    _group_wait: float
    _half_cache: int
    _flush_interval: float
    _max_throttle: float
    _cache: dict[bytes, bytes]
    cache_bytes: int
    _flushing: _Flush | None
    _flushing_bytes: int
    _dirty: set[int]
    _deleting: set[int]
    _checkpoint_waiters: list[asyncio.Future[None]]
    _flush_timer: asyncio.TimerHandle | None
    _synced: Position
    _throttled: collections.deque[tuple[bytes, bytes, Done, asyncio.Future[None] | None, int, float]]
    _throttle_timer: asyncio.TimerHandle | None
    _batch: _Batch | None
    _committing: bool
    _kicked: bool
    _closing: bool
    _closed: bool
    _idle_waiters: list[asyncio.Future[None]]
    _loop: asyncio.AbstractEventLoop | None
    _jobs: queue.SimpleQueue[_Batch | None]
    _flush_jobs: queue.SimpleQueue[_Flush | None]
    _thread: threading.Thread | None
    _flush_thread: threading.Thread | None
    _writer: JournalWriter
    on_commit: Callable[[int, float], None] | None
    on_checkpoint: Callable[[int, float], None] | None
    on_commit_error: Callable[[str, bool], None] | None
    on_lac: Callable[[int, int], None] | None
    lac_watched: Container[int] | None
    last_commit_bytes: int
    last_sync_seconds: float
    last_group_entries: int
    commits: int
    entries_committed: int
    checkpoints: int
    replayed: int

    # --- ledger state ------------------------------------------------------------------------

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

    # --- parts call each other through these -------------------------------------------------

    def _open_batch(self) -> _Batch:
        """The open group, opened now (``bookie.group_commit``)."""
        raise NotImplementedError

    def _start_commit(self, inline: bool = True) -> bool:
        """Hand the open group to the journal (``bookie.group_commit``)."""
        raise NotImplementedError

    def _report_error(self, reason: str, no_space: bool) -> None:
        """Tell ``on_commit_error`` (``bookie.group_commit``)."""
        raise NotImplementedError

    def _start_flush(self) -> None:
        """Start a checkpoint (``bookie.checkpoints``)."""
        raise NotImplementedError

    def _flush_tick(self) -> None:
        """The periodic checkpoint (``bookie.checkpoints``)."""
        raise NotImplementedError

    def _release_throttled(self) -> None:
        """Room in the cache for the waiting adds (``bookie.write_cache``)."""
        raise NotImplementedError

    async def flush(self) -> None:
        """Every write so far is durable in the journal (``bookie.group_commit``)."""
        raise NotImplementedError
