"""ZooKeeper backend specifics, against a real server (the generic contract is the conformance kit)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from kazoo.client import KazooClient

from metastore import ALL_FIELDS, EventType, Order, Value, Version, WatchEvent, open_metastore
from metastore.backends.zookeeper import (
    DEFAULT_PREFIX,
    ZooKeeperMetaStore,
    escape_name,
    parse_uri,
    split_version,
    unescape_name,
)
from metastore.errors import (
    BadVersionError,
    IllegalOpError,
    KeyExistsError,
    NoKeyError,
    ServiceDownError,
)
from metastore.proto.metastore_pb2 import Record
from tests.fixtures.cycles import cyclic_garbage
from tools.zookeeper import ZooKeeperServer, free_port

pytestmark = [pytest.mark.zookeeper, pytest.mark.timeout(60)]

WAIT = 15.0
T = TypeVar("T")

ODD_KEYS = ["a/b", "/", "//x//", "\x00", "a\x00b", ".", "..", "...", "zookeeper", "sp ace", "ü日本🙂",
            "%", "%2F", "%2E", "a%b", "\ud800", "\U0010ffff", "\x7f\x9f\ufff0", "tab\tnl\n",
            "host:3181", "k" * 10_000]


async def _after_reconnection(call: Callable[[], Awaitable[T]], timeout: float = WAIT) -> T:
    """``await call()`` once the store reconnected: each try is bounded by the store's operation_timeout,
    and a restarted ZooKeeper may take longer than that to accept the session again (a CI flake)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call()
        except ServiceDownError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)   # an external server, polled with a deadline


def _zk(uri: str) -> tuple[KazooClient, str]:
    hosts, prefix, _ = parse_uri(uri)
    client = KazooClient(hosts=hosts, timeout=5.0)
    client.start(timeout=5.0)
    return client, prefix


# --------------------------------------------------------------------------- URI, config, names


@pytest.mark.parametrize("uri, hosts, prefix", [
    ("zk://127.0.0.1:2181/quire", "127.0.0.1:2181", "/quire"),
    ("zk://h1:1,h2:2,h3:3/a/b/", "h1:1,h2:2,h3:3", "/a/b"),
    ("zk://h1:1", "h1:1", DEFAULT_PREFIX),
    ("zk://h1:1/", "h1:1", DEFAULT_PREFIX),
    ("zk://h1/p", "h1:2181", "/p"),
    ("ZOOKEEPER://[::1]:2182/p", "[::1]:2182", "/p"),
    ("zk://h:5/p?zk_timeout=3", "h:5", "/p"),
])
def test_parse_uri(uri: str, hosts: str, prefix: str) -> None:
    got_hosts, got_prefix, _ = parse_uri(uri)
    assert (got_hosts, got_prefix) == (hosts, prefix)


@pytest.mark.parametrize("uri", [
    "zk://", "zk:///quire", "zk://h:notaport/p", "zk://h:0/p", "zk://h:70000/p", "zk://h:/p",
    "zk://,h:1/p", "zk://h:1,/p", "zk://h:1/a//b", "zk://h:1/a/../b", "zk://h:1/./b",
    "zk://h:1/zookeeper", "zk://h:1/p\x01", "zk://user@h:1/p", "zk://[::1/p", "zk://h:1:2/p",
    "zk://h:1/p#frag", "zkx://h:1/p", "zk:/h:1/p", "h:1/p",
])
async def test_malformed_uri_is_illegal(uri: str) -> None:
    with pytest.raises(IllegalOpError):
        await ZooKeeperMetaStore.open(uri)


@pytest.mark.parametrize("conf", [
    {"zk_timeout": "abc"}, {"zk_timeout": -1}, {"connect_timeout": "0"}, {"operation_timeout": None},
    {"zk_timeout": float("nan")},
])
async def test_bad_conf_is_illegal(conf: dict[str, object]) -> None:
    with pytest.raises(IllegalOpError):
        await ZooKeeperMetaStore.open("zk://127.0.0.1:1/p", **conf)


async def test_conf_accepts_strings_and_query(zk_uri: str) -> None:
    ms = await open_metastore(zk_uri + "?operation_timeout=7", zk_timeout="3.5", connect_timeout="4")
    try:
        assert isinstance(ms, ZooKeeperMetaStore)
        assert (ms.zk_timeout, ms.connect_timeout, ms.operation_timeout) == (3.5, 4.0, 7.0)
        assert ms.name == "zookeeper"
    finally:
        await ms.close()


