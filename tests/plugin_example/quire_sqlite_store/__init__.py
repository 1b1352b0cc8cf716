"""A complete third-party metastore plugin in one file: ``sqlite:///path/to/file.db``.

It is the worked example of the README section "Writing a metastore plugin":

1. subclass ``metastore.lease.LeaseBackedMetaStore`` (sessions, sweeping and
   polled watches come for free) and implement ``open`` and
   ``_open_raw_table``; declare the options as a frozen dataclass
   (``SqliteOptions``) and read them with ``metastore.conf.store_options``,
   so an unknown option or a bad value is a one-line ``IllegalOpError``;
2. implement a raw ``MetastoreScannableTable`` (get/put/remove/cursors) with
   the contract's errors;
3. register the scheme under the ``quire.metastore`` entry-point group;
4. prove it: ``python -m metastore.testing --uri sqlite:///tmp/x.db``.

Every write is one ``BEGIN IMMEDIATE`` transaction, so several processes can
share the file; versions come from one counter row bumped by every write.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from metastore.api import (
    ALL_FIELDS,
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
    check_fields,
    check_key,
    check_range,
    check_value,
    check_version,
)
from metastore.conf import setting, store_options
from metastore.errors import BadVersionError, IllegalOpError, KeyExistsError, NoKeyError, ServiceDownError
from metastore.lease import LeaseBackedMetaStore, LeaseOptions
from metastore.proto.metastore_pb2 import Record

SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (tbl TEXT NOT NULL, k TEXT NOT NULL, ver INTEGER NOT NULL, rec BLOB NOT NULL,
                               PRIMARY KEY (tbl, k));
CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY CHECK (id = 0), ver INTEGER NOT NULL);
INSERT OR IGNORE INTO counter VALUES (0, 0);
"""
MAX_VALUE = 4 << 20


def _decode(ver: int, rec: bytes, fields: Fields) -> Versioned:
    stored = Record.FromString(rec).fields
    value = Value(stored) if fields is ALL_FIELDS else Value({f: stored[f] for f in fields if f in stored})  # type: ignore[union-attr]
    return Versioned(value, Version(ver))


class SqliteTable(MetastoreScannableTable):
    def __init__(self, store: SqliteMetaStore, name: str) -> None:
        super().__init__(name)
        self.store = store

    def _check_open(self) -> None:
        if self._closed or self.store.closed:
            raise IllegalOpError("table is closed")

    async def get(self, key: str, fields: Fields = ALL_FIELDS, watcher: Watcher | None = None) -> Versioned:
        self._check_open()
        check_key(key)
        fields = check_fields(fields)
        row = await self.store.run(lambda c: c.execute("SELECT ver, rec FROM kv WHERE tbl=? AND k=?",
                                                       (self.name, key)).fetchone())
        if row is None:
            raise NoKeyError(key)
        return _decode(row[0], row[1], fields)

    async def put(self, key: str, value: Value, version: Version) -> Version:
        self._check_open()
        check_key(key)
        value = check_value(value)
        version = check_version(version)
        if any(v is not None and len(v) > MAX_VALUE for v in value.values()):
            raise IllegalOpError(f"a field value is over {MAX_VALUE} bytes")

        def txn(c: sqlite3.Connection) -> Version:
            row = c.execute("SELECT ver, rec FROM kv WHERE tbl=? AND k=?", (self.name, key)).fetchone()
            if version == Version.NEW:
                if row is not None:
                    raise KeyExistsError(key)
                merged = Value({f: v for f, v in value.items() if v is not None})
            else:
                if row is None:
                    raise NoKeyError(key)
                if version != Version.ANY and row[0] != version.value:
                    raise BadVersionError(key)
                merged = Value(Record.FromString(row[1]).fields).merged(value)
            ver = self.store.bump(c)
            rec = Record(fields={k: v for k, v in merged.items() if v is not None}).SerializeToString()
            c.execute("INSERT OR REPLACE INTO kv VALUES (?, ?, ?, ?)", (self.name, key, ver, rec))
            return Version(ver)

        return await self.store.run(txn, write=True)

    async def remove(self, key: str, version: Version) -> None:
        self._check_open()
        check_key(key)
        version = check_version(version)

        def txn(c: sqlite3.Connection) -> None:
            row = c.execute("SELECT ver FROM kv WHERE tbl=? AND k=?", (self.name, key)).fetchone()
            if row is None:
                raise NoKeyError(key)
            if version != Version.ANY and (version == Version.NEW or row[0] != version.value):
                raise BadVersionError(key)
            c.execute("DELETE FROM kv WHERE tbl=? AND k=?", (self.name, key))
            self.store.bump(c)

        await self.store.run(txn, write=True)

    async def _cursor(self, lo: str, lo_inc: bool, hi: str, hi_inc: bool, order: Order,
                      fields: Fields) -> MetastoreCursor:
        fields = check_fields(fields)
        asc = order is Order.ASC

        async def fetch(after: str | None, n: int) -> list[tuple[str, Versioned]]:
            sql, args = "SELECT k, ver, rec FROM kv WHERE tbl=?", [self.name]
            start, start_inc, stop, stop_inc = (lo, lo_inc, hi, hi_inc)
            if after is not None:
                start, start_inc = after, False
            if start:
                sql += f" AND k {('>' if asc else '<') + ('=' if start_inc else '')} ?"
                args.append(start)
            if stop:
                sql += f" AND k {('<' if asc else '>') + ('=' if stop_inc else '')} ?"
                args.append(stop)
            sql += f" ORDER BY k {'ASC' if asc else 'DESC'} LIMIT {int(n)}"
            rows = await self.store.run(lambda c: c.execute(sql, args).fetchall())
            return [(k, _decode(ver, rec, fields)) for k, ver, rec in rows]

        return await ListCursor.paged(fetch)

    async def open_cursor(self, fields: Fields = ALL_FIELDS) -> MetastoreCursor:
        self._check_open()
        return await self._cursor("", True, "", True, Order.ASC, fields)

    async def open_cursor_range(self, first_key: str, first_inclusive: bool, last_key: str,
                                last_inclusive: bool, order: Order = Order.ASC,
                                fields: Fields = ALL_FIELDS) -> MetastoreCursor:
        self._check_open()
        check_range(first_key, last_key, order)
        return await self._cursor(first_key, first_inclusive, last_key, last_inclusive, order, fields)


