"""The blocking facade has the async method names and raises the same errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from metastore import Order, Value, Version, sync
from metastore.errors import BadVersionError, IllegalOpError, KeyExistsError


def test_sync_facade_round_trip(tmp_path: Path) -> None:
    ms = sync.open_metastore(f"lmdb://{tmp_path}")
    assert ms.name == "lmdb" and isinstance(ms.version, int)
    t = ms.create_scannable_table("ledgers")
    v = t.put("b", Value({"x": b"1"}), Version.NEW)
    with pytest.raises(KeyExistsError):
        t.put("b", Value({"x": b"2"}), Version.NEW)
    v2 = t.put("b", Value({"y": b"2"}), v)
    with pytest.raises(BadVersionError):
        t.put("b", Value({"y": b"3"}), v)
    assert t.get("b").value == {"x": b"1", "y": b"2"} and t.get("b").version == v2
    for k in "acd":
        t.put(k, Value({"x": k.encode()}), Version.NEW)
    cur = t.open_cursor_range("d", True, "b", True, Order.DESC, fields={"x"})
    keys = []
    while cur.has_more():
        keys += [k for k, _ in cur.read_entries(2)]
    cur.close()
    assert keys == ["d", "c", "b"]
    t.remove("a", Version.ANY)
    ms.close()
    with pytest.raises(IllegalOpError):
        t.get("b")


def test_sync_open_error_propagates() -> None:
    with pytest.raises(IllegalOpError):
        sync.open_metastore("nosuch://x")
