"""ZooKeeper MetaStore backend (kazoo).

URI: ``zk://host:port[,host:port...]/prefix`` (scheme ``zookeeper://`` too;
the prefix defaults to ``/quire``; a query string such as ``?zk_timeout=4``
adds configuration, keyword arguments win)::

    ms = await open_metastore("zk://127.0.0.1:2181/quire", zk_timeout=2.0)

Configuration (``ZooKeeperOptions``; numbers may be strings, as read from a
``.conf`` file; an unknown key or a bad value is an ``IllegalOpError`` naming
it; every key with its default is in ``conf/metastore-zookeeper.conf``):

* ``zk_timeout`` — ZooKeeper session timeout in seconds (default 2.0; the
  server bounds it to ``[2, 20] * tickTime``);
* ``connect_timeout`` — seconds to wait for the first connection (default
  5.0); ``ServiceDownError`` after that;
* ``operation_timeout`` — bound of every operation, including waiting for a
  reconnection (default 10.0); ``ServiceDownError`` after that;
* ``jute_maxbuffer`` — the server's ``jute.maxbuffer`` (default 1048575);
  a put whose request would exceed it is refused client-side with
  ``IllegalOpError`` (the server would drop the connection instead).

Layout: a table is the znode ``<prefix>/<escaped table>``; a key is a child
znode ``<prefix>/<escaped table>/<escaped key>`` whose data is a protobuf
``Record`` (``metastore/proto/metastore.proto``). Escaping is percent-style on
the UTF-8 bytes (lone surrogates pass through ``surrogatepass``): ASCII
letters, digits and ``-_.~:@,+=`` stay as they are, every other byte becomes
``%XX``, and a name that would be ``.`` or ``..`` has its dots escaped, so any
non-empty ``str`` is a legal, reversible znode name.

Versions: ``Version((czxid << 32) | znode_version)``. ``czxid`` (the zxid
that created the znode) grows with every create and the znode version
(< 2**31) with every ``set``, so versions compare "newer is greater" even
across a delete and re-create, and stay valid across reconnects and reopens.
A CAS put or remove reads the node, checks both parts, and then writes
guarded by the znode version. ZooKeeper cannot check ``czxid`` atomically,
so a delete + re-create + the same number of updates by someone else in
the few milliseconds between that read and the guarded write would not be
noticed (an ABA window; ZooKeeper's own version check has the same one).

Puts merge fields, so every put except a create is a read-modify-write
guarded by the znode version. ``Version.ANY`` retries it on a lost race
through ``metastore.cas`` (jittered backoff, ``cas.ANY_ATTEMPTS`` tries, all
within ``operation_timeout``): an unconditional put must win eventually, so
only the deadline, never a small count, makes it give up
(``ServiceDownError``).

Errors: ``NoNodeError`` -> ``NoKeyError``; ``NodeExistsError`` ->
``KeyExistsError``; ``BadVersionError`` -> ``BadVersionError``; connection
loss, session expiry and timeouts -> ``ServiceDownError``. Reads are retried
across a reconnect within ``operation_timeout``; a write whose connection
drops while it is in flight is reported as ``ServiceDownError`` (it may or
may not have been applied, as with any ZooKeeper client).

Watches are native one-shot data watches delivered on the event loop that
called ``get``. Sessions (``await ms.session(timeout)``) each own a dedicated
ZooKeeper session (a second kazoo client) so that the requested timeout is
honoured and ``close`` ends exactly that session's ephemeral keys; their
znodes are ZooKeeper ``EPHEMERAL`` nodes, removed by the server when the
owning process dies. ``alive`` turns False for good when the session is
closed or expires, or once it has been disconnected for longer than its
timeout (the server has then probably expired it, as a lease would have).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, unquote

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadArgumentsError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.exceptions import BadVersionError as KazooBadVersionError
from kazoo.handlers.threading import AsyncResult, SequentialThreadingHandler
from kazoo.protocol.states import EventType as KazooEventType
from kazoo.protocol.states import KazooState
from kazoo.retry import KazooRetry

from metastore.api import (
    ALL_FIELDS,
    EventType,
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
    WatchEvent,
    check_fields,
    check_key,
    check_range,
    check_value,
    check_version,
    in_range,
)
from metastore.cas import ANY_ATTEMPTS, cas_retry
from metastore.conf import require, setting, store_options
from metastore.errors import (
    BadVersionError,
    IllegalOpError,
    KeyExistsError,
    MetastoreError,
    NoKeyError,
    ServiceDownError,
)
from metastore.proto.metastore_pb2 import Record

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "/quire"
DEFAULT_PORT = 2181
DEFAULT_ZK_TIMEOUT = 2.0
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_OPERATION_TIMEOUT = 10.0
DEFAULT_JUTE_MAXBUFFER = 0xFFFFF
REQUEST_OVERHEAD = 1024
"""Bytes reserved for the request header and framing in the size check."""
SCHEMES = ("zk", "zookeeper")
_SAFE = ":@,+="  # besides ASCII letters, digits and "-_.~", which quote() never escapes
_VERSION_BITS = 32
_VERSION_MASK = (1 << _VERSION_BITS) - 1
_CURSOR_BATCH = 128


# -- names and records ---------------------------------------------------------------------------


def escape_name(name: str) -> str:
    """Turn any non-empty ``str`` into a legal, reversible znode name."""
    out = quote(name, safe=_SAFE, encoding="utf-8", errors="surrogatepass")
    if out in (".", ".."):
        out = out.replace(".", "%2E")
    return out


def unescape_name(escaped: str) -> str:
    """Inverse of ``escape_name``."""
    return unquote(escaped, encoding="utf-8", errors="surrogatepass")


def encode_record(value: Value) -> bytes:
    """Serialise the non-``None`` fields of ``value`` as a ``Record``."""
    try:
        rec = Record(fields={k: v for k, v in value.items() if v is not None})
    except (UnicodeError, ValueError, TypeError) as exc:
        raise IllegalOpError(f"field names must be encodable as UTF-8: {exc}") from None
    return rec.SerializeToString(deterministic=True)


def decode_record(data: bytes | None, where: str) -> Value:
    if not data:
        return Value()
    try:
        rec = Record.FromString(data)
    except Exception as exc:  # protobuf's DecodeError
        raise MetastoreError(f"{where}: znode data is not a metastore Record: {exc}",
                             code="CorruptRecord") from None
    return Value(dict(rec.fields))


_RECORD_CACHE = 4096
"""Records per table remembered for read-free CAS puts."""


def make_version(stat: Any) -> Version:
    """``Version((czxid << 32) | version)`` of a kazoo ``ZnodeStat``."""
    return Version((int(stat.czxid) << _VERSION_BITS) | (int(stat.version) & _VERSION_MASK))


def split_version(version: Version) -> tuple[int, int]:
    """``(czxid, znode version)`` of a concrete version."""
    v = version.value
    return v >> _VERSION_BITS, v & _VERSION_MASK


def _stat_matches(stat: Any, version: Version) -> bool:
    czxid, zver = split_version(version)
    return version.value >= 0 and int(stat.czxid) == czxid and int(stat.version) == zver


# -- URI and configuration -----------------------------------------------------------------------


def _illegal_path_char(ch: str) -> bool:
    # ZooKeeper's PathUtils.validatePath
    o = ord(ch)
    return (o == 0 or 0x01 <= o <= 0x1F or 0x7F <= o <= 0x9F or 0xD800 <= o <= 0xF8FF
            or 0xFFF0 <= o <= 0xFFFF)


def parse_uri(uri: str) -> tuple[str, str, dict[str, str]]:
    """Split ``zk://h:p[,h:p]/prefix[?k=v]`` into (hosts, prefix, query conf).

    ``hosts`` is a kazoo connect string; ``prefix`` is an absolute znode path
    without a trailing slash. Raises ``IllegalOpError`` when malformed.
    """
    if not isinstance(uri, str):
        raise IllegalOpError(f"metastore URI must be a str, not {type(uri).__name__}")
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        raise IllegalOpError(f"malformed ZooKeeper URI {uri!r}: expected zk://host:port[,host:port]/prefix")
    rest, _, fragment = rest.partition("#")
    if fragment:
        raise IllegalOpError(f"malformed ZooKeeper URI {uri!r}: unexpected fragment")
    rest, _, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    if not netloc:
        raise IllegalOpError(f"malformed ZooKeeper URI {uri!r}: no host")
    if "@" in netloc:
        raise IllegalOpError(f"malformed ZooKeeper URI {uri!r}: credentials are not supported")
    hosts = []
    for part in netloc.split(","):
        hosts.append(_parse_host(part, uri))
    prefix = _parse_prefix(unquote(path) if slash else "", uri)
    try:
        conf = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)))
    except ValueError:
        raise IllegalOpError(f"malformed ZooKeeper URI {uri!r}: bad query string") from None
    return ",".join(hosts), prefix, conf


def _parse_host(part: str, uri: str) -> str:
    part = part.strip()
    if not part:
        raise IllegalOpError(f"malformed ZooKeeper URI {uri!r}: empty host")
    if part.startswith("["):  # [ipv6]:port
        host, sep, tail = part[1:].partition("]")
        if not sep or not host:
            raise IllegalOpError(f"malformed ZooKeeper URI {uri!r}: bad IPv6 host {part!r}")
        if tail and not tail.startswith(":"):
            raise IllegalOpError(f"malformed ZooKeeper URI {uri!r}: bad host {part!r}")
        port_text = tail[1:] if tail else ""
        shown = f"[{host}]"
    else:
        host, sep, port_text = part.partition(":")
        if not host or (sep and not port_text) or ":" in port_text:
            raise IllegalOpError(f"malformed ZooKeeper URI {uri!r}: bad host {part!r}")
        shown = host
        if any(c.isspace() or c in "/?#" for c in host):
            raise IllegalOpError(f"malformed ZooKeeper URI {uri!r}: bad host {part!r}")
    port = DEFAULT_PORT
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise IllegalOpError(f"malformed ZooKeeper URI {uri!r}: bad port {port_text!r}")
        port = int(port_text)
    return f"{shown}:{port}"


def _parse_prefix(path: str, uri: str) -> str:
    path = path.rstrip("/")
    if not path:
        return DEFAULT_PREFIX
    parts = path.split("/")
    for p in parts:
        if p in ("", ".", "..") or any(_illegal_path_char(c) for c in p):
            raise IllegalOpError(f"malformed ZooKeeper URI {uri!r}: bad prefix path /{path}")
    if parts[0] == "zookeeper":
        raise IllegalOpError(f"malformed ZooKeeper URI {uri!r}: /zookeeper is reserved")
    return "/" + path


def _positive(key: str, value: float) -> None:
    require(value > 0 and math.isfinite(value), key, value, "must be a positive number")


@dataclass(frozen=True)
class ZooKeeperOptions:
    """Options of ``zk://`` stores (URI query string or ``open_metastore`` keyword arguments)."""

    zk_timeout: float = setting(DEFAULT_ZK_TIMEOUT, "ZooKeeper session timeout in seconds "
                                "(the server bounds it to [2, 20] * tickTime)")
    connect_timeout: float = setting(DEFAULT_CONNECT_TIMEOUT, "seconds to wait for the first connection")
    operation_timeout: float = setting(DEFAULT_OPERATION_TIMEOUT, "bound in seconds of every operation, "
                                       "reconnection included")
    jute_maxbuffer: int = setting(DEFAULT_JUTE_MAXBUFFER, "the server's jute.maxbuffer: larger puts are "
                                  "refused client-side", min=REQUEST_OVERHEAD + 1)

    def __post_init__(self) -> None:
        _positive("zk_timeout", self.zk_timeout)
        _positive("connect_timeout", self.connect_timeout)
        _positive("operation_timeout", self.operation_timeout)


