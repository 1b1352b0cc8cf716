"""The embedded default backend: one LMDB environment per store directory.

    ms = await open_metastore("lmdb://data/metastore")

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
* Writes run on one writer thread per environment (they wait for the disk and
  for other processes' writers); reads run inline on the event loop (they take
  microseconds and never block on writers). Writes that queue up while a
  commit is in flight share the next transaction (group commit); each still
  checks its own version and fails alone.
* Decoded records are cached per table, validated on every read by comparing
  the stored bytes, so another process's write is always seen.
* Sessions are leases and watches are polled (``metastore.lease``). Each
  session renews its lease from a thread of its own (``renew_in_thread``),
  so a busy event loop does not delay its renewals, and lease records take
  the writer thread's priority lane: a renewal is committed before the next
  group of queued writes, never behind a burst's backlog.
* ``counters()`` (``CounterCapability``): the database ``c:counters``, each
  counter 8 bytes big-endian, each add one write transaction (sharing group
  commits with puts); an add of 0 is a plain read.

``create=false`` (what ``open_existing_metastore`` passes for clients and
tools) opens only an existing store: a directory without one raises
``StoreNotFoundError`` naming the path instead of creating an empty store.

Options (``LmdbOptions``; ``open_metastore(uri, **options)`` or the URI's query
string such as ``lmdb://data/metastore?map_size=1073741824``; strings accepted; an
unknown key or a bad value is an ``IllegalOpError`` naming it; every key with
its default is in ``conf/metastore-lmdb.conf``). ``write_mode=inline`` commits
on the caller's thread, blocking its event loop for each synced commit and for
any other process's writer: that saves the thread hand-off, roughly a quarter
of a fast disk's commit time, and suits one-operation-at-a-time tools; servers
keep ``thread``, which never stalls the loop and groups concurrent writes. The
first store a process opens on a directory fixes ``map_size`` and
``max_tables``.

LMDB forbids opening one environment twice in a process, so environments are
shared per directory by a process-wide, reference-counted registry — the one
piece of module state in the metastore.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import queue
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import lmdb

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
    PollingWatches,
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
)
from metastore.conf import setting, store_options
from metastore.errors import (
    BadVersionError,
    IllegalOpError,
    KeyExistsError,
    MetastoreError,
    NoKeyError,
    ServiceDownError,
    StoreNotFoundError,
)
from metastore.lease import (
    LEASE_FIELD,
    SESSIONS_TABLE,
    LeaseBackedMetaStore,
    LeasedScannableTable,
    LeasedTable,
    LeaseOptions,
    LeaseRegistry,
)
from metastore.proto.metastore_pb2 import Record

T = TypeVar("T")
log = logging.getLogger(__name__)

_VER = struct.Struct(">Q")
MAX_KEY_BYTES = 511
DEFAULT_MAP_SIZE = 8 << 30
DEFAULT_MAX_VALUE_SIZE = 16 << 20
DEFAULT_MAX_TABLES = 128
"""LMDB sizes every transaction's table array by this, so a small bound keeps reads fast."""
CACHE_ENTRIES = 1024
"""Decoded records kept per table (records up to ``CACHE_RECORD_BYTES``); the oldest quarter goes when full.

The cache saves decoding the records read again and again (sessions, a
busy topic's owner and ranges, ledgers being opened); a hub's idle topics
are read once when acquired and not again. At 65 536 entries a hub of 10 000
idle topics kept some 1.7 KB per topic of records nobody read (issue 34:
at most 5 KB per idle topic); 1 024 bound each table's cache to about 0.4 MB,
still more than the records ``max_concurrent_topic_loads`` (512) acquisitions
read and write back at once."""
CACHE_RECORD_BYTES = 4096


@dataclass(frozen=True)
class LmdbOptions(LeaseOptions):
    """Options of ``lmdb://`` stores (URI query string or ``open_metastore`` keyword arguments)."""

    map_size: int = setting(DEFAULT_MAP_SIZE, "bytes the store may grow to (sparse; fixed by the first opener)",
                            min=1 << 16)
    max_value_size: int = setting(DEFAULT_MAX_VALUE_SIZE, "largest field value in bytes", min=1)
    max_tables: int = setting(DEFAULT_MAX_TABLES, "tables one process may have open (the store holds any number)",
                              min=2, max=1 << 20)
    create: bool = setting(True, "create the store when the directory holds none (servers); false: fail "
                           "naming the path (clients and tools, through open_existing_metastore)")
    write_mode: str = setting("thread", "thread: commit on a writer thread with group commit; "
                              "inline: on the caller's thread (tools only)", choices=("thread", "inline"))


