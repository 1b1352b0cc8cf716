"""Entry storage: durability, group commit, ledger records, fencing, deletion."""

from __future__ import annotations

import asyncio
import errno
import multiprocessing
import os
import signal
from pathlib import Path

import pytest

from bookie.errors import (
    BadRequestError,
    BookieServerError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
)
from bookie.proto.bookie_pb2 import LedgerIndexRecord
from bookie.storage import LAST_ENTRY, EntryStorage, corrupt_stored_entry, entry_key
from bookie.storage_core import _LedgerState

KEY = b"k" * 20

pytestmark = pytest.mark.timeout(60)


def test_key_layout() -> None:
    assert entry_key(1, 2) == bytes.fromhex("0000000000000001" "0000000000000002")


@pytest.mark.parametrize("master_key", [b"", b"k", bytes(range(20)), b"x" * 200])
def test_a_ledger_record_is_the_bytes_protobuf_encodes(master_key: bytes) -> None:
    for fenced in (False, True):
        for lac in (-1, 0, 1, 127, 128, 300, 1 << 35, (1 << 63) - 1, -(1 << 63)):
            state = _LedgerState(master_key, fenced, lac)
            expected = LedgerIndexRecord(master_key=master_key, fenced=fenced, lac=lac).SerializeToString()
            assert state.record() == expected
            back = LedgerIndexRecord.FromString(state.record())
            assert (back.master_key, back.fenced, back.lac) == (master_key, fenced, lac)


async def test_add_read_and_last_entry(storage: EntryStorage) -> None:
    for i in range(5):
        await storage.add_entry(3, i, KEY, f"e{i}".encode(), i - 1)
    assert storage.read_entry(3, 2) == (2, b"e2")
    assert storage.read_entry(3, LAST_ENTRY) == (4, b"e4")
    assert storage.read_lac(3) == 3
    assert storage.last_entry_id(3) == 4
    await storage.add_entry(4, 0, KEY, b"other")  # a later ledger does not shadow ledger 3's last entry
    assert storage.read_entry(3, LAST_ENTRY) == (4, b"e4")
    with pytest.raises(NoSuchEntryError):
        storage.read_entry(3, 5)
    with pytest.raises(NoSuchLedgerError):
        storage.read_entry(99, 0)
    with pytest.raises(NoSuchLedgerError):
        storage.read_lac(99)


async def test_lac_only_grows(storage: EntryStorage) -> None:
    await storage.add_entry(1, 5, KEY, b"x", lac=4)
    await storage.add_entry(1, 3, KEY, b"x", lac=2)  # out of order
    assert storage.read_lac(1) == 4


async def test_concurrent_adds_share_commits(storage: EntryStorage) -> None:
    sizes: list[int] = []
    storage.on_commit = lambda n, _secs: sizes.append(n)
    await asyncio.gather(*(storage.add_entry(1, i, KEY, b"x" * 100, i - 1) for i in range(1000)))
    assert sum(sizes) == 1000
    assert len(sizes) < 20  # grouped, not one transaction per add
    assert storage.entry_count() == 1000


async def test_add_is_acknowledged_only_after_commit(storage: EntryStorage) -> None:
    acks: list[BaseException | None] = []
    storage.submit_add(1, 0, KEY, b"x", -1, acks.append)
    assert acks == []  # not yet: the commit runs at the end of this loop turn
    with pytest.raises(NoSuchEntryError):
        storage.read_entry(1, 0)  # reads see committed entries only
    await storage.flush()
    assert acks == [None]
    assert storage.read_entry(1, 0) == (0, b"x")


async def test_master_key_and_fencing(storage: EntryStorage) -> None:
    await storage.add_entry(1, 0, KEY, b"x")
    with pytest.raises(UnauthorizedError):
        await storage.add_entry(1, 1, b"other", b"x")
    with pytest.raises(UnauthorizedError):
        await storage.fence(1, b"other")
    await storage.fence(1, KEY)
    with pytest.raises(LedgerFencedError):
        await storage.add_entry(1, 1, KEY, b"x")
    await storage.add_entry(1, 1, KEY, b"x", recovery=True)
    info = storage.ledger_info(1)
    assert info is not None and info.fenced and info.master_key == KEY