# -- errors and the kazoo -> asyncio bridge --------------------------------------------------------

_DOWN = (ConnectionLoss, SessionExpiredError, ConnectionClosedError, OperationTimeoutError)


def _map_error(exc: BaseException, what: str) -> MetastoreError:
    if isinstance(exc, MetastoreError):
        return exc
    if isinstance(exc, NoNodeError):
        return NoKeyError(what)
    if isinstance(exc, NodeExistsError):
        return KeyExistsError(what)
    if isinstance(exc, KazooBadVersionError):
        return BadVersionError(what)
    if isinstance(exc, _DOWN):
        return ServiceDownError(f"{what}: ZooKeeper unavailable ({type(exc).__name__})")
    if isinstance(exc, (BadArgumentsError, NotEmptyError)):
        return IllegalOpError(f"{what}: {type(exc).__name__}")
    if isinstance(exc, KazooException):
        return MetastoreError(f"{what}: {type(exc).__name__}: {exc}", code="ZooKeeperError")
    return MetastoreError(f"{what}: {type(exc).__name__}: {exc}")


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return self.at - time.monotonic()


async def _wait_connected(client: Any, deadline: _Deadline, what: str) -> None:
    """Wait (polling, loop-agnostic) until ``client`` is connected; ``ServiceDownError`` at the deadline."""
    delay = 0.005
    while not client.connected:
        left = deadline.left()
        if left <= 0:
            raise ServiceDownError(f"{what}: not connected to ZooKeeper "
                                   f"(waited {deadline.seconds:.1f} s for a reconnection)")
        await asyncio.sleep(min(delay, left))
        delay = min(delay * 2, 0.1)


