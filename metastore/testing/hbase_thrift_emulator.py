"""TEST DOUBLE — an in-memory emulator of the HBase **Thrift1 gateway**. It is not HBase.

No HBase server can be installed on the machines Quire is developed and
tested on, so this module serves happybase's own ``Hbase.thrift`` IDL
(happybase loads it as the module ``Hbase_thrift``) from a thriftpy2 server
backed by an in-memory store. It exists only so that the hbase metastore
backend and its tests can run; nothing in production may depend on it. Run
the same tests against a real gateway with ``QUIRE_HBASE_THRIFT=host:port``.

Usage::

    with HBaseThriftEmulator() as emu:           # binds 127.0.0.1 on a free port
        conn = happybase.Connection("127.0.0.1", emu.port)

    $ python -m metastore.testing.hbase_thrift_emulator --port 9090
    127.0.0.1:9090                               # first stdout line: the bound address

What it emulates, with HBase's semantics:

* tables with column families (``createTable``/``deleteTable``/enable/disable,
  ``getColumnDescriptors``, ``getTableRegions``); writing to or reading from
  a family the table does not have is an ``IOError`` (NoSuchColumnFamily);
* rows kept in unsigned byte order; scanners (``scannerOpen*``,
  ``scannerOpenWithScan`` including ``reversed``, ``caching``, ``timestamp``,
  ``columns``, ``sortColumns``) with inclusive start and exclusive stop rows;
* per-cell timestamps (server time in milliseconds unless the ``*Ts`` call
  gives one), ``maxVersions`` per family, ``*Ts`` reads as the upper bound
  (exclusive) of the time range;
* deletes as HBase does them: a column or family delete at timestamp ``T``
  removes every version ``<= T`` *and leaves a marker* that also masks puts
  with a timestamp ``<= T`` written later (until ``majorCompact``);
* ``mutateRow(s)(Ts)`` (deletes applied before puts, as the real gateway
  does), ``deleteAll*``, ``atomicIncrement``/``increment*``, ``append``;
* ``checkAndPut``: the put happens only if the checked column's newest value
  equals the expected value; an expected value of ``None`` or empty means
  "the column is absent (or empty)". The put is a single cell at server time;
* HBase's limits: row keys of 1..32767 bytes, cells up to
  ``max_keyvalue_size`` bytes (``hbase.client.keyvalue.maxsize``, 10 MiB),
  legal table names.

Not emulated: filters (``filterString`` -> ``IOError``), TTLs,
intra-row scan batching, regions, scanner leases, durability. All state is
guarded by one lock; a call is atomic, which is *stronger* than the real
gateway (whose ``mutateRow`` applies deletes and puts as two operations), so
code must not rely on more than HBase promises.
"""

from __future__ import annotations

import argparse
import bisect
import importlib
import logging
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import happybase  # noqa: F401  (importing happybase loads Hbase.thrift as the module "Hbase_thrift")
from thriftpy2 import protocol as _protocol
from thriftpy2 import transport as _transport
from thriftpy2.thrift import TApplicationException, TProcessor
from thriftpy2.transport import TTransportException

log = logging.getLogger(__name__)

Hbase_thrift: ModuleType = importlib.import_module("Hbase_thrift")
# thriftpy2's transports are untyped; these are the Cython versions happybase uses too
_TServerSocket: Any = _transport.TServerSocket
_TBufferedTransportFactory: Any = _transport.TBufferedTransportFactory
_TBinaryProtocolFactory: Any = _protocol.TBinaryProtocolFactory
"""happybase's thriftpy2 module for ``Hbase.thrift`` (``Hbase``, ``Mutation``, ``TRowResult``...)."""

MAX_ROW_LENGTH = 32767
DEFAULT_MAX_KEYVALUE_SIZE = 10 * 1024 * 1024
_KEYVALUE_OVERHEAD = 4 + 4 + 2 + 1 + 8 + 1  # lengths, family length, timestamp, type
_LEGAL_NAME_CHARS = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
_i64 = struct.Struct(">q")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _io_error(message: str) -> Exception:
    exc: Exception = Hbase_thrift.IOError(message=message)
    return exc


