"""The embedded default backend: one LMDB environment per store directory.

    ms = await open_metastore("lmdb:///var/lib/quire/meta")

* Each table is a named LMDB database ``t:<name>``; keys are the UTF-8 bytes
  of the ``str`` key, so LMDB's byte order is Python ``str`` order and every
  table is scannable. LMDB limits a key to 511 bytes: a longer key raises
  ``IllegalOpError``.
* A record is ``version (8 bytes, big-endian) + Record`` (protobuf). A new
  version is the wall clock in nanoseconds, and always past the key's
  previous version: it grows on every put, and a key removed and created
  again gets a version newer than any it had (unless the clock steps back
  between the remove and the create). A transaction touches only the one
  table, so each commit writes as few pages as possible.
* Every write is one LMDB transaction committed with ``fsync`` (durable on
  return). Several OS processes may open the same directory: LMDB's own
  reader table and writer lock serialise them, and each CAS is a read-check-
  write inside one write transaction.
* Writes run in a worker thread (they wait for the disk); reads run inline on
  the event loop (they take microseconds and never block on other writers).
* Sessions are leases and watches are polled (``metastore.lease``).

Options (``open_metastore(uri, **conf)`` or the URI's query string such as
``lmdb:///data/meta?map_size=1073741824``; strings accepted): ``map_size``
(bytes, default 8 GiB, sparse), ``max_value_size`` (bytes per field value,
default 16 MiB), ``watch_poll_interval`` (seconds, default 0.05).

LMDB forbids opening one environment twice in a process, so environments are
shared per directory by a process-wide, reference-counted registry — the one
piece of module state in the metastore.
"""

from __future__ import annotations

import asyncio
import os
import struct
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

import lmdb

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
from metastore.errors import BadVersionError, IllegalOpError, KeyExistsError, NoKeyError, ServiceDownError
from metastore.lease import LeaseBackedMetaStore, conf_float
from metastore.proto.metastore_pb2 import Record

T = TypeVar("T")

_VER = struct.Struct(">Q")
MAX_KEY_BYTES = 511
DEFAULT_MAP_SIZE = 8 << 30
DEFAULT_MAX_VALUE_SIZE = 16 << 20


class _SharedEnv:
    """One open LMDB environment, shared by every store of this process on that path."""

    def __init__(self, path: str, map_size: int) -> None:
        self.path = path
        self.env = lmdb.open(path, map_size=map_size, max_dbs=4096, subdir=True, sync=True,
                             metasync=True, lock=True, readahead=False, max_readers=1024)
        self.refs = 0
        self.dbs: dict[str, Any] = {}
        self.lock = threading.Lock()

    def db(self, table: str) -> Any:
        with self.lock:
            handle = self.dbs.get(table)
            if handle is None:
                handle = self.env.open_db(("t:" + table).encode(), create=True)
                self.dbs[table] = handle
            return handle


_ENVS: dict[str, _SharedEnv] = {}
_ENVS_LOCK = threading.Lock()


def _acquire(path: str, map_size: int) -> _SharedEnv:
    with _ENVS_LOCK:
        shared = _ENVS.get(path)
        if shared is None:
            shared = _SharedEnv(path, map_size)
            _ENVS[path] = shared
        shared.refs += 1
        return shared


def _release(shared: _SharedEnv) -> None:
    with _ENVS_LOCK:
        shared.refs -= 1
        if shared.refs <= 0:
            _ENVS.pop(shared.path, None)
            shared.env.close()


def encode_record(version: int, value: Value) -> bytes:
    fields = {k: v for k, v in value.items() if v is not None}
    return _VER.pack(version) + Record(fields=fields).SerializeToString()


_from_string = Record.FromString
_unpack_version = _VER.unpack_from


def decode_record(raw: bytes, fields: Fields = ALL_FIELDS) -> Versioned:
    stored = _from_string(raw[8:]).fields
    if fields is ALL_FIELDS:
        value = Value(stored)
    else:
        value = Value({f: stored[f] for f in fields if f in stored})  # type: ignore[union-attr]
    return Versioned(value, Version(_unpack_version(raw)[0]))


