"""lmdb backend specifics: limits, durability across processes, bad locations."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from metastore import Value, Version, open_metastore
from metastore.errors import IllegalOpError, NoKeyError, ServiceDownError


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
    script = ("import asyncio,sys\nfrom metastore import open_metastore\n"
              "async def m():\n ms=await open_metastore(sys.argv[1]); t=await ms.create_table('t')\n"
              " g=await t.get('k'); print(g.value['a'].decode(), g.version.value)\nasyncio.run(m())")
    out = subprocess.run([sys.executable, "-c", script, f"lmdb://{tmp_path}"], capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    assert out == ["durable", str(v.value)]
    await ms.close()
