"""What the parts of the entry storage (``bookie.storage``) share: keys, ledger records, a group.

The parts are collaborators, each owning its state: the ledger index
(``LedgerIndex``, here: LMDB and the ledgers' records), the journal hand-off
(``bookie.group_commit``), the write cache and its back-pressure
(``bookie.write_cache``), checkpoints and the start-up replay
(``bookie.checkpoints``) and reads (``bookie.storage_reads``);
``EntryStorage`` wires them. Where one part needs another it names what
through a small Protocol here (``GroupState``, ``CheckpointTrigger``).
"""

from __future__ import annotations

import asyncio
import functools
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import lmdb

from bookie import journal
from bookie.errors import (
    BadRequestError,
    BookieServerError,
)
from bookie.journal import Position
from bookie.proto.bookie_pb2 import LedgerIndexRecord
from bookie.segments import SegmentStore
from bookie.wire.framing import varint

__all__ = ["AckSink", "CheckpointTrigger", "Done", "GroupState", "LedgerIndex", "LedgerInfo", "entry_key",
           "ledger_prefix"]

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


_KEY_TAG = b"\x0a"          # LedgerIndexRecord field 1 (master_key), length-delimited
_FENCED_FIELD = b"\x10\x01"  # field 2 (fenced) true
_LAC_TAG = b"\x18"          # field 3 (lac), a varint of its two's complement
_UINT64 = (1 << 64) - 1


class _LedgerState:
    __slots__ = ("fenced", "lac", "last", "master_key")

    def __init__(self, master_key: bytes, fenced: bool = False, lac: int = -1, last: int = -1) -> None:
        self.master_key = master_key
        self.fenced = fenced
        self.lac = lac
        self.last = last  # highest entry id readable (durable: in the cache or LMDB)

    def record(self) -> bytes:
        """The ledger's ``LedgerIndexRecord``, encoded by hand exactly as protobuf does (fields in order, default
        values left out): a checkpoint writes one per changed ledger, thousands with thousands of topics, and
        building the message cost ~6 us a ledger on the loop."""
        key = self.master_key
        out = _KEY_TAG + varint(len(key)) + key if key else b""
        if self.fenced:
            out += _FENCED_FIELD
        if self.lac:
            out += _LAC_TAG + varint(self.lac & _UINT64)
        return out


class _Batch:
    """The writes of one group commit.

    Entries are two parallel lists (keys, payloads) rather than a tuple per
    add: the hot path allocates no object the cyclic GC has to track.
    ``parts`` holds the encoded journal records in order (adds, ledger
    records, fences, explicit LACs); ``dirty`` the ledgers whose LAC rose
    (one LAC record each, added when the group is handed over, except where
    ``piggybacked`` shows that an add of the group carries that LAC in its
    entry header, which the replay reads: ``GroupCommit.admit_frame``); ``last``
    the highest entry id per ledger. ``waiters`` are the ``done`` callbacks
    (a run of ``submit_acked_add`` adds of one sink is one of them, whose
    acks grow in ``run_acks`` while ``run_sink`` is its sink), ``futures``
    those of the coroutine API; both are completed in order, callbacks first.
    The journal thread sets ``position``, ``nbytes`` and ``sync_seconds``;
    ``error`` once the write failed.
    """

    __slots__ = ("dirty", "error", "futures", "keys", "last", "nbytes", "parts", "piggybacked", "position",
                 "run_acks", "run_sink", "started", "sync_seconds", "values", "waiters")

    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.values: list[bytes] = []
        self.waiters: list[Done] = []
        self.run_sink: AckSink | None = None  # the sink of the run the last waiter completes (``run_acks``)
        self.run_acks: list[Any] = []
        self.futures: list[asyncio.Future[None]] = []
        self.parts: list[bytes] = []
        self.dirty: set[int] = set()
        self.piggybacked: dict[int, int] = {}   # ledger -> the highest LAC an add's header in ``parts`` carries
        self.last: dict[int, int] = {}
        self.error: BaseException | None = None
        self.position: Position | None = None
        self.started = time.perf_counter()
        self.nbytes = 0
        self.sync_seconds = 0.0

    def join_run(self, sink: AckSink, ack: object) -> None:
        """``ack`` joins ``sink``'s run: the last waiter's acks if that run is ``sink``'s, else a new waiter."""
        if self.run_sink is sink:
            self.run_acks.append(ack)
        else:
            acks = self.run_acks = [ack]
            self.run_sink = sink
            self.waiters.append(functools.partial(sink, acks))


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



