"""Lease-based ``SessionCapability`` for backends without ephemeral nodes.

A backend that can only store versioned records (lmdb, hbase, most
third-party stores) subclasses ``LeaseBackedMetaStore`` and implements
``_open_raw_table(name, scannable)``; it then gets, for free:

* sessions: ``sess = await store.session(timeout=2.0)`` writes a lease record
  in the hidden table ``__sessions`` and heart-beats it every ``timeout/3``
  (from a thread of its own where the backend sets ``renew_in_thread``);
* ephemeral keys: ``await sess.put_ephemeral(table, key, value)`` stores the
  record with the hidden field ``LEASE_FIELD`` naming the session;
* sweeping: every read (``get``, cursors) and every create that meets an
  ephemeral key whose session has expired removes it (CAS on its version) and
  behaves as if it were absent — "swept by readers";
* watches by polling for backends that have no native watches.

An owner whose process dies stops heart-beating; ``timeout`` seconds later its
keys are gone for every reader. A session that itself notices it missed its
own expiry (a long pause) turns ``alive == False`` and never resurrects.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from metastore.api import (
    ALL_FIELDS,
    Fields,
    MetaStore,
    MetastoreCursor,
    MetastoreScannableTable,
    MetastoreTable,
    Order,
    PollingWatches,
    Session,
    Value,
    Version,
    Versioned,
    Watcher,
    check_fields,
    check_key,
    check_value,
)
from metastore.conf import setting
from metastore.errors import BadVersionError, IllegalOpError, KeyExistsError, MetastoreError, NoKeyError
from metastore.proto.metastore_pb2 import LeaseRecord
from metastore.tasks import spawn

log = logging.getLogger(__name__)

LEASE_FIELD = "\x00lease"
"""Hidden field naming the owning session of an ephemeral key (reserved)."""
SESSIONS_TABLE = "__sessions"
DEFAULT_SESSION_TIMEOUT = 2.0
_GONE_REMEMBERED = 1024
"""Dead sessions a ``LeaseRegistry`` remembers (then it forgets them all and reads their records again)."""


@dataclass(frozen=True)
class LeaseOptions:
    """Options of the lease layer; a lease-backed backend's options dataclass extends it.

    ``LeaseBackedMetaStore(options)`` takes them; parse them with
    ``metastore.conf.store_options`` (``IllegalOpError`` naming a bad key).
    """

    watch_poll_interval: float = setting(0.05, "seconds between polls of a watched key (no native watches)",
                                         min=0.001, max=60.0)
    session_timeout: float = setting(DEFAULT_SESSION_TIMEOUT, "seconds a session's lease outlives its last "
                                     "heartbeat, when session() is given no timeout", min=0.1)


class LeaseRegistry:
    """Answers "has session S expired?" from the hidden sessions table.

    A session seen alive with expiry T is remembered as alive until T: a
    session that closes cleanly removes its keys itself, so the cache never
    hides a dead owner past its lease.

    A session whose record is gone (never there, removed by its close or by
    a sweep) is remembered as dead: its record cannot come back (a session
    creates it once, under a new id, and renews it with a write that fails
    when it is missing), so the answer is final. A takeover asks about the
    same dead owner twice per topic, for thousands of topics (issue 34).
    """

    def __init__(self, sessions: MetastoreTable, clock: Callable[[], float] = time.time) -> None:
        self._sessions = sessions
        self._clock = clock
        self._alive_until: dict[str, float] = {}
        self._gone: set[str] = set()
        """Sessions whose record is gone: dead for good (bounded by ``_GONE_REMEMBERED``)."""

    def _dead(self, session_id: str) -> None:
        self._alive_until.pop(session_id, None)
        if len(self._gone) >= _GONE_REMEMBERED:
            self._gone.clear()
        self._gone.add(session_id)

    async def expired(self, session_id: str) -> bool:
        if session_id in self._gone:
            return True
        now = self._clock()
        until = self._alive_until.get(session_id)
        if until is not None and now < until:
            return False
        try:
            got = await self._sessions.get(session_id)
        except NoKeyError:
            self._dead(session_id)
            return True
        rec = LeaseRecord.FromString(got.value.get("lease") or b"")
        expires = rec.expires_ms / 1000.0
        if now >= expires:
            self._alive_until.pop(session_id, None)
            try:  # sweep the dead session's record too
                await self._sessions.remove(session_id, got.version)
            except MetastoreError:
                pass
            else:
                self._dead(session_id)
            return True
        self._alive_until[session_id] = expires
        return False

    def forget(self, session_id: str) -> None:
        self._alive_until.pop(session_id, None)


class LeasedTable(MetastoreTable):
    """Wraps a backend's raw table with lease sweeping and (optionally) polling watches."""

    def __init__(self, raw: MetastoreTable, leases: LeaseRegistry, watches: PollingWatches | None) -> None:
        super().__init__(raw.name)
        self.raw = raw
        self._leases = leases
        self._watches = watches
        self._sweeps: set[asyncio.Task[None]] = set()
        """Sweeps a read started and did not wait for (``_live(..., wait=False)``)."""

    @property
    def closed(self) -> bool:
        return self._closed or self.raw.closed

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalOpError("table is closed")

    async def _live(self, key: str, got: Versioned, wait: bool = True) -> bool:
        """False when ``got`` is an ephemeral record of an expired session, which is swept: before this
        returns, or (``wait=False``, a read) meanwhile.

        A read need not wait: the record is absent for every reader either way, the sweep is a CAS on
        the expired record's version (it never removes a record written since), and a create that meets
        the record before the sweep lands sweeps it itself (``_put``). A takeover's claim reads each
        topic's dead owner record and then creates its own: on LMDB the two writes now share a group
        commit instead of waiting for one each (issue 34).
        """
        owner = got.value.get(LEASE_FIELD)
        if owner is None or not await self._leases.expired(owner.decode()):
            return True
        if wait:
            await self._sweep(key, got.version, owner.decode())
        else:
            self._sweep_soon(key, got.version, owner.decode())
        return False

    def _sweep_soon(self, key: str, version: Version, owner: str) -> None:
        """``_sweep`` without waiting for it (a backend may queue the removal without a task)."""
        spawn(self._sweeps, self._sweep(key, version, owner), name="sweep")

    async def _sweep(self, key: str, version: Version, owner: str) -> None:
        try:
            await self.raw.remove(key, version)
            log.debug("swept expired ephemeral key %s/%s (session %s)", self.name, key, owner)
        except (NoKeyError, BadVersionError):
            pass
        except MetastoreError as exc:   # the record stays expired: the next reader sweeps it
            log.info("sweep of expired ephemeral key %s/%s failed: %s", self.name, key, exc)

    @staticmethod
    def _with_lease(fields: Fields) -> Fields:
        if fields is ALL_FIELDS:
            return fields
        return frozenset(fields) | {LEASE_FIELD}  # type: ignore[arg-type]

    @staticmethod
    def _strip(got: Versioned, fields: Fields) -> Versioned:
        if LEASE_FIELD not in got.value:
            return got
        value = Value(got.value)
        del value[LEASE_FIELD]
        return Versioned(value, got.version)

    async def get(self, key: str, fields: Fields = ALL_FIELDS, watcher: Watcher | None = None) -> Versioned:
        if self._closed:
            raise IllegalOpError("table is closed")
        if fields is not ALL_FIELDS:
            fields = check_fields(fields)
        got = await self.raw.get(key, self._with_lease(fields))
        if LEASE_FIELD in got.value and not await self._live(key, got, wait=False):
            raise NoKeyError(f"{self.name}/{key}")
        if watcher is not None:
            if self._watches is None:
                await self.raw.get(key, (), watcher=watcher)
            else:
                self._watches.add(self, key, got.version, watcher)
        return self._strip(got, fields)

    async def put(self, key: str, value: Value, version: Version) -> Version:
        self._check_open()
        value = check_value(value)
        if LEASE_FIELD in value:
            raise IllegalOpError(f"field name {LEASE_FIELD!r} is reserved")
        return await self._put(key, value, version)

    async def _put(self, key: str, value: Value, version: Version) -> Version:
        try:
            return await self.raw.put(key, value, version)
        except KeyExistsError:
            if version != Version.NEW:
                raise
            try:
                got = await self.raw.get(key, {LEASE_FIELD})
            except NoKeyError:
                return await self.raw.put(key, value, version)
            if await self._live(key, got):
                raise
            return await self.raw.put(key, value, version)
        except (NoKeyError, BadVersionError):
            raise

    async def remove(self, key: str, version: Version) -> None:
        self._check_open()
        await self.raw.remove(key, version)

    async def open_cursor(self, fields: Fields = ALL_FIELDS) -> MetastoreCursor:
        self._check_open()
        fields = check_fields(fields)
        return LeasedCursor(self, await self.raw.open_cursor(self._with_lease(fields)), fields)

    async def close(self) -> None:
        self._closed = True
        for task in list(self._sweeps):
            task.cancel()