class _SharedEnv:
    """One open LMDB environment, shared by every store of this process on that path."""

    def __init__(self, path: str, map_size: int, max_tables: int) -> None:
        self.path = path
        self.max_tables = max_tables
        self.env = lmdb.open(path, map_size=map_size, max_dbs=max_tables, subdir=True, sync=True,
                             metasync=True, lock=True, readahead=False, max_readers=1024)
        self.refs = 0
        self.dbs: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.writer = _Writer(self.env, os.path.basename(path))

    def db(self, table: str, prefix: str = "t:") -> Any:
        """The named database of ``table`` (``prefix`` ``t:``; the counters are ``c:counters``)."""
        with self.lock:
            handle = self.dbs.get(prefix + table)
            if handle is None:
                try:
                    handle = self.env.open_db((prefix + table).encode(), create=True)
                except lmdb.DbsFullError:
                    raise IllegalOpError(
                        f"cannot open table {table}: this process already has max_tables={self.max_tables} "
                        f"tables of {self.path} open (raise it with ?max_tables=N)") from None
                self.dbs[prefix + table] = handle
            return handle


_STOP: Any = object()
_WAKE: Any = object()
"""Queued after an urgent job: wakes a writer blocked on an empty queue (the job itself is in ``urgent``)."""
MAX_GROUP = 256


