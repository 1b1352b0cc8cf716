"""The metastore conformance kit: the behavioural contract of ``metastore.api``.

Every built-in backend passes it, and a third-party backend proves itself
with it. Three ways to run it:

* ``python -m metastore.testing --uri myscheme://...`` prints a pass/fail table;
* in a pytest module, ``from metastore.testing.conformance import *`` and run
  ``pytest --metastore-uri myscheme://...`` (the ``metastore.testing.plugin``
  pytest plugin adds the option), or define your own ``conformance_uri``
  fixture (it may be parametrized);
* ``pytest --metastore-uri myscheme://... path/to/metastore/testing/conformance.py``.

The tests are plain functions that run their own event loop, so the kit
needs no asyncio pytest plugin. Each test uses fresh, uniquely named tables.
Optional capabilities (scannable tables, sessions, counters) are skipped, with the
reason, when the backend raises ``IllegalOpError`` for them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import textwrap
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from metastore import ALL_FIELDS, Order, Value, Version, open_metastore
from metastore.api import Counters, EventType, MetaStore, MetastoreCursor, MetastoreScannableTable, WatchEvent
from metastore.errors import (
    BadVersionError,
    IllegalOpError,
    KeyExistsError,
    NoKeyError,
)
from metastore.testing.children import WAIT, child, readline, reap

__all__ = [name for name in dir() if name.startswith("test_")]  # filled at the end

"""Upper bound, in seconds, for anything the kit waits on."""

Case = Callable[[MetaStore, str, str], Awaitable[None]]


def _case(fn: Case) -> Callable[[str], None]:
    """Turn ``async fn(store, table_prefix, uri)`` into a sync pytest test taking ``conformance_uri``."""

    def test(conformance_uri: str) -> None:
        async def body() -> None:
            store = await asyncio.wait_for(open_metastore(conformance_uri), WAIT)
            try:
                await fn(store, "c" + uuid.uuid4().hex[:12], conformance_uri)
            finally:
                if not store.closed:
                    await store.close()

        asyncio.run(body())

    test.__name__ = "test_" + fn.__name__.lstrip("_")
    test.__qualname__ = test.__name__
    test.__doc__ = fn.__doc__
    test.__module__ = __name__
    return test


async def _scannable(store: MetaStore, name: str) -> MetastoreScannableTable:
    try:
        return await store.create_scannable_table(name)
    except IllegalOpError as exc:
        pytest.skip(f"backend has no scannable tables: {exc}")


async def _drain(cursor: MetastoreCursor, batch: int = 7) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    while cursor.has_more():
        got = await cursor.read_entries(batch)
        assert len(got) <= batch
        out.extend(got)
    await cursor.close()
    return out


# --------------------------------------------------------------------------- basic CRUD


async def _create_and_get(store: MetaStore, name: str, uri: str) -> None:
    """put(NEW) creates; get returns the value and the same version."""
    t = await store.create_table(name)
    v = await t.put("k1", Value({"owner": b"hub1", "load": b"3"}), Version.NEW)
    got = await t.get("k1")
    assert got.value == {"owner": b"hub1", "load": b"3"}
    assert isinstance(got.value, Value)
    assert got.version == v
    assert v != Version.NEW and v != Version.ANY


async def _create_existing_fails(store: MetaStore, name: str, uri: str) -> None:
    """put(NEW) on an existing key raises KeyExistsError and changes nothing."""
    t = await store.create_table(name)
    v = await t.put("k", Value({"a": b"1"}), Version.NEW)
    with pytest.raises(KeyExistsError):
        await t.put("k", Value({"a": b"2"}), Version.NEW)
    got = await t.get("k")
    assert got.value == {"a": b"1"} and got.version == v


async def _put_missing_key(store: MetaStore, name: str, uri: str) -> None:
    """put with a version or with Version.ANY on a missing key raises NoKeyError."""
    t = await store.create_table(name)
    v = await t.put("other", Value({"a": b"1"}), Version.NEW)
    with pytest.raises(NoKeyError):
        await t.put("missing", Value({"a": b"1"}), Version.ANY)
    with pytest.raises(NoKeyError):
        await t.put("missing", Value({"a": b"1"}), v)
    with pytest.raises(NoKeyError):
        await t.get("missing")


async def _cas_put(store: MetaStore, name: str, uri: str) -> None:
    """CAS put merges fields, returns a greater version, rejects a stale version."""
    t = await store.create_table(name)
    v1 = await t.put("k", Value({"owner": b"hub1"}), Version.NEW)
    v2 = await t.put("k", Value({"load": b"3"}), v1)
    assert v2 != v1 and v1 < v2
    assert (await t.get("k")).value == {"owner": b"hub1", "load": b"3"}
    with pytest.raises(BadVersionError):
        await t.put("k", Value({"load": b"4"}), v1)
    got = await t.get("k")
    assert got.value == {"owner": b"hub1", "load": b"3"} and got.version == v2


async def _any_put_and_field_delete(store: MetaStore, name: str, uri: str) -> None:
    """Version.ANY puts unconditionally; a None field deletes that field; absent is absent."""
    t = await store.create_table(name)
    v1 = await t.put("k", Value({"a": b"1", "b": b"2"}), Version.NEW)
    v2 = await t.put("k", Value({"b": None, "c": b"3"}), Version.ANY)
    assert v1 < v2
    got = await t.get("k")
    assert got.value == {"a": b"1", "c": b"3"}
    assert "b" not in got.value
    v3 = await t.put("k", Value({"never-there": None}), Version.ANY)
    assert v2 < v3 and (await t.get("k")).value == {"a": b"1", "c": b"3"}


async def _empty_and_binary_values(store: MetaStore, name: str, uri: str) -> None:
    """An empty record, an empty field value and arbitrary bytes round-trip."""
    t = await store.create_table(name)
    await t.put("empty", Value(), Version.NEW)
    assert (await t.get("empty")).value == {}
    blob = bytes(range(256)) * 64
    await t.put("bin", Value({"e": b"", "blob": blob}), Version.NEW)
    assert (await t.get("bin")).value == {"e": b"", "blob": blob}


async def _get_fields(store: MetaStore, name: str, uri: str) -> None:
    """get(fields=...) projects; fields=set() gives the version only; missing fields are absent."""
    t = await store.create_table(name)
    v = await t.put("k", Value({"a": b"1", "b": b"2", "c": b"3"}), Version.NEW)
    assert (await t.get("k", fields={"a", "c"})).value == {"a": b"1", "c": b"3"}
    only = await t.get("k", fields=set())
    assert only.value == {} and only.version == v
    assert (await t.get("k", fields={"a", "zz"})).value == {"a": b"1"}
    assert (await t.get("k", fields=ALL_FIELDS)).value == {"a": b"1", "b": b"2", "c": b"3"}


async def _remove(store: MetaStore, name: str, uri: str) -> None:
    """CAS remove; stale version -> BadVersion; NEW -> BadVersion; missing -> NoKey; ANY removes."""
    t = await store.create_table(name)
    v1 = await t.put("k", Value({"a": b"1"}), Version.NEW)
    v2 = await t.put("k", Value({"a": b"2"}), v1)
    with pytest.raises(BadVersionError):
        await t.remove("k", v1)
    with pytest.raises(BadVersionError):
        await t.remove("k", Version.NEW)
    await t.remove("k", v2)
    with pytest.raises(NoKeyError):
        await t.get("k")
    with pytest.raises(NoKeyError):
        await t.remove("k", Version.ANY)
    await t.put("k2", Value({"a": b"1"}), Version.NEW)
    await t.remove("k2", Version.ANY)
    with pytest.raises(NoKeyError):
        await t.get("k2")


async def _recreate_after_remove(store: MetaStore, name: str, uri: str) -> None:
    """A key removed and created again gets a version newer than every earlier one."""
    t = await store.create_table(name)
    v1 = await t.put("k", Value({"a": b"1"}), Version.NEW)
    v2 = await t.put("k", Value({"a": b"2"}), v1)
    await t.remove("k", v2)
    v3 = await t.put("k", Value({"a": b"3"}), Version.NEW)
    assert v2 < v3 and v3 != v1
    assert (await t.get("k")).value == {"a": b"3"}


async def _illegal_arguments(store: MetaStore, name: str, uri: str) -> None:
    """None key/value/version and empty keys raise IllegalOpError."""
    t = await store.create_table(name)
    v = await t.put("k", Value({"a": b"1"}), Version.NEW)
    bad: list[Callable[[], Awaitable[Any]]] = [
        lambda: t.put(None, Value({"a": b"1"}), Version.NEW),  # type: ignore[arg-type]
        lambda: t.put("x", None, Version.NEW),  # type: ignore[arg-type]
        lambda: t.put("k", Value({"a": b"1"}), None),  # type: ignore[arg-type]
        lambda: t.put("", Value({"a": b"1"}), Version.NEW),
        lambda: t.get(None),  # type: ignore[arg-type]
        lambda: t.get(""),
        lambda: t.remove("k", None),  # type: ignore[arg-type]
        lambda: t.remove(None, Version.ANY),  # type: ignore[arg-type]
        lambda: t.put("x", Value({"a": "not bytes"}), Version.NEW),  # type: ignore[dict-item]
    ]
    for call in bad:
        with pytest.raises(IllegalOpError):
            await call()
    assert (await t.get("k")).version == v


async def _odd_keys(store: MetaStore, name: str, uri: str) -> None:
    """Keys with '/', NUL, dots, spaces and non-ASCII round-trip and are listed as given."""
    t = await store.create_table(name)
    keys = ["a/b", "/", "//x//", "\x00", "a\x00b", ".", "..", "zookeeper", "sp ace", "ü日本🙂",
            "%2F", "k" * 200, "tab\tnl\n"]
    for i, k in enumerate(keys):
        await t.put(k, Value({"i": str(i).encode()}), Version.NEW)
    for i, k in enumerate(keys):
        assert (await t.get(k)).value == {"i": str(i).encode()}, repr(k)
    listed = {k for k, _ in await _drain(await t.open_cursor())}
    assert listed == set(keys)


async def _tables_are_separate(store: MetaStore, name: str, uri: str) -> None:
    """The same key in two tables is two records."""
    a = await store.create_table(name + "a")
    b = await store.create_table(name + "b")
    await a.put("k", Value({"t": b"a"}), Version.NEW)
    with pytest.raises(NoKeyError):
        await b.get("k")
    await b.put("k", Value({"t": b"b"}), Version.NEW)
    assert (await a.get("k")).value == {"t": b"a"}
    again = await store.create_table(name + "a")
    assert (await again.get("k")).value == {"t": b"a"}


async def _concurrent_cas(store: MetaStore, name: str, uri: str) -> None:
    """Of many concurrent CAS puts from one version exactly one wins."""
    t = await store.create_table(name)
    v = await t.put("k", Value({"n": b"0"}), Version.NEW)
    results = await asyncio.gather(*(t.put("k", Value({"n": str(i).encode()}), v) for i in range(8)),
                                   return_exceptions=True)
    wins = [r for r in results if isinstance(r, Version)]
    losses = [r for r in results if isinstance(r, BadVersionError)]
    assert len(wins) == 1 and len(losses) == 7, results
    assert (await t.get("k")).version == wins[0]


# --------------------------------------------------------------------------- cursors


async def _full_cursor(store: MetaStore, name: str, uri: str) -> None:
    """open_cursor visits every key exactly once, in batches, with field projection."""
    t = await store.create_table(name)
    keys = [f"key-{i:04d}" for i in range(300)]
    await asyncio.gather(*(t.put(k, Value({"a": k.encode(), "b": b"x"}), Version.NEW) for k in keys))
    seen = await _drain(await t.open_cursor(), batch=64)
    assert sorted(k for k, _ in seen) == keys
    assert all(v.value == {"a": k.encode(), "b": b"x"} for k, v in seen)
    projected = await _drain(await t.open_cursor(fields={"b"}), batch=100)
    assert len(projected) == 300 and all(v.value == {"b": b"x"} for _, v in projected)
    empty = await store.create_table(name + "empty")
    cur = await empty.open_cursor()
    assert await _drain(cur) == []


async def _cursor_versions_match_get(store: MetaStore, name: str, uri: str) -> None:
    """A cursor reports the same version that get does."""
    t = await store.create_table(name)
    for i in range(5):
        v = await t.put(f"k{i}", Value({"a": b"1"}), Version.NEW)
        await t.put(f"k{i}", Value({"a": b"2"}), v)
    for k, got in await _drain(await t.open_cursor()):
        assert got.version == (await t.get(k)).version


RANGE_KEYS = ["a", "a\x00", "a\x00b", "ab", "b", "ba", "c", "d", "e", "f", "m", "z", "é", "日"]


def _expected(first: str, first_inc: bool, last: str, last_inc: bool, order: Order) -> list[str]:
    keys = sorted(RANGE_KEYS, reverse=order is Order.DESC)
    out = []
    for k in keys:
        if order is Order.ASC:
            lo, lo_inc, hi, hi_inc = first, first_inc, last, last_inc
        else:
            lo, lo_inc, hi, hi_inc = last, last_inc, first, first_inc
        if lo and (k < lo or (k == lo and not lo_inc)):
            continue
        if hi and (k > hi or (k == hi and not hi_inc)):
            continue
        out.append(k)
    return out


async def _scan_ranges(store: MetaStore, name: str, uri: str) -> None:
    """Range cursors honour inclusive flags, open ends, ASC/DESC and str key order."""
    t = await _scannable(store, name)
    for k in RANGE_KEYS:
        await t.put(k, Value({"k": k.encode(), "other": b"o"}), Version.NEW)
    cases = [
        ("", True, "", True, Order.ASC),
        ("b", True, "f", True, Order.ASC),
        ("b", False, "f", False, Order.ASC),
        ("a", True, "a\x00b", False, Order.ASC),
        ("bb", True, "", True, Order.ASC),
        ("", True, "c", False, Order.ASC),
        ("", True, "", True, Order.DESC),
        ("f", True, "b", True, Order.DESC),
        ("f", False, "b", False, Order.DESC),
        ("", True, "m", True, Order.DESC),
        ("c", True, "", True, Order.DESC),
        ("zz", True, "y", True, Order.DESC),
        ("c", True, "c", True, Order.ASC),
        ("c", False, "c", True, Order.ASC),
    ]
    for first, fi, last, li, order in cases:
        cur = await t.open_cursor_range(first, fi, last, li, order)
        got = [k for k, _ in await _drain(cur, batch=3)]
        assert got == _expected(first, fi, last, li, order), (first, fi, last, li, order, got)
    cur = await t.open_cursor_range("b", True, "d", True, Order.ASC, fields={"k"})
    rows = await _drain(cur)
    assert [v.value for _, v in rows] == [{"k": k.encode()} for k in ["b", "ba", "c", "d"]]


async def _inverted_range(store: MetaStore, name: str, uri: str) -> None:
    """An inverted range raises IllegalOpError."""
    t = await _scannable(store, name)
    await t.put("a", Value({"x": b"1"}), Version.NEW)
    with pytest.raises(IllegalOpError):
        await t.open_cursor_range("z", True, "a", True, Order.ASC)
    with pytest.raises(IllegalOpError):
        await t.open_cursor_range("a", True, "z", True, Order.DESC)


async def _scannable_is_a_table(store: MetaStore, name: str, uri: str) -> None:
    """A scannable table supports the whole table API too; data written through one handle is seen."""
    t = await _scannable(store, name)
    v = await t.put("k", Value({"a": b"1"}), Version.NEW)
    assert (await t.get("k")).version == v
    assert [k for k, _ in await _drain(await t.open_cursor())] == ["k"]


async def _cursor_paging_exact(store: MetaStore, name: str, uri: str) -> None:
    """read_entries(n) returns exactly n while more remain; has_more is False at the end."""
    t = await _scannable(store, name)
    for i in range(10):
        await t.put(f"{i:02d}", Value({"a": b"1"}), Version.NEW)
    cur = await t.open_cursor_range("", True, "", True, Order.ASC)
    assert cur.has_more()
    assert [k for k, _ in await cur.read_entries(4)] == ["00", "01", "02", "03"]
    assert [k for k, _ in await cur.read_entries(4)] == ["04", "05", "06", "07"]
    assert [k for k, _ in await cur.read_entries(4)] == ["08", "09"]
    assert not cur.has_more()
    assert await cur.read_entries(4) == []
    await cur.close()
    cur = await t.open_cursor_range("05", True, "05", True, Order.DESC)
    assert [k for k, _ in await cur.read_entries(5)] == ["05"]
    assert not cur.has_more()
    await cur.close()


# --------------------------------------------------------------------------- lifecycle


async def _versions_survive_reopen(store: MetaStore, name: str, uri: str) -> None:
    """A version read before close is still valid for CAS after reopening the store."""
    t = await store.create_table(name)
    v = await t.put("k", Value({"a": b"1"}), Version.NEW)
    await store.close()
    again = await open_metastore(uri)
    try:
        t2 = await again.create_table(name)
        got = await t2.get("k")
        assert got.version == v and got.value == {"a": b"1"}
        v2 = await t2.put("k", Value({"a": b"2"}), v)
        assert v < v2
    finally:
        await again.close()


async def _use_after_close(store: MetaStore, name: str, uri: str) -> None:
    """Every operation after close raises IllegalOpError; so does a cursor read after its close."""
    t = await store.create_table(name)
    await t.put("k", Value({"a": b"1"}), Version.NEW)
    cur = await t.open_cursor()
    await cur.close()
    with pytest.raises(IllegalOpError):
        await cur.read_entries(1)
    with pytest.raises(IllegalOpError):
        cur.has_more()
    await store.close()
    with pytest.raises(IllegalOpError):
        await t.get("k")
    with pytest.raises(IllegalOpError):
        await t.put("k", Value({"a": b"2"}), Version.ANY)
    with pytest.raises(IllegalOpError):
        await store.create_table(name)


async def _watch(store: MetaStore, name: str, uri: str) -> None:
    """A watcher registered by get fires once on change and once (newly registered) on removal."""
    t = await store.create_table(name)
    await t.put("k", Value({"a": b"1"}), Version.NEW)
    other = await open_metastore(uri)
    try:
        t2 = await other.create_table(name)
        events: asyncio.Queue[WatchEvent] = asyncio.Queue()
        await t.get("k", watcher=events.put_nowait)
        await t2.put("k", Value({"a": b"2"}), Version.ANY)
        ev = await asyncio.wait_for(events.get(), WAIT)
        assert ev.key == "k" and ev.type is EventType.CHANGED
        await t.get("k", watcher=events.put_nowait)
        await t2.remove("k", Version.ANY)
        ev = await asyncio.wait_for(events.get(), WAIT)
        assert ev.key == "k" and ev.type is EventType.REMOVED
        assert events.empty()
    finally:
        await other.close()


async def _large_values(store: MetaStore, name: str, uri: str) -> None:
    """A 256 KiB value round-trips; a value over the backend's limit is IllegalOpError, not corruption."""
    t = await store.create_table(name)
    big = os.urandom(256 * 1024)
    await t.put("big", Value({"v": big}), Version.NEW)
    assert (await t.get("big")).value["v"] == big
    with pytest.raises(IllegalOpError):
        await t.put("huge", Value({"v": b"x" * (64 << 20)}), Version.NEW)
    with pytest.raises(NoKeyError):
        await t.get("huge")
    assert (await t.get("big")).value["v"] == big


