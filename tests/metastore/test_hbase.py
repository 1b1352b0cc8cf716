"""hbase backend specifics: URIs, table names, the storage layout, gateway failures, limits, processes.

Runs against the emulator (a test double) or a real gateway named by
``QUIRE_HBASE_THRIFT``; tests that stop or restart the gateway use an
emulator of their own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import socket
import struct
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import happybase
import pytest

from metastore import Order, Value, Version, open_metastore
from metastore.api import MetaStore
from metastore.backends import hbase as hb
from metastore.backends.hbase import HBaseMetaStore, hbase_table_name, parse_uri
from metastore.errors import BadVersionError, IllegalOpError, KeyExistsError, NoKeyError, ServiceDownError
from metastore.testing.children import child, readline, reap
from metastore.testing.hbase_thrift_emulator import HBaseThriftEmulator

H: Any = hb.Hbase_thrift
log = logging.getLogger(__name__)
WAIT = 30.0


def _address(uri: str) -> tuple[str, int, str]:
    host, port, prefix, _ = parse_uri(uri)
    return host, port, prefix


@pytest.fixture
async def ms(hbase_uri: str) -> AsyncIterator[MetaStore]:
    store = await open_metastore(hbase_uri)
    yield store
    await store.close()


@pytest.fixture
def raw(hbase_uri: str) -> Iterator[Any]:
    """A plain happybase connection to the same gateway, to look at the stored layout."""
    host, port, _ = _address(hbase_uri)
    conn = happybase.Connection(host, port, timeout=5000)
    yield conn
    conn.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


# --------------------------------------------------------------------------- URIs and names


@pytest.mark.parametrize("uri", [
    "hbase://",
    "hbase:///prefix",
    "hbase://host:notaport/p",
    "hbase://host:99999/p",
    "hbase://host:0/p",
    "hbase://host:9090/a/b",
    "hbase://host:9090/has_underscore",
    "hbase://host:9090/-dash-first",
    "hbase://user:pw@host:9090/p",
    "hbase://host:9090/p#frag",
    "hbase:host:9090/p",
    "zk://host:9090/p",
])
async def test_malformed_uri_is_illegal(uri: str) -> None:
    with pytest.raises(IllegalOpError):
        await HBaseMetaStore.open(uri)


@pytest.mark.parametrize(("conf", "match"), [
    ({"timeout": "soon"}, "timeout"),
    ({"timeout": "0"}, "positive"),
    ({"pool_size": "0"}, "positive"),
    ({"transport": "pigeon"}, "transport"),
    ({"protocol": "json"}, "protocol"),
])
async def test_bad_option_is_illegal(conf: dict[str, str], match: str) -> None:
    with pytest.raises(IllegalOpError, match=match):
        await open_metastore("hbase://127.0.0.1:1/p", **conf)


def test_uri_defaults_and_query_options() -> None:
    assert parse_uri("hbase://gw") == ("gw", 9090, "quire", {})
    assert parse_uri("hbase://gw:9091/") == ("gw", 9091, "quire", {})
    assert parse_uri("hbase://gw:1/q.1-x?timeout=2&pool_size=8") == (
        "gw", 1, "q.1-x", {"timeout": "2", "pool_size": "8"})
    assert parse_uri("HBASE://[::1]:9090/p")[:2] == ("::1", 9090)


def test_table_names_are_legal_and_distinct() -> None:
    names = ["ledgers", "topic_owners", "__sessions", "a-", "a-2d", "a/b", "a.b", "a b", "ü", "日本",
             "\x00", "-", ".", "a" * 50, "\ud800"]
    hnames = [hbase_table_name("qp", n) for n in names]
    assert len(set(hnames)) == len(names)
    for h in hnames:
        assert re.fullmatch(rb"qp_[A-Za-z0-9_.\-]+", h), h
    assert hbase_table_name("qp", "topic_owners") == b"qp_topic_owners"
    assert hbase_table_name("qp", "a-/") == b"qp_a-2d-2f"


async def test_each_table_is_an_hbase_table_with_families_f_and_m(ms: MetaStore, hbase_uri: str,
                                                                  raw: Any) -> None:
    prefix = _address(hbase_uri)[2]
    for name in ("ledgers", "a/b", "ü"):
        await ms.create_table(name)
    await ms.create_scannable_table("ledgers")
    tables = set(raw.tables())
    for name in ("ledgers", "a/b", "ü"):
        assert hbase_table_name(prefix, name) in tables
    families = raw.table(hbase_table_name(prefix, "ledgers")).families()
    assert set(families) == {b"f", b"m"}


async def test_existing_table_without_the_families_is_illegal(ms: MetaStore, hbase_uri: str,
                                                              raw: Any) -> None:
    raw.create_table(hbase_table_name(_address(hbase_uri)[2], "foreign"), {"x": {}})
    with pytest.raises(IllegalOpError, match="families"):
        await ms.create_table("foreign")


# --------------------------------------------------------------------------- layout


async def test_layout_is_a_column_per_field_and_the_version_in_m_v(ms: MetaStore, hbase_uri: str,
                                                                   raw: Any) -> None:
    t = await ms.create_table("topics")
    ht = raw.table(hbase_table_name(_address(hbase_uri)[2], "topics"))
    v1 = await t.put("a/topic", Value({"owner": b"hub1", "load": b"3"}), Version.NEW)
    row = ht.row(b"a/topic", include_timestamp=True)
    assert {c: v for c, (v, _) in row.items()} == {
        b"f:owner": b"hub1", b"f:load": b"3", b"m:v": struct.pack(">Q", v1.value)}
    assert row[b"f:owner"][1] == v1.value  # each field cell's timestamp is the version that wrote it
    v2 = await t.put("a/topic", Value({"load": None, "x:y\x00ü": b"odd name"}), v1)
    assert ht.row(b"a/topic") == {
        b"f:owner": b"hub1", "f:x:y\x00ü".encode(): b"odd name", b"m:v": struct.pack(">Q", v2.value)}
    await t.remove("a/topic", v2)
    # a tombstone stays so that a re-created key gets a newer version
    tomb = ht.row(b"a/topic")
    assert list(tomb) == [b"m:v"] and len(tomb[b"m:v"]) == 9 and tomb[b"m:v"].endswith(b"\x03")
    assert struct.unpack(">Q", tomb[b"m:v"][:8])[0] > v2.value
    v3 = await t.put("a/topic", Value({"owner": b"hub2"}), Version.NEW)
    assert v3.value > struct.unpack(">Q", tomb[b"m:v"][:8])[0]
    assert ht.row(b"a/topic") == {b"f:owner": b"hub2", b"m:v": struct.pack(">Q", v3.value)}


async def test_any_field_name_and_value_round_trips(ms: MetaStore) -> None:
    t = await ms.create_table("t")
    value = Value({"": b"empty name", ":": b"colon", "f:x": b"family-like", "\x00lease2": b"\x00",
                   "ü日本🙂": bytes(range(256)), "e": b""})
    v = await t.put("k", value, Version.NEW)
    got = await t.get("k")
    assert got.value == value and got.version == v
    assert (await t.get("k", fields={"", "f:x", "nope"})).value == {"": b"empty name", "f:x": b"family-like"}


async def test_odd_keys_round_trip_and_scan_in_str_order(ms: MetaStore) -> None:
    t = await ms.create_scannable_table("t")
    # "\uffff" < "\U00010000" in str order (and in UTF-8), but not in UTF-16
    keys = ["a/b", "/", "\x00", "a\x00", "a", "é", "日本", "\uffff", "\U00010000", "z\ud800", "k" * 1000]
    for i, k in enumerate(keys):
        await t.put(k, Value({"i": str(i).encode()}), Version.NEW)
    for i, k in enumerate(keys):
        assert (await t.get(k)).value == {"i": str(i).encode()}
    cur = await t.open_cursor_range("", True, "", True, Order.ASC)
    got = []
    while cur.has_more():
        got += [k for k, _ in await cur.read_entries(3)]
    assert got == sorted(keys)
    cur = await t.open_cursor_range("\U00010000", True, "a", False, Order.DESC)
    assert [k for k, _ in await cur.read_entries(100)] == [k for k in sorted(keys, reverse=True)
                                                          if "a" < k <= "\U00010000"]


async def test_key_over_hbase_row_limit_is_illegal(ms: MetaStore) -> None:
    t = await ms.create_table("t")
    with pytest.raises(IllegalOpError, match="32767"):
        await t.put("k" * 32768, Value({"a": b"1"}), Version.NEW)
    with pytest.raises(IllegalOpError, match="32767"):
        await t.get("é" * 20000)
    await t.put("k" * 32767, Value({"a": b"1"}), Version.NEW)
    assert (await t.get("k" * 32767)).value == {"a": b"1"}


# --------------------------------------------------------------------------- the commit protocol


async def test_a_committed_but_unapplied_put_is_seen_and_completed(ms: MetaStore, hbase_uri: str,
                                                                   raw: Any) -> None:
    """A writer that died between committing m:v and writing the f cells loses nothing."""
    t = await ms.create_scannable_table("t")
    v1 = await t.put("k", Value({"a": b"1", "b": b"2"}), Version.NEW)
    hname = hbase_table_name(_address(hbase_uri)[2], "t")
    v2 = v1.value + 1
    pending = hb._put_cell(v2, [(b"a", b"9"), (b"b", None), (b"c", b"3")])
    assert raw.client.checkAndPut(hname, b"k", b"m:v", struct.pack(">Q", v1.value),
                                  H.Mutation(column=b"m:v", value=pending), {})
    assert raw.table(hname).row(b"k", columns=[b"f"]) == {b"f:a": b"1", b"f:b": b"2"}  # not applied
    got = await t.get("k")
    assert got.value == {"a": b"9", "c": b"3"} and got.version == Version(v2)
    assert (await t.get("k", fields={"b", "c"})).value == {"c": b"3"}
    cur = await t.open_cursor_range("", True, "", True, Order.ASC, fields={"a"})
    assert [(k, v.value) for k, v in await cur.read_entries(10)] == [("k", {"a": b"9"})]
    with pytest.raises(BadVersionError):
        await t.put("k", Value({"d": b"4"}), v1)
    v3 = await t.put("k", Value({"d": b"4"}), got.version)  # applies the pending change first
    assert (await t.get("k")).value == {"a": b"9", "c": b"3", "d": b"4"}
    assert raw.table(hname).row(b"k") == {b"f:a": b"9", b"f:c": b"3", b"f:d": b"4",
                                           b"m:v": struct.pack(">Q", v3.value)}


async def test_a_committed_but_unapplied_remove_is_seen_and_completed(ms: MetaStore, hbase_uri: str,
                                                                      raw: Any) -> None:
    t = await ms.create_table("t")
    v1 = await t.put("k", Value({"a": b"1"}), Version.NEW)
    hname = hbase_table_name(_address(hbase_uri)[2], "t")
    assert raw.client.checkAndPut(hname, b"k", b"m:v", struct.pack(">Q", v1.value),
                                  H.Mutation(column=b"m:v", value=struct.pack(">Q", v1.value + 1) + b"\x02"),
                                  {})
    with pytest.raises(NoKeyError):
        await t.get("k")
    with pytest.raises(NoKeyError):
        await t.remove("k", Version.ANY)
    v2 = await t.put("k", Value({"b": b"2"}), Version.NEW)
    assert v2.value > v1.value + 1
    assert (await t.get("k")).value == {"b": b"2"}  # the old field went with the remove


async def test_a_late_duplicate_apply_cannot_undo_newer_writes(ms: MetaStore, hbase_uri: str,
                                                               raw: Any) -> None:
    t = await ms.create_table("t")
    hname = hbase_table_name(_address(hbase_uri)[2], "t")
    v1 = await t.put("k", Value({"a": b"1", "b": b"x"}), Version.NEW)
    v2 = await t.put("k", Value({"a": b"2", "b": None}), v1)
    # a slow helper re-applies version 1's change after version 2 was written
    raw.client.mutateRowTs(hname, b"k", [H.Mutation(column=b"f:a", value=b"1"),
                                         H.Mutation(column=b"f:b", value=b"x")], v1.value, {})
    got = await t.get("k")
    assert got.value == {"a": b"2"} and got.version == v2


async def test_concurrent_any_puts_all_land_and_merge(ms: MetaStore) -> None:
    t = await ms.create_table("t")
    await t.put("k", Value(), Version.NEW)
    versions = await asyncio.gather(*(t.put("k", Value({f"f{i}": b"%d" % i}), Version.ANY) for i in range(20)))
    assert len(set(versions)) == 20
    got = await t.get("k")
    assert got.value == {f"f{i}": b"%d" % i for i in range(20)}
    assert got.version == max(versions)


async def test_remove_edge_cases(ms: MetaStore) -> None:
    t = await ms.create_table("t")
    with pytest.raises(NoKeyError):
        await t.remove("missing", Version.NEW)
    v = await t.put("k", Value({"a": b"1"}), Version.NEW)
    with pytest.raises(BadVersionError):
        await t.remove("k", Version(v.value + 1))
    with pytest.raises(BadVersionError):
        await t.remove("k", Version(-5))
    with pytest.raises(KeyExistsError):
        await t.put("k", Value({"a": b"2"}), Version.NEW)
    await t.remove("k", v)
    with pytest.raises(NoKeyError):
        await t.put("k", Value({"a": b"2"}), v)


async def test_cursor_skips_removed_keys_and_reads_lazily(ms: MetaStore, hbase_uri: str) -> None:
    t = await ms.create_scannable_table("t")
    for i in range(600):
        await t.put(f"{i:04d}", Value({"a": b"1"}), Version.NEW)
    for i in range(100, 500):  # a long run of tombstones, longer than a scan page
        await t.remove(f"{i:04d}", Version.ANY)
    cur = await t.open_cursor_range("", True, "", True, Order.DESC, fields=set())
    got = []
    while cur.has_more():
        got += [k for k, _ in await cur.read_entries(50)]
    expected = [f"{i:04d}" for i in range(600) if not 100 <= i < 500]
    assert got == expected[::-1]
    full = await t.open_cursor()
    assert [k for k, _ in await full.read_entries(1000)] == expected
    assert not full.has_more()


# --------------------------------------------------------------------------- limits


async def test_oversized_value_is_illegal_and_the_store_keeps_working(ms: MetaStore) -> None:
    t = await ms.create_table("t")
    with pytest.raises(IllegalOpError, match="over the hbase limit"):
        await t.put("big", Value({"v": b"x" * (10 * 1024 * 1024 + 1)}), Version.NEW)
    with pytest.raises(NoKeyError):
        await t.get("big")
    v = await t.put("big", Value({"v": b"x" * 1024}), Version.NEW)
    assert (await t.get("big")).version == v


async def test_max_value_size_is_configurable(hbase_uri: str) -> None:
    ms = await open_metastore(hbase_uri, max_value_size="1000")
    try:
        t = await ms.create_table("t")
        with pytest.raises(IllegalOpError, match="1000"):
            await t.put("k", Value({"a": b"x" * 1001}), Version.NEW)
        with pytest.raises(IllegalOpError, match="1000"):
            await t.put("k", Value({"n" * 1001: b"x"}), Version.NEW)
        await t.put("k", Value({"a": b"x" * 1000}), Version.NEW)
        assert (await t.get("k")).value == {"a": b"x" * 1000}
    finally:
        await ms.close()


async def test_a_put_the_gateway_refuses_changes_nothing() -> None:
    """Fields under the limit whose sum is over the gateway's cell limit: IllegalOpError, nothing written."""
    with HBaseThriftEmulator(max_keyvalue_size=64 * 1024) as emu:
        ms = await open_metastore(f"hbase://{emu.address}/p")
        try:
            t = await ms.create_table("t")
            v = await t.put("k", Value({"a": b"1"}), Version.NEW)
            with pytest.raises(IllegalOpError, match="KeyValue size too large"):
                await t.put("k", Value({"b": b"x" * 40000, "c": b"y" * 40000}), v)
            got = await t.get("k")
            assert got.value == {"a": b"1"} and got.version == v
            assert (await t.put("k", Value({"b": b"x" * 40000}), v)) > v
        finally:
            await ms.close()