def _illegal(message: str) -> Exception:
    exc: Exception = Hbase_thrift.IllegalArgument(message=message)
    return exc


def _split_column(column: bytes) -> tuple[bytes, bytes | None]:
    """``b"fam:qual"`` -> ``(b"fam", b"qual")``; ``b"fam"`` -> ``(b"fam", None)`` (whole family)."""
    fam, sep, qual = column.partition(b":")
    return (fam, qual) if sep else (fam, None)


@dataclass
class _Row:
    """One row: column -> versions (newest first), plus delete markers."""

    cells: dict[bytes, list[tuple[int, bytes]]] = field(default_factory=dict)
    family_deleted: dict[bytes, int] = field(default_factory=dict)
    column_deleted: dict[bytes, int] = field(default_factory=dict)

    def masked(self, column: bytes, ts: int) -> bool:
        fam, _ = _split_column(column)
        return ts <= self.column_deleted.get(column, -1) or ts <= self.family_deleted.get(fam, -1)

    def put(self, column: bytes, ts: int, value: bytes, max_versions: int) -> None:
        if self.masked(column, ts):
            return  # HBase keeps it, but no read can ever see it
        versions = [(t, v) for t, v in self.cells.get(column, []) if t != ts]
        versions.append((ts, value))
        versions.sort(key=lambda tv: -tv[0])
        self.cells[column] = versions[:max(1, max_versions)]

    def delete_column(self, column: bytes, ts: int) -> None:
        self.column_deleted[column] = max(ts, self.column_deleted.get(column, -1))
        self._drop(lambda col: col == column, ts)

    def delete_family(self, family: bytes, ts: int) -> None:
        self.family_deleted[family] = max(ts, self.family_deleted.get(family, -1))
        self._drop(lambda col: _split_column(col)[0] == family, ts)

    def _drop(self, match: Any, ts: int) -> None:
        for col in [c for c in self.cells if match(c)]:
            kept = [(t, v) for t, v in self.cells[col] if t > ts]
            if kept:
                self.cells[col] = kept
            else:
                del self.cells[col]

    def latest(self, column: bytes, before: int | None = None) -> tuple[int, bytes] | None:
        for ts, value in self.cells.get(column, ()):
            if before is None or ts < before:
                return ts, value
        return None

    @property
    def dead(self) -> bool:
        return not self.cells and not self.family_deleted and not self.column_deleted


@dataclass
class _Table:
    name: bytes
    families: dict[bytes, Any]  # family (no colon) -> ColumnDescriptor
    enabled: bool = True
    rows: dict[bytes, _Row] = field(default_factory=dict)
    keys: list[bytes] = field(default_factory=list)  # sorted row keys of self.rows

    def row(self, key: bytes, create: bool = False) -> _Row | None:
        r = self.rows.get(key)
        if r is None and create:
            r = self.rows[key] = _Row()
            bisect.insort(self.keys, key)
        return r

    def gc(self, key: bytes) -> None:
        r = self.rows.get(key)
        if r is not None and r.dead:
            del self.rows[key]
            del self.keys[bisect.bisect_left(self.keys, key)]

    def max_versions(self, column: bytes) -> int:
        desc = self.families[_split_column(column)[0]]
        return int(desc.maxVersions or 1)


@dataclass
class _Scanner:
    table: bytes
    start: bytes
    stop: bytes
    columns: list[bytes] | None
    before: int | None
    reversed: bool
    sort_columns: bool
    last: bytes | None = None