# --------------------------------------------------------------------------- processes

_HOLDER = textwrap.dedent("""
    import asyncio, sys, time
    from metastore import open_metastore, Value
    async def main():
        ms = await open_metastore(sys.argv[1])
        t = await ms.create_table(sys.argv[2])
        s = await ms.session(timeout=float(sys.argv[3]))
        await s.put_ephemeral(t, "eph", Value({"owner": b"child"}))
        print("ready", flush=True)
        await asyncio.sleep(300)
    asyncio.run(main())
""")

_INCREMENTER = textwrap.dedent("""
    import asyncio, sys
    from metastore import open_metastore, Value
    from metastore.cas import update_record
    def bump(cur):
        return Value({"n": str(int(cur.value["n"]) + 1).encode()})
    async def main():
        ms = await open_metastore(sys.argv[1])
        t = await ms.create_table(sys.argv[2])
        done = 0
        for _ in range(int(sys.argv[3])):
            await update_record(t, "counter", bump, attempts=1000)  # every increment must land
            done += 1
        await ms.close()
        print(done, flush=True)
    asyncio.run(main())
""")


async def _ephemeral_dies_with_owner(store: MetaStore, name: str, uri: str) -> None:
    """SessionCapability: an ephemeral key held by a process vanishes after that process is SIGKILLed."""
    try:
        probe = await store.session(timeout=2.0)
    except IllegalOpError as exc:
        pytest.skip(f"backend has no session capability: {exc}")
    t = await store.create_table(name)
    # a live session's key blocks others and vanishes on clean close
    await probe.put_ephemeral(t, "mine", Value({"o": b"me"}))
    with pytest.raises(KeyExistsError):
        await t.put("mine", Value({"o": b"other"}), Version.NEW)
    assert (await t.get("mine")).value == {"o": b"me"}
    await probe.close()
    with pytest.raises(NoKeyError):
        await t.get("mine")

    proc = child(_HOLDER, uri, name, "2.0")
    try:
        assert await readline(proc) == "ready"
        got = await t.get("eph")
        assert got.value == {"owner": b"child"}
        with pytest.raises(KeyExistsError):
            await t.put("eph", Value({"owner": b"parent"}), Version.NEW)
        gone: asyncio.Future[WatchEvent] = asyncio.get_running_loop().create_future()

        def on_event(ev: WatchEvent) -> None:
            if not gone.done():
                gone.set_result(ev)

        await t.get("eph", watcher=on_event)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=WAIT)
        ev = await asyncio.wait_for(gone, WAIT)
        assert ev.type is EventType.REMOVED
        with pytest.raises(NoKeyError):
            await t.get("eph")
        # the key can now be claimed by someone else
        await t.put("eph", Value({"owner": b"parent"}), Version.NEW)
    finally:
        reap(proc)