# --------------------------------------------------------------------------- gateway failures


async def test_unreachable_gateway_is_service_down_quickly() -> None:
    started = time.monotonic()
    with pytest.raises(ServiceDownError):
        await open_metastore(f"hbase://127.0.0.1:{_free_port()}/p", timeout="1.5")
    assert time.monotonic() - started < 1.5


async def test_silent_gateway_is_service_down_within_the_timeout() -> None:
    """A port that accepts connections but never answers must not hang the caller."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        port = listener.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(ServiceDownError):
            await open_metastore(f"hbase://127.0.0.1:{port}/p", timeout=0.5)
        assert time.monotonic() - started < 2.0


async def test_gateway_restart_costs_at_most_one_failed_call() -> None:
    emu = HBaseThriftEmulator().start()
    port = emu.port
    ms = await open_metastore(f"hbase://127.0.0.1:{port}/p", timeout=2, pool_size=4)
    try:
        t = await ms.create_table("t")
        v = await t.put("k", Value({"a": b"1"}), Version.NEW)
        await asyncio.gather(*(t.get("k") for _ in range(16)))  # warm every pooled connection
        emu.stop()
        with pytest.raises(ServiceDownError):
            await t.get("k")
        with pytest.raises(ServiceDownError):
            await t.put("k", Value({"a": b"2"}), v)
        emu = HBaseThriftEmulator(port=port, store=emu.store).start()  # same data, new gateway
        assert (await t.get("k")).version == v
        assert await t.put("k", Value({"a": b"2"}), v) > v
    finally:
        await ms.close()
        emu.stop()


async def test_every_operation_after_close_is_illegal(hbase_uri: str) -> None:
    ms = await open_metastore(hbase_uri)
    t = await ms.create_scannable_table("t")
    await t.put("k", Value({"a": b"1"}), Version.NEW)
    cur = await t.open_cursor_range("", True, "", True, Order.ASC)
    await ms.close()
    for call in (lambda: t.get("k"), lambda: t.put("k", Value(), Version.ANY),
                 lambda: t.remove("k", Version.ANY), lambda: t.open_cursor(),
                 lambda: ms.create_table("t"), lambda: ms.session()):
        with pytest.raises(IllegalOpError):
            await call()
    with pytest.raises(IllegalOpError):
        await t.raw.get("k")  # type: ignore[attr-defined]
    with pytest.raises(IllegalOpError):
        cur.has_more()  # even though its first page is buffered
    with pytest.raises(IllegalOpError):
        await cur.read_entries(1)
    await ms.close()  # idempotent


# --------------------------------------------------------------------------- processes

_HOLDER = textwrap.dedent("""
    import asyncio, sys
    from metastore import open_metastore, Value
    async def main():
        ms = await open_metastore(sys.argv[1])
        t = await ms.create_table("owners")
        s = await ms.session(timeout=1.0)
        await s.put_ephemeral(t, "topic/\\x00ü", Value({"owner": b"child"}))
        print("ready", flush=True)
        await asyncio.sleep(600)
    asyncio.run(main())
