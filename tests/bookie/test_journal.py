"""The journal and the write cache: replay, torn tails, damage in the middle, checkpoints, old directories."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import signal
import struct
import threading
from pathlib import Path

import lmdb
import pytest

from bookie import journal
from bookie import protocol as proto
from bookie.digest import decode_entry
from bookie.errors import BookieServerError, LedgerFencedError, NoSuchEntryError, UnauthorizedError
from bookie.journal import JournalCorruptError
from bookie.proto.bookie_pb2 import LedgerIndexRecord
from bookie.segments import SEGMENT_ENTRIES
from bookie.storage import LAST_ENTRY, EntryStorage, entry_key
from bookie.testing import RawBookieClient
from tests.bookie.conftest import StartBookie, add_req

KEY = b"k" * 20


def _open(path: Path, **kw: object) -> EntryStorage:
    return EntryStorage(path, map_size=64 << 20, **kw)  # type: ignore[arg-type]


def _journal_files(path: Path) -> list[Path]:
    return [path / "journal" / journal.file_name(f) for f in journal.journal_files(path / "journal")]


async def _write_and_crash(path: Path, n: int) -> None:
    """Adds ``n`` entries and a fence, then leaves without a checkpoint (as a kill -9 would)."""
    s = _open(path, flush_interval=3600)
    await asyncio.gather(*(s.add_entry(1, i, KEY, b"%d" % i, i - 1) for i in range(n)))
    await s.fence(2, b"other-key" * 2)
    s.journal.writer.close()  # no close(): nothing is checkpointed
    s.index.env.close()


async def test_replay_restores_entries_fence_master_key_and_lac(tmp_path: Path) -> None:
    await _write_and_crash(tmp_path / "s", 50)
    s = _open(tmp_path / "s")
    try:
        assert s.replayed == 50
        assert [s.read_entry(1, i)[1] for i in range(50)] == [b"%d" % i for i in range(50)]
        assert s.read_entry(1, LAST_ENTRY)[0] == 49 and s.read_lac(1) == 48
        with pytest.raises(UnauthorizedError):
            await s.add_entry(1, 50, b"x" * 20, b"x")
        with pytest.raises(LedgerFencedError):
            await s.add_entry(2, 0, b"other-key" * 2, b"x")
        assert len(_journal_files(tmp_path / "s")) == 1  # the replayed files are gone; a new one is open
    finally:
        await s.close()


async def test_a_lac_piggybacked_on_a_frame_s_adds_is_replayed_from_their_headers_without_lac_records(
        tmp_path: Path) -> None:
    """Issue 34: a LAC that a frame's add raises is in that add's entry header, so the group journals no LAC record
    for it; a crash before any checkpoint still restores each ledger's highest LAC (from the headers), and an
    explicit LAC above it in the same group keeps its record."""
    s = _open(tmp_path / "s", flush_interval=3600)
    for ledger_id in (1, 2, 3):   # known ledgers: admit_frame admits their adds
        await s.add_entry(ledger_id, 0, KEY, add_req(ledger_id, 0).body, -1)
    start = s.journal.synced
    loop = asyncio.get_running_loop()
    frame_done, lac_done = loop.create_future(), loop.create_future()
    frame = [add_req(lid, eid, lac=lac).body for lid, eid, lac in
             [(1, 1, 0), (2, 1, 0), (1, 2, 1), (2, 2, 1), (1, 3, 0), (3, 1, -1)]]
    def sink(acks: list[object], exc: BaseException | None) -> None:   # the frame's one ack, as a connection's
        frame_done.set_result(exc if acks == ["frame"] else acks)
    assert s.journal.admit_frame(frame, 0, True, KEY, False, sink, "frame") == len(frame)
    s.submit_write_lac(2, KEY, 2, lac_done.set_result)   # the same group: above what ledger 2's adds carry
    assert await frame_done is None and await lac_done is None
    records = list(journal.read_journal(tmp_path / "s" / "journal", start))
    assert [(r.ledger_id, r.entry_id) for r in records if r.kind == journal.ADD] == [
        (1, 1), (2, 1), (1, 2), (2, 2), (1, 3), (3, 1)]
    assert [(r.ledger_id, r.lac) for r in records if r.kind == journal.LAC] == [(2, 2)]
    assert (s.read_lac(1), s.read_lac(2), s.read_lac(3)) == (1, 2, -1)
    s.journal.writer.close()   # a kill -9: no checkpoint
    s.index.env.close()
    s = _open(tmp_path / "s")
    try:
        assert s.replayed == 9
        assert (s.read_lac(1), s.read_lac(2), s.read_lac(3)) == (1, 2, -1)
        assert [s.read_entry(1, i)[1] for i in (1, 2, 3)] == [frame[0], frame[2], frame[4]]
    finally:
        await s.close()


@pytest.mark.parametrize("damage", ["truncate", "flip"])
async def test_a_torn_tail_ends_the_replay_cleanly(tmp_path: Path, damage: str) -> None:
    await _write_and_crash(tmp_path / "s", 20)
    (last_file,) = _journal_files(tmp_path / "s")
    data = last_file.read_bytes().rstrip(b"\0")
    if damage == "truncate":  # the last record (the fence) half written
        last_file.write_bytes(data[:-5])
    else:  # its last byte damaged
        last_file.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    s = _open(tmp_path / "s")
    try:
        assert [s.read_entry(1, i)[1] for i in range(20)] == [b"%d" % i for i in range(20)]
        assert s.ledger_info(2) is not None  # the LEDGER record before the torn FENCE survived
        assert not s.ledger_info(2).fenced  # type: ignore[union-attr]
    finally:
        await s.close()


async def test_damage_in_the_middle_refuses_to_start_naming_file_and_offset(tmp_path: Path) -> None:
    await _write_and_crash(tmp_path / "s", 20)
    (last_file,) = _journal_files(tmp_path / "s")
    data = bytearray(last_file.read_bytes())
    offset = 0
    for _ in range(5):  # the sixth record
        offset += journal.HEADER.size + journal.HEADER.unpack_from(data, offset)[0]
    data[offset + journal.HEADER.size + 3] ^= 0xFF
    last_file.write_bytes(bytes(data))
    with pytest.raises(JournalCorruptError, match=rf"{last_file.name}.* offset {offset}\b"):
        _open(tmp_path / "s")
    # nothing was dropped: repairing the byte makes the store open with every entry
    data[offset + journal.HEADER.size + 3] ^= 0xFF
    last_file.write_bytes(bytes(data))
    s = _open(tmp_path / "s")
    try:
        assert s.replayed == 20
    finally:
        await s.close()


async def test_checkpoint_moves_entries_to_lmdb_and_deletes_old_journal_files(tmp_path: Path) -> None:
    # 64 KiB journal files: 200 adds of 1 KiB roll several files
    s = _open(tmp_path / "s", journal_max_size=64 << 10, journal_preallocate=16 << 10, flush_interval=3600)
    try:
        for i in range(200):
            await s.add_entry(1, i, KEY, bytes([i % 256]) * 1024, i - 1)
        assert len(_journal_files(tmp_path / "s")) >= 3
        assert s.cache_bytes == 200 * 1024
        await s.checkpoint()
        assert s.cache_bytes == 0 and s.checkpoints == 1
        assert len(_journal_files(tmp_path / "s")) == 1  # only the current file is left
        with s.index.env.begin() as txn:
            assert txn.stat(s.index.store.segments)["entries"] >= 1
        assert all(s.read_entry(1, i)[1] == bytes([i % 256]) * 1024 for i in range(200))  # now from LMDB
    finally:
        await s.close()


async def test_rewritten_entries_merge_with_stored_segments(tmp_path: Path) -> None:
    s = _open(tmp_path / "s", flush_interval=3600)
    try:
        n = SEGMENT_ENTRIES + 100  # two segments
        for i in range(0, n, 2):  # a write set's share: every other entry
            s.submit_add(1, i, KEY, b"a%d" % i, -1, lambda _exc: None)
        await s.checkpoint()
        # recovery rewrites a range inside the stored segments and adds the odd ids next to them
        for i in range(10, 30):
            await s.add_entry(1, i, KEY, b"b%d" % i, recovery=True)
        await s.checkpoint()
        expect = {i: b"a%d" % i for i in range(0, n, 2)} | {i: b"b%d" % i for i in range(10, 30)}
        assert {i: s.read_entry(1, i)[1] for i in expect} == expect
        assert s.entry_count() == len(expect)
        with pytest.raises(NoSuchEntryError):
            s.read_entry(1, 31)
        assert s.read_entry(1, LAST_ENTRY)[0] == n - 2
    finally:
        await s.close()


async def test_a_directory_written_before_the_journal_still_opens(tmp_path: Path) -> None:
    path = tmp_path / "old"
    env = lmdb.open(str(path), map_size=64 << 20, max_dbs=2)
    entries, ledgers = env.open_db(b"entries"), env.open_db(b"ledgers")
    with env.begin(write=True) as txn:
        for i in range(10):
            txn.put(entry_key(7, i), b"old%d" % i, db=entries)
        txn.put((7).to_bytes(8, "big"), LedgerIndexRecord(master_key=KEY, fenced=False, lac=8).SerializeToString(),
                db=ledgers)
    env.close()
    s = _open(path)
    try:
        assert s.read_entry(7, LAST_ENTRY) == (9, b"old9") and s.read_lac(7) == 8
        await s.add_entry(7, 10, KEY, b"new10", 9)
        await s.add_entry(7, 3, KEY, b"new3", recovery=True)
        await s.checkpoint()
        assert s.read_entry(7, 10)[1] == b"new10" and s.read_entry(7, 3)[1] == b"new3"
        assert s.read_entry(7, 4)[1] == b"old4" and s.read_entry(7, LAST_ENTRY)[0] == 10
        await s.delete_ledger(7)
        assert s.ledger_ids() == set()
    finally:
        await s.close()


async def test_a_full_cache_holds_adds_back_then_lets_them_in(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    s = _open(tmp_path / "s", write_cache_max_size=64 << 10, flush_interval=3600, max_throttle=5)
    gate = asyncio.Event()
    real = s.checkpointer.write
    loop = asyncio.get_running_loop()

    def slow_checkpoint(job: object) -> None:  # on the flush thread: held until the test lets it go
        asyncio.run_coroutine_threadsafe(gate.wait(), loop).result(10)
        real(job)  # type: ignore[arg-type]

    monkeypatch.setattr(s.checkpointer, "write", slow_checkpoint)
    try:
        i = 0
        while s.checkpointer.flushing is None:  # past half the cache (32 KiB), a checkpoint starts (and hangs)
            await s.add_entry(1, i, KEY, bytes(1024))
            i += 1
        while s.cache_bytes < 32 << 10:  # the new cache fills up too
            await s.add_entry(1, i, KEY, bytes(1024))
            i += 1
        assert i == 64
        held = [s.add_entry(1, i, KEY, bytes(1024)) for i in range(64, 100)]
        await asyncio.sleep(0.2)  # give them every chance: they must still wait
        assert not any(f.done() for f in held)
        assert s.cache_bytes <= 64 << 10
        gate.set()
        await asyncio.wait_for(asyncio.gather(*held), 10)
        assert s.read_entry(1, 99)[1] == bytes(1024)
    finally:
        gate.set()
        await s.close()


async def test_group_wait_batches_adds(tmp_path: Path) -> None:
    s = _open(tmp_path / "s", group_wait=0.05)
    try:
        futs = []
        for i in range(10):  # ten adds over ~10 ms, each in a loop turn of its own
            futs.append(s.add_entry(1, i, KEY, b"x"))
            await asyncio.sleep(0.001)
        await asyncio.gather(*futs)
        assert s.commits == 1
    finally:
        await s.close()


async def test_closing_checkpoints_so_nothing_is_left_to_replay(tmp_path: Path) -> None:
    s = _open(tmp_path / "s")
    await asyncio.gather(*(s.add_entry(3, i, KEY, b"x") for i in range(100)))
    await s.close()
    s = _open(tmp_path / "s")
    try:
        assert s.replayed == 0 and s.read_entry(3, LAST_ENTRY)[0] == 99
    finally:
        await s.close()


# --- kill -9 at random points -----------------------------------------------------------------------


def _loader(path: str, seed: int, conn) -> None:  # runs in a child process
    """Adds to three ledgers with frequent checkpoints (small cache, 20 ms interval); reports acks."""

    async def main() -> None:
        s = EntryStorage(path, map_size=256 << 20, write_cache_max_size=256 << 10, flush_interval=0.02,
                         journal_max_size=128 << 10, journal_preallocate=32 << 10)
        rng = random.Random(seed)
        acked: dict[int, int] = {1: -1, 2: -1, 3: -1}
        next_id = {1: s.last_entry_id(1) + 1, 2: s.last_entry_id(2) + 1, 3: s.last_entry_id(3) + 1}

        def done_for(lid: int, eid: int):
            def done(exc: BaseException | None) -> None:
                if exc is None and eid > acked[lid]:
                    acked[lid] = eid
                    conn.send((lid, eid))
            return done

        while True:
            for _ in range(rng.randint(1, 60)):
                lid = rng.choice((1, 2, 3))
                eid = next_id[lid]
                next_id[lid] = eid + 1
                s.submit_add(lid, eid, KEY, struct.pack(">qq", lid, eid) * rng.randint(1, 64), eid - 1,
                             done_for(lid, eid))
            await asyncio.sleep(rng.random() * 0.003)

    asyncio.run(main())


@pytest.mark.slow
async def test_kill_9_at_random_points_loses_no_acknowledged_add(tmp_path: Path) -> None:
    """Guarantee checked: every add acknowledged before a kill -9 reads back, bytes intact, after restart."""
    seed = int(os.environ.get("QUIRE_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    path = str(tmp_path / "s")
    ctx = multiprocessing.get_context("spawn")
    acked: dict[int, int] = {1: -1, 2: -1, 3: -1}
    for run in range(6):
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_loader, args=(path, rng.randrange(1 << 30), child))
        proc.start()
        child.close()
        try:
            kill_after = rng.uniform(0.3, 1.5)  # seconds of load: lands in a journal write, a flush or neither
            loop = asyncio.get_running_loop()
            deadline = loop.time() + kill_after + 30
            started = None
            while loop.time() < deadline:
                ready = await asyncio.to_thread(parent.poll, 1)
                if not ready:
                    continue
                lid, eid = parent.recv()
                acked[lid] = max(acked[lid], eid)
                started = started or loop.time()
                if loop.time() - started >= kill_after:
                    break
            assert started is not None, f"run {run}: no acknowledgement (seed {seed})"
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(10)
        try:
            while parent.poll():
                lid, eid = parent.recv()
                acked[lid] = max(acked[lid], eid)
        except EOFError:  # the writer is gone and everything it sent was read
            pass
        parent.close()
        s = EntryStorage(path, map_size=256 << 20)
        try:
            for lid, last in acked.items():
                for eid in range(last + 1):
                    got = s.read_entry(lid, eid)[1]
                    assert got[:16] == struct.pack(">qq", lid, eid), f"run {run}: {lid}:{eid} damaged (seed {seed})"
        except NoSuchEntryError as exc:
            raise AssertionError(f"run {run}: acknowledged add lost: {exc} (seed {seed})") from exc
        finally:
            await s.close()
    assert all(last > 0 for last in acked.values()), f"seed {seed}"


async def test_journal_write_error_then_recovery(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = _open(tmp_path / "s")
    real = s.journal.writer.append
    calls = {"n": 0}

    def flaky(data: bytes) -> journal.Position:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(5, "Input/output error")
        return real(data)

    monkeypatch.setattr(s.journal.writer, "append", flaky)
    try:
        with pytest.raises(BookieServerError, match="journal write failed"):
            await s.add_entry(1, 0, KEY, b"x")
        await s.add_entry(1, 1, KEY, b"y")  # the next group goes to the journal again
        assert s.read_entry(1, 1)[1] == b"y"
    finally:
        await s.close()


@pytest.mark.slow
async def test_kill_9_of_a_bookie_process_under_load_loses_no_acknowledged_add(start_bookie: StartBookie) -> None:
    """Guarantee checked: after a kill -9 of a bookie process (journal writes, checkpoints every 20 ms and
    journal file rolls all under way), every add it acknowledged reads back with its bytes."""
    seed = int(os.environ.get("QUIRE_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    settings = {"flush_interval": 20, "write_cache_max_size_mb": 1, "journal_max_size_mb": 1,
                "journal_preallocate_mb": 1}
    bookie = start_bookie("kb", **settings)
    port = bookie.address.rsplit(":", 1)[1]
    acked: set[int] = set()
    next_id = 0
    progress = asyncio.Event()
    want = 0

    def ack(r: object, eid: int) -> None:
        if isinstance(r, proto.Response) and r.status == proto.OK:
            acked.add(eid)
            if len(acked) >= want:
                progress.set()

    async def load(c: RawBookieClient, stop: asyncio.Event) -> None:
        nonlocal next_id
        while not stop.is_set():
            for _ in range(rng.randint(1, 200)):
                eid = next_id
                next_id += 1
                c.submit(add_req(11, eid, struct.pack(">q", eid) * rng.randint(1, 40)),
                         lambda r, eid=eid: ack(r, eid))
            c.flush()
            await asyncio.sleep(rng.random() * 0.005)

    for run in range(3):
        c = await RawBookieClient.connect(bookie.address)
        stop = asyncio.Event()
        want = len(acked) + 200
        progress.clear()
        task = asyncio.create_task(load(c, stop))
        await asyncio.wait_for(progress.wait(), 30)
        await asyncio.sleep(rng.uniform(0.0, 0.5))  # then the kill lands at a random point
        bookie.kill()
        stop.set()
        await asyncio.wait_for(task, 10)
        await asyncio.wait_for(c.closed, 10)
        bookie = start_bookie("kb", bookie_port=port, **settings)
        c2 = await RawBookieClient.connect(bookie.address)
        try:
            for eid in sorted(acked):
                resp = await c2.call(proto.read_request(0, 11, eid))
                assert resp.status == proto.OK, f"run {run}: acknowledged entry {eid} lost (seed {seed})"
                body = decode_entry(resp.body, ledger_id=11, entry_id=eid).body
                assert body[:8] == struct.pack(">q", eid), f"run {run}: entry {eid} damaged (seed {seed})"
        finally:
            await c2.close()


async def test_a_failed_journal_write_leaves_no_damage_for_the_replay(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    s = _open(tmp_path / "s", flush_interval=3600)
    await s.add_entry(1, 0, KEY, b"before")
    real_pwrite = os.pwrite

    def half_then_fail(fd: int, data: bytes, offset: int) -> int:  # a write that lands halfway, then EIO
        real_pwrite(fd, bytes(data)[: len(data) // 2], offset)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(journal.os, "pwrite", half_then_fail)
    with pytest.raises(BookieServerError, match="journal write failed"):
        await s.add_entry(1, 1, KEY, b"lost" * 100)
    monkeypatch.setattr(journal.os, "pwrite", real_pwrite)
    await s.add_entry(1, 2, KEY, b"after")  # a new journal file
    assert len(_journal_files(tmp_path / "s")) == 2
    s.journal.writer.close()  # a crash: no checkpoint
    s.index.env.close()
    s = _open(tmp_path / "s")  # the torn half of the failed write was cut: the replay goes through
    try:
        assert s.read_entry(1, 0)[1] == b"before" and s.read_entry(1, 2)[1] == b"after"
        with pytest.raises(NoSuchEntryError):
            s.read_entry(1, 1)
    finally:
        await s.close()


async def test_closing_fails_the_adds_waiting_for_room(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = _open(tmp_path / "s", write_cache_max_size=16 << 10, flush_interval=3600, max_throttle=30)
    gate = threading.Event()
    real = s.checkpointer.write

    def held(job: object) -> None:
        gate.wait(10)
        real(job)  # type: ignore[arg-type]

    monkeypatch.setattr(s.checkpointer, "write", held)
    i = 0
    while s.checkpointer.flushing is None or s.cache_bytes < 8 << 10:
        await s.add_entry(1, i, KEY, bytes(1024))
        i += 1
    waiting = s.add_entry(1, i, KEY, bytes(1024))
    closing = asyncio.ensure_future(s.close())
    with pytest.raises(BookieServerError, match="closing"):
        await asyncio.wait_for(waiting, 10)
    gate.set()
    await asyncio.wait_for(closing, 10)
    assert s.closed