async def _kazoo(client: Any, method: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                 deadline: _Deadline, what: str) -> Any:
    """Run ``client.<method>_async(*args, **kwargs)`` without blocking the loop.

    The result is delivered through ``call_soon_threadsafe``; errors are kazoo
    exceptions (mapped by the caller) or ``ServiceDownError`` at the deadline.
    """
    await _wait_connected(client, deadline, what)
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def on_loop(ar: Any) -> None:
        if fut.done():
            return
        if ar.successful():
            fut.set_result(ar.value)
        else:
            fut.set_exception(ar.exception)

    def on_done(ar: Any) -> None:  # kazoo's connection thread (see _LoopAsyncResult)
        try:
            loop.call_soon_threadsafe(on_loop, ar)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    on_done._quire_direct = True  # type: ignore[attr-defined]
    ar = getattr(client, method)(*args, **kwargs)
    ar.rawlink(on_done)
    left = deadline.left()
    if left <= 0:
        left = 0.001
    try:
        async with asyncio.timeout(left):
            return await fut
    except TimeoutError:
        raise ServiceDownError(f"{what}: no answer from ZooKeeper within "
                               f"{deadline.seconds:.1f} s") from None


class _Conn:
    """A kazoo client plus the timeouts to use it with."""

    def __init__(self, client: Any, operation_timeout: float) -> None:
        self.client = client
        self.operation_timeout = operation_timeout

    def deadline(self) -> _Deadline:
        return _Deadline(self.operation_timeout)

    async def call(self, method: str, *args: Any, what: str, deadline: _Deadline | None = None,
                   retry: bool = False, **kwargs: Any) -> Any:
        """Call a kazoo ``*_async`` method; map errors; retry reads across connection loss."""
        deadline = deadline or self.deadline()
        while True:
            try:
                return await _kazoo(self.client, method, args, kwargs, deadline, what)
            except MetastoreError:
                raise
            except _DOWN as exc:
                exc.with_traceback(None)   # see below
                if retry and deadline.left() > 0 and not isinstance(exc, ConnectionClosedError):
                    log.debug("%s: %s; retrying after reconnection", what, type(exc).__name__)
                    await asyncio.sleep(0.01)
                    continue
                raise _map_error(exc, what) from None
            except KazooException as exc:
                # never shown (``from None``), and its traceback holds ``_kazoo``'s frame, whose future
                # holds it: a cycle per refused create that only the cyclic GC frees (issue 35)
                exc.with_traceback(None)
                raise _map_error(exc, what) from None