async def test_a_refused_create_leaves_no_frames_in_cycles(zk_uri: str) -> None:
    """Issue 35: each refused create (a bookie's auditor election, once a second) kept its frames, with
    their locals, in a cycle through the kazoo exception's traceback until a cyclic collection."""
    import gc

    ms = await open_metastore(zk_uri)
    try:
        t = await ms.create_table("t")
        await t.put("k", Value({"v": b"1"}), Version.NEW)
        gc.collect()
        gc.disable()
        try:
            for _ in range(10):
                with pytest.raises(KeyExistsError):
                    await t.put("k", Value({"v": b"2"}), Version.NEW)
            frames = [o for o in cyclic_garbage() if type(o).__name__ in ("frame", "traceback")]
        finally:
            gc.enable()
        assert frames == [], f"{len(frames)} frames and tracebacks in cycles after 10 refused creates"
        assert (await t.get("k")).value == {"v": b"1"}
    finally:
        await ms.close()


def test_escape_is_reversible_and_legal() -> None:
    for key in ODD_KEYS:
        name = escape_name(key)
        assert unescape_name(name) == key, repr(key)
        assert name and "/" not in name and name not in (".", "..")
        assert all(0x20 < ord(c) < 0x7F for c in name), repr(name)
    assert escape_name("host:3181") == "host:3181"  # common keys stay readable
    assert len({escape_name(k) for k in ODD_KEYS}) == len(ODD_KEYS)
    assert escape_name("%") == "%25" and escape_name("..") == "%2E%2E"


# --------------------------------------------------------------------------- connecting


async def test_unreachable_server_is_service_down_in_time() -> None:
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(ServiceDownError):
        await open_metastore(f"zk://127.0.0.1:{port}/quire", connect_timeout=1.0)
    assert time.monotonic() - t0 < 4.0


async def test_prefix_and_layout(zk_uri: str) -> None:
    """A table is <prefix>/<table>, a key a child znode with a protobuf Record."""
    ms = await open_metastore(zk_uri)
    client, prefix = _zk(zk_uri)
    try:
        t = await ms.create_table("my table")
        assert client.exists(f"{prefix}/my%20table") is not None
        v = await t.put("a/b", Value({"f": b"1"}), Version.NEW)
        data, stat = client.get(f"{prefix}/my%20table/a%2Fb")
        assert dict(Record.FromString(data).fields) == {"f": b"1"}
        assert split_version(v) == (stat.czxid, stat.version)
        assert client.get_children(f"{prefix}/my%20table") == ["a%2Fb"]
    finally:
        client.stop()
        client.close()
        await ms.close()


# --------------------------------------------------------------------------- keys, versions, sizes


async def test_odd_keys_round_trip_and_sort(zk_uri: str) -> None:
    ms = await open_metastore(zk_uri)
    try:
        t = await ms.create_scannable_table("odd")
        await asyncio.gather(*(t.put(k, Value({"k": k.encode("utf-8", "surrogatepass")}), Version.NEW)
                               for k in ODD_KEYS))
        for k in ODD_KEYS:
            assert (await t.get(k)).value == {"k": k.encode("utf-8", "surrogatepass")}, repr(k)
        cur = await t.open_cursor_range("", True, "", True, Order.ASC, fields=set())
        listed = [k for k, _ in await cur.read_entries(1000)]
        assert listed == sorted(ODD_KEYS)
        with pytest.raises(IllegalOpError):  # inverted for DESC
            await t.open_cursor_range("/", False, "a\x00b", True, Order.DESC)
        cur = await t.open_cursor_range("a\x00b", True, "/", False, Order.DESC)
        listed = [k for k, _ in await cur.read_entries(1000)]
        assert listed == [k for k in sorted(ODD_KEYS, reverse=True) if "/" < k <= "a\x00b"]
        assert listed  # the case is not vacuous
    finally:
        await ms.close()


async def test_versions_see_delete_and_recreate(zk_uri: str) -> None:
    """Same znode version after re-create, but the old version must not match (czxid differs)."""
    ms = await open_metastore(zk_uri)
    try:
        t = await ms.create_table("t")
        v1 = await t.put("k", Value({"a": b"1"}), Version.NEW)
        await t.remove("k", v1)
        v2 = await t.put("k", Value({"a": b"2"}), Version.NEW)
        assert split_version(v1)[1] == split_version(v2)[1] == 0
        assert v1 < v2
        with pytest.raises(BadVersionError):
            await t.put("k", Value({"a": b"3"}), v1)
        with pytest.raises(BadVersionError):
            await t.remove("k", v1)
        with pytest.raises(BadVersionError):
            await t.put("k", Value({"a": b"3"}), Version(12345))
        assert (await t.get("k")).version == v2
    finally:
        await ms.close()