class EmulatedHBase:
    """The in-memory store and the ``Hbase`` service handler (method names follow the IDL)."""

    def __init__(self, max_keyvalue_size: int = DEFAULT_MAX_KEYVALUE_SIZE) -> None:
        self.max_keyvalue_size = max_keyvalue_size
        self._lock = threading.RLock()
        self._tables: dict[bytes, _Table] = {}
        self._scanners: dict[int, _Scanner] = {}
        self._next_scanner = 1
        self._clock = 0

    # -- helpers ---------------------------------------------------------

    def _ts(self, ts: int | None = None) -> int:
        """An explicit timestamp, or the server's clock in ms (never going backwards)."""
        if ts is not None:
            if ts < 0:
                raise _illegal(f"negative timestamp {ts}")
            return ts
        self._clock = max(self._clock, _now_ms())
        return self._clock

    def _table(self, name: bytes, enabled: bool = True) -> _Table:
        t = self._tables.get(bytes(name or b""))
        if t is None:
            raise _io_error(f"TableNotFoundException: {name!r}")
        if enabled and not t.enabled:
            raise _io_error(f"TableNotEnabledException: {name!r}")
        return t

    @staticmethod
    def _check_family(t: _Table, column: bytes) -> tuple[bytes, bytes | None]:
        fam, qual = _split_column(column)
        if fam not in t.families:
            raise _io_error(f"NoSuchColumnFamilyException: column family {fam!r} does not exist "
                            f"in table {t.name!r}")
        return fam, qual

    def _check_row(self, row: bytes | None) -> bytes:
        if not row:
            raise _illegal("Row length is 0")
        if len(row) > MAX_ROW_LENGTH:
            raise _illegal(f"Row length {len(row)} is > {MAX_ROW_LENGTH}")
        return bytes(row)

    def _check_cell(self, row: bytes, column: bytes, value: bytes) -> None:
        size = _KEYVALUE_OVERHEAD + len(row) + len(column) - 1 + len(value)
        if size > self.max_keyvalue_size:
            raise _illegal(f"KeyValue size too large ({size} > {self.max_keyvalue_size})")

    def _wanted(self, t: _Table, columns: Sequence[bytes] | None) -> list[tuple[bytes, bytes | None]]:
        return [self._check_family(t, bytes(c)) for c in columns or ()]

    @staticmethod
    def _selected(column: bytes, wanted: list[tuple[bytes, bytes | None]]) -> bool:
        if not wanted:
            return True
        fam, qual = _split_column(column)
        return any(fam == wf and (wq is None or wq == qual) for wf, wq in wanted)

    def _result(self, key: bytes, r: _Row | None, wanted: list[tuple[bytes, bytes | None]],
                before: int | None, sort_columns: bool = False) -> Any | None:
        if r is None:
            return None
        cols: dict[bytes, Any] = {}
        for column in sorted(r.cells):
            if self._selected(column, wanted):
                cell = r.latest(column, before)
                if cell is not None:
                    cols[column] = Hbase_thrift.TCell(value=cell[1], timestamp=cell[0])
        if not cols:
            return None
        if sort_columns:
            return Hbase_thrift.TRowResult(row=key, sortedColumns=[
                Hbase_thrift.TColumn(columnName=c, cell=v) for c, v in cols.items()])
        return Hbase_thrift.TRowResult(row=key, columns=cols)

    def _get_rows(self, table: bytes, rows: Iterable[bytes], columns: Sequence[bytes] | None,
                  before: int | None) -> list[Any]:
        with self._lock:
            t = self._table(table)
            wanted = self._wanted(t, columns)
            out = []
            for key in rows:
                res = self._result(bytes(key), t.rows.get(bytes(key)), wanted, before)
                if res is not None:
                    out.append(res)
            return out

    def _apply(self, t: _Table, row: bytes, mutations: Sequence[Any], ts: int | None) -> None:
        """Validate every mutation first, then apply deletes, then puts (as the gateway does)."""
        row = self._check_row(row)
        stamp = self._ts(ts)
        deletes, puts = [], []
        for m in mutations or ():
            column = bytes(m.column or b"")
            fam, qual = self._check_family(t, column)
            if m.isDelete:
                deletes.append((fam, qual, column))
            elif qual is None:
                log.warning("no column qualifier in %r: a put needs one (ignored)", column)
            else:
                value = bytes(m.value or b"")
                self._check_cell(row, column, value)
                puts.append((column, value))
        r = t.row(row, create=True)
        assert r is not None
        for fam, qual, column in deletes:
            if qual is None:
                r.delete_family(fam, stamp)
            else:
                r.delete_column(column, stamp)
        for column, value in puts:
            r.put(column, stamp, value, t.max_versions(column))
        t.gc(row)

    # -- administration --------------------------------------------------

    def enableTable(self, tableName: bytes) -> None:
        with self._lock:
            self._table(tableName, enabled=False).enabled = True

    def disableTable(self, tableName: bytes) -> None:
        with self._lock:
            self._table(tableName, enabled=False).enabled = False

    def isTableEnabled(self, tableName: bytes) -> bool:
        with self._lock:
            return self._table(tableName, enabled=False).enabled

    def compact(self, tableNameOrRegionName: bytes) -> None:
        with self._lock:
            self._table(tableNameOrRegionName, enabled=False)

    def majorCompact(self, tableNameOrRegionName: bytes) -> None:
        """Drops delete markers, as a major compaction does."""
        with self._lock:
            t = self._table(tableNameOrRegionName, enabled=False)
            for key in list(t.keys):
                r = t.rows[key]
                r.family_deleted.clear()
                r.column_deleted.clear()
                t.gc(key)

    def getTableNames(self) -> list[bytes]:
        with self._lock:
            return sorted(self._tables)

    def getColumnDescriptors(self, tableName: bytes) -> dict[bytes, Any]:
        with self._lock:
            t = self._table(tableName, enabled=False)
            return {fam + b":": desc for fam, desc in t.families.items()}

    def getTableRegions(self, tableName: bytes) -> list[Any]:
        with self._lock:
            t = self._table(tableName, enabled=False)
            return [Hbase_thrift.TRegionInfo(startKey=b"", endKey=b"", id=0, name=t.name + b",,0",
                                             version=1, serverName=b"localhost", port=0)]

    def createTable(self, tableName: bytes, columnFamilies: list[Any]) -> None:
        name = bytes(tableName or b"")
        ns, sep, qualifier = name.rpartition(b":")
        for part in ([ns] if sep else []) + [qualifier]:
            if not part or part[:1] in (b".", b"-") or not set(part) <= _LEGAL_NAME_CHARS:
                raise _illegal(f"Illegal table name {name!r}: use [a-zA-Z_0-9-.], not starting "
                               "with '.' or '-'")
        if not columnFamilies:
            raise _illegal(f"table {name!r} needs at least one column family")
        families: dict[bytes, Any] = {}
        for desc in columnFamilies:
            fam = bytes(desc.name or b"").rstrip(b":")
            if not fam or b":" in fam or fam[:1] == b".":
                raise _illegal(f"Illegal column family name {desc.name!r}")
            if fam in families:
                raise _illegal(f"column family {fam!r} given twice")
            families[fam] = Hbase_thrift.ColumnDescriptor(**{**desc.__dict__, "name": fam + b":"})
        with self._lock:
            if name in self._tables:
                raise Hbase_thrift.AlreadyExists(message=f"table {name!r} already exists")
            self._tables[name] = _Table(name, families)

    def deleteTable(self, tableName: bytes) -> None:
        with self._lock:
            t = self._table(tableName, enabled=False)
            if t.enabled:
                raise _io_error(f"TableNotDisabledException: {tableName!r}")
            del self._tables[t.name]

    # -- reads -----------------------------------------------------------

    def _cells(self, tableName: bytes, row: bytes, column: bytes, before: int | None,
               n: int) -> list[Any]:
        with self._lock:
            t = self._table(tableName)
            _, qual = self._check_family(t, bytes(column))
            r = t.rows.get(bytes(row))
            if r is None or qual is None:
                return []
            return [Hbase_thrift.TCell(value=v, timestamp=ts)
                    for ts, v in r.cells.get(bytes(column), []) if before is None or ts < before][:n]

    def get(self, tableName: bytes, row: bytes, column: bytes, attributes: Any) -> list[Any]:
        return self._cells(tableName, row, column, None, 1)

    def getVer(self, tableName: bytes, row: bytes, column: bytes, numVersions: int,
               attributes: Any) -> list[Any]:
        return self._cells(tableName, row, column, None, numVersions)

    def getVerTs(self, tableName: bytes, row: bytes, column: bytes, timestamp: int, numVersions: int,
                 attributes: Any) -> list[Any]:
        return self._cells(tableName, row, column, timestamp, numVersions)

    def getRow(self, tableName: bytes, row: bytes, attributes: Any) -> list[Any]:
        return self._get_rows(tableName, [row], None, None)

    def getRowWithColumns(self, tableName: bytes, row: bytes, columns: list[bytes],
                          attributes: Any) -> list[Any]:
        return self._get_rows(tableName, [row], columns, None)

    def getRowTs(self, tableName: bytes, row: bytes, timestamp: int, attributes: Any) -> list[Any]:
        return self._get_rows(tableName, [row], None, timestamp)

    def getRowWithColumnsTs(self, tableName: bytes, row: bytes, columns: list[bytes], timestamp: int,
                            attributes: Any) -> list[Any]:
        return self._get_rows(tableName, [row], columns, timestamp)

    def getRows(self, tableName: bytes, rows: list[bytes], attributes: Any) -> list[Any]:
        return self._get_rows(tableName, rows or [], None, None)

    def getRowsWithColumns(self, tableName: bytes, rows: list[bytes], columns: list[bytes],
                           attributes: Any) -> list[Any]:
        return self._get_rows(tableName, rows or [], columns, None)

    def getRowsTs(self, tableName: bytes, rows: list[bytes], timestamp: int, attributes: Any) -> list[Any]:
        return self._get_rows(tableName, rows or [], None, timestamp)

    def getRowsWithColumnsTs(self, tableName: bytes, rows: list[bytes], columns: list[bytes],
                             timestamp: int, attributes: Any) -> list[Any]:
        return self._get_rows(tableName, rows or [], columns, timestamp)

    def getRowOrBefore(self, tableName: bytes, row: bytes, family: bytes) -> list[Any]:
        raise _io_error("getRowOrBefore is deprecated and not emulated")

    def getRegionInfo(self, row: bytes) -> Any:
        raise _io_error("getRegionInfo is not emulated")

    # -- writes ----------------------------------------------------------

    def mutateRow(self, tableName: bytes, row: bytes, mutations: list[Any], attributes: Any) -> None:
        self.mutateRowTs(tableName, row, mutations, None, attributes)  # type: ignore[arg-type]

    def mutateRowTs(self, tableName: bytes, row: bytes, mutations: list[Any], timestamp: int,
                    attributes: Any) -> None:
        with self._lock:
            self._apply(self._table(tableName), row, mutations, timestamp)

    def mutateRows(self, tableName: bytes, rowBatches: list[Any], attributes: Any) -> None:
        self.mutateRowsTs(tableName, rowBatches, None, attributes)  # type: ignore[arg-type]

    def mutateRowsTs(self, tableName: bytes, rowBatches: list[Any], timestamp: int,
                     attributes: Any) -> None:
        with self._lock:
            t = self._table(tableName)
            for batch in rowBatches or ():
                self._apply(t, batch.row, batch.mutations, timestamp)

    def deleteAll(self, tableName: bytes, row: bytes, column: bytes, attributes: Any) -> None:
        self.deleteAllTs(tableName, row, column, None, attributes)  # type: ignore[arg-type]

    def deleteAllTs(self, tableName: bytes, row: bytes, column: bytes, timestamp: int,
                    attributes: Any) -> None:
        with self._lock:
            self._apply(self._table(tableName), row,
                        [Hbase_thrift.Mutation(isDelete=True, column=column)], timestamp)

    def deleteAllRow(self, tableName: bytes, row: bytes, attributes: Any) -> None:
        self.deleteAllRowTs(tableName, row, None, attributes)  # type: ignore[arg-type]

    def deleteAllRowTs(self, tableName: bytes, row: bytes, timestamp: int, attributes: Any) -> None:
        with self._lock:
            t = self._table(tableName)
            self._apply(t, row, [Hbase_thrift.Mutation(isDelete=True, column=fam) for fam in t.families],
                        timestamp)

    def checkAndPut(self, tableName: bytes, row: bytes, column: bytes, value: bytes | None, mput: Any,
                    attributes: Any) -> bool:
        with self._lock:
            t = self._table(tableName)
            row = self._check_row(row)
            _, qual = self._check_family(t, bytes(column or b""))
            if qual is None:
                raise _illegal("checkAndPut needs a column qualifier to check")
            put_column = bytes(mput.column or b"")
            _, put_qual = self._check_family(t, put_column)
            if put_qual is None:
                raise _illegal("checkAndPut needs a column qualifier to put")
            new = bytes(mput.value or b"")
            self._check_cell(row, put_column, new)
            r = t.rows.get(row)
            cur = r.latest(bytes(column)) if r is not None else None
            if not value:  # "the column is absent" (or holds an empty value)
                ok = cur is None or cur[1] == b""
            else:
                ok = cur is not None and cur[1] == bytes(value)
            if ok:
                r = t.row(row, create=True)
                assert r is not None
                r.put(put_column, self._ts(), new, t.max_versions(put_column))
            return ok

    def _increment(self, t: _Table, row: bytes, column: bytes, amount: int) -> int:
        row = self._check_row(row)
        _, qual = self._check_family(t, column)
        if qual is None:
            raise _illegal("increment needs a column qualifier")
        r = t.row(row, create=True)
        assert r is not None
        cur = r.latest(column)
        if cur is not None and len(cur[1]) != 8:
            raise _io_error(f"Field is not a long, it's {len(cur[1])} bytes wide")
        new = (_i64.unpack(cur[1])[0] if cur else 0) + amount
        r.put(column, self._ts(), _i64.pack(new), t.max_versions(column))
        return new

    def atomicIncrement(self, tableName: bytes, row: bytes, column: bytes, value: int) -> int:
        with self._lock:
            return self._increment(self._table(tableName), row, bytes(column), value)

    def increment(self, increment: Any) -> None:
        self.incrementRows([increment])

    def incrementRows(self, increments: list[Any]) -> None:
        with self._lock:
            for inc in increments or ():
                self._increment(self._table(inc.table), inc.row, bytes(inc.column), inc.ammount or 0)

    def append(self, append: Any) -> list[Any]:
        with self._lock:
            t = self._table(append.table)
            row = self._check_row(append.row)
            columns, values = list(append.columns or ()), list(append.values or ())
            if len(columns) != len(values):
                raise _illegal("append needs as many values as columns")
            for c in columns:
                self._check_family(t, bytes(c))
            r = t.row(row, create=True)
            assert r is not None
            stamp, out = self._ts(), list[Any]()
            for c, v in zip(columns, values, strict=True):
                cur = r.latest(bytes(c))
                new = (cur[1] if cur else b"") + bytes(v)
                self._check_cell(row, bytes(c), new)
                r.put(bytes(c), stamp, new, t.max_versions(bytes(c)))
                out.append(Hbase_thrift.TCell(value=new, timestamp=stamp))
            return out

    # -- scanners --------------------------------------------------------

    def _open(self, table: bytes, start: bytes | None, stop: bytes | None, columns: list[bytes] | None,
              before: int | None = None, reversed_: bool = False, sort_columns: bool = False) -> int:
        with self._lock:
            t = self._table(table)
            self._wanted(t, columns)
            sid = self._next_scanner
            self._next_scanner = sid + 1 if sid < 2**31 - 1 else 1
            self._scanners[sid] = _Scanner(t.name, bytes(start or b""), bytes(stop or b""),
                                           [bytes(c) for c in columns] if columns else None,
                                           before, reversed_, sort_columns)
            return sid

    def scannerOpenWithScan(self, tableName: bytes, scan: Any, attributes: Any) -> int:
        if scan.filterString:
            raise _io_error("the HBase Thrift emulator does not support filters")
        return self._open(tableName, scan.startRow, scan.stopRow, scan.columns, scan.timestamp,
                          bool(scan.reversed), bool(scan.sortColumns))

    def scannerOpen(self, tableName: bytes, startRow: bytes, columns: list[bytes], attributes: Any) -> int:
        return self._open(tableName, startRow, None, columns)

    def scannerOpenWithStop(self, tableName: bytes, startRow: bytes, stopRow: bytes, columns: list[bytes],
                            attributes: Any) -> int:
        return self._open(tableName, startRow, stopRow, columns)

    def scannerOpenWithPrefix(self, tableName: bytes, startAndPrefix: bytes, columns: list[bytes],
                              attributes: Any) -> int:
        prefix = bytes(startAndPrefix or b"")
        return self._open(tableName, prefix, _increment_bytes(prefix), columns)

    def scannerOpenTs(self, tableName: bytes, startRow: bytes, columns: list[bytes], timestamp: int,
                      attributes: Any) -> int:
        return self._open(tableName, startRow, None, columns, timestamp)

    def scannerOpenWithStopTs(self, tableName: bytes, startRow: bytes, stopRow: bytes, columns: list[bytes],
                              timestamp: int, attributes: Any) -> int:
        return self._open(tableName, startRow, stopRow, columns, timestamp)

    def scannerGetList(self, id: int, nbRows: int) -> list[Any]:
        with self._lock:
            s = self._scanners.get(id)
            if s is None:
                raise _illegal(f"scanner ID {id} is invalid")
            t = self._tables.get(s.table)
            if t is None:
                return []
            wanted = self._wanted(t, s.columns)
            keys, out = t.keys, list[Any]()
            if not s.reversed:
                i = bisect.bisect_left(keys, s.start) if s.last is None else bisect.bisect_right(keys, s.last)
                while i < len(keys) and len(out) < nbRows and (not s.stop or keys[i] < s.stop):
                    res = self._result(keys[i], t.rows[keys[i]], wanted, s.before, s.sort_columns)
                    s.last = keys[i]
                    if res is not None:
                        out.append(res)
                    i += 1
            else:
                if s.last is not None:
                    i = bisect.bisect_left(keys, s.last) - 1
                else:
                    i = (bisect.bisect_right(keys, s.start) if s.start else len(keys)) - 1
                while i >= 0 and len(out) < nbRows and (not s.stop or keys[i] > s.stop):
                    res = self._result(keys[i], t.rows[keys[i]], wanted, s.before, s.sort_columns)
                    s.last = keys[i]
                    if res is not None:
                        out.append(res)
                    i -= 1
            return out

    def scannerGet(self, id: int) -> list[Any]:
        return self.scannerGetList(id, 1)

    def scannerClose(self, id: int) -> None:
        with self._lock:
            if self._scanners.pop(id, None) is None:
                raise _illegal(f"scanner ID {id} is invalid")

    # -- introspection for tests -----------------------------------------

    @property
    def open_scanners(self) -> int:
        with self._lock:
            return len(self._scanners)


