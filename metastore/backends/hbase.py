"""HBase MetaStore backend (happybase over the HBase Thrift1 gateway).

URI: ``hbase://host[:port]/prefix`` (port defaults to 9090, the prefix to
``quire``; a query string such as ``?timeout=2`` adds configuration, keyword
arguments win)::

    ms = await open_metastore("hbase://thrift-gw:9090/quire", timeout=2.0)

Configuration (``HBaseOptions``; numbers may be strings, as read from a
``.conf`` file; an unknown key or a bad value is an ``IllegalOpError`` naming
it; every key with its default is in ``conf/metastore-hbase.conf``):

* ``timeout`` — seconds (default 5): bound of connecting, of every Thrift
  call and of every metastore operation; ``ServiceDownError`` after it;
* ``pool_size`` — Thrift connections, and worker threads, per store (default 4);
* ``max_value_size`` — bytes per field value and per field name (default
  10 MiB, HBase's ``hbase.client.keyvalue.maxsize``); over it -> ``IllegalOpError``;
* ``transport`` (``buffered``/``framed``) and ``protocol`` (``binary``/``compact``)
  — must match how the gateway was started (defaults: happybase's);
* ``watch_poll_interval`` — seconds between watch polls (default 0.05).

Tables
    One HBase table per metastore table, named ``<prefix>_<table>``. The
    prefix must match ``[A-Za-z0-9][A-Za-z0-9.-]*`` (no ``_``, so
    ``<prefix>_`` is unambiguous). In the table part, ASCII letters, digits,
    ``_`` and ``.`` stay as they are and every other UTF-8 byte becomes
    ``-xx`` (two lowercase hex digits; ``-`` itself is ``-2d``), so any
    non-empty ``str`` maps to a legal, distinct HBase table name. Tables are
    created on first use with the families ``f`` and ``m`` (one version each).

Rows
    A key is the row whose key is the UTF-8 of the ``str`` (lone surrogates
    through ``surrogatepass``); UTF-8 byte order is code-point order, so HBase
    row order is Python ``str`` order and every table is scannable with native
    row-range scans (``Order.DESC`` uses HBase reversed scans). HBase limits a
    row key to 32767 bytes; a longer key raises ``IllegalOpError``.

Storage layout decision
    The Thrift1 IDL's ``checkAndPut`` checks one cell and writes exactly *one*
    cell (a single ``Mutation``), and ``mutateRow`` is unconditional (the real
    gateway even applies its deletes and puts as two operations). A put that
    merges several fields, deletes some and bumps the version can therefore not
    be written atomically as separate cells. Rather than giving up the
    column-per-field layout (which Spark scans read), the version cell is the
    commit point and carries the change until it is applied:

    * ``f:<field name>`` — one column per field (qualifier = UTF-8 of the name,
      any character); each cell's HBase timestamp is the version that wrote it.
    * ``m:v`` — the record's state, always written with ``checkAndPut`` on
      itself:

      - 8 bytes: version (unsigned big-endian) — a live record whose ``f``
        columns are exactly its fields;
      - 8 bytes + ``0x01`` + delta — committed put not yet applied to ``f``
        ("pending"); the delta lists the changed fields (new value, or deleted);
      - 8 bytes + ``0x02`` — committed remove not yet applied;
      - 8 bytes + ``0x03`` — tombstone of a removed key (kept, so that a key
        created again gets a larger version: versions grow across remove and
        re-create without trusting clocks).

    A put: ``checkAndPut(m:v, expected=<current state>, put=<new version +
    delta>)`` commits; then ``mutateRowTs`` writes the delta's cells (deletes
    as column deletes) at timestamp = new version; then ``checkAndPut`` turns
    ``m:v`` back into the plain 8-byte version. A reader does one row-atomic
    ``getRow``: a plain version means "the ``f`` columns are the record"; a
    pending delta is applied on top of them. Whoever meets a pending state
    before writing (the next writer, after a crash of the previous one) applies
    it first, so commits only ever stack on applied states. Applying a delta is
    idempotent and, because each cell's timestamp is its version, a late
    duplicate applier cannot override a newer write (newer cells and newer
    delete markers win), barring an HBase major compaction that purges those
    markers in between. A remove commits ``0x02`` the same way, then deletes
    the ``f`` family up to its version, then leaves the ``0x03`` tombstone.

    Costs: a get is 1 Thrift call; a put or remove with a concrete version or
    ``Version.NEW`` is 3 (commit, apply, settle); ``Version.ANY`` adds a read;
    a put that changes no field is 1. Versions are ``max(previous + 1, now in
    ms)``, so cell timestamps stay close to HBase's own. A single put's delta
    lives in one cell, so the *sum* of the fields changed by one put must fit
    the gateway's KeyValue limit (10 MiB by default); over it the gateway's
    ``IllegalArgument`` becomes ``IllegalOpError`` and nothing is written.
    Tombstones of removed keys stay (9 bytes each); scans skip them.

Concurrency and failures
    Blocking happybase calls run in a per-store pool of ``pool_size`` worker
    threads, each with its own Thrift connection (``ThreadConnections``), so
    the event loop never blocks. CAS conflicts are detected by ``checkAndPut``,
    hence across processes and hosts. After a transport error every pooled
    connection is replaced; reads (get, scans, table checks) are retried once
    on a fresh connection, writes are not (their outcome is unknown). Thrift
    and socket failures, the gateway's ``IOError`` and ``timeout`` ->
    ``ServiceDownError`` (a write that fails that way may or may not have been
    committed; if it was, the next writer or reader completes it); the
    gateway's ``IllegalArgument`` -> ``IllegalOpError``. ``open`` makes one
    call, so an unreachable or silent gateway fails there within ``timeout``.

Counters (``CounterCapability``)
    The HBase table ``<prefix>_-counters`` (no metastore table maps there:
    escaping only ever puts two hex digits after a ``-``), one row per
    counter, its value in the cell ``f:n`` as HBase's own 8-byte counters;
    an add is one Thrift ``atomicIncrement`` (not retried after a transport
    error: its outcome is unknown, so the counter may have moved on, which
    leaves a gap and never a repeat).

Sessions are leases and watches are polled (``metastore.lease``).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import re
import struct
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

import happybase
from thriftpy2.protocol.exc import TProtocolException
from thriftpy2.thrift import TException
from thriftpy2.transport import TTransportException

from metastore.api import (
    ALL_FIELDS,
    MAX_COUNTER,
    Counters,
    Fields,
    ListCursor,
    MetastoreCursor,
    MetastoreScannableTable,
    MetastoreTable,
    Order,
    Value,
    Version,
    Versioned,
    Watcher,
    check_counter,
    check_fields,
    check_key,
    check_range,
    check_value,
    check_version,
    in_range,
)
from metastore.cas import ANY_ATTEMPTS, cas_retry_sync
from metastore.conf import require, setting, store_options
from metastore.errors import (
    BadVersionError,
    IllegalOpError,
    KeyExistsError,
    MetastoreError,
    NoKeyError,
    ServiceDownError,
)
from metastore.lease import LeaseBackedMetaStore, LeaseOptions

log = logging.getLogger(__name__)

T = TypeVar("T")

Hbase_thrift: ModuleType = importlib.import_module("Hbase_thrift")  # loaded by ``import happybase``

DEFAULT_PORT = 9090
DEFAULT_PREFIX = "quire"
DEFAULT_TIMEOUT = 5.0
DEFAULT_POOL_SIZE = 4
DEFAULT_MAX_VALUE_SIZE = 10 * 1024 * 1024
MAX_ROW_BYTES = 32767
_PREFIX_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]*")
_NAME_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.")

FAMILY_FIELDS = b"f"
COL_STATE = b"m:v"
_FIELD_PREFIX = FAMILY_FIELDS + b":"
_VER = struct.Struct(">Q")
_ENTRY = struct.Struct(">Ii")  # qualifier length, value length (-1: field deleted)
KIND_PUT = 1
KIND_REMOVE = 2
KIND_REMOVED = 3


def _now_ms() -> int:
    return int(time.time() * 1000)


# -- names ---------------------------------------------------------------------------------------


def hbase_table_name(prefix: str, table: str) -> bytes:
    """``<prefix>_<escaped table>``: a legal HBase table name, distinct for every ``str`` table."""
    out = bytearray(prefix.encode("ascii") + b"_")
    for b in table.encode("utf-8", "surrogatepass"):
        if b in _NAME_SAFE:
            out.append(b)
        else:
            out += b"-%02x" % b
    return bytes(out)


def _utf8(s: str) -> bytes:
    return s.encode("utf-8", "surrogatepass")


def _text(b: bytes) -> str:
    return b.decode("utf-8", "surrogatepass")


def parse_uri(uri: str) -> tuple[str, int, str, dict[str, str]]:
    """Split ``hbase://host[:port]/prefix[?k=v]`` into (host, port, prefix, query conf).

    Raises ``IllegalOpError`` when malformed.
    """
    if not isinstance(uri, str):
        raise IllegalOpError(f"metastore URI must be a str, not {type(uri).__name__}")
    usage = "expected hbase://host[:port]/prefix"
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError as exc:
        raise IllegalOpError(f"malformed HBase URI {uri!r}: {exc}; {usage}") from None
    if parts.scheme.lower() != "hbase" or "://" not in uri:
        raise IllegalOpError(f"malformed HBase URI {uri!r}: {usage}")
    if not parts.hostname:
        raise IllegalOpError(f"malformed HBase URI {uri!r}: no host; {usage}")
    if parts.username is not None or parts.fragment:
        raise IllegalOpError(f"malformed HBase URI {uri!r}: credentials and fragments are not supported")
    if port == 0:
        raise IllegalOpError(f"malformed HBase URI {uri!r}: port 0")
    prefix = unquote(parts.path).strip("/") or DEFAULT_PREFIX
    if not _PREFIX_RE.fullmatch(prefix):
        raise IllegalOpError(f"malformed HBase URI {uri!r}: the prefix {prefix!r} must match "
                             "[A-Za-z0-9][A-Za-z0-9.-]* (it starts HBase table names)")
    try:
        conf = dict(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query)))
    except ValueError:
        raise IllegalOpError(f"malformed HBase URI {uri!r}: bad query string") from None
    return parts.hostname, port or DEFAULT_PORT, prefix, conf


# -- the state cell ------------------------------------------------------------------------------

Delta = list[tuple[bytes, bytes | None]]
"""Changed fields of a put: (qualifier, new value or None for a deleted field)."""


def encode_delta(delta: Delta) -> bytes:
    parts = []
    for qual, value in delta:
        parts.append(_ENTRY.pack(len(qual), -1 if value is None else len(value)))
        parts.append(qual)
        if value is not None:
            parts.append(value)
    return b"".join(parts)


def decode_delta(raw: bytes, pos: int = 0) -> Delta:
    out: Delta = []
    while pos < len(raw):
        qlen, vlen = _ENTRY.unpack_from(raw, pos)
        pos += _ENTRY.size
        qual = raw[pos:pos + qlen]
        pos += qlen
        if vlen < 0:
            out.append((qual, None))
        else:
            out.append((qual, raw[pos:pos + vlen]))
            pos += vlen
    return out


@dataclass(frozen=True)
class State:
    """A decoded ``m:v`` cell (``cell is None``: the row has no record and never had a tombstone)."""

    cell: bytes | None
    version: int
    kind: int  # 0: plain live record

    @classmethod
    def decode(cls, cell: bytes | None) -> State:
        if not cell:
            return cls(None, 0, 0)
        if len(cell) < 8:
            raise ServiceDownError(f"corrupt state cell {cell!r}")
        return cls(cell, _VER.unpack_from(cell)[0], cell[8] if len(cell) > 8 else 0)

    @property
    def live(self) -> bool:
        return self.cell is not None and self.kind in (0, KIND_PUT)

    @property
    def pending(self) -> bool:
        return self.kind in (KIND_PUT, KIND_REMOVE)

    @property
    def delta(self) -> Delta:
        return decode_delta(self.cell, 9) if self.kind == KIND_PUT and self.cell else []

    def settled(self) -> bytes:
        """The cell this state leaves once applied."""
        head = _VER.pack(self.version)
        return head + bytes([KIND_REMOVED]) if self.kind in (KIND_REMOVE, KIND_REMOVED) else head


def _put_cell(version: int, delta: Delta) -> bytes:
    head = _VER.pack(version)
    return head + bytes([KIND_PUT]) + encode_delta(delta) if delta else head


def _record(state: State, columns: dict[bytes, Any], wanted: frozenset[bytes] | None) -> Versioned:
    """The record a row shows: its ``f`` cells with a pending delta applied on top."""
    value = Value()
    for col, cell in columns.items():
        if col.startswith(_FIELD_PREFIX):
            value[_text(col[2:])] = cell.value
    for qual, new in state.delta:
        if wanted is not None and qual not in wanted:
            continue
        if new is None:
            value.pop(_text(qual), None)
        else:
            value[_text(qual)] = new
    return Versioned(value, Version(state.version))


class _LostRace(Exception):
    """Another writer swapped the state cell between our read and our ``checkAndPut``."""


@dataclass(frozen=True)
class _Scan:
    """A row range: ``start``/``stop`` as HBase takes them plus the exact ``str`` range to keep."""

    start: bytes
    stop: bytes
    reversed: bool
    skip_first: bytes | None  # DESC with an exclusive high end: the start row itself is skipped
    first_key: str
    first_inclusive: bool
    last_key: str
    last_inclusive: bool
    order: Order

    @classmethod
    def plan(cls, first: str, first_inc: bool, last: str, last_inc: bool, order: Order) -> _Scan:
        f, la = _utf8(first), _utf8(last)
        if order is Order.ASC:
            start = f if (not f or first_inc) else f + b"\x00"
            stop = (la + b"\x00" if last_inc else la) if la else b""
            return cls(start, stop, False, None, first, first_inc, last, last_inc, order)
        # reversed scans start at the high row (inclusive) and stop before the low row (exclusive);
        # an inclusive low end stops at a row below it, and rows in between are cut client-side
        stop = (la[:-1] if last_inc else la) if la else b""
        skip = f if f and not first_inc else None
        return cls(f, stop, True, skip, first, first_inc, last, last_inc, order)


# -- tables --------------------------------------------------------------------------------------


class _HBaseCursor(ListCursor):
    """A paged cursor that is closed with its store, even for entries it has buffered."""

    table: HBaseTable | None = None

    def _check_open(self) -> None:
        super()._check_open()
        if self.table is not None and self.table.closed:
            raise IllegalOpError(f"cursor of table {self.table.name}: the metastore is closed")


class HBaseTable(MetastoreScannableTable):
    """A raw HBase-backed table (no lease handling; ``HBaseMetaStore`` wraps it)."""

    def __init__(self, store: HBaseMetaStore, name: str, hbase_name: bytes) -> None:
        super().__init__(name)
        self._store = store
        self.hbase_name = hbase_name

    @property
    def closed(self) -> bool:
        return self._closed or self._store.closed

    def _check_open(self) -> None:
        if self.closed:
            raise IllegalOpError(f"table {self.name} is closed")

    def _row(self, key: str) -> bytes:
        row = _utf8(check_key(key))
        if len(row) > MAX_ROW_BYTES:
            raise IllegalOpError(f"key of {len(row)} bytes is over HBase's {MAX_ROW_BYTES}-byte row limit")
        return row

    @staticmethod
    def _columns(fields: Fields) -> tuple[list[bytes], frozenset[bytes] | None]:
        if fields is ALL_FIELDS:
            return [COL_STATE, FAMILY_FIELDS], None
        wanted = frozenset(_utf8(f) for f in fields)  # type: ignore[union-attr]
        return [COL_STATE, *(_FIELD_PREFIX + q for q in sorted(wanted))], wanted

    # -- blocking parts, run in the store's worker threads --

    def _read_state(self, client: Any, row: bytes) -> bytes | None:
        got = client.getRowWithColumns(self.hbase_name, row, [COL_STATE], {})
        cell = got[0].columns.get(COL_STATE) if got else None
        return bytes(cell.value) if cell is not None else None

    def _settle(self, client: Any, row: bytes, state: State) -> bytes:
        """Apply a pending state to the ``f`` columns and mark it applied; returns the settled cell."""
        if state.kind == KIND_PUT:
            mutations = [Hbase_thrift.Mutation(isDelete=value is None, column=_FIELD_PREFIX + qual,
                                               value=value) for qual, value in state.delta]
        else:
            mutations = [Hbase_thrift.Mutation(isDelete=True, column=FAMILY_FIELDS)]
        client.mutateRowTs(self.hbase_name, row, mutations, state.version, {})
        settled = state.settled()
        client.checkAndPut(self.hbase_name, row, COL_STATE, state.cell,
                           Hbase_thrift.Mutation(column=COL_STATE, value=settled), {})
        return settled

    def _get_sync(self, client: Any, row: bytes, columns: list[bytes],
                  wanted: frozenset[bytes] | None) -> Versioned | None:
        got = client.getRowWithColumns(self.hbase_name, row, columns, {})
        cell = got[0].columns.get(COL_STATE) if got else None
        state = State.decode(bytes(cell.value) if cell is not None else None)
        if not state.live:
            return None
        return _record(state, got[0].columns, wanted)

    def _write_sync(self, client: Any, row: bytes, key: str, delta: Delta | None, version: Version) -> int:
        """A put (``delta`` given) or a remove (``delta is None``); returns the new version.

        One try reads the state cell, checks it and swaps it with ``checkAndPut``; a try that
        loses the swap to another writer is retried (``metastore.cas``, jittered backoff) and
        re-checks, so a lost race on a stale version still ends in ``BadVersionError`` and a
        ``Version.ANY`` put wins eventually. Tries stop at ``timeout`` (``ServiceDownError``),
        when the caller has stopped waiting anyway.
        """
        where = f"{self.name}/{key}"

        def attempt(cur: bytes | None) -> int | None:
            """The new version, or ``None`` when another writer changed the cell first."""
            state = State.decode(cur)
            if state.pending:
                cur = self._settle(client, row, state)
                state = State.decode(cur)
            if delta is not None and version == Version.NEW:
                if state.live:
                    raise KeyExistsError(where)
            elif not state.live:
                raise NoKeyError(where)
            elif version == Version.NEW:
                raise BadVersionError(f"{where} exists (remove with Version.NEW)")
            elif version != Version.ANY and state.version != version.value:
                raise BadVersionError(f"{where}: version {version!r} is not current")
            new_version = max(state.version + 1, _now_ms())
            cell = (_put_cell(new_version, delta) if delta is not None
                    else _VER.pack(new_version) + bytes([KIND_REMOVE]))
            if not client.checkAndPut(self.hbase_name, row, COL_STATE, cur,
                                      Hbase_thrift.Mutation(column=COL_STATE, value=cell), {}):
                return None
            committed = State.decode(cell)
            if committed.pending:  # a failure from here on leaves it to the next writer
                self._settle(client, row, committed)
            return new_version

        # Optimistic first try, no read: a create expects no row, a CAS its version applied.
        if version == Version.NEW and delta is not None:
            done = attempt(None)
        elif not version.is_sentinel and 0 <= version.value < 1 << 64:
            done = attempt(_VER.pack(version.value))
        else:
            done = None
        if done is not None:
            return done

        deadline = time.monotonic() + self._store.timeout  # the caller stops waiting then

        def step() -> int:
            if time.monotonic() > deadline:
                raise ServiceDownError(f"{where}: still contended after {self._store.timeout:g} s")
            got = attempt(self._read_state(client, row))
            if got is None:
                raise _LostRace(where)
            return got

        try:
            return cas_retry_sync(step, attempts=ANY_ATTEMPTS, retry_on=(_LostRace,))
        except _LostRace:
            raise ServiceDownError(f"{where}: gave up after {ANY_ATTEMPTS} contended updates") from None

    def _scan_sync(self, client: Any, scan: _Scan, resume: bytes | None, columns: list[bytes],
                   wanted: frozenset[bytes] | None, n: int
                   ) -> tuple[list[tuple[str, Versioned]], bytes | None, bool]:
        """Live entries (at least one unless the range is exhausted) after ``resume``.

        Returns (entries, last row scanned, exhausted).
        """
        out: list[tuple[str, Versioned]] = []
        while True:
            if resume is None:
                start, skip = scan.start, scan.skip_first
            elif scan.reversed:
                start, skip = resume, resume
            else:
                start, skip = resume + b"\x00", None
            batch = n + (1 if skip is not None else 0)
            tscan = Hbase_thrift.TScan(startRow=start, stopRow=scan.stop, columns=columns, caching=batch,
                                       reversed=scan.reversed)
            sid = client.scannerOpenWithScan(self.hbase_name, tscan, {})
            try:
                rows = client.scannerGetList(sid, batch)
            finally:
                client.scannerClose(sid)
            for r in rows:
                resume = bytes(r.row)
                if resume == skip:
                    continue
                try:
                    key = _text(resume)
                except UnicodeDecodeError:
                    log.warning("table %s: skipping row %r (not UTF-8)", self.name, resume)
                    continue
                if not in_range(key, scan.first_key, scan.first_inclusive, scan.last_key,
                                scan.last_inclusive, scan.order):
                    return out, resume, True  # past the end of the range
                cell = r.columns.get(COL_STATE)
                state = State.decode(bytes(cell.value) if cell is not None else None)
                if state.live:
                    out.append((key, _record(state, r.columns, wanted)))
            if len(rows) < batch:
                return out, resume, True
            if out:
                return out, resume, False

    # -- the async API --

    async def get(self, key: str, fields: Fields = ALL_FIELDS, watcher: Watcher | None = None) -> Versioned:
        self._check_open()
        row = self._row(key)
        columns, wanted = self._columns(check_fields(fields))
        got = await self._store.call(self._get_sync, row, columns, wanted, idempotent=True)
        if got is None:
            raise NoKeyError(f"{self.name}/{key}")
        return got

    async def put(self, key: str, value: Value, version: Version) -> Version:
        self._check_open()
        row = self._row(key)
        value = check_value(value)
        version = check_version(version)
        limit = self._store.max_value_size
        delta: Delta = []
        for name, v in value.items():
            qual = _utf8(name)
            if len(qual) > limit or (v is not None and len(v) > limit):
                raise IllegalOpError(f"field {name[:64]!r}: {len(v or b'')} bytes (name {len(qual)}) "
                                     f"is over the hbase limit of {limit}")
            delta.append((qual, v))
        return Version(await self._store.call(self._write_sync, row, key, delta, version))

    async def remove(self, key: str, version: Version) -> None:
        self._check_open()
        row = self._row(key)
        version = check_version(version)
        await self._store.call(self._write_sync, row, key, None, version)

    async def _cursor(self, scan: _Scan, fields: Fields) -> MetastoreCursor:
        columns, wanted = self._columns(check_fields(fields))
        resume: bytes | None = None
        done = False

        async def fetch(after: str | None, n: int) -> list[tuple[str, Versioned]]:
            nonlocal resume, done
            if done:
                return []
            self._check_open()
            out, resume, done = await self._store.call(self._scan_sync, scan, resume, columns, wanted, n,
                                                         idempotent=True)
            return out

        cursor = await _HBaseCursor.paged(fetch)
        assert isinstance(cursor, _HBaseCursor)
        cursor.table = self
        return cursor

    async def open_cursor(self, fields: Fields = ALL_FIELDS) -> MetastoreCursor:
        self._check_open()
        return await self._cursor(_Scan.plan("", True, "", True, Order.ASC), fields)

    async def open_cursor_range(self, first_key: str, first_inclusive: bool, last_key: str,
                                last_inclusive: bool, order: Order = Order.ASC,
                                fields: Fields = ALL_FIELDS) -> MetastoreCursor:
        self._check_open()
        check_range(first_key, last_key, order)
        return await self._cursor(_Scan.plan(first_key, bool(first_inclusive), last_key,
                                             bool(last_inclusive), order), fields)


# -- the store -----------------------------------------------------------------------------------


COUNTERS_TABLE_SUFFIX = b"_-counters"
COL_COUNTER = b"f:n"


class HBaseCounters(Counters):
    """``CounterCapability`` on HBase: Thrift ``atomicIncrement`` on ``<prefix>_-counters`` (see the docstring)."""

    def __init__(self, store: HBaseMetaStore, hbase_name: bytes) -> None:
        self._store = store
        self._table = hbase_name

    def _increment(self, client: Any, row: bytes, delta: int) -> int:
        if not delta:
            cells = client.get(self._table, row, COL_COUNTER, {})
            return int(struct.unpack(">q", cells[0].value)[0]) if cells else 0
        new: int = client.atomicIncrement(self._table, row, COL_COUNTER, delta)
        return new

    async def add(self, name: str, delta: int) -> int:
        name, delta = check_counter(name, delta)
        row = _utf8(name)
        if len(row) > MAX_ROW_BYTES:
            raise IllegalOpError(f"counter name of {len(row)} bytes is over HBase's {MAX_ROW_BYTES}-byte limit")
        new = await self._store.call(self._increment, row, delta, idempotent=not delta)
        if new < 0:   # HBase's signed 64-bit counter wrapped
            raise IllegalOpError(f"counter {name!r} passed {MAX_COUNTER}")
        return new


@dataclass(frozen=True)
class HBaseOptions(LeaseOptions):
    """Options of ``hbase://`` stores (URI query string or ``open_metastore`` keyword arguments)."""

    timeout: float = setting(DEFAULT_TIMEOUT, "seconds bounding connecting, every Thrift call and every operation")
    pool_size: int = setting(DEFAULT_POOL_SIZE, "Thrift connections, and worker threads, per store")
    max_value_size: int = setting(DEFAULT_MAX_VALUE_SIZE, "largest field value (and field name) in bytes "
                                  "(HBase's hbase.client.keyvalue.maxsize)")
    transport: str = setting("buffered", "Thrift transport of the gateway", choices=("buffered", "framed"))
    protocol: str = setting("binary", "Thrift protocol of the gateway", choices=("binary", "compact"))

    def __post_init__(self) -> None:
        require(self.timeout > 0 and self.timeout != float("inf"), "timeout", self.timeout, "must be positive")
        require(self.pool_size >= 1, "pool_size", self.pool_size, "must be positive")
        require(self.max_value_size >= 1, "max_value_size", self.max_value_size, "must be positive")


