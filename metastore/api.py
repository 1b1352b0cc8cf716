"""The MetaStore contract: the interface every backend implements.

This mirrors BookKeeper's ``MetaStore`` / ``MetastoreTable`` /
``MetastoreScannableTable`` / ``MetastoreCursor`` in asyncio form::

    ms = await open_metastore("lmdb://data/metastore")
    t = await ms.create_table("topics")
    v = await t.put("k", Value({"owner": b"hub1"}), Version.NEW)   # create
    got = await t.get("k")                                          # Versioned
    v2 = await t.put("k", Value({"load": b"3"}), got.version)       # CAS, merges fields
    await t.remove("k", v2)

Rules every backend follows (the conformance kit in
``metastore.testing.conformance`` checks them):

* Keys are non-empty ``str`` (any character); field names ``str``; field
  values ``bytes``. ``None`` as key, value or version -> ``IllegalOpError``.
* ``put(key, value, Version.NEW)`` creates (``KeyExistsError`` if present);
  ``put`` with any other version (including ``Version.ANY``) on a missing key
  -> ``NoKeyError``; with a concrete version that is not current ->
  ``BadVersionError``. A put merges fields into the stored record; a field
  whose value is ``None`` deletes that field.
* ``remove(key, version)``: ``Version.ANY`` removes unconditionally;
  ``Version.NEW`` on an existing key -> ``BadVersionError``; missing key ->
  ``NoKeyError``.
* ``get(key, fields=...)`` returns only the projected fields that exist;
  ``fields=set()`` returns an empty ``Value`` and the version.
* Versions are opaque, compared with ``==`` and ``<`` (newer is greater),
  change on every successful put and stay valid across close and reopen.
* Scannable tables order keys by Python ``str`` order. ``""`` as first or
  last key opens that end. For ``Order.DESC`` the scan starts at
  ``first_key`` (the high key). An inverted range -> ``IllegalOpError``.
* Watches: ``get(key, watcher=cb)`` arranges for ``cb(WatchEvent)`` to be
  called once, on the event loop that made the call, when the key next
  changes or is removed.
* Every operation on a closed store, table or cursor -> ``IllegalOpError``.
* Optional capabilities: ``SessionCapability`` (``session()``: ephemeral
  keys) and ``CounterCapability`` (``counters()``: native atomic counters);
  a backend without one raises ``IllegalOpError`` from its factory method.
"""

from __future__ import annotations

import abc
import asyncio
import enum
import functools
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, NamedTuple

from metastore.errors import IllegalOpError, NoKeyError
from metastore.tasks import spawn

log = logging.getLogger(__name__)


class Value(dict[str, bytes | None]):
    """A record: field name -> bytes. In a ``put``, a ``None`` value deletes the field.

    Values returned by ``get`` and cursors never hold ``None``.
    """

    def merged(self, update: Value) -> Value:
        """Return a copy of this value with ``update`` applied (``None`` deletes)."""
        out = Value(self)
        for k, v in update.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = v
        return out

    def project(self, fields: Fields) -> Value:
        """Return only ``fields`` (those that exist); ``ALL_FIELDS`` returns a copy."""
        if fields is ALL_FIELDS or fields is None:
            return Value(self)
        return Value({k: self[k] for k in fields if k in self})  # type: ignore[union-attr]


@functools.total_ordering
class Version:
    """An opaque, ordered version. ``Version.NEW`` and ``Version.ANY`` are sentinels.

    Backends build concrete versions with ``Version(int)``; callers should only
    compare them (``==``, ``<``) and pass them back.
    """

    __slots__ = ("_sentinel", "_value")

    NEW: ClassVar[Version]
    ANY: ClassVar[Version]

    def __init__(self, value: int, *, _sentinel: str | None = None) -> None:
        if not isinstance(value, int):
            raise IllegalOpError(f"a version wraps an int, not {type(value).__name__}")
        self._value = value
        self._sentinel = _sentinel

    @property
    def value(self) -> int:
        """The backend's integer for this version (meaningless for the sentinels)."""
        return self._value

    @property
    def is_sentinel(self) -> bool:
        return self._sentinel is not None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._sentinel == other._sentinel and (
            self._sentinel is not None or self._value == other._value
        )

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        if self._sentinel or other._sentinel:
            raise TypeError("Version.NEW and Version.ANY are not ordered")
        return self._value < other._value

    def __hash__(self) -> int:
        return hash((self._sentinel, None if self._sentinel else self._value))

    def __repr__(self) -> str:
        return f"Version.{self._sentinel}" if self._sentinel else f"Version({self._value})"


Version.NEW = Version(-1, _sentinel="NEW")
Version.ANY = Version(-2, _sentinel="ANY")


class Versioned(NamedTuple):
    """A value and the version it was read at (immutable)."""

    value: Value
    version: Version