async def test_pending_first_add_already_claims_the_ledger(storage: EntryStorage) -> None:
    acks: list[BaseException | None] = []
    storage.submit_add(8, 0, KEY, b"x", -1, acks.append)
    with pytest.raises(UnauthorizedError):
        storage.submit_add(8, 1, b"thief", b"x", -1, acks.append)
    await storage.flush()
    assert acks == [None]


async def test_state_survives_reopen(tmp_path: Path) -> None:
    s = EntryStorage(tmp_path / "s", map_size=64 << 20)
    await s.add_entry(2, 0, KEY, b"x", 7)
    await s.fence(2, KEY)
    await s.fence(5, KEY)  # fencing an unknown ledger records it
    await s.close()
    s = EntryStorage(tmp_path / "s", map_size=64 << 20)
    try:
        assert s.ledger_ids() == {2, 5}
        assert s.read_lac(2) == 7
        with pytest.raises(LedgerFencedError):
            await s.add_entry(2, 1, KEY, b"x")
        with pytest.raises(NoSuchEntryError):
            s.read_entry(5, LAST_ENTRY)
    finally:
        await s.close()


async def test_delete_ledger(storage: EntryStorage) -> None:
    for lid in (1, 2):
        for i in range(300):
            storage.submit_add(lid, i, KEY, b"x", -1, lambda _exc: None)
    await storage.flush()
    await storage.delete_ledger(1)
    assert storage.ledger_ids() == {2}
    with pytest.raises(NoSuchLedgerError):
        storage.read_entry(1, 0)
    assert storage.entry_count() == 300
    assert storage.read_entry(2, LAST_ENTRY)[0] == 299


async def test_the_checkpoint_after_a_deletion_takes_the_freed_pages(tmp_path: Path) -> None:
    """The pages of deleted ledgers go to the very next checkpoint, a burst of writes whole in one, not to new
    pages at the end of the file (LMDB takes a transaction's freed pages only from the second transaction after
    it on: the storage commits the one between)."""
    s = EntryStorage(tmp_path / "s", map_size=256 << 20, flush_interval=0)   # checkpoints only when asked
    payload = b"p" * 65536
    mib = 1 << 20

    def burst(first: int) -> None:     # 8 MiB over 4 ledgers
        for lid in range(first, first + 4):
            for i in range(32):
                s.submit_add(lid, i, KEY, payload, -1, lambda _exc: None)

    try:
        burst(1)
        await s.checkpoint()
        await s.delete_ledgers([1, 2, 3, 4])
        before = s.index.env.info()["last_pgno"]
        burst(5)
        await s.checkpoint()
        grown = (s.index.env.info()["last_pgno"] - before) * s.index.env.stat()["psize"]
        assert grown < 2 * mib, f"the burst after the deletion took {grown / mib:.1f} MiB of new pages"
        assert s.ledger_ids() == {5, 6, 7, 8} and s.read_entry(8, LAST_ENTRY) == (31, payload)
    finally:
        await s.close()


async def test_bad_ids_and_closing(tmp_path: Path) -> None:
    s = EntryStorage(tmp_path / "s", map_size=64 << 20)
    with pytest.raises(BadRequestError):
        await s.add_entry(-1, 0, KEY, b"x")
    with pytest.raises(BadRequestError):
        await s.add_entry(1, -5, KEY, b"x")
    pending = asyncio.ensure_future(s.add_entry(1, 0, KEY, b"x"))
    await asyncio.sleep(0)  # the add is queued
    await s.close()  # waits for it
    assert pending.done() and pending.exception() is None
    with pytest.raises(BookieServerError, match="closing"):
        await s.add_entry(1, 1, KEY, b"x")