_TRANSPORT_ERRORS = (TTransportException, TProtocolException, OSError, EOFError)
"""Errors after which a connection's stream can no longer be trusted (the gateway's own
``IOError``/``IllegalArgument`` answers leave it usable)."""


class ThreadConnections:
    """One happybase connection per worker thread, replaced after any transport error.

    The store's executor has ``pool_size`` threads, so this is a pool of
    ``pool_size`` connections with no hand-over between threads. A transport
    error bumps a generation number: every thread then reconnects before its
    next call, so a restarted gateway costs one failed call, not one per
    pooled connection (happybase's ``ConnectionPool`` only replaces the
    connection that failed).
    """

    def __init__(self, host: str, port: int, timeout_ms: int, **options: str) -> None:
        self._args: dict[str, Any] = {"host": host, "port": port, "timeout": timeout_ms,
                                      "autoconnect": False, **options}
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[Any] = []
        self._generation = 0
        self._closed = False

    def get(self) -> Any:
        """This thread's connected ``happybase.Connection`` (connecting it if needed)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.generation == self._generation:
            return conn
        self._drop(conn)
        self._local.conn = None
        generation = self._generation
        conn = happybase.Connection(**self._args)
        conn.open()  # TTransportException when the gateway is unreachable
        with self._lock:
            if self._closed:
                conn.close()
                raise IllegalOpError("the HBase metastore is closed")
            self._all.append(conn)
        self._local.conn, self._local.generation = conn, generation
        return conn

    def broken(self) -> None:
        """The current thread's connection failed: drop it, and make every thread reconnect."""
        with self._lock:
            self._generation += 1
        self._drop(getattr(self._local, "conn", None))
        self._local.conn = None

    def _drop(self, conn: Any) -> None:
        if conn is None:
            return
        with self._lock:
            if conn in self._all:
                self._all.remove(conn)
        try:
            conn.close()
        except Exception:
            log.debug("closing an HBase connection failed", exc_info=True)

    def close_all(self) -> None:
        """Close every connection (a call still running in a worker then fails)."""
        with self._lock:
            self._closed = True
            conns, self._all = self._all, []
        for conn in conns:
            try:
                conn.close()
            except Exception:
                log.debug("closing an HBase connection failed", exc_info=True)


