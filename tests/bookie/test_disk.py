"""Disk usage: read-only before the storage map is full, failed commits named by their cause.

What these tests prove and what they do not: no unprivileged test can fill
a real filesystem here, so a small ``ledger_storage_map_size`` stands in
for a small disk (the map is what LMDB can no longer grow), and
``describe_commit_error`` is checked on the errors LMDB raises for a full
disk (``DiskError``/``ENOSPC``, or ``EIO`` with little space left) built by
hand.
"""

from __future__ import annotations

import errno
from pathlib import Path

import lmdb
import pytest

from bookie import protocol as proto
from bookie.disk import DiskUsageMonitor, describe_commit_error
from bookie.errors import BookieServerError
from bookie.registration import BOOKIES_TABLE, READ_ONLY, decode_registration
from bookie.storage import EntryStorage
from bookie.testing import RawBookieClient
from metastore import open_metastore
from tests.bookie.conftest import KEY, StartBookie, add_req

pytestmark = pytest.mark.timeout(60)


def test_commit_errors_are_named() -> None:
    here = Path(".")
    assert describe_commit_error(lmdb.MapFullError("mdb_put", "MDB_MAP_FULL"), here)[1] is True
    assert "storage map full" in describe_commit_error(lmdb.MapFullError("x"), here)[0]
    reason, no_space = describe_commit_error(OSError(errno.ENOSPC, "No space left on device"), here)
    assert no_space and "ENOSPC" in reason
    assert describe_commit_error(lmdb.DiskError("mdb_txn_commit"), here)[1] is True
    # an I/O error with plenty of room left is not taken for a full disk
    reason, no_space = describe_commit_error(lmdb.Error("mdb_txn_commit: Input/output error"), Path("/"))
    assert not no_space or "ENOSPC" in reason


async def test_map_full_commit_is_named_and_reported(tmp_path: Path) -> None:
    # the checkpoint into a 1 MiB map fails; the 1 MiB write cache then fills and adds fail, naming why
    storage = EntryStorage(tmp_path / "s", map_size=1 << 20, write_cache_max_size=1 << 20, max_throttle=0.2)
    reported: list[tuple[str, bool]] = []
    storage.on_commit_error = lambda reason, no_space: reported.append((reason, no_space))
    try:
        with pytest.raises(BookieServerError, match=r"storage map full.*MDB_MAP_FULL"):
            for i in range(200):
                await storage.add_entry(1, i, KEY, bytes(16384))
        assert reported and reported[0][1] is True
    finally:
        await storage.close()


async def test_monitor_counts_written_bytes_and_sees_the_map(tmp_path: Path) -> None:
    storage = EntryStorage(tmp_path / "s", map_size=4 << 20)
    try:
        (tmp_path / "usage").write_text("0.1")  # the filesystem's share, pinned: the map decides
        monitor = DiskUsageMonitor(tmp_path, 0.5, 0.4, str(tmp_path / "usage"), check_bytes=10_000,
                                   map_usage=storage.map_usage)
        assert not monitor.check()[1]
        assert monitor.note_written(6000) is False
        assert monitor.note_written(6000) is True
        for i in range(150):
            await storage.add_entry(1, i, KEY, bytes(16384))
        await storage.checkpoint()  # the entries reach the map
        usage, changed = monitor.check()
        assert changed and monitor.read_only and usage.total == 4 << 20 and usage.used_fraction >= 0.5
        assert monitor.note_written(1) is False  # a check starts the count again
    finally:
        await storage.close()


async def test_bookie_turns_read_only_before_its_map_is_full(start_bookie: StartBookie, metastore_uri: str,
                                                             tmp_path: Path) -> None:
    (tmp_path / "usage").write_text("0.1")  # the filesystem's share, pinned: the map decides
    bookie = start_bookie("small", ledger_storage_map_size=2 << 20, disk_usage_threshold=0.85,
                          disk_usage_lwm_threshold=0.8, disk_check_bytes=4096, disk_check_interval=600000,
                          disk_usage_override_file=tmp_path / "usage")
    c = await RawBookieClient.connect(bookie.address)
    ms = await open_metastore(metastore_uri)
    try:
        statuses = []
        for i in range(200):
            statuses.append((await c.call(add_req(1, i, bytes(16384)))).status)
            if statuses[-1] != proto.OK:
                break
        assert statuses[-1] == proto.READ_ONLY, statuses  # not ERROR: it stopped before the map was full
        assert statuses.count(proto.OK) == len(statuses) - 1 > 10
        assert (await c.call(proto.read_request(0, 1, 0))).status == proto.OK  # reads go on
        table = await ms.create_scannable_table(BOOKIES_TABLE)
        assert decode_registration((await table.get(bookie.address)).value).state == READ_ONLY
        assert (await c.call(proto.bookie_info_request(0))).read_only is True
    finally:
        await c.close()
        await ms.close()