class _LoopAsyncResult(AsyncResult):  # type: ignore[misc]
    """An ``AsyncResult`` that runs its callbacks in the thread that completes it.

    kazoo queues ``rawlink`` callbacks to its completion thread. Ours (marked
    ``_quire_direct``) only hand the result to the event loop with
    ``call_soon_threadsafe``, which is thread-safe and quick, so they run at
    once instead: one thread wake-up less on every operation. kazoo's own
    callbacks (retries, recipes) still go through the completion thread.
    """

    def _do_callbacks(self) -> None:
        for callback in self._callbacks:
            if getattr(callback, "_quire_direct", False) or not self._handler.running:
                try:
                    callback(self)
                except Exception:
                    log.exception("kazoo completion callback raised")
            else:  # kazoo's own callbacks keep running on its completion thread
                self._handler.completion_queue.put(functools.partial(callback, self))


class _LoopHandler(SequentialThreadingHandler):  # type: ignore[misc]
    def async_result(self) -> _LoopAsyncResult:
        return _LoopAsyncResult(self)


def _new_client(hosts: str, session_timeout: float) -> Any:
    retry = KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0, max_jitter=0.2)
    return KazooClient(hosts=hosts, timeout=session_timeout, connection_retry=retry, handler=_LoopHandler(),
                       command_retry=KazooRetry(max_tries=3, delay=0.05, max_delay=1.0),
                       logger=logging.getLogger("kazoo.client"))


async def _start_client(client: Any, hosts: str, connect_timeout: float) -> None:
    client.start_async()  # connects on kazoo's own thread; poll so no executor thread is held
    try:
        await _wait_connected(client, _Deadline(connect_timeout), f"connect to {hosts}")
    except ServiceDownError:
        await _stop_client(client)
        raise ServiceDownError(f"cannot connect to ZooKeeper at {hosts} "
                               f"within {connect_timeout:.1f} s") from None
    except BaseException:  # cancelled: do not leak the client's threads
        await asyncio.shield(_stop_client(client))
        raise


async def _stop_client(client: Any) -> None:
    def stop() -> None:
        try:
            client.stop()
        except Exception:
            log.debug("kazoo stop failed", exc_info=True)
        try:
            client.close()
        except Exception:
            log.debug("kazoo close failed", exc_info=True)

    await asyncio.to_thread(stop)