async def _multiprocess_cas(store: MetaStore, name: str, uri: str) -> None:
    """N processes race CAS increments on one key; the final count equals the successful puts."""
    t = await store.create_table(name)
    await t.put("counter", Value({"n": b"0"}), Version.NEW)
    procs = [child(_INCREMENTER, uri, name, "25") for _ in range(4)]
    try:
        done = [int(await readline(p, timeout=120)) for p in procs]
    finally:
        for p in procs:
            reap(p)
    assert done == [25, 25, 25, 25]
    assert int((await t.get("counter")).value["n"] or b"") == sum(done)


_COUNTER_ADDER = textwrap.dedent("""
    import asyncio, sys
    from metastore import open_metastore
    async def main():
        ms = await open_metastore(sys.argv[1])
        counters = await ms.counters()
        got = [await counters.add(sys.argv[2], 1) for _ in range(int(sys.argv[3]))]
        await ms.close()
        print(" ".join(map(str, got)), flush=True)
    asyncio.run(main())
""")


async def _counters_or_skip(store: MetaStore) -> Counters:
    try:
        return await store.counters()
    except IllegalOpError as exc:
        pytest.skip(f"backend has no counter capability: {exc}")


async def _counters(store: MetaStore, name: str, uri: str) -> None:
    """CounterCapability: counters start at 0, add returns the new value, 0 reads; separate from tables."""
    counters = await _counters_or_skip(store)
    a, b = f"{name}-a", f"{name}-b"
    assert await counters.add(a, 0) == 0
    assert await counters.add(a, 5) == 5
    assert await counters.add(a, 1) == 6
    assert await counters.add(a, 0) == 6
    assert await counters.add(b, 1000) == 1000          # another counter, its own value
    assert await counters.add(a, 0) == 6
    t = await store.create_table(name)                   # a table of the same name does not see them
    with pytest.raises(NoKeyError):
        await t.get(a)
    await t.put(a, Value({"n": b"1"}), Version.NEW)
    assert await counters.add(a, 0) == 6
    for bad_name, delta in ((a, -1), (a, 1.5), (a, True), ("", 1), (None, 1), (a, None)):
        with pytest.raises(IllegalOpError):
            await counters.add(bad_name, delta)  # type: ignore[arg-type]
    assert await counters.add(a, 0) == 6
    # concurrent adds each get their own value
    got = await asyncio.gather(*(counters.add(a, 1) for _ in range(50)))
    assert sorted(got) == list(range(7, 57))
    # durable: another store, and the same store reopened, see the value
    other = await open_metastore(uri)
    try:
        assert await (await other.counters()).add(a, 2) == 58
    finally:
        await other.close()
    await store.close()
    again = await open_metastore(uri)
    try:
        assert await (await again.counters()).add(a, 0) == 58
    finally:
        await again.close()