async def test_concurrent_any_puts_all_merge(zk_uri: str) -> None:
    """Version.ANY re-reads and re-merges on a lost race: no field is lost."""
    ms = await open_metastore(zk_uri)
    other = await open_metastore(zk_uri)
    try:
        t = await ms.create_table("t")
        t2 = await other.create_table("t")
        await t.put("k", Value(), Version.NEW)
        await asyncio.gather(*((t if i % 2 else t2).put("k", Value({f"f{i}": b"x"}), Version.ANY)
                               for i in range(30)))
        assert (await t.get("k")).value == {f"f{i}": b"x" for i in range(30)}
    finally:
        await other.close()
        await ms.close()


async def test_oversized_value_is_illegal_and_store_keeps_working(zk_uri: str) -> None:
    ms = await open_metastore(zk_uri)
    try:
        t = await ms.create_table("big")
        near = b"n" * 1_000_000
        v = await t.put("near", Value({"v": near}), Version.NEW)  # under jute.maxbuffer: fine
        with pytest.raises(IllegalOpError):
            await t.put("over", Value({"v": b"x" * (1 << 20)}), Version.NEW)
        # an update whose merged record would be too large is refused too, and changes nothing
        with pytest.raises(IllegalOpError):
            await t.put("near", Value({"w": b"w" * 100_000}), Version.ANY)
        with pytest.raises(IllegalOpError):
            await t.put("near", Value({"w": b"w" * 100_000}), v)
        got = await t.get("near")
        assert got.version == v and got.value == {"v": near}
        with pytest.raises(NoKeyError):
            await t.get("over")
        assert await t.put("small", Value({"v": b"1"}), Version.NEW)
        assert (await t.get("small")).value == {"v": b"1"}
    finally:
        await ms.close()


# --------------------------------------------------------------------------- cursors


async def test_cursor_skips_keys_removed_after_open(zk_uri: str) -> None:
    ms = await open_metastore(zk_uri)
    try:
        t = await ms.create_scannable_table("s")
        keys = [f"{i:03d}" for i in range(50)]
        await asyncio.gather(*(t.put(k, Value({"a": k.encode()}), Version.NEW) for k in keys))
        cur = await t.open_cursor_range("", True, "", True, Order.DESC, fields=ALL_FIELDS)
        first = await cur.read_entries(5)
        assert [k for k, _ in first] == keys[::-1][:5]
        await asyncio.gather(*(t.remove(k, Version.ANY) for k in keys[:40]))
        rest = []
        while cur.has_more():
            rest.extend(await cur.read_entries(7))
        assert [k for k, _ in rest] == keys[::-1][5:10]
        assert all(v.value == {"a": k.encode()} for k, v in rest)
        await cur.close()
        with pytest.raises(IllegalOpError):
            await cur.read_entries(1)
    finally:
        await ms.close()


# --------------------------------------------------------------------------- server restarts


async def test_server_restart_under_open_store(zk_server_private: ZooKeeperServer) -> None:
    zk = zk_server_private
    ms = await open_metastore(f"zk://{zk.connect_string}/r", operation_timeout=2.0)
    try:
        t = await ms.create_table("t")
        v1 = await t.put("k", Value({"a": b"1"}), Version.NEW)
        await asyncio.to_thread(zk.restart)
        got = await _after_reconnection(lambda: t.get("k"))  # resumes after the reconnection
        assert got is not None and got.value == {"a": b"1"} and got.version == v1
        v2 = await t.put("k", Value({"b": b"2"}), v1)
        assert v1 < v2

        await asyncio.to_thread(zk.stop)
        t0 = time.monotonic()
        with pytest.raises(ServiceDownError):
            await t.get("k")
        with pytest.raises(ServiceDownError):
            await t.put("k", Value({"c": b"3"}), v2)
        with pytest.raises(ServiceDownError):
            await (await t.open_cursor()).read_entries(1)
        assert time.monotonic() - t0 < 3 * 2.0 + 3.0  # bounded by operation_timeout, no hang

        await asyncio.to_thread(zk.start)
        got = await _after_reconnection(lambda: t.get("k"))
        assert got is not None and got.value == {"a": b"1", "b": b"2"} and got.version == v2  # nothing half-applied
        v3 = await t.put("k", Value({"c": b"3"}), v2)
        assert v2 < v3
    finally:
        await ms.close()