class LmdbTable(MetastoreScannableTable):
    """A raw LMDB table (no lease handling; ``LmdbMetaStore`` wraps it)."""

    def __init__(self, store: LmdbMetaStore, name: str) -> None:
        super().__init__(name)
        self._store = store
        self._env = store.shared.env
        self._db = store.shared.db(name)

    def _check_open(self) -> None:
        if self._closed or self._store.closed:
            raise IllegalOpError(f"table {self.name} is closed")

    def _key(self, key: str) -> bytes:
        raw = check_key(key).encode("utf-8", "surrogatepass")
        if len(raw) > MAX_KEY_BYTES:
            raise IllegalOpError(f"key of {len(raw)} bytes is over LMDB's {MAX_KEY_BYTES}-byte limit")
        return raw

    async def get(self, key: str, fields: Fields = ALL_FIELDS, watcher: Watcher | None = None) -> Versioned:
        if self._closed or self._store._closed:
            raise IllegalOpError(f"table {self.name} is closed")
        k = self._key(key)
        if fields is not ALL_FIELDS:
            fields = check_fields(fields)
        raw = self._env.begin(db=self._db).get(k)  # a read txn is aborted when dropped
        if raw is None:
            raise NoKeyError(f"{self.name}/{key}")
        return decode_record(raw, fields)

    @staticmethod
    def _next_version(previous: int) -> int:
        """Wall-clock nanoseconds, and always past ``previous`` (see the module docstring)."""
        return max(previous + 1, time.time_ns())

    def _put_sync(self, k: bytes, key: str, value: Value, version: Version) -> Version:
        with self._env.begin(write=True, db=self._db) as txn:
            raw = txn.get(k)
            if version == Version.NEW:
                if raw is not None:
                    raise KeyExistsError(f"{self.name}/{key}")
                new_value = Value({f: v for f, v in value.items() if v is not None})
                previous = 0
            else:
                if raw is None:
                    raise NoKeyError(f"{self.name}/{key}")
                previous = _VER.unpack_from(raw)[0]
                if version != Version.ANY and previous != version.value:
                    raise BadVersionError(f"{self.name}/{key}: version {version!r} is not current")
                new_value = Value(Record.FromString(raw[8:]).fields).merged(value)
            nv = self._next_version(previous)
            txn.put(k, encode_record(nv, new_value))
        return Version(nv)

    def _remove_sync(self, k: bytes, key: str, version: Version) -> None:
        with self._env.begin(write=True, db=self._db) as txn:
            raw = txn.get(k)
            if raw is None:
                raise NoKeyError(f"{self.name}/{key}")
            if version != Version.ANY and (
                version == Version.NEW or _VER.unpack_from(raw)[0] != version.value
            ):
                raise BadVersionError(f"{self.name}/{key}: version {version!r} is not current")
            txn.delete(k)

    async def put(self, key: str, value: Value, version: Version) -> Version:
        self._check_open()
        k = self._key(key)
        value = check_value(value)
        version = check_version(version)
        limit = self._store.max_value_size
        for f, v in value.items():
            if v is not None and len(v) > limit:
                raise IllegalOpError(f"field {f!r} of {len(v)} bytes is over the lmdb limit of {limit}")
        return await self._store.write(self._put_sync, k, key, value, version)

    async def remove(self, key: str, version: Version) -> None:
        self._check_open()
        k = self._key(key)
        version = check_version(version)
        await self._store.write(self._remove_sync, k, key, version)

    def _page(self, after: bytes | None, start: bytes, start_inclusive: bool, stop: bytes,
              stop_inclusive: bool, order: Order, fields: Fields, n: int) -> list[tuple[str, Versioned]]:
        """Up to ``n`` entries after ``after`` (exclusive) or from ``start``, in ``order``."""
        self._check_open()
        out: list[tuple[str, Versioned]] = []
        with self._env.begin(db=self._db) as txn:
            cur = txn.cursor()
            if order is Order.ASC:
                pos, incl = (after, False) if after is not None else (start, start_inclusive)
                ok = cur.set_range(pos) if pos else cur.first()
                if ok and pos and not incl and cur.key() == pos:
                    ok = cur.next()
                while ok and len(out) < n:
                    k = cur.key()
                    if stop and (k > stop or (k == stop and not stop_inclusive)):
                        break
                    out.append((k.decode("utf-8", "surrogatepass"), decode_record(cur.value(), fields)))
                    ok = cur.next()
            else:
                pos, incl = (after, False) if after is not None else (start, start_inclusive)
                if pos:
                    ok = cur.set_range(pos)
                    if not ok:
                        ok = cur.last()
                    elif cur.key() > pos or (cur.key() == pos and not incl):
                        ok = cur.prev()
                else:
                    ok = cur.last()
                while ok and len(out) < n:
                    k = cur.key()
                    if stop and (k < stop or (k == stop and not stop_inclusive)):
                        break
                    out.append((k.decode("utf-8", "surrogatepass"), decode_record(cur.value(), fields)))
                    ok = cur.prev()
        return out

    async def _cursor(self, start: str, start_inclusive: bool, stop: str, stop_inclusive: bool,
                      order: Order, fields: Fields) -> MetastoreCursor:
        fields = check_fields(fields)
        s = start.encode("utf-8", "surrogatepass")
        e = stop.encode("utf-8", "surrogatepass")

        async def fetch(after: str | None, n: int) -> list[tuple[str, Versioned]]:
            a = after.encode("utf-8", "surrogatepass") if after is not None else None
            return self._page(a, s, start_inclusive, e, stop_inclusive, order, fields, n)

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


