"""Checkpoints triggered by size: a burst of adds goes into LMDB in parts while it comes in (issue 32)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bookie.storage import EntryStorage
from bookie.write_cache import CHECKPOINT_BYTES

KEY = b"k" * 20
WAIT = 10.0

pytestmark = pytest.mark.timeout(60)


def _payload(i: int) -> bytes:
    return i.to_bytes(8, "big") * 128   # 1 KiB


async def test_a_burst_is_checkpointed_in_parts_of_about_checkpoint_bytes(tmp_path: Path) -> None:
    s = EntryStorage(tmp_path / "s", map_size=64 << 20, flush_interval=3600.0)   # the interval never comes
    assert s.cache.checkpoint_bytes == CHECKPOINT_BYTES < s.cache.half
    sizes: list[int] = []
    two = asyncio.Event()

    def checkpointed(entries: int, _seconds: float) -> None:
        sizes.append(entries)
        if len(sizes) >= 2:
            two.set()

    s.on_checkpoint = checkpointed
    total = 3 * CHECKPOINT_BYTES // 1024
    try:
        for start in range(0, total, 256):
            await asyncio.gather(*(s.add_entry(1, i, KEY, _payload(i)) for i in range(start, start + 256)))
        await asyncio.wait_for(two.wait(), WAIT)
        part = CHECKPOINT_BYTES // 1024
        assert all(n <= part + 256 for n in sizes)   # about CHECKPOINT_BYTES each, not the whole burst
        assert sum(sizes) + len(s.cache.entries) + len(s.cache.flushing or {}) >= part * 2
        assert [s.read_entry(1, i)[1] for i in (0, part, total - 1)] == [_payload(0), _payload(part),
                                                                         _payload(total - 1)]
    finally:
        await s.close()
    reopened = EntryStorage(tmp_path / "s", map_size=64 << 20)
    try:
        assert all(reopened.read_entry(1, i)[1] == _payload(i) for i in range(total))
    finally:
        await reopened.close()


async def test_a_small_write_cache_checkpoints_at_half(tmp_path: Path) -> None:
    s = EntryStorage(tmp_path / "s", map_size=8 << 20, write_cache_max_size=256 << 10, flush_interval=3600.0)
    try:
        assert s.cache.checkpoint_bytes == s.cache.half == 128 << 10
        done = asyncio.Event()
        s.on_checkpoint = lambda _n, _secs: done.set()
        await asyncio.gather(*(s.add_entry(2, i, KEY, _payload(i)) for i in range(130)))   # 130 KiB
        await asyncio.wait_for(done.wait(), WAIT)
        assert s.checkpoints >= 1
    finally:
        await s.close()