async def test_failing_checkpoint_fills_the_cache_then_adds_fail_clearly(tmp_path: Path) -> None:
    # 1 MiB map: the checkpoint fails (map full); a 64 KiB cache then fills and adds wait, then fail
    s = EntryStorage(tmp_path / "s", map_size=1 << 20, write_cache_max_size=64 << 10, max_throttle=0.2)
    errors_seen: list[tuple[str, bool]] = []
    s.on_commit_error = lambda reason, no_space: errors_seen.append((reason, no_space))
    try:
        results: list[BaseException | None] = []
        for wave in range(40):  # waves of 20 adds until the full cache refuses some
            results += await asyncio.gather(*(s.add_entry(1, wave * 20 + i, KEY, b"x" * 4000) for i in range(20)),
                                            return_exceptions=True)
            if any(results):
                break
        failed = [r for r in results if isinstance(r, BookieServerError)]
        assert failed and all(r is None or isinstance(r, BookieServerError) for r in results)
        assert "write cache full" in str(failed[0]) and "map full" in str(failed[0])
        assert errors_seen and "map full" in errors_seen[0][0]
        # what was acknowledged stays readable (from memory) while the checkpoint keeps failing
        ok = [i for i, r in enumerate(results) if r is None]
        assert ok and all(s.read_entry(1, i)[1] == b"x" * 4000 for i in ok)
    finally:
        await s.close()


async def test_journal_write_failure_reaches_every_waiter(storage: EntryStorage,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def disk_full(data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(storage.journal.writer, "append", disk_full)
    results = await asyncio.gather(*(storage.add_entry(1, i, KEY, b"x") for i in range(50)),
                                   return_exceptions=True)
    assert all(isinstance(r, BookieServerError) and "journal write failed" in str(r) for r in results)
    with pytest.raises(NoSuchLedgerError if storage.ledger_info(1) is None else NoSuchEntryError):
        storage.read_entry(1, 0)


async def test_corrupt_hooks_flip_a_byte(storage: EntryStorage, tmp_path: Path) -> None:
    await storage.add_entry(1, 0, KEY, b"abc")
    storage.corrupt_entry_for_test(1, 0)
    assert storage.read_entry(1, 0) == (0, b"ab\x9c")
    with pytest.raises(NoSuchEntryError):
        storage.corrupt_entry_for_test(1, 1)


def _writer(path: str, conn) -> None:  # runs in a child process
    async def main() -> None:
        s = EntryStorage(path, map_size=64 << 20)
        acked = 0

        def done(exc: BaseException | None) -> None:
            nonlocal acked
            if exc is None:
                acked += 1
                conn.send(acked)

        i = 0
        while True:
            for _ in range(50):
                s.submit_add(1, i, KEY, i.to_bytes(8, "big") * 4, i - 1, done)
                i += 1
            await asyncio.sleep(0.001)

    asyncio.run(main())


async def test_kill_9_keeps_every_acknowledged_add(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_writer, args=(path, child))
    proc.start()
    acked = 0
    try:
        while acked < 2000:
            ready = await asyncio.to_thread(parent.poll, 30)
            assert ready, "writer produced no acknowledgements"
            acked = parent.recv()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
    while parent.poll():
        acked = parent.recv()
    s = EntryStorage(path, map_size=64 << 20)
    try:
        last, _ = s.read_entry(1, LAST_ENTRY)
        assert last + 1 >= acked  # adds are acknowledged in order, so entries 0..acked-1 are there
        for i in range(acked):
            assert s.read_entry(1, i)[1] == i.to_bytes(8, "big") * 4
    finally:
        await s.close()


def test_corrupt_stored_entry_from_outside(tmp_path: Path) -> None:
    async def fill() -> None:
        s = EntryStorage(tmp_path / "s", map_size=64 << 20)
        await s.add_entry(4, 2, KEY, b"\x00\x01")
        await s.close()

    asyncio.run(fill())
    corrupt_stored_entry(tmp_path / "s", 4, 2)

    async def check() -> tuple[int, bytes]:
        s = EntryStorage(tmp_path / "s", map_size=64 << 20)
        try:
            return s.read_entry(4, 2)
        finally:
            await s.close()

    assert asyncio.run(check()) == (2, b"\x00\xfe")