class LeasedScannableTable(LeasedTable, MetastoreScannableTable):
    raw: MetastoreScannableTable

    async def open_cursor_range(self, first_key: str, first_inclusive: bool, last_key: str,
                                last_inclusive: bool, order: Order = Order.ASC,
                                fields: Fields = ALL_FIELDS) -> MetastoreCursor:
        self._check_open()
        fields = check_fields(fields)
        inner = await self.raw.open_cursor_range(first_key, first_inclusive, last_key, last_inclusive,
                                                 order, self._with_lease(fields))
        return LeasedCursor(self, inner, fields)


class LeasedCursor(MetastoreCursor):
    """Filters expired ephemeral keys out of a raw cursor and hides the lease field."""

    def __init__(self, table: LeasedTable, inner: MetastoreCursor, fields: Fields) -> None:
        self._table = table
        self._inner = inner
        self._fields = fields

    def has_more(self) -> bool:
        self._check_open()
        return self._inner.has_more()

    async def read_entries(self, n: int) -> list[tuple[str, Versioned]]:
        self._check_open()
        out: list[tuple[str, Versioned]] = []
        while len(out) < n and self._inner.has_more():
            for key, got in await self._inner.read_entries(n - len(out)):
                if LEASE_FIELD not in got.value:
                    out.append((key, got))
                elif await self._table._live(key, got):
                    out.append((key, LeasedTable._strip(got, self._fields)))
        return out

    async def close(self) -> None:
        self._closed = True
        await self._inner.close()


