"""Entry storage group commit: pipelined completions, the append fast path, callback isolation."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bookie.errors import BadRequestError, BookieServerError, LedgerFencedError, UnauthorizedError
from bookie.journal import Position
from bookie.storage import LAST_ENTRY, EntryStorage

KEY = b"k" * 20
MAX_ID = (1 << 63) - 1

pytestmark = pytest.mark.timeout(60)


def _payload(i: int) -> bytes:
    return i.to_bytes(8, "big") * 3


def _noop(_exc: BaseException | None) -> None:
    pass


async def test_pipelined_adds_are_acked_in_order_and_only_once_committed(storage: EntryStorage) -> None:
    """Callbacks that add again (a client keeping ``window`` adds outstanding), as the server sees them."""
    window, total = 200, 3000
    acked: list[int] = []
    problems: list[str] = []
    sizes: list[int] = []
    storage.on_commit = lambda n, _secs: sizes.append(n)
    finished = asyncio.get_running_loop().create_future()
    next_id = 0

    def submit() -> None:
        nonlocal next_id
        eid = next_id
        next_id += 1

        def done(exc: BaseException | None) -> None:
            if exc is not None:
                problems.append(f"{eid}: {exc!r}")
            elif storage.read_entry(1, eid) != (eid, _payload(eid)):  # reads see committed entries only
                problems.append(f"{eid} acknowledged before its commit")
            acked.append(eid)
            if next_id < total:
                submit()
            elif len(acked) == total:
                finished.set_result(None)

        storage.submit_add(1, eid, KEY, _payload(eid), eid - 1, done)

    for _ in range(window):
        submit()
    await asyncio.wait_for(finished, 30)
    assert problems == []
    assert acked == list(range(total))
    assert sum(sizes) == total and storage.entry_count() == total
    # The first batch holds the whole window; from then on the callbacks' adds are handed
    # to the commit thread while the rest of the callbacks still run: the window splits.
    assert sizes[0] == window
    assert all(n < window for n in sizes[1:])
    assert storage.read_lac(1) == total - 2


async def test_out_of_order_rewritten_and_duplicate_entries(storage: EntryStorage) -> None:
    for i in range(10):  # ascending past everything stored: the append path
        storage.submit_add(5, i, KEY, b"a%d" % i, -1, _noop)
    await storage.flush()
    storage.submit_add(2, 0, KEY, b"lower ledger", -1, _noop)  # sorts before stored keys
    storage.submit_add(5, 3, KEY, b"rewritten", -1, _noop)
    await storage.flush()
    storage.submit_add(5, 10, KEY, b"first", -1, _noop)  # the same key twice in one batch
    storage.submit_add(5, 10, KEY, b"second", -1, _noop)
    storage.submit_add(5, 11, KEY, b"next", -1, _noop)
    await storage.flush()
    storage.submit_add(5, 13, KEY, b"13", -1, _noop)  # descending within a batch
    storage.submit_add(5, 12, KEY, b"12", -1, _noop)
    await storage.flush()
    assert storage.read_entry(2, 0) == (0, b"lower ledger")
    assert storage.read_entry(5, 3) == (3, b"rewritten")
    assert storage.read_entry(5, 9) == (9, b"a9")
    assert storage.read_entry(5, 10) == (10, b"second")  # the later add wins, as with plain puts
    assert storage.read_entry(5, 11) == (11, b"next")
    assert storage.read_entry(5, 12) == (12, b"12")
    assert storage.read_entry(5, LAST_ENTRY) == (13, b"13")
    assert storage.entry_count() == 15


async def test_a_raising_callback_or_hook_does_not_stop_the_others(storage: EntryStorage,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    acks: list[BaseException | None] = []

    def bad(_exc: BaseException | None) -> None:
        raise RuntimeError("boom")

    def bad_hook(_n: int, _secs: float) -> None:
        raise RuntimeError("hook")

    storage.on_commit = bad_hook
    with caplog.at_level(logging.ERROR, logger="bookie.storage"):
        storage.submit_add(1, 0, KEY, b"x", -1, acks.append)
        storage.submit_add(1, 1, KEY, b"y", -1, bad)
        storage.submit_add(1, 2, KEY, b"z", -1, acks.append)
        fut = storage.add_entry(1, 3, KEY, b"w")
        await storage.flush()
    assert acks == [None, None]
    assert fut.done() and fut.exception() is None
    assert "completion callback raised" in caplog.text and "on_commit hook raised" in caplog.text


async def test_failed_checkpoint_reaches_every_callback_once(tmp_path: Path) -> None:
    # 1 MiB map and a 64 KiB cache: the checkpoint fails, the cache fills, throttled adds fail after 0.2 s
    s = EntryStorage(tmp_path / "s", map_size=1 << 20, write_cache_max_size=64 << 10, max_throttle=0.2)
    try:
        results: dict[int, list[BaseException | None]] = {}
        all_done = asyncio.Event()

        def record(i: int) -> Callable[[BaseException | None], None]:
            results[i] = []

            def done(exc: BaseException | None) -> None:
                results[i].append(exc)
                if all(results.values()):
                    all_done.set()
            return done

        for wave in range(100):  # waves of 20 until the full cache refuses some
            for i in range(wave * 20, wave * 20 + 20):
                s.submit_add(1, i, KEY, b"x" * 4000, -1, record(i))
            all_done.clear()
            await asyncio.wait_for(all_done.wait(), 10)  # throttled adds fail on the storage's timer
            if any(r[0] is not None for r in results.values()):
                break
        assert all(len(r) == 1 for r in results.values())
        outcomes = [r[0] for r in results.values()]
        assert any(isinstance(o, BookieServerError) for o in outcomes)
        assert all(o is None or isinstance(o, BookieServerError) for o in outcomes)
    finally:
        await s.close()


async def test_id_bounds(storage: EntryStorage) -> None:
    acks: list[BaseException | None] = []
    storage.submit_add(MAX_ID, MAX_ID, KEY, b"edge", -1, acks.append)
    for ledger_id, entry_id in ((MAX_ID + 1, 0), (0, MAX_ID + 1), (1 << 64, 0), (-1, 0), (0, -1)):
        with pytest.raises(BadRequestError):
            storage.submit_add(ledger_id, entry_id, KEY, b"x", -1, acks.append)
    await storage.flush()
    assert acks == [None]
    assert storage.read_entry(MAX_ID, LAST_ENTRY) == (MAX_ID, b"edge")


async def test_close_ends_the_commit_thread(tmp_path: Path) -> None:
    before = {t for t in threading.enumerate() if t.name == "bookie-journal"}
    s = EntryStorage(tmp_path / "s", map_size=64 << 20)
    await s.add_entry(1, 0, KEY, b"x")
    mine = [t for t in threading.enumerate() if t.name == "bookie-journal" and t not in before]
    assert len(mine) == 1 and mine[0].is_alive()
    await s.close()
    assert not mine[0].is_alive()


async def test_small_groups_are_written_on_the_loop_and_large_ones_on_the_journal_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = EntryStorage(tmp_path / "s", map_size=64 << 20)
    writers: list[tuple[str, int]] = []
    real = s.journal.writer.append

    def append(data: bytes) -> Position:
        writers.append((threading.current_thread().name, len(data)))
        return real(data)

    monkeypatch.setattr(s.journal.writer, "append", append)
    try:
        await s.add_entry(1, 0, KEY, b"x")  # one add: no hand-off
        assert [name for name, _ in writers] == [threading.main_thread().name]
        writers.clear()
        await asyncio.gather(*(s.add_entry(1, i, KEY, b"x") for i in range(1, 101)))  # one turn, 100 adds
        assert writers[0][0] == "bookie-journal"
        writers.clear()
        s.journal.sync_estimate = 0.5  # a slow disk: the loop never waits for it
        await s.add_entry(1, 101, KEY, b"x")
        assert [name for name, _ in writers] == ["bookie-journal"]
        assert s.read_entry(1, LAST_ENTRY)[0] == 101
    finally:
        await s.close()


async def test_one_slow_sync_leaves_small_groups_on_the_loop_but_a_slow_disk_does_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = EntryStorage(tmp_path / "s", map_size=64 << 20)
    writers: list[str] = []
    slow: list[float] = []   # extra seconds of the next syncs (a slow device), one per sync
    real = s.journal.writer.append

    def append(data: bytes) -> Position:
        writers.append(threading.current_thread().name)
        if slow:
            time.sleep(slow.pop())   # the device takes this long: what the journal times is the write
        return real(data)

    monkeypatch.setattr(s.journal.writer, "append", append)
    loop_thread = threading.main_thread().name
    try:
        await s.add_entry(1, 0, KEY, b"x")
        slow.append(0.01)   # one sync five times the limit (the machine was busy)
        await s.add_entry(1, 1, KEY, b"x")
        assert s.journal.last_sync_seconds >= 0.01
        await s.add_entry(1, 2, KEY, b"x")
        assert writers == [loop_thread] * 3   # the next small group is still written on the loop
        slow.extend([0.01] * 10)   # a slow disk: every sync takes 10 ms
        for entry_id in range(3, 13):
            await s.add_entry(1, entry_id, KEY, b"x")
        assert writers[-1] == "bookie-journal"   # the loop no longer waits for the disk
        assert s.journal.sync_estimate >= 0.002
        assert s.read_entry(1, LAST_ENTRY)[0] == 12
    finally:
        await s.close()


async def test_acked_adds_complete_in_runs_in_submission_order(storage: EntryStorage) -> None:
    calls: list[tuple[str, list[bytes] | None, BaseException | None]] = []

    def sink_a(acks: list[bytes], exc: BaseException | None) -> None:
        calls.append(("a", list(acks), exc))

    def sink_b(acks: list[bytes], exc: BaseException | None) -> None:
        calls.append(("b", list(acks), exc))

    storage.submit_acked_add(sink_a, b"a0", 1, 0, KEY, b"x", -1)
    storage.submit_acked_add(sink_a, b"a1", 1, 1, KEY, b"x", 0)
    storage.submit_add(1, 2, KEY, b"x", 1, lambda exc: calls.append(("done", None, exc)))
    storage.submit_acked_add(sink_a, b"a3", 1, 3, KEY, b"x", 2)   # a new run: a callback came between
    storage.submit_acked_add(sink_b, b"b0", 2, 0, KEY, b"x", -1)
    storage.submit_acked_add(sink_b, b"b1", 2, 1, KEY, b"x", 0)
    await storage.flush()
    assert calls == [("a", [b"a0", b"a1"], None), ("done", None, None), ("a", [b"a3"], None),
                     ("b", [b"b0", b"b1"], None)]
    assert storage.read_entry(1, LAST_ENTRY)[0] == 3 and storage.read_lac(1) == 2


async def test_acked_adds_are_refused_like_any_add(storage: EntryStorage) -> None:
    heard: list[list[bytes]] = []

    def sink(acks: list[bytes], exc: BaseException | None) -> None:
        heard.append(list(acks))

    storage.submit_acked_add(sink, b"ok", 1, 0, KEY, b"x", -1)
    await storage.fence(2, KEY)
    with pytest.raises(UnauthorizedError):
        storage.submit_acked_add(sink, b"key", 1, 1, b"w" * 20, b"x", -1)
    with pytest.raises(LedgerFencedError):
        storage.submit_acked_add(sink, b"fenced", 2, 0, KEY, b"x", -1)
    for ledger_id, entry_id in ((-1, 0), (0, -1), (MAX_ID + 1, 0), (0, MAX_ID + 1)):
        with pytest.raises(BadRequestError):
            storage.submit_acked_add(sink, b"range", ledger_id, entry_id, KEY, b"x", -1)
    storage.submit_acked_add(sink, b"recovery", 2, 0, KEY, b"x", -1, recovery=True)
    await storage.flush()
    assert heard == [[b"ok"], [b"recovery"]]


async def test_throttled_acked_adds_fail_one_by_one(tmp_path: Path) -> None:
    # as test_failed_checkpoint_reaches_every_callback_once: the cache fills, throttled adds fail after 0.2 s
    s = EntryStorage(tmp_path / "s", map_size=1 << 20, write_cache_max_size=64 << 10, max_throttle=0.2)
    try:
        outcomes: dict[bytes, list[BaseException | None]] = {}
        all_done = asyncio.Event()

        def sink(acks: list[bytes], exc: BaseException | None) -> None:
            for ack in acks:
                outcomes[ack].append(exc)
            if all(outcomes.values()):
                all_done.set()

        for wave in range(100):
            for i in range(wave * 20, wave * 20 + 20):
                ack = b"%d" % i
                outcomes[ack] = []
                s.submit_acked_add(sink, ack, 1, i, KEY, b"x" * 4000, -1)
            all_done.clear()
            await asyncio.wait_for(all_done.wait(), 10)
            if any(r[0] is not None for r in outcomes.values()):
                break
        assert all(len(r) == 1 for r in outcomes.values())   # each add heard of exactly once
        assert any(isinstance(r[0], BookieServerError) for r in outcomes.values())
    finally:
        await s.close()