class HBaseMetaStore(LeaseBackedMetaStore):
    """``hbase://host:port/prefix``: metadata in HBase through its Thrift1 gateway; see the module docstring."""

    name = "hbase"
    version = 1
    def __init__(self, uri: str, host: str, port: int, prefix: str, options: HBaseOptions | None = None) -> None:
        options = options or HBaseOptions()
        super().__init__(options)
        self.options = options
        self.uri = uri
        self.host = host
        self.port = port
        self.prefix = prefix
        self.timeout = options.timeout
        self.max_value_size = options.max_value_size
        self.pool_size = options.pool_size
        self._connections = ThreadConnections(
            host, port, max(1, int(self.timeout * 1000)), transport=options.transport, protocol=options.protocol)
        self._executor = ThreadPoolExecutor(self.pool_size, thread_name_prefix="quire-hbase")
        self._known_tables: set[bytes] = set()

    def __repr__(self) -> str:
        return f"HBaseMetaStore({self.host}:{self.port}, prefix={self.prefix!r})"

    @classmethod
    async def open(cls, uri: str, **conf: Any) -> HBaseMetaStore:
        host, port, prefix, query = parse_uri(uri)
        store = cls(uri, host, port, prefix, store_options(HBaseOptions, query, conf,
                                                          source="hbase metastore options"))
        try:  # one cheap call proves the gateway answers (a silent one times out here)
            await store.call(_list_tables, idempotent=True)
        except BaseException:
            await store.close()
            raise
        log.debug("opened HBase metastore %s:%d (prefix %s)", host, port, prefix)
        return store

    def _run(self, fn: Callable[..., T], idempotent: bool, args: tuple[Any, ...]) -> T:
        """In a worker thread: ``fn(client, *args)``; an idempotent call is retried once on a
        fresh connection after a transport error (a stale pooled connection, a restarted gateway)."""
        for attempt in (1, 2):
            try:
                return fn(self._connections.get().client, *args)
            except _TRANSPORT_ERRORS:
                self._connections.broken()
                if not idempotent or attempt == 2 or self._closed:
                    raise
        raise AssertionError("unreachable")

    async def call(self, fn: Callable[..., T], *args: Any, idempotent: bool = False) -> T:
        """Run ``fn(thrift_client, *args)`` in a worker thread within ``timeout``, mapping errors:
        ``IllegalArgument`` -> ``IllegalOpError``, transport errors and the gateway's ``IOError`` ->
        ``ServiceDownError``; ``MetastoreError`` raised by ``fn`` passes through."""
        self._check_open()
        what = getattr(fn, "__name__", "call").strip("_")
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(
                loop.run_in_executor(self._executor, self._run, fn, idempotent, args), self.timeout)
        except MetastoreError:
            raise
        except TimeoutError:
            raise ServiceDownError(f"{what}: no answer from the HBase gateway {self.host}:{self.port} "
                                   f"within {self.timeout:g} s") from None
        except RuntimeError as exc:  # the executor was shut down by close()
            if self._closed:
                raise IllegalOpError("the HBase metastore is closed") from exc
            raise
        except Exception as exc:
            if isinstance(exc, Hbase_thrift.IllegalArgument):
                raise IllegalOpError(f"{what}: HBase refused it: {_message(exc)}") from exc
            if isinstance(exc, TException | OSError | EOFError):
                raise ServiceDownError(f"{what}: HBase gateway {self.host}:{self.port}: "
                                       f"{type(exc).__name__}: {_message(exc)}") from exc
            raise

    def _ensure_table(self, client: Any, hbase_name: bytes) -> None:
        if hbase_name in set(client.getTableNames()):
            families = set(client.getColumnDescriptors(hbase_name))
            missing = {FAMILY_FIELDS + b":", COL_STATE.split(b":")[0] + b":"} - families
            if missing:
                raise IllegalOpError(f"HBase table {hbase_name!r} exists without the families {missing}")
            return
        try:
            client.createTable(hbase_name, [
                Hbase_thrift.ColumnDescriptor(name=fam, maxVersions=1, blockCacheEnabled=True)
                for fam in (b"f:", b"m:")])
            log.info("created HBase table %s", hbase_name.decode())
        except Hbase_thrift.AlreadyExists:
            pass  # another process won the race

    async def counters(self) -> Counters:
        """``CounterCapability``: ``HBaseCounters`` (one ``atomicIncrement`` per add)."""
        self._check_open()
        hbase_name = self.prefix.encode("ascii") + COUNTERS_TABLE_SUFFIX
        if hbase_name not in self._known_tables:
            await self.call(self._ensure_table, hbase_name, idempotent=True)
            self._known_tables.add(hbase_name)
        return HBaseCounters(self, hbase_name)

    async def _open_raw_table(self, name: str, scannable: bool) -> MetastoreTable:
        self._check_open()
        hbase_name = hbase_table_name(self.prefix, name)
        if hbase_name not in self._known_tables:
            await self.call(self._ensure_table, hbase_name, idempotent=True)
            self._known_tables.add(hbase_name)
        return HBaseTable(self, name, hbase_name)

    async def close(self) -> None:
        if self._closed:
            return
        try:
            await super().close()
        finally:
            self._closed = True
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._connections.close_all()


def _list_tables(client: Any) -> list[bytes]:
    names: list[bytes] = client.getTableNames()
    return names


def _message(exc: BaseException) -> str:
    msg = getattr(exc, "message", None) or str(exc)
    return msg.decode("utf-8", "replace") if isinstance(msg, bytes) else str(msg)


__all__: Sequence[str] = ["HBaseMetaStore", "HBaseTable", "hbase_table_name", "parse_uri"]