# -- tables -----------------------------------------------------------------------------------------


class ZooKeeperTable(MetastoreTable):
    """A table: the znode ``<prefix>/<escaped name>``; one child znode per key."""

    def __init__(self, store: ZooKeeperMetaStore, name: str) -> None:
        super().__init__(name)
        self._store = store
        self.path = f"{store.prefix}/{escape_name(name)}"
        # key -> (version, full record) last read or written by this table. A CAS put whose
        # version equals the cached one merges into the cached record and needs no read:
        # versions name exactly one state of a znode, and the guarded set rejects a stale one.
        self._records: collections.OrderedDict[str, tuple[Version, Value]] = collections.OrderedDict()

    def _remember(self, key: str, version: Version, value: Value) -> None:
        self._records[key] = (version, value)
        self._records.move_to_end(key)
        if len(self._records) > _RECORD_CACHE:
            self._records.popitem(last=False)

    # helpers

    def _check_open(self) -> None:
        super()._check_open()
        self._store._check_open()

    def _key_path(self, key: str) -> str:
        return f"{self.path}/{escape_name(key)}"

    def _desc(self, key: str) -> str:
        return f"{self.name}/{key!r}"

    def _check_size(self, path: str, data: bytes, key: str) -> None:
        limit = self._store.jute_maxbuffer
        size = len(data) + len(path.encode("utf-8")) + REQUEST_OVERHEAD
        if size > limit:
            raise IllegalOpError(f"{self._desc(key)}: record of {len(data)} bytes is over ZooKeeper's "
                                 f"request limit (jute.maxbuffer={limit})")

    async def _ensure_table_node(self, deadline: _Deadline) -> None:
        await self._store._conn.call("ensure_path_async", self.path, what=f"table {self.name}",
                                     deadline=deadline, retry=True)

    async def _read(self, key: str, deadline: _Deadline) -> tuple[Value, Any]:
        data, stat = await self._store._conn.call("get_async", self._key_path(key), what=self._desc(key),
                                                  deadline=deadline, retry=True)
        return decode_record(data, self._desc(key)), stat

    async def _create(self, conn: _Conn, key: str, value: Value, ephemeral: bool = False) -> Version:
        path = self._key_path(key)
        data = encode_record(value)
        self._check_size(path, data, key)
        deadline = conn.deadline()
        for attempt in range(2):
            try:
                _, stat = await conn.call("create_async", path, data, ephemeral=ephemeral,
                                          include_data=True, what=self._desc(key), deadline=deadline)
                created = make_version(stat)
                self._remember(key, created, Value({k: v for k, v in value.items() if v is not None}))
                return created
            except NoKeyError:  # the table znode is missing (first use, or removed under us)
                if attempt:
                    raise
                await self._ensure_table_node(deadline)
        raise AssertionError("unreachable")

    # contract

    async def get(self, key: str, fields: Fields = ALL_FIELDS, watcher: Watcher | None = None) -> Versioned:
        self._check_open()
        key = check_key(key)
        fields = check_fields(fields)
        if watcher is not None and not callable(watcher):
            raise IllegalOpError("watcher must be callable")
        conn = self._store._conn
        path = self._key_path(key)
        what = self._desc(key)
        if watcher is None and fields is not ALL_FIELDS and not fields:
            stat = await conn.call("exists_async", path, what=what, retry=True)
            if stat is None:
                raise NoKeyError(what)
            return Versioned(Value(), make_version(stat))
        watch = self._make_watch(key, watcher) if watcher is not None else None
        data, stat = await conn.call("get_async", path, watch=watch, what=what, retry=True)
        value = decode_record(data, what)
        got = make_version(stat)
        self._remember(key, got, value)
        return Versioned(value.project(fields), got)

    def _make_watch(self, key: str, watcher: Watcher) -> Callable[[Any], None]:
        loop = asyncio.get_running_loop()
        store = self._store
        table = self.name

        def deliver(kind: EventType) -> None:
            if store.closed:
                return
            try:
                watcher(WatchEvent(table, key, kind))
            except Exception:
                log.exception("metastore watcher on %s/%r raised", table, key)

        def on_event(event: Any) -> None:  # kazoo's callback thread
            # DELETED -> REMOVED; CHANGED -> CHANGED; NONE (session lost, the watch is
            # gone and the key may have changed unseen) -> CHANGED, so the caller re-reads.
            kind = EventType.REMOVED if event.type == KazooEventType.DELETED else EventType.CHANGED
            try:
                loop.call_soon_threadsafe(deliver, kind)
            except RuntimeError:
                log.debug("watch on %s/%r fired after its event loop closed", table, key)

        return on_event

    async def put(self, key: str, value: Value, version: Version) -> Version:
        self._check_open()
        key = check_key(key)
        value = check_value(value)
        version = check_version(version)
        if version == Version.NEW:
            return await self._create(self._store._conn, key, value)
        conn = self._store._conn
        path = self._key_path(key)
        what = self._desc(key)
        deadline = conn.deadline()
        cached = self._records.get(key)
        if cached is not None and version != Version.ANY and cached[0] == version:
            merged = cached[1].merged(value)
            data = encode_record(merged)
            self._check_size(path, data, key)
            try:
                new_stat = await conn.call("set_async", path, data, version=split_version(version)[1],
                                           what=what, deadline=deadline)
            except (BadVersionError, NoKeyError):
                self._records.pop(key, None)
                raise
            new_version = make_version(new_stat)
            self._remember(key, new_version, merged)
            return new_version

        async def step() -> Version:
            current, stat = await self._read(key, deadline)
            if version != Version.ANY and not _stat_matches(stat, version):
                raise BadVersionError(f"{what}: expected {version!r}, found {make_version(stat)!r}")
            merged = current.merged(value)
            data = encode_record(merged)
            self._check_size(path, data, key)
            new_stat = await conn.call("set_async", path, data, version=stat.version, what=what,
                                       deadline=deadline)  # BadVersionError: lost a race
            new_version = make_version(new_stat)
            self._remember(key, new_version, merged)
            return new_version

        if version != Version.ANY:
            return await step()
        try:  # read again and re-merge after a lost race
            return await cas_retry(step, attempts=ANY_ATTEMPTS, retry_on=(BadVersionError,))
        except BadVersionError:
            raise ServiceDownError(f"{what}: gave up after {ANY_ATTEMPTS} contended updates") from None

    async def remove(self, key: str, version: Version) -> None:
        self._check_open()
        key = check_key(key)
        version = check_version(version)
        self._records.pop(key, None)
        conn = self._store._conn
        path = self._key_path(key)
        what = self._desc(key)
        deadline = conn.deadline()
        if version == Version.ANY:
            await conn.call("delete_async", path, version=-1, what=what, deadline=deadline)
            return
        stat = await conn.call("exists_async", path, what=what, deadline=deadline, retry=True)
        if stat is None:
            raise NoKeyError(what)
        if version == Version.NEW or not _stat_matches(stat, version):
            raise BadVersionError(f"{what}: expected {version!r}, found {make_version(stat)!r}")
        await conn.call("delete_async", path, version=stat.version, what=what, deadline=deadline)

    async def _list_keys(self) -> list[str]:
        try:
            names = await self._store._conn.call("get_children_async", self.path,
                                                 what=f"table {self.name}", retry=True)
        except NoKeyError:
            return []
        return sorted(unescape_name(n) for n in names)

    async def open_cursor(self, fields: Fields = ALL_FIELDS) -> MetastoreCursor:
        self._check_open()
        fields = check_fields(fields)
        return ZooKeeperCursor(self, await self._list_keys(), fields)

    async def _fetch(self, keys: list[str], fields: Fields) -> list[tuple[str, Versioned]]:
        """Read ``keys`` concurrently; keys removed since they were listed are skipped."""
        conn = self._store._conn
        deadline = conn.deadline()
        want_data = fields is ALL_FIELDS or bool(fields)

        async def one(key: str) -> tuple[str, Versioned] | None:
            path = self._key_path(key)
            what = self._desc(key)
            if not want_data:
                stat = await conn.call("exists_async", path, what=what, deadline=deadline, retry=True)
                return None if stat is None else (key, Versioned(Value(), make_version(stat)))
            try:
                data, stat = await conn.call("get_async", path, what=what, deadline=deadline, retry=True)
            except NoKeyError:
                return None
            return key, Versioned(decode_record(data, what).project(fields), make_version(stat))

        results = await asyncio.gather(*(one(k) for k in keys))
        return [r for r in results if r is not None]