class LedgerIndex:
    """The ledgers of one storage: its LMDB environment and, in memory, each ledger's record.

    The in-memory records include writes not yet durable (the journal
    hand-off changes them as it admits writes); ``dirty`` are the ledgers
    whose record changed since the last checkpoint, ``deleting`` those to
    delete at the next one (both taken by ``bookie.checkpoints``).
    """

    def __init__(self, path: Path, map_size: int) -> None:
        self.path = path
        self.env = _open_env(path, map_size)
        self.store = SegmentStore(self.env)
        self.ledgers = self.env.open_db(b"ledgers")
        """LMDB database of the ledger records (``LedgerIndexRecord`` by ``ledger_prefix``)."""
        self.meta = self.env.open_db(b"journal")
        """LMDB database of the checkpoint's journal position."""
        self.state: dict[int, _LedgerState] = {}
        """Each known ledger's record by id (one dict for the storage's life: the hand-off keeps it at hand)."""
        self.dirty: set[int] = set()
        self.deleting: set[int] = set()

    def get(self, ledger_id: int) -> _LedgerState | None:
        """The ledger's record (loaded from LMDB on first use), ``None`` when there is none."""
        state = self.state.get(ledger_id)
        if state is None:
            if ledger_id in self.deleting:
                return None
            with self.env.begin(buffers=True) as txn:
                raw = txn.get(ledger_prefix(ledger_id), db=self.ledgers)
                if raw is None:
                    return None
                rec = LedgerIndexRecord.FromString(bytes(raw))
                last = self.store.last_entry(txn, ledger_id)
            state = self.state[ledger_id] = _LedgerState(rec.master_key, rec.fenced, rec.lac,
                                                         -1 if last is None else last[0])
        return state

    def create(self, ledger_id: int, master_key: bytes) -> _LedgerState:
        """A new record for the ledger (no longer to be deleted)."""
        state = self.state[ledger_id] = _LedgerState(master_key)
        self.deleting.discard(ledger_id)
        return state

    def info(self, ledger_id: int) -> LedgerInfo | None:
        """The ledger's record, or ``None`` when this bookie has none."""
        state = self.get(ledger_id)
        if state is None:
            return None
        return LedgerInfo(ledger_id, state.master_key, state.fenced, state.lac)

    def ids(self) -> set[int]:
        """Every ledger this storage has a record of (durable or pending)."""
        with self.env.begin(db=self.ledgers) as txn:
            ids = {int.from_bytes(k, "big") for k in txn.cursor().iternext(keys=True, values=False)}
        return (ids - self.deleting) | set(self.state)

    def delete(self, ledger_ids: Iterable[int]) -> None:
        """Forget the ledgers now; the next checkpoint deletes them from LMDB."""
        for ledger_id in ledger_ids:
            self.state.pop(ledger_id, None)
            self.dirty.discard(ledger_id)
            self.deleting.add(ledger_id)

    def take_dirty_records(self) -> list[tuple[bytes, bytes]]:
        """The LMDB records of the ledgers changed since the last call (for a checkpoint)."""
        state = self.state
        records = [(ledger_prefix(lid), st.record()) for lid in self.dirty if (st := state.get(lid)) is not None]
        self.dirty = set()
        return records

    def close(self) -> None:
        self.env.close()


class GroupState(Protocol):
    """What checkpoints need of the journal hand-off (``bookie.group_commit.GroupCommit``)."""

    @property
    def busy(self) -> bool:
        """A group is open or being written."""
        ...

    def admit_throttled(self) -> None:
        """There is room in the write cache: the adds waiting for it join the open group."""
        ...


class CheckpointTrigger(Protocol):
    """What the journal hand-off needs of checkpoints (``bookie.checkpoints.Checkpoints``)."""

    armed: bool
    """The periodic checkpoint runs: ``arm`` has nothing to do (the journal hand-off skips the call)."""

    def arm(self) -> None:
        """Writes are coming: make sure the periodic checkpoint runs."""
        ...

    def cache_filled(self) -> None:
        """The write cache holds ``checkpoint_bytes``: checkpoint now unless one runs."""
        ...