class LeaseSession(Session):
    """A heart-beaten lease; see the module docstring."""

    def __init__(self, store: LeaseBackedMetaStore, sessions: MetastoreTable, timeout: float) -> None:
        self.session_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self.timeout = timeout
        self._store = store
        self._sessions = sessions
        # per table name: the table and the keys put_ephemeral wrote in it (a hub's thousands of owned topics:
        # about 21 bytes a key in a dict, where a set takes 50 to 100 and a (table, key) tuple key 64 more)
        self._owned: dict[str, tuple[LeasedTable, dict[str, None]]] = {}
        self._alive = False
        self._expires = 0.0
        self._task: asyncio.Task[None] | None = None
        self.longest_late = 0.0
        """Longest a renewal woke past its time (event-loop lag), seconds."""
        self.longest_write = 0.0
        """Longest a renewal's write took, seconds."""
        self._thread: threading.Thread | None = None     # renew_in_thread: the heartbeat's thread and loop
        self._thread_loop: asyncio.AbstractEventLoop | None = None

    @property
    def alive(self) -> bool:
        return self._alive and time.time() < self._expires

    async def start(self) -> None:
        await self._beat(create=True)
        self._alive = True
        if not self._store.renew_in_thread:
            self._task = asyncio.get_running_loop().create_task(self._heartbeat())
            return
        started = threading.Event()
        self._thread = threading.Thread(target=self._run_heartbeat, args=(started,), daemon=True,
                                        name=f"lease-{self.session_id}")
        self._thread.start()
        await asyncio.to_thread(started.wait)

    def _run_heartbeat(self, started: threading.Event) -> None:
        """The heartbeat on a thread and event loop of its own (``LeaseBackedMetaStore.renew_in_thread``)."""
        loop = asyncio.new_event_loop()
        try:
            self._thread_loop = loop
            self._task = loop.create_task(self._heartbeat())
            started.set()
            with contextlib.suppress(asyncio.CancelledError):
                loop.run_until_complete(self._task)
        finally:
            started.set()
            loop.close()

    async def _beat(self, create: bool = False) -> None:
        expires = time.time() + self.timeout
        rec = LeaseRecord(expires_ms=int(expires * 1000), owner=self.session_id).SerializeToString()
        await self._sessions.put(self.session_id, Value({"lease": rec}),
                                 Version.NEW if create else Version.ANY)
        self._expires = expires

    async def _heartbeat(self) -> None:
        """Renew every ``timeout / 3``, counted from each renewal's start (a slow write does not push
        the next one back); a renewal that came late or took long is logged with both parts, so an
        operator sees whether a busy event loop or the store's writes ate the lease."""
        interval = self.timeout / 3.0
        loop = asyncio.get_running_loop()
        due = loop.time() + interval
        while self._alive:
            await asyncio.sleep(max(0.0, due - loop.time()))
            started = loop.time()
            late = started - due
            self.longest_late = max(self.longest_late, late)
            if time.time() >= self._expires:
                log.warning("session %s missed its lease; it has expired (this renewal woke %.0f ms late: the "
                            "event loop was busy)", self.session_id, late * 1000)
                self._alive = False
                return
            try:
                await self._beat()
            except NoKeyError:
                log.warning("session %s was swept; it has expired", self.session_id)
                self._alive = False
                return
            except MetastoreError as exc:
                log.warning("session %s heartbeat failed: %s", self.session_id, exc)
            took = loop.time() - started
            self.longest_write = max(self.longest_write, took)
            if late + took > interval:
                log.warning("session %s renewed its %.1f s lease %.0f ms late: the event loop woke it %.0f ms "
                            "late and the write took %.0f ms", self.session_id, self.timeout,
                            (late + took - interval) * 1000, late * 1000, took * 1000)
            due = started + interval

    async def put_ephemeral(self, table: MetastoreTable, key: str, value: Value) -> Version:
        if not self.alive:
            raise IllegalOpError(f"session {self.session_id} is not alive")
        if not isinstance(table, LeasedTable):
            raise IllegalOpError("put_ephemeral needs a table of the session's own store")
        check_key(key)
        value = check_value(value)
        value[LEASE_FIELD] = self.session_id.encode()
        version = await table._put(key, value, Version.NEW)
        owned = self._owned.get(table.name)
        if owned is None:
            owned = self._owned[table.name] = (table, {})
        owned[1][key] = None
        return version

    async def close(self) -> None:
        if not self._alive and self._task is None:
            return
        self._alive = False
        if self._thread is not None:
            task, loop, thread = self._task, self._thread_loop, self._thread
            if task is not None and loop is not None:
                with contextlib.suppress(RuntimeError):    # its loop already closed: the heartbeat ended
                    loop.call_soon_threadsafe(task.cancel)
            await asyncio.to_thread(thread.join, 10.0)
            self._thread = self._thread_loop = None
            self._task = None
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for table, key in [(t, k) for t, keys in self._owned.values() for k in keys]:
            try:
                got = await table.raw.get(key, {LEASE_FIELD})
                if got.value.get(LEASE_FIELD) == self.session_id.encode():
                    await table.raw.remove(key, got.version)
            except MetastoreError:
                pass
        self._owned.clear()
        try:
            await self._sessions.remove(self.session_id, Version.ANY)
        except MetastoreError:
            pass