class _AllFields:
    """Sentinel type of ``ALL_FIELDS``."""

    _instance: ClassVar[_AllFields | None] = None

    def __new__(cls) -> _AllFields:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ALL_FIELDS"


ALL_FIELDS: Final = _AllFields()
Fields = Collection[str] | _AllFields | None
"""A field projection: a collection of names, or ``ALL_FIELDS`` (``None`` means the same)."""


class Order(enum.Enum):
    ASC = "asc"
    DESC = "desc"


class EventType(enum.Enum):
    CHANGED = "changed"
    REMOVED = "removed"


@dataclass(frozen=True)
class WatchEvent:
    """Delivered once to a watcher registered with ``get(key, watcher=...)``."""

    table: str
    key: str
    type: EventType


Watcher = Callable[[WatchEvent], Any]


def check_key(key: object) -> str:
    """Validate a key; raise ``IllegalOpError`` for ``None``, non-str or empty keys."""
    if key is None:
        raise IllegalOpError("key must not be None")
    if not isinstance(key, str):
        raise IllegalOpError(f"key must be str, not {type(key).__name__}")
    if not key:
        raise IllegalOpError("key must not be empty")
    return key


def check_value(value: object) -> Value:
    """Validate a value for ``put``; plain dicts are accepted and converted.

    Returns a new ``Value`` (the caller's dict may change afterwards). The common case, str field names
    and ``bytes``/``None`` values, is one pass with exact type tests (a takeover validates about ten
    values a topic, each twice: the lease layer's and the backend's put, issue 34).
    """
    if type(value) is Value or type(value) is dict:
        for k, v in value.items():
            if type(k) is not str or (v is not None and type(v) is not bytes):
                break
        else:
            return Value(value)
    if value is None:
        raise IllegalOpError("value must not be None")
    if not isinstance(value, dict):
        raise IllegalOpError(f"value must be a Value (dict), not {type(value).__name__}")
    for k, v in value.items():
        if not isinstance(k, str):
            raise IllegalOpError(f"field names must be str, not {type(k).__name__}")
        if v is not None and not isinstance(v, bytes | bytearray | memoryview):
            raise IllegalOpError(f"field {k!r}: values must be bytes, not {type(v).__name__}")
    return Value({k: (None if v is None else bytes(v)) for k, v in value.items()})


def check_version(version: object) -> Version:
    if version is None:
        raise IllegalOpError("version must not be None")
    if not isinstance(version, Version):
        raise IllegalOpError(f"version must be a Version, not {type(version).__name__}")
    return version


def check_fields(fields: Fields) -> Fields:
    if fields is None or fields is ALL_FIELDS:
        return ALL_FIELDS
    if isinstance(fields, str | bytes):
        raise IllegalOpError("fields must be a collection of names, not a single string")
    out = frozenset(fields)  # type: ignore[arg-type]
    for f in out:
        if not isinstance(f, str):
            raise IllegalOpError("field names must be str")
    return out


def check_range(first_key: str, last_key: str, order: Order) -> None:
    """Raise ``IllegalOpError`` for an inverted range (both ends given)."""
    for k in (first_key, last_key):
        if k is None or not isinstance(k, str):
            raise IllegalOpError("range keys must be str ('' opens that end)")
    if not isinstance(order, Order):
        raise IllegalOpError(f"order must be an Order, not {order!r}")
    if first_key and last_key:
        if order is Order.ASC and first_key > last_key:
            raise IllegalOpError(f"inverted ASC range {first_key!r} > {last_key!r}")
        if order is Order.DESC and first_key < last_key:
            raise IllegalOpError(f"inverted DESC range {first_key!r} < {last_key!r}")


def in_range(key: str, first_key: str, first_inclusive: bool, last_key: str,
             last_inclusive: bool, order: Order) -> bool:
    """True when ``key`` lies in the range as the scannable-cursor contract defines it."""
    lo, lo_inc, hi, hi_inc = (
        (first_key, first_inclusive, last_key, last_inclusive)
        if order is Order.ASC
        else (last_key, last_inclusive, first_key, first_inclusive)
    )
    if lo and (key < lo or (key == lo and not lo_inc)):
        return False
    return not (hi and (key > hi or (key == hi and not hi_inc)))


class Closeable:
    """Mixin: tracks closed state and raises ``IllegalOpError`` after ``close``."""

    _closed: bool = False
    _what: ClassVar[str] = "object"

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalOpError(f"{self._what} is closed")

    @property
    def closed(self) -> bool:
        return self._closed