async def test_service_down_after_kill_then_resume(zk_server_private: ZooKeeperServer) -> None:
    zk = zk_server_private
    ms = await open_metastore(f"zk://{zk.connect_string}/r", operation_timeout=1.0)
    try:
        t = await ms.create_table("t")
        await t.put("k", Value({"a": b"1"}), Version.NEW)
        await asyncio.to_thread(zk.kill)
        with pytest.raises(ServiceDownError):
            await t.put("k2", Value({"a": b"1"}), Version.NEW)
        await asyncio.to_thread(zk.start)
        # kazoo reconnects with its own backoff, which may exceed one 1 s operation timeout:
        # the store must answer again within WAIT, each attempt failing cleanly until then
        deadline = asyncio.get_running_loop().time() + WAIT
        while True:
            try:
                got = await asyncio.wait_for(t.get("k"), WAIT)
                break
            except ServiceDownError:
                if asyncio.get_running_loop().time() > deadline:
                    raise
        assert got.value == {"a": b"1"}
    finally:
        await ms.close()


# --------------------------------------------------------------------------- watches


async def test_watch_is_delivered_on_the_loop(zk_uri: str) -> None:
    ms = await open_metastore(zk_uri)
    other = await open_metastore(zk_uri)
    try:
        t = await ms.create_table("w")
        t2 = await other.create_table("w")
        await t.put("k", Value({"a": b"1"}), Version.NEW)
        loop = asyncio.get_running_loop()
        seen: list[tuple[WatchEvent, int, asyncio.AbstractEventLoop]] = []
        fired = asyncio.Event()

        def cb(ev: WatchEvent) -> None:
            seen.append((ev, threading.get_ident(), asyncio.get_running_loop()))
            fired.set()

        got = await t.get("k", fields=set(), watcher=cb)
        assert got.value == {}
        await t2.put("k", Value({"a": b"2"}), Version.ANY)
        await asyncio.wait_for(fired.wait(), WAIT)
        ev, ident, ev_loop = seen[0]
        assert ev == WatchEvent("w", "k", EventType.CHANGED)
        assert ident == threading.get_ident() and ev_loop is loop
        await t2.put("k", Value({"a": b"3"}), Version.ANY)  # one-shot: no second event
        fired.clear()
        await t.get("k", watcher=cb)
        await t2.remove("k", Version.ANY)
        await asyncio.wait_for(fired.wait(), WAIT)
        assert [e.type for e, _, _ in seen] == [EventType.CHANGED, EventType.REMOVED]
        with pytest.raises(NoKeyError):
            await t.get("k", watcher=cb)
    finally:
        await other.close()
        await ms.close()


# --------------------------------------------------------------------------- sessions


async def test_session_ephemerals_are_zookeeper_ephemerals(zk_uri: str) -> None:
    ms = await open_metastore(zk_uri)
    client, prefix = _zk(zk_uri)
    try:
        t = await ms.create_table("owners")
        sess = await ms.session(timeout=3.0)
        assert sess.alive and sess.timeout == 3.0
        v = await sess.put_ephemeral(t, "topic/a", Value({"hub": b"h1"}))
        stat = client.exists(f"{prefix}/owners/topic%2Fa")
        assert stat is not None and stat.ephemeralOwner == int(sess.session_id, 16)
        with pytest.raises(KeyExistsError):
            await sess.put_ephemeral(t, "topic/a", Value({"hub": b"h2"}))
        # the owner may update it through the table with CAS (e.g. load reports)
        v2 = await t.put("topic/a", Value({"load": b"1"}), v)
        assert (await t.get("topic/a")).version == v2
        await sess.close()
        assert not sess.alive
        with pytest.raises(NoKeyError):
            await t.get("topic/a")
        with pytest.raises(IllegalOpError):
            await sess.put_ephemeral(t, "topic/b", Value({"hub": b"h1"}))
        with pytest.raises(IllegalOpError):
            not_a_table: Any = object()
            await (await ms.session()).put_ephemeral(not_a_table, "x", Value())
    finally:
        client.stop()
        client.close()
        await ms.close()


