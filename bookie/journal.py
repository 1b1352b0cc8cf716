"""The bookie journal: the durability point of every add (BookKeeper's ``Journal``).

    writer = JournalWriter(directory, file_id=7, max_size=2 << 30, preallocate=16 << 20)
    position = writer.append(data)        # one synchronous write (O_DSYNC); rolls files as needed
    writer.close()

    for record in read_journal(directory, start=Position(7, 0)):   # replay at start-up
        record.kind, record.ledger_id, record.entry_id, record.value, record.end
    encode_add(key, payload) / encode_ledger(...) / encode_fence(...) / encode_lac(...)

Files are ``<16 hex digits>.txn`` in the journal directory, numbered upwards;
a bookie appends to one file at a time, starts a new one at every start-up
and when the current one would pass ``max_size``, and preallocates each
``preallocate`` bytes at a time (``posix_fallocate``), so a sync rarely has
file-size metadata to write. A directory fsync follows each new file.

Every record is ``length (4 bytes BE) | crc32c (4 bytes BE) | kind (1 byte) | body``;
``length`` counts kind and body and the CRC32C covers them (not the length,
whose damage shows as a bad CRC or an impossible length). Bodies:

* ``ADD``: ledger id and entry id (the 16-byte storage key), then the payload;
* ``LEDGER``: ledger id, then the master key (written once, when a ledger
  becomes known to the bookie, before any add of it);
* ``FENCE``: ledger id;
* ``LAC``: ledger id, then the LAC (8 bytes BE, signed): a ledger's LAC that
  rose in a group, unless an ``ADD`` of that group carries it in its payload's
  entry header (ledger id, entry id, LAC), which the replay reads too;
  explicit LACs always.

Replay stops cleanly at the end of the written data (a zero length: the
preallocated tail) and at a torn or corrupt record at the tail of the last
file (a crash mid-write: nothing in it was acknowledged). A bad record with
a valid record after it, or a bad record in a file that is not the last, is
damage in the middle: ``JournalCorruptError`` names the file and offset and
the bookie refuses to start rather than drop acknowledged adds silently.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from crc32c import crc32c

from bookie.errors import BookieServerError

log = logging.getLogger(__name__)

__all__ = [
    "ADD",
    "FENCE",
    "LAC",
    "LEDGER",
    "JournalCorruptError",
    "JournalRecord",
    "JournalWriter",
    "Position",
    "encode_fence",
    "encode_lac",
    "encode_ledger",
    "journal_files",
    "read_journal",
]

ADD = 1
LEDGER = 2
FENCE = 3
LAC = 4
_KINDS = frozenset({ADD, LEDGER, FENCE, LAC})

HEADER = struct.Struct(">II")
"""Length of kind + body, and the CRC32C of kind + body."""
_ID = struct.Struct(">q")
_ID_LAC = struct.Struct(">qq")
_MAX_RECORD = 1 << 30
"""No record is longer (frames are at most a few MiB): a longer length is damage."""
_RESYNC_SCAN = 1 << 20
"""How far past a record with an impossible length replay looks for a valid one (bytes)."""
SUFFIX = ".txn"
_ADD_KIND = bytes([ADD])


class Position(NamedTuple):
    """A place in the journal: file id and byte offset (the end of the last record before it)."""

    file_id: int
    offset: int


class JournalCorruptError(BookieServerError):
    """A damaged record before the end of the journal: acknowledged adds could be lost."""


@dataclass(frozen=True, slots=True)
class JournalRecord:
    kind: int
    ledger_id: int
    entry_id: int        # ADD only, else -1
    value: bytes         # ADD: payload; LEDGER: master key; LAC: empty (see ``lac``)
    lac: int             # LAC only, else -1
    end: Position        # where the next record starts


def file_name(file_id: int) -> str:
    return f"{file_id:016x}{SUFFIX}"


def journal_files(directory: Path) -> list[int]:
    """Ids of the journal files in ``directory``, ascending (none when it does not exist)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    ids = []
    for name in names:
        if name.endswith(SUFFIX) and len(name) == 16 + len(SUFFIX):
            try:
                ids.append(int(name[:16], 16))
            except ValueError:
                continue
    return sorted(ids)


def _record(kind: int, body: bytes) -> bytes:
    data = bytes([kind]) + body
    return HEADER.pack(len(data), crc32c(data)) + data


def encode_add_parts(key: bytes, payload: bytes) -> tuple[bytes, bytes, bytes]:
    """The three buffers of an ADD record (header, kind + key, payload): no copy of the payload."""
    head = _ADD_KIND + key
    return HEADER.pack(17 + len(payload), crc32c(payload, crc32c(head))), head, payload


def encode_ledger(ledger_id: int, master_key: bytes) -> bytes:
    return _record(LEDGER, _ID.pack(ledger_id) + master_key)


def encode_fence(ledger_id: int) -> bytes:
    return _record(FENCE, _ID.pack(ledger_id))