class MetastoreCursor(Closeable, abc.ABC):
    """Iterates over ``(key, Versioned)`` pairs in batches.

    ``has_more()`` is False once every entry was returned; ``read_entries(n)``
    returns up to ``n`` entries (an empty list when exhausted). Both raise
    ``IllegalOpError`` after ``close()``.
    """

    _what = "cursor"

    @abc.abstractmethod
    def has_more(self) -> bool: ...

    @abc.abstractmethod
    async def read_entries(self, n: int) -> list[tuple[str, Versioned]]: ...

    async def close(self) -> None:
        self._closed = True

    def __aiter__(self) -> MetastoreCursor:
        return self

    async def __anext__(self) -> list[tuple[str, Versioned]]:
        if not self.has_more():
            raise StopAsyncIteration
        batch = await self.read_entries(256)
        if not batch and not self.has_more():
            raise StopAsyncIteration
        return batch


class ListCursor(MetastoreCursor):
    """A cursor over entries a backend has already materialised, or fetches in pages.

    ``fetch(after_key, n)`` pages lazily: it returns the next up to ``n``
    entries after ``after_key`` (``None`` at the start), an empty list at the
    end. The cursor reads one entry ahead so ``has_more()`` is exact: build
    paged cursors with ``await ListCursor.paged(fetch)``.
    """

    def __init__(self, entries: Iterable[tuple[str, Versioned]] | None = None,
                 fetch: Callable[[str | None, int], Awaitable[list[tuple[str, Versioned]]]] | None = None,
                 page: int = 256) -> None:
        self._buf: list[tuple[str, Versioned]] = list(entries or [])
        self._pos = 0
        self._fetch = fetch
        self._page = page
        self._last: str | None = None
        self._exhausted = fetch is None

    @classmethod
    async def paged(cls, fetch: Callable[[str | None, int], Awaitable[list[tuple[str, Versioned]]]],
                    page: int = 256) -> ListCursor:
        cursor = cls(fetch=fetch, page=page)
        await cursor._fill(1)
        return cursor

    async def _fill(self, n: int) -> None:
        """Buffer more than ``n`` entries (or all that are left)."""
        while len(self._buf) - self._pos <= n and not self._exhausted:
            assert self._fetch is not None
            more = await self._fetch(self._last, max(self._page, n + 1))
            if not more:
                self._exhausted = True
                break
            self._buf = self._buf[self._pos:] + more
            self._pos = 0
            self._last = more[-1][0]

    def has_more(self) -> bool:
        self._check_open()
        return self._pos < len(self._buf) or not self._exhausted

    async def read_entries(self, n: int) -> list[tuple[str, Versioned]]:
        self._check_open()
        if not isinstance(n, int) or n <= 0:
            raise IllegalOpError("read_entries needs n > 0")
        await self._fill(n)
        out = self._buf[self._pos:self._pos + n]
        self._pos += len(out)
        return out


class MetastoreTable(Closeable, abc.ABC):
    """A named table of versioned records (no key order assumed)."""

    _what = "table"

    def __init__(self, name: str) -> None:
        self.name = name

    @abc.abstractmethod
    async def get(self, key: str, fields: Fields = ALL_FIELDS,
                  watcher: Watcher | None = None) -> Versioned:
        """Return the record at ``key``; ``NoKeyError`` if missing."""

    @abc.abstractmethod
    async def put(self, key: str, value: Value, version: Version) -> Version:
        """Create (``Version.NEW``), CAS-update (a version) or force-update (``Version.ANY``).

        Returns the new version. Raises ``KeyExistsError``, ``NoKeyError``,
        ``BadVersionError``, ``IllegalOpError`` (bad argument, too large) or
        ``ServiceDownError``.
        """

    @abc.abstractmethod
    async def remove(self, key: str, version: Version) -> None:
        """Remove ``key`` if ``version`` is current (``Version.ANY``: unconditionally)."""

    @abc.abstractmethod
    async def open_cursor(self, fields: Fields = ALL_FIELDS) -> MetastoreCursor:
        """A cursor over every entry, in no particular order."""

    async def close(self) -> None:
        self._closed = True


class MetastoreScannableTable(MetastoreTable):
    """A table whose keys are stored in ``str`` order and can be range-scanned."""

    @abc.abstractmethod
    async def open_cursor_range(self, first_key: str, first_inclusive: bool, last_key: str,
                                last_inclusive: bool, order: Order = Order.ASC,
                                fields: Fields = ALL_FIELDS) -> MetastoreCursor:
        """A cursor over the keys between ``first_key`` and ``last_key`` in ``order``.

        ``""`` opens that end; for ``Order.DESC`` ``first_key`` is the high key.
        An inverted range raises ``IllegalOpError``.
        """