""")

_INCREMENTER = textwrap.dedent("""
    import asyncio, sys
    from metastore import open_metastore, Value
    from metastore.errors import BadVersionError
    async def main():
        ms = await open_metastore(sys.argv[1])
        t = await ms.create_table("idgen")
        lost = 0
        for _ in range(int(sys.argv[2])):
            while True:
                got = await t.get("ledger")
                try:
                    await t.put("ledger", Value({"n": b"%d" % (int(got.value["n"]) + 1)}), got.version)
                    break
                except BadVersionError:
                    lost += 1
        await ms.close()
        print(lost, flush=True)
    asyncio.run(main())
""")


async def test_ephemeral_key_disappears_after_its_process_is_killed(ms: MetaStore, hbase_uri: str) -> None:
    t = await ms.create_table("owners")
    key = "topic/\x00ü"
    proc = child(_HOLDER, hbase_uri)
    try:
        assert await readline(proc) == "ready"
        assert (await t.get(key)).value == {"owner": b"child"}
        with pytest.raises(KeyExistsError):
            await t.put(key, Value({"owner": b"parent"}), Version.NEW)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(WAIT)
        deadline = time.monotonic() + 15.0
        while True:  # the 1 s lease expires; the next read sweeps the key
            try:
                await t.get(key)
            except NoKeyError:
                break
            assert time.monotonic() < deadline, "the dead owner's ephemeral key never went away"
            await asyncio.sleep(0.1)
        await t.put(key, Value({"owner": b"parent"}), Version.NEW)
        assert (await t.get(key)).value == {"owner": b"parent"}
    finally:
        reap(proc)


async def test_cas_is_shared_between_processes(ms: MetaStore, hbase_uri: str) -> None:
    t = await ms.create_table("idgen")
    await t.put("ledger", Value({"n": b"0"}), Version.NEW)
    procs = [child(_INCREMENTER, hbase_uri, "20") for _ in range(3)]
    try:
        lost = [int(await readline(p)) for p in procs]
        codes = [await asyncio.to_thread(p.wait, WAIT) for p in procs]
    finally:
        for p in procs:
            reap(p)
    assert codes == [0, 0, 0]
    assert (await t.get("ledger")).value == {"n": b"60"}  # no increment lost, none counted twice
    log.info("CAS conflicts between the processes: %d", sum(lost))
