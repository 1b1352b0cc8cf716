"""The CAS-retry helper against a real lmdb store: racing writers, bounded attempts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from metastore import MetaStore, Value, Version, open_metastore
from metastore.cas import cas_retry, cas_retry_sync, update_record
from metastore.errors import BadVersionError, NoKeyError


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[MetaStore]:
    ms = await open_metastore(f"lmdb://{tmp_path}/m")
    yield ms
    await ms.close()


async def test_racing_increments_all_land(store: MetaStore) -> None:
    t = await store.create_table("counters")

    def incr(cur):  # type: ignore[no-untyped-def]
        n = int(cur.value["n"]) if cur is not None else 0
        return Value({"n": str(n + 1).encode()})

    await asyncio.wait_for(asyncio.gather(*(update_record(t, "c", incr) for _ in range(40))), 60)
    got = await t.get("c")
    assert got.value["n"] == b"40"


async def test_update_none_leaves_record_and_missing_key(store: MetaStore) -> None:
    t = await store.create_table("t")
    assert await update_record(t, "absent", lambda cur: None) is None
    with pytest.raises(NoKeyError):
        await t.get("absent")
    v = await t.put("k", Value({"a": b"1", "b": b"2"}), Version.NEW)
    same = await update_record(t, "k", lambda cur: None)
    assert same is not None and same.version == v
    merged = await update_record(t, "k", lambda cur: Value({"a": None, "c": b"3"}))
    assert merged is not None and merged.value == {"b": b"2", "c": b"3"}
    assert (await t.get("k")) == merged


@pytest.mark.parametrize(("error", "options", "calls"), [
    (BadVersionError, {"attempts": 4, "first_delay": 0.0001, "max_delay": 0.001}, 4),  # retried, bounded
    (NoKeyError, {}, 1),                                                               # passes at once
])
async def test_attempts_are_bounded_and_other_errors_pass_at_once(
        error: type[Exception], options: dict[str, Any], calls: int) -> None:
    tries = 0

    async def step() -> None:
        nonlocal tries
        tries += 1
        raise error("conflict or gone")

    with pytest.raises(error):
        await cas_retry(step, **options)
    assert tries == calls


def test_sync_variant_retries_then_returns() -> None:
    tries = iter([BadVersionError("x"), BadVersionError("y"), None])

    def step() -> str:
        err = next(tries)
        if err is not None:
            raise err
        return "done"

    assert cas_retry_sync(step, first_delay=0.0001) == "done"
