"""The entry store behind the write cache: ledger entries in LMDB, a segment per checkpoint run.

    store = SegmentStore(env)                     # opens its databases in an open environment
    with env.begin(write=True) as txn:
        store.write(txn, {key: payload, ...})      # 16-byte storage keys; merged with what is stored
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
``count (4 bytes BE) | count x storage key (16 bytes) | count x end offset
(4 bytes BE) | payloads``, built without a Python step per entry (sorted
keys, ``b"".join``, ``accumulate``). A segment holds at most
``SEGMENT_ENTRIES`` entries and about ``SEGMENT_BYTES``; its entry ids
ascend but need not be consecutive (a bookie holds only the entries of its
write sets). The segments of one ledger never overlap: a write whose ids
fall inside stored segments merges with them (the new payload of an id
wins) and rewrites them. The common checkpoint of many ledgers with a few
entries each (one entry per ledger per message over thousands of topics)
costs a lookup and a segment per ledger; those segments are put together
(``PUT_BATCH`` a call).

Data written before the journal existed is in database ``entries``, one
value per entry (key = the storage key); it is still read and deleted.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import struct
from collections.abc import Collection, Mapping
from typing import Any

import lmdb

__all__ = ["SEGMENT_BYTES", "SEGMENT_ENTRIES", "SegmentStore", "decode_segment", "encode_segment"]

SEGMENT_ENTRIES = 1024
SEGMENT_BYTES = 1 << 20
SLICE = 4 * SEGMENT_ENTRIES
"""Keys a checkpoint sorts, looks up or encodes in one C call: the flush thread returns to the
interpreter between slices, so the loop thread waits at most about a slice's work (~1 ms), not the
whole checkpoint's (tens of ms for 200 000 entries), for the GIL."""
PUT_BATCH = 512
"""New segments a checkpoint puts in one call (``SegmentStore.write``'s common case), for the same reason."""
_KEY = struct.Struct(">QQ")
_LEDGER_PREFIX = operator.itemgetter(slice(0, 8))
"""A storage key's ledger id bytes."""
_COUNT = struct.Struct(">I")
_END = struct.Struct(">I")
_MAX_ID = (1 << 63) - 1


def _ledger_runs(entries: Mapping[bytes, bytes]) -> list[tuple[int, list[bytes]]]:
    """``(ledger_id, its keys ascending)`` for every ledger of ``entries``, ledgers ascending.

    Sorted a ``SLICE`` at a time: each slice's keys of one ledger ascend, and
    a ledger's slices usually follow one another (entry ids grow as they are
    added), so joining them is a copy; slices that interleave (recovery adds)
    are sorted together.
    """
    keys = list(entries)
    pieces: dict[bytes, list[list[bytes]]] = {}
    for i in range(0, len(keys), SLICE):
        # one groupby step per ledger (many ledgers with an entry or two each are the common checkpoint)
        for prefix, group in itertools.groupby(sorted(keys[i:i + SLICE]), _LEDGER_PREFIX):
            part = list(group)
            seen = pieces.get(prefix)
            if seen is None:
                pieces[prefix] = [part]
            else:
                seen.append(part)
    runs = []
    for prefix in sorted(pieces):
        parts = pieces[prefix]
        if len(parts) == 1:
            run = parts[0]
        elif all(a[-1] < b[0] for a, b in itertools.pairwise(parts)):
            run = list(itertools.chain.from_iterable(parts))
        else:
            run = sorted(itertools.chain.from_iterable(parts))
        runs.append((int.from_bytes(prefix, "big"), run))
    return runs


def encode_segment(keys: list[bytes], payloads: list[bytes]) -> bytes:
    """A segment value from storage keys in ascending order and their payloads."""
    n = len(keys)
    ends = struct.pack(f">{n}I", *itertools.accumulate(map(len, payloads)))
    return b"".join((_COUNT.pack(n), *keys, ends, *payloads))


def decode_segment(value: Any) -> list[tuple[bytes, bytes]]:
    """Every ``(storage key, payload)`` of a segment value (bytes or an LMDB buffer)."""
    (n,) = _COUNT.unpack_from(value, 0)
    ends = struct.unpack_from(f">{n}I", value, 4 + 16 * n)
    base = 4 + 20 * n
    out = []
    start = 0
    for i in range(n):
        out.append((bytes(value[4 + 16 * i:20 + 16 * i]), bytes(value[base + start:base + ends[i]])))
        start = ends[i]
    return out


def _last_key(value: Any) -> bytes:
    (n,) = _COUNT.unpack_from(value, 0)
    return bytes(value[4 + 16 * (n - 1):4 + 16 * n])


def _payload(value: Any, n: int, i: int) -> bytes:
    start = _END.unpack_from(value, 4 + 16 * n + 4 * (i - 1))[0] if i else 0
    end = _END.unpack_from(value, 4 + 16 * n + 4 * i)[0]
    base = 4 + 20 * n
    return bytes(value[base + start:base + end])


def _overlaps(cur: lmdb.Cursor, lo: bytes, hi: bytes) -> bool:
    """Whether a stored segment holds keys in ``[lo, hi]`` (storage keys of one ledger): one starts inside, or the
    one before ``lo`` (same ledger) reaches it. ``SegmentStore._write_run`` merges such runs."""
    if cur.set_range(lo):
        if bytes(cur.key()) <= hi:
            return True
        if not cur.prev():
            return False
    elif not cur.last():
        return False
    key = bytes(cur.key())
    return key[:8] == lo[:8] and _last_key(cur.value()) >= lo


