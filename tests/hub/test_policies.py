"""hub.policies (sans-IO: validation, longest-prefix matching, the retention/TTL/quota decisions) and
hub.policy_store on real metastores (LMDB and ZooKeeper)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st

from hub.conf import HubConf, load_hub_conf
from hub.log_usage import bytes_after
from hub.policies import (
    MIB,
    POLICY_KEYS,
    Policy,
    PolicyError,
    PolicyTable,
    check_prefix,
    eviction_target,
    parse_assignments,
    parse_policy,
    quota_exceeded,
    retention_deletes,
    ttl_expired_through,
)
from hub.policy_store import PolicyCache, PolicyStore
from metastore import open_metastore
from metastore.api import MetaStore

# --- validation ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("values", "key"), [
    ({"retention_size_mb": -2}, "retention_size_mb"),            # -1 is "for ever"; less is a negative size
    ({"retention_time_minutes": -5}, "retention_time_minutes"),
    ({"backlog_quota_limit_bytes": -1}, "backlog_quota_limit_bytes"),
    ({"message_ttl_seconds": -1}, "message_ttl_seconds"),
    ({"message_ttl_seconds": "soon"}, "message_ttl_seconds"),
    ({"message_ttl_seconds": True}, "message_ttl_seconds"),      # JSON true is no integer
    ({"retention_size_mb": 1.5}, "retention_size_mb"),
    ({"backlog_quota_policy": "drop_oldest"}, "backlog_quota_policy"),
    ({"backlog_quota_policy": 3}, "backlog_quota_policy"),
    ({"retention_sise_mb": 1}, "retention_sise_mb"),             # an unknown key is named
])
def test_bad_values_name_the_key(values: dict[str, object], key: str) -> None:
    with pytest.raises(PolicyError) as got:
        parse_policy(values)
    assert got.value.key == key and key in str(got.value)


def test_good_values_and_assignments() -> None:
    assert parse_policy({"retention_size_mb": -1, "backlog_quota_policy": " Producer_Exception"}) == {
        "retention_size_mb": -1, "backlog_quota_policy": "producer_exception"}
    assert parse_assignments(["message_ttl_seconds=60", "retention_time_minutes= 5"]) == {
        "message_ttl_seconds": 60, "retention_time_minutes": 5}
    for words, key in ((["message_ttl_seconds"], "message_ttl_seconds"), ([], "body"), (["=3"], "=3"),
                       (["retention_size_mb=-3"], "retention_size_mb")):
        with pytest.raises(PolicyError) as got:
            parse_assignments(words)
        assert got.value.key == key


def test_prefixes_must_be_utf8_without_nul() -> None:
    assert check_prefix(b"orders/\xc3\xa9") == "orders/é" and check_prefix("") == ""
    for bad in (b"\xff\xfe", "a\x00b", b"ok\xc3", "\udcff"):
        with pytest.raises(PolicyError) as got:
            check_prefix(bad)
        assert got.value.key == "prefix"


def test_conf_defaults_are_the_policy_defaults() -> None:
    assert Policy.from_conf(HubConf()) == Policy()
    conf = load_hub_conf(None, {"retention_size_mb": "-1", "backlog_quota_policy": "producer_exception"})
    assert Policy.from_conf(conf).to_json()["retention_size_mb"] == -1
    assert set(Policy().to_json()) == set(POLICY_KEYS)


# --- matching ------------------------------------------------------------------------------------

def test_each_key_from_the_longest_prefix_that_sets_it() -> None:
    table = PolicyTable(Policy(message_ttl_seconds=7), {
        "": {"retention_size_mb": 1},
        "orders/": {"retention_size_mb": 10, "backlog_quota_limit_bytes": 100},
        "orders/eu": {"backlog_quota_limit_bytes": 5},
    })
    p = table.for_topic(b"orders/eu/1")
    assert (p.retention_size_mb, p.backlog_quota_limit_bytes, p.message_ttl_seconds) == (10, 5, 7)
    assert table.for_topic(b"orders/us").backlog_quota_limit_bytes == 100
    assert table.for_topic(b"payments").retention_size_mb == 1
    assert PolicyTable(Policy()).for_topic(b"x") == Policy()


@given(st.dictionaries(st.text("ab/", max_size=4), st.integers(0, 1000), max_size=6), st.text("ab/", max_size=6))
def test_matching_is_the_longest_prefix(prefixes: dict[str, int], topic: str) -> None:
    table = PolicyTable(Policy(), {p: {"message_ttl_seconds": v} for p, v in prefixes.items()})
    matching = [p for p in prefixes if topic.startswith(p)]
    want = prefixes[max(matching, key=len)] if matching else 0
    assert table.for_topic(topic.encode()).message_ttl_seconds == want


# --- decisions -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Led:
    ledger_id: int
    size_bytes: int
    closed_ms: int


LEDGERS = [Led(i, MIB // 2, 1000 * i) for i in range(1, 11)]    # ten 0.5 MB ledgers, one a second
NOW = 10_000


@pytest.mark.parametrize(("time_min", "size_mb", "deleted"), [
    (0, 0, list(range(1, 11))),         # Hedwig's rule: every consumed ledger goes
    (-1, 0, []), (0, -1, []),           # for ever by either limit
    (0, 2, [1, 2, 3, 4, 5, 6]),         # the newest 2 MB (four ledgers) stay
    (0, 1, [1, 2, 3, 4, 5, 6, 7, 8]),
    (1, 0, []),                         # nothing is a minute old yet
])
def test_retention_keeps_until_both_limits_allow(time_min: int, size_mb: int, deleted: list[int]) -> None:
    p = Policy(retention_time_minutes=time_min, retention_size_mb=size_mb)
    assert retention_deletes(p, LEDGERS, NOW) == deleted


def test_retention_by_time_and_size_together() -> None:
    p = Policy(retention_time_minutes=1, retention_size_mb=1)
    later = 1000 * 5 + 60_000            # ledgers 1..5 are a minute old
    assert retention_deletes(p, LEDGERS, later) == [1, 2, 3, 4, 5]   # size alone would let 1..8 go
    assert retention_deletes(p, LEDGERS, NOW + 600_000) == [1, 2, 3, 4, 5, 6, 7, 8]  # time alone: all ten


def test_ttl_by_ledger_time() -> None:
    written = [(10, 1000), (20, 5000), (25, 9000)]
    assert ttl_expired_through(Policy(message_ttl_seconds=0), written, 100_000) == 0
    assert ttl_expired_through(Policy(message_ttl_seconds=5), written, 10_000) == 20
    assert ttl_expired_through(Policy(message_ttl_seconds=5), written, 5_999) == 0
    assert ttl_expired_through(Policy(message_ttl_seconds=1), written, 10_000) == 25


def test_quota_boundary_and_eviction_target() -> None:
    p = Policy(backlog_quota_limit_bytes=300)
    assert not quota_exceeded(p, 299) and quota_exceeded(p, 300) and not quota_exceeded(Policy(), 10**12)
    per_message = 100
    after = lambda seq: (10 - seq) * per_message   # noqa: E731  (messages 1..10, 100 bytes each)
    assert eviction_target(300, 0, 10, after) == 8            # 200 bytes left: under the limit
    assert eviction_target(300, 8, 10, after) == 0            # already under
    assert eviction_target(0, 0, 10, after) == 0              # no quota
    assert eviction_target(1, 0, 10, after) == 10


def test_bytes_after_shares_a_ledger_by_seq_ids() -> None:
    ledgers = [(1, 10, 1000), (11, 20, 500), (21, 20, 0)]   # the last: empty
    assert bytes_after(ledgers, 0) == 1500
    assert bytes_after(ledgers, 5) == 500 + 500
    assert bytes_after(ledgers, 10) == 500 and bytes_after(ledgers, 20) == 0


# --- the store, on real metastores ---------------------------------------------------------------

@pytest_asyncio.fixture(loop_scope="function", params=["lmdb", pytest.param("zk", marks=pytest.mark.zookeeper)])
async def ms(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MetaStore]:
    if request.param == "lmdb":
        uri = f"lmdb://{tmp_path / 'ms'}"
    else:
        uri = request.getfixturevalue("zk_uri")
    store = await open_metastore(uri)
    try:
        yield store
    finally:
        await store.close()


@pytest.mark.asyncio(loop_scope="function")
async def test_store_put_update_delete_and_the_refreshed_copy(ms: MetaStore) -> None:
    store = PolicyStore(ms)
    cache = PolicyCache(store, Policy(), refresh_interval=60.0)
    await cache.start()
    assert await store.policies() == {} and cache.generation == 0
    assert await store.put("orders/eu ü", {"retention_size_mb": 10}) == {"retention_size_mb": 10}
    assert await store.update("orders/eu ü", {"message_ttl_seconds": "30"}) == {
        "message_ttl_seconds": 30, "retention_size_mb": 10}
    await store.put("", {"backlog_quota_limit_bytes": 1000, "backlog_quota_policy": "producer_exception"})
    assert cache.for_topic(b"orders/eu \xc3\xbc/1") == Policy()       # not re-read yet
    await cache.refresh()
    assert cache.generation == 1
    p = cache.for_topic("orders/eu ü/1".encode())
    assert (p.retention_size_mb, p.message_ttl_seconds, p.backlog_quota_limit_bytes) == (10, 30, 1000)
    assert list(await store.policies()) == ["", "orders/eu ü"]
    with pytest.raises(PolicyError, match="retention_size_mb"):
        await store.update("orders/eu ü", {"retention_size_mb": -7})
    assert await store.get("orders/eu ü") == {"message_ttl_seconds": 30, "retention_size_mb": 10}  # unchanged
    assert await store.delete("orders/eu ü") == {"message_ttl_seconds": 30, "retention_size_mb": 10}
    with pytest.raises(LookupError):
        await store.delete("orders/eu ü")
    assert await store.put("", {}) == {} and await store.policies() == {}
    await cache.refresh()
    assert cache.for_topic(b"orders/eu") == Policy() and cache.generation == 2