class LmdbMetaStore(LeaseBackedMetaStore):
    """``lmdb:///path``: the embedded, durable, multi-process-safe default."""

    name = "lmdb"
    version = 1

    def __init__(self, path: str, conf: dict[str, Any]) -> None:
        self.watch_poll_interval = conf_float(conf, "watch_poll_interval", 0.05)
        super().__init__()
        self.path = path
        self.max_value_size = int(conf_float(conf, "max_value_size", DEFAULT_MAX_VALUE_SIZE))
        map_size = int(conf_float(conf, "map_size", DEFAULT_MAP_SIZE))
        try:
            os.makedirs(path, exist_ok=True)
            self.shared = _acquire(path, map_size)
        except (OSError, lmdb.Error) as exc:
            raise ServiceDownError(f"cannot open lmdb store at {path}: {exc}") from exc
        self._write_lock = asyncio.Lock()

    @classmethod
    async def open(cls, uri: str, **conf: Any) -> LmdbMetaStore:
        parts = urlsplit(uri)
        if parts.scheme != "lmdb":
            raise IllegalOpError(f"not an lmdb URI: {uri!r}")
        path = unquote(parts.netloc + parts.path)
        if not path:
            raise IllegalOpError(f"lmdb URI {uri!r} names no directory (use lmdb:///abs/path)")
        options: dict[str, Any] = dict(parse_qsl(parts.query))
        options.update(conf)  # keyword options win over the URI's query string
        return cls(os.path.abspath(path), options)

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a write transaction in a worker thread (it waits for fsync)."""
        self._check_open()
        try:
            return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
        except lmdb.Error as exc:
            raise ServiceDownError(f"lmdb write failed: {exc}") from exc

    async def _open_raw_table(self, name: str, scannable: bool) -> MetastoreTable:
        self._check_open()
        try:
            return await self.write(LmdbTable, self, name)
        except lmdb.Error as exc:
            raise ServiceDownError(f"cannot open table {name}: {exc}") from exc

    async def close(self) -> None:
        if self._closed:
            return
        await super().close()
        _release(self.shared)