def encode_lac(ledger_id: int, lac: int) -> bytes:
    return _record(LAC, _ID_LAC.pack(ledger_id, lac))


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class JournalWriter:
    """Appends groups of records to the journal files; used by one thread at a time.

    ``append`` returns only after the data is synced (the file is opened
    ``O_DSYNC``: the write is the ``fdatasync``); an
    ``OSError`` leaves the writer on a fresh file at the next append, since
    the failed file's tail is unknown.
    """

    def __init__(self, directory: Path, file_id: int, *, max_size: int, preallocate: int) -> None:
        self.directory = directory
        self.max_size = max_size
        self.preallocate = max(preallocate, 4096)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._fd = -1
        self._file_id = file_id - 1
        self._offset = 0
        self._allocated = 0
        self._open_next()

    @property
    def position(self) -> Position:
        return Position(self._file_id, self._offset)

    def _open_next(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._file_id += 1
        path = self.directory / file_name(self._file_id)
        # O_DSYNC: each write returns once its data is on the device (one system call, one GIL
        # hand-back, and on ext4 faster than write + fdatasync: 285 against 395-630 us here)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DSYNC, 0o644)
        self._offset = 0
        self._allocated = 0
        _sync_directory(self.directory)  # the new file's name survives a crash

    def append(self, data: bytes) -> Position:
        """Write ``data`` (whole records) and sync it; the position after it."""
        try:
            if self._fd < 0 or (self._offset and self._offset + len(data) > self.max_size):
                self._open_next()
            end = self._offset + len(data)
            if end > self._allocated:
                grow = max(end - self._allocated, self.preallocate)
                os.posix_fallocate(self._fd, self._allocated, grow)
                self._allocated += grow
            written = os.pwrite(self._fd, data, self._offset)
            while written < len(data):  # a short write (rare): write the rest
                written += os.pwrite(self._fd, memoryview(data)[written:], self._offset + written)
        except OSError:
            if self._fd >= 0:
                # cut what the failed write may have left, so that this file ends cleanly: a torn
                # record in a file that is not the last would look like damage to the replay
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self._offset)
                os.close(self._fd)
            self._fd = -1
            raise
        self._offset = end
        return Position(self._file_id, end)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _parse(kind: int, body: memoryview, end: Position) -> JournalRecord | None:
    if kind == ADD and len(body) >= 16:
        ledger_id, entry_id = struct.unpack_from(">QQ", body)
        return JournalRecord(ADD, ledger_id, entry_id, bytes(body[16:]), -1, end)
    if kind == LEDGER and len(body) >= 8:
        return JournalRecord(LEDGER, _ID.unpack_from(body)[0], -1, bytes(body[8:]), -1, end)
    if kind == FENCE and len(body) == 8:
        return JournalRecord(FENCE, _ID.unpack_from(body)[0], -1, b"", -1, end)
    if kind == LAC and len(body) == 16:
        ledger_id, lac = _ID_LAC.unpack_from(body)
        return JournalRecord(LAC, ledger_id, -1, b"", lac, end)
    return None


def _valid_at(data: memoryview, offset: int) -> bool:
    """Whether a whole, intact record starts at ``offset``."""
    if offset + HEADER.size > len(data):
        return False
    length, crc = HEADER.unpack_from(data, offset)
    start = offset + HEADER.size
    if not 0 < length <= _MAX_RECORD or start + length > len(data) or data[start] not in _KINDS:
        return False
    return bool(crc32c(data[start:start + length]) == crc)


def _damage_in_middle(data: memoryview, offset: int) -> bool:
    """After a bad record at ``offset``: does a valid record follow (so the damage is not a torn tail)?"""
    length, _ = HEADER.unpack_from(data, offset) if offset + HEADER.size <= len(data) else (0, 0)
    if 0 < length <= _MAX_RECORD and _valid_at(data, offset + HEADER.size + length):
        return True
    written = len(bytes(data[offset:offset + _RESYNC_SCAN]).rstrip(b"\0"))  # the zeros after it are unwritten
    return any(_valid_at(data, p) for p in range(offset + 1, offset + written - HEADER.size))


def read_journal(directory: Path, start: Position) -> Iterator[JournalRecord]:
    """Every record from ``start`` on, in order; see the module docstring for the end and for damage.

    Raises ``JournalCorruptError`` naming the file and offset of damage
    before the tail, ``OSError`` when a file cannot be read.
    """
    files = [f for f in journal_files(directory) if f >= start.file_id]
    for i, file_id in enumerate(files):
        path = directory / file_name(file_id)
        with open(path, "rb") as fh:
            data = memoryview(fh.read())
        offset = start.offset if file_id == start.file_id else 0
        last_file = i == len(files) - 1
        while offset + HEADER.size <= len(data):
            length, crc = HEADER.unpack_from(data, offset)
            if length == 0 and crc == 0:
                break  # the preallocated, never written tail
            begin = offset + HEADER.size
            end = begin + length
            record = None
            if 0 < length <= _MAX_RECORD and end <= len(data) and crc32c(data[begin:end]) == crc:
                record = _parse(data[begin], data[begin + 1:end], Position(file_id, end))
            if record is None:
                if last_file and not _damage_in_middle(data, offset):
                    log.warning("journal %s: torn record at offset %d ends the replay (crash mid-write)",
                                path, offset)
                    return
                raise JournalCorruptError(f"journal file {path} is corrupt at offset {offset} "
                                          f"(records after it are intact): refusing to start")
            yield record
            offset = end