async def _multiprocess_counters(store: MetaStore, name: str, uri: str) -> None:
    """CounterCapability: processes adding to one counter at once never get the same value."""
    counters = await _counters_or_skip(store)
    procs = [child(_COUNTER_ADDER, uri, name, "25") for _ in range(4)]
    try:
        seen = [int(v) for p in procs for v in (await readline(p, timeout=120)).split()]
    finally:
        for p in procs:
            reap(p)
    assert sorted(seen) == list(range(1, 101))
    assert await counters.add(name, 0) == 100


CASES: list[Case] = [
    _create_and_get, _create_existing_fails, _put_missing_key, _cas_put, _any_put_and_field_delete,
    _empty_and_binary_values, _get_fields, _remove, _recreate_after_remove, _illegal_arguments,
    _odd_keys, _tables_are_separate, _concurrent_cas, _full_cursor, _cursor_versions_match_get,
    _scan_ranges, _inverted_range, _scannable_is_a_table, _cursor_paging_exact,
    _versions_survive_reopen, _use_after_close, _watch, _large_values,
    _ephemeral_dies_with_owner, _multiprocess_cas, _counters, _multiprocess_counters,
]

for _fn in CASES:
    _test = _case(_fn)
    globals()[_test.__name__] = _test

__all__ = [n for n in globals() if n.startswith("test_")]

