"""tools.bench.queue: the metastore commit count its Quire lines carry."""

from pathlib import Path

from metastore import Value, Version, open_metastore
from tools.bench.queue import metastore_commits


async def _puts(uri: str, prefix: str, n: int) -> None:
    """``n`` writes, each its own transaction (one at a time)."""
    store = await open_metastore(uri)
    try:
        table = await store.create_table("t")
        for i in range(n):
            await table.put(f"{prefix}{i}", Value({"f": b"x"}), Version.NEW)
    finally:
        await store.close()


async def test_metastore_commits_counts_every_write_transaction(tmp_path: Path) -> None:
    uri = f"lmdb://{tmp_path}/meta"
    await _puts(uri, "a", 1)
    first = metastore_commits(uri)
    assert first is not None and first >= 1
    await _puts(uri, "b", 5)
    second = metastore_commits(uri)
    assert second is not None and first + 5 <= second <= first + 7     # the puts, and the table's opening


def test_metastore_commits_is_none_for_other_backends() -> None:
    assert metastore_commits("zk://127.0.0.1:2181/quire") is None