class ZooKeeperScannableTable(ZooKeeperTable, MetastoreScannableTable):
    """Keys are listed and sorted client-side (Python ``str`` order), then read lazily."""

    async def open_cursor_range(self, first_key: str, first_inclusive: bool, last_key: str,
                                last_inclusive: bool, order: Order = Order.ASC,
                                fields: Fields = ALL_FIELDS) -> MetastoreCursor:
        self._check_open()
        check_range(first_key, last_key, order)
        fields = check_fields(fields)
        keys = [k for k in await self._list_keys()
                if in_range(k, first_key, bool(first_inclusive), last_key, bool(last_inclusive), order)]
        if order is Order.DESC:
            keys.reverse()
        return ZooKeeperCursor(self, keys, fields)


class ZooKeeperCursor(MetastoreCursor):
    """Walks a key list taken when the cursor was opened, reading records in batches on demand."""

    def __init__(self, table: ZooKeeperTable, keys: list[str], fields: Fields) -> None:
        self._table = table
        self._keys = keys
        self._pos = 0
        self._fields = fields

    def has_more(self) -> bool:
        self._check_open()
        return self._pos < len(self._keys)

    async def read_entries(self, n: int) -> list[tuple[str, Versioned]]:
        self._check_open()
        self._table._check_open()
        if not isinstance(n, int) or n <= 0:
            raise IllegalOpError("read_entries needs n > 0")
        out: list[tuple[str, Versioned]] = []
        while len(out) < n and self._pos < len(self._keys):
            take = min(n - len(out), _CURSOR_BATCH)
            batch = self._keys[self._pos:self._pos + take]
            got = await self._table._fetch(batch, self._fields)
            self._check_open()
            self._pos += len(batch)
            out.extend(got)
        return out

    async def close(self) -> None:
        self._closed = True
        self._keys = []