def _settle(done: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    """Complete a group's futures on their loop (one wake-up per group and loop)."""
    for fut, ok, result in done:
        if fut.done():
            continue
        if ok:
            fut.set_result(result)
        else:
            fut.set_exception(result)


class _Writer:
    """The one thread that runs an environment's write transactions.

    A job is ``fn(txn, *args)``: it must check before it writes and raise (a
    ``MetastoreError``) without writing when its check fails, so jobs can
    share a transaction. Jobs queued while a commit runs form the next group;
    an ``lmdb.Error`` inside a group (say the map is full) aborts it and its
    jobs are retried one transaction each, so only the culprit fails. A job
    with ``txn=False`` (opening a table) runs alone outside any transaction.

    Urgent jobs (``submit(..., urgent=True)``: the sessions table's lease
    writes) have a lane of their own: before each group the thread commits
    every urgent job waiting, in a short transaction of their own, so a
    lease renewal waits for at most the one group already committing, never
    for a burst's queue of thousands of writes (issue 34: a hub lost its
    lease behind 10 000 new topics' writes). An urgent job may thus overtake
    bulk jobs queued before it; nothing orders a session record against
    other tables' writes, so that is safe. Each write is still durable
    (synced) before its future completes.
    """

    def __init__(self, env: Any, name: str) -> None:
        self.env = env
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.urgent: collections.deque[Any] = collections.deque()
        """Urgent jobs (thread-safe appends and pops); see the class docstring."""
        self.commits = 0
        """Write transactions committed, and writes they carried (``writes / commits`` = mean group)."""
        self.writes = 0
        self.thread = threading.Thread(target=self._run, name=f"lmdb-writer-{name}", daemon=True)
        self.thread.start()

    def submit(self, fn: Callable[..., T], args: tuple[Any, ...], txn: bool = True,
               urgent: bool = False) -> asyncio.Future[T]:
        """Queue ``fn`` (``urgent``: in the priority lane, committed before the next group)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        if urgent:
            self.urgent.append((loop, fut, fn, args, txn))
            self.queue.put(_WAKE)
        else:
            self.queue.put((loop, fut, fn, args, txn))
        return fut

    def stop(self) -> None:
        self.queue.put(_STOP)
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=30)

    def _run(self) -> None:
        q = self.queue
        while True:
            job = q.get()
            self._run_urgent()
            if job is _STOP:
                return
            if job is _WAKE:
                continue
            group = [job]
            stop = False
            while len(group) < MAX_GROUP and not q.empty():
                nxt = q.get()
                if nxt is _STOP:
                    stop = True
                    break
                if nxt is not _WAKE:
                    group.append(nxt)
            self._run_urgent()   # any that came while the group formed go first
            self._run_group(group)
            if stop:
                self._run_urgent()
                return

    def _run_urgent(self) -> None:
        """Commit every urgent job waiting, in a group of their own (none: nothing to do)."""
        urgent = self.urgent
        if not urgent:
            return
        group: list[Any] = []
        while urgent and len(group) < MAX_GROUP:
            group.append(urgent.popleft())
        self._run_group(group)

    def _run_group(self, group: list[Any]) -> None:
        done: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], bool, Any]]] = {}
        batch = [j for j in group if j[4]]
        for loop, fut, fn, args, _ in (j for j in group if not j[4]):
            done.setdefault(loop, []).append(self._call(fut, fn, None, args))
        if len(batch) == 1:
            loop, fut, fn, args, _ = batch[0]
            done.setdefault(loop, []).append(self._one(fut, fn, args))
            self.writes += 1
        elif batch:
            results: list[tuple[asyncio.AbstractEventLoop, tuple[asyncio.Future[Any], bool, Any]]] = []
            try:
                with self.env.begin(write=True) as txn:
                    for loop, fut, fn, args, _ in batch:
                        results.append((loop, self._call(fut, fn, txn, args, raise_lmdb=True)))
                self.commits += 1
                self.writes += len(batch)
            except lmdb.Error:
                log.warning("lmdb group commit of %d writes failed; retrying them one by one", len(batch))
                results = [(loop, self._one(fut, fn, args)) for loop, fut, fn, args, _ in batch]
                self.writes += len(batch)
            except BaseException as exc:  # the commit itself failed: nothing of the group is durable
                results = [(loop, (fut, False, _as_down(exc))) for loop, fut, _, _, _ in batch]
            for loop, r in results:
                done.setdefault(loop, []).append(r)
        for loop, items in done.items():
            try:
                loop.call_soon_threadsafe(_settle, items)
            except RuntimeError:  # that loop is closed: nobody waits for these any more
                pass

    def _one(self, fut: asyncio.Future[Any], fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, bool, Any]:
        try:
            with self.env.begin(write=True) as txn:
                out = self._call(fut, fn, txn, args, raise_lmdb=True)
            self.commits += 1
            return out
        except BaseException as exc:
            return fut, False, _as_down(exc)

    @staticmethod
    def _call(fut: asyncio.Future[Any], fn: Callable[..., Any], txn: Any, args: tuple[Any, ...],
              raise_lmdb: bool = False) -> tuple[Any, bool, Any]:
        try:
            return fut, True, (fn(*args) if txn is None else fn(txn, *args))
        except MetastoreError as exc:
            # an answer (a failed check, say KeyExistsError), not a fault: without the writer thread's
            # frames, whose locals hold the results that hold it (a cycle only the cyclic GC frees)
            return fut, False, exc.with_traceback(None)
        except lmdb.Error as exc:
            if raise_lmdb:
                raise
            return fut, False, _as_down(exc)
        except Exception as exc:
            return fut, False, exc


def _as_down(exc: BaseException) -> BaseException:
    if isinstance(exc, MetastoreError):
        return exc
    if isinstance(exc, lmdb.Error):
        return ServiceDownError(f"lmdb write failed: {exc}")
    return exc


_ENVS: dict[str, _SharedEnv] = {}
_ENVS_LOCK = threading.Lock()


def _acquire(path: str, map_size: int, max_tables: int) -> _SharedEnv:
    with _ENVS_LOCK:
        shared = _ENVS.get(path)
        if shared is None:
            shared = _SharedEnv(path, map_size, max_tables)
            _ENVS[path] = shared
        shared.refs += 1
        return shared


def _release(shared: _SharedEnv) -> None:
    with _ENVS_LOCK:
        shared.refs -= 1
        if shared.refs <= 0:
            _ENVS.pop(shared.path, None)
            shared.writer.stop()
            shared.env.close()


def encode_record(version: int, value: Value) -> bytes:
    fields = {k: v for k, v in value.items() if v is not None}
    return _VER.pack(version) + Record(fields=fields).SerializeToString()


_from_string = Record.FromString
_versioned = tuple.__new__  # builds a Versioned without NamedTuple's Python-level __new__
_unpack_version = _VER.unpack_from


def decode_record(raw: bytes, fields: Fields = ALL_FIELDS) -> Versioned:
    """The record stored as ``raw`` (``fields``: only those), as a fresh ``Versioned``."""
    stored = _from_string(raw[8:]).fields
    value = Value()
    if fields is ALL_FIELDS:
        for f in stored:  # filling an empty Value is the fastest copy out of a protobuf map
            value[f] = stored[f]
    else:
        for f in fields:  # type: ignore[union-attr]
            if f in stored:
                value[f] = stored[f]
    return _versioned(Versioned, (value, Version(_unpack_version(raw)[0])))


class LmdbTable(MetastoreScannableTable):
    """A raw LMDB table (no lease handling; ``LmdbMetaStore`` wraps it)."""

    def __init__(self, store: LmdbMetaStore, name: str) -> None:
        super().__init__(name)
        self._store = store
        self._env = store.shared.env
        self._db = store.shared.db(name)
        self._writer = store.shared.writer
        self._cache: dict[bytes, tuple[bytes, Versioned]] = {}
        self._urgent = name == SESSIONS_TABLE
        """Lease records take the writer's priority lane (``_Writer``): renewals never wait behind bulk writes."""

    def _check_open(self) -> None:
        if self._closed or self._store.closed:
            raise IllegalOpError(f"table {self.name} is closed")

    async def close(self) -> None:
        self._closed = True
        self._cache.clear()  # a closed table's decoded records are garbage

    def _key(self, key: str) -> bytes:
        raw = check_key(key).encode("utf-8", "surrogatepass")
        if len(raw) > MAX_KEY_BYTES:
            raise IllegalOpError(f"key of {len(raw)} bytes is over LMDB's {MAX_KEY_BYTES}-byte limit")
        return raw

    def _cached(self, k: bytes, raw: bytes) -> Versioned | None:
        """The cached record of ``k`` if it is still the one stored as ``raw``."""
        hit = self._cache.get(k)
        return hit[1] if hit is not None and hit[0] == raw else None

    def _decode(self, k: bytes, raw: bytes) -> Versioned:
        """The record stored as ``raw`` under ``k``, from the cache when the bytes are unchanged."""
        return self._cached(k, raw) or self._fill(k, raw)

    def _fill(self, k: bytes, raw: bytes) -> Versioned:
        """Decode ``raw`` (not in the cache) and remember it."""
        got = decode_record(raw)
        self._remember(k, raw, got)
        return got

    def _remember(self, k: bytes, raw: bytes, got: Versioned) -> None:
        if len(raw) > CACHE_RECORD_BYTES:
            return
        cache = self._cache
        if len(cache) >= CACHE_ENTRIES:
            for old in list(cache)[: CACHE_ENTRIES // 4]:  # drop the oldest quarter
                cache.pop(old, None)
        cache[k] = (raw, got)

    def read(self, key: str) -> Versioned:
        """The whole current record (shared with the cache: callers must copy its ``Value``)."""
        if self._closed or self._store._closed:
            raise IllegalOpError(f"table {self.name} is closed")
        if type(key) is not str or not key:
            check_key(key)
        k = key.encode("utf-8", "surrogatepass")
        if len(k) > MAX_KEY_BYTES:
            self._key(key)
        raw = self._env.begin(db=self._db).get(k)  # a read txn is aborted when dropped
        if raw is None:
            raise NoKeyError(f"{self.name}/{key}")
        return self._decode(k, raw)

    async def get(self, key: str, fields: Fields = ALL_FIELDS, watcher: Watcher | None = None) -> Versioned:
        got = self.read(key)
        if fields is not ALL_FIELDS:
            fields = check_fields(fields)
        return Versioned(got.value.project(fields), got.version)

    @staticmethod
    def _next_version(previous: int) -> int:
        """Wall-clock nanoseconds, and always past ``previous`` (see the module docstring)."""
        return max(previous + 1, time.time_ns())

    def _put_txn(self, txn: Any, k: bytes, key: str, value: Value, version: Version) -> Version:
        raw = txn.get(k, db=self._db)
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
            new_value = self._decode(k, raw).value.merged(value)
        nv = Version(self._next_version(previous))
        record = encode_record(nv.value, new_value)
        txn.put(k, record, db=self._db)
        self._remember(k, record, Versioned(new_value, nv))
        return nv

    def _remove_txn(self, txn: Any, k: bytes, key: str, version: Version) -> None:
        raw = txn.get(k, db=self._db)
        if raw is None:
            raise NoKeyError(f"{self.name}/{key}")
        if version != Version.ANY and (
            version == Version.NEW or _VER.unpack_from(raw)[0] != version.value
        ):
            raise BadVersionError(f"{self.name}/{key}: version {version!r} is not current")
        txn.delete(k, db=self._db)
        self._cache.pop(k, None)

    async def put(self, key: str, value: Value, version: Version) -> Version:
        self._check_open()
        k = self._key(key)
        value = check_value(value)
        version = check_version(version)
        limit = self._store.max_value_size
        for f, v in value.items():
            if v is not None and len(v) > limit:
                raise IllegalOpError(f"field {f!r} of {len(v)} bytes is over the lmdb limit of {limit}")
        return await self._store.write(self._put_txn, k, key, value, version, urgent=self._urgent)

    async def remove(self, key: str, version: Version) -> None:
        self._check_open()
        k = self._key(key)
        version = check_version(version)
        await self._store.write(self._remove_txn, k, key, version, urgent=self._urgent)

    def _page(self, after: bytes | None, start: bytes, start_inclusive: bool, stop: bytes,
              stop_inclusive: bool, order: Order, fields: Fields, n: int) -> list[tuple[str, Versioned]]:
        """Up to ``n`` entries after ``after`` (exclusive) or from ``start``, in ``order``.

        One read transaction per page; records come from the cache when their bytes are
        unchanged and are decoded otherwise (a scan does not fill the cache).
        """
        self._check_open()
        out: list[tuple[str, Versioned]] = []
        append = out.append
        cache_get = self._cache.get
        decode = decode_record
        pos, incl = (after, False) if after is not None else (start, start_inclusive)
        with self._env.begin(db=self._db) as txn:
            cur = txn.cursor()
            if order is Order.ASC:
                if pos and not cur.set_range(pos):
                    return out
                items = cur.iternext()
                if pos and not incl and cur.key() == pos:
                    next(items, None)
            else:
                if pos:
                    if not cur.set_range(pos):
                        if not cur.last():
                            return out
                    elif cur.key() > pos or (cur.key() == pos and not incl):
                        if not cur.prev():
                            return out
                elif not cur.last():
                    return out
                items = cur.iterprev()
            asc = order is Order.ASC
            for k, raw in items:
                if stop and (((k > stop) if asc else (k < stop)) or (k == stop and not stop_inclusive)):
                    break
                hit = cache_get(k)
                if hit is not None and hit[0] == raw:
                    got = hit[1]
                    got = _versioned(Versioned, (got.value.project(fields), got.version))
                else:
                    got = decode(raw, fields)
                append((k.decode("utf-8", "surrogatepass"), got))
                if len(out) >= n:
                    break
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


class LmdbCounters(Counters):
    """``CounterCapability`` on LMDB: the database ``c:counters``, one write transaction per add.

    A counter is 8 bytes, big-endian; adds queued together share a group commit like puts.
    """

    def __init__(self, store: LmdbMetaStore, db: Any) -> None:
        self._store = store
        self._db = db

    def _add_txn(self, txn: Any, k: bytes, name: str, delta: int) -> int:
        raw = txn.get(k, db=self._db)
        new = (_VER.unpack(raw)[0] if raw is not None else 0) + delta
        if new > MAX_COUNTER:
            raise IllegalOpError(f"counter {name!r} would pass {MAX_COUNTER}")
        if delta:
            txn.put(k, _VER.pack(new), db=self._db)
        return new

    async def add(self, name: str, delta: int) -> int:
        name, delta = check_counter(name, delta)
        k = name.encode("utf-8", "surrogatepass")
        if len(k) > MAX_KEY_BYTES:
            raise IllegalOpError(f"counter name of {len(k)} bytes is over LMDB's {MAX_KEY_BYTES}-byte limit")
        if not delta:   # a read: no transaction to wait for
            self._store._check_open()
            raw = self._store.shared.env.begin(db=self._db).get(k)
            return _VER.unpack(raw)[0] if raw is not None else 0
        return await self._store.write(self._add_txn, k, name, delta)


def _swept(fut: asyncio.Future[None]) -> None:
    """A queued sweep's outcome: a record changed or gone meanwhile is what a sweep may meet."""
    if fut.cancelled():
        return
    exc = fut.exception()
    if exc is not None and not isinstance(exc, NoKeyError | BadVersionError):
        log.info("sweep of an expired ephemeral key failed: %s", exc)


class _FastGet(LeasedTable):
    """Lease wrapper whose ``get`` reads inline, one layer deep, when the record is not ephemeral."""

    raw: LmdbTable

    def __init__(self, raw: MetastoreTable, leases: LeaseRegistry, watches: PollingWatches | None) -> None:
        super().__init__(raw, leases, watches)
        self._replacing: set[str] = set()
        """Keys whose expired ephemeral record a create is replacing now (``_put``)."""

    async def get(self, key: str, fields: Fields = ALL_FIELDS, watcher: Watcher | None = None) -> Versioned:
        t = self.raw
        if watcher is None and type(key) is str and key and not (self._closed or t._closed or t._store._closed):
            k = key.encode("utf-8", "surrogatepass")
            if len(k) <= MAX_KEY_BYTES:
                raw = t._env.begin(db=t._db).get(k)  # a read txn is aborted when dropped
                if raw is None:
                    raise NoKeyError(f"{self.name}/{key}")
                hit = t._cache.get(k)  # ``_decode`` inlined: this is the hottest path of the store
                value, version = hit[1] if hit is not None and hit[0] == raw else t._fill(k, raw)
                if LEASE_FIELD not in value:
                    if fields is ALL_FIELDS:
                        return _versioned(Versioned, (Value(value), version))
                    return _versioned(Versioned, (value.project(check_fields(fields)), version))
        return await super().get(key, fields, watcher)

    async def _put(self, key: str, value: Value, version: Version) -> Version:
        """A create that meets an expired ephemeral record replaces it in one compare-and-set write.

        The general path (``LeasedTable._put``) tries the create, fails, reads the record, removes it and
        creates again: four writes where a takeover's claim of a dead hub's topic needs one (issue 34).
        An ephemeral create (``put_ephemeral``) reads the record inline first (an LMDB read takes
        microseconds); a record changed meanwhile makes the replacement fail, and the general path
        decides. Other creates (ledgers, ranges: never an ephemeral record there) go the general path.
        """
        t = self.raw
        if (version == Version.NEW and LEASE_FIELD in value and type(key) is str and key
                and not (self._closed or t._closed or t._store._closed)):
            k = key.encode("utf-8", "surrogatepass")
            raw = t._env.begin(db=t._db).get(k) if len(k) <= MAX_KEY_BYTES else None
            if raw is not None:
                stored, held = t._decode(k, raw)
                owner = stored.get(LEASE_FIELD)
                if owner is None or not await self._leases.expired(owner.decode()):
                    raise KeyExistsError(f"{self.name}/{key}")
                gone = {f: None for f in stored if f not in value}   # a put merges: the old fields go
                self._replacing.add(key)   # a sweep a read queued this loop turn is not needed
                try:
                    return await t.put(key, Value({**gone, **value}), held)
                except (BadVersionError, NoKeyError):
                    pass
                finally:
                    self._replacing.discard(key)
        return await super()._put(key, value, version)

    def _sweep_soon(self, key: str, version: Version, owner: str) -> None:
        """The removal of an expired ephemeral record a read met, queued on the writer thread (no task) at
        the end of the loop turn, unless a create is replacing the record by then (``_put``: a takeover's
        claim reads the dead owner's record and writes its own in the same turn; the sweep would only
        race it)."""
        t = self.raw
        if t._closed or t._store._closed or t._store.write_mode != "thread":
            super()._sweep_soon(key, version, owner)
            return
        asyncio.get_running_loop().call_soon(self._sweep_queued, key, version)

    def _sweep_queued(self, key: str, version: Version) -> None:
        t = self.raw
        if key in self._replacing or self._closed or t._closed or t._store._closed:
            return
        k = key.encode("utf-8", "surrogatepass")
        t._writer.submit(t._remove_txn, (k, key, version), urgent=t._urgent).add_done_callback(_swept)

    async def close(self) -> None:
        await super().close()
        await self.raw.close()  # each wrapper has a raw table of its own: give back its cache


class _FastGetScannable(_FastGet, LeasedScannableTable):
    raw: LmdbTable


class LmdbMetaStore(LeaseBackedMetaStore):
    """``lmdb:///path``: the embedded, durable, multi-process-safe default."""

    name = "lmdb"
    version = 1
    creates_missing_store = True
    table_class = _FastGet
    scannable_table_class = _FastGetScannable
    renew_in_thread = True   # a hub's loop busy with a burst of acquisitions no longer delays its renewals

    def __init__(self, path: str, options: LmdbOptions | None = None) -> None:
        options = options or LmdbOptions()
        super().__init__(options)
        self.options = options
        self.path = path
        self.max_value_size = options.max_value_size
        self.write_mode = options.write_mode
        try:
            os.makedirs(path, exist_ok=True)
            self.shared = _acquire(path, options.map_size, options.max_tables)
        except (OSError, lmdb.Error) as exc:
            raise ServiceDownError(f"cannot open lmdb store at {path}: {exc}") from exc
        self._write_lock = asyncio.Lock()
        self._counters: LmdbCounters | None = None

    @staticmethod
    def _check_exists(path: str) -> None:
        """``StoreNotFoundError`` naming ``path`` unless it holds an LMDB store."""
        if not os.path.isdir(path):
            raise StoreNotFoundError(f"no lmdb metastore at {path} (no such directory)")
        if not os.path.isfile(os.path.join(path, "data.mdb")):
            raise StoreNotFoundError(f"no lmdb metastore at {path} (the directory holds no data.mdb)")

    @classmethod
    async def open(cls, uri: str, **conf: Any) -> LmdbMetaStore:
        parts = urlsplit(uri)
        if parts.scheme != "lmdb":
            raise IllegalOpError(f"not an lmdb URI: {uri!r}")
        path = unquote(parts.netloc + parts.path)
        if not path:
            raise IllegalOpError(f"lmdb URI {uri!r} names no directory (use lmdb:///abs/path)")
        options = store_options(LmdbOptions, parts.query, conf, source="lmdb metastore options")
        path = os.path.abspath(path)
        if not options.create:
            cls._check_exists(path)
        return cls(path, options)

    def commit_counts(self) -> tuple[int, int]:
        """``(write transactions, writes they carried)`` of this directory's writer thread so far.

        Shared by every store of this process on the directory; the ratio of
        two differences is the mean group-commit size over that span.
        """
        writer = self.shared.writer
        return writer.commits, writer.writes

    async def write(self, fn: Callable[..., T], *args: Any, urgent: bool = False) -> T:
        """Run ``fn(txn, *args)`` in a write transaction on the writer thread; return once it is synced.

        ``urgent``: in the writer's priority lane, ahead of queued writes (lease renewals; see ``_Writer``).

        With ``write_mode=inline`` the transaction runs and syncs on the calling thread instead,
        blocking the event loop for the commit (see the module docstring).
        """
        self._check_open()
        if self.write_mode == "inline":
            try:
                with self.shared.env.begin(write=True) as txn:
                    return fn(txn, *args)
            except lmdb.Error as exc:
                raise ServiceDownError(f"lmdb write failed: {exc}") from exc
        return await self.shared.writer.submit(fn, args, urgent=urgent)

    async def counters(self) -> Counters:
        """``CounterCapability``: ``LmdbCounters`` (one write transaction per add)."""
        self._check_open()
        if self._counters is None:
            try:
                db = await self.shared.writer.submit(self.shared.db, ("counters", "c:"), txn=False)
            except ServiceDownError as exc:
                raise ServiceDownError(f"cannot open the counters: {exc}") from exc
            self._counters = LmdbCounters(self, db)
        return self._counters

    async def _open_raw_table(self, name: str, scannable: bool) -> MetastoreTable:
        self._check_open()
        try:
            return await self.shared.writer.submit(LmdbTable, (self, name), txn=False)
        except ServiceDownError as exc:
            raise ServiceDownError(f"cannot open table {name}: {exc}") from exc

    async def close(self) -> None:
        if self._closed:
            return
        await super().close()
        _release(self.shared)