async def test_closing_the_store_ends_its_sessions(zk_uri: str) -> None:
    ms = await open_metastore(zk_uri)
    owner = await open_metastore(zk_uri)
    try:
        t = await ms.create_table("t")
        sess = await owner.session()
        await sess.put_ephemeral(await owner.create_table("t"), "e", Value({"a": b"1"}))
        assert (await t.get("e")).value == {"a": b"1"}
        await owner.close()
        assert not sess.alive
        with pytest.raises(NoKeyError):
            await t.get("e")
    finally:
        await owner.close()
        await ms.close()


async def put_once_reconnected(t: Any, key: str) -> None:
    """``put`` after a server restart: each try waits ``operation_timeout`` for the reconnection (with its
    backoff after refused connects, a loaded machine can take longer than one) and raises
    ``ServiceDownError`` before sending anything; the caller bounds the whole wait."""
    while True:
        try:
            await t.put(key, Value({"a": b"1"}), Version.NEW)
            return
        except ServiceDownError:
            continue


async def test_session_dies_when_disconnected_past_its_timeout(zk_server_private: ZooKeeperServer) -> None:
    zk = zk_server_private
    ms = await open_metastore(f"zk://{zk.connect_string}/r", operation_timeout=2.0)
    try:
        t = await ms.create_table("t")
        sess = await ms.session(timeout=1.0)
        await sess.put_ephemeral(t, "e", Value({"a": b"1"}))
        await asyncio.to_thread(zk.stop)
        deadline = time.monotonic() + WAIT
        while sess.alive:
            assert time.monotonic() < deadline, "session still alive long after its timeout"
            await asyncio.sleep(0.05)
        await asyncio.to_thread(zk.start)
        assert not sess.alive  # never resurrects
        with pytest.raises(IllegalOpError):
            await sess.put_ephemeral(t, "e2", Value({"a": b"1"}))
        await asyncio.wait_for(put_once_reconnected(t, "k"), WAIT)  # the store works again
        await sess.close()
        # gone: deleted by close when the session came back in time, else expired by the server
        deadline = time.monotonic() + WAIT
        while True:
            try:
                await t.get("e", fields=set())
            except NoKeyError:
                break
            assert time.monotonic() < deadline, "ephemeral key outlived its closed session"
            await asyncio.sleep(0.05)
    finally:
        await ms.close()


_HOLDER = textwrap.dedent("""
    import asyncio, sys
    from metastore import open_metastore, Value
    async def main():
        ms = await open_metastore(sys.argv[1], zk_timeout=1.0)
        t = await ms.create_table("live")
        s = await ms.session(timeout=1.0)
        await s.put_ephemeral(t, "holder", Value({"pid": str(__import__("os").getpid()).encode()}))
        print("ready", flush=True)
        await asyncio.sleep(120)
    asyncio.run(main())
""")


async def test_ephemeral_vanishes_when_holder_is_sigkilled(zk_uri: str) -> None:
    ms = await open_metastore(zk_uri)
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, zk_uri], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), WAIT)
        if line.strip() != "ready":
            pytest.fail(f"holder did not get ready: {line!r}\n{proc.stderr.read() if proc.stderr else ''}")
        t = await ms.create_table("live")
        assert (await t.get("holder")).value == {"pid": str(proc.pid).encode()}
        os.kill(proc.pid, signal.SIGKILL)
        await asyncio.to_thread(proc.wait, WAIT)
        killed = time.monotonic()
        deadline = killed + WAIT
        while True:
            try:
                await t.get("holder", fields=set())
            except NoKeyError:
                break
            assert time.monotonic() < deadline, "ephemeral key outlived its owner's session"
            await asyncio.sleep(0.05)
        assert time.monotonic() - killed < 6.0  # session timeout 1 s, expiry checked every tick
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=WAIT)
        await ms.close()


# --------------------------------------------------------------------------- lifecycle


async def test_everything_after_close_is_illegal(zk_uri: str) -> None:
    ms = await open_metastore(zk_uri)
    t = await ms.create_scannable_table("t")
    await t.put("k", Value({"a": b"1"}), Version.NEW)
    cur = await t.open_cursor()
    await ms.close()
    await ms.close()  # idempotent
    for call in (lambda: t.get("k"), lambda: t.put("k", Value(), Version.ANY),
                 lambda: t.remove("k", Version.ANY), lambda: t.open_cursor(),
                 lambda: t.open_cursor_range("", True, "", True), lambda: cur.read_entries(1),
                 lambda: ms.create_table("x"), lambda: ms.create_scannable_table("x"),
                 lambda: ms.session()):
        with pytest.raises(IllegalOpError):
            await call()