def _find(value: Any, key: bytes) -> bytes | None:
    """The payload stored under ``key`` in a segment value, or ``None`` (binary search over its keys)."""
    (n,) = _COUNT.unpack_from(value, 0)
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if bytes(value[4 + 16 * mid:20 + 16 * mid]) < key:
            lo = mid + 1
        else:
            hi = mid
    if lo == n or bytes(value[4 + 16 * lo:20 + 16 * lo]) != key:
        return None
    return _payload(value, n, lo)


class SegmentStore:
    """Entries of every ledger in one LMDB environment; see the module docstring."""

    def __init__(self, env: lmdb.Environment) -> None:
        self.env = env
        self.segments = env.open_db(b"segments")
        self.legacy = env.open_db(b"entries")

    # --- reads ----------------------------------------------------------------------------------

    def _covering(self, cur: lmdb.Cursor, key: bytes) -> Any | None:
        """The value of the segment whose key range holds ``key`` (same ledger), or ``None``."""
        if cur.set_range(key):
            if bytes(cur.key()) == key:
                return cur.value()
            if not cur.prev():
                return None
        elif not cur.last():
            return None
        if bytes(cur.key())[:8] != key[:8]:
            return None
        value = cur.value()
        return value if _last_key(value) >= key else None

    def read(self, txn: lmdb.Transaction, ledger_id: int, entry_id: int) -> bytes | None:
        """The stored payload of one entry, or ``None``."""
        key = _KEY.pack(ledger_id, entry_id)
        value = self._covering(txn.cursor(db=self.segments), key)
        if value is not None:
            found = _find(value, key)
            if found is not None:
                return found
        legacy = txn.get(key, db=self.legacy)
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
            value = seg[1]
            (n,) = _COUNT.unpack_from(value, 0)
            best = (int.from_bytes(_last_key(value)[8:], "big"), _payload(value, n, n - 1))
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

    def write(self, txn: lmdb.Transaction, entries: Mapping[bytes, bytes], skip: Collection[int] = ()) -> None:
        """Store the entries (storage key -> payload), merged with the stored segments.

        Ledgers in ``skip`` are left out (deleted meanwhile). The work is cut
        in slices of ``SLICE`` keys (see ``SLICE``).
        """
        get = entries.__getitem__
        cur = txn.cursor(db=self.segments)
        puts: list[tuple[bytes, bytes]] = []   # new segments that touch no stored one, put together
        for ledger_id, keys in _ledger_runs(entries):
            if ledger_id in skip:
                continue
            if len(keys) <= SEGMENT_ENTRIES and not _overlaps(cur, keys[0], keys[-1]):
                # the common case (a ledger's entries come after what is stored): one new segment, no
                # merge; many ledgers with a few entries each cost a put each, not a cursor and a call each
                values = list(map(get, keys))
                if sum(map(len, values)) <= SEGMENT_BYTES:
                    puts.append((keys[0], encode_segment(keys, values)))
                    if len(puts) >= PUT_BATCH:
                        cur.putmulti(puts)
                        puts = []
                    continue
            for i in range(0, len(keys), SLICE):
                part = keys[i:i + SLICE]
                self._write_run(txn, part, list(map(get, part)))
        if puts:
            cur.putmulti(puts)

    def _write_run(self, txn: lmdb.Transaction, keys: list[bytes], values: list[bytes]) -> None:
        """Entries of one ledger (sorted keys): merge with overlapping segments, then put in chunks.

        Runs of one ledger written one after the other stay correct: a stored
        segment reaching past ``keys[-1]`` is merged whole and rewritten, and
        the next run merges with what that wrote.
        """
        lo, hi = keys[0], keys[-1]
        cur = txn.cursor(db=self.segments)
        stale: list[bytes] = []
        moved = cur.prev() if cur.set_range(lo) else cur.last()
        if moved:  # the segment starting before lo may reach into [lo, hi]
            key = bytes(cur.key())
            if key[:8] == lo[:8] and key < lo and _last_key(cur.value()) >= lo:
                stale.append(key)
        if cur.set_range(lo):  # segments starting inside [lo, hi]
            while True:
                key = bytes(cur.key())
                if key > hi:
                    break
                stale.append(key)
                if not cur.next():
                    break
        if stale:
            merged = dict(zip(keys, values, strict=True))
            for key in stale:
                for k, payload in decode_segment(txn.get(key, db=self.segments)):
                    merged.setdefault(k, payload)  # the new payload of a key wins
                txn.delete(key, db=self.segments)
            keys = sorted(merged)
            values = list(map(merged.__getitem__, keys))
        sizes = list(itertools.accumulate(map(len, values)))
        puts = []
        start, base, n = 0, 0, len(keys)
        while start < n:
            end = bisect.bisect_right(sizes, base + SEGMENT_BYTES, start, min(start + SEGMENT_ENTRIES, n))
            end = max(end, start + 1)
            puts.append((keys[start], encode_segment(keys[start:end], values[start:end])))
            base = sizes[end - 1]
            start = end
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
        key = _KEY.pack(ledger_id, entry_id)
        value = self._covering(txn.cursor(db=self.segments), key)
        if value is not None:
            items = decode_segment(value)
            for i, (k, payload) in enumerate(items):
                if k == key and payload:
                    items[i] = (k, payload[:-1] + bytes([payload[-1] ^ 0xFF]))
                    txn.put(items[0][0], encode_segment([k for k, _ in items], [p for _, p in items]),
                            db=self.segments)
                    return True
        found = txn.get(key, db=self.legacy)
        if found is None or not len(found):
            return False
        payload = bytes(found)
        txn.put(key, payload[:-1] + bytes([payload[-1] ^ 0xFF]), db=self.legacy)
        return True
