"""A blocking facade over any MetaStore, for tools, scripts and Spark executors.

    from metastore import sync, Value, Version
    ms = sync.open_metastore("lmdb://data/metastore")
    t = ms.create_table("topics")
    v = t.put("k", Value({"owner": b"hub1"}), Version.NEW)
    cur = t.open_cursor()
    while cur.has_more():
        for key, versioned in cur.read_entries(100): ...
    cur.close(); ms.close()

Objects have the same method names as the asyncio API. Each blocking store
runs its asyncio store on a private event-loop thread; calls block until the
result is ready and raise the same ``metastore.errors`` exceptions. Watchers
are called on that private thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from metastore.api import (
    ALL_FIELDS,
    Fields,
    MetaStore,
    MetastoreCursor,
    MetastoreScannableTable,
    MetastoreTable,
    Order,
    Session,
    Value,
    Version,
    Versioned,
    Watcher,
)
from metastore.errors import IllegalOpError
from metastore.registry import open_metastore as _open_async

T = TypeVar("T")


class _LoopThread:
    """A private event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._closed = False
        running = threading.Event()
        self.loop.call_soon(running.set)
        self._thread = threading.Thread(target=self.loop.run_forever, name="quire-metastore-sync",
                                        daemon=True)
        self._thread.start()
        # a busy machine may start the thread late: ``run`` right after this must not find the loop idle
        if not running.wait(timeout=30):
            raise IllegalOpError("the blocking metastore's event loop did not start within 30 s")

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed or not self.loop.is_running():
            coro.close()
            raise IllegalOpError("blocking metastore is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self._closed = True
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        if not self._thread.is_alive() and not self.loop.is_closed():
            self.loop.close()


class SyncCursor:
    def __init__(self, runner: _LoopThread, cursor: MetastoreCursor) -> None:
        self._runner = runner
        self._cursor = cursor

    def has_more(self) -> bool:
        return self._cursor.has_more()

    def read_entries(self, n: int) -> list[tuple[str, Versioned]]:
        return self._runner.run(self._cursor.read_entries(n))

    def close(self) -> None:
        self._runner.run(self._cursor.close())

    def __enter__(self) -> SyncCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncTable:
    def __init__(self, runner: _LoopThread, table: MetastoreTable) -> None:
        self._runner = runner
        self.table = table
        self.name = table.name

    def get(self, key: str, fields: Fields = ALL_FIELDS, watcher: Watcher | None = None) -> Versioned:
        return self._runner.run(self.table.get(key, fields, watcher))

    def put(self, key: str, value: Value, version: Version) -> Version:
        return self._runner.run(self.table.put(key, value, version))

    def remove(self, key: str, version: Version) -> None:
        self._runner.run(self.table.remove(key, version))

    def open_cursor(self, fields: Fields = ALL_FIELDS) -> SyncCursor:
        return SyncCursor(self._runner, self._runner.run(self.table.open_cursor(fields)))

    def open_cursor_range(self, first_key: str, first_inclusive: bool, last_key: str,
                          last_inclusive: bool, order: Order = Order.ASC,
                          fields: Fields = ALL_FIELDS) -> SyncCursor:
        if not isinstance(self.table, MetastoreScannableTable):
            raise IllegalOpError(f"table {self.name} is not scannable")
        coro = self.table.open_cursor_range(first_key, first_inclusive, last_key, last_inclusive,
                                            order, fields)
        return SyncCursor(self._runner, self._runner.run(coro))

    def close(self) -> None:
        self._runner.run(self.table.close())


class SyncSession:
    def __init__(self, runner: _LoopThread, session: Session) -> None:
        self._runner = runner
        self.session = session
        self.session_id = session.session_id

    @property
    def alive(self) -> bool:
        return self.session.alive

    def put_ephemeral(self, table: SyncTable, key: str, value: Value) -> Version:
        return self._runner.run(self.session.put_ephemeral(table.table, key, value))

    def close(self) -> None:
        self._runner.run(self.session.close())


class SyncMetaStore:
    """Blocking counterpart of ``metastore.api.MetaStore``."""

    def __init__(self, runner: _LoopThread, store: MetaStore) -> None:
        self._runner = runner
        self.store = store
        self.name = store.name
        self.version = store.version

    def create_table(self, name: str) -> SyncTable:
        return SyncTable(self._runner, self._runner.run(self.store.create_table(name)))

    def create_scannable_table(self, name: str) -> SyncTable:
        return SyncTable(self._runner, self._runner.run(self.store.create_scannable_table(name)))

    def session(self, timeout: float | None = None) -> SyncSession:
        return SyncSession(self._runner, self._runner.run(self.store.session(timeout)))

    def close(self) -> None:
        try:
            self._runner.run(self.store.close())
        finally:
            self._runner.stop()

    def __enter__(self) -> SyncMetaStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_metastore(uri: str, **conf: Any) -> SyncMetaStore:
    """Open ``uri`` and return a blocking store (same errors as the asyncio API)."""
    runner = _LoopThread()
    try:
        store = runner.run(_open_async(uri, **conf))
    except BaseException:
        runner.stop()
        raise
    return SyncMetaStore(runner, store)
