"""lmdb backend specifics: limits, durability across processes, bad locations."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from metastore import Value, Version, open_metastore
from metastore.errors import BadVersionError, IllegalOpError, NoKeyError, ServiceDownError
from metastore.proto.metastore_pb2 import LeaseRecord
from tests.fixtures.cycles import cyclic_garbage


def _in_child(path: Path, body: str) -> list[str]:
    """Run ``body`` (one line, with ``t`` = table ``t`` of the store at ``path``) in another process."""
    script = ("import asyncio,sys\nfrom metastore import open_metastore, Value, Version\n"
              "async def m():\n ms=await open_metastore(sys.argv[1]); t=await ms.create_table('t')\n"
              f" {body}\nasyncio.run(m())")
    return subprocess.run([sys.executable, "-c", script, f"lmdb://{path}"], capture_output=True,
                          text=True, timeout=60, check=True).stdout.split()


async def test_key_over_lmdb_limit_is_illegal_and_store_keeps_working(tmp_path: Path) -> None:
    ms = await open_metastore(f"lmdb://{tmp_path}")
    t = await ms.create_table("t")
    with pytest.raises(IllegalOpError, match="511"):
        await t.put("k" * 600, Value({"a": b"1"}), Version.NEW)
    await t.put("k" * 511, Value({"a": b"1"}), Version.NEW)
    assert (await t.get("k" * 511)).value == {"a": b"1"}
    await ms.close()


async def test_field_over_limit_is_illegal(tmp_path: Path) -> None:
    ms = await open_metastore(f"lmdb://{tmp_path}", max_value_size="1024")
    t = await ms.create_table("t")
    with pytest.raises(IllegalOpError, match="over the lmdb limit of 1024"):
        await t.put("k", Value({"a": b"x" * 1025}), Version.NEW)
    with pytest.raises(NoKeyError):
        await t.get("k")
    await t.put("k", Value({"a": b"x" * 1024}), Version.NEW)
    await ms.close()


async def test_options_in_the_uri_query(tmp_path: Path) -> None:
    ms = await open_metastore(f"lmdb://{tmp_path}?max_value_size=10")
    t = await ms.create_table("t")
    with pytest.raises(IllegalOpError, match="limit of 10"):
        await t.put("k", Value({"a": b"x" * 11}), Version.NEW)
    await ms.close()


async def test_bad_option_value_is_illegal(tmp_path: Path) -> None:
    with pytest.raises(IllegalOpError, match="max_value_size"):
        await open_metastore(f"lmdb://{tmp_path}", max_value_size="lots")


async def test_path_that_is_a_file_is_service_down(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_bytes(b"not a directory")
    with pytest.raises(ServiceDownError):
        await open_metastore(f"lmdb://{f}")


async def test_two_stores_on_one_path_in_one_process_share_data(tmp_path: Path) -> None:
    a = await open_metastore(f"lmdb://{tmp_path}")
    b = await open_metastore(f"lmdb://{tmp_path}")
    ta, tb = await a.create_table("t"), await b.create_table("t")
    v = await ta.put("k", Value({"a": b"1"}), Version.NEW)
    await a.close()  # closing one must not close the shared environment under the other
    assert (await tb.get("k")).version == v
    await b.close()


async def test_write_is_durable_for_another_process(tmp_path: Path) -> None:
    ms = await open_metastore(f"lmdb://{tmp_path}")
    t = await ms.create_table("t")
    v = await t.put("k", Value({"a": b"durable"}), Version.NEW)
    out = _in_child(tmp_path, "g=await t.get('k'); print(g.value['a'].decode(), g.version.value)")
    assert out == ["durable", str(v.value)]
    await ms.close()


async def test_cached_record_is_revalidated_against_another_process_write(tmp_path: Path) -> None:
    ms = await open_metastore(f"lmdb://{tmp_path}")
    t = await ms.create_table("t")
    v1 = await t.put("k", Value({"a": b"mine"}), Version.NEW)
    assert (await t.get("k")).value == {"a": b"mine"}  # now cached in this process
    out = _in_child(tmp_path, "v=await t.put('k', Value({'a': b'theirs'}), Version.ANY); print(v.value)")
    got = await t.get("k")
    assert got.value == {"a": b"theirs"}
    assert got.version.value == int(out[0]) and got.version > v1
    await ms.close()


async def test_returned_values_are_copies_of_the_cache(tmp_path: Path) -> None:
    ms = await open_metastore(f"lmdb://{tmp_path}")
    t = await ms.create_table("t")
    await t.put("k", Value({"a": b"1"}), Version.NEW)
    got = await t.get("k")
    got.value["a"] = b"changed by the caller"
    assert (await t.get("k")).value == {"a": b"1"}
    await ms.close()


async def test_concurrent_writes_share_commits_and_each_checks_its_own_version(tmp_path: Path) -> None:
    ms = await open_metastore(f"lmdb://{tmp_path}")
    t = await ms.create_table("t")
    base = await t.put("contended", Value({"n": b"0"}), Version.NEW)
    writer = ms.shared.writer  # type: ignore[attr-defined]
    commits, writes = writer.commits, writer.writes
    fresh = [t.put(f"k{i}", Value({"i": str(i).encode()}), Version.NEW) for i in range(100)]
    racing = [t.put("contended", Value({"n": str(i).encode()}), base) for i in range(20)]
    results = await asyncio.gather(*fresh, *racing, return_exceptions=True)
    assert all(isinstance(r, Version) for r in results[:100])
    cas = results[100:]
    winners = [i for i, r in enumerate(cas) if isinstance(r, Version)]
    assert len(winners) == 1
    assert all(isinstance(r, BadVersionError) for i, r in enumerate(cas) if i != winners[0])
    assert writer.writes - writes == 120
    assert writer.commits - commits < 120  # writes queued behind a commit rode a shared one
    await ms.close()
    reopened = await open_metastore(f"lmdb://{tmp_path}")
    t2 = await reopened.create_table("t")
    assert (await t2.get("contended")).value == {"n": str(winners[0]).encode()}
    assert [(await t2.get(f"k{i}")).value["i"] for i in range(100)] == [str(i).encode() for i in range(100)]
    await reopened.close()


async def test_a_write_that_overflows_the_map_fails_alone(tmp_path: Path) -> None:
    ms = await open_metastore(f"lmdb://{tmp_path}?map_size=1048576")
    t = await ms.create_table("t")
    small = [t.put(f"s{i}", Value({"v": b"x" * 100}), Version.NEW) for i in range(20)]
    huge = t.put("huge", Value({"v": b"x" * (4 << 20)}), Version.NEW)
    results = await asyncio.gather(huge, *small, return_exceptions=True)
    assert isinstance(results[0], ServiceDownError)
    assert all(isinstance(r, Version) for r in results[1:])
    with pytest.raises(NoKeyError):
        await t.get("huge")
    assert (await t.get("s19")).value == {"v": b"x" * 100}
    await t.put("after", Value({"v": b"ok"}), Version.NEW)  # the store keeps serving
    await ms.close()


async def test_a_failed_conditional_write_leaves_no_cyclic_garbage(tmp_path: Path) -> None:
    """A refused put is freed by reference counting (issue 35: a bookie's auditor loop tries an ephemeral
    create every second; each KeyExistsError, with the writer thread's frames in its traceback, was a
    cycle of about 30 objects that waited for a cyclic collection, which a bookie's GC_THRESHOLD makes rare)."""
    import gc

    from metastore.errors import KeyExistsError

    ms = await open_metastore(f"lmdb://{tmp_path}")
    t = await ms.create_table("t")
    await t.put("k", Value({"v": b"1"}), Version.NEW)
    owner, other = await ms.session(timeout=10), await ms.session(timeout=10)
    await owner.put_ephemeral(t, "e", Value({"v": b"1"}))
    gc.collect()
    gc.disable()
    try:
        for _ in range(20):
            with pytest.raises(KeyExistsError):
                await t.put("k", Value({"v": b"2"}), Version.NEW)
            with pytest.raises(BadVersionError):
                await t.put("k", Value({"v": b"2"}), Version(12345))
            with pytest.raises(KeyExistsError):
                await other.put_ephemeral(t, "e", Value({"v": b"2"}))
        unreachable = len(cyclic_garbage())
    finally:
        gc.enable()
    assert unreachable < 20, f"{unreachable} objects in cycles after 60 refused writes"
    assert (await t.get("k")).value == {"v": b"1"}
    await ms.close()


async def test_too_many_open_tables_is_a_clear_error(tmp_path: Path) -> None:
    ms = await open_metastore(f"lmdb://{tmp_path}?max_tables=4")
    opened = []
    with pytest.raises(IllegalOpError, match="max_tables=4"):
        for i in range(10):
            opened.append(await ms.create_table(f"t{i}"))
    assert 1 <= len(opened) < 4  # the hidden sessions table takes one slot
    await opened[0].put("k", Value({"a": b"1"}), Version.NEW)
    assert (await opened[0].get("k")).value == {"a": b"1"}
    await ms.close()


async def test_unknown_write_mode_is_illegal(tmp_path: Path) -> None:
    with pytest.raises(IllegalOpError, match="write_mode: 'eventually'"):
        await open_metastore(f"lmdb://{tmp_path}?write_mode=eventually")


async def test_inline_writes_are_durable_and_a_failing_write_leaves_the_store_serving(tmp_path: Path) -> None:
    ms = await open_metastore(f"lmdb://{tmp_path}?write_mode=inline&map_size=1048576")
    t = await ms.create_table("t")
    v = await t.put("k", Value({"a": b"1"}), Version.NEW)
    with pytest.raises(ServiceDownError, match="lmdb write failed"):
        await t.put("huge", Value({"a": b"x" * (4 << 20)}), Version.NEW)
    with pytest.raises(BadVersionError):
        await t.put("k", Value({"a": b"2"}), Version(v.value + 1))
    await ms.close()
    out = _in_child(tmp_path, "g=await t.get('k'); print(g.value['a'].decode(), g.version.value)")
    assert out == ["1", str(v.value)]


# --------------------------------------------------------------------------- cursor pages


async def _collect(cur: object, n: int) -> list[tuple[str, bytes, int]]:
    out = []
    while cur.has_more() and len(out) <= 10_000:  # type: ignore[attr-defined]  # a repeating cursor fails
        for key, got in await cur.read_entries(n):  # type: ignore[attr-defined]
            out.append((key, got.value.get("v", b""), len(got.value)))
    await cur.close()  # type: ignore[attr-defined]
    return out


@pytest.mark.parametrize("cached", [False, True])
async def test_ranges_across_many_pages_match_a_sorted_model(tmp_path: Path, cached: bool) -> None:
    from metastore.api import Order

    keys = [f"k{i:04d}" for i in range(0, 1400, 2)]  # 700 keys: several 256-entry pages
    ms = await open_metastore(f"lmdb://{tmp_path}")
    t = await ms.create_scannable_table("t")
    await asyncio.gather(*(t.put(k, Value({"v": k.encode(), "w": b"1"}), Version.NEW) for k in keys))
    if not cached:  # reopened: every record is decoded, none comes from the cache
        await ms.close()
        ms = await open_metastore(f"lmdb://{tmp_path}")
        t = await ms.create_scannable_table("t")
    cases = [("", True, "", True), ("k0100", True, "k0900", False), ("k0101", False, "k0901", True),
             ("k0100", False, "k0100", True), ("k9999", True, "", True), ("", True, "k0000", False)]
    try:
        for lo, lo_in, hi, hi_in in cases:
            want = [k for k in keys if (not lo or k > lo or (lo_in and k == lo))
                    and (not hi or k < hi or (hi_in and k == hi))]
            got = await _collect(await t.open_cursor_range(lo, lo_in, hi, hi_in, Order.ASC, {"v"}), 7)
            assert got == [(k, k.encode(), 1) for k in want], (lo, lo_in, hi, hi_in)
            # DESC starts at the high key
            got = await _collect(await t.open_cursor_range(hi, hi_in, lo, lo_in, Order.DESC), 300)
            assert got == [(k, k.encode(), 2) for k in reversed(want)], (hi, hi_in, lo, lo_in, "desc")
    finally:
        await ms.close()


async def test_raw_decoding_scan_sees_what_the_cursor_sees_and_close_drops_the_cache(tmp_path: Path) -> None:
    from metastore.testing.rawclients import lmdb_decoding_scan

    ms = await open_metastore(f"lmdb://{tmp_path}")
    t = await ms.create_scannable_table("ledgers")
    await asyncio.gather(*(t.put(f"{i:020d}", Value({"data": b"x"}), Version.NEW) for i in range(300)))
    assert len(await _collect(await t.open_cursor(), 1000)) == 300
    raw = t.raw  # type: ignore[attr-defined]
    assert raw._cache  # puts fill the decoded-record cache ...
    await ms.close()
    assert not raw._cache  # ... which a closed table gives back
    assert lmdb_decoding_scan(str(tmp_path), "ledgers") == 300


def test_any_range_in_either_order_matches_the_contract(tmp_path: Path) -> None:
    """Hypothesis hunts for a range or page boundary where the lmdb cursor and ``in_range`` disagree."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from metastore import sync
    from metastore.api import Order, in_range

    alphabet = st.sampled_from("ab\x00é\U0001f600")
    keys_st = st.sets(st.text(alphabet, min_size=1, max_size=3), max_size=40)
    bound = st.one_of(st.just(""), st.text(alphabet, min_size=1, max_size=3))
    store = sync.open_metastore(f"lmdb://{tmp_path}")
    t = store.create_scannable_table("t")

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(keys=keys_st, lo=bound, lo_in=st.booleans(), hi=bound, hi_in=st.booleans(),
           order=st.sampled_from([Order.ASC, Order.DESC]), batch=st.integers(1, 5))
    def check(keys: set[str], lo: str, lo_in: bool, hi: str, hi_in: bool, order: Order, batch: int) -> None:
        if lo and hi and hi < lo:
            lo, hi, lo_in, hi_in = hi, lo, hi_in, lo_in
        first, first_in, last, last_in = (lo, lo_in, hi, hi_in) if order is Order.ASC else (hi, hi_in, lo, lo_in)
        for k in keys:
            t.put(k, Value({"v": k.encode("utf-8", "surrogatepass")}), Version.NEW)
        want = sorted((k for k in keys if in_range(k, first, first_in, last, last_in, order)),
                      reverse=order is Order.DESC)
        cur = t.open_cursor_range(first, first_in, last, last_in, order)
        got: list[str] = []
        while cur.has_more() and len(got) <= len(keys):  # a cursor that repeats itself fails, not hangs
            got += [k for k, _ in cur.read_entries(batch)]
        cur.close()
        for k in keys:
            t.remove(k, Version.ANY)
        assert got == want

    try:
        check()
    finally:
        store.close()


@pytest.mark.parametrize("make_dir", [False, True])
async def test_opening_an_existing_store_never_creates_one(tmp_path: Path, make_dir: bool) -> None:
    """Clients and tools (``open_existing_metastore``, ``create=false``) fail naming the path; servers create."""
    from metastore import open_existing_metastore
    from metastore.errors import StoreNotFoundError

    path = tmp_path / "typo"
    if make_dir:
        path.mkdir()
    for opener in (open_existing_metastore(f"lmdb://{path}"), open_metastore(f"lmdb://{path}?create=false")):
        with pytest.raises(StoreNotFoundError, match=f"no lmdb metastore at {path}") as err:
            await opener
        assert isinstance(err.value, ServiceDownError) and len(str(err.value).splitlines()) == 1
    assert path.is_dir() == make_dir and not (path / "data.mdb").exists()
    ms = await open_metastore(f"lmdb://{path}")          # a server: creates it
    await (await ms.create_table("t")).put("k", Value({"a": b"1"}), Version.NEW)
    await ms.close()
    again = await open_existing_metastore(f"lmdb://{path}")
    assert (await (await again.create_table("t")).get("k")).value == {"a": b"1"}
    await again.close()


async def test_relative_lmdb_uri_is_relative_to_the_working_directory(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    ms = await open_metastore("lmdb://data/metastore")   # the stock confs' metastore_uri
    await ms.close()
    assert (tmp_path / "data" / "metastore" / "data.mdb").is_file()


def test_a_blocking_store_opened_while_its_thread_starts_late_still_opens(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """On a busy machine the loop thread may start after the first ``run``: the store must wait for it
    (it once refused with "blocking metastore is closed", then failed to close a running loop)."""
    import time

    from metastore import sync

    real_new_loop = asyncio.new_event_loop

    def late_loop() -> asyncio.AbstractEventLoop:
        loop = real_new_loop()
        run_forever = loop.run_forever

        def slow_start() -> None:
            time.sleep(0.3)
            run_forever()
        loop.run_forever = slow_start  # type: ignore[method-assign]
        return loop

    monkeypatch.setattr(sync.asyncio, "new_event_loop", late_loop)
    store = sync.open_metastore(f"lmdb://{tmp_path / 'late'}")
    try:
        table = store.create_table("t")
        table.put("k", Value({"f": b"v"}), Version.NEW)
        assert table.get("k").value == Value({"f": b"v"})
    finally:
        store.close()


async def test_urgent_writes_overtake_the_queued_backlog(tmp_path: Path) -> None:
    """The writer's priority lane: a job submitted urgent behind 1 000 queued ones commits before them."""
    ms = await open_metastore(f"lmdb://{tmp_path}")
    writer = ms.shared.writer  # type: ignore[attr-defined]
    gate = threading.Event()
    inside = threading.Event()
    order: list[str] = []

    def hold(txn: object) -> None:
        inside.set()
        assert gate.wait(timeout=30)

    def record(txn: object, name: str) -> str:
        order.append(name)
        return name

    held = writer.submit(hold, ())       # the thread is busy with this one's commit meanwhile
    assert await asyncio.to_thread(inside.wait, 30)   # (its group formed: nothing below joins it)
    bulk = [writer.submit(record, (f"bulk{i}",)) for i in range(1000)]
    urgent = writer.submit(record, ("urgent",), urgent=True)
    gate.set()
    assert await asyncio.wait_for(urgent, 30) == "urgent"
    await asyncio.wait_for(asyncio.gather(held, *bulk), 30)
    assert order[0] == "urgent"
    assert order[1:] == [f"bulk{i}" for i in range(1000)]   # the bulk lane keeps its order
    await ms.close()


async def test_session_renews_while_a_write_backlog_drains(tmp_path: Path) -> None:
    """Issue 34: a lease renewal never queues behind a burst's writes (on the old FIFO writer it waited for
    the whole backlog, here 8 s or more of slow writes, and a 2 s session expired). It waits for the group
    committing when it comes: 256 writes, ~0.1 s on a quiet machine, well under a second on a loaded one
    (a 0.6 s session was too tight for the full suite's load)."""
    ms = await open_metastore(f"lmdb://{tmp_path}")
    writer = ms.shared.writer  # type: ignore[attr-defined]
    fast = threading.Event()

    def slow(txn: object) -> None:   # a slow disk: each write of the backlog takes 0.4 ms
        if not fast.is_set():
            time.sleep(0.0004)

    sess = await ms.session(timeout=2.0)
    try:
        backlog = [writer.submit(slow, ()) for _ in range(20000)]
        loop = asyncio.get_running_loop()
        until = loop.time() + 5.0     # 2.5 leases, 7 renewals; the backlog lasts 8 s at least
        while loop.time() < until:
            assert sess.alive, "the session expired while the backlog drained"
            await asyncio.sleep(0.05)
        assert not all(f.done() for f in backlog)   # the backlog was still there all along
        assert sess.alive
    finally:
        fast.set()
        await asyncio.wait_for(asyncio.gather(*backlog), 30)
        await sess.close()
        await ms.close()


async def test_session_renews_while_the_event_loop_is_blocked(tmp_path: Path) -> None:
    """Issue 34: the lease is renewed from a thread of its own, so an event loop busy for longer than the
    lease (a hub acquiring thousands of topics at once) does not lose it. On a loop-driven heartbeat the
    session had expired when the loop came back. ``close`` stops the thread and removes the lease."""
    from metastore.lease import SESSIONS_TABLE

    ms = await open_metastore(f"lmdb://{tmp_path}")
    sess = await ms.session(timeout=0.6)
    try:
        time.sleep(2.0)                 # the loop blocked: 3 leases, about 10 renewals due meanwhile
        assert sess.alive, "the session expired while the event loop was blocked"
        raw = await ms._open_raw_table(SESSIONS_TABLE, False)  # type: ignore[attr-defined]
        renewed = LeaseRecord.FromString((await raw.get(sess.session_id)).value["lease"])
        assert renewed.expires_ms / 1000 > time.time()          # the stored lease is current too
    finally:
        await sess.close()
    assert not sess.alive and not any(t.name.startswith("lease-") for t in threading.enumerate())
    with pytest.raises(NoKeyError):
        await raw.get(sess.session_id)
    await ms.close()


async def test_a_read_answers_an_expired_ephemeral_key_absent_and_a_create_right_after_wins(tmp_path: Path) -> None:
    """Issue 34: a read that meets an expired session's ephemeral key answers ``NoKeyError`` without
    waiting for the sweep (it answers while no write can commit; it used to wait for the sweep's commit).
    The sweep (a CAS on the dead record's version) and a create queued right behind it both land, in
    that order, and the created record is the one that stays (a takeover's read-then-claim)."""
    from metastore.lease import LEASE_FIELD

    ms = await open_metastore(f"lmdb://{tmp_path}")
    try:
        owners = await ms.create_table("owners")
        raw = owners.raw  # type: ignore[attr-defined]
        for i in range(50):   # records of a session that never renewed (no lease record: expired)
            await raw.put(f"t{i}", Value({"o": b"dead", LEASE_FIELD: b"gone:1:0"}), Version.NEW)
        writer = ms.shared.writer  # type: ignore[attr-defined]
        gate, inside = threading.Event(), threading.Event()

        def hold(txn: object) -> None:
            inside.set()
            assert gate.wait(timeout=30)

        held = writer.submit(hold, ())       # no write commits meanwhile: a read that waited would hang
        assert await asyncio.to_thread(inside.wait, 30)
        try:
            with pytest.raises(NoKeyError):
                await asyncio.wait_for(owners.get("t0"), 5)
        finally:
            gate.set()
            await held
        sess = await ms.session(timeout=5.0)
        for i in range(50):
            with pytest.raises(NoKeyError):
                await owners.get(f"t{i}")
            await sess.put_ephemeral(owners, f"t{i}", Value({"o": b"me"}))   # no KeyExistsError
        for i in range(50):
            assert (await owners.get(f"t{i}")).value == Value({"o": b"me"})
            assert (await raw.get(f"t{i}")).value[LEASE_FIELD] == sess.session_id.encode()
        await sess.close()
    finally:
        await ms.close()


async def test_a_create_over_an_expired_ephemeral_key_is_one_write(tmp_path: Path) -> None:
    """Issue 34: a takeover's claim of a dead hub's topic replaces the expired ephemeral record in one
    compare-and-set write (it was a failed create, a read, a removal and a create again). The old
    record's other fields go; a live session's record still refuses the create."""
    from metastore.errors import KeyExistsError
    from metastore.lease import LEASE_FIELD

    ms = await open_metastore(f"lmdb://{tmp_path}")
    try:
        owners = await ms.create_table("owners")
        raw = owners.raw  # type: ignore[attr-defined]
        await raw.put("t", Value({"o": b"dead", "extra": b"x", LEASE_FIELD: b"gone:1:0"}), Version.NEW)
        old = (await raw.get("t")).version
        sess = await ms.session(timeout=60.0)   # no renewal write within the count below
        writes = ms.commit_counts()[1]  # type: ignore[attr-defined]
        new = await sess.put_ephemeral(owners, "t", Value({"o": b"me"}))
        assert ms.commit_counts()[1] - writes == 1  # type: ignore[attr-defined]
        assert old < new
        got = await raw.get("t")
        assert got.value == Value({"o": b"me", LEASE_FIELD: sess.session_id.encode()})
        other = await ms.session(timeout=5.0)
        with pytest.raises(KeyExistsError):
            await other.put_ephemeral(owners, "t", Value({"o": b"other"}))
        with pytest.raises(KeyExistsError):
            await owners.put("t", Value({"o": b"plain"}), Version.NEW)
        await other.close()
        await sess.close()
    finally:
        await ms.close()


async def test_a_read_then_a_create_of_an_expired_ephemeral_key_is_one_write_and_a_lone_read_sweeps(
        tmp_path: Path) -> None:
    """Issue 34: a takeover's claim reads the dead owner's record (absent to it) and creates its own in the
    same loop turn: the sweep the read queued is dropped, the create replaces the record, one write in
    all. A read that no create follows still sweeps the record."""
    from metastore.lease import LEASE_FIELD

    ms = await open_metastore(f"lmdb://{tmp_path}")
    try:
        owners = await ms.create_table("owners")
        raw = owners.raw  # type: ignore[attr-defined]
        for key in ("claimed", "left"):
            await raw.put(key, Value({"o": b"dead", LEASE_FIELD: b"gone:1:0"}), Version.NEW)
        sess = await ms.session(timeout=60.0)   # no renewal write within the count below
        writes = ms.commit_counts()[1]  # type: ignore[attr-defined]
        with pytest.raises(NoKeyError):
            await owners.get("claimed")
        await sess.put_ephemeral(owners, "claimed", Value({"o": b"me"}))
        await asyncio.sleep(0)   # the end of the loop turn: a sweep still queued would be sent now
        await raw.put("barrier", Value({"b": b"1"}), Version.NEW)   # the writer runs its queue in order
        assert (await owners.get("claimed")).value == Value({"o": b"me"})
        assert ms.commit_counts()[1] - writes == 2  # type: ignore[attr-defined]   # the claim and the barrier
        with pytest.raises(NoKeyError):
            await owners.get("left")
        async with asyncio.timeout(10):
            while True:   # the sweep of the record nobody created again lands
                try:
                    await raw.get("left")
                except NoKeyError:
                    break
                await asyncio.sleep(0.01)
        await sess.close()
    finally:
        await ms.close()
