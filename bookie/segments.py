"""The entry store behind the write cache: ledger entries in LMDB, a segment per checkpoint run.

    store = SegmentStore(env)                     # opens its databases in an open environment
    with env.begin(write=True) as txn:
        store.write(txn, {ledger_id: {entry_id: payload, ...}})   # merged with what is stored
        store.delete_ledger(txn, ledger_id)
    with env.begin(buffers=True) as txn:
        store.read(txn, ledger_id, entry_id)       # bytes or None
        store.last_entry(txn, ledger_id)           # (entry_id, payload) or None

A checkpoint writes thousands of entries at once. py-lmdb releases the GIL
around every single put, and a thread that releases the GIL thousands of
times while the event loop thread is busy gets it back only every switch
interval (5 ms): per-entry puts from the flush thread would crawl under
load. So a checkpoint writes one LMDB value per run of a ledger's entries, a
*segment*: database ``segments``, key ``ledger_id (8 bytes BE) + first
entry id (8 bytes BE)`` (the storage key of its first entry), value
``count (4 bytes BE) | count x (entry id 8 bytes BE, end offset 4 bytes BE) |
payloads``. A segment holds at most ``SEGMENT_ENTRIES`` entries and about
``SEGMENT_BYTES``; its entry ids ascend but need not be consecutive (a
bookie holds only the entries of its write sets). The segments of one
ledger never overlap: a write whose ids fall inside stored segments merges
with them (the new payload of an id wins) and rewrites them.

Data written before the journal existed is in database ``entries``, one
value per entry (key = the storage key); it is still read and deleted.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any

import lmdb

__all__ = ["SEGMENT_BYTES", "SEGMENT_ENTRIES", "SegmentStore", "decode_segment", "encode_segment"]

SEGMENT_ENTRIES = 1024
SEGMENT_BYTES = 1 << 20
_KEY = struct.Struct(">QQ")
_COUNT = struct.Struct(">I")
_SLOT = struct.Struct(">qI")
_MAX_ID = (1 << 63) - 1


def encode_segment(items: list[tuple[int, bytes]]) -> bytes:
    """A segment value from ``(entry_id, payload)`` pairs in ascending id order."""
    slots = bytearray(_COUNT.pack(len(items)))
    end = 0
    for entry_id, payload in items:
        end += len(payload)
        slots += _SLOT.pack(entry_id, end)
    return bytes(slots) + b"".join(p for _, p in items)


def decode_segment(value: Any) -> list[tuple[int, bytes]]:
    """Every ``(entry_id, payload)`` of a segment value (bytes or an LMDB buffer)."""
    (count,) = _COUNT.unpack_from(value, 0)
    base = _COUNT.size + count * _SLOT.size
    out = []
    start = 0
    for i in range(count):
        entry_id, end = _SLOT.unpack_from(value, _COUNT.size + i * _SLOT.size)
        out.append((entry_id, bytes(value[base + start:base + end])))
        start = end
    return out


def _bounds(value: Any) -> tuple[int, int]:
    """First and last entry id of a segment value."""
    (count,) = _COUNT.unpack_from(value, 0)
    first = _SLOT.unpack_from(value, _COUNT.size)[0]
    last = _SLOT.unpack_from(value, _COUNT.size + (count - 1) * _SLOT.size)[0]
    return first, last


def _find(value: Any, entry_id: int) -> bytes | None:
    """The payload of ``entry_id`` in a segment value, or ``None`` (binary search over its slots)."""
    (count,) = _COUNT.unpack_from(value, 0)
    lo, hi = 0, count
    unpack = _SLOT.unpack_from
    while lo < hi:
        mid = (lo + hi) // 2
        if unpack(value, _COUNT.size + mid * _SLOT.size)[0] < entry_id:
            lo = mid + 1
        else:
            hi = mid
    if lo == count:
        return None
    found, end = unpack(value, _COUNT.size + lo * _SLOT.size)
    if found != entry_id:
        return None
    start = unpack(value, _COUNT.size + (lo - 1) * _SLOT.size)[1] if lo else 0
    base = _COUNT.size + count * _SLOT.size
    return bytes(value[base + start:base + end])


def _chunks(items: list[tuple[int, bytes]]) -> Iterable[list[tuple[int, bytes]]]:
    chunk: list[tuple[int, bytes]] = []
    size = 0
    for item in items:
        if chunk and (len(chunk) >= SEGMENT_ENTRIES or size + len(item[1]) > SEGMENT_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(item)
        size += len(item[1])
    if chunk:
        yield chunk


class SegmentStore:
    """Entries of every ledger in one LMDB environment; see the module docstring."""

    def __init__(self, env: lmdb.Environment) -> None:
        self.env = env
        self.segments = env.open_db(b"segments")
        self.legacy = env.open_db(b"entries")

    # --- reads ----------------------------------------------------------------------------------

    def _covering(self, cur: lmdb.Cursor, ledger_id: int, entry_id: int) -> Any | None:
        """The value of the segment of ``ledger_id`` whose id range holds ``entry_id`` (cursor on it)."""
        key = _KEY.pack(ledger_id, entry_id)
        if cur.set_range(key):
            if bytes(cur.key()) == key:
                return cur.value()
            if not cur.prev():
                return None
        elif not cur.last():
            return None
        k = bytes(cur.key())
        if int.from_bytes(k[:8], "big") != ledger_id:
            return None
        value = cur.value()
        return value if _bounds(value)[1] >= entry_id else None

    def read(self, txn: lmdb.Transaction, ledger_id: int, entry_id: int) -> bytes | None:
        """The stored payload of one entry, or ``None``."""
        value = self._covering(txn.cursor(db=self.segments), ledger_id, entry_id)
        if value is not None:
            found = _find(value, entry_id)
            if found is not None:
                return found
        legacy = txn.get(_KEY.pack(ledger_id, entry_id), db=self.legacy)
        return None if legacy is None else bytes(legacy)

    def _last_in(self, txn: lmdb.Transaction, db: Any, ledger_id: int) -> tuple[bytes, Any] | None:
        cur = txn.cursor(db=db)
        positioned = cur.set_range(_KEY.pack(ledger_id + 1, 0)) if ledger_id < _MAX_ID else False
        if not (cur.prev() if positioned else cur.last()):
            return None
        key = bytes(cur.key())
        if int.from_bytes(key[:8], "big") != ledger_id:
            return None
        return key, cur.value()

    def last_entry(self, txn: lmdb.Transaction, ledger_id: int) -> tuple[int, bytes] | None:
        """``(entry_id, payload)`` of the highest stored entry of the ledger, or ``None``."""
        best: tuple[int, bytes] | None = None
        seg = self._last_in(txn, self.segments, ledger_id)
        if seg is not None:
            items = decode_segment(seg[1])
            best = items[-1]
        old = self._last_in(txn, self.legacy, ledger_id)
        if old is not None:
            entry_id = int.from_bytes(old[0][8:], "big")
            if best is None or entry_id > best[0]:
                best = (entry_id, bytes(old[1]))
        return best

    def count(self, txn: lmdb.Transaction) -> int:
        """Stored entries (a full scan of the segment headers: for tools and tests)."""
        n = int(txn.stat(self.legacy)["entries"])
        for value in txn.cursor(db=self.segments).iternext(keys=False, values=True):
            n += _COUNT.unpack_from(value, 0)[0]
        return n

    # --- writes ---------------------------------------------------------------------------------

    def write(self, txn: lmdb.Transaction, ledgers: Mapping[int, Mapping[int, bytes]]) -> None:
        """Store the entries (``ledger_id -> {entry_id: payload}``), merged with the stored segments."""
        for ledger_id, entries in ledgers.items():
            if entries:
                self._write_ledger(txn, ledger_id, dict(entries))

    def _write_ledger(self, txn: lmdb.Transaction, ledger_id: int, entries: dict[int, bytes]) -> None:
        lo, hi = min(entries), max(entries)
        cur = txn.cursor(db=self.segments)
        stale: list[bytes] = []
        # the segment starting before lo may reach into [lo, hi]
        if cur.set_range(_KEY.pack(ledger_id, lo)):
            moved = cur.prev()
        else:
            moved = cur.last()
        if moved:
            key = bytes(cur.key())
            if int.from_bytes(key[:8], "big") == ledger_id and _bounds(cur.value())[1] >= lo:
                stale.append(key)
        # segments starting inside [lo, hi]
        if cur.set_range(_KEY.pack(ledger_id, lo)):
            while True:
                key = bytes(cur.key())
                lid, first = _KEY.unpack(key)
                if lid != ledger_id or first > hi:
                    break
                stale.append(key)
                if not cur.next():
                    break
        for key in stale:
            for entry_id, payload in decode_segment(txn.get(key, db=self.segments)):
                entries.setdefault(entry_id, payload)  # the new payload of an id wins
            txn.delete(key, db=self.segments)
        items = sorted(entries.items())
        puts = [(_KEY.pack(ledger_id, chunk[0][0]), encode_segment(chunk)) for chunk in _chunks(items)]
        txn.cursor(db=self.segments).putmulti(puts)

    def delete_ledger(self, txn: lmdb.Transaction, ledger_id: int) -> None:
        """Remove every stored entry of the ledger."""
        prefix = ledger_id.to_bytes(8, "big")
        for db in (self.segments, self.legacy):
            cur = txn.cursor(db=db)
            if cur.set_range(prefix):
                while bytes(cur.key())[:8] == prefix:
                    if not cur.delete():
                        break

    def corrupt(self, txn: lmdb.Transaction, ledger_id: int, entry_id: int) -> bool:
        """Flip the last byte of a stored entry's payload (test hook); False when it is not stored."""
        value = self._covering(txn.cursor(db=self.segments), ledger_id, entry_id)
        if value is not None:
            items = decode_segment(value)
            for i, (eid, payload) in enumerate(items):
                if eid == entry_id and payload:
                    items[i] = (eid, payload[:-1] + bytes([payload[-1] ^ 0xFF]))
                    txn.put(_KEY.pack(ledger_id, items[0][0]), encode_segment(items), db=self.segments)
                    return True
        key = _KEY.pack(ledger_id, entry_id)
        found = txn.get(key, db=self.legacy)
        if found is None or not len(found):
            return False
        payload = bytes(found)
        txn.put(key, payload[:-1] + bytes([payload[-1] ^ 0xFF]), db=self.legacy)
        return True