@dataclass(frozen=True)
class SqliteOptions(LeaseOptions):
    """``sqlite:///path?busy_timeout=30`` (or ``open_metastore(uri, busy_timeout=30)``)."""

    busy_timeout: float = setting(30.0, "seconds a write waits for another process's lock", min=0.0)


class SqliteMetaStore(LeaseBackedMetaStore):
    name = "sqlite"
    version = 1

    def __init__(self, path: str, options: SqliteOptions | None = None) -> None:
        self.options = options or SqliteOptions()
        super().__init__(self.options)
        self.path = path
        self._local = threading.local()

    @classmethod
    async def open(cls, uri: str, **conf: Any) -> SqliteMetaStore:
        parts = urlsplit(uri)
        if parts.scheme != "sqlite" or not parts.path:
            raise IllegalOpError(f"expected sqlite:///path/to/file.db, got {uri!r}")
        store = cls(parts.path, store_options(SqliteOptions, parts.query, conf, source="sqlite metastore options"))
        try:
            os.makedirs(os.path.dirname(parts.path) or ".", exist_ok=True)
            await store.run(lambda c: c.executescript(SCHEMA), write=False)
        except sqlite3.Error as exc:
            raise ServiceDownError(f"cannot open {parts.path}: {exc}") from exc
        return store

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=self.options.busy_timeout, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            self._local.conn = conn
        return conn

    @staticmethod
    def bump(c: sqlite3.Connection) -> int:
        c.execute("UPDATE counter SET ver = ver + 1 WHERE id = 0")
        return int(c.execute("SELECT ver FROM counter WHERE id = 0").fetchone()[0])

    async def run(self, fn: Any, write: bool = False) -> Any:
        self._check_open()

        def call() -> Any:
            c = self._conn()
            if not write:
                return fn(c)
            c.execute("BEGIN IMMEDIATE")
            try:
                out = fn(c)
            except BaseException:
                c.execute("ROLLBACK")
                raise
            c.execute("COMMIT")
            return out

        try:
            return await asyncio.to_thread(call)
        except sqlite3.Error as exc:
            raise ServiceDownError(str(exc)) from exc

    async def _open_raw_table(self, name: str, scannable: bool) -> MetastoreTable:
        return SqliteTable(self, name)