def _increment_bytes(b: bytes) -> bytes:
    """The first byte string after every string that starts with ``b`` (``b""`` = no end)."""
    stripped = b.rstrip(b"\xff")
    return stripped[:-1] + bytes([stripped[-1] + 1]) if stripped else b""


class _Processor(TProcessor):
    """A TProcessor that answers an unexpected handler error with a TApplicationException.

    thriftpy2's own processor re-raises it, which drops the client connection.
    """

    def process(self, iprot: Any, oprot: Any) -> None:
        api, seqid, result, call = self.process_in(iprot)
        if isinstance(result, TApplicationException):
            self.send_exception(oprot, api, result, seqid)
            return
        assert call is not None
        try:
            result.success = call()
        except TApplicationException as e:
            self.send_exception(oprot, api, e, seqid)
            return
        except Exception as e:
            if not self.handle_exception(e, result):
                log.exception("emulated %s failed", api)
                self.send_exception(oprot, api, TApplicationException(
                    TApplicationException.INTERNAL_ERROR, f"{type(e).__name__}: {e}"), seqid)
                return
        if not result.oneway:
            self.send_result(oprot, api, result, seqid)


class HBaseThriftEmulator:
    """Serves ``EmulatedHBase`` over Thrift1 (buffered transport, binary protocol — happybase's defaults).

    ``start()`` binds and serves from daemon threads (one per client, as the
    gateway's thread-pool mode does); ``port`` is the bound port; ``stop()``
    closes the listener and every client connection. Idle clients are never
    dropped (``client_timeout=None``). Passing the ``store`` of a stopped
    emulator to a new one on the same port models a gateway restart: the
    gateway is stateless, the data lives on.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *,
                 max_keyvalue_size: int = DEFAULT_MAX_KEYVALUE_SIZE, store: EmulatedHBase | None = None) -> None:
        self.host = host
        self._requested_port = port
        self.store = store if store is not None else EmulatedHBase(max_keyvalue_size)
        self._processor = _Processor(Hbase_thrift.Hbase, self.store)
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._clients: set[Any] = set()
        self._clients_lock = threading.Lock()
        self._stopping = threading.Event()
        self._port: int | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the emulator is not started")
        return self._port

    @property
    def address(self) -> str:
        """``host:port`` of the running emulator."""
        return f"{self.host}:{self.port}"

    def start(self) -> HBaseThriftEmulator:
        if self._thread is not None:
            raise RuntimeError("the emulator is already started")
        server = _TServerSocket(host=self.host, port=self._requested_port, client_timeout=None)
        server.listen()
        self._server = server
        self._port = server.sock.getsockname()[1]
        self._stopping.clear()
        self._thread = threading.Thread(target=self._accept_loop, name=f"hbase-emulator-{self._port}",
                                        daemon=True)
        self._thread.start()
        log.info("HBase Thrift1 emulator (test double) serving on %s", self.address)
        return self

    def _accept_loop(self) -> None:
        server = self._server
        assert server is not None
        while not self._stopping.is_set():
            try:
                client = server.accept()
            except OSError:
                if self._stopping.is_set():
                    return
                log.exception("emulator accept failed")
                time.sleep(0.05)
                continue
            with self._clients_lock:
                self._clients.add(client)
            threading.Thread(target=self._serve_client, args=(client,), daemon=True,
                             name=f"hbase-emulator-client-{self._port}").start()

    def _serve_client(self, client: Any) -> None:
        trans = _TBufferedTransportFactory().get_transport(client)
        proto = _TBinaryProtocolFactory().get_protocol(trans)
        try:
            while not self._stopping.is_set():
                self._processor.process(proto, proto)
        except (TTransportException, OSError, EOFError):
            pass
        except Exception:
            log.exception("emulator client connection failed")
        finally:
            with self._clients_lock:
                self._clients.discard(client)
            trans.close()

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            sock = self._server.sock
            if sock is not None:
                try:  # wake the blocked accept()
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._server.close()
        with self._clients_lock:
            clients, self._clients = list(self._clients), set()
        for c in clients:  # wake each client thread; it closes its own socket
            sock = c.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._thread = None
        self._server = None

    def __enter__(self) -> HBaseThriftEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="In-memory HBase Thrift1 gateway emulator (a TEST DOUBLE, not HBase). "
                    "Prints the bound host:port as its first stdout line.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9090, help="0 picks a free port")
    parser.add_argument("--max-keyvalue-size", type=int, default=DEFAULT_MAX_KEYVALUE_SIZE)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with HBaseThriftEmulator(args.host, args.port, max_keyvalue_size=args.max_keyvalue_size) as emu:
        print(emu.address, flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