class Session(abc.ABC):
    """Ephemeral keys that vanish when the owning process dies (``SessionCapability``).

    ``put_ephemeral`` creates ``key`` (``KeyExistsError`` when a live owner
    holds it). The key is removed when the session is closed, and by the
    backend (ZooKeeper) or by readers sweeping an expired lease (lmdb, hbase)
    once the owning process stops heart-beating for ``timeout`` seconds.
    """

    session_id: str
    timeout: float

    @abc.abstractmethod
    async def put_ephemeral(self, table: MetastoreTable, key: str, value: Value) -> Version:
        """Create ``key`` in ``table`` owned by this session."""

    @abc.abstractmethod
    async def close(self) -> None:
        """End the session; its ephemeral keys are removed."""

    @property
    @abc.abstractmethod
    def alive(self) -> bool:
        """False once the session expired or was closed."""


MAX_COUNTER = (1 << 63) - 1
"""The largest value a counter may reach (a signed 64-bit integer, as HBase's counters)."""


def check_counter(name: object, delta: object) -> tuple[str, int]:
    """Validate a ``Counters.add`` call: a non-empty ``str`` name and an ``int`` delta >= 0."""
    name = check_key(name)
    if not isinstance(delta, int) or isinstance(delta, bool):
        raise IllegalOpError(f"a counter delta is an int, not {type(delta).__name__}")
    if delta < 0 or delta > MAX_COUNTER:
        raise IllegalOpError(f"a counter delta must be between 0 and {MAX_COUNTER}, not {delta}")
    return name, delta


class Counters(abc.ABC):
    """Native atomic counters (``CounterCapability``): ``await ms.counters()``.

    A counter is named by a non-empty ``str`` and lives in the store's own
    counter namespace (no table's get, put or scan sees it). It starts at 0;
    ``add(name, delta)`` adds ``delta`` (an ``int`` >= 0; 0 reads) in one
    atomic step of the backend itself, never a compare-and-set that can lose,
    durably, across every process and host sharing the store, and returns
    the value after the add. Counters only grow; a sum past ``MAX_COUNTER``
    raises ``IllegalOpError``. Backends: lmdb (one write
    transaction), hbase (the Thrift ``atomicIncrement``); ZooKeeper has none
    (callers fall back to compare-and-set).
    """

    @abc.abstractmethod
    async def add(self, name: str, delta: int) -> int:
        """Add ``delta`` to counter ``name`` atomically; its new value. ``IllegalOpError`` for bad arguments."""


class MetaStore(Closeable, abc.ABC):
    """A metadata store: a factory of tables.

    Backends are constructed through ``open_metastore(uri, **conf)`` which
    calls ``await cls.open(uri, **conf)``.
    """

    name: str = "abstract"
    version: int = 1
    _what = "metastore"

    @classmethod
    @abc.abstractmethod
    async def open(cls, uri: str, **conf: Any) -> MetaStore:
        """Connect to or open the store named by ``uri``.

        Raises ``IllegalOpError`` for a malformed URI or configuration and
        ``ServiceDownError`` when the service cannot be reached within the
        configured timeout.
        """

    @abc.abstractmethod
    async def create_table(self, name: str) -> MetastoreTable:
        """Return the table ``name`` (created on first use)."""

    async def create_scannable_table(self, name: str) -> MetastoreScannableTable:
        """Return the ordered table ``name``; ``IllegalOpError`` if the backend cannot order keys."""
        raise IllegalOpError(f"backend {self.name} has no scannable tables")

    async def session(self, timeout: float | None = None) -> Session:
        """Open a ``SessionCapability`` session; ``IllegalOpError`` if unsupported."""
        raise IllegalOpError(f"backend {self.name} has no session capability")

    async def counters(self) -> Counters:
        """The store's native atomic counters (``CounterCapability``); ``IllegalOpError`` if unsupported."""
        raise IllegalOpError(f"backend {self.name} has no counter capability")

    async def close(self) -> None:
        self._closed = True

    async def __aenter__(self) -> MetaStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


@dataclass
class PollingWatches:
    """Watches for backends without native ones: poll ``get`` until the version changes.

    One task per registered watch, polling every ``interval`` seconds; the
    watcher fires once with CHANGED or REMOVED. ``cancel_all`` stops them
    (call it from the backend's ``close``).
    """

    interval: float = 0.05
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def add(self, table: MetastoreTable, key: str, seen: Version | None, watcher: Watcher) -> None:
        spawn(self._tasks, self._poll(table, key, seen, watcher))

    async def _poll(self, table: MetastoreTable, key: str, seen: Version | None,
                    watcher: Watcher) -> None:
        while True:
            await asyncio.sleep(self.interval)
            if table.closed:
                return
            try:
                now: Version | None = (await table.get(key, fields=())).version
            except NoKeyError:
                now = None
            except Exception:  # service down, closed: keep trying until cancelled
                log.debug("watch poll on %s/%s failed", table.name, key, exc_info=True)
                continue
            if now != seen:
                kind = EventType.REMOVED if now is None else EventType.CHANGED
                try:
                    watcher(WatchEvent(table.name, key, kind))
                except Exception:
                    log.exception("metastore watcher raised")
                return

    def cancel_all(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        self._tasks.clear()