class LeaseBackedMetaStore(MetaStore):
    """Base for backends that get sessions and watches through leases and polling."""

    native_watches = False
    watch_poll_interval = 0.05
    """Used when no ``LeaseOptions`` are given (a subclass may set its own)."""
    session_timeout = DEFAULT_SESSION_TIMEOUT
    """Lease of ``session()`` without a timeout, when no ``LeaseOptions`` are given."""
    table_class: type[LeasedTable] = LeasedTable
    """Wrappers for plain and scannable tables; a backend may subclass them for fast paths."""
    scannable_table_class: type[LeasedScannableTable] = LeasedScannableTable
    renew_in_thread = False
    """Heart-beat each session from a thread and event loop of its own, not the caller's loop: a renewal
    then comes on time however long the application's loop is busy (as a ZooKeeper client's pings do).
    Only for a backend whose writes may run from any event loop (``lmdb``'s writer thread settles each
    write on the loop that queued it)."""

    def __init__(self, options: LeaseOptions | None = None) -> None:
        if options is not None:
            self.watch_poll_interval = options.watch_poll_interval
            self.session_timeout = options.session_timeout
        self._tables: dict[str, LeasedTable] = {}
        self._watches = None if self.native_watches else PollingWatches(self.watch_poll_interval)
        self._leases: LeaseRegistry | None = None
        self._sessions_list: list[LeaseSession] = []

    @abc.abstractmethod
    async def _open_raw_table(self, name: str, scannable: bool) -> MetastoreTable:
        """Return the backend's own table (no lease handling)."""

    async def _table(self, name: str, scannable: bool) -> LeasedTable:
        self._check_open()
        if not isinstance(name, str) or not name:
            raise IllegalOpError("table name must be a non-empty str")
        t = self._tables.get(name)
        if t is not None and (not scannable or isinstance(t, LeasedScannableTable)):
            return t
        leases = await self._lease_registry()
        raw = await self._open_raw_table(name, scannable)
        if scannable:
            if not isinstance(raw, MetastoreScannableTable):
                raise IllegalOpError(f"backend {self.name} cannot order table {name}")
            t = self.scannable_table_class(raw, leases, self._watches)
        else:
            t = self.table_class(raw, leases, self._watches)
        self._tables[name] = t
        return t

    async def _lease_registry(self) -> LeaseRegistry:
        if self._leases is None:
            raw = await self._open_raw_table(SESSIONS_TABLE, False)
            self._leases = LeaseRegistry(raw)
        return self._leases

    async def create_table(self, name: str) -> MetastoreTable:
        return await self._table(name, scannable=False)

    async def create_scannable_table(self, name: str) -> MetastoreScannableTable:
        t = await self._table(name, scannable=True)
        assert isinstance(t, LeasedScannableTable)
        return t

    async def session(self, timeout: float | None = None) -> Session:
        self._check_open()
        await self._lease_registry()
        raw = await self._open_raw_table(SESSIONS_TABLE, False)
        sess = LeaseSession(self, raw, float(timeout or self.session_timeout))
        await sess.start()
        self._sessions_list.append(sess)
        return sess

    async def close(self) -> None:
        if self._closed:
            return
        for s in self._sessions_list:
            await s.close()
        if self._watches is not None:
            self._watches.cancel_all()
        for t in self._tables.values():
            await t.close()
        self._closed = True