# -- sessions ---------------------------------------------------------------------------------------


class ZooKeeperSession(Session):
    """A ZooKeeper session of its own; ``put_ephemeral`` creates ``EPHEMERAL`` znodes in it."""

    def __init__(self, store: ZooKeeperMetaStore, conn: _Conn, timeout: float) -> None:
        self._store = store
        self._conn = conn
        self.timeout = timeout
        sid, _ = conn.client.client_id or (0, b"")
        self._zk_session = int(sid)
        self.session_id = f"{sid:#x}"
        self._closed = False
        self._lost = False
        self._suspended_at: float | None = None
        self._owned: dict[tuple[str, str], tuple[ZooKeeperTable, Version]] = {}
        conn.client.add_listener(self._on_state)

    def _on_state(self, state: str) -> None:  # kazoo's connection thread
        if self._closed:
            return
        if state == KazooState.SUSPENDED:
            if self._suspended_at is None:
                self._suspended_at = time.monotonic()
        elif state == KazooState.CONNECTED:
            self._check_suspension()
            self._suspended_at = None
        elif state == KazooState.LOST:
            self._mark_lost("expired")

    def _mark_lost(self, why: str) -> None:
        if not self._lost:
            self._lost = True
            log.warning("ZooKeeper session %s %s; treat its ephemeral keys as gone", self.session_id, why)

    def _check_suspension(self) -> None:
        since = self._suspended_at
        if since is not None and time.monotonic() - since >= self.timeout:
            self._mark_lost(f"was disconnected for over its {self.timeout:.1f} s timeout")

    @property
    def alive(self) -> bool:
        """False once closed, expired, or disconnected for longer than ``timeout`` (never again True)."""
        if self._closed or self._store.closed:
            return False
        self._check_suspension()
        if self._lost:
            return False
        cid = self._conn.client.client_id
        return cid is None or int(cid[0]) == self._zk_session

    async def put_ephemeral(self, table: MetastoreTable, key: str, value: Value) -> Version:
        if not isinstance(table, ZooKeeperTable) or table._store is not self._store:
            raise IllegalOpError("put_ephemeral needs a table of the session's own store")
        table._check_open()
        key = check_key(key)
        value = check_value(value)
        if not self.alive:
            raise IllegalOpError(f"session {self.session_id} is not alive")
        version = await table._create(self._conn, key, value, ephemeral=True)
        self._owned[(table.name, key)] = (table, version)
        return version

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        client = self._conn.client
        if self._owned and not client.connected and client.state != KazooState.LOST:
            # Disconnected but maybe not expired: give the session up to its timeout to come
            # back, so its keys go now rather than whenever the server expires it.
            try:
                await _wait_connected(client, _Deadline(min(self.timeout, self._conn.operation_timeout)),
                                      f"close session {self.session_id}")
            except ServiceDownError:
                log.info("session %s closed while disconnected; ZooKeeper will expire its keys",
                         self.session_id)
        if client.connected:  # also when deemed lost: the owner check below is exact
            deadline = _Deadline(min(self._conn.operation_timeout, 5.0))
            for (_, key), (table, _v) in list(self._owned.items()):
                path = table._key_path(key)
                try:
                    stat = await self._conn.call("exists_async", path, what=path, deadline=deadline)
                    if stat is not None and int(stat.ephemeralOwner) == self._zk_session:
                        await self._conn.call("delete_async", path, version=-1, what=path,
                                              deadline=deadline)
                except MetastoreError as exc:
                    log.debug("session %s: could not remove %s: %s", self.session_id, path, exc)
        self._owned.clear()
        self._conn.client.remove_listener(self._on_state)
        await _stop_client(self._conn.client)  # ends the ZooKeeper session: the server drops the rest
        self._store._sessions.discard(self)


