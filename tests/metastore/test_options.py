"""Backend options: one dataclass per backend, conf/metastore-*.conf agree, bad keys are one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from metastore import Value, Version, open_metastore
from metastore.backends.hbase import HBaseOptions
from metastore.backends.lmdb import LmdbMetaStore, LmdbOptions
from metastore.backends.zookeeper import ZooKeeperOptions
from metastore.conf import check_conf_file, store_options
from metastore.errors import IllegalOpError
from metastore.lease import LeaseOptions

CONF = Path(__file__).resolve().parents[2] / "conf"

# Nothing listens on port 1: options are checked before any connection is tried.
BACKENDS = [
    ("lmdb", LmdbOptions, "lmdb://{tmp}/store"),
    ("zookeeper", ZooKeeperOptions, "zk://127.0.0.1:1/p"),
    ("hbase", HBaseOptions, "hbase://127.0.0.1:1/p"),
]
BAD_VALUES = {
    "lmdb": [("map_size", "big", "expected an integer"), ("write_mode", "eventually", "expected one of"),
             ("watch_poll_interval", "0", "expected >= 0.001"), ("max_tables", "1", "expected >= 2")],
    "zookeeper": [("zk_timeout", "abc", "expected a number"), ("operation_timeout", "-1", "positive"),
                  ("jute_maxbuffer", "1.5", "expected an integer")],
    "hbase": [("pool_size", "0", "positive"), ("transport", "pigeon", "expected one of buffered, framed"),
              ("watch_poll_interval", "soon", "expected a number")],
}


@pytest.mark.parametrize(("name", "cls"), [(n, c) for n, c, _ in BACKENDS])
def test_conf_file_lists_every_option_with_its_default(name: str, cls: type) -> None:
    assert check_conf_file(cls, CONF / f"metastore-{name}.conf") == []


@pytest.mark.parametrize(("name", "uri"), [(n, u) for n, _, u in BACKENDS])
@pytest.mark.parametrize("where", ["query", "keyword"])
async def test_unknown_option_is_refused_naming_it(name: str, uri: str, where: str, tmp_path: Path) -> None:
    uri = uri.format(tmp=tmp_path)
    with pytest.raises(IllegalOpError) as err:
        if where == "query":
            await open_metastore(uri + "?zk_timeout_typo=3")
        else:
            await open_metastore(uri, zk_timeout_typo=3)
    assert str(err.value).startswith(f"{name} metastore options: unknown key 'zk_timeout_typo'")
    if name == "zookeeper":
        assert str(err.value).endswith("(did you mean 'zk_timeout'?)")


@pytest.mark.parametrize(("name", "uri", "key", "value", "why"),
                         [(n, u, k, v, w) for n, _, u in BACKENDS for k, v, w in BAD_VALUES[n]])
async def test_bad_value_is_refused_naming_it(name: str, uri: str, key: str, value: str, why: str,
                                              tmp_path: Path) -> None:
    with pytest.raises(IllegalOpError) as err:
        await open_metastore(uri.format(tmp=tmp_path) + f"?{key}={value}")
    text = str(err.value)
    assert text.startswith(f"{name} metastore options: bad value for {key}: ")
    assert why in text and "\n" not in text


async def test_lmdb_options_reach_the_store_and_a_refused_open_leaves_the_process_serving(tmp_path: Path) -> None:
    uri = f"lmdb://{tmp_path}/s"
    with pytest.raises(IllegalOpError, match="max_value_size"):
        await open_metastore(uri, max_value_size="lots")
    ms = await open_metastore(uri + "?max_value_size=10&write_mode=thread", write_mode="inline",
                              watch_poll_interval="0.01")
    try:
        assert isinstance(ms, LmdbMetaStore)
        assert ms.options == LmdbOptions(max_value_size=10, write_mode="inline", watch_poll_interval=0.01)
        assert ms.write_mode == "inline" and ms.watch_poll_interval == 0.01
        t = await ms.create_table("t")
        with pytest.raises(IllegalOpError, match="over the lmdb limit of 10"):
            await t.put("k", Value({"v": b"x" * 11}), Version.NEW)
        await t.put("k", Value({"v": b"x" * 10}), Version.NEW)
        assert (await t.get("k")).value == {"v": b"x" * 10}
    finally:
        await ms.close()


def test_store_options_keyword_arguments_win_and_a_malformed_query_is_refused() -> None:
    got = store_options(LeaseOptions, "watch_poll_interval=1", {"watch_poll_interval": 2.5}, source="x")
    assert got == LeaseOptions(watch_poll_interval=2.5)
    assert store_options(LeaseOptions, "session_timeout=0.5").session_timeout == 0.5
    assert store_options(LeaseOptions, "", None) == LeaseOptions()
    assert store_options(LeaseOptions, [("watch_poll_interval", "0.5")]).watch_poll_interval == 0.5
    with pytest.raises(IllegalOpError, match="x: malformed query string"):
        store_options(LeaseOptions, "watch_poll_interval", None, source="x")


async def test_lease_session_timeout_option_is_the_default_session_lease(tmp_path: Path) -> None:
    ms = await open_metastore(f"lmdb://{tmp_path}/s?session_timeout=0.7")
    try:
        session = await ms.session()
        assert session.timeout == 0.7  # type: ignore[attr-defined]
        assert session.alive
        await session.close()
        assert (await ms.session(timeout=3)).timeout == 3.0  # type: ignore[attr-defined]
    finally:
        await ms.close()