def _session_timeout(timeout: object) -> float:
    """``session(timeout)`` as seconds; ``IllegalOpError`` unless a positive, finite number."""
    try:
        seconds = float(timeout)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        seconds = math.nan
    if not (seconds > 0 and math.isfinite(seconds)):
        raise IllegalOpError(f"session timeout must be a positive number of seconds, got {timeout!r}")
    return seconds


# -- the store --------------------------------------------------------------------------------------


class ZooKeeperMetaStore(MetaStore):
    """MetaStore on ZooKeeper; see the module docstring."""

    name = "zookeeper"
    version = 1

    def __init__(self, uri: str, hosts: str, prefix: str, conn: _Conn, *, zk_timeout: float,
                 connect_timeout: float, jute_maxbuffer: int) -> None:
        self.uri = uri
        self.hosts = hosts
        self.prefix = prefix
        self._conn = conn
        self.zk_timeout = zk_timeout
        self.connect_timeout = connect_timeout
        self.jute_maxbuffer = jute_maxbuffer
        self._tables: dict[str, ZooKeeperTable] = {}
        self._sessions: set[ZooKeeperSession] = set()

    @property
    def operation_timeout(self) -> float:
        return self._conn.operation_timeout

    @classmethod
    async def open(cls, uri: str, **conf: Any) -> ZooKeeperMetaStore:
        hosts, prefix, query = parse_uri(uri)
        opts = store_options(ZooKeeperOptions, query, conf, source="zookeeper metastore options")
        client = _new_client(hosts, opts.zk_timeout)
        await _start_client(client, hosts, opts.connect_timeout)
        store = cls(uri, hosts, prefix, _Conn(client, opts.operation_timeout), zk_timeout=opts.zk_timeout,
                    connect_timeout=opts.connect_timeout, jute_maxbuffer=opts.jute_maxbuffer)
        try:
            await store._conn.call("ensure_path_async", prefix, what=f"prefix {prefix}", retry=True)
        except BaseException:
            await _stop_client(client)
            raise
        log.debug("opened ZooKeeper metastore %s (prefix %s, session %#x)", hosts, prefix,
                  (client.client_id or (0,))[0])
        return store

    def _check_name(self, name: object) -> str:
        self._check_open()
        if not isinstance(name, str) or not name:
            raise IllegalOpError("table name must be a non-empty str")
        return name

    async def _table(self, name: str, cls: type[ZooKeeperTable]) -> ZooKeeperTable:
        t = self._tables.get(name)
        if t is not None and isinstance(t, cls) and not t.closed:
            return t
        t = cls(self, name)
        await t._ensure_table_node(self._conn.deadline())
        self._tables[name] = t
        return t

    async def create_table(self, name: str) -> MetastoreTable:
        name = self._check_name(name)
        return await self._table(name, ZooKeeperTable)

    async def create_scannable_table(self, name: str) -> MetastoreScannableTable:
        name = self._check_name(name)
        t = await self._table(name, ZooKeeperScannableTable)
        assert isinstance(t, ZooKeeperScannableTable)
        return t

    async def session(self, timeout: float | None = None) -> Session:
        self._check_open()
        seconds = self.zk_timeout if timeout is None else _session_timeout(timeout)
        client = _new_client(self.hosts, seconds)
        await _start_client(client, self.hosts, self.connect_timeout)
        sess = ZooKeeperSession(self, _Conn(client, self.operation_timeout), seconds)
        self._sessions.add(sess)
        log.debug("opened ZooKeeper session %s (timeout %.1f s)", sess.session_id, seconds)
        return sess

    async def close(self) -> None:
        if self._closed:
            return
        for sess in list(self._sessions):
            try:
                await sess.close()
            except Exception:
                log.debug("closing session %s failed", sess.session_id, exc_info=True)
        for t in self._tables.values():
            await t.close()
        self._closed = True
        await _stop_client(self._conn.client)

    def __repr__(self) -> str:
        return f"ZooKeeperMetaStore({self.hosts!r}, prefix={self.prefix!r})"
